/* Thread-arena test target: three named threads each own a glibc thread arena created before
 * the tracer attaches, then leave known live and freed (retained) bytes in it and measure their
 * own heap with mincore, for tests/test_residency_bpf.py to compare with the trace.
 *
 *   arenas [--linger]
 * Prints "ready <pid>", waits for SIGUSR1. Thread arena-i (i = 1..3) then allocates 1500*i
 * blocks of 8000 bytes, touches them, frees every other one (the holes stay resident: glibc
 * cannot trim between live blocks), and prints
 *   "arena arena-i tid=T heap=0xH live=L resident=R"
 * where R is mincore() over its heap's used part. Then "done" (and sleeps with --linger).
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

#include "common.h"

#define BLK 8000
#define HEAP_MAX (64UL << 20)

static pthread_barrier_t created, go;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile sink;

__attribute__((noinline)) void fill_arena(int i)
{
    int n = 1500 * i;
    void **b = malloc(sizeof(void *) * n); /* freed below: not part of the live figure */
    for (int k = 0; k < n; k++) {
        b[k] = malloc(BLK);
        memset(b[k], i, BLK);
    }
    for (int k = 1; k < n; k += 2)
        free(b[k]);
    uintptr_t heap = (uintptr_t)b[0] & ~(HEAP_MAX - 1);
    size_t used = *(size_t *)(heap + 16); /* heap_info.size */
    size_t pages = used / 4096;
    unsigned char *vec = malloc(pages);
    mincore((void *)heap, used, vec);
    size_t res = 0;
    for (size_t p = 0; p < pages; p++)
        res += vec[p] & 1;
    free(vec);
    long live = (long)((n + 1) / 2) * BLK;
    sink = b[0];
    free(b);
    pthread_mutex_lock(&print_lock);
    printf("arena arena-%d tid=%d heap=%#lx live=%ld resident=%zu\n", i, gettid(), (unsigned long)heap, live,
           res * 4096);
    fflush(stdout);
    pthread_mutex_unlock(&print_lock);
}

static void *thread_main(void *arg)
{
    int i = (int)(intptr_t)arg;
    char name[16];
    snprintf(name, sizeof name, "arena-%d", i);
    pthread_setname_np(pthread_self(), name);
    sink = malloc(64); /* creates this thread's arena before the tracer attaches */
    free(sink);
    pthread_barrier_wait(&created);
    pthread_barrier_wait(&go);
    fill_arena(i);
    return NULL;
}

int main(int argc, char **argv)
{
    int linger = argc > 1 && !strcmp(argv[1], "--linger");
    sigset_t set;
    block_usr1(&set);
    pthread_barrier_init(&created, NULL, 4);
    pthread_barrier_init(&go, NULL, 4);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, thread_main, (void *)(intptr_t)(i + 1));
    pthread_barrier_wait(&created);
    ready_wait_usr1(&set);
    pthread_barrier_wait(&go);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    printf("done\n");
    flush_linger(linger);
    return 0;
}
