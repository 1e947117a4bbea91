/* Test target: an mmap/munmap storm with exactly known shapes, for the in-kernel accounting of
 * the mmap family (probes/allocscope.c `regions`) and its rare-shape fallback.
 *
 *   storm [--pairs N] [--linger]
 *     prints "ready <pid>", waits for SIGUSR1, works, prints "done <rare>" where <rare> is how
 *     many calls of a rare shape it made (the probes hand those to the tracer); with --linger
 *     it then sleeps until killed.
 *
 * Thread "stormer", each shape in its own noinline function (tests/test_regions_bpf.py holds the
 * expected figures):
 *   storm_pair       N x (mmap 1..4 pages, touch, munmap whole)          common: 0 live
 *   storm_keep       37 x mmap 3 pages, kept                             common: 111 pages live
 *   storm_head       11 x (mmap 6 pages, munmap its first 2)             common: 44 pages live
 *   storm_span       5 x (mmap 2 regions back to back, munmap both in one call)  common: 0 live
 *   storm_remap      7 x (mmap 2 pages, mremap to 5, may move)           common: 35 pages live
 *   storm_middle     13 x (mmap 7 pages, munmap pages 2..3)              rare: 65 pages live
 *   storm_fixed      3 x (mmap 4 pages, mmap MAP_FIXED 2 pages over the 2nd and 3rd)
 *                    rare: 6 pages of storm_fixed + 6 pages of storm_fixed_over live
 *   storm_brk        sbrk(+5 pages), sbrk(-2 pages)                      brk: 3 pages live
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define PAGE 4096
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)
#define RW (PROT_READ | PROT_WRITE)

static long pairs = 100000;
static int rare;
void *volatile sink;

/* A macro, not a function: the site of each mapping is the storm_* function that makes it. */
#define map(pages) ((char *)mmap(NULL, (size_t)(pages) * PAGE, RW, ANON, -1, 0))

NOINLINE void storm_pair(void)
{
    for (long i = 0; i < pairs; i++) {
        size_t n = 1 + (size_t)(i % 4);
        char *p = map(n);
        p[0] = 1;
        munmap(p, n * PAGE);
    }
}

NOINLINE void storm_keep(void)
{
    for (int i = 0; i < 37; i++)
        sink = map(3);
}

NOINLINE void storm_head(void)
{
    for (int i = 0; i < 11; i++) {
        char *p = map(6);
        munmap(p, 2 * PAGE);
        sink = p;
    }
}

NOINLINE void storm_span(void)
{
    for (int i = 0; i < 5; i++) {
        /* reserve 3 pages, give the middle back, map two regions exactly into the hole's sides
         * is not possible without MAP_FIXED; instead map 2 regions and unmap them if adjacent */
        char *a = map(2);
        char *b = map(2);
        if (b + 2 * PAGE == a) { /* the kernel placed b right below a: one munmap frees both */
            munmap(b, 4 * PAGE);
        } else {
            munmap(a, 2 * PAGE);
            munmap(b, 2 * PAGE);
        }
    }
}

NOINLINE void storm_remap(void)
{
    for (int i = 0; i < 7; i++) {
        char *p = map(2);
        sink = mremap(p, 2 * PAGE, 5 * PAGE, MREMAP_MAYMOVE);
    }
}

NOINLINE void storm_middle(void)
{
    for (int i = 0; i < 13; i++) {
        char *p = map(7);
        munmap(p + 2 * PAGE, 2 * PAGE);
        rare++;
        sink = p;
    }
}

NOINLINE void storm_fixed_over(char *at)
{
    sink = mmap(at, 2 * PAGE, RW, ANON | MAP_FIXED, -1, 0);
    rare++;
}

NOINLINE void storm_fixed(void)
{
    for (int i = 0; i < 3; i++) {
        char *p = map(4);
        storm_fixed_over(p + PAGE);
    }
}

NOINLINE void storm_brk(void)
{
    sbrk(5 * PAGE);
    sbrk(-2 * PAGE);
    rare++; /* the break shrinking over tracked pages */
}

static void *stormer(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "stormer");
    storm_pair();
    storm_keep();
    storm_head();
    storm_span();
    storm_remap();
    storm_middle();
    storm_fixed();
    storm_brk();
    return NULL;
}

static void on_usr1(int sig) { (void)sig; }

int main(int argc, char **argv)
{
    int linger = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atol(argv[++i]);
        else if (!strcmp(argv[i], "--linger"))
            linger = 1;
    }
    sbrk(0);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGUSR1, on_usr1);
    pthread_t t; /* created before the attach: its stack is not part of the work */
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
    pthread_create(&t, NULL, stormer, NULL);
    pthread_join(t, NULL);
    printf("done %d\n", rare);
    fflush(stdout);
    if (linger)
        for (;;)
            pause();
    return 0;
}
