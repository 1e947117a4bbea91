/* allocscope's in-process sampler: the code `allocscope record|top --inject` maps into a running
 * process (tracer/inject/), so that only the sampled allocator calls trap.
 *
 * Freestanding: no libc, no relocations, no thread-local storage, no allocation. The tracer maps
 * the file itself (mmap of its segments through injected system calls: no dlopen, no loader lock
 * taken in the target), fills `as_cfg`, and patches each allocator entry with a jump to a stub
 * that loads the function's slot into %rcx (the 4th argument: every hooked function takes at
 * most 3) and jumps to the hook of its kind. The slot's `orig` is a trampoline that replays the
 * entry's displaced instructions and jumps back behind them.
 *
 * A hook calls the real function, decides in the process whether the block is sampled (the BPF
 * estimator: kept with probability min(1, size/N), then worth max(size, N) bytes) and only then
 * calls a marker (as_mark_alloc, as_mark_free) that carries allocscope's uprobe. An unsampled
 * call costs a table lookup and a few branches: no trap, no system call.
 *
 * Per-thread state lives in a table keyed by the thread pointer (%fs:0, the TCB address on
 * glibc and musl), which the BPF side reads too (probes/regions.h agent_api): while a hook's
 * real call runs, the slot's `api` says so, and an mmap or brk it makes is the allocator's.
 *
 * Safety: a hook never allocates; a call made from inside a hooked call (an allocator calling
 * its own public entry) passes through; the tables are lock-free (compare-and-swap); a fork's
 * child marks nothing (a guard word its fork wipes: ours() below); the watchdog thread (raw clone,
 * every signal blocked, no TLS use) unhooks the process when the tracer's pidfd says it died. */

typedef unsigned long u64;
typedef long s64;
typedef unsigned int u32;
typedef int s32;
typedef unsigned char u8;
typedef u64 (*as_fn3)(u64, u64, u64);

#include "agent.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define HOOK __attribute__((visibility("hidden"), used, noinline))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define GOLDEN 0x9E3779B97F4A7C15ULL

HIDDEN struct as_config as_cfg __attribute__((used, aligned(64))) = {
    .magic = AS_AGENT_MAGIC, .version = AS_AGENT_VERSION, .size = sizeof(struct as_config)};

/* Markers: empty functions that carry allocscope's uprobes. Each starts with a 5-byte nop, then
 * push %rbp: on a kernel that optimizes a uprobe on a 5-byte nop (x86-64, 6.18: the probe becomes
 * a call into a trampoline that makes the uprobe system call, no breakpoint trap) the probe sits on
 * the nop, 35–55 % cheaper a hit (bench/marker_trap.py); elsewhere it sits on the push, an
 * instruction the kernel emulates (tracer/inject/agent.py marker_offset). Written in assembly so
 * that no compiler removes the calls; CFI for unwinders. */
#define MARKER(name)                                                                                       \
    ".globl " name "\n.hidden " name "\n.type " name ",@function\n.p2align 4\n" name ":\n.cfi_startproc\n" \
    ".byte 0x0f,0x1f,0x44,0x00,0x00\npush %rbp\n.cfi_def_cfa_offset 16\n.cfi_offset %rbp,-16\n"            \
    "pop %rbp\n.cfi_def_cfa_offset 8\nret\n.cfi_endproc\n.size " name ",.-" name "\n"
__asm__(".text\n" MARKER("as_mark_alloc") MARKER("as_mark_free") MARKER("as_mark_sys"));
/* p, the requested size, the bytes it stands for, the slot's cookie (enum as_api | source << 16),
 * the hook's frame (caller's %rbp at [fp], return address at [fp + 8], caller's %rsp fp + 16) */
void as_mark_alloc(u64 p, u64 size, u64 weight, u64 cookie, void *fp);
void as_mark_free(u64 p, u64 cookie);
/* An mmap-family call: phase 0 before the real call (munmap, madvise, brk: the probes read the
 * anonymous RSS and the time), 1 after it; the record; the hook's frame (as as_mark_alloc's). */
