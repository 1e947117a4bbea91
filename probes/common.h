/* allocscope BPF, common.h: the maps every part uses, the target gate, counters.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_COMMON_H
#define AS_COMMON_H

#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "allocscope.h"

/* A load-time constant: the value is moved into a register the compiler cannot see through (an
 * empty asm), so it is never folded into other constants or code: the program is compiled once
 * with a marker value per constant, and the loader rewrites that one move for each recording
 * (tracer/bpf/prebuilt.py; the verifier then knows the value exactly, as if compiled in).
 * tracer/bpf/source.py wraps every value that depends on the kernel or the options in it. */
#define AS_K(v) as_k((u64)(v))
static __always_inline u64 as_k(u64 v)
{
    asm volatile("" : "+r"(v));
    return v;
}
#ifndef AS_LAUNCHED
#define AS_LAUNCHED 0 /* launch mode: ignore everything until the target's exec */
#endif
#ifndef AS_FLOOR
#define AS_FLOOR 0 /* the trap floor (bench/overhead.py): every program returns at once */
#endif

#if (AS_MAX_DEPTH & (AS_MAX_DEPTH - 1)) != 0
#error "AS_MAX_DEPTH must be a power of 2"
#endif

#ifndef AS_TGID
#error "AS_TGID must be defined"
#endif
#ifndef AS_MAX_LIVE
#error "AS_MAX_LIVE: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#ifndef AS_MAX_STACKS
#error "AS_MAX_STACKS: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#ifndef AS_MAX_SITES
#error "AS_MAX_SITES: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#ifndef AS_RING_PAGES
#error "AS_RING_PAGES: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#ifndef AS_PAGE_SIZE
#error "AS_PAGE_SIZE: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#define AS_MAX_THREADS 32768

BPF_F_TABLE("hash", u64, struct as_live, live, AS_MAX_LIVE, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u64, struct as_stack, stacks, AS_MAX_STACKS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct as_site_key, struct as_site, sites, AS_MAX_SITES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct as_flow_key, struct as_flow, flows, 65536, BPF_F_NO_PREALLOC);
/* Per-thread state between an allocator entry and its return: task-local storage, which the
 * kernel frees with the thread (no hash update or delete per call; sp == 0: no call open). */
BPF_TASK_STORAGE(inflight, struct as_inflight);
BPF_HASH(sysargs, u32, struct as_sysargs, AS_MAX_THREADS);
BPF_PERCPU_ARRAY(counters, u64, AS_CNT_MAX);
BPF_ARRAY(totals, s64, 8); /* 0: live bytes (heap API), 1: peak of 0, 2: bytes in `regions`,
                            * 3: regions, 4: CUDA host memory (pinned, managed) from the driver
                            * API, 5: GPU memory (device), 6: peak of 5, 7: the high-water
                            * wake threshold of 0 + 2 + 4 (set by the tracer; 0: off) */
/* GPU memory and pinned registrations (no new host addresses), keyed apart from `live`. */
BPF_F_TABLE("hash", struct as_dev_key, struct as_live, dev_live, AS_MAX_LIVE, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct as_stack, 1);
BPF_RINGBUF_OUTPUT(events, AS_RING_PAGES);

/* Set once the traced program is gone: it exec'd another program (whose allocations would
 * reach the same libc probes and tracepoints), or its last thread exited (its pid may be given
 * to a new process). Nothing of that pid is counted after. */
BPF_ARRAY(gone, u32, 1);

static __always_inline int target_gone(void)
{
    u32 zero = 0;
    u32 *g = gone.lookup(&zero);
    return g && *g;
}

/* --inject: the thread running the tracer's injected system calls while the agent is loaded
 * (tracer/inject/injection.py): its mmaps are the tracer's, not the program's (is_target_sys). Compiled
 * in every variant so that an --inject recording shares the compiled program with a sampled one. */
BPF_ARRAY(quiet_tid, u32, 1);

static __always_inline int injecting(void)
{
    u32 zero = 0;
    u32 *q = quiet_tid.lookup(&zero);
    return q && *q && *q == (u32)bpf_get_current_pid_tgid();
}

/* Launch mode (AS_LAUNCHED): the target is forked by the tracer and traced only once it has
 * exec'd, so the tracer's own pre-exec allocations in the child never count. */
BPF_ARRAY(armed, u32, 1);

static __always_inline int is_target(void)
{
    if (AS_FLOOR)
        return 0; /* the trap floor: every probe attached, every program returning at once */
    if ((bpf_get_current_pid_tgid() >> 32) != AS_TGID)
        return 0;
    if (AS_LAUNCHED) {
        u32 zero = 0;
        u32 *a = armed.lookup(&zero);
        if (!a || !*a)
            return 0;
    }
    return !target_gone();
}
#define is_target_sys() (is_target() && !injecting()) /* the mmap-family syscall programs */

static __always_inline u32 current_tid(void)
{
    return (u32)bpf_get_current_pid_tgid();
}

static __always_inline struct as_inflight *thread_state(u64 flags)
{
    return inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, flags);
}

/* The CUDA driver API's own call state: a driver call and the mallocs it makes inside nest in
 * separate states, so both are counted (each once). */
BPF_TASK_STORAGE(cu_inflight, struct as_inflight);

static __always_inline struct as_inflight *cu_state(u64 flags)
{
    return cu_inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, flags);
}

/* What an allocation made by `api` is (enum as_source), and whether it is GPU memory or a
 * registration (`dev_live`) rather than a new host block (`live`). */
static __always_inline u32 api_source(u32 api)
{
    switch (api) {
    case AS_API_CU_ALLOC:
    case AS_API_CU_ALLOC_PITCH:
    case AS_API_CU_CREATE:
        return AS_SRC_CUDA_DEVICE;
    case AS_API_CU_HOST_ALLOC:
    case AS_API_CU_HOST_REGISTER:
        return AS_SRC_CUDA_PINNED;
    case AS_API_CU_MANAGED:
        return AS_SRC_CUDA_MANAGED;
    default:
        return AS_SRC_HEAP;
    }
}

/* The key kind of a dev_live entry: device pointers (cuMemAlloc*, freed by cuMemFree*),
 * handles (cuMemCreate / cuMemRelease), registrations (cuMemHostRegister / Unregister); 0: a
 * host block in `live`. */
static __always_inline u32 dev_kind(u32 api)
{
    if (api == AS_API_CU_ALLOC || api == AS_API_CU_ALLOC_PITCH)
        return AS_API_CU_ALLOC;
    if (api == AS_API_CU_CREATE || api == AS_API_CU_HOST_REGISTER)
        return api;
    return 0;
}

static __always_inline void count(u32 idx, u64 n)
{
    u64 *c = counters.lookup(&idx);
    if (c)
        *c += n; /* per-CPU: no atomics needed */
}

/* [lo, hi) of the target's uprobe trampoline page ("[uprobes]" in its maps, written by the tracer;
 * 0: not mapped yet, the kernel's usual place, the top page below TASK_SIZE on 4-level paging).
 * Another tool's return probe on the same function puts the trampoline's address in place of
 * the return address of every call, ours included. */
BPF_ARRAY(xol_cfg, u64, 2);

static __always_inline int is_trampoline(u64 word)
{
    u32 k0 = 0, k1 = 1;
    u64 *lo = xol_cfg.lookup(&k0), *hi = xol_cfg.lookup(&k1);
    if (lo && hi && *hi)
        return word >= *lo && word < *hi;
    return word >= 0x7fffffffe000ULL && word < 0x7ffffffff000ULL;
}

#endif /* AS_COMMON_H */
