/* allocscope: layouts shared by the BPF program (allocscope.c) and the tracer.
 *
 * This header is the single source of truth for every map key/value and ring
 * event. tracer/base/layout.py mirrors it with ctypes, and tests/test_layout.py
 * checks that the mirror's sizes equal the ctypes classes BCC derives from
 * this file. Change both together and bump TRACE_FORMAT_VERSION when a
 * change reaches the trace files.
 *
 * Only fixed-width types, explicit padding, no bitfields.
 */
#ifndef ALLOCSCOPE_H
#define ALLOCSCOPE_H

#ifndef AS_MAX_DEPTH
#define AS_MAX_DEPTH 64 /* user frames kept per stack */
#endif

/* Allocator API that made an allocation (as_live.api, as_inflight.api). */
enum as_api {
    AS_API_NONE = 0,
    AS_API_MALLOC = 1,
    AS_API_CALLOC = 2,
    AS_API_REALLOC = 3,
    AS_API_REALLOCARRAY = 4,
    AS_API_POSIX_MEMALIGN = 5,
    AS_API_ALIGNED_ALLOC = 6, /* also memalign when both share one address */
    AS_API_MEMALIGN = 7,
    AS_API_VALLOC = 8,
    AS_API_PVALLOC = 9,
    AS_API_FREE = 10,
    AS_API_MALLOC_TRIM = 11,
    AS_API_MMAP = 12, /* syscalls seen outside any allocator call */
    AS_API_BRK = 13,
    AS_API_MALLCTL = 14, /* jemalloc's mallctl(name, ...): a purge call (as malloc_trim) when the name asks one */
    /* The CUDA driver API (libcuda.so.1): its own per-thread call state (cu_inflight), so the
     * driver's own mallocs inside a call still count as heap allocations. */
    AS_API_CU_ALLOC = 20,         /* cuMemAlloc_v2, cuMemAllocAsync, cuMemAllocFromPoolAsync: *dptr */
    AS_API_CU_ALLOC_PITCH = 21,   /* cuMemAllocPitch_v2: *dptr, *pPitch x Height bytes */
    AS_API_CU_CREATE = 22,        /* cuMemCreate: *handle (virtual memory management) */
    AS_API_CU_HOST_ALLOC = 23,    /* cuMemHostAlloc, cuMemAllocHost_v2: *pp, pinned host memory */
    AS_API_CU_HOST_REGISTER = 24, /* cuMemHostRegister_v2: p, existing host memory pinned */
    AS_API_CU_MANAGED = 25,       /* cuMemAllocManaged: *dptr, managed (host-mapped) memory */
    AS_API_CU_FREE = 26,          /* cuMemFree_v2, cuMemFreeAsync: dptr (device or managed) */
    AS_API_CU_RELEASE = 27,       /* cuMemRelease: handle */
    AS_API_CU_FREE_HOST = 28,     /* cuMemFreeHost: p */
    AS_API_CU_UNREGISTER = 29,    /* cuMemHostUnregister: p */
    AS_API_CUSTOM = 30,           /* a user's allocation function (--alloc-fn) */
    AS_API_CUSTOM_FREE = 31,      /* a user's free function (--free-fn) */
    AS_API_MAX = 32,
};

