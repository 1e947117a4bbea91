/* allocscope BPF program (BCC dialect).
 *
 * Aggregates in the kernel: every allocation is kept in `live` (address ->
 * size, stack, thread, time) and counted in `sites` per (stack, thread);
 * frees look the address up and are charged back to the allocating site and
 * thread, and to the (allocating, freeing) thread pair in `flows`. Nothing
 * per malloc leaves the kernel. Rare events (mmap family, brk, madvise,
 * malloc_trim, thread names, exit, exec) go through the `events` ring buffer.
 *
 * Compile-time parameters (cflags -D..., all set by tracer/probe.py probe_cflags from the
 * recording's options, tracer/options.py, where their defaults live):
 *   AS_TGID         process to trace
 *   AS_MAX_LIVE     outstanding allocations tracked
 *   AS_MAX_STACKS   distinct stacks
 *   AS_MAX_SITES    distinct (stack, thread, source)
 *   AS_MAX_REGIONS  mmap-family allocations accounted here
 *   AS_RING_PAGES   ring buffer size in pages
 *   AS_PAGE_SIZE    the target's page size
 *   AS_WAIT_EXEC    launch mode: ignore everything until the target's exec
 *   AS_OFF_*        kernel struct offsets from the running kernel's BTF (tracer/kernel.py)
 *   AS_SAMPLE_BYTES, AS_FAULTS + AS_FAULT_SAMPLE, AS_UNWIND_DWARF, AS_FLOOR: modes
 *
 * Stacks: user stacks are captured in return probes, where the first frame
 * is the return address into the caller, so the immediate caller is never
 * lost (an entry probe's frame-pointer walk skips it). In syscall
 * tracepoints the word at the user stack pointer is kept as a candidate
 * caller frame; the tracer decides whether it is one. capture_stack() is the
 * only place that walks a stack: a DWARF unwinder plugs in there.
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "allocscope.h"

#if (AS_MAX_DEPTH & (AS_MAX_DEPTH - 1)) != 0
#error "AS_MAX_DEPTH must be a power of 2"
#endif

#ifndef AS_TGID
#error "AS_TGID must be defined"
#endif
#ifndef AS_MAX_LIVE
#error "AS_MAX_LIVE: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
#ifndef AS_MAX_STACKS
#error "AS_MAX_STACKS: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
#ifndef AS_MAX_SITES
#error "AS_MAX_SITES: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
#ifndef AS_RING_PAGES
#error "AS_RING_PAGES: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
#ifndef AS_PAGE_SIZE
#error "AS_PAGE_SIZE: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
#define AS_MAX_THREADS 32768

BPF_F_TABLE("hash", u64, struct as_live, live, AS_MAX_LIVE, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u64, struct as_stack, stacks, AS_MAX_STACKS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct as_site_key, struct as_site, sites, AS_MAX_SITES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct as_flow_key, struct as_flow, flows, 65536, BPF_F_NO_PREALLOC);
/* Per-thread state between an allocator entry and its return: task-local storage, which the
 * kernel frees with the thread (no hash update or delete per call; sp == 0: no call open). */
BPF_TASK_STORAGE(inflight, struct as_inflight);
BPF_HASH(sysargs, u32, struct as_sysargs, AS_MAX_THREADS);
BPF_PERCPU_ARRAY(counters, u64, AS_CNT_MAX);
BPF_ARRAY(totals, s64, 8); /* 0: live bytes (heap API), 1: peak of 0, 2: bytes in `regions`,
                            * 3: regions, 4: CUDA host memory (pinned, managed) from the driver
                            * API, 5: GPU memory (device), 6: peak of 5 */
/* GPU memory and pinned registrations (no new host addresses), keyed apart from `live`. */
BPF_F_TABLE("hash", struct as_dev_key, struct as_live, dev_live, AS_MAX_LIVE, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct as_stack, 1);
BPF_RINGBUF_OUTPUT(events, AS_RING_PAGES);

/* Set once the traced program is gone: it exec'd another program (whose allocations would
 * reach the same libc probes and tracepoints), or its last thread exited (its pid may be given
 * to a new process). Nothing of that pid is counted after. */
BPF_ARRAY(gone, u32, 1);

static __always_inline int target_gone(void)
{
    u32 zero = 0;
    u32 *g = gone.lookup(&zero);
    return g && *g;
}

#ifdef AS_WAIT_EXEC
/* Launch mode: the target is forked by the tracer and traced only once it has exec'd, so the
 * tracer's own pre-exec allocations in the child never count. */
BPF_ARRAY(armed, u32, 1);

static __always_inline int is_target(void)
{
    if ((bpf_get_current_pid_tgid() >> 32) != AS_TGID)
        return 0;
    u32 zero = 0;
    u32 *a = armed.lookup(&zero);
    return a && *a && !target_gone();
}
#else
static __always_inline int is_target(void)
{
    return (bpf_get_current_pid_tgid() >> 32) == AS_TGID && !target_gone();
}
#endif
#ifdef AS_FLOOR
/* The trap floor (bench/overhead.py): every probe attached, every program returning at once. */
#define is_target() 0
#endif

static __always_inline u32 current_tid(void)
{
    return (u32)bpf_get_current_pid_tgid();
}

static __always_inline struct as_inflight *thread_state(u64 flags)
{
    return inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, flags);
}

/* The CUDA driver API's own call state: a driver call and the mallocs it makes inside nest in
 * separate states, so both are counted (each once). */
BPF_TASK_STORAGE(cu_inflight, struct as_inflight);

static __always_inline struct as_inflight *cu_state(u64 flags)
{
    return cu_inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, flags);
}

/* What an allocation made by `api` is (enum as_source), and whether it is GPU memory or a
 * registration (`dev_live`) rather than a new host block (`live`). */
static __always_inline u32 api_source(u32 api)
{
    switch (api) {
    case AS_API_CU_ALLOC:
    case AS_API_CU_ALLOC_PITCH:
    case AS_API_CU_CREATE:
        return AS_SRC_CUDA_DEVICE;
    case AS_API_CU_HOST_ALLOC:
    case AS_API_CU_HOST_REGISTER:
        return AS_SRC_CUDA_PINNED;
    case AS_API_CU_MANAGED:
        return AS_SRC_CUDA_MANAGED;
    default:
        return AS_SRC_HEAP;
    }
}

/* The key kind of a dev_live entry: device pointers (cuMemAlloc*, freed by cuMemFree*),
 * handles (cuMemCreate / cuMemRelease), registrations (cuMemHostRegister / Unregister); 0: a
 * host block in `live`. */
static __always_inline u32 dev_kind(u32 api)
{
    if (api == AS_API_CU_ALLOC || api == AS_API_CU_ALLOC_PITCH)
        return AS_API_CU_ALLOC;
    if (api == AS_API_CU_CREATE || api == AS_API_CU_HOST_REGISTER)
        return api;
    return 0;
}

static __always_inline void count(u32 idx, u64 n)
{
    u64 *c = counters.lookup(&idx);
    if (c)
        *c += n; /* per-CPU: no atomics needed */
}

/* --- stacks ------------------------------------------------------------ */

/* Hash the stack and keep it in `stacks`. bpf_get_stack zero-fills the
 * buffer past the frames it wrote, so hashing up to the first zero slot is
 * the same as hashing `depth` frames, and keeps the loop simple enough for
 * the verifier. */
