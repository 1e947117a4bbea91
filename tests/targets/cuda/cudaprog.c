/* Test target: GPU-style memory with exactly known figures, through the driver API of a
 * libcuda.so.1 (the stand-in, tests/targets/cuda/libcuda_standin.c, in a private directory),
 * plus shared mappings made by the program itself. tests/test_cuda_bpf.py holds the figures.
 *
 *   cudaprog LIBDIR [--linger]
 *     prints "ready <pid>", waits for SIGUSR1, then dlopen()s LIBDIR/libcuda.so.1 (so the
 *     tracer must find the driver after it attached) and LIBDIR/libcudart.so.13 (the stand-in
 *     runtime, tests/targets/cuda/libcudart_standin.c), works in four named threads and prints
 *     "done"; with --linger it then sleeps until killed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common.h"

#define NOINLINE __attribute__((noinline))
#define MIB (1024 * 1024)
#define PAGE 4096

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;

static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
static CUresult (*cuMemAllocHost_v2)(void **, size_t);
static CUresult (*cuMemFreeHost)(void *);
static CUresult (*cuMemHostRegister_v2)(void *, size_t, unsigned);
static CUresult (*cuMemHostUnregister)(void *);
static CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
static CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*cuMemFree_v2)(CUdeviceptr);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
static CUresult (*cuMemCreate)(CUhandle *, size_t, const void *, unsigned long long);
static CUresult (*cuMemRelease)(CUhandle);
static CUresult (*cuInit)(unsigned);
static CUresult (*cuCtxCreate_v2)(void **, unsigned, int);
/* the runtime API (cudaError_t is an int, 0: cudaSuccess) */
static int (*cudaMalloc)(void **, size_t);
static int (*cudaFree)(void *);
static int (*cudaHostAlloc)(void **, size_t, unsigned);
static int (*cudaMallocHost)(void **, size_t);

void *volatile sink;

static void must(CUresult r, const char *what)
{
    if (r != 0) {
        fprintf(stderr, "%s failed: %d\n", what, r);
        exit(1);
    }
}

/* --- thread "pinner": pinned host memory -------------------------------------------------- */

NOINLINE void pin_host_alloc(void)
{
    void *p[3];
    for (int i = 0; i < 3; i++)
        must(cuMemHostAlloc(&p[i], 7 * MIB + 4099, 0), "cuMemHostAlloc");
    must(cuMemFreeHost(p[0]), "cuMemFreeHost"); /* 2 stay */
}

NOINLINE void pin_alloc_host(void)
{
    void *p;
    for (int i = 0; i < 2; i++)
        must(cuMemAllocHost_v2(&p, 3 * MIB), "cuMemAllocHost_v2");
}

NOINLINE char *pin_buffer(void)
{
    return malloc(MIB);
}

NOINLINE void pin_register(void)
{
    char *a = pin_buffer(), *b = pin_buffer();
    must(cuMemHostRegister_v2(a, MIB, 0), "cuMemHostRegister_v2"); /* stays registered */
    must(cuMemHostRegister_v2(b, MIB, 0), "cuMemHostRegister_v2");
    must(cuMemHostUnregister(b), "cuMemHostUnregister");
    sink = a;
}

NOINLINE void pin_fail(void)
{
    void *p;
    if (cuMemHostAlloc(&p, (size_t)1 << 41, 0) == 0) /* the stand-in refuses > 1 TiB */
        exit(2);
}

static void *pinner(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "pinner");
    pin_host_alloc();
    pin_alloc_host();
    pin_register();
    pin_fail();
    return NULL;
}

/* --- thread "gpu-0": device memory ------------------------------------------------------------ */

NOINLINE void dev_alloc(void)
{
    CUdeviceptr d[5];
    for (int i = 0; i < 5; i++)
        must(cuMemAlloc_v2(&d[i], 64 * MIB), "cuMemAlloc_v2");
    must(cuMemFree_v2(d[1]), "cuMemFree_v2");
    must(cuMemFree_v2(d[3]), "cuMemFree_v2"); /* 3 stay */
}

NOINLINE void dev_pitch(void)
{
    CUdeviceptr d;
    size_t pitch = 0;
    must(cuMemAllocPitch_v2(&d, &pitch, 1000, 77, 4), "cuMemAllocPitch_v2"); /* pitch 1024 */
}

NOINLINE void dev_async(void)
{
    CUdeviceptr d[4];
    for (int i = 0; i < 4; i++)
        must(cuMemAllocAsync(&d[i], MIB, NULL), "cuMemAllocAsync");
    for (int i = 0; i < 4; i++)
        must(cuMemFreeAsync(d[i], NULL), "cuMemFreeAsync");
}

NOINLINE void dev_create(void)
{
    CUhandle h[2];
    for (int i = 0; i < 2; i++)
        must(cuMemCreate(&h[i], 2 * MIB, NULL, 0), "cuMemCreate");
    must(cuMemRelease(h[0]), "cuMemRelease"); /* 1 stays */
}

