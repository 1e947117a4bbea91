/* allocscope BPF, syscalls.h: the syscall exits of the mmap family, brk and madvise: each dispatched
 * to its accounting (regions.h) or, for the rare shapes, an event.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_SYSCALLS_H
#define AS_SYSCALLS_H
#include "common.h"
#include "stacks.h"
#include "python.h"
#include "rss.h"
#include "regions.h"

/* The exits that keep a region need the caller's stack. With the DWARF unwinder the stack is
 * taken by another program: the unwinder inlined beside the region code made the verifier take
 * 0.18 s for each of mmap's and brk's exit programs (the product of the unwinder's loop and the
 * region code's branches), most of a start-up's verification. The exit hands the call over to
 * sys_unwind, which unwinds and hands it to sys_keep (tail calls on the same CPU, the state in
 * `sys_pending`), as alloc_return does with alloc_unwind and alloc_keep. */
/* --inject: the agent hooks the mmap family in the process (tracer/inject/agent/agent.c) and reports each
 * call through the as_mark_sys marker (mark_sys below), so that its tracepoints can stay detached:
 * an enabled syscall tracepoint sends every system call of every process on the machine through
 * the kernel's slow path. sys_hooked[nr] != 0: the markers report that call, and its tracepoint
 * programs (if attached) ignore it. Both paths share `sysargs`, so a call whose entry one path saw
 * and whose exit the other did (the switch happening in between) is still counted once. */
BPF_ARRAY(sys_hooked, u32, 32);

static __always_inline int sys_by_agent(u32 nr)
{
    u32 *h = sys_hooked.lookup(&nr);
    return h && *h;
}

/* Where a marker's stack starts: the hooked function's caller (its return address, the stack
 * pointer after the return, its frame pointer), as at an allocator's return probe. */
struct as_origin {
    u64 ip, sp, bp;
};

#ifdef AS_UNWIND_DWARF
struct as_sys_pending {
    struct as_sysargs a;
    u64 ret, now, sid, lo, hi, old;
    u64 oip, osp, obp; /* a marker's origin (0: a tracepoint's: the stack starts at the syscall) */
    u32 tid, api, nr, pad;
};
BPF_PERCPU_ARRAY(sys_pending, struct as_sys_pending, 1);
BPF_PROG_ARRAY(sys_tails, 2);  /* 0: sys_unwind, 1: sys_keep (tracepoint programs, set by the tracer) */
BPF_PROG_ARRAY(msys_tails, 2); /* the same for mark_sys: 0: msys_unwind, 1: msys_keep (uprobe programs) */

/* Hand the rest of this exit to sys_unwind -> sys_keep; returns only when that failed. */
static __always_inline void sys_handoff(void *ctx, struct as_sysargs *a, u32 nr, u64 ret, u64 lo, u64 hi, u64 old,
                                        u32 tid, u32 api, u64 now, struct as_origin *o)
{
    u32 zero = 0;
    struct as_sys_pending *p = sys_pending.lookup(&zero);
    if (!p)
        return;
    p->a = *a;
    p->nr = nr;
    p->ret = ret;
    p->lo = lo;
    p->hi = hi;
    p->old = old;
    p->tid = tid;
    p->api = api;
    p->now = now;
    p->sid = 0;
    if (o) {
        p->oip = o->ip;
        p->osp = o->sp;
        p->obp = o->bp;
        msys_tails.call(ctx, 0);
    } else {
        p->oip = 0;
        sys_tails.call(ctx, 0);
    }
    count(AS_LOST_STACK_ERR, 1); /* the table is filled before the tracepoints attach */
}
#endif