static __always_inline u64 store_stack(struct as_stack *st)
{
    u64 h = 0xcbf29ce484222325ULL ^ st->flags ^ (st->extra * 0x9e3779b97f4a7c15ULL);
    for (u32 i = 0; i < AS_MAX_DEPTH; i++) {
        u64 ip = st->ips[i];
        if (ip == 0)
            break;
        h ^= ip;
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    if (h == 0)
        h = 1;
    if (stacks.lookup(&h))
        return h;
    int err = stacks.insert(&h, st);
    if (err != 0 && err != -EEXIST) {
        count(AS_LOST_STACK_FULL, 1);
        return 0;
    }
    return h;
}

#ifdef AS_UNWIND_DWARF
#include "unwind_dwarf.h"
#endif

/* Frame-pointer walk of the user stack, starting at the probe's user pc.
 * `extra` is kept beside the frames (syscalls: word at the user sp).
 * AS_UNWIND_DWARF: return probes unwind with CFI rows from the caller's registers. */
static __always_inline u64 capture_stack(void *ctx, u32 flags, u64 extra)
{
#ifdef AS_UNWIND_DWARF
    if (!(flags & AS_STACK_SYSCALL)) {
        struct pt_regs *regs = (struct pt_regs *)ctx;
        return capture_dwarf(PT_REGS_IP(regs), PT_REGS_SP(regs), PT_REGS_FP(regs), 0);
    }
#endif
    u32 zero = 0;
    struct as_stack *st = scratch.lookup(&zero);
    if (!st)
        return 0;
    long n = bpf_get_stack(ctx, st->ips, sizeof(st->ips), BPF_F_USER_STACK);
    if (n <= 0) {
        count(AS_LOST_STACK_ERR, 1);
        return 0;
    }
    st->depth = (u32)(n / sizeof(u64));
    st->flags = flags;
    st->extra = extra;
    return store_stack(st);
}

static __always_inline u64 capture_syscall_stack(void *ctx)
{
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 sp = 0, word = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp);
#ifdef AS_UNWIND_DWARF
    u64 ip = 0, bp = 0; /* DWARF: the syscall wrapper's own row finds its caller */
    bpf_probe_read_kernel(&ip, sizeof(ip), &regs->ip);
    bpf_probe_read_kernel(&bp, sizeof(bp), &regs->bp);
    return capture_dwarf(ip, sp, bp, 1);
#endif
    if (sp)
        bpf_probe_read_user(&word, sizeof(word), (void *)sp);
    return capture_stack(ctx, AS_STACK_SYSCALL, word);
}

/* --- resident memory: the kernel's RSS counters of the target's mm --------- */
/* Releases (malloc_trim, munmap, madvise, brk) are measured as the drop of the target's anonymous
 * RSS between their entry and return, so the bytes they really gave back are known, not summed
 * from lengths. The counter is read when needed: mm->rss_stat[MM_ANONPAGES] of the current task,
 * at offsets the tracer found in the running kernel's BTF (tracer/kernel.py) — the same value the
 * kernel's kmem:rss_stat tracepoint reports (percpu_counter's global count). With
 * AS_RSS_TRACEPOINT instead (a kernel whose BTF lacks the layout) a program on that tracepoint
 * keeps a copy current, at the price of one BPF run per RSS change of every process. */
#ifndef AS_RSS_TRACEPOINT
static __always_inline s64 rss_anon(void)
{
    u64 task = bpf_get_current_task(), mm = 0;
    s64 pages = 0;
    bpf_probe_read_kernel(&mm, sizeof(mm), (void *)(task + AS_OFF_TASK_MM));
    if (!mm)
        return 0;
    bpf_probe_read_kernel(&pages, sizeof(pages), (void *)(mm + AS_OFF_MM_ANON));
    return pages * AS_PAGE_SIZE;
}
#else
BPF_ARRAY(rss, s64, 4);
BPF_ARRAY(rss_mm, u32, 1); /* mm_id of the target, learned from its own first rss_stat event */

static __always_inline s64 rss_anon(void)
{
    u32 k = 1;
    s64 *v = rss.lookup(&k);
    return v ? *v : 0;
}

TRACEPOINT_PROBE(kmem, rss_stat)
{
    u32 zero = 0;
    u32 *mm = rss_mm.lookup(&zero);
    if (!mm)
        return 0;
    if (*mm == 0) {
        if (!args->curr || !is_target())
            return 0;
        *mm = args->mm_id;
    } else if (args->mm_id != *mm) {
        return 0;
    }
    u32 m = (u32)args->member;
    if (m >= 4)
        return 0;
    s64 v = args->size;
    rss.update(&m, &v);
    return 0;
}
#endif

/* --- accounting ---------------------------------------------------------- */

static __always_inline void totals_add(s64 delta)
{
    u32 k0 = 0, k1 = 1;
    s64 *live_b = totals.lookup(&k0);
    s64 *peak_b = totals.lookup(&k1);
    if (!live_b || !peak_b)
        return;
    s64 now = __sync_fetch_and_add(live_b, delta) + delta;
    if (delta > 0 && now > *peak_b)
        *peak_b = now; /* racy max: may miss a concurrent peak by one block */
}


/* Live-bytes totals of what an allocation is: heap (the malloc family of every allocator),
 * CUDA host memory, GPU. A user's allocation function is a layer above them (its pool's slabs
 * are counted where they were allocated): no total. */
static __always_inline void source_totals(u32 api, u32 src, s64 delta)
{
    if (api == AS_API_CUSTOM || api == AS_API_CU_HOST_REGISTER)
        return; /* a layer above: a pool's slab, a registered buffer, are counted where allocated */
    if (src != AS_SRC_CUDA_DEVICE && src != AS_SRC_CUDA_PINNED && src != AS_SRC_CUDA_MANAGED) {
        totals_add(delta);
        return;
    }
    u32 k = src == AS_SRC_CUDA_DEVICE ? 5 : 4, kp = 6;
    s64 *v = totals.lookup(&k);
    if (!v)
        return;
    s64 now = __sync_fetch_and_add(v, delta) + delta;
    if (k == 5 && delta > 0) {
        s64 *peak = totals.lookup(&kp);
        if (peak && now > *peak)
            *peak = now;
    }
}

/* One free by thread `tid` of `bytes` allocated by `alloc_tid` at `alloc_ts`; `count`: 1 when
 * it was the allocation's last byte. */
static __always_inline void flow_add(u32 alloc_tid, u32 tid, u64 bytes, u64 cnt, u64 alloc_ts, u64 now)
{
    struct as_flow_key fk = {.alloc_tid = alloc_tid, .free_tid = tid};
    struct as_flow *f = flows.lookup(&fk);
    if (!f) {
        struct as_flow zero = {};
        flows.insert(&fk, &zero);
        f = flows.lookup(&fk);
        if (!f) {
            count(AS_LOST_FLOW_FULL, 1);
            return;
        }
    }
    __sync_fetch_and_add(&f->bytes, bytes);
    if (!cnt)
        return;
    u64 wait = now > alloc_ts ? now - alloc_ts : 0;
    __sync_fetch_and_add(&f->count, 1);
    __sync_fetch_and_add(&f->wait_ns_sum, wait);
    if (wait > f->wait_ns_max)
        f->wait_ns_max = wait;
}

/* The site of (stack, thread, source), created empty when new; 0 when the map is full. */
static __always_inline struct as_site *site_of(u64 sid, u32 tid, u32 source)
{
    struct as_site_key sk = {.stack_id = sid, .tid = tid, .source = source};
    struct as_site *s = sites.lookup(&sk);
    if (!s) {
        struct as_site zero = {};
        sites.insert(&sk, &zero);
        s = sites.lookup(&sk);
        if (!s)
            count(AS_LOST_SITE_FULL, 1);
    }
    return s;
}

/* A tracked allocation `c` freed by thread `tid`: its site, its total, its flow. */
static __always_inline void charge_free(struct as_live *c, u32 tid, u64 now)
{
    u32 src = c->source;
    count(AS_CNT_FREES, 1);
    source_totals(c->api, src, -(s64)c->size);
    struct as_site_key sk = {.stack_id = c->stack_id, .tid = c->tid, .source = src};
    struct as_site *s = sites.lookup(&sk);
    if (s) {
        __sync_fetch_and_add(&s->free_bytes, c->size);
        __sync_fetch_and_add(&s->free_count, 1);
    }
    flow_add(c->tid, tid, c->size, 1, c->ts_ns, now);
}

/* Charge the free of `addr` by thread `tid` back to its allocation. */
static __always_inline void free_addr(u32 tid, u64 addr, u64 now)
{
    struct as_live *l = live.lookup(&addr);
    if (!l) {
        count(AS_CNT_FREE_UNKNOWN, 1);
        return;
    }
    struct as_live c = *l;
    if (live.delete(&addr) != 0)
        return; /* another thread freed it first (double free in the target) */
    charge_free(&c, tid, now);
}

