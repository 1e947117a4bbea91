/*
 * provingd -- the bundled demo daemon for allocscope.
 *
 * Build:  gcc -std=c11 -O2 -g -fno-omit-frame-pointer -pthread -Wall -Wextra \
 *             -o provingd provingd.c
 *         (or `make -C demo`)
 *
 * The incident this models
 * ------------------------
 * A GPU proving daemon (Rust + C++/CUDA) idled at 70 GiB.  Raising its number
 * of partition workers from 10 to 12 should have cost ~26 GiB more; instead the
 * process climbed to 668 GiB and was OOM-killed.
 *
 * Each worker synthesizes a "partition" (~13 GiB of circuit data) and hands it
 * to a single GPU thread over a channel with exactly one slot.  A counting
 * semaphore ("pw" permits) was meant to bound how many partitions exist at
 * once.  The bug: the worker released its permit right after synthesis,
 * *before* the hand-off to the GPU thread.  A finished partition that is still
 * waiting for the one-slot channel then holds no permit, so the next worker
 * starts synthesizing another one.  Whenever synthesis outruns the GPU,
 * finished partitions pile up behind the channel -- one per worker -- and the
 * memory bound the permits were supposed to give is gone.
 *
 * This program reproduces that shape, scaled down (8 MiB instead of 13 GiB):
 *
 *   pworker-1..W --(permit)--> synthesize_partition() --[1-slot channel]--> gpu
 *                                                                           |
 *                          finalizer <-- (free + malloc_trim) <-------------+
 *
 *   correct (default): a worker keeps its permit until the gpu thread has
 *       taken its partition out of the channel.  Live partitions are bounded
 *       by pw (held by permit holders, the channel slot included) + 1 at the
 *       gpu + at most 1 on its way through the finalizer: <= pw + 2.
 *   --bug: the permit is released right after synthesis.  Live partitions
 *       are bounded only by the number of workers: W held by workers + 1 in
 *       the slot + 1 at the gpu + 1 at the finalizer (W + 3).  How fast the
 *       pile-up forms depends on how much faster pw synthesizers are than the
 *       gpu.  With the defaults (gpu 200 ms -> 5 partitions/s; synthesis
 *       440 ms +-50% -> pw/0.44 partitions/s) pw=2 delivers ~0.9x what the
 *       gpu drains, so only jitter builds a small backlog (peak 5-6 live,
 *       vs pw+2 = 4); pw=3 (1.4x) and pw=4 (1.8x) fill every worker within
 *       a few seconds (peak 14-15 live, vs pw+2 = 5-6).  That is the
 *       non-linear jump of the incident (10 -> 12 workers, 70 -> 668 GiB).
 *
 *   A run proves --partitions jobs (default 120, ~25-30 s), then joins all
 *   threads, frees everything and prints a one-line summary on stderr.
 *
 * Synthesis on the real box is many-core CPU work taking minutes; on a small
 * test machine we model its wall time with a sleep (--synth-ms, jittered per
 * job from --seed) after a few ms of genuine CPU work, so the queueing
 * dynamics do not depend on how many cores the host has.
 *
 * Allocation sites, each in its own noinline function so that call stacks
 * recorded by a tracer name them:
 *   synthesize_partition  M MiB per job (mmap'd), freed by the finalizer
 *                         thread: big, cross-thread, the culprit.
 *   alloc_job_meta        256 B per job, freed by the same worker shortly
 *                         after: transient.
 *   load_config           a parameter cache allocated once at start-up and
 *                         kept for the whole run: plateaued.
 *   append_log_record     4 KiB per proved partition, appended to an in-memory
 *                         log that is never trimmed while running: growing
 *                         (a slow leak).  Released only at shutdown.
 *
 * Thread names (pthread_setname_np): pworker-1..pworker-W, gpu, finalizer.
 *
 * With --wait-signal the daemon starts its threads, loads its config, prints
 * "ready <pid>" on stdout and waits for SIGUSR1 before doing any work, so a
 * tracer can attach first.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define JOB_META_BYTES 256u
#define LOG_RECORD_BYTES 4096u
#define CONFIG_CACHE_BYTES (2 * MIB)
#define MAX_WORKERS 9999 /* "pworker-9999" fits the 15-char thread name */
#define TRIM_EVERY 8u /* finalizer calls malloc_trim(0) every this many frees */

