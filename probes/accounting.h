/* allocscope BPF, accounting.h: the live-block table, per-(stack, thread, source) site counters, flows,
 * totals.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_ACCOUNTING_H
#define AS_ACCOUNTING_H
#include "common.h"
#include "changes.h"

/* --- accounting ---------------------------------------------------------- */

/* The high-water wake (totals[7], set by the tracer): once the live total (heap API + regions
 * + CUDA host memory, the reports' `live_bytes`) passes it, one AS_EV_PEAK event wakes the tracer,
 * which reads the per-stack counters at once (a peak snapshot, tracer/record/peaks.py) and sets the next
 * threshold: its reading + the margin. 0: disarmed (between a wake and the tracer's re-arm, which
 * bounds the rate to one wake per read). Racy like the peak: two CPUs may both wake it. */
static __always_inline void peak_watch(void)
{
    u32 k0 = 0, k2 = 2, k4 = 4, k7 = 7;
    s64 *th = totals.lookup(&k7);
    if (!th || *th <= 0)
        return;
    s64 *a = totals.lookup(&k0);
    s64 *b = totals.lookup(&k2);
    s64 *c = totals.lookup(&k4);
    if (!a || !b || !c)
        return;
    s64 now = *a + *b + *c, was = *th;
    if (now <= was)
        return;
    *th = 0;
    struct as_event *e = events.ringbuf_reserve(sizeof(struct as_event));
    if (!e) {
        count(AS_LOST_RING_FULL, 1);
        *th = was; /* the next allocation tries again */
        return;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = AS_EV_PEAK;
    e->tid = (u32)bpf_get_current_pid_tgid();
    e->ts_ns = bpf_ktime_get_ns();
    e->addr = (u64)now;
    e->len = (u64)was;
    events.ringbuf_submit(e, 0);
    count(AS_CNT_EVENTS, 1);
}

static __always_inline void totals_add(s64 delta)
{
    u32 k0 = 0, k1 = 1;
    s64 *live_b = totals.lookup(&k0);
    s64 *peak_b = totals.lookup(&k1);
    if (!live_b || !peak_b)
        return;
    s64 now = __sync_fetch_and_add(live_b, delta) + delta;
    if (delta > 0 && now > *peak_b)
        *peak_b = now; /* racy max: may miss a concurrent peak by one block */
    if (delta > 0)
        peak_watch();
}


/* Live-bytes totals of what an allocation is: heap (the malloc family of every allocator),
 * CUDA host memory, GPU. A user's allocation function is a layer above them (its pool's slabs
 * are counted where they were allocated): no total. */
static __always_inline void source_totals(u32 api, u32 src, s64 delta)
{
    if (api == AS_API_CUSTOM || api == AS_API_CU_HOST_REGISTER)
        return; /* a layer above: a pool's slab, a registered buffer, are counted where allocated */
    if (src != AS_SRC_CUDA_DEVICE && src != AS_SRC_CUDA_PINNED && src != AS_SRC_CUDA_MANAGED) {
        totals_add(delta);
        return;
    }
    u32 k = src == AS_SRC_CUDA_DEVICE ? 5 : 4, kp = 6;
    s64 *v = totals.lookup(&k);
    if (!v)
        return;
    s64 now = __sync_fetch_and_add(v, delta) + delta;
    if (k == 4 && delta > 0)
        peak_watch();
    if (k == 5 && delta > 0) {
        s64 *peak = totals.lookup(&kp);
        if (peak && now > *peak)
            *peak = now;
    }
}

/* One free by thread `tid` of `bytes` allocated by `alloc_tid` at `alloc_ts`; `count`: 1 when
 * it was the allocation's last byte. */
static __always_inline void flow_add(u32 alloc_tid, u32 tid, u64 bytes, u64 cnt, u64 alloc_ts, u64 now)
{
    struct as_flow_key fk = {.alloc_tid = alloc_tid, .free_tid = tid};
    struct as_flow *f = flows.lookup(&fk);
    if (!f) {
        struct as_flow zero = {};
        flows.insert(&fk, &zero);
        f = flows.lookup(&fk);
        if (!f) {
            count(AS_LOST_FLOW_FULL, 1);
            return;
        }
    }
    __sync_fetch_and_add(&f->bytes, bytes);
    if (cnt) {
        u64 wait = now > alloc_ts ? now - alloc_ts : 0;
        __sync_fetch_and_add(&f->count, 1);
        __sync_fetch_and_add(&f->wait_ns_sum, wait);
        if (wait > f->wait_ns_max)
            f->wait_ns_max = wait;
    }
    map_dirty(AS_DIRTY_FLOWS); /* after the change: the tracer reads the map once it moved */
}

/* The site of (stack, thread, source), created empty when new; 0 when the map is full. */
static __always_inline struct as_site *site_of(u64 sid, u32 tid, u32 source)
{
    struct as_site_key sk = {.stack_id = sid, .tid = tid, .source = source};
    struct as_site *s = sites.lookup(&sk);
    if (!s) {
        struct as_site zero = {};
        sites.insert(&sk, &zero);
        s = sites.lookup(&sk);
        if (!s)
            count(AS_LOST_SITE_FULL, 1);
    }
    return s;
}

/* A tracked allocation `c` freed by thread `tid`: its site, its total, its flow. */
static __always_inline void charge_free(struct as_live *c, u32 tid, u64 now)
{
    u32 src = c->source;
    count(AS_CNT_FREES, 1);
    source_totals(c->api, src, -(s64)c->size);
    struct as_site_key sk = {.stack_id = c->stack_id, .tid = c->tid, .source = src};
    struct as_site *s = sites.lookup(&sk);
    if (s) {
        __sync_fetch_and_add(&s->free_bytes, c->size);
        __sync_fetch_and_add(&s->free_count, 1);
        site_changed(c->stack_id, c->tid, src, s);
    }
    flow_add(c->tid, tid, c->size, 1, c->ts_ns, now);
}

/* Charge the free of `addr` by thread `tid` back to its allocation; `now` 0: read the clock only
 * once the block is known (a free probe's common case in sampled mode is a block never kept). */
static __always_inline void free_addr(u32 tid, u64 addr, u64 now)
{
    struct as_live *l = live.lookup(&addr);
    if (!l) {
        count(AS_CNT_FREE_UNKNOWN, 1);
        return;
    }
    if (!now)
        now = bpf_ktime_get_ns();
    struct as_live c = *l;
    if (live.delete(&addr) != 0)
        return; /* another thread freed it first (double free in the target) */
    charge_free(&c, tid, now);
}

/* The free of a GPU allocation or registration (`dev_live`); 0 when it was not tracked. */
static __always_inline int dev_free(u32 tid, u64 value, u32 kind, u64 now)
{
    struct as_dev_key k = {.value = value, .kind = kind};
    struct as_live *l = dev_live.lookup(&k);
    if (!l)
        return 0;
    struct as_live c = *l;
    if (dev_live.delete(&k) != 0)
        return 1;
    charge_free(&c, tid, now);
    return 1;
}

/* Keep one allocation made at stack `sid`: a host block in `live`, or GPU memory / a pinned
 * registration in `dev_live`. */
static __always_inline void record_alloc(u32 tid, u64 addr, u64 size, u32 api, u64 ts, u64 sid, u32 src)
{
    struct as_live l = {.size = size, .stack_id = sid, .ts_ns = ts, .tid = tid, .api = (u16)api, .source = (u16)src};
    u32 kind = api == AS_API_CUSTOM ? AS_CUSTOM_KIND : dev_kind(api);
    int err;
    if (kind) {
        struct as_dev_key k = {.value = addr, .kind = kind};
        err = dev_live.insert(&k, &l);
        if (err == -EEXIST) { /* the same value live already: a free we could not see */
            dev_free(tid, addr, kind, ts);
            err = dev_live.update(&k, &l);
        }
    } else {
        err = live.insert(&addr, &l);
        if (err == -EEXIST) {
            /* The address is live already: a free we could not see. Charge it, then replace. */
            free_addr(tid, addr, ts);
            err = live.update(&addr, &l);
        }
    }
    if (err != 0) {
        count(AS_LOST_LIVE_FULL, 1);
        count(AS_LOST_LIVE_FULL_BYTES, size);
        return;
    }
    count(AS_CNT_ALLOCS, 1);
    source_totals(api, src, (s64)size);

    struct as_site *s = site_of(sid, tid, src);
    if (!s)
        return;
    u64 ab = __sync_fetch_and_add(&s->alloc_bytes, size) + size;
    __sync_fetch_and_add(&s->alloc_count, 1);
    u64 fb = s->free_bytes;
    if (ab > fb && ab - fb > s->peak_live_bytes)
        s->peak_live_bytes = ab - fb;
    site_changed(sid, tid, src, s);
}

#endif /* AS_ACCOUNTING_H */