/* The free of a GPU allocation or registration (`dev_live`); 0 when it was not tracked. */
static __always_inline int dev_free(u32 tid, u64 value, u32 kind, u64 now)
{
    struct as_dev_key k = {.value = value, .kind = kind};
    struct as_live *l = dev_live.lookup(&k);
    if (!l)
        return 0;
    struct as_live c = *l;
    if (dev_live.delete(&k) != 0)
        return 1;
    charge_free(&c, tid, now);
    return 1;
}

/* Keep one allocation made at stack `sid`: a host block in `live`, or GPU memory / a pinned
 * registration in `dev_live`. */
static __always_inline void record_alloc(u32 tid, u64 addr, u64 size, u32 api, u64 ts, u64 sid, u32 src)
{
    struct as_live l = {.size = size, .stack_id = sid, .ts_ns = ts, .tid = tid, .api = (u16)api,
                        .source = (u16)src};
    u32 kind = api == AS_API_CUSTOM ? AS_CUSTOM_KIND : dev_kind(api);
    int err;
    if (kind) {
        struct as_dev_key k = {.value = addr, .kind = kind};
        err = dev_live.insert(&k, &l);
        if (err == -EEXIST) { /* the same value live already: a free we could not see */
            dev_free(tid, addr, kind, ts);
            err = dev_live.update(&k, &l);
        }
    } else {
        err = live.insert(&addr, &l);
        if (err == -EEXIST) {
            /* The address is live already: a free we could not see. Charge it, then replace. */
            free_addr(tid, addr, ts);
            err = live.update(&addr, &l);
        }
    }
    if (err != 0) {
        count(AS_LOST_LIVE_FULL, 1);
        count(AS_LOST_LIVE_FULL_BYTES, size);
        return;
    }
    count(AS_CNT_ALLOCS, 1);
    source_totals(api, src, (s64)size);

    struct as_site *s = site_of(sid, tid, src);
    if (!s)
        return;
    u64 ab = __sync_fetch_and_add(&s->alloc_bytes, size) + size;
    __sync_fetch_and_add(&s->alloc_count, 1);
    u64 fb = s->free_bytes;
    if (ab > fb && ab - fb > s->peak_live_bytes)
        s->peak_live_bytes = ab - fb;
}

/* --- entry/return pairing -------------------------------------------------
 * One entry state per thread. An allocator entry deeper on the same stack
 * (sp lower) is a nested call; one at the same sp is a tail jump (glibc's
 * realloc(NULL, n) jumps to malloc, reallocarray to realloc); both are
 * counted once, by the outermost call. A return must come back at entry
 * sp + 8; anything else is reported as unmatched, never guessed. */

#ifdef AS_MULTI_SOURCE
/* The probed address of an entry probe -> the source of the allocator it belongs to (the heap of
 * a further allocator, heap:KIND[:PREFIX]); filled by the tracer as modules are mapped. An entry
 * it does not know (yet) is the main heap's. */
BPF_HASH(probe_src, u64, u32, 4096);

static __always_inline u32 entry_source(struct pt_regs *ctx)
{
    u64 ip = PT_REGS_IP(ctx); /* the probed instruction, set back by the kernel for handlers */
    u32 *s = probe_src.lookup(&ip);
    return s ? *s : AS_SRC_HEAP;
}
#else
#define entry_source(ctx) AS_SRC_HEAP
#endif

static __always_inline int enter_state(struct pt_regs *ctx, struct as_inflight *cur, u32 api, u64 size,
                                       u64 arg, u64 arg2, u32 src)
{
    u64 sp = PT_REGS_SP(ctx);
    if (!cur) {
        count(AS_LOST_INFLIGHT_FULL, 1);
        return 0;
    }
    if (cur->sp) {
        if (sp < cur->sp) {
            cur->nest++;
            count(AS_CNT_NESTED, 1);
            return 0;
        }
        if (sp == cur->sp) {
            cur->tail++;
            count(AS_CNT_NESTED, 1);
            return 0;
        }
        count(AS_LOST_STALE_ENTRY, 1);
    }
    cur->sp = sp;
    cur->size = size;
    cur->arg = arg;
    cur->arg2 = arg2;
    cur->ts_ns = api == AS_API_MALLOC_TRIM ? bpf_ktime_get_ns() : 0; /* allocations: return time */
    cur->api = api;
    cur->nest = 0;
    cur->tail = 0;
    cur->source = src;
    return 0;
}

static __always_inline int enter(struct pt_regs *ctx, u32 api, u64 size, u64 arg)
{
    if (!is_target())
        return 0;
    return enter_state(ctx, thread_state(BPF_LOCAL_STORAGE_GET_F_CREATE), api, size, arg, 0, entry_source(ctx));
}

static __always_inline int cu_enter(struct pt_regs *ctx, u32 api, u64 size, u64 arg, u64 arg2)
{
    if (!is_target())
        return 0;
    return enter_state(ctx, cu_state(BPF_LOCAL_STORAGE_GET_F_CREATE), api, size, arg, arg2, api_source(api));
}

/* The return matching the outermost open call of `cur`: 1 when this is it (the call state is
 * copied to `out` and closed), 0 for the return of a nested or tail-jumped call. */
static __always_inline int leave_state(struct pt_regs *ctx, struct as_inflight *cur, struct as_inflight *out)
{
    if (!cur || !cur->sp) {
        count(AS_LOST_UNMATCHED_RET, 1);
        return 0;
    }
    u64 sp = PT_REGS_SP(ctx);
    if (sp != cur->sp + 8) {
        if (sp < cur->sp + 8 && cur->nest > 0) {
            cur->nest--;
            return 0;
        }
        /* Returned above the entry: the entry's own return was lost. */
        count(AS_LOST_UNMATCHED_RET, 1);
        cur->sp = 0;
        return 0;
    }
    if (cur->tail > 0) {
        cur->tail--; /* the tail-jumped-to function returns first, same sp */
        return 0;
    }
    *out = *cur;
    cur->sp = 0;
    return 1;
}

