/* Target for --inject (tests/test_inject_bpf.py): known live bytes at known sites, under load.
 *
 *   inject [--threads N]
 * N "churn-<i>" threads malloc/calloc/realloc/free small blocks in a tight loop (nothing kept).
 * Prints "ready <pid>".
 * SIGUSR1: thread "holder" allocates and keeps 4000 blocks of 4096 bytes in hold_small() and
 *          24 blocks of 1 MiB in hold_large(), then prints "held".
 * SIGUSR2: "holder" frees them all, prints "freed".
 * SIGHUP:  "holder" forks a child that allocates and frees 10000 blocks and then execs
 *          /bin/true; prints "child <exit status>" once it has been waited for.
 * SIGTERM: the threads stop, every block's contents are checked, "bye <ops>" and exit 0 (3 when a
 *          block was corrupted).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define SMALL 4000
#define LARGE 24

static volatile sig_atomic_t stop, want_hold, want_free, want_fork;
static void *small[SMALL], *large[LARGE];
static volatile unsigned long ops[16];
static volatile int corrupt;

NOINLINE void hold_small(void)
{
    for (int i = 0; i < SMALL; i++) {
        small[i] = malloc(4096);
        memset(small[i], i & 0xff, 4096);
    }
}

NOINLINE void hold_large(void)
{
    for (int i = 0; i < LARGE; i++) {
        large[i] = malloc(1 << 20);
        memset(large[i], 0x5a, 1 << 20);
    }
}

NOINLINE void release_all(void)
{
    for (int i = 0; i < SMALL; i++) {
        unsigned char *p = small[i];
        if (p && (p[0] != (i & 0xff) || p[4095] != (i & 0xff)))
            corrupt = 1;
        free(p);
        small[i] = 0;
    }
    for (int i = 0; i < LARGE; i++) {
        free(large[i]);
        large[i] = 0;
    }
}

NOINLINE void churn_once(unsigned i)
{
    unsigned char *p = malloc(16 + (i % 64) * 24);
    p[0] = (unsigned char)i;
    unsigned char *q = calloc(4, 8 + (i % 16));
    if (q[3])
        corrupt = 1;
    p = realloc(p, 32 + (i % 128) * 16);
    if (p[0] != (unsigned char)i)
        corrupt = 1;
    free(q);
    free(p);
}

static void *churn_main(void *arg)
{
    long id = (long)arg;
    char name[16];
    snprintf(name, sizeof name, "churn-%ld", id);
    pthread_setname_np(pthread_self(), name);
    for (unsigned i = 0; !stop; i++) {
        churn_once(i);
        ops[id]++;
    }
    return 0;
}

static void forker(void)
{
    pid_t c = fork();
    if (c == 0) {
        for (int i = 0; i < 10000; i++)
            free(malloc(64 + i % 4000));
        execl("/bin/true", "true", (char *)0);
        _exit(9);
    }
    int st = 0;
    waitpid(c, &st, 0);
    printf("child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    fflush(stdout);
}

static void *holder_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "holder");
    while (!stop) {
        if (want_hold) {
            want_hold = 0;
            hold_small();
            hold_large();
            printf("held\n");
            fflush(stdout);
        }
        if (want_free) {
            want_free = 0;
            release_all();
            printf("freed\n");
            fflush(stdout);
        }
        if (want_fork) {
            want_fork = 0;
            forker();
        }
        usleep(2000);
    }
    return 0;
}

static void on_sig(int s)
{
    if (s == SIGUSR1)
        want_hold = 1;
    else if (s == SIGUSR2)
        want_free = 1;
    else if (s == SIGHUP)
        want_fork = 1;
    else
        stop = 1;
}

int main(int argc, char **argv)
{
    int n = 2;
    if (argc > 2 && !strcmp(argv[1], "--threads"))
        n = atoi(argv[2]);
    if (n > 15)
        n = 15;
    struct sigaction sa = {0};
    sa.sa_handler = on_sig;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s = 1; s < 32; s++)
        if (s == SIGUSR1 || s == SIGUSR2 || s == SIGHUP || s == SIGTERM || s == SIGINT)
            sigaction(s, &sa, 0);
    sigset_t blk;
    sigemptyset(&blk);
    sigaddset(&blk, SIGUSR1);
    sigaddset(&blk, SIGUSR2);
    sigaddset(&blk, SIGHUP);
    pthread_t th[16], holder;
    pthread_sigmask(SIG_BLOCK, &blk, 0); /* the signals go to the main thread, which sleeps */
    for (long i = 0; i < n; i++)
        pthread_create(&th[i], 0, churn_main, (void *)i);
    pthread_create(&holder, 0, holder_main, 0);
    pthread_sigmask(SIG_UNBLOCK, &blk, 0);
    printf("ready %d\n", getpid());
    fflush(stdout);
    while (!stop)
        pause();
    for (long i = 0; i < n; i++)
        pthread_join(th[i], 0);
    pthread_join(holder, 0);
    release_all();
    unsigned long total = 0;
    for (int i = 0; i < n; i++)
        total += ops[i];
    printf("bye %lu\n", total);
    return corrupt ? 3 : 0;
}