/* ------------------------------------------------------------------------ */
/* options                                                                   */

struct options {
    int pw;           /* semaphore permits: partitions allowed "in flight" */
    int workers;      /* partition-worker threads */
    int partitions;   /* total jobs; the run ends after this many */
    int partition_mb; /* size of one partition */
    int gpu_ms;       /* time the gpu thread spends proving one partition */
    int synth_ms;     /* mean wall time of one synthesis (jitter +-50%) */
    int chunk_kb;     /* 0: a partition is one block; else chunks of this many KiB */
    bool bug;         /* release the permit before the hand-off */
    bool wait_signal; /* print "ready <pid>", wait for SIGUSR1 */
    bool verbose;     /* per-second progress on stderr */
    const char *summary; /* also write the summary line to this file */
    uint64_t seed;
};

static struct options opt = {
    .pw = 2,
    .workers = 12,
    .partitions = 120,
    .partition_mb = 8,
    .gpu_ms = 200,
    .synth_ms = 440,
    .seed = 1,
};

/* ------------------------------------------------------------------------ */
/* data                                                                      */

struct job_meta {
    uint64_t id;
    uint64_t synth_ns; /* wall time this job's synthesis takes */
    uint64_t ticket;   /* channel ticket, set at hand-off */
    char label[JOB_META_BYTES - 3 * sizeof(uint64_t)];
};
_Static_assert(sizeof(struct job_meta) == JOB_META_BYTES, "job_meta is 256 B");

struct partition {
    struct partition *next; /* finalizer queue link */
    uint64_t job_id;
    uint64_t checksum;
    size_t bytes;
    unsigned char data[];
};

struct config {
    uint64_t seed;
    size_t cache_bytes;
    unsigned char *param_cache; /* stands in for SRS / circuit parameters */
};

struct log_record {
    struct log_record *next;
    char text[LOG_RECORD_BYTES - sizeof(struct log_record *)];
};
_Static_assert(sizeof(struct log_record) == LOG_RECORD_BYTES, "log record is 4 KiB");

/* The single-slot channel between the workers and the gpu thread. */
struct gpu_channel {
    pthread_mutex_t mu;
    pthread_cond_t not_full;
    pthread_cond_t not_empty;
    pthread_cond_t taken;
    struct partition *slot;
    uint64_t pushed;      /* tickets handed out */
    uint64_t taken_count; /* tickets taken by the gpu thread */
    bool closed;
};

/* Unbounded queue from the gpu thread to the finalizer. */
struct fin_queue {
    pthread_mutex_t mu;
    pthread_cond_t not_empty;
    struct partition *head, *tail;
    bool closed;
};

static struct gpu_channel chan = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .not_full = PTHREAD_COND_INITIALIZER,
    .not_empty = PTHREAD_COND_INITIALIZER,
    .taken = PTHREAD_COND_INITIALIZER,
};
static struct fin_queue finq = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .not_empty = PTHREAD_COND_INITIALIZER,
};

static sem_t permits;
static struct config *config;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct log_record *log_head;

/* Start gate: workers wait here until main opens it (after SIGUSR1 with
 * --wait-signal, immediately otherwise). */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;

/* Completion: the finalizer signals when every partition has been freed. */
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv; /* CLOCK_MONOTONIC, initialised in main */

