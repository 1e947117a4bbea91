/* allocscope BPF, regions.h: memory from the kernel, accounted here: regions (the mmap family's
 * allocations), their sites, releases, the break, what a mapping is tracked as.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_REGIONS_H
#define AS_REGIONS_H
#include "common.h"
#include "accounting.h"

/* --- memory from the kernel: syscall tracepoints ------------------------ */
/* Memory the target maps outside any allocator call (and the break it moves up) is accounted
 * here, page by page, with no event: `regions` holds one entry per allocation, keyed by its
 * start, and the common shapes — a region mapped, unmapped whole or from its start, moved or
 * resized by mremap, the break moved up — update the per-(stack, thread, source) sites, the
 * flows and the totals in place. The rare shapes (a munmap that does not start at a region, a
 * MAP_FIXED mapping, an mremap to a fixed address, the break shrinking over tracked pages, a
 * full map) go to the tracer as events (counted: n_slow); it takes the regions they touch out
 * of the map and replays them page-exact (tracer/record/regions.py). Syscalls made inside allocator
 * calls (glibc's mmapped chunks, heap trimming) belong to that call and are never regions.
 * Every release (munmap, madvise, brk down) is measured by the anonymous RSS it gave back and
 * summed per (thread, kind, allocator call) in `releases`. */
#ifndef AS_MAX_REGIONS
#error "AS_MAX_REGIONS: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#define AS_UNMAP_STEPS 8 /* regions one munmap may free here, back to back */
#define AS_MAP_FIXED 0x10
#define AS_MAP_ANONYMOUS 0x20
#ifndef AS_UVM_MAJOR
#define AS_UVM_MAJOR 0
#endif
#define AS_PROT_EXEC 4
#define AS_MREMAP_FIXED 2
#define AS_MREMAP_DONTUNMAP 4

BPF_F_TABLE("hash", u64, struct as_region, regions, AS_MAX_REGIONS, BPF_F_NO_PREALLOC);
/* Mappings seen made and not tracked (file mappings, PROT_NONE reservations, an allocator's own
 * chunks): start -> end. A munmap from the start of one is known to touch no tracked page and
 * needs no event (glibc's free() unmapping a chunk its malloc mapped: free has no call state).
 * Least recently used ones are dropped: their munmap then goes to the tracer, which finds
 * nothing tracked — slower, never wrong. The tracer deletes those a rare shape touches. */
BPF_TABLE("lru_hash", u64, u64, untracked, 4096);
/* Per region site: bytes the tracer freed in regions it took over (written by the tracer only),
 * so that a site's peak here is alloc - free - these. */
BPF_F_TABLE("hash", struct as_site_key, u64, site_ext, AS_MAX_REGIONS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct as_release_key, struct as_release, releases, 16384, BPF_F_NO_PREALLOC);
/* 0: the break (0: not known yet; the tracer seeds it from /proc), 1: != 0 once the break was a
 * region here (a shrink then goes to the tracer) */
BPF_ARRAY(brk_state, u64, 2);

static __always_inline u64 page_up(u64 n)
{
    return (n + AS_PAGE_SIZE - 1) & ~(u64)(AS_PAGE_SIZE - 1);
}

static __always_inline void save_sysargs(u32 nr, u64 a0, u64 a1, u64 a2, u64 a3, u64 a4, s64 rss)
{
    u32 tid = current_tid();
    struct as_sysargs a = {
        .a0 = a0, .a1 = a1, .a2 = a2, .a3 = a3, .a4 = a4, .ts_ns = bpf_ktime_get_ns(), .rss = rss, .nr = nr};
    sysargs.update(&tid, &a);
}

