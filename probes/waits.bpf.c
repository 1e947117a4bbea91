/* allocscope BPF, waits.bpf.c: off-CPU waits by user stack (sched:sched_switch) and TLB flushes
 * (tlb:tlb_flush) of the target, as raw tracepoints where the kernel's BTF gives the task
 * offsets (they run on every context switch and flush of the machine): see waits.h.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "waits.h"

#ifdef AS_OFF_TASK_TGID
/* Raw: no tracepoint buffer filled for every switch of the machine. The incoming task is looked
 * up only when it is the target's (its tgid read first), the outgoing one only when current is. */
RAW_TRACEPOINT_PROBE(sched_switch) /* (bool preempt, prev, next[, unsigned int prev_state]) */
{
    void *next_task = (void *)ctx->args[2];
    u32 next_tgid = 0;
    bpf_probe_read_kernel(&next_tgid, sizeof(next_tgid), next_task + AS_OFF_TASK_TGID);
    if (next_tgid == AS_TGID) {
        u32 next = 0;
        bpf_probe_read_kernel(&next, sizeof(next), next_task + AS_OFF_TASK_PID);
        struct as_offcpu *o = offcpu.lookup(&next);
        if (o && o->ts_ns) { /* a blocked target thread runs again */
            wait_ended(next, o, bpf_ktime_get_ns());
            o->ts_ns = 0;
        }
    }
    if (!is_target() || ctx->args[0]) /* preempted: still runnable, not a wait */
        return 0;
#ifdef AS_SWITCH_STATE_ARG
    u32 raw = (u32)ctx->args[3];
#else
    u32 raw = 0;
    bpf_probe_read_kernel(&raw, sizeof(raw), (void *)ctx->args[1] + AS_OFF_TASK_STATE);
#endif
    long state = switch_state(raw);
    if (!state)
        return 0;
    return wait_began(ctx, state);
}
#else
TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 next = (u32)args->next_pid;
    struct as_offcpu *o = offcpu.lookup(&next);
    if (o && o->ts_ns) { /* a blocked target thread runs again */
        wait_ended(next, o, bpf_ktime_get_ns());
        o->ts_ns = 0;
    }
    if (!is_target())
        return 0;
    long state = args->prev_state;
    if (state != 1 && state != 2)
        return 0; /* preempted (still runnable), stopped, traced, exiting: not a wait */
    return wait_began(args, state);
}
#endif

#ifdef AS_WAIT_TAILS
/* The raw sched_switch's stack unwound (waits.h wait_began hands it over when not memoized). */
int wait_unwind(struct bpf_raw_tracepoint_args *ctx)
{
    u32 zero = 0;
    struct as_wait_pending *p = wait_pending.lookup(&zero);
    if (!p)
        return 0;
    u64 ip = 0, sp = 0, bp = 0, sid = 0;
    syscall_regs(&ip, &sp, &bp);
    if (!unwind_chunk(ip, sp, bp, 1, &sid)) {
        wait_tails.call(ctx, 0); /* the next frames: this program again */
        sid = unwind_cut();
    }
    p->sid = sid;
    wait_tails.call(ctx, 1);
    count(AS_LOST_STACK_ERR, 1);
    wait_record(p->tid, p->sid, p->state, p->now); /* no keep program: kept without the memo */
    return 0;
}

int wait_keep(struct bpf_raw_tracepoint_args *ctx)
{
    u32 zero = 0;
    struct as_wait_pending *p = wait_pending.lookup(&zero);
    if (!p)
        return 0;
    struct as_wait_memo *m = wait_memo.lookup(&p->tid);
    if (m)
        wait_memo_keep(m, p->ip, p->sp, p->bp, p->sid);
    wait_record(p->tid, p->sid, p->state, p->now);
    return 0;
}
#endif

/* What unmapping costs the other CPUs: TLB flushes by reason (0 task switch, 1 remote shootdown
 * received, 2 local shootdown, 3 local mm shootdown, 4 remote IPI sent, 5 remote wrong CPU). */
RAW_TRACEPOINT_PROBE(tlb_flush) /* (int reason, unsigned long pages): raw, no buffer filled */
{
    if (!is_target())
        return 0;
    u32 reason = (u32)ctx->args[0];
    unsigned long pages = (unsigned long)ctx->args[1];
    struct as_tlb *t = tlb_flushes.lookup(&reason);
    if (!t)
        return 0;
    t->flushes += 1;
    if (pages == (unsigned long)-1)
        t->full += 1;
    else
        t->pages += pages;
    return 0;
}
