/* A sort's memory (tests/test_residency_peak_bpf.py): the same pages freed and touched again.
 *
 *   resort ROUNDS [PAUSE_MS]   each round mallocs one block of every size of SIZES_MIB (prime
 *                              MiB: 37 and 41 above glibc's largest mmap threshold, so mmapped;
 *                              13, 7 and 11 below it, so from the heap once a free has raised the
 *                              threshold), touches every page (sort_buffer), frees it; one block at
 *                              a time, so the process never holds more than 41 MiB of them. Prints
 *                              "done" and the largest size; PAUSE_MS between blocks (default 30).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define MIB (1L << 20)

static const long SIZES_MIB[] = {37, 13, 41, 7, 11};
#define NSIZES (sizeof(SIZES_MIB) / sizeof(SIZES_MIB[0]))

NOINLINE void sort_buffer(char *p, long size)
{
    for (long i = 0; i < size; i += 4096)
        p[i] = (char)i;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 30;
    for (int r = 0; r < rounds; r++) {
        for (unsigned i = 0; i < NSIZES; i++) {
            long size = SIZES_MIB[i] * MIB;
            char *p = malloc(size);
            if (!p)
                return 1;
            sort_buffer(p, size);
            usleep(pause_ms * 1000);
            free(p);
        }
    }
    printf("done 41\n");
    return 0;
}
