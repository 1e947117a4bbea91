/* allocscope BPF, waits.h: off-CPU time of the target's threads by user stack
 * (sched:sched_switch), so the reports can join memory to waiting: who holds what while blocked.
 *
 * A target thread that blocks (switched out sleeping, S, or uninterruptible, D; a preempted
 * thread is runnable, not waiting) fills its `offcpu` entry: when, and its user stack then (the
 * entry, made at its first wait, stays until it exits; ts_ns 0 while it runs). On its
 * switch back in the wait is summed per (stack, thread) in `waits` when it lasted at least the
 * threshold (`wait_cfg[0]`, ns, set by the tracer: --wait-min), else only counted. No ring event:
 * the tracer reads `waits` and the threads blocked now (`offcpu`) each interval.
 *
 * Cost: the program runs on every context switch of the machine. As a raw tracepoint (the task
 * offsets from the kernel's BTF) it costs other processes one read of the incoming task's tgid and
 * a compare, no tracepoint record filled; the classic tracepoint (no BTF) fills the record and
 * makes one hash lookup (is the incoming task a blocked target thread?). For a target thread
 * that blocks, its user stack — the same as one of its last AS_WAIT_WAYS waits' (same ip, sp, bp:
 * an event loop, a worker blocking in the same few calls) is taken from `wait_memo`, not unwound
 * again. A stack cut short is not kept there: the module it stopped at may have its unwind rows
 * by the next wait (tracer/unwind/unwinder.py builds them once stacks cross it).
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_WAITS_H
#define AS_WAITS_H
#include "common.h"
#include "changes.h"
#include "stacks.h"

#define AS_MAX_WAITS 16384

BPF_HASH(offcpu, u32, struct as_offcpu, AS_MAX_THREADS);
BPF_F_TABLE("hash", struct as_wait_key, struct as_wait, waits, AS_MAX_WAITS, BPF_F_NO_PREALLOC);
BPF_HASH(wait_memo, u32, struct as_wait_memo, AS_MAX_THREADS);
BPF_ARRAY(wait_cfg, u64, 1); /* 0: the threshold (ns); 0 there: waits are not traced */
BPF_PERCPU_ARRAY(tlb_flushes, struct as_tlb, 8);

static __always_inline void wait_ended(u32 tid, struct as_offcpu *o, u64 now)
{
    u64 d = now - o->ts_ns;
    u32 zero = 0;
    u64 *min = wait_cfg.lookup(&zero);
    if (!min || d < *min) {
        count(AS_CNT_WAITS_SHORT, 1);
        count(AS_CNT_WAIT_SHORT_NS, d);
        return;
    }
    struct as_wait_key k = {.stack_id = o->stack_id, .tid = tid};
    struct as_wait *w = waits.lookup(&k);
    if (!w) {
        struct as_wait z = {};
        waits.insert(&k, &z); /* -EEXIST: made meanwhile, fine */
        w = waits.lookup(&k);
        if (!w) {
            count(AS_LOST_WAIT_FULL, 1);
            return;
        }
    }
    __sync_fetch_and_add(&w->count, 1);
    __sync_fetch_and_add(&w->total_ns, d);
    if (d > w->max_ns)
        w->max_ns = d; /* one thread per key: no race with itself */
    map_dirty(AS_DIRTY_WAITS);
}

/* The raw sched_switch with the DWARF unwinder hands a stack it must unwind to wait_unwind and
 * wait_keep (waits.bpf.c) by tail call, as the syscall exits do (syscalls.h): the unwinder then sits
 * in a program of its own, verified beside the others at start, not inlined in the program of every
 * context switch (1.1 s of the verifier's time on the path to live probes, 0.4 s now). */
#if defined(AS_UNWIND_DWARF) && defined(AS_OFF_TASK_TGID)
#define AS_WAIT_TAILS 1
struct as_wait_pending {
    u64 now, ip, sp, bp, sid;
    u32 tid, state;
};
BPF_PERCPU_ARRAY(wait_pending, struct as_wait_pending, 1);
BPF_PROG_ARRAY(wait_tails, 2); /* 0: wait_unwind, 1: wait_keep (raw tracepoint programs, set by the tracer) */
#endif

static __always_inline void wait_regs(u64 *ip, u64 *sp, u64 *bp)
{
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    bpf_probe_read_kernel(ip, sizeof(*ip), &regs->ip);
    bpf_probe_read_kernel(sp, sizeof(*sp), &regs->sp);
    bpf_probe_read_kernel(bp, sizeof(*bp), &regs->bp);
}

