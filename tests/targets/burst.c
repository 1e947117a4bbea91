/* A burst shorter than the interval, one allocation function reached through 8 callers.
 *
 *   burst   prints "ready"; on SIGUSR1 keeps one block of KEEP_BYTES (keep_base), sleeps 1.3 s,
 *           then 8 threads, each through its own caller (caller0 .. caller7, as a work-stealing
 *           pool reaches one function), call burst_alloc() BLOCKS times (BLOCK_BYTES each,
 *           held); once all hold their blocks it prints "held <bytes>" (the program's own count,
 *           BURST_BYTES), holds them HOLD_MS, frees them all, prints "done" and waits to be
 *           killed.
 * So: burst_alloc's location peaks at exactly 8 x BLOCKS x BLOCK_BYTES = 384 MiB for 100 ms,
 * 8 stacks of 48 MiB each; the process's live total at the peak is that + KEEP_BYTES.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

#define NOINLINE __attribute__((noinline))
#define THREADS 8
#define BLOCKS 192
#define BLOCK_BYTES (256 << 10)
#define BURST_BYTES ((long)THREADS * BLOCKS * BLOCK_BYTES)
#define KEEP_BYTES 777777
#define HOLD_MS 100

void *volatile sink;
static void *blocks[THREADS][BLOCKS];
static pthread_barrier_t held, freed;

NOINLINE void *burst_alloc(size_t n)
{
    void *p = malloc(n);
    memset(p, 1, 64);
    return p;
}

NOINLINE void keep_base(void) { sink = malloc(KEEP_BYTES); }

static void work(int t)
{
    for (int i = 0; i < BLOCKS; i++)
        blocks[t][i] = burst_alloc(BLOCK_BYTES);
    pthread_barrier_wait(&held);
    pthread_barrier_wait(&freed);
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[t][i]);
}

#define CALLER(k) NOINLINE void *caller##k(void *a) { (void)a; work(k); __asm__ volatile(""); return 0; }
CALLER(0) CALLER(1) CALLER(2) CALLER(3) CALLER(4) CALLER(5) CALLER(6) CALLER(7)
static void *(*callers[THREADS])(void *) = {caller0, caller1, caller2, caller3, caller4, caller5, caller6,
                                            caller7};

static void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void)
{
    sigset_t usr1;
    int sig;
    block_usr1(&usr1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_barrier_init(&held, NULL, THREADS + 1);
    pthread_barrier_init(&freed, NULL, THREADS + 1);
    pthread_t th[THREADS];
    printf("ready\n");
    sigwait(&usr1, &sig);
    keep_base();
    nap(1300);
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, callers[t], NULL);
    pthread_barrier_wait(&held);
    printf("held %ld keep %d\n", BURST_BYTES, KEEP_BYTES);
    nap(HOLD_MS);
    pthread_barrier_wait(&freed);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    printf("done\n");
    for (;;)
        pause();
}
