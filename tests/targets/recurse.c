/* One malloc call site reached through many recursive stacks (issue 19: a report must not split
 * it into one site per stack).
 *
 *   recurse    starts threads "rec-0", "rec-1", "rec-2", prints "ready <pid>", waits for
 *              SIGUSR1; then each thread makes ROUNDS blocks through make_block(), the only
 *              malloc here, reached by walk(depth) recursing 1..5 deep, by the mutual recursion
 *              even(n) / odd(n), or by walk down into even/odd; thread t keeps KEEP[t] of its
 *              blocks (KEEP_TOTAL = 7 in all) and frees the others at once (free_block). Prints
 *              "done {json}" (the ground truth: block_bytes, blocks, live, live_bytes) and
 *              holds the kept blocks until SIGUSR1, SIGTERM or SIGINT (exit 0).
 *
 * tests/test_rustd_bpf.py builds it -O2 -g -fomit-frame-pointer (DWARF unwinding); conftest's
 * `targets` builds every .c of tests/targets with frame pointers too. noinline + noclone and the
 * volatile store after every call keep every level a real frame (no tail calls, no
 * recursion turned into a loop, no .constprop clones).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define BLOCK_BYTES ((3u << 20) + 4096) /* 3 MiB + 4 KiB: 3149824 */
#define NTHREADS 3
#define ROUNDS 12
#define KEEP_TOTAL 7

static const int KEEP[NTHREADS] = {3, 2, 2}; /* sums to KEEP_TOTAL */

static volatile long depth_seen; /* written after every recursive call: no tail calls */
static void *kept[KEEP_TOTAL];
static pthread_barrier_t start;
static sigset_t sigs; /* blocked in every thread: main takes them with sigwait */

NOINLINE void *make_block(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    ((volatile char *)p)[0] = 1;
    return p;
}

NOINLINE void free_block(void *p) { free(p); }

NOINLINE void *odd(int n);

NOINLINE void *even(int n)
{
    void *p = n <= 0 ? make_block(BLOCK_BYTES) : odd(n - 1);
    depth_seen = n;
    return p;
}

NOINLINE void *odd(int n)
{
    void *p = n <= 0 ? make_block(BLOCK_BYTES) : even(n - 1);
    depth_seen = -n;
    return p;
}

/* depth levels of walk, then make_block directly (parity < 0) or even(parity) */
NOINLINE void *walk(int depth, int parity)
{
    void *p = depth > 0 ? walk(depth - 1, parity) : parity < 0 ? make_block(BLOCK_BYTES) : even(parity);
    depth_seen = depth;
    return p;
}

static NOINLINE void *one_block(int t, int j)
{
    switch ((t + j) % 3) {
    case 0: return walk(1 + j % 5, -1);          /* walk x1..5 -> make_block */
    case 1: return (j & 1) ? odd(j % 6) : even(j % 6); /* even/odd chains of 0..5 */
    default: return walk(1 + j % 3, j % 4);       /* walk -> even/odd -> make_block */
    }
}

static void *worker(void *arg)
{
    int t = (int)(long)arg, base = 0;
    char name[16];
    snprintf(name, sizeof name, "rec-%d", t);
    pthread_setname_np(pthread_self(), name);
    for (int i = 0; i < t; i++)
        base += KEEP[i];
    pthread_barrier_wait(&start);
    for (int j = 0; j < ROUNDS; j++) {
        void *p = one_block(t, j);
        if (j % 4 == 1 && j / 4 < KEEP[t])   /* rounds 1, 5, 9: kept while KEEP[t] allows */
            kept[base + j / 4] = p;
        else
            free_block(p);
    }
    return NULL;
}

int main(void)
{
    pthread_t th[NTHREADS];
    int sig;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGUSR1);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    pthread_barrier_init(&start, NULL, NTHREADS + 1);
    for (long t = 0; t < NTHREADS; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    sigwait(&sigs, &sig);
    pthread_barrier_wait(&start);
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    int live = 0;
    for (int i = 0; i < KEEP_TOTAL; i++)
        live += kept[i] != NULL;
    printf("done {\"block_bytes\":%u,\"blocks\":%d,\"live\":%d,\"live_bytes\":%lu,\"threads\":%d}\n",
           BLOCK_BYTES, NTHREADS * ROUNDS, live, (unsigned long)live * BLOCK_BYTES, NTHREADS);
    fflush(stdout);
    sigwait(&sigs, &sig);
    return 0;
}
