/* Many sites, a few changing at a time (tests/test_sitechanges_bpf.py, issue 33).
 *   sitechurn N BURST
 * Prints "ready <pid>". Each signal then frees and allocates again, each at its own stack (site i:
 * a chain of noinline frames through step0 or step1 as the bits of i say), the next sites round
 * robin, and prints "ok <sites touched so far>": the first SIGUSR2 all N (one 4 KiB block at each
 * of N distinct stacks), every later SIGUSR2 BURST sites, every SIGUSR1 one site. A site touched
 * once more has alloc_count 2 and free_count 1. SIGTERM ends it.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int bits;
static unsigned n;
static void **blocks;
static volatile sig_atomic_t one, burst, stop;

static void on_usr1(int s) { (void)s; one++; }
static void on_usr2(int s) { (void)s; burst++; }
static void on_term(int s) { (void)s; stop = 1; }

__attribute__((noinline, noipa)) static void *level(int d, unsigned i);

__attribute__((noinline, noipa)) static void *step0(int d, unsigned i)
{
    void *p = level(d + 1, i);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline, noipa)) static void *step1(int d, unsigned i)
{
    void *p = level(d + 1, i);
    __asm__ volatile("nop" ::: "memory");
    return p;
}

__attribute__((noinline, noipa)) static void *level(int d, unsigned i)
{
    if (d == bits) {
        char *p = malloc(4096);
        if (p)
            p[0] = 1;
        return p;
    }
    return (i >> d & 1) ? step1(d, i) : step0(d, i);
}

__attribute__((noinline, noipa)) static unsigned touch(unsigned from, unsigned count)
{
    for (unsigned j = 0; j < count; j++) {
        unsigned i = (from + j) % n;
        free(blocks[i]);
        blocks[i] = level(0, i);
    }
    return (from + count) % n;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    n = (unsigned)strtoul(argv[1], 0, 10);
    unsigned k = (unsigned)strtoul(argv[2], 0, 10);
    if (!n)
        return 2;
    while ((1u << bits) < n)
        bits++;
    blocks = calloc(n, sizeof(void *));
    sigset_t all, none;
    sigemptyset(&all);
    sigaddset(&all, SIGUSR1);
    sigaddset(&all, SIGUSR2);
    sigaddset(&all, SIGTERM);
    sigprocmask(SIG_BLOCK, &all, &none);
    signal(SIGUSR1, on_usr1);
    signal(SIGUSR2, on_usr2);
    signal(SIGTERM, on_term);
    printf("ready %d\n", getpid());
    fflush(stdout);
    unsigned next = 0, first = 1, total = 0;
    while (!stop) {
        sigsuspend(&none);
        unsigned count = 0;
        if (burst) {
            count = first ? n : k;
            burst = 0;
            first = 0;
        } else if (one) {
            count = one;
            one = 0;
        }
        if (!count)
            continue;
        next = touch(next, count); /* the one call site: every pass shares the stacks */
        total += count;
        printf("ok %u\n", total);
        fflush(stdout);
    }
    return 0;
}
