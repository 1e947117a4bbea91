/* allocscope BPF, heap.h: the heap API: entry/return pairing (per-thread call state), what an
 * allocation's return records.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_HEAP_H
#define AS_HEAP_H
#include "common.h"
#include "stacks.h"
#include "python.h"
#include "rss.h"
#include "accounting.h"

/* --- entry/return pairing -------------------------------------------------
 * One entry state per thread. An allocator entry deeper on the same stack
 * (sp lower) is a nested call; one at the same sp is a tail jump (glibc's
 * realloc(NULL, n) jumps to malloc, reallocarray to realloc); both are
 * counted once, by the outermost call. A return must come back at entry
 * sp + 8; anything else is reported as unmatched, never guessed. */

/* The probed address of an entry probe -> the source of the allocator it belongs to (the heap of
 * a further allocator, heap:KIND[:PREFIX]); filled by the tracer as modules are mapped. An entry
 * it does not know (yet) is the main heap's. Looked up only once the tracer has set src_cfg[0]
 * (several allocators): one compiled program serves both cases, and the programs can be built
 * before the allocators are known. (Uprobe sessions carry the source in the cookie instead.) */
BPF_HASH(probe_src, u64, u32, 4096);
BPF_ARRAY(src_cfg, u32, 1);

static __always_inline u32 entry_source(struct pt_regs *ctx)
{
    u32 zero = 0;
    u32 *multi = src_cfg.lookup(&zero);
    if (!multi || !*multi)
        return AS_SRC_HEAP;
    u64 ip = PT_REGS_IP(ctx); /* the probed instruction, set back by the kernel for handlers */
    u32 *s = probe_src.lookup(&ip);
    return s ? *s : AS_SRC_HEAP;
}

/* The thread's call state for the outermost call now entered (`unsampled`: as_inflight's). */
static __always_inline void open_state(struct as_inflight *cur, u64 sp, u32 api, u64 size, u64 arg, u64 arg2, u32 src,
                                       u32 unsampled)
{
    cur->sp = sp;
    cur->size = size;
    cur->arg = arg;
    cur->arg2 = arg2;
    cur->ts_ns = api == AS_API_MALLOC_TRIM ? bpf_ktime_get_ns() : 0; /* allocations: return time */
    cur->api = api;
    cur->nest = 0;
    cur->tail = 0;
    cur->source = src;
    cur->unsampled = unsampled;
}

static __always_inline int enter_state(struct pt_regs *ctx, struct as_inflight *cur, u32 api, u64 size, u64 arg,
                                       u64 arg2, u32 src)
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
    open_state(cur, sp, api, size, arg, arg2, src, 0);
    return 0;
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
    e->len = in->size;     /* anon RSS at entry */
    e->addr2 = rss_anon(); /* anon RSS at return */
    e->ret = ret;
    e->in_api = AS_API_MALLOC_TRIM;
    e->source = in->source; /* whose purge call: malloc_trim, mallctl, MallocExtension_Release*, mi_collect */
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
    u64 ip, sp, bp; /* where the stack starts: the probe's registers, or (markers) the hook's caller */
    u32 tid, api, src, pad;
};
BPF_PERCPU_ARRAY(pending, struct as_pending, 1);
BPF_PROG_ARRAY(tails, 2); /* 0: alloc_unwind, 1: alloc_keep (set by the tracer before attaching) */
#ifdef AS_SESSION
/* The same two for heap_session: a program array takes programs of one attach type only (the
 * kernel refuses a tail call between a uprobe session and a classic uprobe program). */
BPF_PROG_ARRAY(stails, 2); /* 0: salloc_unwind, 1: salloc_keep */
#endif

static __always_inline void tail_to(struct pt_regs *ctx, int session, u32 i)
{
#ifdef AS_SESSION
    if (session) {
        stails.call(ctx, i);
        return;
    }
#endif
    tails.call(ctx, i);
}

static __always_inline void tail_failed(struct as_pending *p)
{
    count(AS_LOST_LIVE_FULL, 1); /* cannot happen once `tails` is filled; never silent */
    count(AS_LOST_LIVE_FULL_BYTES, p->size);
}

static __always_inline int unwind_pending(struct pt_regs *ctx, int session)
{
    u32 zero = 0;
    struct as_pending *p = pending.lookup(&zero);
    if (!p)
        return 0;
    u64 sid = 0;
    if (!unwind_chunk(p->ip, p->sp, p->bp, 0, &sid)) {
        tail_to(ctx, session, 0); /* the next frames: this program again */
        sid = unwind_cut();
    }
    p->sid = sid;
    tail_to(ctx, session, 1);
    tail_failed(p);
    return 0;
}