static __always_inline struct as_event *new_event(u32 type, u32 tid)
{
    struct as_event *e = events.ringbuf_reserve(sizeof(struct as_event));
    if (!e) {
        count(AS_LOST_RING_FULL, 1);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = type;
    e->tid = tid;
    e->ts_ns = bpf_ktime_get_ns();
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    return e;
}

static __always_inline void submit(struct as_event *e)
{
    events.ringbuf_submit(e, 0);
    count(AS_CNT_EVENTS, 1);
}

/* --inject: the agent's per-thread table (tracer/inject/agent/agent.h struct as_thread, keyed by the
 * thread pointer): while a hook's real call runs, the thread's slot names the call. Filled by the
 * tracer once the agent is loaded; threads[0] = 0 until then. */
struct as_agent_cfg {
    u64 threads;
    u32 bits, pad;
};
BPF_ARRAY(agent_cfg, struct as_agent_cfg, 1);

static __always_inline u32 agent_api(void)
{
#ifdef AS_OFF_TASK_FSBASE
    u32 zero = 0;
    struct as_agent_cfg *c = agent_cfg.lookup(&zero);
    if (!c || !c->threads || c->bits == 0 || c->bits > 30)
        return AS_API_NONE;
    u64 key = 0;
    bpf_probe_read_kernel(&key, sizeof(key), (char *)bpf_get_current_task_btf() + AS_OFF_TASK_FSBASE);
    if (!key)
        return AS_API_NONE;
    u64 mask = (1ULL << c->bits) - 1, h = ((key >> 4) * 0x9E3779B97F4A7C15ULL) >> (64 - c->bits);
    for (int i = 0; i < 8; i++) {
        u64 slot = c->threads + (((h + i) & mask) << 6), k = 0;
        if (bpf_probe_read_user(&k, sizeof(k), (void *)slot))
            return AS_API_NONE;
        if (k == key) {
            /* struct as_thread: sp at 16, ra at 24, api at 32. The call is still running while
             * the word at sp is its return address and the thread is deeper (agent.c nested). */
            u64 st[3] = {};
            if (bpf_probe_read_user(st, sizeof(st), (void *)(slot + 16)))
                return AS_API_NONE;
            u32 api = (u32)st[2];
            if (!api)
                return AS_API_NONE;
            struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
            u64 usp = 0, word = 0;
            bpf_probe_read_kernel(&usp, sizeof(usp), &regs->sp);
            if (usp && usp < st[0] && !bpf_probe_read_user(&word, sizeof(word), (void *)st[0]) && word == st[1])
                return api;
            return AS_API_NONE;
        }
        if (k == 0)
            return AS_API_NONE;
    }
#endif
    return AS_API_NONE;
}

/* The allocator or CUDA call the current thread is inside, AS_API_NONE outside any. */
static __always_inline u32 current_api(void)
{
    u32 injected = agent_api();
    if (injected)
        return injected;
    struct as_inflight *in = thread_state(0);
    if (in && in->sp && in->unsampled != AS_CALL_UNWATCHED)
        return in->api;
    if (in && in->sp) { /* an unsampled call in a uprobe session: is it still running? */
        struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
        struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
        u64 usp = 0, word = 0;
        bpf_probe_read_kernel(&usp, sizeof(usp), &regs->sp);
        if (usp && usp < in->sp && !bpf_probe_read_user(&word, sizeof(word), (void *)in->sp) &&
            (word == in->ra || is_trampoline(word)))
            return in->api;
    }
    struct as_inflight *cu = cu_state(0);
    return cu && cu->sp ? cu->api : AS_API_NONE; /* a user's pool function is a layer above: its
                                                    own mmaps stay the kernel layer's */
}

/* Pops the saved syscall arguments; 0 when the entry was not seen. */
static __always_inline int pop_sysargs(u32 nr, struct as_sysargs *out)
{
    u32 tid = current_tid();
    struct as_sysargs *a = sysargs.lookup(&tid);
    if (!a)
        return 0;
    if (a->nr != nr) {
        sysargs.delete(&tid);
        return 0;
    }
    *out = *a;
    sysargs.delete(&tid);
    return 1;
}

static __always_inline void region_totals(s64 bytes, s64 n)
{
    u32 k2 = 2, k3 = 3;
    s64 *b = totals.lookup(&k2);
    s64 *c = totals.lookup(&k3);
    if (b)
        __sync_fetch_and_add(b, bytes);
    if (c && n)
        __sync_fetch_and_add(c, n);
    if (bytes > 0)
        peak_watch();
}

/* Bytes newly held by a region site: alloc counters and its peak. */
static __always_inline void region_grew(u64 sid, u32 tid, u32 source, u64 bytes, u64 allocs)
{
    struct as_site *s = site_of(sid, tid, source);
    if (!s)
        return;
    u64 ab = __sync_fetch_and_add(&s->alloc_bytes, bytes) + bytes;
    if (allocs)
        __sync_fetch_and_add(&s->alloc_count, allocs);
    struct as_site_key sk = {.stack_id = sid, .tid = tid, .source = source};
    u64 fb = s->free_bytes;
    u64 *ext = site_ext.lookup(&sk);
    if (ext)
        fb += *ext;
    if (ab > fb && ab - fb > s->peak_live_bytes)
        s->peak_live_bytes = ab - fb;
    site_changed(sid, tid, source, s);
}

/* `bytes` of region `c` given back by thread `tid`; `last`: the region is gone. */
static __always_inline void region_freed(struct as_region *c, u64 bytes, u32 last, u32 tid, u64 now)
{
    region_totals(-(s64)bytes, last ? -1 : 0);
    struct as_site_key sk = {.stack_id = c->stack_id, .tid = c->tid, .source = c->source};
    struct as_site *s = sites.lookup(&sk);
    if (s) {
        __sync_fetch_and_add(&s->free_bytes, bytes);
        if (last)
            __sync_fetch_and_add(&s->free_count, 1);
        site_changed(c->stack_id, c->tid, c->source, s);
    }
    flow_add(c->tid, tid, bytes, last, c->ts_ns, now);
}

/* A new region [lo, hi); -1 when it cannot be kept here (its start is still a region: the
 * tracer has not replayed the unmap of the old one yet; or the map is full). */
static __always_inline int region_new(u64 lo, u64 hi, u64 sid, u32 tid, u64 now, u32 source)
{
    struct as_region r = {.end = hi, .stack_id = sid, .ts_ns = now, .tid = tid, .source = source};
    if (regions.insert(&lo, &r) != 0)
        return -1;
    region_totals((s64)(hi - lo), 1);
    region_grew(sid, tid, source, hi - lo, 1);
    return 0;
}

/* munmap [lo, hi): frees the regions that start at lo and, back to back, at each freed one's
 * end; the last one may lose only its head. Returns where it stopped: hi when [lo, hi) was
 * accounted here, less when the rest is for the tracer. */
static __always_inline u64 unmap_regions(u64 lo, u64 hi, u32 tid, u64 now, u64 *sid)
{
    u64 cur = lo;
#pragma clang loop unroll(disable)
    for (int i = 0; i < AS_UNMAP_STEPS; i++) {
        if (cur >= hi)
            break;
        struct as_region *r = regions.lookup(&cur);
        if (!r) {
            u64 *u = untracked.lookup(&cur);
            if (!u)
                break;
            u64 end = *u;
            if (end > hi) { /* its head: the rest stays untracked */
                u64 key = hi;
                untracked.update(&key, &end);
                untracked.delete(&cur);
                cur = hi;
                break;
            }
            untracked.delete(&cur);
            cur = end > cur ? end : hi;
            continue;
        }
        struct as_region c = *r;
        if (*sid == 0)
            *sid = c.stack_id; /* what the time of this munmap is charged to */
        if (c.end > hi) {
            /* its head: the rest stays, keyed by its new start */
            u64 key = hi;
            if (regions.insert(&key, &c) != 0)
                break;
            if (regions.delete(&cur) != 0) {
                regions.delete(&key);
                break;
            }
            region_freed(&c, hi - cur, 0, tid, now);
            cur = hi;
            break;
        }
        if (regions.delete(&cur) != 0)
            break;
        region_freed(&c, c.end - cur, 1, tid, now);
        cur = c.end;
    }
    return cur;
}

/* mremap of a whole region to a place the kernel chose (or in place): 0 when done here. */
static __always_inline int remap_region(struct as_sysargs *a, u64 nlo, u32 tid, u64 now)
{
    u64 olo = a->a0, ohi = page_up(a->a0 + a->a1), nhi = page_up(nlo + a->a2);
    if (a->a3 & (AS_MREMAP_FIXED | AS_MREMAP_DONTUNMAP))
        return -1;
    struct as_region *r = regions.lookup(&olo);
    if (!r || r->end != ohi)
        return -1;
    struct as_region c = *r;
    c.end = nhi;
    if (nlo != olo) {
        if (regions.insert(&nlo, &c) != 0)
            return -1;
        if (regions.delete(&olo) != 0) {
            regions.delete(&nlo);
            return -1;
        }
    } else {
        r->end = nhi;
    }
    u64 olen = ohi - olo, nlen = nhi - nlo;
    if (nlen > olen) { /* the new pages belong to the region that grew */
        region_totals((s64)(nlen - olen), 0);
        region_grew(c.stack_id, c.tid, c.source, nlen - olen, 0);
    } else if (nlen < olen) {
        region_freed(&c, olen - nlen, 0, tid, now);
    }
    return 0;
}

static __always_inline void count_release(u32 tid, u32 kind, u32 api, u64 len, s64 before, u64 ns, u64 sid)
{
    struct as_release_key k = {.tid = tid, .kind = (u16)kind, .api = (u16)api, .stack_id = sid};
    struct as_release *r = releases.lookup(&k);
    if (!r) {
        struct as_release zero = {};
        releases.insert(&k, &zero);
        r = releases.lookup(&k);
        if (!r)
            return;
    }
    __sync_fetch_and_add(&r->calls, 1);
    __sync_fetch_and_add(&r->requested_bytes, len);
    __sync_fetch_and_add(&r->released_bytes, before - rss_anon());
    __sync_fetch_and_add(&r->ns, ns);
    map_dirty(AS_DIRTY_RELEASES);
}

/* A rare shape for the tracer: the event, timed at the syscall's entry (regions it takes over
 * must be older). */
static __always_inline struct as_event *slow_event(u32 type, u32 tid, struct as_sysargs *a, u32 api)
{
    struct as_event *e = new_event(type, tid);
    if (!e)
        return 0;
    count(AS_CNT_SLOW, 1);
    e->ts_ns = a->ts_ns;
    e->in_api = api;
    return e;
}

#define AS_MAP_TYPE 0x0f /* MAP_SHARED 1, MAP_PRIVATE 2, MAP_SHARED_VALIDATE 3 */
#define AS_MAP_PRIVATE 2

#ifdef AS_OFF_TASK_FILES
/* What the file behind `fd` is, for a mapping of it: shared memory (tmpfs: memfd, /dev/shm;
 * hugetlbfs), a device (/dev/nvidiactl: major 195 minor 255, nvidia-uvm's dynamic major
 * AS_UVM_MAJOR, /dev/zero and the other mem devices 1), or 0: a regular file, not
 * tracked. /dev/nvidia0.. (major 195, minor < 255: doorbells, register windows) are `device`.
 * Read through the fd table at offsets from the kernel's BTF (tracer/bpf/kernel_btf.py). */
static __always_inline u32 fd_source(s32 fd, u32 flags)
{
    u64 task = bpf_get_current_task(), files = 0, fdt = 0, fds = 0, file = 0, inode = 0, sb = 0;
    u64 magic = 0;
    u32 max_fds = 0, rdev = 0;
    u16 mode = 0;
    if (fd < 0)
        return 0;
    bpf_probe_read_kernel(&files, sizeof(files), (void *)(task + AS_OFF_TASK_FILES));
    if (!files)
        return 0;
    bpf_probe_read_kernel(&fdt, sizeof(fdt), (void *)(files + AS_OFF_FILES_FDT));
    if (!fdt)
        return 0;
    bpf_probe_read_kernel(&max_fds, sizeof(max_fds), (void *)(fdt + AS_OFF_FDT_MAX_FDS));
    if ((u32)fd >= max_fds)
        return 0;
    bpf_probe_read_kernel(&fds, sizeof(fds), (void *)(fdt + AS_OFF_FDT_FD));
    bpf_probe_read_kernel(&file, sizeof(file), (void *)(fds + 8 * (u64)fd));
    if (!file)
        return 0;
    bpf_probe_read_kernel(&inode, sizeof(inode), (void *)(file + AS_OFF_FILE_INODE));
    if (!inode)
        return 0;
    bpf_probe_read_kernel(&mode, sizeof(mode), (void *)(inode + AS_OFF_INODE_MODE));
    if ((mode & 0170000) == 0020000) { /* S_ISCHR */
        bpf_probe_read_kernel(&rdev, sizeof(rdev), (void *)(inode + AS_OFF_INODE_RDEV));
        u32 major = rdev >> 20, minor = rdev & 0xfffff;
        if (major == 1) /* /dev/zero and friends: anonymous memory by another name (the 580
                         * driver's pinned memory is a rw-s map of /dev/zero) */
            return (flags & AS_MAP_TYPE) == AS_MAP_PRIVATE ? AS_SRC_MMAP : AS_SRC_SHMEM;
        if (major == 195 && minor == 255) /* /dev/nvidiactl */
            return AS_SRC_CUDA_PINNED;
        if (AS_UVM_MAJOR && major == AS_UVM_MAJOR)
            return AS_SRC_CUDA_MANAGED;
        return AS_SRC_DEVICE;
    }
    bpf_probe_read_kernel(&sb, sizeof(sb), (void *)(inode + AS_OFF_INODE_SB));
    if (!sb)
        return 0;
    bpf_probe_read_kernel(&magic, sizeof(magic), (void *)(sb + AS_OFF_SB_MAGIC));
    if ((u32)magic == 0x01021994 /* TMPFS_MAGIC */ || (u32)magic == 0x958458f6 /* HUGETLBFS_MAGIC */)
        return AS_SRC_SHMEM;
    return 0;
}
#else
static __always_inline u32 fd_source(s32 fd, u32 flags)
{
    return 0; /* this kernel's BTF does not describe the fd table: file mappings untracked */
}
#endif

/* What an mmap with these arguments is tracked as (enum as_source), 0: not tracked. Mappings
 * made inside an allocator or CUDA call belong to that call. */
static __always_inline u32 mmap_source(struct as_sysargs *a, u32 api)
{
    if (api != AS_API_NONE || a->a2 == 0 /* PROT_NONE: address space reserved, not memory */)
        return 0;
    u32 flags = (u32)a->a3;
    if (flags & AS_MAP_ANONYMOUS)
        return (flags & AS_MAP_TYPE) == AS_MAP_PRIVATE ? AS_SRC_MMAP : AS_SRC_SHMEM;
    if (a->a2 & AS_PROT_EXEC)
        return 0; /* code */
    return fd_source((s32)a->a4, flags);
}

#endif /* AS_REGIONS_H */
