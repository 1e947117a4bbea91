/* Memory from before the attach, in several glibc arenas, for the census (tracer/allocators/census.py).
 *
 *   census   4 worker threads (each its own arena) and the main thread allocate before the
 *            attach: every worker PRE_BLOCKS blocks of PRE_BYTES, main MAIN_BLOCKS of PRE_BYTES,
 *            SMALL_BLOCKS small ones (24..200 bytes) and two mmapped chunks of MMAP_BYTES; all
 *            written to. Prints "ready". On SIGUSR1: every thread frees every other block of its
 *            own (and main one mmapped chunk and half its small ones), then every worker allocates
 *            POST_BLOCKS blocks of POST_BYTES and main one mmapped chunk of MMAP_BYTES, all
 *            kept and written to; prints "truth before=B since=S before_chunk=BC since_chunk=SC
 *            arena=A uord=U ford=F hblkhd=H" — its own counts (requested bytes; chunk bytes:
 *            malloc_usable_size + 8) of what is live from before and since the SIGUSR1, and
 *            mallinfo2() — then "done", and waits to be killed.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define NOINLINE __attribute__((noinline))
#define WORKERS 4
#define PRE_BLOCKS 5000
#define PRE_BYTES 8000
#define MAIN_BLOCKS 2000
#define SMALL_BLOCKS 20000
#define POST_BLOCKS 4000
#define POST_BYTES 2000
#define MMAP_BYTES (4 << 20)

static void *pre[WORKERS + 1][PRE_BLOCKS];
static void *post[WORKERS][POST_BLOCKS];
static void *small[SMALL_BLOCKS];
static void *big[3];
static long before, since, before_chunk, since_chunk;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t allocated, go, finished;

static void *touch(size_t n)
{
    void *p = malloc(n);
    memset(p, 0x5a, n);
    return p;
}

static void count(long *req, long *chunk, void *p, size_t n)
{
    pthread_mutex_lock(&mu);
    *req += n;
    *chunk += malloc_usable_size(p) + 8;
    pthread_mutex_unlock(&mu);
}

NOINLINE void after_attach(int t)
{
    for (int i = 0; i < POST_BLOCKS; i++) {
        post[t][i] = touch(POST_BYTES);
        count(&since, &since_chunk, post[t][i], POST_BYTES);
    }
}

static void *worker(void *arg)
{
    int t = (int)(long)arg;
    for (int i = 0; i < PRE_BLOCKS; i++)
        pre[t][i] = touch(PRE_BYTES);
    pthread_barrier_wait(&allocated);
    pthread_barrier_wait(&go);
    for (int i = 0; i < PRE_BLOCKS; i += 2) {
        free(pre[t][i]);
        pre[t][i] = NULL;
    }
    after_attach(t);
    for (int i = 0; i < PRE_BLOCKS; i++)
        if (pre[t][i])
            count(&before, &before_chunk, pre[t][i], PRE_BYTES);
    pthread_barrier_wait(&finished);
    for (;;)
        pause();
    return NULL;
}

int main(void)
{
    sigset_t usr1;
    int sig;
    block_usr1(&usr1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_barrier_init(&allocated, NULL, WORKERS + 1);
    pthread_barrier_init(&go, NULL, WORKERS + 1);
    pthread_barrier_init(&finished, NULL, WORKERS + 1);
    pthread_t th[WORKERS];
    for (int t = 0; t < WORKERS; t++)
        pthread_create(&th[t], NULL, worker, (void *)(long)t);
    for (int i = 0; i < MAIN_BLOCKS; i++)
        pre[WORKERS][i] = touch(PRE_BYTES);
    for (int i = 0; i < SMALL_BLOCKS; i++)
        small[i] = touch(24 + (i * 8) % 184);
    big[0] = touch(MMAP_BYTES);
    big[1] = touch(MMAP_BYTES);
    pthread_barrier_wait(&allocated);
    printf("ready\n");
    sigwait(&usr1, &sig);
    pthread_barrier_wait(&go);
    for (int i = 0; i < MAIN_BLOCKS; i += 2) {
        free(pre[WORKERS][i]);
        pre[WORKERS][i] = NULL;
    }
    for (int i = 0; i < SMALL_BLOCKS; i += 2) {
        free(small[i]);
        small[i] = NULL;
    }
    free(big[0]);
    big[2] = touch(MMAP_BYTES);
    count(&since, &since_chunk, big[2], MMAP_BYTES);
    for (int i = 0; i < MAIN_BLOCKS; i++)
        if (pre[WORKERS][i])
            count(&before, &before_chunk, pre[WORKERS][i], PRE_BYTES);
    for (int i = 0; i < SMALL_BLOCKS; i++)
        if (small[i])
            count(&before, &before_chunk, small[i], 24 + (i * 8) % 184);
    count(&before, &before_chunk, big[1], MMAP_BYTES);
    pthread_barrier_wait(&finished);
    struct mallinfo2 mi = mallinfo2();
    printf("truth before=%ld since=%ld before_chunk=%ld since_chunk=%ld arena=%zu uord=%zu ford=%zu hblkhd=%zu\n",
           before, since, before_chunk, since_chunk, mi.arena, mi.uordblks, mi.fordblks, mi.hblkhd);
    printf("done\n");
    for (;;)
        pause();
}
