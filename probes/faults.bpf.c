/* allocscope BPF, faults.bpf.c: residency mode's perf-event programs (faults.h).
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "faults.h"

#ifdef AS_FAULTS
#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
int fault_sample(struct bpf_perf_event_data *ctx)
{
    if (!is_target())
        return 0;
    count(AS_CNT_FAULT_SAMPLES, 1);
    u64 ip = 0, sp = 0, bp = 0;
    syscall_regs(&ip, &sp, &bp);
    u64 sid = scache_lookup(ip, sp, bp);
    if (sid) {
        fault_charge_py(sid);
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
    syscall_regs(&ip, &sp, &bp);
    u64 sid = 0;
    if (!unwind_chunk(ip, sp, bp, 1, &sid)) {
        ftails.call(ctx, 0); /* the next frames: this program again */
        sid = unwind_cut();
    }
    p->sid = sid;
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
    syscall_regs(&ip, &sp, &bp);
    scache_fill(ip, sp, bp, p->sid);
    fault_charge_py(p->sid);
    return 0;
}
#else
int fault_sample(struct bpf_perf_event_data *ctx)
{
    if (!is_target())
        return 0;
    count(AS_CNT_FAULT_SAMPLES, 1);
    fault_charge_py(capture_syscall_stack(ctx));
    return 0;
}
#endif
#endif
