/* What bench/'s C targets share: print "ready <pid>", then wait for SIGUSR1 (blocked before the
 * line goes out, so a signal sent as soon as it is read is not lost; it stays blocked after, in
 * every thread started later). Call it before starting any thread. */
#ifndef BENCH_READY_H
#define BENCH_READY_H

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static void ready_then_wait(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
}

#endif
