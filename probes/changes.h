/* allocscope BPF program, changes.h: which sites changed since the tracer's last read (issue 33).
 *
 * A header (declarations only: maps, static inline helpers), included by accounting.h and
 * waits.h; inlined into probes/allocscope.c by tracer/bpf/source.py bpf_text. Layouts: allocscope.h.
 * The tracer's half: tracer/record/sitechanges.py.
 *
 * Every interval the tracer needs the sites that changed, not all of them: with 100k live sites
 * and a handful changing, reading and comparing the whole `sites` map is nearly all of its work.
 * So each change of a site also names its key, once per generation:
 *
 *   chg_ctl[0]  the generation now (set by the tracer; 0: off, nothing is named)
 *   chg_ctl[1]  keys named in generation g with g even (may pass the capacity: overflow)
 *   chg_ctl[2]  ... with g odd
 *   chg_ctl[3]  the capacity per generation (<= AS_SITE_CHANGES, set by the tracer)
 *   site_chg    2 x AS_SITE_CHANGES slots: [parity * AS_SITE_CHANGES + i], i < chg_ctl[1 + parity]
 *
 * A site remembers the generation it was last named in (as_site.gen): a change in a generation
 * it was already named in names nothing. The counters are changed first, the key named after,
 * its slot's `gen` stamped last. The tracer, to read generation g: reads the slots of g - 1
 * again (a program that was between its counter update and its slot write at the last read is
 * done by now), empties the buffer of g + 1 (the parity of g - 1), moves the generation to g + 1,
 * then reads the slots of g stamped g, and looks those keys up. A count past the capacity, or a
 * slot of g - 1 still not stamped, makes it read the whole map instead for that interval. Both
 * arrays are BPF_F_MMAPABLE: the tracer reads and writes them without a system call.
 *
 * Beside them, `chg_dirty` (per CPU): a counter per other cumulative map (releases, waits,
 * flows), bumped whenever it changes, so the tracer reads a map only when its counter moved. */
#ifndef AS_SITE_CHANGES
#define AS_SITE_CHANGES 65536 /* slots per generation (the tracer may use fewer) */
#endif
#define AS_MMAPABLE (1U << 10) /* BPF_F_MMAPABLE */

BPF_F_TABLE("array", u32, u64, chg_ctl, 4, AS_MMAPABLE);
BPF_F_TABLE("array", u32, struct as_change, site_chg, 2 * AS_SITE_CHANGES, AS_MMAPABLE);
BPF_PERCPU_ARRAY(chg_dirty, u64, 4); /* 0: releases, 1: waits, 2: flows */

#define AS_DIRTY_RELEASES 0
#define AS_DIRTY_WAITS 1
#define AS_DIRTY_FLOWS 2

static __always_inline void map_dirty(u32 idx)
{
    u64 *c = chg_dirty.lookup(&idx);
    if (c)
        *c += 1; /* per-CPU: no atomics needed */
}

/* Site `s` (key: stack, thread, source) changed: name its key in this generation, once. */
static __always_inline void site_changed(u64 sid, u32 tid, u32 source, struct as_site *s)
{
    u32 k0 = 0;
    u64 *gen = chg_ctl.lookup(&k0);
    if (!gen)
        return;
    u64 g = *gen;
    if (!g || s->gen == g)
        return;
    s->gen = g;
    u32 kc = 1 + (u32)(g & 1), kcap = 3;
    u64 *cnt = chg_ctl.lookup(&kc);
    u64 *cap = chg_ctl.lookup(&kcap);
    if (!cnt || !cap)
        return;
    u64 i = __sync_fetch_and_add(cnt, 1);
    if (i >= *cap || i >= AS_SITE_CHANGES)
        return; /* overflow: the count says so, the tracer reads the whole map */
    u32 slot = (u32)(g & 1) * AS_SITE_CHANGES + (u32)i;
    struct as_change *c = site_chg.lookup(&slot);
    if (!c)
        return;
    c->stack_id = sid;
    c->tid = tid;
    c->source = source;
    __asm__ __volatile__("" ::: "memory");
    c->gen = g; /* last: a slot stamped g holds its key */
}
