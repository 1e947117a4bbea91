/* The agent's free check under a realistic free pattern, for bench/agent_free.py:
 *   agent_free [--mode all|plain|before|after] [--pattern churn|pair] [--pool 1000000] [--ops 100000]
 *              [--batches 30] [--sample-bytes 524288] [--filter-bits 14] [--work-kib 0] [--work-lines 0]
 * --mode all (default): the three modes in one process, a pool each, batches taking turns.
 * churn: a pool of `pool` live blocks of mixed sizes (65 % 16-127 B, 30 % 128-1023 B, 5 % 1-8 KiB);
 * each op frees a random one and allocates another in its place (free order unrelated to the
 * allocation order). pair: malloc(32) + free, the tight loop of bench/pair.c. --work-kib/lines:
 * after each op, read `lines` random cache lines of a buffer of that size (the daemon's own work
 * competing for the caches). Modes: glibc's malloc/free called directly (plain), or through the
 * hooks of the agent as it was (before, symbols b_*) or as it is (after, a_*), both linked in
 * (bench/agent_harness.c). Prints "ready" once the pools are filled and churned, one line per batch:
 * "ns <mode> <batch> <per op>", then per hooked mode "levels <mode> ...": of the
 * live blocks, how many pass the first level of the free check, how many both, and the live
 * sampled blocks. Times are the thread's CPU time (a busy box preempts it). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef uint64_t u64;
#define HX(p)                                                                                                  \
    extern u64 p##hx_tables_bytes(uint32_t);                                                                       \
    extern void p##hx_init(u64, u64, uint32_t, u64, u64, uint32_t);                                                      \
    extern u64 p##hx_malloc(u64);                                                                              \
    extern void p##hx_free(u64);                                                                               \
    extern void p##hx_levels(const u64 *, u64, u64 *, u64 *, u64 *);
HX(b_)
HX(a_)

static void *plain_malloc(size_t n) { return malloc(n); }
static void plain_free(void *p) { free(p); }
static void *b_malloc(size_t n) { return (void *)b_hx_malloc(n); }
static void b_free(void *p) { b_hx_free((u64)p); }
static void *a_malloc(size_t n) { return (void *)a_hx_malloc(n); }
static void a_free(void *p) { a_hx_free((u64)p); }

static u64 rng = 0x9E3779B97F4A7C15ULL;
static inline u64 next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static inline size_t size_of(u64 r)
{
    u64 c = r % 100, v = r >> 8;
    if (c < 65)
        return 16 + v % 112;
    if (c < 95)
        return 128 + v % 896;
    return 1024 + v % 7168;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: not the waits of a busy box */
    return t.tv_sec * 1e9 + t.tv_nsec;
}

struct mode {
    const char *name;
    void *(*volatile m)(size_t);
    void (*volatile f)(void *);
    void (*levels)(const u64 *, u64, u64 *, u64 *, u64 *);
    u64 *pool;
};

static long pool_n = 1000000, work_lines = 0;
static volatile unsigned char *work;
static u64 work_mask;
static unsigned sink;

static void churn(struct mode *md, long ops)
{
    u64 *pool = md->pool;
    for (long i = 0; i < ops; i++) {
        u64 r = next(), j = r % (u64)pool_n;
        md->f((void *)pool[j]);
        pool[j] = (u64)md->m(size_of(next()));
        *(volatile char *)pool[j] = 1;
        for (long w = 0; w < work_lines; w++)
            sink += work[(((r + (u64)w) * 0x9E3779B97F4A7C15ULL) >> 20 & work_mask) * 64];
    }
}

static void pairs(struct mode *md, long ops)
{
    for (long i = 0; i < ops; i++) {
        char *p = md->m(32);
        *(volatile char *)p = 1;
        md->f(p);
    }
}

int main(int argc, char **argv)
{
    const char *mode = "all", *pattern = "churn";
    long ops = 100000, batches = 30, work_kib = 0;
    u64 sample_bytes = 524288;
    uint32_t filter_bits = 14;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--mode"))
            mode = v;
        else if (!strcmp(k, "--pattern"))
            pattern = v;
        else if (!strcmp(k, "--pool"))
            pool_n = atol(v);
        else if (!strcmp(k, "--ops"))
            ops = atol(v);
        else if (!strcmp(k, "--batches"))
            batches = atol(v);
        else if (!strcmp(k, "--sample-bytes"))
            sample_bytes = strtoull(v, 0, 10);
        else if (!strcmp(k, "--filter-bits"))
            filter_bits = (uint32_t)atoi(v);
        else if (!strcmp(k, "--work-kib"))
            work_kib = atol(v);
        else if (!strcmp(k, "--work-lines"))
            work_lines = atol(v);
        else {
            fprintf(stderr, "agent_free: unknown option %s\n", k);
            return 2;
        }
    }
    if (work_kib && work_lines) {
        work = malloc((size_t)work_kib << 10); /* before any hook: outside the pools' pages */
        memset((void *)work, 1, (size_t)work_kib << 10);
        work_mask = ((u64)work_kib << 10) / 64 - 1; /* a power of two of lines */
    }
    struct mode all[3] = {{"plain", plain_malloc, plain_free, 0, 0},
                          {"before", b_malloc, b_free, b_hx_levels, 0},
                          {"after", a_malloc, a_free, a_hx_levels, 0}};
    struct mode *use[3];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(mode, "all") || !strcmp(mode, all[i].name))
            use[n++] = &all[i];
    if (!n) {
        fprintf(stderr, "agent_free: unknown mode %s\n", mode);
        return 2;
    }
    for (int b = 0; b < 2; b++) {
        u64 len = b ? a_hx_tables_bytes(filter_bits) : b_hx_tables_bytes(filter_bits);
        void *t = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (t == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        (b ? a_hx_init : b_hx_init)((u64)t, sample_bytes, (uint32_t)getpid(), (u64)malloc, (u64)free, filter_bits);
    }
    int pair = !strcmp(pattern, "pair");
    if (!pair) /* the pools filled together, then churned into their steady state */
        for (int k = 0; k < n; k++)
            use[k]->pool = calloc((size_t)pool_n, sizeof(u64));
    for (long i = 0; !pair && i < pool_n; i++)
        for (int k = 0; k < n; k++) {
            use[k]->pool[i] = (u64)use[k]->m(size_of(next()));
            *(volatile char *)use[k]->pool[i] = 1;
        }
    for (long i = 0; !pair && i < 2 * pool_n; i += 10000)
        for (int k = 0; k < n; k++)
            churn(use[k], 10000);
    printf("ready\n");
    fflush(stdout);
    /* batches rotate over the modes (the order reversed every other round) */
    for (long b = 0; b < batches; b++)
        for (int k0 = 0; k0 < n; k0++) {
            struct mode *md = use[b % 2 ? n - 1 - k0 : k0];
            double t0 = now();
            if (pair)
                pairs(md, ops);
            else
                churn(md, ops);
            printf("ns %s %ld %.3f\n", md->name, b, (now() - t0) / (double)ops);
        }
    for (int k = 0; k < n && !pair; k++)
        if (use[k]->levels) {
            u64 f, both, live;
            use[k]->levels(use[k]->pool, (u64)pool_n, &f, &both, &live);
            printf("levels %s pool %ld first %llu both %llu live_sampled %llu\n", use[k]->name, pool_n,
                   (unsigned long long)f, (unsigned long long)both, (unsigned long long)live);
        }
    fflush(stdout);
    return (int)(sink & 0);
}
