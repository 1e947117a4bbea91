/* The agent's set of sampled blocks, exact (tests/test_inject.py): tracer/inject/agent/agent.c compiled in
 * (-I tracer/agent), its hooks called directly over glibc's malloc, realloc and free, the tables
 * mapped as tracer/inject/loading.py maps them. Every block's sampling is known from the agent's counter
 * (as_cfg.sampled moves by one); every free and realloc must report (as_cfg.freed) exactly the
 * sampled blocks, whatever the filter in front of the set says. Phases: every block sampled
 * (sample_bytes 1) with a filter of 256 page counts (they saturate), then 4096 (some) with the
 * tracer's 16 KiB filter. After
 * each, with every block freed: the set and its counts are empty and the filter holds only 0 or
 * the stuck 255. Prints one line per phase; exit 1 on any mismatch.
 * Then the fork guard (agent.c ours()): with as_cfg.pid deliberately wrong, the process whose guard
 * page holds 1 marks its sampled blocks and its fork's child (the page wiped) marks none; one
 * "fork" line with both counts. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.c"

#define SET_BITS 17
static struct as_slot ms, rs, fs;
static u64 rnd = 88172645463325252ULL;

static u64 next(void)
{
    rnd ^= rnd << 13;
    rnd ^= rnd >> 7;
    rnd ^= rnd << 17;
    return rnd;
}

static int phase(u64 sample_bytes, long n, long ops, u64 max_size, u32 filter_bits)
{
    u64 len = (64ULL << 14) + (64ULL << SET_BITS) + (1ULL << SET_BITS) + (1ULL << filter_bits);
    u64 t = (u64)mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    as_cfg.threads = t;
    as_cfg.thread_bits = 14;
    as_cfg.set = t + (64ULL << 14);
    as_cfg.set_bits = SET_BITS;
    as_cfg.spill = as_cfg.set + (64ULL << SET_BITS);
    as_cfg.filter = as_cfg.spill + (1ULL << SET_BITS);
    as_cfg.filter_bits = filter_bits;
    as_cfg.sample_bytes = sample_bytes;
    as_cfg.pid = (u32)getpid();
    as_cfg.sampled = as_cfg.freed = as_cfg.set_full = 0;
    as_cfg.enabled = 1;
    u64 *pool = calloc(n, 8);
    char *was = calloc(n, 1);
    long sampled = 0, wrong = 0;
    for (long k = 0; k < ops; k++) {
        long i = (long)(next() % (u64)n);
        u64 size = 1 + next() % max_size, s0 = as_cfg.sampled, f0 = as_cfg.freed;
        if (pool[i] && next() % 4 == 0) { /* realloc: the old block reported iff sampled */
            u64 r = as_h_realloc(pool[i], size, 0, &rs);
            wrong += (as_cfg.freed - f0) != (u64)was[i];
            pool[i] = r;
        } else {
            if (pool[i])
                as_h_free(pool[i], 0, 0, &fs);
            wrong += (as_cfg.freed - f0) != (u64)was[i];
            pool[i] = as_h_malloc(size, 0, 0, &ms);
        }
        was[i] = (char)(as_cfg.sampled - s0);
        sampled += was[i];
    }
    for (long i = 0; i < n; i++) {
        u64 f0 = as_cfg.freed;
        as_h_free(pool[i], 0, 0, &fs);
        wrong += (as_cfg.freed - f0) != (u64)was[i];
    }
    long left = 0, counts = 0, stuck = 0, odd = 0;
    for (u64 i = 0; i < (8ULL << SET_BITS); i++)
        left += ((u64 *)as_cfg.set)[i] != 0;
    for (u64 i = 0; i < (1ULL << SET_BITS); i++)
        counts += ((u8 *)as_cfg.spill)[i] != 0;
    for (u64 i = 0; i < (1ULL << filter_bits); i++) {
        u8 c = ((u8 *)as_cfg.filter)[i];
        stuck += c == 255;
        odd += c != 0 && c != 255;
    }
    printf("phase filter_bits=%u sample_bytes=%lu sampled=%ld freed=%lu set_full=%lu wrong=%ld left=%ld counts=%ld "
           "stuck=%ld "
           "odd=%ld\n",
           filter_bits, sample_bytes, sampled, as_cfg.freed, as_cfg.set_full, wrong, left, counts, stuck, odd);
    free(pool);
    free(was);
    munmap((void *)t, len);
    return wrong || left || counts || odd || (u64)sampled != as_cfg.freed;
}

/* `n` mallocs of 64 B, every one sampled: (sampled, foreign) moved by how many */
static void count_marks(long n, long *sampled, long *foreign)
{
    u64 s0 = as_cfg.sampled, f0 = as_cfg.foreign;
    for (long i = 0; i < n; i++)
        as_h_free(as_h_malloc(64, 0, 0, &ms), 0, 0, &fs);
    *sampled = (long)(as_cfg.sampled - s0);
    *foreign = (long)(as_cfg.foreign - f0);
}

static int fork_guard(void)
{
    u64 len = (64ULL << 14) + (64ULL << SET_BITS) + (1ULL << SET_BITS) + (1ULL << 14);
    u64 t = (u64)mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    u64 *guard = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (madvise(guard, 4096, MADV_WIPEONFORK) != 0)
        return 1;
    *guard = 1;
    as_cfg.threads = t;
    as_cfg.set = t + (64ULL << 14);
    as_cfg.spill = as_cfg.set + (64ULL << SET_BITS);
    as_cfg.filter = as_cfg.spill + (1ULL << SET_BITS);
    as_cfg.filter_bits = 14;
    as_cfg.sample_bytes = 1;
    as_cfg.pid = 1; /* not ours by getpid: only the guard can say it is */
    as_cfg.guard = (u64)guard;
    as_cfg.enabled = 1;
    long ps, pf, cs = -1, cf = -1;
    count_marks(1000, &ps, &pf);
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    pid_t c = fork();
    if (c == 0) {
        long r[2];
        count_marks(1000, &r[0], &r[1]);
        _exit(write(fds[1], r, sizeof(r)) == sizeof(r) ? 0 : 1);
    }
    long r[2] = {-1, -1};
    int st = 0;
    if (read(fds[0], r, sizeof(r)) == sizeof(r))
        cs = r[0], cf = r[1];
    waitpid(c, &st, 0);
    printf("fork parent_sampled=%ld parent_foreign=%ld child_sampled=%ld child_foreign=%ld\n", ps, pf, cs, cf);
    as_cfg.guard = 0;
    return ps != 1000 || pf != 0 || cs != 0 || cf != 1000;
}

int main(void)
{
    ms.orig = (u64)malloc;
    rs.orig = (u64)realloc;
    fs.orig = (u64)free;
    ms.cookie = 1;
    rs.cookie = 4;
    fs.cookie = 7;
    int bad = phase(1, 300000, 600000, 24, 8); /* 256 page counts: they saturate */
    bad |= phase(4096, 200000, 600000, 2048, 14);
    bad |= fork_guard();
    return bad;
}
