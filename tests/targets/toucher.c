/* A steady first-toucher for residency mode's duty-cycled page-fault events (issue 50;
 * tests/test_fault_duty_bpf.py).
 *
 *   toucher SECONDS MIB_PER_S
 * Thread "toucher" maps 1 MiB (mmap: fresh pages every time, where glibc's dynamic mmap threshold
 * would soon serve a freed malloc block again from its heap) in touch_pages(), writes one byte
 * into each of its 256 pages (a first-touch fault each) and unmaps it, MIB_PER_S of them a second
 * in 20 slices, for SECONDS; then prints "touched <pages>" and exits 0. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))

static long seconds, mib_per_s, pages;

NOINLINE void touch_pages(void)
{
    char *b = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED)
        exit(1);
    for (size_t off = 0; off < (1 << 20); off += 4096)
        b[off] = 1;
    pages += 256;
    munmap(b, 1 << 20);
}

static void *toucher(void *arg)
{
    (void)arg;
    struct timespec slice = {0, 50 * 1000 * 1000};
    for (long s = 0; s < seconds * 20; s++) {
        for (long i = 0; i < mib_per_s / 20; i++)
            touch_pages();
        nanosleep(&slice, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    seconds = atol(argv[1]);
    mib_per_s = atol(argv[2]);
    pthread_t t;
    pthread_create(&t, NULL, toucher, NULL);
    pthread_setname_np(t, "toucher");
    pthread_join(t, NULL);
    printf("touched %ld\n", pages);
    return 0;
}
