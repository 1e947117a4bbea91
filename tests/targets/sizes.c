/* Known bytes at three sites of very different block sizes, for sampling tests.
 *   sizes   -> keeps 20000 x 1000 B (small_blocks), 1500 x 50000 B (medium_blocks),
 *              100000 x 64 B (tiny_blocks), then exits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))
void *volatile sink;

NOINLINE void small_blocks(void) { for (int i = 0; i < 20000; i++) sink = malloc(1000); }
NOINLINE void medium_blocks(void) { for (int i = 0; i < 1500; i++) sink = malloc(50000); }
NOINLINE void tiny_blocks(void) { for (int i = 0; i < 100000; i++) sink = malloc(64); }

int main(void)
{
    small_blocks();
    medium_blocks();
    tiny_blocks();
    printf("done\n");
    return 0;
}
