/* Malloc-heavy loop for the overhead benchmarks (bench/overhead.py, bench/unwind_cost.py).
 *   malloc_loop [--threads N] [--iters N] [--depth D] [--wait-signal]
 * Each thread descends D noinline frames (default 0), then keeps a ring of 64 blocks: every
 * iteration frees the oldest and allocates a new one from a cycle of size classes (16 B ..
 * 16 KiB), so every malloc's stack is D + a few frames deep. Prints "ready <pid>" with
 * --wait-signal and waits for SIGUSR1; then "elapsed <seconds>" of the work alone.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ready.h"

static long iters = 500000;
static int depth = 0;
static const size_t sizes[] = {16, 24, 48, 64, 100, 256, 512, 1024, 4096, 16384};
void *volatile sink;

__attribute__((noinline, noipa)) static void *alloc_block(size_t n) { return malloc(n); }

__attribute__((noinline, noipa)) static long work(void)
{
    void *ring[64] = {0};
    for (long i = 0; i < iters; i++) {
        int slot = (int)(i & 63);
        free(ring[slot]);
        ring[slot] = alloc_block(sizes[i % 10]);
        ((volatile char *)ring[slot])[0] = 1;
    }
    for (int s = 0; s < 64; s++)
        free(ring[s]);
    return iters;
}

__attribute__((noinline, noipa)) static long descend(int d)
{
    long r = d > 0 ? descend(d - 1) : work();
    sink = &r; /* not a tail call: the frame stays */
    return r + 1;
}

static void *worker(void *arg)
{
    (void)arg;
    descend(depth);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 2, wait = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
            depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--wait-signal"))
            wait = 1;
    }
    if (wait)
        ready_then_wait();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_t t[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("elapsed %.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
