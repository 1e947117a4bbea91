/* Known allocations through jemalloc (linked against Debian's libjemalloc.so.2, as redis is),
 * whose malloc and free begin with instructions the kernel single-steps: allocscope moves their
 * probes onto emulated branches behind them (tracer/allocators/placement.py); every call must still count.
 *   jem --wait-signal   print "ready <pid>", wait for SIGUSR1, work, print "done", wait on stdin
 * Keeps: jem_leak 700 x 333 B, jem_calloc 9 x (13 x 41) B, jem_realloc 4 blocks of 100 B grown
 * to 5000 B; jem_churn makes 5000 malloc/free pairs (nothing kept); free(NULL) 100 times.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../common.h"

#define NOINLINE __attribute__((noinline))
void *volatile sink;
void *volatile kept[1000]; /* read by no one: volatile keeps gcc from eliding the calls */
int nkept;

NOINLINE void jem_leak(void) { for (int i = 0; i < 700; i++) kept[nkept++] = malloc(333); }
NOINLINE void jem_calloc(void) { for (int i = 0; i < 9; i++) kept[nkept++] = calloc(13, 41); }
NOINLINE void jem_realloc(void)
{
    for (int i = 0; i < 4; i++) {
        void *p = malloc(100);
        kept[nkept++] = realloc(p, 5000);
    }
}
NOINLINE void jem_churn(void)
{
    for (int i = 0; i < 5000; i++) {
        void *p = malloc(16 + (i % 7) * 24);
        sink = p;
        free(p);
    }
    void *volatile null = NULL; /* gcc drops a literal free(NULL) */
    for (int i = 0; i < 100; i++)
        free(null);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sigset_t set;
    block_usr1(&set);
    ready_wait_usr1(&set);
    jem_leak();
    jem_calloc();
    jem_realloc();
    jem_churn();
    printf("done\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) /* linger until the test closes stdin or kills us */
        ;
    return 0;
}