static __always_inline void mmap_exit_sid(void *ctx, struct as_sysargs *a, u64 lo, u32 tid, u32 api, u64 now, u64 sid)
{
    u64 hi = page_up(lo + a->a1);
    u32 prot = (u32)a->a2, flags = (u32)a->a3;
    s32 fd = (s32)a->a4;
    u32 src = mmap_source(a, api);
    int code = (prot & AS_PROT_EXEC) && !(flags & AS_MAP_ANONYMOUS);
    int slow = (flags & AS_MAP_FIXED) && api == AS_API_NONE;
    if (src) {
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
#ifdef AS_UNWIND_DWARF
    /* Launch mode: hold the main thread at each file mapped executable (the loader mapping a
     * library) until the tracer has mapped its unwind rows: the tracer is its ptrace parent, sees
     * the stop, loads, and resumes it with the signal suppressed (tracer/unwind/unwinder.py). */
    if (AS_LAUNCHED && code && fd >= 0 && tid == AS_TGID)
        bpf_send_signal_thread(19 /* SIGSTOP */);
#endif
}

/* The stack of a syscall exit: from the syscall's registers (tracepoint), or from a marker's
 * origin, the hook's caller (frame pointers: the marker's frame left out); with the thread's
 * Python frames (python.h) when it runs CPython, as an allocation's. */
static __always_inline u64 sys_stack(void *ctx, struct as_origin *o, u32 tid)
{
    return py_stack(tid, o ? capture_stack_skip(ctx, 0, 0, 1) : capture_syscall_stack(ctx));
}

static __always_inline void mmap_exit(void *ctx, struct as_sysargs *a, u64 lo, u32 tid, u32 api, u64 now,
                                      struct as_origin *o)
{
    if (!mmap_source(a, api)) {
        mmap_exit_sid(ctx, a, lo, tid, api, now, 0);
        return;
    }
#ifdef AS_UNWIND_DWARF
    sys_handoff(ctx, a, 9, lo, 0, 0, 0, tid, api, now, o);
    mmap_exit_sid(ctx, a, lo, tid, api, now, 0);
#else
    mmap_exit_sid(ctx, a, lo, tid, api, now, sys_stack(ctx, o, tid));
#endif
}

static __always_inline void munmap_exit(struct as_sysargs *a, u32 tid, u32 api, u64 now)
{
    u64 lo = a->a0 & ~(u64)(AS_PAGE_SIZE - 1), hi = page_up(a->a0 + a->a1);
    if (api != AS_API_NONE || hi <= lo) {
        count_release(tid, AS_EV_MUNMAP, api, a->a1, a->rss, now - a->ts_ns, 0);
        untracked.delete(&lo);
        return; /* an allocator unmapping its own memory */
    }
    u64 sid = 0;
    u64 cur = unmap_regions(lo, hi, tid, now, &sid);
    count_release(tid, AS_EV_MUNMAP, api, a->a1, a->rss, now - a->ts_ns, sid);
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

/* A break change the kernel side does not account itself: the tracer replays it. */
static __always_inline void brk_event(struct as_sysargs *a, u64 nb, u64 old, u32 tid, u32 api, u64 sid)
{
    struct as_event *e = slow_event(AS_EV_BRK, tid, a, api);
    if (!e)
        return;
    e->addr = nb;
    e->len = old;
    e->stack_id = sid;
    submit(e);
}

/* The break grown over [lo, hi) by the program (not its allocator): a region, or an event. */
static __always_inline void brk_grown(struct as_sysargs *a, u64 nb, u64 old, u64 lo, u64 hi, u32 tid, u32 api, u64 now,
                                      u64 sid)
{
    if (region_new(lo, hi, sid, tid, now, AS_SRC_BRK) == 0) {
        count(AS_CNT_REGION_OPS, 1);
        return;
    }
    brk_event(a, nb, old, tid, api, sid);
}

static __always_inline void brk_exit(void *ctx, struct as_sysargs *a, u64 nb, u32 tid, u32 api, u64 now,
                                     struct as_origin *o)
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
        *tracked = 1;
#ifdef AS_UNWIND_DWARF
        sys_handoff(ctx, a, 12, nb, lo, hi, old, tid, api, now, o); /* -> brk_grown */
        sid = 0;
#else
        sid = sys_stack(ctx, o, tid);
#endif
        brk_grown(a, nb, old, lo, hi, tid, api, now, sid);
        return;
    } else {
        count_release(tid, AS_EV_BRK, api, 0, a->rss, now - a->ts_ns, 0);
        if (!*tracked)
            return; /* no page of the break was ever a region */
    }
    brk_event(a, nb, old, tid, api, 0);
}

/* The attach. BCC attaches the syscall tracepoints when it loads the program, a second or more
 * before the uprobes: a mapping made in between inside an allocator call (glibc's mmapped chunk,
 * jemalloc's extent) looked like the program's own mmap, at a stack cut short (no unwind rows
 * yet), dated before the attach, and stayed live for good once its munmap came inside free, after
 * the uprobes (issue 53: a 112 MiB "mmap" location in redis). `sys_live[0]`: when the tracer had
 * attached every probe (bpf_ktime_get_ns's clock, CLOCK_MONOTONIC; 0 until then). A call that
 * entered before that (or returns before it) belongs to the memory from before the attach: never
 * a region, a release or a growth of the break; its mapping is `untracked` (its munmap needs no
 * event), the break it set is kept, and code it mapped still reaches the tracer. */