static __always_inline void emit_trim(u32 tid, struct as_inflight *in, s64 ret, u64 now)
{
    struct as_event *e = events.ringbuf_reserve(sizeof(struct as_event));
    if (!e) {
        count(AS_LOST_RING_FULL, 1);
        return;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = AS_EV_TRIM;
    e->tid = tid;
    e->ts_ns = in->ts_ns;
    e->addr = in->arg;
    e->len2 = now - in->ts_ns;
    e->len = in->size;       /* anon RSS at entry */
    e->addr2 = rss_anon();   /* anon RSS at return */
    e->ret = ret;
    e->in_api = AS_API_MALLOC_TRIM;
    e->source = in->source;  /* whose purge call: malloc_trim, mallctl, MallocExtension_Release*, mi_collect */
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    events.ringbuf_submit(e, 0);
    count(AS_CNT_EVENTS, 1);
}

#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
/* Stack cache miss: alloc_return hands the allocation to alloc_unwind, which unwinds and hands
 * it to alloc_keep (tail calls, on the same CPU, state in `pending`): the verifier then sees the
 * cache check, the unwinder and the accounting as three programs, not their product. */
struct as_pending {
    u64 addr, size, ts, sid;
    u32 tid, api, src, pad;
};
BPF_PERCPU_ARRAY(pending, struct as_pending, 1);
BPF_PROG_ARRAY(tails, 2); /* 0: alloc_unwind, 1: alloc_keep (set by the tracer before attaching) */

static __always_inline void tail_failed(struct as_pending *p)
{
    count(AS_LOST_LIVE_FULL, 1); /* cannot happen once `tails` is filled; never silent */
    count(AS_LOST_LIVE_FULL_BYTES, p->size);
}

int alloc_unwind(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct as_pending *p = pending.lookup(&zero);
    if (!p)
        return 0;
    u64 ip = PT_REGS_IP(ctx), sp = PT_REGS_SP(ctx), bp = PT_REGS_FP(ctx);
    p->sid = unwind_store(ip, sp, bp, 0);
    tails.call(ctx, 1);
    tail_failed(p);
    return 0;
}

int alloc_keep(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct as_pending *p = pending.lookup(&zero);
    if (!p)
        return 0;
    scache_fill(PT_REGS_IP(ctx), PT_REGS_SP(ctx), PT_REGS_FP(ctx), p->sid);
    record_alloc(p->tid, p->addr, p->size, p->api, p->ts, p->sid, p->src);
    return 0;
}
#endif

/* The stack of an allocation seen in alloc_return, then keep it. */
static __always_inline void alloc_done(struct pt_regs *ctx, u32 tid, u64 addr, u64 size, u32 api,
                                       u64 ts, u32 src)
{
#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
    u64 sid = scache_lookup(PT_REGS_IP(ctx), PT_REGS_SP(ctx), PT_REGS_FP(ctx));
    if (!sid) {
        u32 zero = 0;
        struct as_pending *p = pending.lookup(&zero);
        if (p) {
            p->addr = addr;
            p->size = size;
            p->ts = ts;
            p->tid = tid;
            p->api = api;
            p->src = src;
            tails.call(ctx, 0);
            tail_failed(p);
        }
        return;
    }
    record_alloc(tid, addr, size, api, ts, sid, src);
#else
    record_alloc(tid, addr, size, api, ts, capture_stack(ctx, 0, 0), src);
#endif
}

/* The one return probe of every allocator function. */
int alloc_return(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    struct as_inflight in = {};
    if (!leave_state(ctx, thread_state(0), &in))
        return 0;

    u64 ret = PT_REGS_RC(ctx);
    u64 now = bpf_ktime_get_ns();
    u64 addr = ret;

    switch (in.api) {
    case AS_API_MALLOC_TRIM:
        emit_trim(tid, &in, (s64)(int)ret, now);
        return 0;
    case AS_API_POSIX_MEMALIGN:
        if ((int)ret != 0) {
            count(AS_CNT_FAILED, 1);
            return 0;
        }
        addr = 0;
        bpf_probe_read_user(&addr, sizeof(addr), (void *)in.arg);
        break;
    case AS_API_REALLOC:
    case AS_API_REALLOCARRAY:
        if (ret == 0) {
            /* glibc: realloc(p, 0) frees p and returns NULL; otherwise p stays. */
            if (in.size == 0 && in.arg != 0)
                free_addr(tid, in.arg, now);
            else
                count(AS_CNT_FAILED, 1);
            return 0;
        }
        if (in.arg != 0)
            free_addr(tid, in.arg, now);
        break;
    default:
        break;
    }
    if (addr == 0) {
        count(AS_CNT_FAILED, 1);
        return 0;
    }
#ifdef AS_SAMPLE_BYTES
    /* Byte-weighted sampling: a block is kept with probability min(1, size/N) and then stands
     * for max(size, N) bytes — an unbiased estimate of the bytes, decided here, so unsampled
     * blocks cost no stack walk and no map update (their free is one failed lookup). */
    u64 weight = in.size;
    if (in.size < AS_SAMPLE_BYTES) {
        if ((u64)bpf_get_prandom_u32() * AS_SAMPLE_BYTES >= (in.size << 32)) {
            count(AS_CNT_UNSAMPLED, 1);
            return 0;
        }
        weight = AS_SAMPLE_BYTES;
    }
    alloc_done(ctx, tid, addr, weight, in.api, now, in.source);
#else
    alloc_done(ctx, tid, addr, in.size, in.api, now, in.source);
#endif
    return 0;
}

/* --- entry probes (named after the symbol) ------------------------------- */

/* a * b, or 0 when it overflows (the call then fails). Written without a
 * division or 128-bit multiply, which BPF lacks. */
static __always_inline u64 mul_size(u64 a, u64 b)
{
    u64 ah = a >> 32, bh = b >> 32;
    if (ah == 0 && bh == 0)
        return a * b;
    if (ah != 0 && bh != 0)
        return 0;
    u64 hi = ah ? ah * b : bh * a;          /* the high half times the other */
    u64 lo = ah ? (a & 0xffffffffULL) * b : (b & 0xffffffffULL) * a;
    if (hi >> 32)
        return 0;
    u64 r = (hi << 32) + lo;
    return r < lo ? 0 : r;
}

int malloc_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_MALLOC, PT_REGS_PARM1(ctx), 0);
}

int calloc_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_CALLOC, mul_size(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)), 0);
}

int realloc_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_REALLOC, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx));
}

int reallocarray_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_REALLOCARRAY, mul_size(PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx)),
                 PT_REGS_PARM1(ctx));
}

int posix_memalign_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_POSIX_MEMALIGN, PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx));
}

int aligned_alloc_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_ALIGNED_ALLOC, PT_REGS_PARM2(ctx), 0);
}

int memalign_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_MEMALIGN, PT_REGS_PARM2(ctx), 0);
}

int valloc_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_VALLOC, PT_REGS_PARM1(ctx), 0);
}

int pvalloc_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_PVALLOC, PT_REGS_PARM1(ctx), 0);
}

int malloc_trim_enter(struct pt_regs *ctx)
{
    return enter(ctx, AS_API_MALLOC_TRIM, (u64)rss_anon(), PT_REGS_PARM1(ctx));
}

int free_enter(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u64 p = PT_REGS_PARM1(ctx);
    if (p == 0) {
        count(AS_CNT_FREE_NULL, 1);
        return 0;
    }
    free_addr(current_tid(), p, bpf_ktime_get_ns());
    return 0;
}

/* --- the CUDA driver API (libcuda.so.1) ---------------------------------------------------
 * Out-pointer calls: the address or handle is read from *dptr when the call returns
 * CUDA_SUCCESS (0); a failed call allocates nothing. The mappings the driver makes inside a
 * call (pinned host memory is a shared mapping of /dev/nvidiactl) belong to the call: the call
 * state makes them "inside an API call", as malloc's own mmaps are. GPU memory is its own total
 * (totals[5]) and never host memory. */
int cu_return(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    struct as_inflight in = {};
    if (!leave_state(ctx, cu_state(0), &in))
        return 0;
    u64 now = bpf_ktime_get_ns();
    if ((int)PT_REGS_RC(ctx) != 0) {
        count(AS_CNT_FAILED, 1);
        return 0;
    }
    u64 addr = 0, size = in.size;
    switch (in.api) {
    case AS_API_CU_FREE:
        if (!dev_free(tid, in.arg, AS_API_CU_ALLOC, now))
            free_addr(tid, in.arg, now); /* managed memory: a host block */
        return 0;
    case AS_API_CU_RELEASE:
        if (!dev_free(tid, in.arg, AS_API_CU_CREATE, now))
            count(AS_CNT_FREE_UNKNOWN, 1);
        return 0;
    case AS_API_CU_FREE_HOST:
        free_addr(tid, in.arg, now);
        return 0;
    case AS_API_CU_UNREGISTER:
        if (!dev_free(tid, in.arg, AS_API_CU_HOST_REGISTER, now))
            count(AS_CNT_FREE_UNKNOWN, 1);
        return 0;
    case AS_API_CU_HOST_REGISTER:
        addr = in.arg;
        break;
    case AS_API_CU_ALLOC_PITCH: {
        u64 pitch = 0;
        bpf_probe_read_user(&pitch, sizeof(pitch), (void *)in.arg2);
        size = mul_size(pitch, in.size);
        bpf_probe_read_user(&addr, sizeof(addr), (void *)in.arg);
        break;
    }
    default: /* the address or handle was stored at the out pointer */
        bpf_probe_read_user(&addr, sizeof(addr), (void *)in.arg);
        break;
    }
    if (addr == 0 || size == 0) {
        count(AS_CNT_FAILED, 1);
        return 0;
    }
    alloc_done(ctx, tid, addr, size, in.api, now, in.source);
    return 0;
}

