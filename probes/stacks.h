/* allocscope BPF, stacks.h: capture_stack(), the one place a user stack is walked (frame pointers, or the
 * DWARF unwinder of unwind_dwarf.h). Both keep what they walked with store_stack (stack_store.h):
 * neither header uses the other's names back (no include circle).
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_STACKS_H
#define AS_STACKS_H
#include "common.h"
#include "stack_store.h"

#ifdef AS_UNWIND_DWARF
#include "unwind_dwarf.h"
#endif

/* Frame-pointer walk of the user stack, starting at the probe's user pc.
 * `extra` is kept beside the frames (syscalls: word at the user sp).
 * AS_UNWIND_DWARF: return probes unwind with CFI rows from the caller's registers. */
static __always_inline u64 capture_stack_skip(void *ctx, u32 flags, u64 extra, u32 skip);

static __always_inline u64 capture_stack(void *ctx, u32 flags, u64 extra)
{
    return capture_stack_skip(ctx, flags, extra, 0);
}

/* capture_stack, the first `skip` frames left out (frame pointers only) */
static __always_inline u64 capture_stack_skip(void *ctx, u32 flags, u64 extra, u32 skip)
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
    long n = bpf_get_stack(ctx, st->ips, sizeof(st->ips), BPF_F_USER_STACK | (skip & BPF_F_SKIP_FIELD_MASK));
    if (n <= 0) {
        count(AS_LOST_STACK_ERR, 1);
        return 0;
    }
    st->depth = (u32)(n / sizeof(u64));
    st->flags = flags;
    st->extra = extra;
    return store_stack(st);
}

/* The user registers the thread entered the kernel with (a syscall, a fault, or the syscall
 * whose kernel code touched user memory): where its stack starts; DWARF unwinding looks the
 * syscall wrapper's own row up (exact = 1), which finds its caller. */
static __always_inline void syscall_regs(u64 *ip, u64 *sp, u64 *bp)
{
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    bpf_probe_read_kernel(ip, sizeof(*ip), &regs->ip);
    bpf_probe_read_kernel(sp, sizeof(*sp), &regs->sp);
    bpf_probe_read_kernel(bp, sizeof(*bp), &regs->bp);
}

static __always_inline u64 capture_syscall_stack(void *ctx)
{
#ifdef AS_UNWIND_DWARF
    u64 ip = 0, sp = 0, bp = 0;
    syscall_regs(&ip, &sp, &bp);
    return capture_dwarf(ip, sp, bp, 1);
#else
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 sp = 0, word = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp);
    if (sp)
        bpf_probe_read_user(&word, sizeof(word), (void *)sp);
    return capture_stack(ctx, AS_STACK_SYSCALL, word);
#endif
}

#endif /* AS_STACKS_H */
