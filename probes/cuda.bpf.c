/* allocscope BPF, cuda.bpf.c: the CUDA driver API (libcuda.so.1): its return and entry probes.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "heap.h"

/* --- the CUDA driver API (libcuda.so.1) ---------------------------------------------------
 * Out-pointer calls: the address or handle is read from *dptr when the call returns
 * CUDA_SUCCESS (0); a failed call allocates nothing. The mappings the driver makes inside a
 * call (pinned host memory is a shared mapping of /dev/nvidiactl) belong to the call: the call
 * state makes them "inside an API call", as malloc's own mmaps are. GPU memory is its own total
 * (totals[5]) and never host memory. */
int cu_return(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    struct as_inflight in = {};
    if (!leave_state(ctx, cu_state(0), &in))
        return 0;
    u64 now = bpf_ktime_get_ns();
    if ((int)PT_REGS_RC(ctx) != 0) {
        count(AS_CNT_FAILED, 1);
        return 0;
    }
    u64 addr = 0, size = in.size;
    switch (in.api) {
    case AS_API_CU_FREE:
        if (!dev_free(tid, in.arg, AS_API_CU_ALLOC, now))
            free_addr(tid, in.arg, now); /* managed memory: a host block */
        return 0;
    case AS_API_CU_RELEASE:
        if (!dev_free(tid, in.arg, AS_API_CU_CREATE, now))
            count(AS_CNT_FREE_UNKNOWN, 1);
        return 0;
    case AS_API_CU_FREE_HOST:
        free_addr(tid, in.arg, now);
        return 0;
    case AS_API_CU_UNREGISTER:
        if (!dev_free(tid, in.arg, AS_API_CU_HOST_REGISTER, now))
            count(AS_CNT_FREE_UNKNOWN, 1);
        return 0;
    case AS_API_CU_HOST_REGISTER:
        addr = in.arg;
        break;
    case AS_API_CU_ALLOC_PITCH: {
        u64 pitch = 0;
        bpf_probe_read_user(&pitch, sizeof(pitch), (void *)in.arg2);
        size = mul_size(pitch, in.size);
        bpf_probe_read_user(&addr, sizeof(addr), (void *)in.arg);
        break;
    }
    default: /* the address or handle was stored at the out pointer */
        bpf_probe_read_user(&addr, sizeof(addr), (void *)in.arg);
        break;
    }
    if (addr == 0 || size == 0) {
        count(AS_CNT_FAILED, 1);
        return 0;
    }
    alloc_done(ctx, tid, addr, size, in.api, now, in.source);
    return 0;
}

int cu_alloc_enter(struct pt_regs *ctx) /* (CUdeviceptr *dptr, size_t bytesize, ...) */
{
    return cu_enter(ctx, AS_API_CU_ALLOC, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_pitch_enter(struct pt_regs *ctx) /* (dptr, size_t *pPitch, WidthInBytes, Height, ...) */
{
    return cu_enter(ctx, AS_API_CU_ALLOC_PITCH, PT_REGS_PARM4(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx));
}

int cu_create_enter(struct pt_regs *ctx) /* (CUmemGenericAllocationHandle *handle, size_t size, ...) */
{
    return cu_enter(ctx, AS_API_CU_CREATE, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_host_alloc_enter(struct pt_regs *ctx) /* (void **pp, size_t bytesize, ...) */
{
    return cu_enter(ctx, AS_API_CU_HOST_ALLOC, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_register_enter(struct pt_regs *ctx) /* (void *p, size_t bytesize, unsigned int Flags) */
{
    return cu_enter(ctx, AS_API_CU_HOST_REGISTER, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_managed_enter(struct pt_regs *ctx) /* (CUdeviceptr *dptr, size_t bytesize, unsigned int flags) */
{
    return cu_enter(ctx, AS_API_CU_MANAGED, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), 0);
}

int cu_free_enter(struct pt_regs *ctx) /* (CUdeviceptr dptr, ...) */
{
    return cu_enter(ctx, AS_API_CU_FREE, 0, PT_REGS_PARM1(ctx), 0);
}

int cu_release_enter(struct pt_regs *ctx) /* (CUmemGenericAllocationHandle handle) */
{
    return cu_enter(ctx, AS_API_CU_RELEASE, 0, PT_REGS_PARM1(ctx), 0);
}

int cu_free_host_enter(struct pt_regs *ctx) /* (void *p) */
{
    return cu_enter(ctx, AS_API_CU_FREE_HOST, 0, PT_REGS_PARM1(ctx), 0);
}

int cu_unregister_enter(struct pt_regs *ctx) /* (void *p) */
{
    return cu_enter(ctx, AS_API_CU_UNREGISTER, 0, PT_REGS_PARM1(ctx), 0);
}
