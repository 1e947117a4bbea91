/* Test target with exactly known allocations through every traced API.
 *
 * Each allocation site is its own noinline function, sizes are distinctive and counts prime,
 * so a wrong attribution shows at once. tests/test_record.py holds the expected figures.
 *
 *   apis [--wait-signal] [--linger]
 *     --wait-signal  print "ready <pid>" and wait for SIGUSR1 before working (attach first)
 *     --linger       after the work, print "done" and sleep until killed
 *
 * Threads: main (frees the pre-attach blocks), "alpha" (most APIs), "beta" (own leak, and
 * frees what alpha hands over).
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

#define NOINLINE __attribute__((noinline))
#define PAGE 4096

void *volatile sink; /* keeps the compiler from eliding malloc/free pairs */
static void *pre_attach[5];
static void *handoff[29];
static sem_t handoff_ready;
static void *kept[128];
static int nkept;

static void keep(void *p)
{
    kept[nkept++] = p;
    sink = p;
}

NOINLINE void pre_attach_alloc(void)
{
    for (int i = 0; i < 5; i++)
        pre_attach[i] = malloc(333);
}

NOINLINE void free_preattach(void)
{
    for (int i = 0; i < 5; i++)
        free(pre_attach[i]);
}

NOINLINE void leak_malloc(void)
{
    for (int i = 0; i < 7; i++)
        keep(malloc(1013));
}

NOINLINE void leak_calloc(void)
{
    for (int i = 0; i < 11; i++)
        keep(calloc(17, 61));
}

NOINLINE void leak_realloc(void)
{
    for (int i = 0; i < 3; i++) {
        void *p = malloc(100);
        sink = p;
        keep(realloc(p, 5003));
    }
}

NOINLINE void leak_reallocarray(void)
{
    for (int i = 0; i < 5; i++)
        keep(reallocarray(NULL, 13, 97));
}

NOINLINE void leak_posix_memalign(void)
{
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        if (posix_memalign(&p, 64, 777) == 0)
            keep(p);
    }
}

NOINLINE void leak_aligned_alloc(void)
{
    for (int i = 0; i < 2; i++)
        keep(aligned_alloc(256, 2048));
}

NOINLINE void leak_memalign(void)
{
    for (int i = 0; i < 2; i++)
        keep(memalign(128, 999));
}

NOINLINE void leak_valloc(void)
{
    for (int i = 0; i < 2; i++)
        keep(valloc(3001));
}

NOINLINE void leak_pvalloc(void)
{
    keep(pvalloc(5000));
}

NOINLINE void churn(void)
{
    for (int i = 0; i < 1000; i++) {
        void *p = malloc(4099);
        sink = p;
        free(p);
    }
}

NOINLINE void big_malloc(void)
{
    keep(malloc(1048583)); /* above the mmap threshold: glibc mmaps it inside malloc */
}

NOINLINE void map_partial(void)
{
    char *p = mmap(NULL, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p + 1 * PAGE, PAGE);
    munmap(p + 4 * PAGE, PAGE); /* 3 pages stay */
    sink = p;
}

NOINLINE void map_remap(void)
{
    char *p = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    sink = mremap(p, 4 * PAGE, 9 * PAGE, MREMAP_MAYMOVE); /* 9 pages stay */
}

NOINLINE void map_shrink(void)
{
    char *p = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    sink = mremap(p, 8 * PAGE, 2 * PAGE, 0); /* 2 pages stay */
}

NOINLINE void map_full_unmap(void)
{
    char *p = mmap(NULL, 6 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    sink = p;
    munmap(p, 6 * PAGE);
}

NOINLINE void handoff_alloc(void)
{
    for (int i = 0; i < 29; i++)
        handoff[i] = malloc(3331);
    sem_post(&handoff_ready);
}

NOINLINE void handoff_free(void)
{
    sem_wait(&handoff_ready);
    for (int i = 0; i < 29; i++)
        free(handoff[i]);
}

NOINLINE void leak_beta(void)
{
    for (int i = 0; i < 13; i++)
        keep(malloc(2203));
}

static void *alpha_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "alpha");
    leak_malloc();
    leak_calloc();
    leak_realloc();
    leak_reallocarray();
    leak_posix_memalign();
    leak_aligned_alloc();
    leak_memalign();
    leak_valloc();
    leak_pvalloc();
    churn();
    big_malloc();
    map_partial();
    map_remap();
    map_shrink();
    map_full_unmap();
    handoff_alloc();
    malloc_trim(0);
    return NULL;
}

static void *beta_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "beta");
    leak_beta(); /* alpha has been joined: keep() is not shared */
    handoff_free();
    return NULL;
}

int main(int argc, char **argv)
{
    int wait_signal = 0, linger = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait-signal"))
            wait_signal = 1;
        else if (!strcmp(argv[i], "--linger"))
            linger = 1;
    }
    sem_init(&handoff_ready, 0, 0);
    pre_attach_alloc();
    if (wait_signal) {
        sigset_t set;
        block_usr1(&set);
        signal(SIGUSR1, on_usr1);
        ready_wait_usr1(&set);
    }
    free_preattach();
    pthread_t a, b;
    pthread_create(&a, NULL, alpha_main, NULL);
    pthread_join(a, NULL);
    pthread_create(&b, NULL, beta_main, NULL);
    pthread_join(b, NULL);
    printf("done\n");
    flush_linger(linger);
    return 0;
}
