/* A daemon for the night watch (allocscope watch): each incarnation holds a known number of bytes
 * at one named site and stays until it is killed.
 *
 *   restartd hold MIB [STEP_MS]   hold_partitions: MIB blocks of 1 MiB + 4096 bytes each (memset,
 *                                 so resident), one every STEP_MS (default 0), then
 *                                 "held BYTES BLOCKS" on stdout; stays until killed
 *   restartd wait MIB             "ready", then waits for SIGUSR1 before hold_partitions(MIB) (what
 *                                 it holds comes after a tracer attached: the count is its own);
 *                                 "held BYTES BLOCKS", stays until killed (watch: several at once)
 *   restartd exit MS              lives MS milliseconds, allocating small blocks, then exit(3)
 *   restartd oom STEP_MIB STEP_MS grow_until_killed: STEP_MIB MiB (touched) every STEP_MS, for ever;
 *                                 "grown BYTES" after each step (the OOM killer ends it)
 *
 * The names of the functions are what the tests look for; noinline keeps them on the stacks. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK ((size_t)1 << 20) + 4096

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *volatile keep[1 << 16];

__attribute__((noinline)) static size_t hold_partitions(int mib, long step_ms)
{
    size_t held = 0;
    for (int i = 0; i < mib; i++) {
        char *p = malloc(BLOCK);
        memset(p, i + 1, BLOCK);
        keep[i] = p;
        held += BLOCK;
        if (step_ms)
            sleep_ms(step_ms);
    }
    return held;
}

__attribute__((noinline)) static void grow_until_killed(int step_mib, long step_ms)
{
    size_t grown = 0;
    for (int i = 0;; i++) {
        char *p = malloc((size_t)step_mib << 20);
        if (!p)
            abort();
        memset(p, 7, (size_t)step_mib << 20);
        keep[i % (1 << 16)] = p;
        grown += (size_t)step_mib << 20;
        printf("grown %zu\n", grown);
        fflush(stdout);
        sleep_ms(step_ms);
    }
}

__attribute__((noinline)) static void short_life(long ms)
{
    for (long t = 0; t < ms; t += 5) {
        keep[t % 64] = malloc(100 + t % 50);
        sleep_ms(5);
    }
}

static volatile sig_atomic_t go;

static void on_usr1(int sig)
{
    (void)sig;
    go = 1;
}

static void wait_for_usr1(void)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    signal(SIGUSR1, on_usr1);
    printf("ready\n");
    fflush(stdout);
    sigdelset(&old, SIGUSR1);
    while (!go)
        sigsuspend(&old);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "wait")) {
        wait_for_usr1();
        size_t held = hold_partitions(atoi(argv[2]), 0);
        printf("held %zu %d\n", held, atoi(argv[2]));
        fflush(stdout);
        for (;;)
            pause();
    }
    if (argc >= 3 && !strcmp(argv[1], "hold")) {
        size_t held = hold_partitions(atoi(argv[2]), argc > 3 ? atol(argv[3]) : 0);
        printf("held %zu %d\n", held, atoi(argv[2]));
        fflush(stdout);
        for (;;)
            pause();
    }
    if (argc >= 4 && !strcmp(argv[1], "oom"))
        grow_until_killed(atoi(argv[2]), atol(argv[3]));
    if (argc >= 3 && !strcmp(argv[1], "exit")) {
        short_life(atol(argv[2]));
        return 3;
    }
    fprintf(stderr, "usage: restartd hold MIB [STEP_MS] | wait MIB | exit MS | oom STEP_MIB STEP_MS\n");
    return 2;
}
