/* bench/gpu_driver.c: the real CUDA driver, through its API with known sizes (bench/gpu_check.py
 * records it). Declares the prototypes it uses (no cuda.h needed) and dlopen()s libcuda.so.1.
 * Live at exit (nothing is freed at exit):
 *   device : cuMemAlloc_v2 5 x 64 MiB, 2 freed -> 192 MiB; cuMemCreate 2 x 2 MiB, 1 released -> 2 MiB
 *            (mapped with cuMemAddressReserve/cuMemMap/cuMemSetAccess); cuMemAllocAsync 4 x 1 MiB,
 *            all freed with cuMemFreeAsync -> 0; cuMemAllocAsync_ptsz 2 x 1 MiB, 1 freed with
 *            cuMemFreeAsync_ptsz -> 1 MiB.                  device live 195 MiB in 5, peak 320 MiB
 *   host   : cuMemAllocHost_v2 2 x 3 MiB; cuMemHostAlloc 3 x (7 MiB + 4099), 1 freed;
 *            cuMemAllocManaged 2 x 16 MiB, 1 freed; cuMemHostRegister_v2 of 1 MiB malloc'd memory.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)
typedef int CUresult;
typedef unsigned long long CUdeviceptr, CUhandle;
typedef struct { int type, requestedHandleTypes; struct { int type, id; } location; void *win32;
                 struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage;
                          unsigned char reserved[4]; } allocFlags; } Prop;
typedef struct { struct { int type, id; } location; int flags; } Access;

#define F(name, ...) static CUresult (*name)(__VA_ARGS__)
F(cuInit, unsigned); F(cuDeviceGet, int *, int); F(cuCtxCreate_v2, void **, unsigned, int);
F(cuCtxSynchronize, void);
F(cuMemAlloc_v2, CUdeviceptr *, size_t); F(cuMemFree_v2, CUdeviceptr);
F(cuMemAllocAsync, CUdeviceptr *, size_t, void *); F(cuMemFreeAsync, CUdeviceptr, void *);
F(cuMemAllocAsync_ptsz, CUdeviceptr *, size_t, void *); F(cuMemFreeAsync_ptsz, CUdeviceptr, void *);
F(cuMemAllocHost_v2, void **, size_t); F(cuMemFreeHost, void *);
F(cuMemHostAlloc, void **, size_t, unsigned); F(cuMemHostRegister_v2, void *, size_t, unsigned);
F(cuMemAllocManaged, CUdeviceptr *, size_t, unsigned);
F(cuMemCreate, CUhandle *, size_t, const Prop *, unsigned long long); F(cuMemRelease, CUhandle);
F(cuMemAddressReserve, CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
F(cuMemMap, CUdeviceptr, size_t, size_t, CUhandle, unsigned long long);
F(cuMemSetAccess, CUdeviceptr, size_t, const Access *, size_t);
F(cuMemGetInfo_v2, size_t *, size_t *);

static void must(CUresult r, const char *what)
{
    if (r) { fprintf(stderr, "%s failed: %d\n", what, r); exit(1); }
}
#define L(h, n) do { *(void **)&n = dlsym(h, #n); if (!n) { fprintf(stderr, "no %s\n", #n); exit(1); } } while (0)

__attribute__((noinline)) void dev_alloc(void)
{
    CUdeviceptr d[5];
    for (int i = 0; i < 5; i++) must(cuMemAlloc_v2(&d[i], 64 * MIB), "cuMemAlloc_v2");
    must(cuMemFree_v2(d[1]), "free"); must(cuMemFree_v2(d[3]), "free");
}
__attribute__((noinline)) void dev_async(void)
{
    CUdeviceptr d[4];
    for (int i = 0; i < 4; i++) must(cuMemAllocAsync(&d[i], MIB, NULL), "cuMemAllocAsync");
    for (int i = 0; i < 4; i++) must(cuMemFreeAsync(d[i], NULL), "cuMemFreeAsync");
    must(cuCtxSynchronize(), "sync");
}
__attribute__((noinline)) void dev_async_ptsz(void)
{
    CUdeviceptr d[2];
    for (int i = 0; i < 2; i++) must(cuMemAllocAsync_ptsz(&d[i], MIB, NULL), "cuMemAllocAsync_ptsz");
    must(cuMemFreeAsync_ptsz(d[0], NULL), "cuMemFreeAsync_ptsz"); /* 1 MiB stays */
    must(cuCtxSynchronize(), "sync");
}
__attribute__((noinline)) void dev_create(void)
{
    Prop p; memset(&p, 0, sizeof p); p.type = 1; p.location.type = 1; p.location.id = 0;
    CUhandle h[2];
    for (int i = 0; i < 2; i++) must(cuMemCreate(&h[i], 2 * MIB, &p, 0), "cuMemCreate");
    must(cuMemRelease(h[0]), "cuMemRelease");
    CUdeviceptr va;
    must(cuMemAddressReserve(&va, 2 * MIB, 0, 0, 0), "cuMemAddressReserve");
    must(cuMemMap(va, 2 * MIB, 0, h[1], 0), "cuMemMap");
    Access a; memset(&a, 0, sizeof a); a.location.type = 1; a.flags = 3;
    must(cuMemSetAccess(va, 2 * MIB, &a, 1), "cuMemSetAccess");
}
__attribute__((noinline)) void host_pinned(void)
{
    void *p[3], *q;
    for (int i = 0; i < 2; i++) must(cuMemAllocHost_v2(&q, 3 * MIB), "cuMemAllocHost_v2");
    for (int i = 0; i < 3; i++) must(cuMemHostAlloc(&p[i], 7 * MIB + 4099, 0), "cuMemHostAlloc");
    must(cuMemFreeHost(p[0]), "cuMemFreeHost");
}
__attribute__((noinline)) void host_managed(void)
{
    CUdeviceptr m[2];
    for (int i = 0; i < 2; i++) must(cuMemAllocManaged(&m[i], 16 * MIB, 1), "cuMemAllocManaged");
    must(cuMemFree_v2(m[0]), "free managed");
}
__attribute__((noinline)) void host_register(void)
{
    void *b = aligned_alloc(4096, MIB);
    must(cuMemHostRegister_v2(b, MIB, 0), "cuMemHostRegister_v2");
}

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    L(h, cuInit); L(h, cuDeviceGet); L(h, cuCtxCreate_v2); L(h, cuCtxSynchronize); L(h, cuMemAlloc_v2);
    L(h, cuMemFree_v2); L(h, cuMemAllocAsync); L(h, cuMemFreeAsync); L(h, cuMemAllocHost_v2);
    L(h, cuMemFreeHost); L(h, cuMemHostAlloc); L(h, cuMemHostRegister_v2); L(h, cuMemAllocManaged);
    L(h, cuMemCreate); L(h, cuMemRelease); L(h, cuMemAddressReserve); L(h, cuMemMap); L(h, cuMemSetAccess);
    L(h, cuMemGetInfo_v2); L(h, cuMemAllocAsync_ptsz); L(h, cuMemFreeAsync_ptsz);
    int dev; void *ctx; size_t fr0, fr1, tot;
    must(cuInit(0), "cuInit"); must(cuDeviceGet(&dev, 0), "cuDeviceGet");
    must(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
    sleep(1);  /* the tracer probes libcuda once it is loaded */
    must(cuMemGetInfo_v2(&fr0, &tot), "cuMemGetInfo");
    dev_alloc(); dev_async(); dev_async_ptsz(); dev_create(); host_pinned(); host_managed(); host_register();
    must(cuMemGetInfo_v2(&fr1, &tot), "cuMemGetInfo");
    printf("memgetinfo_delta %zu\n", fr0 - fr1);
    fflush(stdout);
    sleep(2);
    printf("done\n");
    return 0;
}
