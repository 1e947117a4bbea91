/* allocscope BPF, syscalls.bpf.c: the syscall tracepoints of the mmap family, brk and madvise, the
 * --inject marker that stands in for them, and the tail calls that take their stacks.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "syscalls.h"

#ifdef AS_UNWIND_DWARF
int sys_unwind(void *ctx)
{
    u32 zero = 0;
    struct as_sys_pending *p = sys_pending.lookup(&zero);
    if (!p)
        return 0;
    u64 ip = 0, sp = 0, bp = 0, sid = 0;
    syscall_regs(&ip, &sp, &bp);
    if (!unwind_chunk(ip, sp, bp, 1, &sid)) {
        sys_tails.call(ctx, 0); /* the next frames: this program again */
        sid = unwind_cut();
    }
    p->sid = sid;
    sys_tails.call(ctx, 1);
    count(AS_LOST_STACK_ERR, 1);
    return 0;
}

int sys_keep(void *ctx)
{
    return sys_keep_pending(ctx);
}

/* mark_sys's: the stack from the hooked function's caller, as after a return */
int msys_unwind(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct as_sys_pending *p = sys_pending.lookup(&zero);
    if (!p)
        return 0;
    u64 sid = 0;
    if (!unwind_chunk(p->oip, p->osp, p->obp, 0, &sid)) {
        msys_tails.call(ctx, 0); /* the next frames: this program again */
        sid = unwind_cut();
    }
    p->sid = sid;
    msys_tails.call(ctx, 1);
    count(AS_LOST_STACK_ERR, 1);
    return 0;
}

int msys_keep(struct pt_regs *ctx)
{
    return sys_keep_pending(ctx);
}
#endif
/* as_mark_sys(phase, struct as_sysrec *r, fp): an mmap-family call through the agent's hook.
 * Phase 0 (before munmap, madvise, brk): the arguments, the time and the anonymous RSS, as the
 * entry tracepoints save them. Phase 1 (after the call): the exit's accounting, the stack from
 * the hook's caller. mmap and mremap report after the call only (nothing is measured across
 * them): the time is the exit's. */
int mark_sys(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    struct as_sysrec r = {};
    if (bpf_probe_read_user(&r, sizeof(r), (void *)PT_REGS_PARM2(ctx)))
        return 0;
    u32 nr = (u32)r.nr;
    if (!sys_by_agent(nr))
        return 0; /* its tracepoint counts it */
    if (PT_REGS_PARM1(ctx) == 0) {
        save_sysargs(nr, r.a[0], r.a[1], r.a[2], 0, 0, rss_anon());
        return 0;
    }
    struct as_sysargs a = {};
    int saved = pop_sysargs(nr, &a); /* (mmap, mremap: only a tracepoint's entry, at the switch) */
    if (nr == 9 || nr == 25) {
        a.a0 = r.a[0];
        a.a1 = r.a[1];
        a.a2 = r.a[2];
        a.a3 = r.a[3];
        a.a4 = r.a[4];
        a.ts_ns = bpf_ktime_get_ns();
        a.rss = 0;
        a.nr = nr;
    } else if (!saved) {
        return 0;
    }
    u64 fp = PT_REGS_PARM3(ctx);
    struct as_origin o = {};
    bpf_probe_read_user(&o.bp, sizeof(o.bp), (void *)fp);
    bpf_probe_read_user(&o.ip, sizeof(o.ip), (void *)(fp + 8));
    o.sp = fp + 16;
    sys_done(ctx, nr, (s64)r.ret, &a, &o);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    if (!is_target_sys() || sys_by_agent(9))
        return 0;
    save_sysargs(9, args->addr, args->len, args->prot, args->flags, args->fd, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    if (!is_target_sys() || sys_by_agent(9))
        return 0;
    syscall_exit(args, 9, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
    if (!is_target_sys() || sys_by_agent(11))
        return 0;
    save_sysargs(11, args->addr, args->len, 0, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_munmap)
{
    if (!is_target_sys() || sys_by_agent(11))
        return 0;
    syscall_exit(args, 11, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mremap)
{
    if (!is_target_sys() || sys_by_agent(25))
        return 0;
    save_sysargs(25, args->addr, args->old_len, args->new_len, args->flags, args->new_addr, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mremap)
{
    if (!is_target_sys() || sys_by_agent(25))
        return 0;
    syscall_exit(args, 25, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_brk)
{
    if (!is_target_sys() || sys_by_agent(12))
        return 0;
    save_sysargs(12, args->brk, 0, 0, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_brk)
{
    if (!is_target_sys() || sys_by_agent(12))
        return 0;
    syscall_exit(args, 12, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_madvise)
{
    if (!is_target_sys() || sys_by_agent(28))
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
    if (!is_target_sys() || sys_by_agent(28))
        return 0;
    syscall_exit(args, 28, args->ret);
    return 0;
}
