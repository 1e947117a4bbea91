/* Target for bench/retention.py: maps GIB gibibytes of anonymous memory (MAP_NORESERVE) and
 * touches one page in every STRIDE (STRIDE 1: the first TOUCH_GIB gibibytes, page by page),
 * prints "ready <pid> <start> <end>", then sleeps until killed.
 *   sparsemap GIB STRIDE [TOUCH_GIB]
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    size_t gib = argc > 1 ? strtoul(argv[1], 0, 10) : 24, stride = argc > 2 ? strtoul(argv[2], 0, 10) : 6;
    size_t touch = argc > 3 ? strtoul(argv[3], 0, 10) << 30 : 0;
    size_t len = gib << 30;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return 1;
    madvise(p, len, MADV_NOHUGEPAGE); /* 4 KiB pages: the page tables at their largest */
    size_t end = stride > 1 ? len : (touch < len ? touch : len);
    for (size_t o = 0; o < end; o += 4096 * stride)
        p[o] = 1;
    printf("ready %d %lu %lu\n", (int)getpid(), (unsigned long)p, (unsigned long)(p + len));
    fflush(stdout);
    for (;;)
        pause();
}
