/* Waits test target: threads blocked while holding memory, and what freeing costs, each measured
 * by the program itself (CLOCK_MONOTONIC around the call) for tests/test_waits_bpf.py.
 *
 *   waits [--signal]
 * --signal: print "ready <pid>" and wait for SIGUSR1 first (to be attached to: --pid, --inject).
 * main ("waits-main") locks `gate`, starts three "holder-N" threads and one "unmapper", sleeps
 * HOLD_MS, unlocks, joins them, then trims.
 *   holder-N (N = 1..3): hold_buffers() mallocs N blocks of 1 MiB (touched), then
 *       wait_for_gate() blocks in pthread_mutex_lock(&gate) until main lets go (~HOLD_MS),
 *       frees its blocks. Prints "holder N tid=T held=BYTES waited_ns=NS".
 *   unmapper: map_regions() mmaps UNMAPS regions of (i+1) * 16 MiB (touched), then
 *       unmap_regions() munmaps each, timed one by one. Prints "unmapper tid=T bytes=B ns=NS".
 *   main, at the end: fragments the main arena (4000-byte blocks, every 50th kept) and calls
 *       malloc_trim(0), timed. Prints "trim tid=T ns=NS".
 * The timed munmaps and malloc_trim run at SCHED_FIFO (as root): no preemption inside the window.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1L << 20)
#define HOLD_MS 1500
#define HOLDERS 3
#define UNMAPS 6
#define NFRAG 20011

static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static void *frag[NFRAG];

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static long gettid_(void) { return (long)gettid(); }

/* The timed calls run at SCHED_FIFO (as root), so a loaded machine does not preempt the thread
 * between its clock reads and the call: what it measures is the call. */
static void realtime(void)
{
    struct sched_param sp = {.sched_priority = 1};
    pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
}

__attribute__((noinline)) void **hold_buffers(int n)
{
    void **bufs = malloc(sizeof(void *) * (size_t)n);
    for (int i = 0; i < n; i++) {
        bufs[i] = malloc(MIB);
        memset(bufs[i], 0x11, MIB);
    }
    return bufs;
}

__attribute__((noinline)) long wait_for_gate(void)
{
    long t0 = now_ns();
    pthread_mutex_lock(&gate);
    long waited = now_ns() - t0;
    pthread_mutex_unlock(&gate);
    return waited;
}

static void *holder(void *arg)
{
    int n = (int)(long)arg;
    char name[16];
    snprintf(name, sizeof name, "holder-%d", n);
    pthread_setname_np(pthread_self(), name);
    void **bufs = hold_buffers(n);
    long waited = wait_for_gate();
    pthread_mutex_lock(&out_mu);
    printf("holder %d tid=%ld held=%ld waited_ns=%ld\n", n, gettid_(), n * MIB + (long)sizeof(void *) * n,
           waited);
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    return NULL;
}

__attribute__((noinline)) void *map_regions(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    memset(p, 0x22, len);
    return p;
}

__attribute__((noinline)) long unmap_regions(void *p, size_t len)
{
    long t0 = now_ns();
    munmap(p, len);
    return now_ns() - t0;
}

static void *unmapper(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "unmapper");
    void *maps[UNMAPS];
    long bytes = 0, ns = 0;
    for (int i = 0; i < UNMAPS; i++)
        maps[i] = map_regions((size_t)(i + 1) * 16 * MIB);
    realtime();
    for (int i = 0; i < UNMAPS; i++) {
        ns += unmap_regions(maps[i], (size_t)(i + 1) * 16 * MIB);
        bytes += (i + 1) * 16 * MIB;
    }
    pthread_mutex_lock(&out_mu);
    printf("unmapper tid=%ld bytes=%ld ns=%ld\n", gettid_(), bytes, ns);
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
    return NULL;
}

__attribute__((noinline)) long trim_now(void)
{
    for (int i = 0; i < NFRAG; i++) {
        frag[i] = malloc(4000);
        memset(frag[i], 0x5a, 4000);
    }
    for (int i = 0; i < NFRAG; i++)
        if (i % 50)
            free(frag[i]);
    realtime();
    long t0 = now_ns();
    malloc_trim(0);
    return now_ns() - t0;
}

int main(int argc, char **argv)
{
    pthread_setname_np(pthread_self(), "waits-main");
    if (argc > 1 && !strcmp(argv[1], "--signal")) {
        sigset_t usr1;
        int sig;
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        sigprocmask(SIG_BLOCK, &usr1, NULL);
        printf("ready %d\n", getpid());
        fflush(stdout);
        sigwait(&usr1, &sig);
    }
    pthread_mutex_lock(&gate);
    pthread_t th[HOLDERS + 1];
    for (long i = 0; i < HOLDERS; i++)
        pthread_create(&th[i], NULL, holder, (void *)(i + 1));
    pthread_create(&th[HOLDERS], NULL, unmapper, NULL);
    struct timespec hold = {.tv_sec = HOLD_MS / 1000, .tv_nsec = (HOLD_MS % 1000) * 1000000L};
    nanosleep(&hold, NULL);
    pthread_mutex_unlock(&gate);
    for (int i = 0; i <= HOLDERS; i++)
        pthread_join(th[i], NULL);
    long trim_ns = trim_now();
    printf("trim tid=%ld ns=%ld\n", gettid_(), trim_ns);
    fflush(stdout);
    for (int i = 0; i < NFRAG; i += 50)
        free(frag[i]);
    return 0;
}
