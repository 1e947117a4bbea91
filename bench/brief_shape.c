/* The brief's memory shape in small (issue 50; bench/overhead.py --workload brief):
 *   brief_shape [--threads 2] [--iters 60] [--mib 40] [--keep 2] [--wait-signal]
 * Each thread mallocs a MIB-MiB buffer per iteration (glibc maps it: above its mmap threshold),
 * writes one byte into every page (a first-touch page fault each), sums a byte a page, keeps the
 * last KEEP buffers alive and frees the oldest: the partitions of the brief's proving daemon,
 * few allocator calls and every page touched. With --wait-signal it prints "ready <pid>", waits
 * for SIGUSR1, then prints "elapsed <seconds>" of the work alone and "faults <n>" (its minor
 * faults over the work, getrusage) and "cpu <seconds>" (its user + system time over the work).
 * With --blocks (bench/paired.py) it prints "ready <pid>" and then, for each line read on stdin,
 * runs the threads for --iters iterations each (a block) and prints "block <wall s> <cpu s>
 * <faults>" of that block alone; it exits at the end of stdin. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ready.h"

static long iters = 60, mib = 40;
static int keep = 2;
static volatile unsigned long sink;

__attribute__((noinline, noipa)) static char *make_buffer(size_t n)
{
    return malloc(n);
}

__attribute__((noinline, noipa)) static unsigned long fill(char *b, size_t n)
{
    unsigned long s = 0;
    for (size_t off = 0; off < n; off += 4096) {
        b[off] = (char)off;
        s += (unsigned char)b[off];
    }
    return s;
}

static double seconds(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) + (b->tv_nsec - a->tv_nsec) / 1e9;
}

static double cpu_between(const struct rusage *a, const struct rusage *b)
{
    return (b->ru_utime.tv_sec - a->ru_utime.tv_sec) + (b->ru_stime.tv_sec - a->ru_stime.tv_sec) +
           ((b->ru_utime.tv_usec - a->ru_utime.tv_usec) + (b->ru_stime.tv_usec - a->ru_stime.tv_usec)) / 1e6;
}

static void *worker(void *arg)
{
    (void)arg;
    size_t n = (size_t)mib << 20;
    char *ring[64] = {0};
    unsigned long s = 0;
    for (long i = 0; i < iters; i++) {
        int slot = (int)(i % (keep + 1));
        free(ring[slot]); /* the oldest of keep + 1 */
        ring[slot] = make_buffer(n);
        if (!ring[slot]) {
            perror("malloc");
            exit(1);
        }
        s += fill(ring[slot], n);
    }
    for (int k = 0; k <= keep; k++)
        free(ring[k]);
    sink += s;
    return NULL;
}

static void run_threads(int threads)
{
    pthread_t tid[256];
    for (int t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, worker, NULL);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
}

int main(int argc, char **argv)
{
    int threads = 2, wait = 0, blocks = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--keep") && i + 1 < argc)
            keep = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--wait-signal"))
            wait = 1;
        else if (!strcmp(argv[i], "--blocks"))
            blocks = 1;
        else {
            fprintf(stderr,
                    "usage: brief_shape [--threads N] [--iters N] [--mib N] [--keep N] [--wait-signal | --blocks]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 256 || keep < 1 || keep > 63 || mib < 1 || iters < 1) {
        fprintf(stderr, "brief_shape: bad arguments\n");
        return 2;
    }
    if (blocks) {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        char line[256];
        while (fgets(line, sizeof line, stdin)) {
            struct rusage r0, r1;
            struct timespec t0, t1;
            getrusage(RUSAGE_SELF, &r0);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            run_threads(threads);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            getrusage(RUSAGE_SELF, &r1);
            printf("block %.6f %.6f %ld\n", seconds(&t0, &t1), cpu_between(&r0, &r1), r1.ru_minflt - r0.ru_minflt);
            fflush(stdout);
        }
        return 0;
    }
    if (wait)
        ready_then_wait();
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_threads(threads);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &r1);
    printf("elapsed %.6f\nfaults %ld\ncpu %.6f\n", seconds(&t0, &t1), r1.ru_minflt - r0.ru_minflt,
           cpu_between(&r0, &r1));
    fflush(stdout);
    return 0;
}
