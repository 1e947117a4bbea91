/* Generator for bench/scale.py: after SIGUSR1, keeps N blocks of 32 bytes allocated from 8
 * distinct call sites, prints "done", and sleeps until killed.   gen N */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ready.h"

void *volatile sink;
#define SITE(k) __attribute__((noinline)) void site##k(long n) { for (long i = 0; i < n; i++) sink = malloc(32); }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
static void (*sites[8])(long) = {site0, site1, site2, site3, site4, site5, site6, site7};

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    ready_then_wait();
    for (int k = 0; k < 8; k++)
        sites[k](n / 8);
    printf("done\n");
    fflush(stdout);
    for (;;)
        pause();
}
