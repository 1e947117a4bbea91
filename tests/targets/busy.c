/* Busy target for attach-while-allocating tests.
 *
 *   busy [--threads N]
 * N threads (default 2, named "churn-<i>") malloc/free blocks of varying sizes in a tight loop,
 * never keeping more than one block each. Prints "ready <pid>" at start.
 * SIGUSR1: thread "leaker" wakes and leaks exactly 101 blocks of 7777 bytes in busy_leak(),
 *          then prints "leaked" on stdout.
 * SIGTERM: clean exit.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

void *volatile sink;
static volatile sig_atomic_t stop;

NOINLINE void churn_once(unsigned i)
{
    void *p = malloc(16 + (i % 64) * 24);
    sink = p;
    free(p);
}

static void *churn_main(void *arg)
{
    char name[16];
    snprintf(name, sizeof name, "churn-%ld", (long)(size_t)arg);
    pthread_setname_np(pthread_self(), name);
    for (unsigned i = 0; !stop; i++)
        churn_once(i);
    return NULL;
}

NOINLINE void busy_leak(void)
{
    for (int i = 0; i < 101; i++)
        sink = malloc(7777);
}

static void *leaker_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "leaker");
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    int sig;
    sigwait(&set, &sig);
    busy_leak();
    printf("leaked\n");
    fflush(stdout);
    return NULL;
}

int main(int argc, char **argv)
{
    long n = 2;
    for (int i = 1; i < argc - 1; i++)
        if (!strcmp(argv[i], "--threads"))
            n = atol(argv[i + 1]);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* only the leaker takes SIGUSR1, via sigwait */
    pthread_t leaker, t[64];
    pthread_create(&leaker, NULL, leaker_main, NULL);
    for (long i = 0; i < n && i < 64; i++)
        pthread_create(&t[i], NULL, churn_main, (void *)(size_t)(i + 1));
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    pthread_join(leaker, NULL);
    for (;;)
        pause(); /* churn goes on until SIGTERM/SIGKILL */
}
