/* Test target: a daemon whose work is in forked children (issue 53, item 8: PostgreSQL's backends).
 *
 *   forker [--workers N] [--quick M]
 *     prints "ready <pid>", waits for SIGUSR1, forks N workers (default 3) and prints
 *     "worker <pid>" for each; each worker mallocs 8 MiB in 64 KiB blocks (touched), churns
 *     small blocks until it has used 0.3 s of CPU, frees everything and exits. Once they are
 *     gone, M quick workers (default 20), one after the other, each churning for 20 ms of CPU:
 *     most live between two of the tracer's reads. The parent only forks and waits, allocating
 *     nothing, then prints "done" and sleeps until killed. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define NOINLINE __attribute__((noinline))
#define BLOCK (64 << 10)
#define BLOCKS 128 /* 8 MiB */

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static NOINLINE void churn(double cpu)
{
    while (cpu_s() < cpu) {
        char *p = malloc(200);
        p[0] = 1;
        free(p);
    }
}

static NOINLINE void worker(void)
{
    static char *kept[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        kept[i] = malloc(BLOCK);
        memset(kept[i], i, BLOCK);
    }
    churn(0.3);
    for (int i = 0; i < BLOCKS; i++)
        free(kept[i]);
}

int main(int argc, char **argv)
{
    int n = 3, quick = 20;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--workers"))
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = atoi(argv[++i]);
    sigset_t set;
    block_usr1(&set);
    ready_wait_usr1(&set);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            worker();
            _exit(0);
        }
        printf("worker %d\n", (int)pid);
    }
    fflush(stdout);
    while (wait(NULL) > 0)
        ;
    for (int i = 0; i < quick; i++) {
        if (fork() == 0) {
            churn(0.02);
            _exit(0);
        }
        wait(NULL);
    }
    printf("done\n");
    flush_linger(1);
    return 0;
}