/* Counters (index into the per-CPU `counters` array). Losses first. */
enum as_counter {
    AS_LOST_LIVE_FULL = 0,    /* live map full: allocation not tracked */
    AS_LOST_LIVE_FULL_BYTES,  /* ... and its bytes */
    AS_LOST_STACK_FULL,       /* stack map full: site recorded as "[stack lost]" */
    AS_LOST_STACK_ERR,        /* bpf_get_stack failed */
    AS_LOST_SITE_FULL,        /* site map full: bytes not attributed to a site */
    AS_LOST_INFLIGHT_FULL,    /* per-thread entry state map full */
    AS_LOST_UNMATCHED_RET,    /* return probe without its entry (probe went live mid-call) */
    AS_LOST_STALE_ENTRY,      /* entry state overwritten: its return was never seen */
    AS_LOST_RING_FULL,        /* ring buffer full: syscall/thread event dropped */
    AS_LOST_FLOW_FULL,        /* flow map full */
    AS_LOST_STACK_TRUNCATED,  /* DWARF unwinding stopped early (depth, unreadable stack, CFI rule) */
    AS_LOST_STACK_PENDING,    /* DWARF unwinding reached a module whose rows were still being built */
    AS_LOST_COUNT,            /* marker: counters below are not losses */
    AS_CNT_FREE_UNKNOWN = 16, /* free() of a block allocated before attach (ignored) */
    AS_CNT_FREE_NULL,         /* free(NULL) */
    AS_CNT_ALLOCS,            /* allocations tracked */
    AS_CNT_FREES,             /* frees matched */
    AS_CNT_NESTED,            /* allocator calls nested in another (counted once) */
    AS_CNT_FAILED,            /* allocator call returned NULL / error */
    AS_CNT_EVENTS,            /* ring events submitted */
    AS_CNT_UNSAMPLED = 24,    /* --sample-bytes: allocations not sampled */
    AS_CNT_FAULTS,            /* residency mode: user page faults seen (before sampling) */
    AS_CNT_STACK_CACHED,      /* stacks taken from the per-thread stack cache (not unwound) */
    AS_CNT_REGION_OPS,        /* mmap-family calls accounted in the kernel (no event) */
    AS_CNT_SLOW,              /* mmap-family calls of a rare shape handed to the tracer (events) */
    AS_CNT_FAULT_SAMPLES,     /* residency mode: sampled page faults (one in AS_FAULT_SAMPLE) */
    AS_CNT_WAITS,             /* target threads blocking (sched_switch out, sleeping or D) */
    AS_CNT_WAITS_SHORT,       /* ... back on-CPU sooner than the wait threshold: counted, not stacked */
    AS_CNT_WAIT_SHORT_NS,     /* ... their time off-CPU, summed */
    AS_CNT_WAIT_STACK_MEMO,   /* wait stacks taken from the thread's last wait (same ip, sp, bp) */
    AS_LOST_WAIT_FULL,        /* waits map full: a long wait not attributed to a stack */
    AS_CNT_CTL_SKIPPED,       /* jemalloc mallctl calls that asked no purge (statistics): not reported */
    AS_CNT_MAX = 40,
};

/* What a tracked allocation is (as_site_key.source, as_region.source). */
enum as_source {
    AS_SRC_HEAP = 0,         /* an allocator call (malloc family) */
    AS_SRC_MMAP = 1,         /* an anonymous private mapping made outside any allocator call */
    AS_SRC_BRK = 2,          /* the break moved up outside any allocator call */
    AS_SRC_FAULT = 3,        /* residency mode: sampled first touches (fault_sites) */
    AS_SRC_SHMEM = 4,        /* a shared mapping: MAP_SHARED|MAP_ANONYMOUS, memfd, tmpfs (/dev/shm) */
    AS_SRC_CUDA_PINNED = 5,  /* pinned host memory: cuMemHostAlloc..., or a map of /dev/nvidiactl */
    AS_SRC_CUDA_MANAGED = 6, /* cuMemAllocManaged, or a map of /dev/nvidia-uvm */
    AS_SRC_DEVICE = 7,       /* a map of another device file (/dev/dri, /dev/kfd, ...) */
    AS_SRC_CUDA_DEVICE = 8,  /* GPU memory (cuMemAlloc..., cuMemCreate): never host memory */
    AS_SRC_MAX = 16,
    /* From here on, ids the tracer gives out per recording (meta.json `sources`): the heap of
     * each further allocator (heap:jemalloc:_rjem_ ...) and each --alloc-fn (custom:SYMBOL). */
    AS_SRC_DYNAMIC = 16,
};

/* dev_live key kind of the blocks of the users' allocation functions (one key space for all). */
#define AS_CUSTOM_KIND 0x10000u

