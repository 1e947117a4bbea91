/* allocscope BPF, customfns.bpf.c: the probes of the users' own allocation functions (--alloc-fn,
 * --free-fn; customfns.h).
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "customfns.h"
#include "heap.h"

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
