/* Handoff test target (issue 46): a pool of synth threads makes partitions and passes them on;
 * the memory they allocated is held downstream, not by them. tests/test_handoff_bpf.py.
 *
 *   handoff   prints "ready <pid>", waits for SIGUSR1, then:
 * 6 threads synth-1..6 take jobs from a queue (waiting in take_job when there is none), make a
 * partition of PART bytes (make_partition, touched), and send it over a one-slot channel
 * (channel_send: blocks while the slot is taken). Thread "gpu" receives them and forwards each to
 * thread "finalizer", which keeps the last WINDOW and frees older ones. 9 jobs are posted at once;
 * on its STALL_AT-th partition the gpu thread stalls for STALL_MS holding it: then the slot holds
 * one partition, 2 synth threads are blocked in channel_send each holding the one it is sending,
 * 4 wait in take_job for jobs that never come, and the partitions they made are downstream. Once
 * the two senders are blocked the gpu thread prints, per synth thread,
 *   "stall <name> tid=<tid> state=<sending|idle> made_live=<bytes>"
 * (made_live: the bytes of the partitions it made that are still live, wherever they are), then
 * "stalled". After the stall everything flows: "done" once the finalizer has all 9 (it keeps the
 * last 3); with --linger the process then stays.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

#define NSYNTH 6
#define JOBS 9
#define STALL_AT 6
#define WINDOW 3
#define STALL_MS 3000
#define PART ((4 << 20) + 1024)
#define NOINLINE __attribute__((noinline))

struct partition {
    int maker; /* index of the synth thread that made it */
    char data[];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER, slot_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t fin_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static int jobs_left;
static struct partition *slot;
static struct partition *finq[JOBS];
static int finq_n, finq_taken, finalized;
static int sending[NSYNTH]; /* blocked in channel_send */
static pid_t tids[NSYNTH];
static long made_live[NSYNTH]; /* bytes of its partitions still live */

NOINLINE static int take_job(void)
{
    pthread_mutex_lock(&mu);
    while (jobs_left == 0)
        pthread_cond_wait(&jobs_cv, &mu);
    jobs_left--;
    pthread_mutex_unlock(&mu);
    return 1;
}

NOINLINE static struct partition *make_partition(int me)
{
    struct partition *p = malloc(PART);
    memset(p, me + 1, PART);
    p->maker = me;
    pthread_mutex_lock(&mu);
    made_live[me] += PART;
    pthread_mutex_unlock(&mu);
    return p;
}

NOINLINE static void channel_send(int me, struct partition *p)
{
    pthread_mutex_lock(&mu);
    sending[me] = 1;
    pthread_cond_broadcast(&slot_cv);
    while (slot != NULL)
        pthread_cond_wait(&slot_cv, &mu);
    slot = p;
    sending[me] = 0;
    pthread_cond_broadcast(&slot_cv);
    pthread_mutex_unlock(&mu);
}

NOINLINE static void run_job(int me)
{
    struct partition *p = make_partition(me);
    channel_send(me, p);
}

static void *synth_main(void *arg)
{
    int me = (int)(long)arg;
    char name[24];
    snprintf(name, sizeof name, "synth-%d", me + 1);
    pthread_setname_np(pthread_self(), name);
    tids[me] = (pid_t)syscall(SYS_gettid);
    for (;;) {
        take_job();
        run_job(me);
    }
    return NULL;
}

static struct partition *channel_recv(void)
{
    pthread_mutex_lock(&mu);
    while (slot == NULL)
        pthread_cond_wait(&slot_cv, &mu);
    struct partition *p = slot;
    slot = NULL;
    pthread_cond_broadcast(&slot_cv);
    pthread_mutex_unlock(&mu);
    return p;
}

static void stall_report(void)
{
    /* wait until the two senders are blocked, the slot is full again and the finalizer has
     * the partitions before this one (polled: three conditions, two condition variables) */
    pthread_mutex_lock(&mu);
    for (;;) {
        int n = 0;
        for (int i = 0; i < NSYNTH; i++)
            n += sending[i];
        if (n == JOBS - STALL_AT - 1 && slot != NULL && finalized == STALL_AT - 1)
            break;
        pthread_mutex_unlock(&mu);
        usleep(1000);
        pthread_mutex_lock(&mu);
    }
    for (int i = 0; i < NSYNTH; i++)
        printf("stall synth-%d tid=%d state=%s made_live=%ld\n", i + 1, (int)tids[i], sending[i] ? "sending" : "idle",
               made_live[i]);
    printf("stalled\n");
    fflush(stdout);
    pthread_mutex_unlock(&mu);
}

static void *gpu_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "gpu");
    for (int n = 1; n <= JOBS; n++) {
        struct partition *p = channel_recv();
        if (n == STALL_AT) {
            stall_report();
            usleep(STALL_MS * 1000);
        }
        pthread_mutex_lock(&mu);
        finq[finq_n++] = p;
        pthread_cond_broadcast(&fin_cv);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static void *finalizer_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "finalizer");
    struct partition *window[JOBS];
    int kept = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (finq_taken == finq_n)
            pthread_cond_wait(&fin_cv, &mu);
        struct partition *p = finq[finq_taken++];
        pthread_mutex_unlock(&mu);
        window[kept++] = p;
        if (kept > WINDOW) {
            struct partition *old = window[kept - WINDOW - 1];
            pthread_mutex_lock(&mu);
            made_live[old->maker] -= PART;
            pthread_mutex_unlock(&mu);
            free(old);
        }
        pthread_mutex_lock(&mu);
        finalized++;
        pthread_cond_broadcast(&done_cv);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int linger = argc > 1 && !strcmp(argv[1], "--linger");
    sigset_t set;
    block_usr1(&set);
    pthread_t t;
    for (long i = 0; i < NSYNTH; i++)
        pthread_create(&t, NULL, synth_main, (void *)i);
    pthread_create(&t, NULL, gpu_main, NULL);
    pthread_create(&t, NULL, finalizer_main, NULL);
    ready_wait_usr1(&set);
    pthread_mutex_lock(&mu);
    jobs_left = JOBS;
    pthread_cond_broadcast(&jobs_cv);
    while (finalized < JOBS)
        pthread_cond_wait(&done_cv, &mu);
    pthread_mutex_unlock(&mu);
    printf("done\n");
    flush_linger(linger);
    return 0;
}
