/* One allocation site reached through two callers with identical frames, so the allocator
 * returns to the same address with the same stack pointer either way: the probes' stack cache,
 * keyed by (return address, sp), must still tell the callers apart (it re-reads the return
 * addresses the cached unwind read).
 *   samesp --wait-signal   print "ready <pid>", wait for SIGUSR1, then:
 *     300 x via_a(111), 300 x via_b(222), then 300 alternating: via_a(333) / via_b(444)
 *   keeps every block; prints "done" and waits on stdin.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

#define NOINLINE __attribute__((noinline, noipa))
void *volatile kept[1000];
int nkept;
volatile int tag;

NOINLINE void *leaf(size_t n) { return malloc(n); }
NOINLINE void via_a(size_t n) { tag = 1; kept[nkept++] = leaf(n); }
NOINLINE void via_b(size_t n) { tag = 2; kept[nkept++] = leaf(n); }

int main(void)
{
    sigset_t set;
    block_usr1(&set);
    ready_wait_usr1(&set);
    for (int i = 0; i < 300; i++)
        via_a(111);
    for (int i = 0; i < 300; i++)
        via_b(222);
    for (int i = 0; i < 300; i++) {
        if (i & 1)
            via_a(333);
        else
            via_b(444);
    }
    printf("done\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    return 0;
}
