/* Many distinct allocation sites, few of them changing per tick (bench/interval_cost.py, issue 33).
 *   sites N K TICK_MS [SIZE]
 * Prints "ready <pid>" and waits for SIGUSR1. Then allocates one block of SIZE bytes (default
 * 4096) at each of N distinct call stacks (site i: a chain of BITS noinline frames, frame j
 * through step0 or step1 as bit j of i says), prints "live <N>", and every TICK_MS frees and
 * reallocates the blocks of K sites (round robin), each at its own stack again: per tick, K
 * sites change (alloc_count and free_count + 1), the other N - K do not. SIGTERM ends it.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int bits;
static size_t size = 4096;
static volatile sig_atomic_t go, stop;

static void on_usr1(int s) { (void)s; go = 1; }
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
        char *p = malloc(size);
        if (p)
            p[0] = 1;
        return p;
    }
    return (i >> d & 1) ? step1(d, i) : step0(d, i);
}

static void **blocks;
static unsigned n;

/* Free and allocate again the blocks of sites [from, from + count) mod n, each at its stack. */
__attribute__((noinline, noipa)) static unsigned touch(unsigned from, unsigned count)
{
    for (unsigned j = 0; j < count && n; j++) {
        unsigned i = (from + j) % n;
        free(blocks[i]);
        blocks[i] = level(0, i);
    }
    return n ? (from + count) % n : 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: sites N K TICK_MS [SIZE]\n");
        return 2;
    }
    n = (unsigned)strtoul(argv[1], 0, 10);
    unsigned k = (unsigned)strtoul(argv[2], 0, 10);
    long tick_ms = strtol(argv[3], 0, 10);
    if (argc > 4)
        size = strtoul(argv[4], 0, 10);
    while ((1u << bits) < n)
        bits++;
    signal(SIGUSR1, on_usr1);
    signal(SIGTERM, on_term);
    blocks = calloc(n ? n : 1, sizeof(void *));
    printf("ready %d\n", getpid());
    fflush(stdout);
    while (!go && !stop)
        pause();
    /* one call site of touch(): the first pass (every site) and the ticks share their stacks */
    unsigned next = 0, todo = n, first = 1;
    struct timespec ts = {tick_ms / 1000, (tick_ms % 1000) * 1000000L};
    while (!stop) {
        next = touch(next, todo);
        if (first) {
            printf("live %u\n", n);
            fflush(stdout);
            first = 0;
            next = 0;
        }
        todo = k;
        nanosleep(&ts, 0);
    }
    return 0;
}
