/* Test target: mmap-family calls in flight while the probes attach (issue 53, item 6).
 *
 *   attachrace
 *     starts its two threads at once (they run while the tracer attaches), prints "ready <pid>",
 *     and on SIGUSR1 stops them, unmaps and frees everything, prints
 *     "stopped chunks=<n> maps=<n>" (calls made) and sleeps until killed.
 *
 * Thread "chunker", chunk_loop: malloc(CHUNK) and free of a block glibc serves with a mapping of
 *   its own (over the 32 MiB ceiling of its mmap threshold), back to back: an mmap inside malloc,
 *   a munmap inside free, a millisecond apart. Neither is ever the program's own mapping.
 * Thread "mapper", map_loop: mmap(MAP, MAP_POPULATE) and munmap: each mmap spends milliseconds in
 *   the kernel (populating), so one is usually in flight when the probes go live.
 *
 * Nothing is live at the end: a live mapping of either size, or an mmap site that is not
 * map_loop's, was made up at the attach. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common.h"

#define NOINLINE __attribute__((noinline))
#define CHUNK ((size_t)40 << 20 | 3 * 4096 | 123) /* 40 MiB + 3 pages + 123 B */
#define MAP ((size_t)24 << 20 | 5 * 4096)         /* 24 MiB + 5 pages */

static volatile int stop;
static long chunks, maps;

static NOINLINE void chunk_loop(void)
{
    while (!stop) {
        char *p = malloc(CHUNK);
        if (!p)
            abort();
        p[0] = 1;
        p[CHUNK - 1] = 1;
        usleep(1000); /* held: the probes usually attach between its malloc and its free */
        free(p);
        chunks++;
    }
}

static NOINLINE void map_loop(void)
{
    while (!stop) {
        char *p = mmap(NULL, MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED)
            abort();
        p[MAP - 1] = 1;
        munmap(p, MAP);
        maps++;
        usleep(1000);
    }
}

static void *chunker(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "chunker");
    chunk_loop();
    return NULL;
}

static void *mapper(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "mapper");
    map_loop();
    return NULL;
}

int main(void)
{
    sigset_t set;
    block_usr1(&set);
    pthread_t a, b;
    pthread_create(&a, NULL, chunker, NULL);
    pthread_create(&b, NULL, mapper, NULL);
    ready_wait_usr1(&set);
    stop = 1;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("stopped chunks=%ld maps=%ld\n", chunks, maps);
    flush_linger(1);
    return 0;
}