static atomic_int next_job;
static atomic_int live;          /* partitions allocated and not yet freed */
static atomic_int peak_live;
static atomic_int synthesizing;  /* workers inside synthesize_partition */
static atomic_int waiting;       /* finished partitions not yet in the slot */
static atomic_int peak_waiting;  /* the most there ever were */
static atomic_int at_gpu;
static atomic_int synthesized;
static atomic_int proved;
static atomic_int freed;

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("provingd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void check(int err, const char *what)
{
    if (err != 0)
        die("%s: %s", what, strerror(err));
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

static long rss_kib(void)
{
    long pages_total, pages_res;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return -1;
    int n = fscanf(f, "%ld %ld", &pages_total, &pages_res);
    fclose(f);
    return n == 2 ? pages_res * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

static void note_live(int delta)
{
    int now = atomic_fetch_add(&live, delta) + delta;
    int peak = atomic_load(&peak_live);
    while (now > peak && !atomic_compare_exchange_weak(&peak_live, &peak, now))
        ;
}

/* ------------------------------------------------------------------------ */
/* allocation sites                                                          */

/* Each allocation site is its own out-of-line function so that recorded call
 * stacks name it: no inlining, and no IPA clones ("foo.constprop.0") either. */
#if defined(__clang__)
#define ALLOC_SITE __attribute__((noinline))
#else
#define ALLOC_SITE __attribute__((noinline, noclone))
#endif

/* Placed after a final call to free(): keeps the call from becoming a tail
 * jump at -O2, which would drop this function's frame from the stack. */
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")

/* Loaded once, kept for the whole run: a plateaued allocation. */
ALLOC_SITE static struct config *load_config(uint64_t seed)
{
    struct config *c = malloc(sizeof *c);
    if (c == NULL)
        die("load_config: out of memory");
    c->seed = seed;
    c->cache_bytes = CONFIG_CACHE_BYTES;
    c->param_cache = malloc(c->cache_bytes);
    if (c->param_cache == NULL)
        die("load_config: out of memory");
    uint64_t x = seed;
    for (size_t i = 0; i < c->cache_bytes; i += sizeof x) {
        x = splitmix64(x);
        memcpy(c->param_cache + i, &x, sizeof x);
    }
    return c;
}

/* Per-job metadata, freed by the same worker right after the hand-off:
 * a transient allocation. */
ALLOC_SITE static struct job_meta *alloc_job_meta(int id)
{
    struct job_meta *m = malloc(sizeof *m);
    if (m == NULL)
        die("alloc_job_meta: out of memory");
    m->id = (uint64_t)id;
    m->ticket = 0;
    /* Synthesis wall time: synth_ms +-50%, a pure function of (seed, id) so
     * that the same seed gives the same workload. */
    uint64_t r = splitmix64(opt.seed * 0x100000001b3u + (uint64_t)id);
    double f = 0.5 + (double)(r >> 11) / 9007199254740992.0; /* [0.5, 1.5) */
    m->synth_ns = (uint64_t)(f * opt.synth_ms * 1e6);
    snprintf(m->label, sizeof m->label, "partition-job-%d", id);
    return m;
}

ALLOC_SITE static void free_job_meta(struct job_meta *m)
{
    free(m);
    KEEP_FRAME();
}

/* The culprit: M MiB per partition, made resident, freed by another thread. */
ALLOC_SITE static struct partition *synthesize_partition(const struct job_meta *job)
{
    uint64_t t0 = now_ns();
    size_t bytes = (size_t)opt.partition_mb * MIB;
    size_t chunk = (size_t)opt.chunk_kb * 1024, nchunks = chunk ? (bytes + chunk - 1) / chunk : 0;
    /* One block, or (--chunk-kb) a table of chunk pointers and the chunks: many live blocks. */
    struct partition *p = malloc(sizeof *p + (chunk ? nchunks * sizeof(unsigned char *) : bytes));
    if (p == NULL)
        die("synthesize_partition: out of memory (%zu bytes)", bytes);
    note_live(+1);
    p->next = NULL;
    p->job_id = job->id;
    p->bytes = bytes;
    unsigned char **chunks = (unsigned char **)p->data;
    for (size_t c = 0; c < nchunks; c++) {
        chunks[c] = malloc(chunk);
        if (chunks[c] == NULL)
            die("synthesize_partition: out of memory (chunk %zu)", c);
    }

    /* Touch every page so the whole partition is resident. */
    if (chunk)
        for (size_t c = 0; c < nchunks; c++)
            memset(chunks[c], 0, chunk);
    else
        memset(p->data, 0, bytes);

    /* A few ms of real CPU work: fold the parameter cache into every word. */
    uint64_t acc = job->id;
    const uint64_t *params = (const uint64_t *)config->param_cache;
    size_t nparams = config->cache_bytes / sizeof *params;
    for (size_t i = 0; i < bytes / sizeof acc; i++) {
        acc = splitmix64(acc ^ params[i % nparams]);
        size_t off = i * sizeof acc;
        memcpy(chunk ? chunks[off / chunk] + off % chunk : p->data + off, &acc, sizeof acc);
    }
    p->checksum = acc;

    /* The rest of synthesis (minutes of many-core work on the real box). */
    uint64_t spent = now_ns() - t0;
    if (spent < job->synth_ns)
        sleep_ns(job->synth_ns - spent);
    return p;
}

ALLOC_SITE static void release_partition(struct partition *p)
{
    note_live(-1);
    if (opt.chunk_kb) {
        size_t chunk = (size_t)opt.chunk_kb * 1024, nchunks = (p->bytes + chunk - 1) / chunk;
        unsigned char **chunks = (unsigned char **)p->data;
        for (size_t c = 0; c < nchunks; c++)
            free(chunks[c]);
    }
    free(p);
    KEEP_FRAME();
}

/* One 4 KiB record per proved partition, never trimmed: a slow leak. */
ALLOC_SITE static void append_log_record(const struct partition *p, uint64_t prove_ns)
{
    struct log_record *r = malloc(sizeof *r);
    if (r == NULL)
        die("append_log_record: out of memory");
    /* No memset: GCC would fold malloc+memset into calloc, and this site is
     * meant to show up as a malloc. */
    snprintf(r->text, sizeof r->text,
             "proved partition job=%" PRIu64 " bytes=%zu checksum=%016" PRIx64
             " prove_ms=%.1f",
             p->job_id, p->bytes, p->checksum, (double)prove_ns / 1e6);
    pthread_mutex_lock(&log_mu);
    r->next = log_head;
    log_head = r;
    pthread_mutex_unlock(&log_mu);
}

/* ------------------------------------------------------------------------ */
/* single-slot channel                                                       */

/* Blocks while the slot is occupied; returns the partition's ticket. */
static uint64_t channel_push(struct partition *p)
{
    pthread_mutex_lock(&chan.mu);
    while (chan.slot != NULL)
        pthread_cond_wait(&chan.not_full, &chan.mu);
    chan.slot = p;
    uint64_t ticket = ++chan.pushed;
    atomic_fetch_sub(&waiting, 1);
    pthread_cond_signal(&chan.not_empty);
    pthread_mutex_unlock(&chan.mu);
    return ticket;
}

/* Blocks until the gpu thread has taken the partition with this ticket. */
static void channel_wait_taken(uint64_t ticket)
{
    pthread_mutex_lock(&chan.mu);
    while (chan.taken_count < ticket)
        pthread_cond_wait(&chan.taken, &chan.mu);
    pthread_mutex_unlock(&chan.mu);
}

/* NULL once the channel is closed and empty. */
static struct partition *channel_take(void)
{
    pthread_mutex_lock(&chan.mu);
    while (chan.slot == NULL && !chan.closed)
        pthread_cond_wait(&chan.not_empty, &chan.mu);
    struct partition *p = chan.slot;
    if (p != NULL) {
        chan.slot = NULL;
        chan.taken_count++;
        atomic_fetch_add(&at_gpu, 1);
        pthread_cond_signal(&chan.not_full);
        pthread_cond_broadcast(&chan.taken);
    }
    pthread_mutex_unlock(&chan.mu);
    return p;
}

static void channel_close(void)
{
    pthread_mutex_lock(&chan.mu);
    chan.closed = true;
    pthread_cond_broadcast(&chan.not_empty);
    pthread_mutex_unlock(&chan.mu);
}

static void finq_push(struct partition *p)
{
    pthread_mutex_lock(&finq.mu);
    p->next = NULL;
    if (finq.tail != NULL)
        finq.tail->next = p;
    else
        finq.head = p;
    finq.tail = p;
    pthread_cond_signal(&finq.not_empty);
    pthread_mutex_unlock(&finq.mu);
}

static struct partition *finq_pop(void)
{
    pthread_mutex_lock(&finq.mu);
    while (finq.head == NULL && !finq.closed)
        pthread_cond_wait(&finq.not_empty, &finq.mu);
    struct partition *p = finq.head;
    if (p != NULL) {
        finq.head = p->next;
        if (finq.head == NULL)
            finq.tail = NULL;
    }
    pthread_mutex_unlock(&finq.mu);
    return p;
}

static void finq_close(void)
{
    pthread_mutex_lock(&finq.mu);
    finq.closed = true;
    pthread_cond_broadcast(&finq.not_empty);
    pthread_mutex_unlock(&finq.mu);
}

/* ------------------------------------------------------------------------ */
/* threads                                                                   */

static void *partition_worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gate_mu);
    while (!gate_open)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);

    for (;;) {
        int id = atomic_fetch_add(&next_job, 1);
        if (id >= opt.partitions)
            break;
        struct job_meta *job = alloc_job_meta(id);

        while (sem_wait(&permits) != 0 && errno == EINTR)
            ;
        atomic_fetch_add(&synthesizing, 1);
        struct partition *p = synthesize_partition(job);
        atomic_fetch_sub(&synthesizing, 1);
        atomic_fetch_add(&synthesized, 1);
        int w = atomic_fetch_add(&waiting, 1) + 1;
        int pw_seen = atomic_load(&peak_waiting);
        while (w > pw_seen && !atomic_compare_exchange_weak(&peak_waiting, &pw_seen, w))
            ;

        if (opt.bug) {
            /* THE BUG (as in the incident): the permit goes back as soon as
             * synthesis is done.  This worker still owns a finished partition
             * and is about to block on the one-slot channel, but another
             * worker may now start synthesizing -- nothing bounds how many
             * finished partitions wait here except the number of workers. */
            sem_post(&permits);
            job->ticket = channel_push(p);
        } else {
            /* The fix: hold the permit until the gpu thread has taken the
             * partition out of the channel, so the permits bound the number of
             * partitions that exist outside the gpu. */
            job->ticket = channel_push(p);
            channel_wait_taken(job->ticket);
            sem_post(&permits);
        }
        free_job_meta(job);
    }
    return NULL;
}