static __always_inline int keep_pending(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct as_pending *p = pending.lookup(&zero);
    if (!p)
        return 0;
    scache_fill(p->ip, p->sp, p->bp, p->sid);
    record_alloc(p->tid, p->addr, p->size, p->api, p->ts, py_stack(p->tid, p->sid), p->src);
    return 0;
}

#endif

/* The stack of an allocation seen in alloc_return (or at a marker: ip/sp/bp are then the hook's
 * caller's, as at a return), then keep it. */
static __always_inline void alloc_done_at(struct pt_regs *ctx, u32 tid, u64 addr, u64 size, u32 api, u64 ts, u32 src,
                                          int session, u64 ip, u64 sp, u64 bp, u32 skip)
{
#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
    u64 sid = scache_lookup(ip, sp, bp);
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
            p->ip = ip;
            p->sp = sp;
            p->bp = bp;
            tail_to(ctx, session, 0);
            tail_failed(p);
        }
        return;
    }
    record_alloc(tid, addr, size, api, ts, py_stack(tid, sid), src);
#elif defined(AS_UNWIND_DWARF)
    record_alloc(tid, addr, size, api, ts, py_stack(tid, capture_dwarf(ip, sp, bp, 0)), src);
#else
    record_alloc(tid, addr, size, api, ts, py_stack(tid, capture_stack_skip(ctx, 0, 0, skip)), src);
#endif
}

static __always_inline void alloc_done_in(struct pt_regs *ctx, u32 tid, u64 addr, u64 size, u32 api, u64 ts, u32 src,
                                          int session)
{
    alloc_done_at(ctx, tid, addr, size, api, ts, src, session, PT_REGS_IP(ctx), PT_REGS_SP(ctx), PT_REGS_FP(ctx), 0);
}

static __always_inline void alloc_done(struct pt_regs *ctx, u32 tid, u64 addr, u64 size, u32 api, u64 ts, u32 src)
{
    alloc_done_in(ctx, tid, addr, size, api, ts, src, 0);
}

#ifdef AS_SAMPLE_BYTES
/* 1: keep a block of `size` bytes (probability min(1, size/N)). */
static __always_inline int sample_keep(u64 size)
{
    return size >= AS_SAMPLE_BYTES || (u64)bpf_get_prandom_u32() * AS_SAMPLE_BYTES < (size << 32);
}
#endif

/* The return of an allocator call: alloc_return's body, and heap_session's on the return. */
static __always_inline int alloc_leave(struct pt_regs *ctx, int session)
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
    case AS_API_MALLCTL: /* a statistics read (mallctl_entered): its state only matched this return */
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
     * for max(size, N) bytes — an unbiased estimate of the bytes, decided here (or, in a uprobe
     * session, at the entry: heap_session), so unsampled blocks cost no stack walk and no map
     * update (their free is one failed lookup). */
    u64 weight = in.size;
    if (in.size < AS_SAMPLE_BYTES) {
        if (session) {
            if (in.unsampled) /* AS_CALL_FREES_ONLY: counted unsampled at the entry */
                return 0;
        } else if (!sample_keep(in.size)) {
            count(AS_CNT_UNSAMPLED, 1);
            return 0;
        }
        weight = AS_SAMPLE_BYTES;
    }
    alloc_done_in(ctx, tid, addr, weight, in.api, now, in.source, session);
#else
    alloc_done_in(ctx, tid, addr, in.size, in.api, now, in.source, session);
#endif
    return 0;
}

/* a * b, or 0 when it overflows (the call then fails). Written without a
 * division or 128-bit multiply, which BPF lacks. */
static __always_inline u64 mul_size(u64 a, u64 b)
{
    u64 ah = a >> 32, bh = b >> 32;
    if (ah == 0 && bh == 0)
        return a * b;
    if (ah != 0 && bh != 0)
        return 0;
    u64 hi = ah ? ah * b : bh * a; /* the high half times the other */
    u64 lo = ah ? (a & 0xffffffffULL) * b : (b & 0xffffffffULL) * a;
    if (hi >> 32)
        return 0;
    u64 r = (hi << 32) + lo;
    return r < lo ? 0 : r;
}

/* 1: jemalloc's mallctl `name` asks for a purge (a name ending ".purge", ".decay" or ".reset":
 * "arena.<i>.purge", "arena.<i>.decay", "prof.reset"); 0: anything else: statistics and settings
 * ("epoch", "stats.resident", "stats.arenas.<i>.dirty_purged", "opt.dirty_decay_ms"), which redis
 * reads ~40 times a second. Only purges are reported: a read costs no ring event and no tracer
 * wake-up. */
