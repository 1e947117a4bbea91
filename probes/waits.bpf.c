/* allocscope BPF, waits.bpf.c: off-CPU waits by user stack (sched:sched_switch) and TLB flushes
 * (tlb:tlb_flush) of the target: see waits.h.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "waits.h"

TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 next = (u32)args->next_pid;
    struct as_offcpu *o = offcpu.lookup(&next);
    if (o) { /* a blocked target thread runs again */
        wait_ended(next, o, bpf_ktime_get_ns());
        offcpu.delete(&next);
    }
    if (!is_target())
        return 0;
    long state = args->prev_state;
    if (state != 1 && state != 2)
        return 0; /* preempted (still runnable), stopped, traced, exiting: not a wait */
    u32 zero = 0;
    u64 *min = wait_cfg.lookup(&zero);
    if (!min || *min == 0)
        return 0;
    struct as_offcpu w = {.ts_ns = bpf_ktime_get_ns(), .state = (u32)state};
    u32 tid = current_tid();
    count(AS_CNT_WAITS, 1);
    w.stack_id = wait_stack(args, tid);
    offcpu.update(&tid, &w);
    return 0;
}

/* What unmapping costs the other CPUs: TLB flushes by reason (0 task switch, 1 remote shootdown
 * received, 2 local shootdown, 3 local mm shootdown, 4 remote IPI sent, 5 remote wrong CPU). */
TRACEPOINT_PROBE(tlb, tlb_flush)
{
    if (!is_target())
        return 0;
    u32 reason = (u32)args->reason;
    struct as_tlb *t = tlb_flushes.lookup(&reason);
    if (!t)
        return 0;
    t->flushes += 1;
    if (args->pages == (unsigned long)-1)
        t->full += 1;
    else
        t->pages += args->pages;
    return 0;
}