static void *gpu_thread(void *arg)
{
    (void)arg;
    struct partition *p;
    while ((p = channel_take()) != NULL) {
        uint64_t t0 = now_ns();
        sleep_ns((uint64_t)opt.gpu_ms * 1000000u); /* "prove" on the GPU */
        uint64_t dt = now_ns() - t0;
        append_log_record(p, dt);
        atomic_fetch_sub(&at_gpu, 1);
        atomic_fetch_add(&proved, 1);
        finq_push(p);
    }
    return NULL;
}

static void *finalizer_thread(void *arg)
{
    (void)arg;
    struct partition *p;
    unsigned since_trim = 0;
    while ((p = finq_pop()) != NULL) {
        release_partition(p); /* cross-thread free: allocated by a pworker */
        if (++since_trim == TRIM_EVERY) {
            malloc_trim(0);
            since_trim = 0;
        }
        if (atomic_fetch_add(&freed, 1) + 1 == opt.partitions) {
            pthread_mutex_lock(&done_mu);
            pthread_cond_broadcast(&done_cv);
            pthread_mutex_unlock(&done_mu);
        }
    }
    malloc_trim(0);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* main                                                                      */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: provingd [--pw N] [--workers W] [--partitions P] [--partition-mb M]\n"
            "                [--gpu-ms T] [--synth-ms S] [--bug] [--wait-signal]\n"
            "                [--seed S] [--verbose] [--summary FILE] [--chunk-kb K]\n"
            "  --pw N            semaphore permits (partitions in flight), default %d\n"
            "  --workers W       partition-worker threads, default %d\n"
            "  --partitions P    partitions to prove before exiting, default %d\n"
            "  --partition-mb M  size of one partition in MiB, default %d\n"
            "  --gpu-ms T        gpu time per partition, default %d\n"
            "  --synth-ms S      mean synthesis wall time (+-50%%), default %d\n"
            "  --bug             release the permit before the gpu hand-off\n"
            "  --wait-signal     print 'ready <pid>' and wait for SIGUSR1 before working\n"
            "  --seed S          workload seed, default %" PRIu64 "\n"
            "  --verbose         per-second progress on stderr\n"
            "  --summary FILE    also write the summary line (peaks) to FILE\n"
            "  --chunk-kb K      build each partition from K KiB chunks (many live blocks)\n",
            opt.pw, opt.workers, opt.partitions, opt.partition_mb, opt.gpu_ms,
            opt.synth_ms, opt.seed);
}