NOINLINE void dev_fail(void)
{
    CUdeviceptr d;
    for (int i = 0; i < 2; i++)
        if (cuMemAlloc_v2(&d, (size_t)1 << 41) == 0)
            exit(2);
}

static void *gpu(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "gpu-0");
    dev_alloc();
    dev_pitch();
    dev_async();
    dev_create();
    dev_fail();
    return NULL;
}

/* --- thread "managed": managed memory and the program's own shared mappings -------------------- */

NOINLINE void managed_alloc(void)
{
    CUdeviceptr d[3];
    for (int i = 0; i < 3; i++) {
        must(cuMemAllocManaged(&d[i], 2 * MIB + 1, 1), "cuMemAllocManaged");
        memset((void *)(size_t)d[i], 1, 2 * MIB + 1); /* touched on the host */
    }
    must(cuMemFree_v2(d[2]), "cuMemFree_v2"); /* 2 stay */
}

NOINLINE void shm_anon(void)
{
    char *p = mmap(NULL, 9 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(p, 1, 9 * PAGE);
    sink = p;
}

NOINLINE void shm_memfd(void)
{
    int fd = memfd_create("cudaprog", 0);
    if (ftruncate(fd, 5 * PAGE) != 0)
        exit(3);
    char *p = mmap(NULL, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    memset(p, 1, 5 * PAGE);
    sink = p;
}

NOINLINE void devzero_map(void)
{
    int fd = open("/dev/zero", O_RDWR);
    sink = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
}

NOINLINE void file_map(const char *path)
{
    int fd = open(path, O_RDONLY);
    sink = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, fd, 0); /* a regular file: not an allocation */
    close(fd);
}

static const char *self_path;

static void *managed(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "managed");
    managed_alloc();
    shm_anon();
    shm_memfd();
    devzero_map();
    file_map(self_path);
    return NULL;
}

/* --- thread "cudart": the runtime API, and the driver's own state ------------------------------ */

NOINLINE void ctx_setup(void)
{
    void *ctx;
    must(cuInit(0), "cuInit");
    for (int i = 0; i < 2; i++)
        must(cuCtxCreate_v2(&ctx, 0, 0), "cuCtxCreate_v2");
}

NOINLINE void rt_malloc(void)
{
    void *d[3];
    for (int i = 0; i < 3; i++)
        must(cudaMalloc(&d[i], 16 * MIB), "cudaMalloc");
    must(cudaFree(d[0]), "cudaFree"); /* 2 stay */
}

NOINLINE void rt_host(void)
{
    void *p;
    for (int i = 0; i < 2; i++)
        must(cudaHostAlloc(&p, 4 * MIB, 0), "cudaHostAlloc");
    must(cudaMallocHost(&p, 2 * MIB), "cudaMallocHost");
}

static void *cudart(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "cudart");
    ctx_setup();
    rt_malloc();
    rt_host();
    return NULL;
}

#define SYM(name)                                                                                  \
    do {                                                                                           \
        *(void **)&name = dlsym(lib, #name);                                                       \
        if (!name) {                                                                               \
            fprintf(stderr, "no %s in %s\n", #name, path);                                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: cudaprog LIBDIR [--linger]\n");
        return 2;
    }
    int linger = argc > 2 && !strcmp(argv[2], "--linger");
    self_path = argv[0];
    sigset_t set;
    block_usr1(&set);
    signal(SIGUSR1, on_usr1);
    ready_wait_usr1(&set);

    char path[4096];
    snprintf(path, sizeof path, "%s/libcuda.so.1", argv[1]);
    void *lib = dlopen(path, RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    SYM(cuMemHostAlloc);
    SYM(cuMemAllocHost_v2);
    SYM(cuMemFreeHost);
    SYM(cuMemHostRegister_v2);
    SYM(cuMemHostUnregister);
    SYM(cuMemAllocManaged);
    SYM(cuMemAlloc_v2);
    SYM(cuMemAllocPitch_v2);
    SYM(cuMemAllocAsync);
    SYM(cuMemFree_v2);
    SYM(cuMemFreeAsync);
    SYM(cuMemCreate);
    SYM(cuMemRelease);
    SYM(cuInit);
    SYM(cuCtxCreate_v2);
    snprintf(path, sizeof path, "%s/libcudart.so.13", argv[1]);
    lib = dlopen(path, RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    SYM(cudaMalloc);
    SYM(cudaFree);
    SYM(cudaHostAlloc);
    SYM(cudaMallocHost);
    printf("loaded\n");
    fflush(stdout);
    /* the tracer probes the driver once it sees it mapped: wait for its word on stdin */
    char go[8];
    if (!fgets(go, sizeof go, stdin))
        return 1;

    pthread_t t[4];
    pthread_create(&t[0], NULL, pinner, NULL);
    pthread_join(t[0], NULL);
    pthread_create(&t[1], NULL, gpu, NULL);
    pthread_join(t[1], NULL);
    pthread_create(&t[2], NULL, managed, NULL);
    pthread_join(t[2], NULL);
    pthread_create(&t[3], NULL, cudart, NULL);
    pthread_join(t[3], NULL);
    printf("done\n");
    flush_linger(linger);
    return 0;
}
