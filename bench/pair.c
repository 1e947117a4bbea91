/* The price of one malloc+free pair, for bench/inject_floor.py:  pair [--size 32] [--batch 2000000]
 * Prints "ready <pid>", then times batches of `batch` pairs of malloc(size) + a one-byte write +
 * free, and prints "ns <nanoseconds per pair>" after each, until killed. Timed through volatile
 * function pointers so that the compiler cannot fold the pair away; the same process read before,
 * during and after an injected recording gives plain vs hooked. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *(*volatile do_malloc)(size_t) = malloc;
static void (*volatile do_free)(void *) = free;

int main(int argc, char **argv)
{
    size_t size = 32;
    long batch = 2000000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size"))
            size = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atol(argv[i + 1]);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < batch; i++) {
            char *p = do_malloc(size);
            *(volatile char *)p = 1;
            do_free(p);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("ns %.3f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)batch);
        fflush(stdout);
    }
}
