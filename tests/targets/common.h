/* What the test targets do around their work, written once: block SIGUSR1, say "ready PID",
 * wait for the test's SIGUSR1 (sent once the tracer is attached); at the end flush and, with
 * --linger, stay until killed. A header, not compiled alone (the targets fixture builds *.c);
 * subfolders include it as "../common.h".
 *
 * always_inline: the code stands in main as it did before, so the frames the tests assert and
 * the allocations they count (stdio's buffer under the first printf) stay exactly the same. */
#ifndef ALLOCSCOPE_TEST_COMMON_H
#define ALLOCSCOPE_TEST_COMMON_H

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#define TARGET_INLINE static inline __attribute__((always_inline))

/* A handler for targets that install one (the signal is blocked and taken by sigwait). */
__attribute__((unused)) static void on_usr1(int sig) { (void)sig; }

/* Block SIGUSR1 in this thread and in every thread it starts after. */
TARGET_INLINE void block_usr1(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGUSR1);
    sigprocmask(SIG_BLOCK, set, NULL);
}

/* Say "ready PID" and wait for SIGUSR1 (block_usr1 first). */
TARGET_INLINE void ready_wait_usr1(sigset_t *set)
{
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int sig;
    sigwait(set, &sig);
}

/* Flush what was said; with linger, stay (until killed). */
TARGET_INLINE void flush_linger(int linger)
{
    fflush(stdout);
    if (linger)
        for (;;)
            pause();
}

#endif
