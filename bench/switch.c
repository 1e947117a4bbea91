/* Context-switch ping-pong for bench/waits.py: two threads hand a token back and forth through a
 * mutex and two condition variables, so every hand-off blocks one thread (sched_switch out,
 * sleeping) and wakes the other. Prints "ready <pid>", waits for SIGUSR1, does N hand-offs, prints
 * "elapsed <s> handoffs <n>".
 *
 *   switch [N]   (default 200000)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ready.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv[2] = {PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};
static int turn;
static long n;

__attribute__((noinline)) static void wait_turn(int me)
{
    while (turn != me)
        pthread_cond_wait(&cv[me], &mu);
}

static void *player(void *arg)
{
    int me = (int)(long)arg;
    pthread_mutex_lock(&mu);
    for (long i = 0; i < n; i++) {
        wait_turn(me);
        turn = !me;
        pthread_cond_signal(&cv[!me]);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

int main(int argc, char **argv)
{
    n = argc > 1 ? atol(argv[1]) : 200000;
    ready_then_wait();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_t t[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, player, (void *)i);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("elapsed %.6f handoffs %ld\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, 2 * n);
    fflush(stdout);
    return 0;
}
