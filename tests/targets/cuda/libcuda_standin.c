/* A stand-in for the NVIDIA driver library, built by the tests as libcuda.so.1 in a private
 * directory (with -fcf-protection, so every entry point starts with endbr64 as the real
 * driver's do). It exports the real names and C signatures of the driver API calls allocscope
 * probes, and behaves, as seen from the process, like the real driver on a machine where it was
 * measured (docs/gpu-memory.md):
 *
 *   cuMemHostAlloc / cuMemAllocHost_v2   a rw-s shared mapping of a memfd made inside the call
 *                                        (the real driver maps /dev/nvidiactl): pinned host memory
 *   cuMemFreeHost                        unmaps it
 *   cuMemAllocManaged                    a rw-s shared mapping of a memfd (the real driver: of
 *                                        /dev/nvidia-uvm): managed memory
 *   cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemCreate
 *                                        device memory: an opaque handle, nothing in host memory
 *   cuMemFree_v2, cuMemFreeAsync, cuMemRelease   free them
 *   cuMemHostRegister_v2 / cuMemHostUnregister   pin / unpin existing host memory (no new memory)
 *   cuInit, cuCtxCreate_v2               the driver's own state, malloc'd by internal functions and
 *                                        kept: cuInit's first call DRIVER_STATE_BYTES, each context
 *                                        CTX_TABLE_BYTES + CTX_INDEX_BYTES (two call sites in one
 *                                        function) + CTX_STREAM_BYTES (another function)
 *
 * Every call also mallocs (and frees) a little bookkeeping, as a driver does. A size above
 * STANDIN_MAX_BYTES fails with CUDA_ERROR_OUT_OF_MEMORY (2) and allocates nothing. The tests
 * strip its symbol table (-s), as the real driver's is: the calls keep their names (.dynsym),
 * the internals are addresses (libcuda.so.1+0x...). Not a driver: nothing here touches a GPU.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef struct CUmemAllocationProp_st { int type, requestedHandleTypes, location_type, location_id; } CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define STANDIN_MAX_BYTES ((size_t)1 << 40)
#define PAGE 4096

static unsigned long long next_handle = 0x7f0000000000ULL; /* device addresses: opaque here */

static size_t page_up(size_t n) { return (n + PAGE - 1) & ~(size_t)(PAGE - 1); }

static void bookkeeping(void)
{
    void *volatile note = malloc(48);
    free(note);
}

/* A shared mapping of a fresh memfd, as the driver's mapping of its device file. */
static void *shared_map(size_t bytes)
{
    int fd = memfd_create("standin-cuda", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)page_up(bytes)) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, page_up(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* Sizes of the host mappings made here, so that frees unmap the right length. */
#define MAX_MAPS 4096
static struct { void *p; size_t bytes; } maps[MAX_MAPS];

static void remember(void *p, size_t bytes)
{
    for (int i = 0; i < MAX_MAPS; i++)
        if (!maps[i].p) {
            maps[i].p = p;
            maps[i].bytes = bytes;
            return;
        }
}

static size_t forget(void *p)
{
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].p == p) {
            maps[i].p = NULL;
            return maps[i].bytes;
        }
    return 0;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    (void)Flags;
    bookkeeping();
    if (!pp || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > STANDIN_MAX_BYTES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = shared_map(bytesize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0, bytesize); /* pinned memory is resident at once */
    remember(p, bytesize);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

CUresult cuMemFreeHost(void *p)
{
    bookkeeping();
    size_t bytes = forget(p);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, page_up(bytes));
    return CUDA_SUCCESS;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    bookkeeping();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > STANDIN_MAX_BYTES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = shared_map(bytesize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    remember(p, bytesize);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static CUresult device_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    bookkeeping();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > STANDIN_MAX_BYTES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = __atomic_fetch_add(&next_handle, page_up(bytesize) + (1 << 20), __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return device_alloc(dptr, bytesize);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    (void)ElementSizeBytes;
    if (!pPitch)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511; /* rows padded to 512 bytes */
    CUresult r = device_alloc(dptr, pitch * Height);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return device_alloc(dptr, bytesize);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    (void)pool;
    (void)hStream;
    return device_alloc(dptr, bytesize);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    bookkeeping();
    void *p = (void *)(uintptr_t)dptr;
    size_t bytes = forget(p); /* managed memory is host-mapped */
    if (bytes)
        munmap(p, page_up(bytes));
    return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    (void)hStream;
    return cuMemFree_v2(dptr);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    (void)prop;
    (void)flags;
    return device_alloc(handle, size);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    bookkeeping();
    return handle ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    (void)Flags;
    bookkeeping();
    return p && bytesize ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostUnregister(void *p)
{
    bookkeeping();
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#define DRIVER_STATE_BYTES 2048
#define CTX_TABLE_BYTES 3000
#define CTX_INDEX_BYTES 1000
#define CTX_STREAM_BYTES 512

static void *volatile driver_state;

__attribute__((noinline)) static void init_state(void)
{
    if (!driver_state)
        driver_state = malloc(DRIVER_STATE_BYTES);
}

CUresult cuInit(unsigned int Flags)
{
    (void)Flags;
    init_state();
    return CUDA_SUCCESS;
}

typedef struct ctx_st { void *table, *index, *stream; } *CUcontext;

__attribute__((noinline)) static void ctx_tables(CUcontext c)
{
    c->table = malloc(CTX_TABLE_BYTES);
    c->index = malloc(CTX_INDEX_BYTES);
}

__attribute__((noinline)) static void ctx_streams(CUcontext c)
{
    c->stream = malloc(CTX_STREAM_BYTES);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, int dev)
{
    (void)flags;
    (void)dev;
    static struct ctx_st ctxs[16];
    static int n;
    if (!pctx || n == 16)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = &ctxs[n++];
    ctx_tables(c);
    ctx_streams(c);
    *pctx = c;
    return CUDA_SUCCESS;
}