int cu_alloc_enter(struct pt_regs *ctx) /* (CUdeviceptr *dptr, size_t bytesize, ...) */
{
    return cu_enter(ctx, AS_API_CU_ALLOC, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_pitch_enter(struct pt_regs *ctx) /* (dptr, size_t *pPitch, WidthInBytes, Height, ...) */
{
    return cu_enter(ctx, AS_API_CU_ALLOC_PITCH, PT_REGS_PARM4(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx));
}

int cu_create_enter(struct pt_regs *ctx) /* (CUmemGenericAllocationHandle *handle, size_t size, ...) */
{
    return cu_enter(ctx, AS_API_CU_CREATE, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_host_alloc_enter(struct pt_regs *ctx) /* (void **pp, size_t bytesize, ...) */
{
    return cu_enter(ctx, AS_API_CU_HOST_ALLOC, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_register_enter(struct pt_regs *ctx) /* (void *p, size_t bytesize, unsigned int Flags) */
{
    return cu_enter(ctx, AS_API_CU_HOST_REGISTER, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_managed_enter(struct pt_regs *ctx) /* (CUdeviceptr *dptr, size_t bytesize, unsigned int flags) */
{
    return cu_enter(ctx, AS_API_CU_MANAGED, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_free_enter(struct pt_regs *ctx) /* (CUdeviceptr dptr, ...) */
{
    return cu_enter(ctx, AS_API_CU_FREE, 0, PT_REGS_PARM1(ctx), 0);
}

int cu_release_enter(struct pt_regs *ctx) /* (CUmemGenericAllocationHandle handle) */
{
    return cu_enter(ctx, AS_API_CU_RELEASE, 0, PT_REGS_PARM1(ctx), 0);
}

int cu_free_host_enter(struct pt_regs *ctx) /* (void *p) */
{
    return cu_enter(ctx, AS_API_CU_FREE_HOST, 0, PT_REGS_PARM1(ctx), 0);
}

int cu_unregister_enter(struct pt_regs *ctx) /* (void *p) */
{
    return cu_enter(ctx, AS_API_CU_UNREGISTER, 0, PT_REGS_PARM1(ctx), 0);
}

/* --- the users' own allocation functions (--alloc-fn, --free-fn) -----------------------------
 * For pools and slab caches the tool cannot know. Each probed function's spec (which argument is
 * the size, the count, the out pointer, the freed pointer) is in `custom_fns`, keyed by the
 * probed address. Their blocks live in dev_live under one key kind (AS_CUSTOM_KIND): a pool's
 * first object can sit at the very address of the slab malloc gave it. They have their own call
 * state, so the mallocs a pool makes inside its calls (its slabs) still count, as heap. */
BPF_HASH(custom_fns, u64, struct as_custom, 256);
BPF_TASK_STORAGE(custom_inflight, struct as_inflight);

/* Argument n (0-based) of the probed call. Every register is read straight from the context
 * first: the verifier refuses a context pointer the compiler has offset by n. */
static __always_inline u64 arg_n(struct pt_regs *ctx, u32 n)
{
    u64 a[8] = {PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0, 0};
    return a[n & 7];
}

static __always_inline struct as_inflight *custom_state(u64 flags)
{
    return custom_inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, flags);
}

int custom_enter(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u64 ip = PT_REGS_IP(ctx);
    struct as_custom *c = custom_fns.lookup(&ip);
    if (!c)
        return 0;
    u64 size = c->size_arg != AS_ARG_NONE ? arg_n(ctx, c->size_arg) : 0;
    if (c->count_arg != AS_ARG_NONE)
        size = mul_size(arg_n(ctx, c->count_arg), size);
    u64 out = c->out_arg != AS_ARG_NONE ? arg_n(ctx, c->out_arg) : 0;
    /* arg: the out pointer; arg2: 1 when the function returns a status and stores the pointer */
    return enter_state(ctx, custom_state(BPF_LOCAL_STORAGE_GET_F_CREATE), AS_API_CUSTOM, size, out,
                       c->out_arg != AS_ARG_NONE, c->source);
}

int custom_return(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    struct as_inflight in = {};
    if (!leave_state(ctx, custom_state(0), &in))
        return 0;
    u64 ret = PT_REGS_RC(ctx), addr = ret;
    if (in.arg2) { /* a status: 0 is success, then the pointer is at *out */
        if ((int)ret != 0) {
            count(AS_CNT_FAILED, 1);
            return 0;
        }
        addr = 0;
        bpf_probe_read_user(&addr, sizeof(addr), (void *)in.arg);
    }
    if (addr == 0) {
        count(AS_CNT_FAILED, 1);
        return 0;
    }
    alloc_done(ctx, tid, addr, in.size, AS_API_CUSTOM, bpf_ktime_get_ns(), in.source);
    return 0;
}

int custom_free_enter(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u64 ip = PT_REGS_IP(ctx);
    struct as_custom *c = custom_fns.lookup(&ip);
    if (!c)
        return 0;
    u64 p = arg_n(ctx, c->ptr_arg);
    if (p == 0) {
        count(AS_CNT_FREE_NULL, 1);
        return 0;
    }
    if (!dev_free(current_tid(), p, AS_CUSTOM_KIND, bpf_ktime_get_ns()))
        count(AS_CNT_FREE_UNKNOWN, 1);
    return 0;
}

/* --- memory from the kernel: syscall tracepoints ------------------------ */
/* Memory the target maps outside any allocator call (and the break it moves up) is accounted
 * here, page by page, with no event: `regions` holds one entry per allocation, keyed by its
 * start, and the common shapes — a region mapped, unmapped whole or from its start, moved or
 * resized by mremap, the break moved up — update the per-(stack, thread, source) sites, the
 * flows and the totals in place. The rare shapes (a munmap that does not start at a region, a
 * MAP_FIXED mapping, an mremap to a fixed address, the break shrinking over tracked pages, a
 * full map) go to the tracer as events (counted: n_slow); it takes the regions they touch out
 * of the map and replays them page-exact (tracer/regions.py). Syscalls made inside allocator
 * calls (glibc's mmapped chunks, heap trimming) belong to that call and are never regions.
 * Every release (munmap, madvise, brk down) is measured by the anonymous RSS it gave back and
 * summed per (thread, kind, allocator call) in `releases`. */
#ifndef AS_MAX_REGIONS
#error "AS_MAX_REGIONS: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
#define AS_UNMAP_STEPS 8   /* regions one munmap may free here, back to back */
#define AS_MAP_FIXED 0x10
#define AS_MAP_ANONYMOUS 0x20
#ifndef AS_UVM_MAJOR
#define AS_UVM_MAJOR 0
#endif
#define AS_PROT_EXEC 4
#define AS_MREMAP_FIXED 2
#define AS_MREMAP_DONTUNMAP 4

BPF_F_TABLE("hash", u64, struct as_region, regions, AS_MAX_REGIONS, BPF_F_NO_PREALLOC);
/* Mappings seen made and not tracked (file mappings, PROT_NONE reservations, an allocator's own
 * chunks): start -> end. A munmap from the start of one is known to touch no tracked page and
 * needs no event (glibc's free() unmapping a chunk its malloc mapped: free has no call state).
 * Least recently used ones are dropped: their munmap then goes to the tracer, which finds
 * nothing tracked — slower, never wrong. The tracer deletes those a rare shape touches. */
BPF_TABLE("lru_hash", u64, u64, untracked, 4096);
/* Per region site: bytes the tracer freed in regions it took over (written by the tracer only),
 * so that a site's peak here is alloc - free - these. */
BPF_F_TABLE("hash", struct as_site_key, u64, site_ext, AS_MAX_REGIONS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct as_release_key, struct as_release, releases, 16384, BPF_F_NO_PREALLOC);
/* 0: the break (0: not known yet; the tracer seeds it from /proc), 1: != 0 once the break was a
 * region here (a shrink then goes to the tracer) */
BPF_ARRAY(brk_state, u64, 2);

static __always_inline u64 page_up(u64 n)
{
    return (n + AS_PAGE_SIZE - 1) & ~(u64)(AS_PAGE_SIZE - 1);
}

static __always_inline void save_sysargs(u32 nr, u64 a0, u64 a1, u64 a2, u64 a3, u64 a4, s64 rss)
{
    u32 tid = current_tid();
    struct as_sysargs a = {.a0 = a0, .a1 = a1, .a2 = a2, .a3 = a3, .a4 = a4,
                           .ts_ns = bpf_ktime_get_ns(), .rss = rss, .nr = nr};
    sysargs.update(&tid, &a);
}

static __always_inline struct as_event *new_event(u32 type, u32 tid)
{
    struct as_event *e = events.ringbuf_reserve(sizeof(struct as_event));
    if (!e) {
        count(AS_LOST_RING_FULL, 1);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = type;
    e->tid = tid;
    e->ts_ns = bpf_ktime_get_ns();
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    return e;
}

static __always_inline void submit(struct as_event *e)
{
    events.ringbuf_submit(e, 0);
    count(AS_CNT_EVENTS, 1);
}

/* The allocator or CUDA call the current thread is inside, AS_API_NONE outside any. */
static __always_inline u32 current_api(void)
{
    struct as_inflight *in = thread_state(0);
    if (in && in->sp)
        return in->api;
    struct as_inflight *cu = cu_state(0);
    return cu && cu->sp ? cu->api : AS_API_NONE; /* a user's pool function is a layer above: its
                                                    own mmaps stay the kernel layer's */
}

/* Pops the saved syscall arguments; 0 when the entry was not seen. */
static __always_inline int pop_sysargs(u32 nr, struct as_sysargs *out)
{
    u32 tid = current_tid();
    struct as_sysargs *a = sysargs.lookup(&tid);
    if (!a)
        return 0;
    if (a->nr != nr) {
        sysargs.delete(&tid);
        return 0;
    }
    *out = *a;
    sysargs.delete(&tid);
    return 1;
}

static __always_inline void region_totals(s64 bytes, s64 n)
{
    u32 k2 = 2, k3 = 3;
    s64 *b = totals.lookup(&k2);
    s64 *c = totals.lookup(&k3);
    if (b)
        __sync_fetch_and_add(b, bytes);
    if (c && n)
        __sync_fetch_and_add(c, n);
}

/* Bytes newly held by a region site: alloc counters and its peak. */
static __always_inline void region_grew(u64 sid, u32 tid, u32 source, u64 bytes, u64 allocs)
{
    struct as_site *s = site_of(sid, tid, source);
    if (!s)
        return;
    u64 ab = __sync_fetch_and_add(&s->alloc_bytes, bytes) + bytes;
    if (allocs)
        __sync_fetch_and_add(&s->alloc_count, allocs);
    struct as_site_key sk = {.stack_id = sid, .tid = tid, .source = source};
    u64 fb = s->free_bytes;
    u64 *ext = site_ext.lookup(&sk);
    if (ext)
        fb += *ext;
    if (ab > fb && ab - fb > s->peak_live_bytes)
        s->peak_live_bytes = ab - fb;
}

/* `bytes` of region `c` given back by thread `tid`; `last`: the region is gone. */
static __always_inline void region_freed(struct as_region *c, u64 bytes, u32 last, u32 tid, u64 now)
{
    region_totals(-(s64)bytes, last ? -1 : 0);
    struct as_site_key sk = {.stack_id = c->stack_id, .tid = c->tid, .source = c->source};
    struct as_site *s = sites.lookup(&sk);
    if (s) {
        __sync_fetch_and_add(&s->free_bytes, bytes);
        if (last)
            __sync_fetch_and_add(&s->free_count, 1);
    }
    flow_add(c->tid, tid, bytes, last, c->ts_ns, now);
}

/* A new region [lo, hi); -1 when it cannot be kept here (its start is still a region: the
 * tracer has not replayed the unmap of the old one yet; or the map is full). */
static __always_inline int region_new(u64 lo, u64 hi, u64 sid, u32 tid, u64 now, u32 source)
{
    struct as_region r = {.end = hi, .stack_id = sid, .ts_ns = now, .tid = tid, .source = source};
    if (regions.insert(&lo, &r) != 0)
        return -1;
    region_totals((s64)(hi - lo), 1);
    region_grew(sid, tid, source, hi - lo, 1);
    return 0;
}

/* munmap [lo, hi): frees the regions that start at lo and, back to back, at each freed one's
 * end; the last one may lose only its head. Returns where it stopped: hi when [lo, hi) was
 * accounted here, less when the rest is for the tracer. */
static __always_inline u64 unmap_regions(u64 lo, u64 hi, u32 tid, u64 now)
{
    u64 cur = lo;
#pragma clang loop unroll(disable)
    for (int i = 0; i < AS_UNMAP_STEPS; i++) {
        if (cur >= hi)
            break;
        struct as_region *r = regions.lookup(&cur);
        if (!r) {
            u64 *u = untracked.lookup(&cur);
            if (!u)
                break;
            u64 end = *u;
            if (end > hi) { /* its head: the rest stays untracked */
                u64 key = hi;
                untracked.update(&key, &end);
                untracked.delete(&cur);
                cur = hi;
                break;
            }
            untracked.delete(&cur);
            cur = end > cur ? end : hi;
            continue;
        }
        struct as_region c = *r;
        if (c.end > hi) { /* its head: the rest stays, keyed by its new start */
            u64 key = hi;
            if (regions.insert(&key, &c) != 0)
                break;
            if (regions.delete(&cur) != 0) {
                regions.delete(&key);
                break;
            }
            region_freed(&c, hi - cur, 0, tid, now);
            cur = hi;
            break;
        }
        if (regions.delete(&cur) != 0)
            break;
        region_freed(&c, c.end - cur, 1, tid, now);
        cur = c.end;
    }
    return cur;
}

/* mremap of a whole region to a place the kernel chose (or in place): 0 when done here. */
static __always_inline int remap_region(struct as_sysargs *a, u64 nlo, u32 tid, u64 now)
{
    u64 olo = a->a0, ohi = page_up(a->a0 + a->a1), nhi = page_up(nlo + a->a2);
    if (a->a3 & (AS_MREMAP_FIXED | AS_MREMAP_DONTUNMAP))
        return -1;
    struct as_region *r = regions.lookup(&olo);
    if (!r || r->end != ohi)
        return -1;
    struct as_region c = *r;
    c.end = nhi;
    if (nlo != olo) {
        if (regions.insert(&nlo, &c) != 0)
            return -1;
        if (regions.delete(&olo) != 0) {
            regions.delete(&nlo);
            return -1;
        }
    } else {
        r->end = nhi;
    }
    u64 olen = ohi - olo, nlen = nhi - nlo;
    if (nlen > olen) { /* the new pages belong to the region that grew */
        region_totals((s64)(nlen - olen), 0);
        region_grew(c.stack_id, c.tid, c.source, nlen - olen, 0);
    } else if (nlen < olen) {
        region_freed(&c, olen - nlen, 0, tid, now);
    }
    return 0;
}

static __always_inline void count_release(u32 tid, u32 kind, u32 api, u64 len, s64 before)
{
    struct as_release_key k = {.tid = tid, .kind = (u16)kind, .api = (u16)api};
    struct as_release *r = releases.lookup(&k);
    if (!r) {
        struct as_release zero = {};
        releases.insert(&k, &zero);
        r = releases.lookup(&k);
        if (!r)
            return;
    }
    __sync_fetch_and_add(&r->calls, 1);
    __sync_fetch_and_add(&r->requested_bytes, len);
    __sync_fetch_and_add(&r->released_bytes, before - rss_anon());
}

/* A rare shape for the tracer: the event, timed at the syscall's entry (regions it takes over
 * must be older). */
static __always_inline struct as_event *slow_event(u32 type, u32 tid, struct as_sysargs *a, u32 api)
{
    struct as_event *e = new_event(type, tid);
    if (!e)
        return 0;
    count(AS_CNT_SLOW, 1);
    e->ts_ns = a->ts_ns;
    e->in_api = api;
    return e;
}

#define AS_MAP_TYPE 0x0f /* MAP_SHARED 1, MAP_PRIVATE 2, MAP_SHARED_VALIDATE 3 */
#define AS_MAP_PRIVATE 2

#ifdef AS_OFF_TASK_FILES
/* What the file behind `fd` is, for a mapping of it: shared memory (tmpfs: memfd, /dev/shm;
 * hugetlbfs), a device (/dev/nvidiactl: major 195 minor 255, nvidia-uvm's dynamic major
 * AS_UVM_MAJOR, /dev/zero and the other mem devices 1), or 0: a regular file, not
 * tracked. /dev/nvidia0.. (major 195, minor < 255: doorbells, register windows) are `device`.
 * Read through the fd table at offsets from the kernel's BTF (tracer/kernel.py). */
static __always_inline u32 fd_source(s32 fd, u32 flags)
{
    u64 task = bpf_get_current_task(), files = 0, fdt = 0, fds = 0, file = 0, inode = 0, sb = 0;
    u64 magic = 0;
    u32 max_fds = 0, rdev = 0;
    u16 mode = 0;
    if (fd < 0)
        return 0;
    bpf_probe_read_kernel(&files, sizeof(files), (void *)(task + AS_OFF_TASK_FILES));
    if (!files)
        return 0;
    bpf_probe_read_kernel(&fdt, sizeof(fdt), (void *)(files + AS_OFF_FILES_FDT));
    if (!fdt)
        return 0;
    bpf_probe_read_kernel(&max_fds, sizeof(max_fds), (void *)(fdt + AS_OFF_FDT_MAX_FDS));
    if ((u32)fd >= max_fds)
        return 0;
    bpf_probe_read_kernel(&fds, sizeof(fds), (void *)(fdt + AS_OFF_FDT_FD));
    bpf_probe_read_kernel(&file, sizeof(file), (void *)(fds + 8 * (u64)fd));
    if (!file)
        return 0;
    bpf_probe_read_kernel(&inode, sizeof(inode), (void *)(file + AS_OFF_FILE_INODE));
    if (!inode)
        return 0;
    bpf_probe_read_kernel(&mode, sizeof(mode), (void *)(inode + AS_OFF_INODE_MODE));
    if ((mode & 0170000) == 0020000) { /* S_ISCHR */
        bpf_probe_read_kernel(&rdev, sizeof(rdev), (void *)(inode + AS_OFF_INODE_RDEV));
        u32 major = rdev >> 20, minor = rdev & 0xfffff;
        if (major == 1) /* /dev/zero and friends: anonymous memory by another name (the 580
                         * driver's pinned memory is a rw-s map of /dev/zero) */
            return (flags & AS_MAP_TYPE) == AS_MAP_PRIVATE ? AS_SRC_MMAP : AS_SRC_SHMEM;
        if (major == 195 && minor == 255) /* /dev/nvidiactl */
            return AS_SRC_CUDA_PINNED;
        if (AS_UVM_MAJOR && major == AS_UVM_MAJOR)
            return AS_SRC_CUDA_MANAGED;
        return AS_SRC_DEVICE;
    }
    bpf_probe_read_kernel(&sb, sizeof(sb), (void *)(inode + AS_OFF_INODE_SB));
    if (!sb)
        return 0;
    bpf_probe_read_kernel(&magic, sizeof(magic), (void *)(sb + AS_OFF_SB_MAGIC));
    if ((u32)magic == 0x01021994 /* TMPFS_MAGIC */ || (u32)magic == 0x958458f6 /* HUGETLBFS_MAGIC */)
        return AS_SRC_SHMEM;
    return 0;
}
#else
static __always_inline u32 fd_source(s32 fd, u32 flags)
{
    return 0; /* this kernel's BTF does not describe the fd table: file mappings untracked */
}
#endif

/* What an mmap with these arguments is tracked as (enum as_source), 0: not tracked. Mappings
 * made inside an allocator or CUDA call belong to that call. */
static __always_inline u32 mmap_source(struct as_sysargs *a, u32 api)
{
    if (api != AS_API_NONE || a->a2 == 0 /* PROT_NONE: address space reserved, not memory */)
        return 0;
    u32 flags = (u32)a->a3;
    if (flags & AS_MAP_ANONYMOUS)
        return (flags & AS_MAP_TYPE) == AS_MAP_PRIVATE ? AS_SRC_MMAP : AS_SRC_SHMEM;
    if (a->a2 & AS_PROT_EXEC)
        return 0; /* code */
    return fd_source((s32)a->a4, flags);
}

static __always_inline void mmap_exit(void *ctx, struct as_sysargs *a, u64 lo, u32 tid, u32 api, u64 now)
{
    u64 hi = page_up(lo + a->a1);
    u32 prot = (u32)a->a2, flags = (u32)a->a3;
    s32 fd = (s32)a->a4;
    u32 src = mmap_source(a, api);
    int code = (prot & AS_PROT_EXEC) && !(flags & AS_MAP_ANONYMOUS);
    int slow = (flags & AS_MAP_FIXED) && api == AS_API_NONE;
    u64 sid = 0;
    if (src) {
        sid = capture_syscall_stack(ctx);
        if (!slow && region_new(lo, hi, sid, tid, now, src) == 0) {
            untracked.delete(&lo);
            count(AS_CNT_REGION_OPS, 1);
            return;
        }
        slow = 1; /* MAP_FIXED, or its start is still a region: the tracer replays it */
    } else if (!(flags & AS_MAP_FIXED)) {
        untracked.update(&lo, &hi);
    }
    if (!slow && !code)
        return;
    struct as_event *e = slow ? slow_event(AS_EV_MMAP, tid, a, api) : new_event(AS_EV_CODE, tid);
    if (!e)
        return;
    e->addr = lo;
    e->len = a->a1;
    e->prot = prot;
    e->flags = flags;
    e->fd = fd;
    e->source = src;
    e->stack_id = sid;
    e->in_api = api;
    e->ret = (s64)lo;
    submit(e);
#if defined(AS_UNWIND_DWARF) && defined(AS_WAIT_EXEC)
    /* Launch mode: hold the main thread at each file mapped executable (the loader mapping a
     * library) until the tracer has mapped its unwind rows: the tracer is its ptrace parent, sees
     * the stop, loads, and resumes it with the signal suppressed (tracer/unwind.py). */
    if (code && fd >= 0 && tid == AS_TGID)
        bpf_send_signal_thread(19 /* SIGSTOP */);
#endif
}

static __always_inline void munmap_exit(struct as_sysargs *a, u32 tid, u32 api, u64 now)
{
    u64 lo = a->a0 & ~(u64)(AS_PAGE_SIZE - 1), hi = page_up(a->a0 + a->a1);
    count_release(tid, AS_EV_MUNMAP, api, a->a1, a->rss);
    if (api != AS_API_NONE || hi <= lo) {
        untracked.delete(&lo);
        return; /* an allocator unmapping its own memory */
    }
    u64 cur = unmap_regions(lo, hi, tid, now);
    if (cur >= hi) {
        count(AS_CNT_REGION_OPS, 1);
        return;
    }
    struct as_event *e = slow_event(AS_EV_MUNMAP, tid, a, api);
    if (!e)
        return;
    e->addr = cur;
    e->len = hi - cur;
    submit(e);
}

static __always_inline void mremap_exit(struct as_sysargs *a, u64 nlo, u32 tid, u32 api, u64 now)
{
    if (api != AS_API_NONE)
        return; /* glibc's realloc moving its own mmapped chunk */
    if (remap_region(a, nlo, tid, now) == 0) {
        count(AS_CNT_REGION_OPS, 1);
        return;
    }
    struct as_event *e = slow_event(AS_EV_MREMAP, tid, a, api);
    if (!e)
        return;
    e->addr = a->a0;
    e->len = a->a1;
    e->addr2 = nlo;
    e->len2 = a->a2;
    e->flags = (u32)a->a3;
    submit(e);
}

static __always_inline void brk_exit(void *ctx, struct as_sysargs *a, u64 nb, u32 tid, u32 api, u64 now)
{
    u32 k0 = 0, k1 = 1;
    u64 *cur = brk_state.lookup(&k0);
    u64 *tracked = brk_state.lookup(&k1);
    if (!cur || !tracked)
        return;
    u64 old = *cur;
    *cur = nb;
    if (old == 0 || nb == old)
        return; /* not known before, or a query (brk(0)) */
    u64 sid = 0;
    if (nb > old) {
        u64 lo = page_up(old), hi = page_up(nb);
        if (api != AS_API_NONE || hi <= lo)
            return; /* malloc growing its heap */
        sid = capture_syscall_stack(ctx);
        *tracked = 1;
        if (region_new(lo, hi, sid, tid, now, AS_SRC_BRK) == 0) {
            count(AS_CNT_REGION_OPS, 1);
            return;
        }
    } else {
        count_release(tid, AS_EV_BRK, api, 0, a->rss);
        if (!*tracked)
            return; /* no page of the break was ever a region */
    }
    struct as_event *e = slow_event(AS_EV_BRK, tid, a, api);
    if (!e)
        return;
    e->addr = nb;
    e->len = old;
    e->stack_id = sid;
    submit(e);
}

static __always_inline void syscall_exit(void *ctx, u32 nr, s64 ret)
{
    struct as_sysargs a = {};
    if (!pop_sysargs(nr, &a))
        return;
    if (ret < 0 && ret > -4096)
        return; /* failed: nothing changed */
    u32 tid = current_tid();
    u32 api = current_api();
    u64 now = bpf_ktime_get_ns();
    switch (nr) {
    case 9: /* mmap(addr, len, prot, flags, fd) -> addr */
        mmap_exit(ctx, &a, (u64)ret, tid, api, now);
        break;
    case 11: /* munmap(addr, len) */
        munmap_exit(&a, tid, api, now);
        break;
    case 25: /* mremap(old, old_len, new_len, flags, new_addr) -> new */
        mremap_exit(&a, (u64)ret, tid, api, now);
        break;
    case 12: /* brk(requested) -> new break */
        brk_exit(ctx, &a, (u64)ret, tid, api, now);
        break;
    case 28: /* madvise(start, len, advice) */
        count_release(tid, AS_EV_MADVISE, api, a.a1, a.rss);
        break;
    default:
        break;
    }
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    if (!is_target())
        return 0;
    save_sysargs(9, args->addr, args->len, args->prot, args->flags, args->fd, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 9, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
    if (!is_target())
        return 0;
    save_sysargs(11, args->addr, args->len, 0, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_munmap)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 11, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mremap)
{
    if (!is_target())
        return 0;
    save_sysargs(25, args->addr, args->old_len, args->new_len, args->flags, args->new_addr, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mremap)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 25, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_brk)
{
    if (!is_target())
        return 0;
    save_sysargs(12, args->brk, 0, 0, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_brk)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 12, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_madvise)
{
    if (!is_target())
        return 0;
    int advice = args->behavior;
    /* Only advice that can release memory: DONTNEED, FREE, REMOVE, PAGEOUT,
     * DONTNEED_LOCKED. */
    if (advice != 4 && advice != 8 && advice != 9 && advice != 21 && advice != 24)
        return 0;
    save_sysargs(28, args->start, args->len_in, advice, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_madvise)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 28, args->ret);
    return 0;
}

/* --- threads and process lifetime ----------------------------------------- */

TRACEPOINT_PROBE(task, task_rename)
{
    if (!is_target())
        return 0;
    struct as_event *e = new_event(AS_EV_THREAD_NAME, (u32)args->pid);
    if (!e)
        return 0;
    bpf_probe_read_kernel(&e->comm, sizeof(e->comm), args->newcomm);
    submit(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    sysargs.delete(&tid); /* `inflight` is task storage: the kernel frees it with the thread */
    if (args->group_dead) {
        u32 zero = 0, one = 1;
        gone.update(&zero, &one); /* the pid may be reused from now on */
    }
    struct as_event *e = new_event(AS_EV_THREAD_EXIT, tid);
    if (!e)
        return 0;
    e->ret = args->group_dead;
    submit(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    if ((bpf_get_current_pid_tgid() >> 32) != AS_TGID)
        return 0;
#ifdef AS_WAIT_EXEC
    u32 zero = 0, one = 1;
    u32 *a = armed.lookup(&zero);
    if (a && *a == 0) {
        armed.update(&zero, &one); /* the launched command starts: trace from here */
        return 0;
    }
#endif
    if (target_gone())
        return 0; /* a reused pid exec'ing: not ours */
    u32 zero_g = 0, one_g = 1;
    gone.update(&zero_g, &one_g); /* the new program is not traced */
    struct as_event *e = new_event(AS_EV_EXEC, current_tid());
    if (!e)
        return 0;
    submit(e);
    return 0;
}

/* --- residency mode: sampled first touches ---------------------------------------------------
 * With AS_FAULTS (allocscope record --mode residency) no allocator probe is attached: memory is
 * seen where the kernel hands it out — the mmap family above, and user page faults here. The
 * tracer opens a software perf event (page faults) on every thread of the target with a sample
 * period of AS_FAULT_SAMPLE, inherited by threads created later: the kernel only counts faults,
 * and this program runs on one in AS_FAULT_SAMPLE, which stands for AS_FAULT_SAMPLE pages charged
 * to the faulting stack and thread in `fault_sites` (alloc_bytes / alloc_count; nothing is ever
 * freed here). Stacks go through the per-thread stack cache: a loop touching the pages of a
 * buffer faults at the same few (ip, sp) and is unwound once. */
#ifdef AS_FAULTS
#include <uapi/linux/bpf_perf_event.h>
#ifndef AS_FAULT_SAMPLE
#error "AS_FAULT_SAMPLE: set by the tracer (tracer/probe.py, probe_cflags)"
#endif
BPF_F_TABLE("hash", struct as_site_key, struct as_site, fault_sites, AS_MAX_SITES, BPF_F_NO_PREALLOC);

static __always_inline void fault_charge(u64 sid)
{
    struct as_site_key k = {.stack_id = sid, .tid = current_tid(), .source = AS_SRC_FAULT};
    struct as_site *s = fault_sites.lookup(&k);
    if (!s) {
        struct as_site z = {};
        fault_sites.insert(&k, &z);
        s = fault_sites.lookup(&k);
        if (!s) {
            count(AS_LOST_SITE_FULL, 1);
            return;
        }
    }
    __sync_fetch_and_add(&s->alloc_bytes, AS_FAULT_SAMPLE * AS_PAGE_SIZE);
    __sync_fetch_and_add(&s->alloc_count, AS_FAULT_SAMPLE);
    s->peak_live_bytes = s->alloc_bytes;
}

/* The user registers of the faulting thread: those of the fault itself, or of the syscall
 * whose kernel code touched user memory. */
static __always_inline void fault_regs(u64 *ip, u64 *sp, u64 *bp)
{
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    bpf_probe_read_kernel(ip, sizeof(*ip), &regs->ip);
    bpf_probe_read_kernel(sp, sizeof(*sp), &regs->sp);
    bpf_probe_read_kernel(bp, sizeof(*bp), &regs->bp);
}

#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
BPF_PROG_ARRAY(ftails, 2); /* 0: fault_unwind, 1: fault_keep (perf-event programs) */

int fault_sample(struct bpf_perf_event_data *ctx)
{
    if (!is_target())
        return 0;
    count(AS_CNT_FAULT_SAMPLES, 1);
    u64 ip = 0, sp = 0, bp = 0;
    fault_regs(&ip, &sp, &bp);
    u64 sid = scache_lookup(ip, sp, bp);
    if (sid) {
        fault_charge(sid);
        return 0;
    }
    ftails.call(ctx, 0);
    fault_charge(0); /* cannot happen once `ftails` is filled: counted as a lost stack */
    count(AS_LOST_STACK_ERR, 1);
    return 0;
}

int fault_unwind(struct bpf_perf_event_data *ctx)
{
    u32 zero = 0;
    struct as_pending *p = pending.lookup(&zero);
    if (!p)
        return 0;
    u64 ip = 0, sp = 0, bp = 0;
    fault_regs(&ip, &sp, &bp);
    p->sid = unwind_store(ip, sp, bp, 1);
    ftails.call(ctx, 1);
    fault_charge(p->sid);
    return 0;
}

int fault_keep(struct bpf_perf_event_data *ctx)
{
    u32 zero = 0;
    struct as_pending *p = pending.lookup(&zero);
    if (!p)
        return 0;
    u64 ip = 0, sp = 0, bp = 0;
    fault_regs(&ip, &sp, &bp);
    scache_fill(ip, sp, bp, p->sid);
    fault_charge(p->sid);
    return 0;
}
#else
int fault_sample(struct bpf_perf_event_data *ctx)
{
    if (!is_target())
        return 0;
    count(AS_CNT_FAULT_SAMPLES, 1);
    fault_charge(capture_syscall_stack(ctx));
    return 0;
}
#endif
#endif
