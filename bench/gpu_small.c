/* bench/gpu_small.c: a small C target with known live memory at exit: keep() holds 8 x 1 MiB
 * (malloc) and 4 x 256 KiB (calloc) = 9 MiB; churn() frees all it takes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
void *volatile held[12];
__attribute__((noinline)) void keep(void)
{
    for (int i = 0; i < 8; i++) { held[i] = malloc(1 << 20); memset(held[i], 1, 1 << 20); }
    for (int i = 0; i < 4; i++) held[8 + i] = calloc(1, 256 << 10);
}
__attribute__((noinline)) void churn(void)
{
    for (int i = 0; i < 1000; i++) free(malloc(4096 + i));
}
int main(void) { usleep(300000); keep(); churn(); sleep(1); return 0; }
