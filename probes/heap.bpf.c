/* allocscope BPF, heap.bpf.c: the heap API's programs: the return program that records an
 * allocation, the entry probes named after the symbols, the uprobe_multi and session
 * programs, the --inject markers.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "heap.h"

#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
/* A stack cache miss in alloc_return, heap_session or mark_alloc: the unwind and the
 * accounting, as tail calls (heap.h alloc_done_at). */
int alloc_unwind(struct pt_regs *ctx)
{
    return unwind_pending(ctx, 0);
}

int alloc_keep(struct pt_regs *ctx)
{
    return keep_pending(ctx);
}

#ifdef AS_SESSION
int salloc_unwind(struct pt_regs *ctx)
{
    return unwind_pending(ctx, 1);
}

int salloc_keep(struct pt_regs *ctx)
{
    return keep_pending(ctx);
}
#endif
#endif

/* The one return probe of every allocator function (classic uprobes). */
int alloc_return(struct pt_regs *ctx)
{
    return alloc_leave(ctx, 0);
}

/* --- entry probes (named after the symbol) ------------------------------- */
int malloc_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_MALLOC);
}

int calloc_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_CALLOC);
}

int realloc_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_REALLOC);
}

int reallocarray_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_REALLOCARRAY);
}

int posix_memalign_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_POSIX_MEMALIGN);
}

int aligned_alloc_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_ALIGNED_ALLOC);
}

int memalign_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_MEMALIGN);
}

int valloc_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_VALLOC);
}

int pvalloc_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_PVALLOC);
}

int malloc_trim_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_MALLOC_TRIM);
}

int mallctl_enter(struct pt_regs *ctx)
{
    return api_enter(ctx, AS_API_MALLCTL);
}

int free_enter(struct pt_regs *ctx)
{
    if (is_target())
        free_arg1(ctx);
    return 0;
}

/* --- uprobe_multi links (kernel 6.6+) -------------------------------------
 * Attached through links (tracer/bpf/attach.py), one program serves every heap function of a module:
 * the cookie of each probed address is enum as_api | source << 16. A link detaches all its
 * probes with one wait where a perf event per probe waits once each (seconds at exit). */

/* The entry of every heap function of a module (returns: alloc_return, on a return link). */
int heap_entry(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u64 cookie = bpf_get_attach_cookie(ctx);
    u32 api = (u32)cookie & 0xffff, src = (u32)(cookie >> 16);
    if (api == AS_API_FREE) {
        free_arg1(ctx);
        return 0;
    }
    u64 size = 0, arg = 0;
    if (!heap_args(ctx, api, &size, &arg))
        return mallctl_entered(ctx, api, src);
    return enter_state(ctx, thread_state(BPF_LOCAL_STORAGE_GET_F_CREATE), as_api_call(api), size, arg, 0, src);
}

#ifdef AS_SESSION
/* --- uprobe session (kernel 6.13+; sampled mode) --------------------------
 * One program for the entry and the return of every heap function, attached through a
 * uprobe_multi link per module (tracer/bpf/attach.py): the cookie of each probed address says which
 * call it is (enum as_api | source << 16). The entry decides whether the call is sampled and
 * returns 1 when its return is not needed — the kernel then sets no return probe for that call
 * (no trap): an unsampled allocation costs one trap, not two. Nested and tail-jumped calls skip
 * their return as well (the outermost call counts them once). On the return, the probed
 * address (bpf_get_func_ip) differs from the instruction pointer (the caller's). */
int heap_session(struct pt_regs *ctx)
{
    if (AS_FLOOR)
        return 0; /* the trap floor keeps every return probe: the three traps of classic probes */
    if (PT_REGS_IP(ctx) != bpf_get_func_ip(ctx))
        return alloc_leave(ctx, 1);
    if (!is_target())
        return 1;
    u64 cookie = bpf_get_attach_cookie(ctx);
    u32 api = (u32)cookie & 0xffff, src = (u32)(cookie >> 16);
    u64 size = 0, arg = 0;
    if (api == AS_API_FREE) {
        free_arg1(ctx);
        return 1;
    }
    if (!heap_args(ctx, api, &size, &arg))
        return 1;
    api = as_api_call(api);
    struct as_inflight *cur = thread_state(BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!cur) {
        count(AS_LOST_INFLIGHT_FULL, 1);
        return 1;
    }
    u64 sp = PT_REGS_SP(ctx);
    if (cur->sp && cur->unsampled != AS_CALL_UNWATCHED) {
        /* A call whose return is watched is open: this one is nested in it (deeper) or
         * tail-jumped to from it (same sp), counted once by the outer call; no return needed. */
        if (sp <= cur->sp) {
            count(AS_CNT_NESTED, 1);
            return 1;
        }
        count(AS_LOST_STALE_ENTRY, 1);
    }
    /* An unwatched (unsampled) call's state is simply replaced: a call nested in it gets its own
     * chance to be sampled, the outer one having had none counted. */
    u32 unsampled = 0;
#ifdef AS_SAMPLE_BYTES
    if (api != AS_API_MALLOC_TRIM && !sample_keep(size)) {
        /* Not sampled. A realloc still needs its return when its old block is tracked (the
         * return frees it, unless the call fails); any other call does not. */
        count(AS_CNT_UNSAMPLED, 1);
        if (!((api == AS_API_REALLOC || api == AS_API_REALLOCARRAY) && arg && live.lookup(&arg))) {
            /* The state stays, unwatched, so that the mmap or brk this call may make is known
             * to be the allocator's (current_api), not the program's. */
            u64 ra = 0;
            bpf_probe_read_user(&ra, sizeof(ra), (void *)sp);
            open_state(cur, sp, api, size, arg, 0, src, AS_CALL_UNWATCHED);
            cur->ra = ra;
            return 1;
        }
        unsampled = AS_CALL_FREES_ONLY;
    }
#endif
    open_state(cur, sp, api, size, arg, 0, src, unsampled);
    return 0;
}
#endif

/* --- the in-process sampler's markers (--inject; tracer/inject/agent/agent.c) ------------------------
 * The agent decided in the process that this block is sampled: as_mark_alloc(p, size, weight,
 * cookie, fp) is called from the hook, fp its frame (the caller's %rbp at [fp], the return address
 * at [fp + 8], the caller's %rsp fp + 16): the stack starts at the hook's caller, exactly as at an
 * allocator's return probe. weight: the bytes the block stands for (max(size, N)). */
int mark_alloc(struct pt_regs *ctx)
{
    if (!is_target())
        return 0;
    u64 p = PT_REGS_PARM1(ctx), weight = PT_REGS_PARM3(ctx), cookie = PT_REGS_PARM4(ctx);
    u64 fp = PT_REGS_PARM5(ctx), bp = 0, ra = 0;
    bpf_probe_read_user(&bp, sizeof(bp), (void *)fp);
    bpf_probe_read_user(&ra, sizeof(ra), (void *)(fp + 8));
    if (p == 0)
        return 0;
    alloc_done_at(ctx, current_tid(), p, weight, (u32)cookie & 0xffff, bpf_ktime_get_ns(), (u32)(cookie >> 16), 0, ra,
                  fp + 16, bp, 1);
    return 0;
}

/* as_mark_free(p, cookie): a sampled block's free (the agent found it in its set) */
int mark_free(struct pt_regs *ctx)
{
    if (is_target())
        free_arg1(ctx);
    return 0;
}
