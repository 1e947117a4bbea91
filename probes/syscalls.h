/* allocscope BPF program, syscalls.h: the syscall tracepoints of the mmap family, brk and madvise:
 * each exit dispatched to its accounting (regions.h) or, for the rare shapes, an event.
 *
 * Part of probes/allocscope.c: included there, in order, and inlined into it by
 * tracer/probe.py bpf_text (BCC rewrites map calls only in the main file). Layouts: allocscope.h. */

static __always_inline void mmap_exit(void *ctx, struct as_sysargs *a, u64 lo, u32 tid, u32 api, u64 now)
{
    u64 hi = page_up(lo + a->a1);
    u32 prot = (u32)a->a2, flags = (u32)a->a3;
    s32 fd = (s32)a->a4;
    u32 src = mmap_source(a, api);
    int code = (prot & AS_PROT_EXEC) && !(flags & AS_MAP_ANONYMOUS);
    int slow = (flags & AS_MAP_FIXED) && api == AS_API_NONE;
    u64 sid = 0;
    if (src) {
        sid = capture_syscall_stack(ctx);
        if (!slow && region_new(lo, hi, sid, tid, now, src) == 0) {
            untracked.delete(&lo);
            count(AS_CNT_REGION_OPS, 1);
            return;
        }
        slow = 1; /* MAP_FIXED, or its start is still a region: the tracer replays it */
    } else if (!(flags & AS_MAP_FIXED)) {
        untracked.update(&lo, &hi);
    }
    if (!slow && !code)
        return;
    struct as_event *e = slow ? slow_event(AS_EV_MMAP, tid, a, api) : new_event(AS_EV_CODE, tid);
    if (!e)
        return;
    e->addr = lo;
    e->len = a->a1;
    e->prot = prot;
    e->flags = flags;
    e->fd = fd;
    e->source = src;
    e->stack_id = sid;
    e->in_api = api;
    e->ret = (s64)lo;
    submit(e);
#if defined(AS_UNWIND_DWARF) && defined(AS_WAIT_EXEC)
    /* Launch mode: hold the main thread at each file mapped executable (the loader mapping a
     * library) until the tracer has mapped its unwind rows: the tracer is its ptrace parent, sees
     * the stop, loads, and resumes it with the signal suppressed (tracer/unwind.py). */
    if (code && fd >= 0 && tid == AS_TGID)
        bpf_send_signal_thread(19 /* SIGSTOP */);
#endif
}

static __always_inline void munmap_exit(struct as_sysargs *a, u32 tid, u32 api, u64 now)
{
    u64 lo = a->a0 & ~(u64)(AS_PAGE_SIZE - 1), hi = page_up(a->a0 + a->a1);
    if (api != AS_API_NONE || hi <= lo) {
        count_release(tid, AS_EV_MUNMAP, api, a->a1, a->rss, now - a->ts_ns, 0);
        untracked.delete(&lo);
        return; /* an allocator unmapping its own memory */
    }
    u64 sid = 0;
    u64 cur = unmap_regions(lo, hi, tid, now, &sid);
    count_release(tid, AS_EV_MUNMAP, api, a->a1, a->rss, now - a->ts_ns, sid);
    if (cur >= hi) {
        count(AS_CNT_REGION_OPS, 1);
        return;
    }
    struct as_event *e = slow_event(AS_EV_MUNMAP, tid, a, api);
    if (!e)
        return;
    e->addr = cur;
    e->len = hi - cur;
    submit(e);
}

static __always_inline void mremap_exit(struct as_sysargs *a, u64 nlo, u32 tid, u32 api, u64 now)
{
    if (api != AS_API_NONE)
        return; /* glibc's realloc moving its own mmapped chunk */
    if (remap_region(a, nlo, tid, now) == 0) {
        count(AS_CNT_REGION_OPS, 1);
        return;
    }
    struct as_event *e = slow_event(AS_EV_MREMAP, tid, a, api);
    if (!e)
        return;
    e->addr = a->a0;
    e->len = a->a1;
    e->addr2 = nlo;
    e->len2 = a->a2;
    e->flags = (u32)a->a3;
    submit(e);
}

static __always_inline void brk_exit(void *ctx, struct as_sysargs *a, u64 nb, u32 tid, u32 api, u64 now)
{
    u32 k0 = 0, k1 = 1;
    u64 *cur = brk_state.lookup(&k0);
    u64 *tracked = brk_state.lookup(&k1);
    if (!cur || !tracked)
        return;
    u64 old = *cur;
    *cur = nb;
    if (old == 0 || nb == old)
        return; /* not known before, or a query (brk(0)) */
    u64 sid = 0;
    if (nb > old) {
        u64 lo = page_up(old), hi = page_up(nb);
        if (api != AS_API_NONE || hi <= lo)
            return; /* malloc growing its heap */
        sid = capture_syscall_stack(ctx);
        *tracked = 1;
        if (region_new(lo, hi, sid, tid, now, AS_SRC_BRK) == 0) {
            count(AS_CNT_REGION_OPS, 1);
            return;
        }
    } else {
        count_release(tid, AS_EV_BRK, api, 0, a->rss, now - a->ts_ns, 0);
        if (!*tracked)
            return; /* no page of the break was ever a region */
    }
    struct as_event *e = slow_event(AS_EV_BRK, tid, a, api);
    if (!e)
        return;
    e->addr = nb;
    e->len = old;
    e->stack_id = sid;
    submit(e);
}

static __always_inline void syscall_exit(void *ctx, u32 nr, s64 ret)
{
    struct as_sysargs a = {};
    if (!pop_sysargs(nr, &a))
        return;
    if (ret < 0 && ret > -4096)
        return; /* failed: nothing changed */
    u32 tid = current_tid();
    u32 api = current_api();
    u64 now = bpf_ktime_get_ns();
    switch (nr) {
    case 9: /* mmap(addr, len, prot, flags, fd) -> addr */
        mmap_exit(ctx, &a, (u64)ret, tid, api, now);
        break;
    case 11: /* munmap(addr, len) */
        munmap_exit(&a, tid, api, now);
        break;
    case 25: /* mremap(old, old_len, new_len, flags, new_addr) -> new */
        mremap_exit(&a, (u64)ret, tid, api, now);
        break;
    case 12: /* brk(requested) -> new break */
        brk_exit(ctx, &a, (u64)ret, tid, api, now);
        break;
    case 28: /* madvise(start, len, advice) */
        count_release(tid, AS_EV_MADVISE, api, a.a1, a.rss, now - a.ts_ns, 0);
        break;
    default:
        break;
    }
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    if (!is_target())
        return 0;
    save_sysargs(9, args->addr, args->len, args->prot, args->flags, args->fd, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 9, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
    if (!is_target())
        return 0;
    save_sysargs(11, args->addr, args->len, 0, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_munmap)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 11, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mremap)
{
    if (!is_target())
        return 0;
    save_sysargs(25, args->addr, args->old_len, args->new_len, args->flags, args->new_addr, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mremap)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 25, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_brk)
{
    if (!is_target())
        return 0;
    save_sysargs(12, args->brk, 0, 0, 0, 0, rss_anon());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_brk)
{
    if (!is_target())
        return 0;
    syscall_exit(args, 12, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_madvise)
{
    if (!is_target())
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
    if (!is_target())
        return 0;
    syscall_exit(args, 28, args->ret);
    return 0;
}
