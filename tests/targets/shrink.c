/* Sampled mode's realloc path: blocks that are always sampled (>= N) shrunk by realloc to sizes
 * that are almost never sampled, so the new block goes unrecorded but the old one must be freed.
 *   shrink   -> 200 x malloc(65536) (big_blocks), each realloc'ed to 100 B (shrink_blocks) and
 *               kept; 50 000 x malloc(64) kept (tiny_blocks); then exits.
 */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))
static void *keep[200];
void *volatile sink;

NOINLINE void big_blocks(void) { for (int i = 0; i < 200; i++) keep[i] = malloc(65536); }
NOINLINE void shrink_blocks(void)
{
    for (int i = 0; i < 200; i++) {
        void *p = realloc(keep[i], 100);
        if (p)
            keep[i] = p;
    }
}
NOINLINE void tiny_blocks(void) { for (int i = 0; i < 50000; i++) sink = malloc(64); }

int main(void)
{
    big_blocks();
    shrink_blocks();
    tiny_blocks();
    printf("done %p\n", keep[0]);
    return 0;
}