#define AS_CTL_NAME 64
static __always_inline int mallctl_purges(u64 name)
{
    char n[AS_CTL_NAME] = {};
    if (bpf_probe_read_user_str(n, sizeof(n), (void *)name) <= 1)
        return 0;
#pragma unroll
    for (int i = 0; i + 6 < AS_CTL_NAME; i++) {
        if (n[i] != '.' || n[i + 6] != 0)
            continue;
        if ((n[i + 1] == 'p' && n[i + 2] == 'u' && n[i + 3] == 'r' && n[i + 4] == 'g' && n[i + 5] == 'e') ||
            (n[i + 1] == 'd' && n[i + 2] == 'e' && n[i + 3] == 'c' && n[i + 4] == 'a' && n[i + 5] == 'y') ||
            (n[i + 1] == 'r' && n[i + 2] == 'e' && n[i + 3] == 's' && n[i + 4] == 'e' && n[i + 5] == 't'))
            return 1;
    }
    return 0;
}

/* The size and the pointer argument of heap call `api` from its registers; 0: not a heap call (nor
 * a purge: a mallctl that asks none). */
static __always_inline int heap_args(struct pt_regs *ctx, u32 api, u64 *size, u64 *arg)
{
    switch (api) {
    case AS_API_MALLOC:
    case AS_API_VALLOC:
    case AS_API_PVALLOC:
        *size = PT_REGS_PARM1(ctx);
        return 1;
    case AS_API_CALLOC:
        *size = mul_size(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx));
        return 1;
    case AS_API_REALLOC:
        *size = PT_REGS_PARM2(ctx);
        *arg = PT_REGS_PARM1(ctx);
        return 1;
    case AS_API_REALLOCARRAY:
        *size = mul_size(PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx));
        *arg = PT_REGS_PARM1(ctx);
        return 1;
    case AS_API_POSIX_MEMALIGN:
        *size = PT_REGS_PARM3(ctx);
        *arg = PT_REGS_PARM1(ctx);
        return 1;
    case AS_API_ALIGNED_ALLOC:
    case AS_API_MEMALIGN:
        *size = PT_REGS_PARM2(ctx);
        return 1;
    case AS_API_MALLCTL:
        if (!mallctl_purges(PT_REGS_PARM1(ctx))) {
            count(AS_CNT_CTL_SKIPPED, 1);
            return 0;
        }
        /* fall through: a purge call */
    case AS_API_MALLOC_TRIM:
        *size = (u64)rss_anon();
        *arg = PT_REGS_PARM1(ctx);
        return 1;
    default:
        return 0;
    }
}

/* The call as the state records it: a mallctl that passed heap_args is a purge call. */
static __always_inline u32 as_api_call(u32 api)
{
    return api == AS_API_MALLCTL ? AS_API_MALLOC_TRIM : api;
}

/* heap_args refused `api`: a mallctl that asks no purge still opens a state when its return is
 * probed anyway (classic probes, return links), so that the return matches it and reports nothing
 * (alloc_leave) rather than counting an unmatched return. Sessions simply skip the return. */
static __always_inline int mallctl_entered(struct pt_regs *ctx, u32 api, u32 src)
{
    if (api != AS_API_MALLCTL)
        return 0;
    return enter_state(ctx, thread_state(BPF_LOCAL_STORAGE_GET_F_CREATE), AS_API_MALLCTL, 0, 0, 0, src);
}

/* free(p), and every other free the cookie or the symbol says takes the pointer first. */
static __always_inline void free_arg1(struct pt_regs *ctx)
{
    u64 p = PT_REGS_PARM1(ctx);
    if (p == 0)
        count(AS_CNT_FREE_NULL, 1);
    else
        free_addr(current_tid(), p, 0);
}

/* A classic entry probe (a perf event per symbol): the program says which call it is. */
static __always_inline int api_enter(struct pt_regs *ctx, u32 api)
{
    if (!is_target())
        return 0;
    u64 size = 0, arg = 0;
    if (!heap_args(ctx, api, &size, &arg))
        return mallctl_entered(ctx, api, entry_source(ctx));
    return enter_state(ctx, thread_state(BPF_LOCAL_STORAGE_GET_F_CREATE), as_api_call(api), size, arg, 0,
                       entry_source(ctx));
}

#endif /* AS_HEAP_H */