/* The thread's memo of its last waits' stacks (made at its first wait), or NULL. */
static __always_inline struct as_wait_memo *wait_memo_of(u32 tid)
{
    struct as_wait_memo *m = wait_memo.lookup(&tid);
    if (!m) {
        struct as_wait_memo z = {};
        wait_memo.update(&tid, &z);
        m = wait_memo.lookup(&tid);
    }
    return m;
}

/* The stack id of a wait at (ip, sp, bp) when one of the thread's last waits was there, else 0. */
static __always_inline u64 wait_memo_hit(struct as_wait_memo *m, u64 ip, u64 sp, u64 bp)
{
#pragma unroll
    for (int i = 0; i < AS_WAIT_WAYS; i++) {
        struct as_wait_way *w = &m->way[i];
        if (w->stack_id && w->ip == ip && w->sp == sp && w->bp == bp) {
            count(AS_CNT_WAIT_STACK_MEMO, 1);
            return w->stack_id;
        }
    }
    return 0;
}

/* Keep a freshly unwound stack in the memo, unless it was cut short (e.g. at a module whose rows
 * are being built): then it is unwound again next time. */
static __always_inline void wait_memo_keep(struct as_wait_memo *m, u64 ip, u64 sp, u64 bp, u64 sid)
{
#ifdef AS_UNWIND_DWARF
    u32 zero = 0;
    struct as_stack *st = scratch.lookup(&zero);
    if (st && (st->flags & AS_STACK_TRUNCATED))
        return;
#endif
    struct as_wait_way *w = &m->way[m->next & (AS_WAIT_WAYS - 1)];
    w->ip = ip;
    w->sp = sp;
    w->bp = bp;
    w->stack_id = sid;
    m->next += 1; /* the thread's own entry: nobody else writes it */
}

/* The blocked thread's `offcpu` entry: when, in which state, at which stack. The entry stays
 * between its waits (ts_ns 0 while it runs; the exit program deletes it): a blocking switch
 * rewrites it in place rather than inserting and deleting an element. */
static __always_inline void wait_record(u32 tid, u64 sid, long state, u64 now)
{
    struct as_offcpu *o = offcpu.lookup(&tid);
    if (o) {
        o->stack_id = sid;
        o->state = (u32)state;
        o->ts_ns = now; /* last: nonzero says blocked */
        return;
    }
    struct as_offcpu w = {.ts_ns = now, .stack_id = sid, .state = (u32)state};
    offcpu.update(&tid, &w);
}

/* A raw sched_switch's prev_state as the classic tracepoint reports it (1 sleeping, S; 2
 * uninterruptible, D; 0 anything else: idle kernel waits, stopped, traced, exiting), the way
 * __trace_sched_switch_state folds it (TASK_REPORT bits; TASK_IDLE apart; RTLOCK_WAIT as D). */
static __always_inline long switch_state(u32 raw)
{
    if ((raw & 0x402) == 0x402) /* TASK_IDLE: TASK_UNINTERRUPTIBLE | TASK_NOLOAD */
        return 0;
    if (raw & 0x1000) /* TASK_RTLOCK_WAIT */
        return 2;
    u32 m = raw & 0x7f; /* TASK_REPORT */
    if (m == 1)
        return 1;
    return m == 2 || m == 3 ? 2 : 0;
}

/* A target thread blocks (current, switched out in `state`): when, and its user stack. */
static __always_inline int wait_began(void *ctx, long state)
{
    u32 zero = 0;
    u64 *min = wait_cfg.lookup(&zero);
    if (!min || *min == 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 tid = current_tid();
    count(AS_CNT_WAITS, 1);
    u64 ip = 0, sp = 0, bp = 0;
    wait_regs(&ip, &sp, &bp);
    struct as_wait_memo *m = wait_memo_of(tid);
    u64 sid = m ? wait_memo_hit(m, ip, sp, bp) : 0;
    if (!sid) {
#ifdef AS_WAIT_TAILS
        struct as_wait_pending *p = wait_pending.lookup(&zero);
        if (p) {
            p->now = now;
            p->ip = ip;
            p->sp = sp;
            p->bp = bp;
            p->sid = 0;
            p->tid = tid;
            p->state = (u32)state;
            wait_tails.call(ctx, 0); /* -> wait_unwind -> wait_keep */
        }
        count(AS_LOST_STACK_ERR, 1); /* no tail call: the wait is kept without its stack */
#else
        sid = capture_syscall_stack(ctx);
        if (m)
            wait_memo_keep(m, ip, sp, bp, sid);
#endif
    }
    wait_record(tid, sid, state, now);
    return 0;
}

#endif /* AS_WAITS_H */