void as_mark_sys(u64 phase, const struct as_sysrec *r, void *fp);

/* The watchdog's first instructions: the tracer points a stopped thread here with the clone
 * arguments in %rdi/%rsi; the new thread (on its own stack) runs as_watchdog_main and exits, the
 * old one stops at the int3 for the tracer. */
__asm__(".text\n"
        ".globl as_clone_entry\n.hidden as_clone_entry\n.type as_clone_entry,@function\n.p2align 4\n"
        "as_clone_entry:\n"
        "xor %edx,%edx\nxor %r10d,%r10d\nxor %r8d,%r8d\nmov $56,%eax\nsyscall\n"
        "test %rax,%rax\njnz 1f\n"
        "xor %ebp,%ebp\ncall as_watchdog_main\n"
        "mov $60,%eax\nxor %edi,%edi\nsyscall\n"
        "1:\nint3\n"
        ".globl as_syscall_insn\n.hidden as_syscall_insn\nas_syscall_insn:\nsyscall\nint3\n"
        ".size as_clone_entry,.-as_clone_entry\n");

static inline s64 sys3(s64 nr, u64 a, u64 b, u64 c)
{
    s64 r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

#define SYS_mprotect 10
#define SYS_getpid 39
#define SYS_poll 7
#define SYS_close 3
#define PROT_RWX 7
#define POLLIN 1

/* --- per-thread state --------------------------------------------------------------------- */

static inline u64 thread_key(void)
{
    u64 v;
    __asm__("mov %%fs:0, %0" : "=r"(v));
    return v;
}

static struct as_thread spare = {.rng = GOLDEN}; /* threads past the table's probe window share this one */

static inline u64 rdtsc(void)
{
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}

/* The thread's slot when it is not at its home (the first of its probe window), or not there yet:
 * out of line, so that the hooks' common case keeps no register for it. */
__attribute__((noinline)) static struct as_thread *self_slow(u64 key)
{
    struct as_thread *tab = (struct as_thread *)as_cfg.threads;
    u32 bits = as_cfg.thread_bits;
    u64 mask = (1ULL << bits) - 1, h = ((key >> 4) * GOLDEN) >> (64 - bits);
    for (u32 i = 0; i < AS_THREAD_PROBES; i++) {
        struct as_thread *t = &tab[(h + i) & mask];
        u64 k = __atomic_load_n(&t->key, __ATOMIC_RELAXED);
        if (k == key)
            return t;
        if (k == 0 && __sync_bool_compare_and_swap(&t->key, 0, key)) {
            u64 seed = (key ^ rdtsc()) * GOLDEN;
            t->rng = seed ? seed : GOLDEN;
            return t;
        }
    }
    __atomic_fetch_add(&as_cfg.thread_overflow, 1, __ATOMIC_RELAXED);
    return &spare;
}

/* The calling thread's slot: its home slot, almost always (probes/regions.h agent_api looks
 * for it the same way). */
static inline struct as_thread *self(void)
{
    u64 key = thread_key();
    struct as_thread *t = (struct as_thread *)as_cfg.threads + (((key >> 4) * GOLDEN) >> (64 - as_cfg.thread_bits));
    if (likely(__atomic_load_n(&t->key, __ATOMIC_RELAXED) == key))
        return t;
    return self_slow(key);
}

/* 1: keep a block of `size` bytes, with probability min(1, size/N) (probes/heap.h sample_keep) */
static inline int keep(struct as_thread *t, u64 size)
{
    u64 n = as_cfg.sample_bytes;
    if (size >= n)
        return 1;
    u64 x = t->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t->rng = x;
    return (x >> 32) * n < (size << 32);
}

/* --- the set of sampled blocks ------------------------------------------------------------
 * Buckets of 8 pointers; a pointer whose home bucket is full lands in one of the next 3. One
 * byte per home bucket counts the pointers homed there (wherever they landed).
 *
 * The filter: a free of an unsampled block (nearly every free) must stop after reading memory
 * that is in L1. The counts above are indexed by a scattering hash of the pointer (the set must
 * spread its pointers), 128 KiB that a free lands in at random: under a real workload nearly every
 * free missed L1, often L2. So in front of them, u8[1 << filter_bits] (16 KiB) counts the sampled
 * pointers in each 4 KiB page of address space: the 64 pages of a 256 KiB region share one line
 * (placed by a hash of the region, so that glibc's 64 MiB-aligned arenas do not collide), and
 * frees of neighbouring blocks read the same few lines. A count is exact until it reaches 255,
 * where it stays ("look in the set" for good); a page that shares its count with another is only
 * a trip to the second level. Nothing is missed: a pointer's page count is raised before the
 * pointer is in the set and lowered after it left it. */

static inline u64 bucket_of(u64 p)
{
    return ((p >> 4) * GOLDEN) >> (64 - as_cfg.set_bits);
}

static inline u8 *filter_of(u64 p)
{
    u64 line = ((p >> (AS_FILTER_PAGE + AS_FILTER_LINE)) * GOLDEN) >> (64 + AS_FILTER_LINE - as_cfg.filter_bits);
    return (u8 *)as_cfg.filter + (line << AS_FILTER_LINE) + ((p >> AS_FILTER_PAGE) & ((1 << AS_FILTER_LINE) - 1));
}

/* +1 (d = 1) or -1 (d = 255) on a page's count, unless it stuck at 255. 0: it is stuck (+1). */
static int filter_add(u8 *f, u8 d)
{
    u8 c = __atomic_load_n(f, __ATOMIC_RELAXED);
    while (c != 255)
        if (__atomic_compare_exchange_n(f, &c, (u8)(c + d), 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return 1;
    return 0;
}

static int set_insert(u64 p)
{
    u64 *set = (u64 *)as_cfg.set;
    u8 *count = (u8 *)as_cfg.spill;
    u64 nb = 1ULL << as_cfg.set_bits, h = bucket_of(p);
    if (__atomic_load_n(&count[h], __ATOMIC_RELAXED) == 255)
        return 0;
    u8 *f = filter_of(p);
    int counted = filter_add(f, 1);                     /* before the pointer can be looked for */
    __atomic_fetch_add(&count[h], 1, __ATOMIC_ACQ_REL); /* likewise */
    for (u32 j = 0; j < AS_SET_SPILL; j++) {
        u64 *b = &set[((h + j) & (nb - 1)) * 8];
        for (u32 i = 0; i < 8; i++)
            if (b[i] == 0 && __sync_bool_compare_and_swap(&b[i], 0, p))
                return 1;
    }
    __atomic_fetch_sub(&count[h], 1, __ATOMIC_ACQ_REL);
    if (counted)
        filter_add(f, 255);
    return 0;
}

static inline int set_remove(u64 p)
{
    u64 h = bucket_of(p);
    u8 *count = (u8 *)as_cfg.spill;
    if (likely(__atomic_load_n(&count[h], __ATOMIC_RELAXED) == 0))
        return 0;
    u64 *set = (u64 *)as_cfg.set;
    u64 nb = 1ULL << as_cfg.set_bits;
    for (u32 j = 0; j < AS_SET_SPILL; j++) {
        u64 *b = &set[((h + j) & (nb - 1)) * 8];
        for (u32 i = 0; i < 8; i++)
            if (__atomic_load_n(&b[i], __ATOMIC_RELAXED) == p && __sync_bool_compare_and_swap(&b[i], p, 0)) {
                __atomic_fetch_sub(&count[h], 1, __ATOMIC_ACQ_REL);
                filter_add(filter_of(p), 255);
                return 1;
            }
    }
    return 0;
}

/* --- hooks ------------------------------------------------------------------------------- */

static inline int ours(void)
{
    /* A fork's child runs these hooks too, on a copy of the tables: it marks nothing. The guard
     * word's page is wiped in a child (MADV_WIPEONFORK), so this costs a load, not a system call
     * (a getpid on every sampled call cost rustd ~0.5 % more than its 120 ns: bench/inject_toggle.py);
     * without the page, getpid. */
    const volatile u64 *guard = (const volatile u64 *)as_cfg.guard;
    if (likely(guard ? *guard != 0 : sys3(SYS_getpid, 0, 0, 0) == (s64)as_cfg.pid))
        return 1;
    __atomic_fetch_add(&as_cfg.foreign, 1, __ATOMIC_RELAXED);
    return 0;
}

static __attribute__((always_inline)) inline void sampled(u64 p, u64 size, const struct as_slot *s, void *fp)
{
    if (!ours())
        return;
    if (!set_insert(p)) {
        __atomic_fetch_add(&as_cfg.set_full, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&as_cfg.sampled, 1, __ATOMIC_RELAXED);
    as_mark_alloc(p, size, size > as_cfg.sample_bytes ? size : as_cfg.sample_bytes, s->cookie, fp);
}

static __attribute__((always_inline)) inline void unsampled_free(u64 p, const struct as_slot *s)
{
    if (p && set_remove(p) && ours()) {
        __atomic_fetch_add(&as_cfg.freed, 1, __ATOMIC_RELAXED);
        as_mark_free(p, s->cookie);
    }
}

#define API(s) ((u32)(s)->cookie & 0xffff)

/* 1 when `p` may be in the set: its page's count (in L1, mostly), then its home bucket's */
static inline int maybe_sampled(u64 p)
{
    return p && *filter_of(p) && ((u8 *)as_cfg.spill)[bucket_of(p)];
}


/* The call state of a hooked call: while the real function runs, `api` names it (BPF reads it:
 * probes/regions.h agent_api, so that an mmap or brk inside it is the allocator's) and `depth`
 * says a call made inside it (an allocator calling its own public entry: mimalloc's malloc calls
 * mi_malloc, glibc's realloc(NULL, n) jumps to malloc) passes through: the outermost call is the
 * one sampled. The sampling is decided before the call, so the common case is a call, two stores
 * and a return. sp/ra: the entry's stack slot and its return address (BPF checks that the call is
 * still running: the word at sp is still ra and the thread is deeper). */
#define RA_SLOT() ((u64 *)__builtin_frame_address(0) + 1)

/* The sampled call (out of line): the real call, the old block of a realloc freed, the new block
 * kept. `ra_slot`: where the caller's return address is. */
__attribute__((noinline)) static u64 call_sampled(u64 a, u64 b, u64 c, const struct as_slot *s, struct as_thread *t,
                                                  u64 size, u32 kind, int keep_new, u64 *ra_slot)
{
    u64 r = ((as_fn3)s->orig)(a, b, c);
    t->api = 0;
    u64 p = r;
    if (kind == 1) { /* realloc, reallocarray: the old block goes when the call succeeds (or size 0) */
        if (a && (r || size == 0))
            unsampled_free(a, s);
    } else if (kind == 2) { /* posix_memalign: 0 and *pp */
        p = ((u32)r == 0 && a) ? *(volatile u64 *)a : 0;
    }
    if (p && keep_new)
        sampled(p, size, s, ra_slot - 1); /* the caller's %rbp was pushed there by the hook */
    t->depth = 0;
    return r;
}

/* An allocation of a size known before the call. */
#define ALLOC_HOOK(name, SIZE, KIND)                                    \
    HOOK u64 name(u64 a, u64 b, u64 c, const struct as_slot *s)         \
    {                                                                   \
        as_fn3 f = (as_fn3)s->orig;                                     \
        if (unlikely(!as_cfg.enabled))                                  \
            return f(a, b, c);                                          \
        struct as_thread *t = self();                                   \
        if (unlikely(t->depth))                                         \
            return f(a, b, c);                                          \
        u64 *ra_slot = RA_SLOT();                                       \
        u64 size = (SIZE);                                              \
        int k = keep(t, size);                                          \
        t->sp = (u64)ra_slot;                                           \
        t->ra = *ra_slot;                                               \
        t->call = API(s) | 1ULL << 32; /* api, depth 1: one store */    \
        if (unlikely(k) || (KIND == 1 && maybe_sampled(a)))             \
            return call_sampled(a, b, c, s, t, size, KIND, k, ra_slot); \
        u64 r = f(a, b, c);                                             \
        t->call = 0;                                                    \
        return r;                                                       \
    }

static inline u64 mul_or_max(u64 a, u64 b)
{
    u64 r;
    return __builtin_mul_overflow(a, b, &r) ? ~0ULL : r;
}

ALLOC_HOOK(as_h_malloc, a, 0)                /* malloc, valloc, pvalloc, mallocx, mi_malloc_aligned */
ALLOC_HOOK(as_h_calloc, mul_or_max(a, b), 0) /* calloc, mi_mallocn */
ALLOC_HOOK(as_h_aligned, b, 0)               /* aligned_alloc, memalign (alignment, size) */
ALLOC_HOOK(as_h_realloc, b, 1)               /* realloc(p, size[, flags]) */
ALLOC_HOOK(as_h_reallocarray, mul_or_max(b, c), 1)
ALLOC_HOOK(as_h_posix_memalign, c, 2) /* posix_memalign(&p, alignment, size) */

__attribute__((noinline)) static u64 free_sampled(u64 a, u64 b, u64 c, const struct as_slot *s)
{
    unsampled_free(a, s);
    return ((as_fn3)s->orig)(a, b, c);
}

/* free(p), sdallocx(p, size, flags), dallocx(p, flags), mi_free_size...: p first. The common
 * case (not a sampled block) is one byte read (the filter's), then a tail jump to the real free. */
HOOK u64 as_h_free(u64 a, u64 b, u64 c, const struct as_slot *s)
{
    if (likely(as_cfg.enabled) && unlikely(maybe_sampled(a)))
        return free_sampled(a, b, c, s);
    return ((as_fn3)s->orig)(a, b, c);
}

/* --- the mmap family --------------------------------------------------------------------
 * mmap, munmap, mremap, madvise and brk, hooked like the allocators, so that an --inject recording
 * needs no syscall tracepoint (enabling one sends every system call of every process on the
 * machine through the kernel's slow path). Each hook calls the real function and tells the probes
 * what the system call did through as_mark_sys, whose uprobe runs the same accounting as the
 * tracepoint programs (probes/syscalls.h mark_sys): after the call for mmap and mremap (one trap),
 * before and after it for munmap, madvise (only the advice that can release memory) and brk (the
 * anonymous RSS given back is measured across the call). A failed call reports nothing after it.
 * Unlike the allocator hooks these report whether or not sampling is on: the probes decide
 * (sys_hooked) which path counts a call, the tracepoint's or this one.
 *
 * The arguments are taken as the kernel takes them: int arguments (prot, flags, fd, advice) have
 * undefined upper halves in their registers. glibc's brk(addr) returns 0 or -1; the break after
 * it is asked of the kernel (brk(0)), as the system call would have returned it. */

typedef u64 (*as_fn6)(u64, u64, u64, u64, u64, u64);
typedef u64 (*as_fnv)(u64, u64, u64, u64, ...);

#define SYS_brk 12

static __attribute__((always_inline)) inline void sys_mark(u64 phase, struct as_sysrec *r, u64 *ra_slot)
{
    __atomic_fetch_add(&as_cfg.sys_marks, 1, __ATOMIC_RELAXED);
    as_mark_sys(phase, r, ra_slot - 1);
    __asm__ volatile("" ::: "memory"); /* the record is read by the probe: keep its stores */
}

/* The thread's slot, claimed for the call (0: a call of the family is running already on this
 * thread: one definition calling another, reported once, by the outer one) */
static inline struct as_thread *sys_enter(void)
{
    struct as_thread *t = self();
    if (t->sys)
        return 0;
    t->sys = 1;
    return t;
}

static inline u64 sys_result(u64 r)
{
    return r == ~0ULL ? (u64)-22 : r; /* libc's -1 (errno set): failed; the probes skip it */
}

static __attribute__((always_inline)) inline u64 sys_mmap(u64 orig, u64 a, u64 b, u64 c, u64 d, u64 e, u64 f,
                                                          u64 *ra_slot)
{
    struct as_thread *t = sys_enter();
    if (!t)
        return ((as_fn6)orig)(a, b, c, d, e, f);
    u64 r = ((as_fn6)orig)(a, b, c, d, e, f);
    if (r != ~0ULL) {
        struct as_sysrec rec = {9, {a, b, (u32)c, (u32)d, (u64)(s64)(s32)e}, r};
        sys_mark(1, &rec, ra_slot);
    }
    t->sys = 0;
    return r;
}

static __attribute__((always_inline)) inline u64 sys_munmap(u64 orig, u64 a, u64 b, u64 *ra_slot)
{
    struct as_thread *t = sys_enter();
    if (!t)
        return ((as_fn6)orig)(a, b, 0, 0, 0, 0);
    struct as_sysrec rec = {11, {a, b, 0, 0, 0}, 0};
    sys_mark(0, &rec, ra_slot);
    u64 r = ((as_fn6)orig)(a, b, 0, 0, 0, 0);
    rec.ret = sys_result(r);
    sys_mark(1, &rec, ra_slot);
    t->sys = 0;
    return r;
}

static __attribute__((always_inline)) inline u64 sys_mremap(u64 orig, u64 a, u64 b, u64 c, u64 d, u64 e, u64 *ra_slot)
{
    struct as_thread *t = sys_enter();
    if (!t)
        return ((as_fnv)orig)(a, b, c, d, e);
    u64 r = ((as_fnv)orig)(a, b, c, d, e);
    if (r != ~0ULL) {
        struct as_sysrec rec = {25, {a, b, c, (u32)d, e}, r};
        sys_mark(1, &rec, ra_slot);
    }
    t->sys = 0;
    return r;
}

/* The advice that can release memory (the tracepoint's filter): DONTNEED, FREE, REMOVE, PAGEOUT,
 * DONTNEED_LOCKED; any other passes straight through. */
static inline int releasing(u32 advice)
{
    return advice == 4 || advice == 8 || advice == 9 || advice == 21 || advice == 24;
}

static __attribute__((always_inline)) inline u64 sys_madvise(u64 orig, u64 a, u64 b, u64 c, u64 *ra_slot)
{
    struct as_thread *t = releasing((u32)c) ? sys_enter() : 0;
    if (!t)
        return ((as_fn6)orig)(a, b, c, 0, 0, 0);
    struct as_sysrec rec = {28, {a, b, (u32)c, 0, 0}, 0};
    sys_mark(0, &rec, ra_slot);
    u64 r = ((as_fn6)orig)(a, b, c, 0, 0, 0);
    rec.ret = sys_result(r);
    sys_mark(1, &rec, ra_slot);
    t->sys = 0;
    return r;
}

static __attribute__((always_inline)) inline u64 sys_brk(u64 orig, u64 a, u64 *ra_slot)
{
    struct as_thread *t = sys_enter();
    if (!t)
        return ((as_fn6)orig)(a, 0, 0, 0, 0, 0);
    struct as_sysrec rec = {12, {a, 0, 0, 0, 0}, 0};
    sys_mark(0, &rec, ra_slot);
    u64 r = ((as_fn6)orig)(a, 0, 0, 0, 0, 0);
    rec.ret = (u64)sys3(SYS_brk, 0, 0, 0); /* the break now, as the system call returns it */
    sys_mark(1, &rec, ra_slot);
    t->sys = 0;
    return r;
}

/* One hook per (kind, definition): as_hs_mmap_0 .. as_hs_brk_3. The stub jumps here with every
 * argument register as the caller set it. */
#define SYS_ORIG(k, i) __atomic_load_n(&as_cfg.sys_orig[k][i], __ATOMIC_RELAXED)
#define SYS_HOOKS(i)                                                             \
    HOOK u64 as_hs_mmap_##i(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f)            \
    {                                                                            \
        return sys_mmap(SYS_ORIG(AS_SYS_MMAP, i), a, b, c, d, e, f, RA_SLOT());  \
    }                                                                            \
    HOOK u64 as_hs_munmap_##i(u64 a, u64 b)                                      \
    {                                                                            \
        return sys_munmap(SYS_ORIG(AS_SYS_MUNMAP, i), a, b, RA_SLOT());          \
    }                                                                            \
    HOOK u64 as_hs_mremap_##i(u64 a, u64 b, u64 c, u64 d, u64 e)                 \
    {                                                                            \
        return sys_mremap(SYS_ORIG(AS_SYS_MREMAP, i), a, b, c, d, e, RA_SLOT()); \
    }                                                                            \
    HOOK u64 as_hs_madvise_##i(u64 a, u64 b, u64 c)                              \
    {                                                                            \
        return sys_madvise(SYS_ORIG(AS_SYS_MADVISE, i), a, b, c, RA_SLOT());     \
    }                                                                            \
    HOOK u64 as_hs_brk_##i(u64 a)                                                \
    {                                                                            \
        return sys_brk(SYS_ORIG(AS_SYS_BRK, i), a, RA_SLOT());                   \
    }

SYS_HOOKS(0)
SYS_HOOKS(1)
SYS_HOOKS(2)
SYS_HOOKS(3)

/* --- the watchdog ------------------------------------------------------------------------- */

/* Put back every patched entry word (the tracer is gone): one compare-and-swap each, on a page
 * made writable for the moment. A page that cannot be made writable keeps its jump, and the
 * hooks pass every call straight through (enabled = 0). */
static void unhook_all(void)
{
    as_cfg.enabled = 0;
    for (u32 i = 0; i < as_cfg.nhooks && i < AS_MAX_HOOKS; i++) {
        struct as_restore *h = &as_cfg.hooks[i];
        if (h->done)
            continue;
        if (sys3(SYS_mprotect, h->page, h->page_len, PROT_RWX) != 0) {
            h->done = 2;
            continue;
        }
        if (h->wide) {
            unsigned __int128 want = ((unsigned __int128)h->patched_hi << 64) | h->patched_word;
            unsigned __int128 orig = ((unsigned __int128)h->orig_hi << 64) | h->orig_word;
            __sync_val_compare_and_swap((unsigned __int128 *)h->word_addr, want, orig);
        } else {
            __sync_val_compare_and_swap((u64 *)h->word_addr, h->patched_word, h->orig_word);
        }
        sys3(SYS_mprotect, h->page, h->page_len, h->prot);
        h->done = 1;
    }
}

struct as_pollfd {
    s32 fd;
    short events, revents;
};

HOOK void as_watchdog_main(void)
{
    struct as_pollfd pfd = {as_cfg.pidfd, POLLIN, 0};
    sys3(157, 15, (u64) "allocscope-wd", 0); /* prctl(PR_SET_NAME): what ps -L and top -H show */
    __atomic_store_n(&as_cfg.watchdog, AS_WD_RUNNING, __ATOMIC_RELEASE);
    for (;;) {
        if (__atomic_load_n(&as_cfg.state, __ATOMIC_ACQUIRE) != AS_STATE_HOOKED)
            break;
        pfd.revents = 0;
        s64 r = sys3(SYS_poll, (u64)&pfd, 1, as_cfg.poll_ms);
        if (__atomic_load_n(&as_cfg.state, __ATOMIC_ACQUIRE) != AS_STATE_HOOKED)
            break;
        /* POLLIN: the tracer exited; POLLNVAL/POLLHUP: the descriptor is gone. Either way no one
         * will unhook this process but us. EINTR cannot come (every signal is blocked). */
        if (r > 0 || (r < 0 && r != -4)) {
            unhook_all();
            __atomic_store_n(&as_cfg.state, AS_STATE_UNHOOKED, __ATOMIC_RELEASE);
            /* POLLIN: the descriptor is still the tracer's pidfd, and no one else will close it.
             * (POLLNVAL: it is gone already, and its number may be the program's by now.) */
            if (r > 0 && pfd.revents == POLLIN)
                sys3(SYS_close, (u64)as_cfg.pidfd, 0, 0);
            break;
        }
    }
    __atomic_store_n(&as_cfg.watchdog, AS_WD_EXITED, __ATOMIC_RELEASE);
}
