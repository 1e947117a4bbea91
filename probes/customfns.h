/* allocscope BPF, customfns.h: the users' own allocation functions (--alloc-fn, --free-fn).
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_CUSTOMFNS_H
#define AS_CUSTOMFNS_H
#include "common.h"

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
    u64 a[8] = {PT_REGS_PARM1(ctx),
                PT_REGS_PARM2(ctx),
                PT_REGS_PARM3(ctx),
                PT_REGS_PARM4(ctx),
                PT_REGS_PARM5(ctx),
                PT_REGS_PARM6(ctx),
                0,
                0};
    return a[n & 7];
}

static __always_inline struct as_inflight *custom_state(u64 flags)
{
    return custom_inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, flags);
}

#endif /* AS_CUSTOMFNS_H */