static int parse_int(const char *name, const char *s, int min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > INT_MAX / 2)
        die("bad value for --%s: '%s' (need an integer >= %d)", name, s, min);
    return (int)v;
}

static void parse_args(int argc, char **argv)
{
    enum { O_PW = 256, O_WORKERS, O_PARTS, O_MB, O_GPU, O_SYNTH, O_SEED, O_SUMMARY, O_CHUNK };
    static const struct option longopts[] = {
        {"pw", required_argument, NULL, O_PW},
        {"workers", required_argument, NULL, O_WORKERS},
        {"partitions", required_argument, NULL, O_PARTS},
        {"partition-mb", required_argument, NULL, O_MB},
        {"gpu-ms", required_argument, NULL, O_GPU},
        {"synth-ms", required_argument, NULL, O_SYNTH},
        {"seed", required_argument, NULL, O_SEED},
        {"summary", required_argument, NULL, O_SUMMARY},
        {"chunk-kb", required_argument, NULL, O_CHUNK},
        {"bug", no_argument, NULL, 'b'},
        {"wait-signal", no_argument, NULL, 'w'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_PW: opt.pw = parse_int("pw", optarg, 1); break;
        case O_WORKERS: opt.workers = parse_int("workers", optarg, 1); break;
        case O_PARTS: opt.partitions = parse_int("partitions", optarg, 1); break;
        case O_MB: opt.partition_mb = parse_int("partition-mb", optarg, 1); break;
        case O_GPU: opt.gpu_ms = parse_int("gpu-ms", optarg, 0); break;
        case O_SYNTH: opt.synth_ms = parse_int("synth-ms", optarg, 0); break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 0);
            if (errno != 0 || end == optarg || *end != '\0')
                die("bad value for --seed: '%s'", optarg);
            opt.seed = v;
            break;
        }
        case O_SUMMARY: opt.summary = optarg; break;
        case O_CHUNK: opt.chunk_kb = parse_int("chunk-kb", optarg, 0); break;
        case 'b': opt.bug = true; break;
        case 'w': opt.wait_signal = true; break;
        case 'v': opt.verbose = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind != argc) {
        usage(stderr);
        exit(2);
    }
    if (opt.workers > MAX_WORKERS)
        die("--workers: at most %d", MAX_WORKERS);
}

