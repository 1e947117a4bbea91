/* Target for bench/residency.py: fills the main heap with GIB gibibytes in blocks of BLOCK
 * bytes (touching every page), prints "ready <pid>", then sleeps until killed.
 *   bigheap GIB BLOCK
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    size_t gib = argc > 1 ? strtoul(argv[1], 0, 10) : 4, blk = argc > 2 ? strtoul(argv[2], 0, 10) : 65536;
    mallopt(M_MMAP_THRESHOLD, 64 << 20); /* keep blocks in the brk heap */
    mallopt(M_ARENA_MAX, 1);
    size_t n = (gib << 30) / blk;
    for (size_t i = 0; i < n; i++) {
        char *p = malloc(blk);
        for (size_t o = 0; o < blk; o += 4096)
            p[o] = 1;
        p[blk - 1] = 1;
    }
    printf("ready %d %zu\n", (int)getpid(), n);
    fflush(stdout);
    for (;;)
        pause();
}
