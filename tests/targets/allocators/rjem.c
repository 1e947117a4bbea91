/* Test target: the allocator set-up of a Rust daemon built with tikv-jemallocator — a prefixed
 * jemalloc linked into the executable (`_rjem_*` entry points) serving the program's own data,
 * while a C library it links (libplain.so, plain.c) still calls glibc's malloc. The `_rjem_*`
 * functions here have jemalloc's names and C signatures over a small mmap-backed arena of their
 * own (a stand-in: not jemalloc). tests/test_allocators_bpf.py holds the figures.
 *
 *   rjem [--linger]   prints "ready <pid>", waits for SIGUSR1, works in thread "worker", prints
 *                     "done"; with --linger it then sleeps until killed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common.h"

#define NOINLINE __attribute__((noinline))
#define USED __attribute__((used, noinline))
#define MALLOCX_ZERO 0x40

void *plain_alloc(size_t n); /* libplain.so: glibc malloc */
void plain_free(void *p);

/* --- the stand-in jemalloc: a bump arena with a 16-byte header, frees put on a list ---------- */
static char *arena, *arena_end, *bump;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *carve(size_t n, int zero)
{
    pthread_mutex_lock(&mu);
    size_t need = (n + 16 + 15) & ~(size_t)15;
    char *p = NULL;
    if (bump + need <= arena_end) {
        p = bump;
        bump += need;
    }
    pthread_mutex_unlock(&mu);
    if (!p)
        return NULL;
    *(size_t *)p = n;
    if (zero)
        memset(p + 16, 0, n);
    return p + 16;
}

static size_t size_of(void *p) { return *(size_t *)((char *)p - 16); }

USED void *_rjem_malloc(size_t n) { return carve(n, 0); }
USED void *_rjem_calloc(size_t a, size_t b) { return carve(a * b, 1); }
/* A bump arena: a free only counts (visibly, so the compiler keeps every call to the frees). */
static volatile long released;
static void release(void *p) { if (p) released++; }

USED void _rjem_free(void *p) { release(p); }
USED void _rjem_sdallocx(void *p, size_t size, int flags) { (void)size; (void)flags; release(p); }
USED void _rjem_dallocx(void *p, int flags) { (void)flags; release(p); }
USED void *_rjem_mallocx(size_t n, int flags) { return carve(n, flags & MALLOCX_ZERO); }

USED void *_rjem_rallocx(void *p, size_t n, int flags)
{
    void *q = carve(n, flags & MALLOCX_ZERO);
    if (q && p) {
        size_t old = size_of(p);
        memcpy(q, p, old < n ? old : n);
        release(p);
    }
    return q;
}

USED void *_rjem_realloc(void *p, size_t n) { return _rjem_rallocx(p, n, 0); }

USED int _rjem_posix_memalign(void **out, size_t align, size_t n)
{
    (void)align; /* the arena's blocks are 16-aligned; the tests ask for 16 */
    void *p = carve(n, 0);
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

/* --- the program ----------------------------------------------------------------------------- */
static void *kept[256];
static int nkept;
static void keep(void *p) { kept[nkept++] = p; }

NOINLINE void rust_vec_push(void)        /* Vec growth: mallocx then rallocx */
{
    for (int i = 0; i < 5; i++) {
        void *p = _rjem_mallocx(64, 0);
        keep(_rjem_rallocx(p, 4096, 0)); /* 5 x 4096 live, the 64s freed */
    }
}

NOINLINE void rust_box_new(void)         /* Box::new: malloc, some dropped with sdallocx */
{
    for (int i = 0; i < 7; i++) {
        void *p = _rjem_malloc(333);
        if (i < 3)
            _rjem_sdallocx(p, 333, 0);   /* 4 x 333 live */
        else
            keep(p);
    }
}

NOINLINE void rust_zeroed(void)          /* calloc and mallocx(MALLOCX_ZERO) */
{
    keep(_rjem_calloc(11, 17));
    keep(_rjem_mallocx(1000, MALLOCX_ZERO));
}

NOINLINE void rust_aligned(void)
{
    void *p;
    if (_rjem_posix_memalign(&p, 16, 777) == 0)
        keep(p);
    if (_rjem_posix_memalign(&p, 16, (size_t)1 << 40) == 0) /* fails: not an allocation */
        keep(p);
}

NOINLINE void rust_dealloc(void)
{
    void *p = _rjem_malloc(5000);
    _rjem_dallocx(p, 0);                 /* freed */
}

NOINLINE void c_library_work(void)       /* the C library's own glibc mallocs */
{
    for (int i = 0; i < 9; i++) {
        void *p = plain_alloc(2203);
        if (i % 3 == 0)
            plain_free(p);               /* 6 x 2203 live */
        else
            keep(p);
    }
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "worker");
    rust_vec_push();
    rust_box_new();
    rust_zeroed();
    rust_aligned();
    rust_dealloc();
    c_library_work();
    return NULL;
}

int main(int argc, char **argv)
{
    int linger = argc > 1 && !strcmp(argv[1], "--linger");
    arena = mmap(NULL, 64 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bump = arena;
    arena_end = arena + (64 << 20);
    sigset_t set;
    block_usr1(&set);
    signal(SIGUSR1, on_usr1);
    ready_wait_usr1(&set);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    printf("done\n");
    flush_linger(linger);
    return 0;
}
