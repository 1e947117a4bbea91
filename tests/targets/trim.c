/* malloc_trim test target: fragments the main arena, calls malloc_trim twice, and prints what
 * it measured itself, for tests/test_residency_bpf.py to compare with the trace.
 *
 *   trim [--wait-signal]
 * The main thread (renamed "trimmer") allocates 20011 blocks of 4000 bytes from the main arena
 * (below the mmap threshold), touches them, and frees all but every 50th: ~78 MB of free chunks
 * that glibc cannot give back by trimming the top of the heap. malloc_trim(0) then madvises
 * their whole free pages away; a second malloc_trim(0) finds nothing new to release but still
 * returns 1. Each line: "trimN ret=R released=BYTES dur_ns=NS" (RssAnon before - after); then
 * "heap rss=BYTES live=BYTES": smaps' Rss of [heap] after the trims, and the usable bytes of the
 * blocks still allocated (tests/test_trim_bpf.py).
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define N 20011
#define SZ 4000

static void *blocks[N];

static long rss_anon(void)
{
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noinline)) void fragment_main_arena(void)
{
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(SZ);
        memset(blocks[i], 0x5a, SZ);
    }
    for (int i = 0; i < N; i++)
        if (i % 50 != 49 && i != N - 1)
            free(blocks[i]);
}

static long heap_rss(void)
{
    char line[512];
    long kb = -1;
    int in_heap = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strstr(line, " rw"))
            in_heap = strstr(line, "[heap]") != NULL;
        else if (in_heap && sscanf(line, "Rss: %ld kB", &kb) == 1)
            break;
    }
    if (f)
        fclose(f);
    return kb * 1024;
}

__attribute__((noinline)) void trim_once(int n)
{
    long before = rss_anon();
    long t0 = now_ns();
    int ret = malloc_trim(0);
    long dur = now_ns() - t0;
    long after = rss_anon();
    printf("trim%d ret=%d released=%ld dur_ns=%ld\n", n, ret, before - after, dur);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    pthread_setname_np(pthread_self(), "trimmer");
    if (argc > 1 && !strcmp(argv[1], "--wait-signal")) {
        sigset_t set;
        block_usr1(&set);
        ready_wait_usr1(&set);
    }
    fragment_main_arena();
    trim_once(1);
    trim_once(2);
    long live = 0;
    for (int i = 0; i < N; i++)
        if (i % 50 == 49 || i == N - 1)
            live += malloc_usable_size(blocks[i]);
    printf("heap rss=%ld live=%ld\n", heap_rss(), live);
    printf("done\n");
    fflush(stdout);
    return 0;
}