/* Ring event types. */
enum as_event_type {
    AS_EV_MMAP = 1,
    AS_EV_MUNMAP = 2,
    AS_EV_MREMAP = 3,
    AS_EV_BRK = 4,
    AS_EV_MADVISE = 5,
    AS_EV_TRIM = 6,        /* malloc_trim: ts = start, len2 = duration ns, ret = return value */
    AS_EV_THREAD_NAME = 7, /* comm of tid changed (comm = new name) */
    AS_EV_THREAD_EXIT = 8, /* tid exited (comm = last name) */
    AS_EV_EXEC = 9,        /* the process exec'd another program */
    AS_EV_CODE = 10,       /* a file mapped executable (a library loaded): the tracer reads the maps */
    AS_EV_PEAK = 11,       /* live total past the wake threshold: addr = total, len = threshold */
    AS_EV_PYSTACK = 12,    /* a stack with Python frames stored (addr = its id): read its code objects now */
    AS_EV_PYTHREAD = 13,   /* the probe found tid's PyThreadState (addr) itself: the tracer's walk owns it */
};
/* AS_EV_MMAP .. AS_EV_BRK are the rare shapes the kernel side does not account itself (a
 * partial munmap, MAP_FIXED, an mremap it cannot follow, brk shrinking tracked pages): the
 * tracer replays them (tracer/record/regions.py) after taking the regions they touch out of the
 * `regions` map. Their ts_ns is the syscall's entry time. */

/* Stack flags. */
#define AS_STACK_SYSCALL 1u /* taken in a syscall: `extra` is the word at the user sp */

/* A user stack. Key of `stacks` is a 64-bit hash of (flags, extra, ips[0..depth)). */
struct as_stack {
    __u32 depth;
    __u32 flags;
    __u64 extra; /* AS_STACK_SYSCALL: candidate return address read at the user sp */
    __u64 ips[AS_MAX_DEPTH];
};

/* Value of `live`: one outstanding allocation, keyed by its address. */
struct as_live {
    __u64 size;     /* bytes requested */
    __u64 stack_id; /* key into `stacks` (0: stack lost) */
    __u64 ts_ns;    /* CLOCK_MONOTONIC of the allocation */
    __u32 tid;      /* allocating thread */
    __u16 api;      /* enum as_api */
    __u16 source;   /* enum as_source or a dynamic id: the site it is charged to */
};

/* Key/value of `sites`: cumulative counters per (stack, allocating thread, source). */
struct as_site_key {
    __u64 stack_id;
    __u32 tid;
    __u32 source; /* enum as_source */
};

struct as_site {
    __u64 alloc_bytes;
    __u64 alloc_count;
    __u64 free_bytes; /* frees of blocks this (stack, tid) allocated, by any thread */
    __u64 free_count;
    __u64 peak_live_bytes; /* max of alloc_bytes - free_bytes seen at an allocation */
    __u64 gen;             /* the generation its key was last named in (changes.h); not a counter */
};

/* Value of `site_chg` (changes.h): a site key named in generation `gen`. */
struct as_change {
    __u64 stack_id;
    __u32 tid;
    __u32 source;
    __u64 gen; /* written last: the slot holds a key of this generation */
};

/* Key of `dev_live`: GPU memory and pinned registrations, which are no new host addresses
 * (a device pointer, a cuMemCreate handle, a cuMemHostRegister'd range: another key space). */
struct as_dev_key {
    __u64 value;
    __u32 kind; /* enum as_api of the allocating call */
    __u32 pad;
};

/* Key/value of `flows`: frees by (allocating thread, freeing thread). */
struct as_flow_key {
    __u32 alloc_tid;
    __u32 free_tid;
};

struct as_flow {
    __u64 bytes;
    __u64 count;
    __u64 wait_ns_sum; /* sum over frees of (free time - allocation time) */
    __u64 wait_ns_max;
};

/* Value of `inflight`: a thread between an allocator entry and its return. */
struct as_inflight {
    __u64 sp;        /* user sp at the outermost entry; its return has sp + 8 */
    __u64 size;      /* requested bytes (0 for free/trim); cuMemAllocPitch: Height */
    __u64 arg;       /* realloc: old pointer; posix_memalign: memptr; CUDA: the out pointer or handle */
    __u64 arg2;      /* cuMemAllocPitch: pPitch */
    __u64 ts_ns;     /* entry time */
    __u32 api;       /* enum as_api */
    __u16 nest;      /* allocator calls made deeper on the stack inside this one */
    __u16 tail;      /* allocator functions tail-jumped to from this one (same sp) */
    __u32 source;    /* the allocator (or --alloc-fn) the outermost call belongs to */
    __u32 unsampled; /* uprobe session, sampled mode: AS_CALL_FREES_ONLY, AS_CALL_UNWATCHED (below) */
    __u64 ra;        /* AS_CALL_UNWATCHED: the return address at entry (the word at sp) */
};
/* as_inflight.unsampled: 0, a sampled call (its return closes the state). AS_CALL_FREES_ONLY: an
 * unsampled realloc whose return frees its tracked old block. AS_CALL_UNWATCHED: an unsampled
 * call with no return probe: nothing closes the state, so it counts as open only while the
 * word at sp is still its return address and the thread's sp is below it (current_api). */