static void progress(uint64_t t_start)
{
    pthread_mutex_lock(&chan.mu);
    int in_slot = chan.slot != NULL;
    pthread_mutex_unlock(&chan.mu);
    fprintf(stderr,
            "[%6.1fs] live partitions=%d peak=%d | synthesizing=%d waiting=%d "
            "channel=%d gpu=%d | synthesized=%d proved=%d freed=%d | rss=%ld MiB\n",
            (double)(now_ns() - t_start) / 1e9, atomic_load(&live),
            atomic_load(&peak_live), atomic_load(&synthesizing),
            atomic_load(&waiting), in_slot, atomic_load(&at_gpu),
            atomic_load(&synthesized), atomic_load(&proved), atomic_load(&freed),
            rss_kib() / 1024);
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);

    /* Serve every partition from its own mmap: a fixed threshold also turns
     * off glibc's dynamic threshold, which would otherwise move 8 MiB chunks
     * into the arenas after the first free. */
    mallopt(M_MMAP_THRESHOLD, (int)MIB);

    /* SIGUSR1 stays blocked in every thread; main collects it with sigwait. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    check(pthread_sigmask(SIG_BLOCK, &usr1, NULL), "pthread_sigmask");

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&done_cv, &ca);
    pthread_condattr_destroy(&ca);

    if (sem_init(&permits, 0, (unsigned)opt.pw) != 0)
        die("sem_init: %s", strerror(errno));
    config = load_config(opt.seed);

    pthread_t *workers = calloc((size_t)opt.workers, sizeof *workers);
    if (workers == NULL)
        die("out of memory");
    char name[16];
    for (int i = 0; i < opt.workers; i++) {
        check(pthread_create(&workers[i], NULL, partition_worker, NULL), "pthread_create");
        snprintf(name, sizeof name, "pworker-%d", (i + 1) % (MAX_WORKERS + 1));
        pthread_setname_np(workers[i], name);
    }
    pthread_t gpu, fin;
    check(pthread_create(&gpu, NULL, gpu_thread, NULL), "pthread_create");
    pthread_setname_np(gpu, "gpu");
    check(pthread_create(&fin, NULL, finalizer_thread, NULL), "pthread_create");
    pthread_setname_np(fin, "finalizer");

    if (opt.wait_signal) {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        int sig;
        check(sigwait(&usr1, &sig), "sigwait");
    }
    if (opt.verbose)
        fprintf(stderr,
                "provingd: pw=%d workers=%d partitions=%d partition=%d MiB gpu=%d ms "
                "synth=%d ms %s\n",
                opt.pw, opt.workers, opt.partitions, opt.partition_mb, opt.gpu_ms,
                opt.synth_ms, opt.bug ? "BUG (permit released before hand-off)" : "fixed");

    uint64_t t_start = now_ns();
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);

    /* Wait for every partition to be freed, reporting once a second. */
    pthread_mutex_lock(&done_mu);
    uint64_t next_tick = t_start + 1000000000u;
    while (atomic_load(&freed) < opt.partitions) {
        struct timespec ts = {.tv_sec = (time_t)(next_tick / 1000000000u),
                              .tv_nsec = (long)(next_tick % 1000000000u)};
        int rc = pthread_cond_timedwait(&done_cv, &done_mu, &ts);
        if (rc == ETIMEDOUT) {
            if (opt.verbose)
                progress(t_start);
            next_tick += 1000000000u;
        }
    }
    pthread_mutex_unlock(&done_mu);
    double elapsed = (double)(now_ns() - t_start) / 1e9;
    if (opt.verbose)
        progress(t_start);

    /* Orderly shutdown: workers have run out of jobs; drain and stop the gpu
     * and finalizer threads, then release what is left. */
    for (int i = 0; i < opt.workers; i++)
        check(pthread_join(workers[i], NULL), "pthread_join");
    channel_close();
    check(pthread_join(gpu, NULL), "pthread_join");
    finq_close();
    check(pthread_join(fin, NULL), "pthread_join");
    free(workers);

    size_t log_records = 0;
    while (log_head != NULL) {
        struct log_record *r = log_head;
        log_head = r->next;
        free(r);
        log_records++;
    }
    free(config->param_cache);
    free(config);
    sem_destroy(&permits);
    pthread_cond_destroy(&done_cv);

    int peak = atomic_load(&peak_live);
    char line[256];
    snprintf(line, sizeof line,
             "provingd: %s pw=%d workers=%d: peak live partitions %d (%d MiB, "
             "pw+2=%d), total partitions %d, log records %zu, elapsed %.1fs, "
             "peak waiting for the channel %d\n",
             opt.bug ? "bug" : "fixed", opt.pw, opt.workers, peak,
             peak * opt.partition_mb, opt.pw + 2, atomic_load(&freed), log_records,
             elapsed, atomic_load(&peak_waiting));
    fputs(line, stderr);
    if (opt.summary != NULL) {
        FILE *f = fopen(opt.summary, "w");
        if (f == NULL || fputs(line, f) < 0 || fclose(f) != 0)
            die("--summary %s: %s", opt.summary, strerror(errno));
    }
    return 0;
}
