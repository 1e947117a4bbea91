/* A stand-in for the CUDA runtime library, built by the tests as libcudart.so.13 beside the
 * stand-in driver (libcuda_standin.c, linked against it) and stripped of its symbol table, as the
 * vendor's libcudart is: the runtime calls keep their names (.dynsym), its internals are addresses
 * on a stack (libcudart.so.13+0x...). Like the real runtime it allocates through the driver API,
 * each call through an internal function:
 *
 *   cudaMalloc / cudaFree               cuMemAlloc_v2 / cuMemFree_v2       (device memory)
 *   cudaMallocAsync / cudaFreeAsync     cuMemAllocAsync / cuMemFreeAsync
 *   cudaMallocPitch                     cuMemAllocPitch_v2
 *   cudaHostAlloc / cudaMallocHost      cuMemHostAlloc / cuMemAllocHost_v2 (pinned host memory)
 *   cudaFreeHost                        cuMemFreeHost
 *   cudaMallocManaged                   cuMemAllocManaged                  (managed memory)
 *
 * Its first call mallocs the runtime's own state (RT_STATE_BYTES, kept), as the real runtime's
 * lazy initialization does. Not a runtime: nothing here touches a GPU.
 */
#include <stddef.h>
#include <stdlib.h>

typedef int CUresult;
typedef int cudaError_t;
typedef unsigned long long CUdeviceptr;
typedef void *cudaStream_t;

#define RT_STATE_BYTES 4000
#define NOINLINE __attribute__((noinline))

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, void *hStream);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, void *hStream);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemFreeHost(void *p);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);

static void *volatile rt_state;

static cudaError_t status(CUresult r) { return r == 0 ? 0 : 2; /* cudaErrorMemoryAllocation */ }

NOINLINE static void rt_lazy_init(void)
{
    if (!rt_state)
        rt_state = malloc(RT_STATE_BYTES);
}

NOINLINE static cudaError_t rt_device_alloc(void **devPtr, size_t size, cudaStream_t stream, int async)
{
    rt_lazy_init();
    CUdeviceptr d = 0;
    CUresult r = async ? cuMemAllocAsync(&d, size, stream) : cuMemAlloc_v2(&d, size);
    *devPtr = (void *)(size_t)d;
    return status(r);
}

NOINLINE static cudaError_t rt_host_alloc(void **pHost, size_t size, unsigned int flags, int legacy)
{
    rt_lazy_init();
    return status(legacy ? cuMemAllocHost_v2(pHost, size) : cuMemHostAlloc(pHost, size, flags));
}

NOINLINE static cudaError_t rt_device_free(void *devPtr, cudaStream_t stream, int async)
{
    CUdeviceptr d = (CUdeviceptr)(size_t)devPtr;
    return status(async ? cuMemFreeAsync(d, stream) : cuMemFree_v2(d));
}

cudaError_t cudaMalloc(void **devPtr, size_t size) { return rt_device_alloc(devPtr, size, NULL, 0); }

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    return rt_device_alloc(devPtr, size, stream, 1);
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    rt_lazy_init();
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocPitch_v2(&d, pitch, width, height, 4);
    *devPtr = (void *)(size_t)d;
    return status(r);
}

cudaError_t cudaFree(void *devPtr) { return rt_device_free(devPtr, NULL, 0); }

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) { return rt_device_free(devPtr, stream, 1); }

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) { return rt_host_alloc(pHost, size, flags, 0); }

cudaError_t cudaMallocHost(void **ptr, size_t size) { return rt_host_alloc(ptr, size, 0, 1); }

cudaError_t cudaFreeHost(void *ptr) { return status(cuMemFreeHost(ptr)); }

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    rt_lazy_init();
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocManaged(&d, size, flags);
    *devPtr = (void *)(size_t)d;
    return status(r);
}
