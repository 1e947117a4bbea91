/* Partitions mapped at once and touched gradually (issue 50: residency mode's composition at the
 * peak above the RSS high-water: a mapped partition counted whole before its pages are touched).
 *
 *   mapgrow PARTS MIB STEP_MS   PARTS partitions of MIB MiB, each malloc'ed (glibc maps it) in
 *                               make_partition() and written 1 MiB every STEP_MS; the last one
 *                               only half; then "mapped BYTES touched BYTES" on stdout, 1.5 s
 *                               more (a snapshot), every partition freed (unmapped), 1.5 s more,
 *                               exit 0: the peak is before the end. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *volatile keep[1024];

__attribute__((noinline)) static char *make_partition(size_t bytes)
{
    char *p = malloc(bytes);
    if (!p)
        abort();
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int parts = atoi(argv[1]);
    size_t mib = (size_t)atoi(argv[2]);
    long step_ms = atol(argv[3]);
    size_t touched = 0;
    for (int i = 0; i < parts && i < 1024; i++) {
        char *p = make_partition(mib << 20);
        keep[i] = p;
        size_t upto = i == parts - 1 ? mib / 2 : mib;
        for (size_t m = 0; m < upto; m++) {
            memset(p + (m << 20), i + 1, 1 << 20);
            touched += 1 << 20;
            sleep_ms(step_ms);
        }
    }
    printf("mapped %zu touched %zu\n", (size_t)parts * (mib << 20), touched);
    fflush(stdout);
    sleep_ms(1500);
    for (int i = 0; i < parts && i < 1024; i++)
        free(keep[i]);
    sleep_ms(1500);
    return 0;
}