#define AS_CALL_FREES_ONLY 1
#define AS_CALL_UNWATCHED 2

/* Value of `custom_fns` (key: the probed address): a user's allocation or free function
 * (--alloc-fn / --free-fn). Argument numbers are 0-based; AS_ARG_NONE: not given. */
#define AS_ARG_NONE 0xff
struct as_custom {
    __u32 source;   /* its dynamic source id (custom:SYMBOL) */
    __u8 size_arg;  /* the size, or with count_arg the element size */
    __u8 count_arg; /* calloc-like: count */
    __u8 out_arg;   /* the pointer is stored at *argM and the return value is a status (0: ok) */
    __u8 ptr_arg;   /* a free function: the pointer */
};

/* Value of `sysargs`: a thread between a syscall's entry and exit. */
struct as_sysargs {
    __u64 a0, a1, a2, a3, a4;
    __u64 ts_ns; /* entry time */
    __s64 rss;   /* anon RSS (bytes) at entry: munmap, madvise, brk */
    __u32 nr;
    __u32 pad;
};

/* Value of `regions` (key: start address, page aligned): memory the target mapped outside any
 * allocator call (or the break it moved up), accounted in the kernel. A region is one
 * allocation; a munmap from its start trims or frees it here. */
struct as_region {
    __u64 end;
    __u64 stack_id;
    __u64 ts_ns; /* when it was mapped (syscall exit) */
    __u32 tid;
    __u32 source; /* enum as_source */
};

/* Key/value of `releases`: memory handed back to the kernel (munmap, madvise, brk shrink),
 * per (thread, kind, allocator call it ran inside), measured as the drop of the target's
 * anonymous RSS between the syscall's entry and exit. Cumulative. */
struct as_release_key {
    __u32 tid;
    __u16 kind;     /* enum as_event_type: AS_EV_MUNMAP, AS_EV_MADVISE, AS_EV_BRK */
    __u16 api;      /* enum as_api of the allocator call, AS_API_NONE outside one */
    __u64 stack_id; /* munmap of a region mapped outside the allocators: the stack that mapped it
                     * (its first region); 0 otherwise */
};

struct as_release {
    __u64 calls;
    __u64 requested_bytes; /* lengths asked for (0 for brk) */
    __s64 released_bytes;  /* sum of anon RSS before - after */
    __u64 ns;              /* time in the syscall, entry to exit */
};

/* Value of `offcpu` (key: tid): a target thread that blocked (sched_switch out while sleeping,
 * S, or uninterruptible, D) and is not back on-CPU yet, or (ts_ns 0) one that is back. */
struct as_offcpu {
    __u64 ts_ns;    /* when it blocked; 0: running again */
    __u64 stack_id; /* its user stack then */
    __u32 state;    /* sched_switch's prev_state: 1 S, 2 D */
    __u32 pad;
};

/* Key and value of `waits`: the waits at least the threshold long, per (stack, thread). */
struct as_wait_key {
    __u64 stack_id;
    __u32 tid;
    __u32 pad;
};

struct as_wait {
    __u64 count;
    __u64 total_ns;
    __u64 max_ns;
};

/* Value of `tlb_flushes` (per CPU, key: tlb:tlb_flush's reason, 0..5): TLB flushes on the
 * target's threads (a remote shootdown counts on the CPU it interrupts, when a target thread runs
 * there). */
struct as_tlb {
    __u64 flushes;
    __u64 pages; /* of the ranged flushes */
    __u64 full;  /* flushes of everything (TLB_FLUSH_ALL) */
};

/* Value of `wait_memo` (key: tid): the registers and stack of the thread's last AS_WAIT_WAYS
 * waits at different places (a worker blocks in a few: its semaphore, its channel, a sleep). */
#define AS_WAIT_WAYS 4
struct as_wait_way {
    __u64 ip, sp, bp;
    __u64 stack_id;
};