BPF_ARRAY(sys_live, u64, 1);

static __always_inline u64 sys_live_ns(void)
{
    u32 zero = 0;
    u64 *t = sys_live.lookup(&zero);
    return t ? *t : 0;
}

static __always_inline void sys_before_attach(u32 nr, s64 ret, struct as_sysargs *a, u32 tid, u64 live)
{
    if (nr == 12) { /* the break stays known: the first growth after the attach is measured from it */
        u32 k0 = 0;
        u64 *cur = brk_state.lookup(&k0);
        if (cur && *cur)
            *cur = (u64)ret;
        return;
    }
    if (nr != 9)
        return;
    u64 lo = (u64)ret, hi = page_up(lo + a->a1);
    u32 flags = (u32)a->a3;
    if (live && !(flags & AS_MAP_FIXED))
        untracked.update(&lo, &hi); /* in flight at the attach: its munmap finds it here */
    if (!(a->a2 & AS_PROT_EXEC) || (flags & AS_MAP_ANONYMOUS))
        return;
    struct as_event *e = new_event(AS_EV_CODE, tid); /* the unwinder loads its rows */
    if (!e)
        return;
    e->addr = lo;
    e->len = a->a1;
    e->prot = (u32)a->a2;
    e->flags = flags;
    e->fd = (s32)a->a4;
    e->ret = (s64)lo;
    submit(e);
}

/* A syscall of the mmap family done: `a` its arguments, `ret` its result; `o`: the marker's
 * origin (0: a tracepoint). */
static __always_inline void sys_done(void *ctx, u32 nr, s64 ret, struct as_sysargs *ap, struct as_origin *o)
{
    struct as_sysargs a = *ap;
    if (ret < 0 && ret > -4096)
        return; /* failed: nothing changed */
    u32 tid = current_tid();
    u64 live = sys_live_ns();
    if (!live || a.ts_ns < live) {
        sys_before_attach(nr, ret, &a, tid, live);
        return;
    }
    u32 api = current_api();
    u64 now = bpf_ktime_get_ns();
    switch (nr) {
    case 9: /* mmap(addr, len, prot, flags, fd) -> addr */
        mmap_exit(ctx, &a, (u64)ret, tid, api, now, o);
        break;
    case 11: /* munmap(addr, len) */
        munmap_exit(&a, tid, api, now);
        break;
    case 25: /* mremap(old, old_len, new_len, flags, new_addr) -> new */
        mremap_exit(&a, (u64)ret, tid, api, now);
        break;
    case 12: /* brk(requested) -> new break */
        brk_exit(ctx, &a, (u64)ret, tid, api, now, o);
        break;
    case 28: /* madvise(start, len, advice) */
        count_release(tid, AS_EV_MADVISE, api, a.a1, a.rss, now - a.ts_ns, 0);
        break;
    default:
        break;
    }
}

static __always_inline void syscall_exit(void *ctx, u32 nr, s64 ret)
{
    struct as_sysargs a = {};
    if (!pop_sysargs(nr, &a))
        return;
    sys_done(ctx, nr, ret, &a, 0);
}

#ifdef AS_UNWIND_DWARF
static __always_inline int sys_keep_pending(void *ctx)
{
    u32 zero = 0;
    struct as_sys_pending *p = sys_pending.lookup(&zero);
    if (!p)
        return 0;
    struct as_sysargs a = p->a;
    u64 sid = py_stack(p->tid, p->sid); /* the unwound native stack, with its Python frames */
    if (p->nr == 9)
        mmap_exit_sid(ctx, &a, p->ret, p->tid, p->api, p->now, sid);
    else if (p->nr == 12)
        brk_grown(&a, p->ret, p->old, p->lo, p->hi, p->tid, p->api, p->now, sid);
    return 0;
}
#endif

/* What as_mark_sys's second argument points at (mark_sys, syscalls.bpf.c). */
struct as_sysrec {
    u64 nr;
    u64 a[5];
    u64 ret;
};

#endif /* AS_SYSCALLS_H */
