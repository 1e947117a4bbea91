/* allocscope BPF program, customfns.h: the users' own allocation functions (--alloc-fn, --free-fn).
 *
 * Part of probes/allocscope.c: included there, in order, and inlined into it by
 * tracer/probe.py bpf_text (BCC rewrites map calls only in the main file). Layouts: allocscope.h. */

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