struct as_wait_memo {
    struct as_wait_way way[AS_WAIT_WAYS];
    __u32 next; /* the way the next new place replaces */
    __u32 pad;
};

/* Ring event. */
struct as_event {
    __u32 type; /* enum as_event_type */
    __u32 tid;
    __u64 ts_ns;
    __u64 addr;  /* mmap/munmap/code: start; mremap: old; brk: new break; trim: pad arg */
    __u64 len;   /* length; mremap: old length; brk: the break before; trim: anon RSS at entry */
    __u64 addr2; /* mremap: new address; trim: anon RSS at return */
    __u64 len2;  /* mremap: new length; trim: duration ns */
    __u64 stack_id;
    __s64 ret;    /* syscall / malloc_trim return value */
    __u32 flags;  /* mmap/mremap flags; madvise: advice */
    __u32 prot;   /* mmap prot */
    __s32 fd;     /* mmap fd */
    __u32 in_api; /* enum as_api of the allocator call this happened inside, 0: none */
    __u32 source; /* AS_EV_MMAP: enum as_source it is tracked as, 0: not tracked */
    __u32 pad;
    char comm[16];
};

/* --- DWARF unwinding (probes/unwind_dwarf.h, tracer/unwind/unwinder.py) ----------------------------
 * User space turns .eh_frame/.debug_frame of every executable mapping into rows (`urows`, one
 * contiguous slice per module sorted by file offset) and maps address ranges of the target to
 * slices (`umaps`, an LPM trie). */
/* unwound with CFI rows: `extra` bit i set = frame i was found by a frame-pointer step (no row
 * covered frame i-1) */
#define AS_STACK_DWARF 2u
#define AS_STACK_TRUNCATED 4u /* unwinding stopped before the outermost frame */

/* How a row finds the CFA (as_urow.cfa_type). */
enum as_cfa {
    AS_CFA_NONE = 0,        /* no CFI covers the pc: frame-pointer step */
    AS_CFA_RSP = 1,         /* CFA = rsp + 8 * cfa_off */
    AS_CFA_RBP = 2,         /* CFA = rbp + 8 * cfa_off */
    AS_CFA_PLT = 3,         /* PLT entry: CFA = rsp + 8, + 8 more when (rip & 15) >= cfa_off */
    AS_CFA_SIGNAL = 4,      /* __restore_rt: the interrupted registers are in the ucontext at rsp */
    AS_CFA_STOP = 5,        /* return address undefined: the outermost frame (_start, clone3) */
    AS_CFA_UNSUPPORTED = 6, /* any other rule (DWARF expression, CFA in another register) */
};
#define AS_RBP_UNKNOWN 0x80 /* as_urow.rbp_off: the caller's rbp cannot be recovered */

/* One unwind row, valid from file offset `pc` up to the next row's. Return address at CFA - 8. */
struct as_urow {
    __u32 pc;      /* file offset in the module */
    __s16 cfa_off; /* in units of 8 bytes (AS_CFA_PLT: the rip & 15 threshold) */
    __u8 cfa_type; /* enum as_cfa */
    __u8 rbp_off;  /* signed (BCC has no s8): caller's rbp saved at CFA + 8 * (s8)rbp_off;
                       0: rbp unchanged */
};

/* Key of `umaps` (LPM trie): a prefix of a target address, address bytes big-endian. */
struct as_umap_key {
    __u32 prefixlen;
    __u8 addr[8];
};

/* Value of `umaps`: file offset = address - bias; rows [begin, begin + count) of `urows`.
 * `module`: the module's slot in `upending` (given out by the tracer, < AS_UNWIND_MODULES).
 * AS_UMAP_PENDING in `flags`: the module's rows are not loaded yet (the tracer builds them once
 * stacks cross it): a stack that reaches it ends there, truncated, counted in upending[module]. */
struct as_umap {
    __u64 bias;
    __u32 begin;
    __u32 count;
    __u32 module;
    __u32 flags;
};
#define AS_UMAP_PENDING 1u

/* Value of `upending` (an array by module slot): stacks cut short at that module while it was
 * pending, and when (bpf_ktime_get_ns, CLOCK_MONOTONIC). Slot 0: `stacks` of all modules. */
struct as_upending {
    __u64 stacks;
    __u64 first_ns; /* 0: none yet */
    __u64 last_ns;
};

#endif /* ALLOCSCOPE_H */
