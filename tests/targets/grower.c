/* A known growing site in a named thread, for `allocscope top`.
 *
 *   grower            prints "ready <pid>"; thread "grower" then takes SIGUSR1 one at a time:
 *                     each one runs grow_tick() once (one malloc(3333), kept) and prints
 *                     "tick <n>".
 *   grower --auto N   prints "ready <pid>"; on SIGUSR1 thread "grower" runs keep_config()
 *                     (one malloc(2000), kept), sleeps 1.2 s, then N times, 100 ms apart:
 *                     grow_tick() (malloc(3333), kept) and burst() (malloc(1 MiB), freed at
 *                     once); prints "done" and holds everything until killed.
 * So: grow_tick holds n x 3333 B and grows; keep_config holds 2000 B, the oldest block;
 * burst holds nothing, with a peak of exactly 1 MiB.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define GROW_BYTES 3333
#define CONFIG_BYTES 2000
#define BURST_BYTES (1 << 20)

void *volatile sink;
static long auto_ticks;

NOINLINE void grow_tick(void) { sink = malloc(GROW_BYTES); }
NOINLINE void keep_config(void) { sink = malloc(CONFIG_BYTES); }

NOINLINE void burst(void)
{
    void *p = malloc(BURST_BYTES);
    sink = p;
    free(p);
}

static void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static sigset_t usr1; /* blocked in every thread: the grower takes it with sigwait */

static void wait_usr1(void)
{
    int sig;
    sigwait(&usr1, &sig);
}

static void *grower_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "grower");
    if (auto_ticks) {
        wait_usr1();
        keep_config();
        nap(1200);
        for (long i = 0; i < auto_ticks; i++) {
            grow_tick();
            burst();
            nap(100);
        }
        printf("done\n");
        fflush(stdout);
        return NULL;
    }
    for (int n = 1;; n++) {
        wait_usr1();
        grow_tick();
        printf("tick %d\n", n);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--auto"))
        auto_ticks = atol(argv[2]);
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL); /* inherited by the grower thread */
    pthread_t t;
    pthread_create(&t, NULL, grower_main, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        pause();
}
