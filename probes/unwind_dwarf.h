/* allocscope: DWARF (CFI) unwinding of the user stack inside the probe (BCC dialect).
 *
 * Included by stacks.h when AS_UNWIND_DWARF is defined; keeps its stacks with store_stack()
 * (stack_store.h; scratch, count(): common.h). Declarations only (see allocscope.c). Layouts are in allocscope.h; tracer/unwind/unwinder.py
 * builds and loads the rows.
 *
 * Each frame: find the mapping of the pc in `umaps` (LPM trie: one lookup, no loop), binary
 * search its row slice in `urows` for the last row at or below the pc's file offset, compute
 * the CFA from rsp or rbp, read the return address at CFA - 8 and the caller's rbp where the
 * row says it was saved. The caller's rsp is the CFA. A pc that no row covers (JIT code, a
 * module without CFI, a mapping not loaded yet) takes one frame-pointer step instead, marked in
 * the stack's `extra` bitmask. Stops, cleanly, at a row whose return address is undefined
 * (_start, clone3), at a zero return address or rbp 0 in frame-pointer code; everything else
 * that stops early (unreadable stack, unsupported rule, 64 frames and more to go) sets
 * AS_STACK_TRUNCATED and counts AS_LOST_STACK_TRUNCATED.
 *
 * Pending modules. The tracer registers every executable mapping at attach, but builds the rows
 * of a module only once stacks cross it (tracer/unwind/unwinder.py: tables off the probes' start). Until
 * then its `umaps` entries carry AS_UMAP_PENDING: a pc there ends the stack (the frames so far,
 * AS_STACK_TRUNCATED, never cached), counted in AS_LOST_STACK_PENDING and per module in
 * `upending` (slot 0: all of them) — which the tracer polls to know what to build first. When the rows are in it
 * rewrites the entries and bumps `ugen`.
 *
 * Compile-time parameters:
 *   AS_UNWIND_ROWS   rows in `urows` (set by the tracer: RecordOptions.unwind_rows)
 *   AS_UNWIND_MAPS   prefixes in `umaps`              (default 65536)
 *   AS_UNWIND_STEPS  binary search steps: a slice has at most 2^steps rows (tracer/unwind/unwinder.py)
 *   AS_UNWIND_MODULES  module slots of `upending`      (default 1024; tracer/unwind/unwinder.py MODULE_SLOTS)
 *   AS_SCACHE_WAYS   cached stacks per thread, a power of 2 (default 32, ~20 KiB a thread; 0: none)
 *
 * Stack cache (return probes). Unwinding is a pure function of its inputs: the registers (ip,
 * sp, and bp when a rule used it before a saved value replaced it), the rows (which change only
 * when the tracer rewrites `umaps`; it bumps `ugen` then) and the stack words it read — at most
 * two a frame (the return address, the saved rbp), kept as offsets from sp in fixed slots. The
 * return probe looks (ip, sp) up in a small per-thread cache (task storage), re-reads those
 * words and compares a hash of them: the same inputs give the same stack, so the cached stack id
 * is used with no row lookups (~1 read a frame). A miss tail-calls `alloc_unwind`, which unwinds
 * and fills the way. Nothing that cannot be reproduced (a failed read, a signal frame, a
 * truncated stack, a word beyond 4 GiB of the sp) is cached. Two different word vectors of one
 * (ip, sp) can only be confused by a 64-bit hash collision.
 */
#ifndef AS_UNWIND_DWARF_H
#define AS_UNWIND_DWARF_H
#include "common.h"
#include "stack_store.h"
#ifndef AS_UNWIND_ROWS
#error "AS_UNWIND_ROWS: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
#ifndef AS_UNWIND_MAPS
#define AS_UNWIND_MAPS 65536
#endif
#ifndef AS_UNWIND_STEPS
#error "AS_UNWIND_STEPS: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif

#ifndef AS_UNWIND_MODULES
#define AS_UNWIND_MODULES 1024
#endif

#ifndef AS_SCACHE_WAYS
#define AS_SCACHE_WAYS 32
#endif
#define AS_SCACHE_SLOTS (2 * AS_MAX_DEPTH) /* return address and saved rbp of each frame */
#define AS_SLOT_NONE 0xffffffffu

BPF_ARRAY(urows, struct as_urow, AS_UNWIND_ROWS);
BPF_ARRAY(ugen, u64, 1);                                    /* bumped by the tracer whenever `umaps` changes */
BPF_ARRAY(upending, struct as_upending, AS_UNWIND_MODULES); /* stacks cut short, by module slot */

/* Offsets from sp of the words one unwind read, by slot (2 * frame, + 1 for the saved rbp), and
 * the running state of the cache bookkeeping. Kept in a per-CPU map value, not on the BPF
 * stack: the verifier does not track map memory, so these values do not split its states. */
struct as_slots {
    u32 off[AS_SCACHE_SLOTS];
    u64 vh;      /* sum over slots of vh_mix(slot, word) */
    u64 bad;     /* != 0: not reproducible */
    u64 bp_reg;  /* 1 while bp holds frame 0's register value */
    u64 need_bp; /* ... and a rule used it */
    u64 nslots;  /* after the unwind: slots to cache, 0: do not cache */
    /* A saved rbp read from the stack counts only once a rule uses it: in code without frame
     * pointers rbp is an ordinary register whose saved value changes from call to call. */
    u64 pend_val;
    u32 pend_slot; /* AS_SLOT_NONE: no saved rbp waiting */
    u32 pend_off;
};
BPF_PERCPU_ARRAY(uslots, struct as_slots, 1);

#if AS_SCACHE_WAYS > 0
struct as_scache {
    u64 ip, sp, bp; /* registers at the return probe; bp compared only when need_bp */
    u64 gen;        /* `ugen` when cached */
    u64 stack_id;
    u64 vhash;  /* sum over used slots of vh_mix(slot, word at sp + off) */
    u32 nslots; /* 0: empty */
    u32 need_bp;
    u32 span; /* bytes from sp covering every slot's word; > AS_SCACHE_SPAN: read each */
    u32 pad;
    struct as_slots s;
};

/* A cached stack whose words lie within AS_SCACHE_SPAN bytes of sp is checked with one read of
 * that stretch of stack instead of one read a word. */
#define AS_SCACHE_SPAN 4096
struct as_sbuf {
    u64 w[AS_SCACHE_SPAN / 8];
};
BPF_PERCPU_ARRAY(sbuf, struct as_sbuf, 1);

struct as_scache_set {
    struct as_scache way[AS_SCACHE_WAYS];
};

BPF_TASK_STORAGE(scache, struct as_scache_set);
#endif
BPF_F_TABLE("lpm_trie", struct as_umap_key, struct as_umap, umaps, AS_UNWIND_MAPS, BPF_F_NO_PREALLOC);

/* Outcome of one step. */
#define AS_STEP_OK 0
#define AS_STEP_END 1     /* outermost frame reached */
#define AS_STEP_TRUNC 2   /* cannot go on */
#define AS_STEP_PENDING 3 /* the pc is in a module whose rows are still being built */

struct as_ustate {
    u64 ip, sp, bp;
    /* exact: ip is the pc of the frame (frame 0 of a syscall, interrupted code), not a return
     * address: look its own row up, not the call's (ip - 1) */
    u32 exact;
    u32 fp;               /* this frame was found by a frame-pointer step */
    struct as_slots *rec; /* the stack cache's bookkeeping */
    u64 sp0;
};

static __always_inline u64 vh_mix(u32 slot, u64 w)
{
    u64 h = (w ^ ((u64)slot << 48)) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
    return h * 0xbf58476d1ce4e5b9ULL;
}

/* A stack ends at pending module `slot`: count it there (the tracer builds the most-hit first),
 * and in slot 0, the sum the tracer polls (it reads every slot only when that moved). */
static __always_inline void note_pending(u32 slot)
{
    u32 all = 0;
    struct as_upending *p = upending.lookup(&slot);
    struct as_upending *a = upending.lookup(&all);
    if (!p || !a || slot == 0)
        return;
    u64 now = bpf_ktime_get_ns();
    if (p->first_ns == 0)
        p->first_ns = now; /* racing CPUs: one of their times, all within the same moment */
    p->last_ns = now;
    __sync_fetch_and_add(&p->stacks, 1);
    __sync_fetch_and_add(&a->stacks, 1);
}

/* The row for `pc` (file offset `key` in slice `m`); type AS_CFA_NONE when none covers it. */
static __always_inline void find_row(struct as_umap *m, u32 key, struct as_urow *out)
{
    u32 lo = m->begin, len = m->count;
    out->cfa_type = AS_CFA_NONE;
#pragma clang loop unroll(disable)
    for (int s = 0; s < AS_UNWIND_STEPS; s++) {
        if (len <= 1)
            break;
        u32 half = len >> 1;
        u32 mid = lo + half;
        struct as_urow *r = urows.lookup(&mid);
        if (!r)
            return;
        if (r->pc <= key) {
            lo = mid;
            len -= half;
        } else {
            len = half;
        }
    }
    struct as_urow *r = urows.lookup(&lo);
    if (r && r->pc <= key)
        *out = *r;
}

/* Read the word at `addr` for slot `slot`, noting it for the stack cache (a saved rbp, `is_bp`,
 * only provisionally: see use_bp). */
static __always_inline int read_word_as(struct as_ustate *s, u32 slot, u64 addr, u64 *out, int is_bp)
{
    long err = bpf_probe_read_user(out, sizeof(*out), (void *)addr);
    u64 off = addr - s->sp0;
    struct as_slots *r = s->rec;
    r->bad |= (u64)err | (off >> 32); /* below sp0 wraps to a huge offset */
    if (is_bp) {
        r->pend_slot = slot;
        r->pend_off = (u32)off;
        r->pend_val = *out;
    } else {
        r->off[slot & (AS_SCACHE_SLOTS - 1)] = (u32)off;
        r->vh += vh_mix(slot, *out);
    }
    return err;
}

static __always_inline int read_word(struct as_ustate *s, u32 slot, u64 addr, u64 *out)
{
    return read_word_as(s, slot, addr, out, 0);
}

static __always_inline int read_bp(struct as_ustate *s, u32 slot, u64 addr, u64 *out)
{
    return read_word_as(s, slot, addr, out, 1);
}

/* s->bp now holds a value read from the stack (read_bp), or 0 (`known`: nothing was read). */
static __always_inline void set_bp(struct as_ustate *s, u64 bp, int known)
{
    s->bp = bp;
    s->rec->bp_reg = 0;
    if (known)
        s->rec->pend_slot = AS_SLOT_NONE;
}

/* A rule is about to use s->bp: the unwind now depends on where that value came from — the
 * register of frame 0, or the saved rbp read last, which is committed to the cached words. */
static __always_inline void use_bp(struct as_ustate *s)
{
    struct as_slots *r = s->rec;
    r->need_bp |= r->bp_reg;
    u32 slot = r->pend_slot;
    if (slot != AS_SLOT_NONE) {
        r->off[slot & (AS_SCACHE_SLOTS - 1)] = r->pend_off;
        r->vh += vh_mix(slot, r->pend_val);
        r->pend_slot = AS_SLOT_NONE;
    }
}

#ifdef AS_OFF_TASK_UTASK
/* A return address that is the uprobe trampoline (a return probe is pending on that call: ours
 * in full mode, or another tool's) stands for the one the kernel saved in the thread's
 * return_instance list, the entry whose stack slot is `slot`; 0 when none matches. The stack is
 * then not cached: the slot's word (the trampoline) no longer tells one caller from another. */
static __always_inline u64 real_return(struct as_ustate *s, u64 ra, u64 slot)
{
    if (!is_trampoline(ra))
        return ra;
    s->rec->bad = 1;
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    u64 utask = 0, ri = 0;
    bpf_probe_read_kernel(&utask, sizeof(utask), (char *)task + AS_OFF_TASK_UTASK);
    if (utask)
        bpf_probe_read_kernel(&ri, sizeof(ri), (void *)(utask + AS_OFF_UTASK_RI));
#pragma clang loop unroll(disable)
    for (int k = 0; k < 2; k++) { /* the newest pending return probes: one per probed call still running */
        if (!ri)
            break;
        u64 stack = 0, orig = 0;
        bpf_probe_read_kernel(&stack, sizeof(stack), (void *)(ri + AS_OFF_RI_STACK));
        if (stack == slot) {
            bpf_probe_read_kernel(&orig, sizeof(orig), (void *)(ri + AS_OFF_RI_ORIG));
            return orig ? orig : ra;
        }
        bpf_probe_read_kernel(&ri, sizeof(ri), (void *)(ri + AS_OFF_RI_NEXT));
    }
    return ra;
}
#else
#define real_return(s, ra, slot) (ra)
#endif

/* One frame up from `s`, frame `i`. */
static __always_inline int unwind_step(struct as_ustate *s, u32 i)
{
    u32 sra = 2 * i, sbp = 2 * i + 1; /* slots of this frame's return address and saved rbp */
    u64 pc = s->exact ? s->ip : s->ip - 1;
    struct as_umap_key key = {.prefixlen = 64};
#pragma unroll
    for (int b = 0; b < 8; b++)
        key.addr[b] = (u8)(pc >> (56 - 8 * b)); /* big-endian: the trie matches from the top */
    struct as_urow row = {};
    struct as_umap *m = umaps.lookup(&key);
    if (m) {
        if (m->flags & AS_UMAP_PENDING) {
            note_pending(m->module);
            return AS_STEP_PENDING;
        }
        find_row(m, (u32)(pc - m->bias), &row);
    }

    u64 cfa = 0, ra = 0;
    u8 t = row.cfa_type;
    if (t == AS_CFA_RSP) {
        cfa = s->sp + ((s64)row.cfa_off << 3);
    } else if (t == AS_CFA_RBP) {
        use_bp(s);
        if (s->bp == 0)
            return AS_STEP_TRUNC;
        cfa = s->bp + ((s64)row.cfa_off << 3);
    } else if (t == AS_CFA_PLT) {
        cfa = s->sp + 8 + (((s->ip & 15) >= (u64)row.cfa_off) ? 8 : 0);
    } else if (t == AS_CFA_SIGNAL) {
        /* rt_sigreturn frame: struct ucontext at rsp; uc_mcontext.rbp/rsp/rip at 120/160/168 */
        u64 nbp = 0, nsp = 0, nip = 0;
        s->rec->bad = 1; /* the interrupted sp may lie anywhere (an alternate signal stack) */
        if (read_word(s, sra, s->sp + 120, &nbp) || read_word(s, sbp, s->sp + 160, &nsp) ||
            read_word(s, sbp, s->sp + 168, &nip))
            return AS_STEP_TRUNC;
        s->ip = nip;
        s->sp = nsp;
        set_bp(s, nbp, 1); /* not cached anyway */
        s->exact = 1;      /* the interrupted instruction itself */
        s->fp = 0;
        return nip ? AS_STEP_OK : AS_STEP_END;
    } else if (t == AS_CFA_STOP) {
        return AS_STEP_END;
    } else if (t != AS_CFA_NONE) {
        return AS_STEP_TRUNC; /* AS_CFA_UNSUPPORTED */
    } else {
        /* no row: frame-pointer step */
        u64 obp = s->bp, nbp = 0;
        use_bp(s);
        if (obp == 0)
            return AS_STEP_END;
        if (obp < s->sp)
            return AS_STEP_END; /* not a frame chain: where frame pointers end too */
        if (read_bp(s, sbp, obp, &nbp) || read_word(s, sra, obp + 8, &ra))
            return AS_STEP_END;
        ra = real_return(s, ra, obp + 8);
        s->ip = ra;
        s->sp = obp + 16;
        set_bp(s, nbp, 0);
        s->exact = 0;
        s->fp = 1;
        return ra ? AS_STEP_OK : AS_STEP_END;
    }
    if (cfa <= s->sp && row.cfa_type != AS_CFA_PLT)
        return AS_STEP_TRUNC; /* the stack grows down: a caller's frame is above */
    if (read_word(s, sra, cfa - 8, &ra))
        return AS_STEP_TRUNC;
    ra = real_return(s, ra, cfa - 8);
    if (row.rbp_off == AS_RBP_UNKNOWN) {
        set_bp(s, 0, 1);
    } else if (row.rbp_off != 0) {
        u64 nbp = 0;
        if (read_bp(s, sbp, cfa + ((s64)(s8)row.rbp_off << 3), &nbp))
            return AS_STEP_TRUNC;
        set_bp(s, nbp, 0);
    }
    s->ip = ra;
    s->sp = cfa;
    s->exact = 0;
    s->fp = 0;
    return ra ? AS_STEP_OK : AS_STEP_END;
}

/* An unwind in progress on this CPU. A tail-called unwinder (alloc_unwind, sys_unwind, ...)
 * walks AS_UNWIND_CHUNK frames and, with more to go, tail-calls itself: the state a chunk leaves
 * to the next is here, the frames in `scratch`, the cache bookkeeping in `uslots`. The verifier
 * then follows a loop of AS_UNWIND_CHUNK frames once per program instead of AS_MAX_DEPTH: it
 * spent 0.43-0.61 s of CPU on each unwinder (three to six a recording) before the probes went
 * live, 0.06-0.12 s now (issue 45); a 64-frame stack costs 8 tail calls of a few ns.
 * `active` is 0 between unwinds: every chain that began one ends it (unwind_chunk stores the
 * stack, or unwind_cut when the self call failed) before it leaves the unwinder. */
#ifndef AS_UNWIND_CHUNK
#define AS_UNWIND_CHUNK 8
#endif
struct as_uwalk {
    u64 ip, sp, bp, sp0;
    u64 fpmask; /* frames found by a frame-pointer step */
    u32 exact, fp;
    u32 n;     /* frames stored in scratch so far */
    u32 flags; /* AS_STACK_* */
    u32 pending;
    u32 active; /* an unwind is under way (a chunk tail-called the next) */
};
BPF_PERCPU_ARRAY(uwalk, struct as_uwalk, 1);

/* Start an unwind from (ip, sp, bp) in this CPU's walk; 0: nothing to unwind (counted). */
static __always_inline int unwind_begin(struct as_uwalk *w, struct as_slots *rec, u64 ip, u64 sp, u64 bp, u32 exact)
{
    rec->vh = 0;
    rec->bad = 0;
    rec->bp_reg = 1;
    rec->need_bp = 0;
    rec->pend_slot = AS_SLOT_NONE;
    w->ip = ip;
    w->sp = sp;
    w->bp = bp;
    w->sp0 = sp;
    w->exact = exact;
    w->fp = 0;
    w->fpmask = 0;
    w->n = 0;
    w->flags = AS_STACK_DWARF;
    w->pending = 0;
    w->active = 0;
    if (ip == 0) {
        count(AS_LOST_STACK_ERR, 1);
        return 0;
    }
    return 1;
}

/* Up to `limit` frames more of the walk into scratch; 1 when the stack is complete (its
 * outermost frame, a cut, AS_MAX_DEPTH frames), 0 when there are more to go. */
static __always_inline int unwind_frames(struct as_uwalk *w, struct as_stack *st, struct as_slots *rec, u32 limit)
{
    struct as_ustate s = {
        .ip = w->ip, .sp = w->sp, .bp = w->bp, .exact = w->exact, .fp = w->fp, .rec = rec, .sp0 = w->sp0};
    u64 fpmask = w->fpmask;
    u32 i = w->n, flags = w->flags, done = 0;
#pragma clang loop unroll(disable)
    for (u32 k = 0; k < limit; k++) {
        st->ips[i & (AS_MAX_DEPTH - 1)] = s.ip;
        if (s.fp)
            fpmask |= 1ULL << (i & 63);
        rec->off[(2 * i) & (AS_SCACHE_SLOTS - 1)] = AS_SLOT_NONE;
        rec->off[(2 * i + 1) & (AS_SCACHE_SLOTS - 1)] = AS_SLOT_NONE;
        int r = unwind_step(&s, i);
        i++;
        if (r == AS_STEP_END) {
            done = 1;
            break;
        }
        if (r == AS_STEP_PENDING) {
            flags |= AS_STACK_TRUNCATED;
            w->pending = 1;
            done = 1;
            break;
        }
        if (r == AS_STEP_TRUNC || i >= AS_MAX_DEPTH) {
            flags |= AS_STACK_TRUNCATED;
            done = 1;
            break;
        }
    }
    w->ip = s.ip;
    w->sp = s.sp;
    w->bp = s.bp;
    w->exact = s.exact;
    w->fp = s.fp;
    w->fpmask = fpmask;
    w->n = i;
    w->flags = flags;
    return done;
}

/* The walk's frames stored as a stack (its id; 0: none). */
static __always_inline u64 unwind_finish(struct as_uwalk *w, struct as_stack *st, struct as_slots *rec)
{
    u32 n = w->n, flags = w->flags;
    w->active = 0;
    if (n > AS_MAX_DEPTH)
        n = AS_MAX_DEPTH;
    if (n < AS_MAX_DEPTH)
        st->ips[n & (AS_MAX_DEPTH - 1)] = 0; /* store_stack hashes up to the first zero */
    if (w->pending)
        count(AS_LOST_STACK_PENDING, 1);
    else if (flags & AS_STACK_TRUNCATED)
        count(AS_LOST_STACK_TRUNCATED, 1);
    st->depth = n;
    st->flags = flags;
    st->extra = w->fpmask;
    if (flags & AS_STACK_TRUNCATED)
        rec->bad = 1;
    rec->nslots = 2 * n;
    return store_stack(st);
}

/* This CPU's unwind: the frames (scratch), the cache bookkeeping (uslots), the walk (uwalk). */
struct as_uwork {
    struct as_stack *st;
    struct as_slots *rec;
    struct as_uwalk *w;
};

/* 0 when a per-CPU map has no slot (never, in practice: the verifier wants the check). */
static __always_inline int unwind_work(struct as_uwork *u)
{
    u32 zero = 0;
    u->st = scratch.lookup(&zero);
    u->rec = uslots.lookup(&zero);
    u->w = uwalk.lookup(&zero);
    return u->st && u->rec && u->w;
}

/* Unwind from (ip, sp, bp) into scratch and store the stack, in one program; what caching it
 * needs is left in `uslots` (this CPU's). The way is filled by another program (scache_fill):
 * filling it here, after a loop whose every exit the verifier follows apart, would cost it too
 * much. The tail-called unwinders use unwind_chunk instead. */
static __always_inline u64 unwind_store(u64 ip, u64 sp, u64 bp, u32 exact)
{
    struct as_uwork u;
    if (!unwind_work(&u) || !unwind_begin(u.w, u.rec, ip, sp, bp, exact))
        return 0;
    unwind_frames(u.w, u.st, u.rec, AS_MAX_DEPTH);
    return unwind_finish(u.w, u.st, u.rec);
}

/* In a tail-called unwinder: begin the unwind from (ip, sp, bp) unless one is under way (the
 * program called itself), walk AS_UNWIND_CHUNK frames. 1: done, the stack's id in *sid (0:
 * none); 0: more to go, the program tail-calls itself next, and calls unwind_cut if that fails.
 * Each unwinder spells those four lines out: BCC refuses a map's .call() inside a macro. */
static __always_inline int unwind_chunk(u64 ip, u64 sp, u64 bp, u32 exact, u64 *sid)
{
    struct as_uwork u;
    *sid = 0;
    if (!unwind_work(&u))
        return 1;
    if (!u.w->active && !unwind_begin(u.w, u.rec, ip, sp, bp, exact))
        return 1;
    if (!unwind_frames(u.w, u.st, u.rec, AS_UNWIND_CHUNK)) {
        u.w->active = 1;
        return 0;
    }
    *sid = unwind_finish(u.w, u.st, u.rec);
    return 1;
}

/* The self call of a chunked unwinder failed (the tail call limit): the frames so far, cut. */
static __always_inline u64 unwind_cut(void)
{
    struct as_uwork u;
    if (!unwind_work(&u))
        return 0;
    u.w->flags |= AS_STACK_TRUNCATED;
    return unwind_finish(u.w, u.st, u.rec);
}

static __always_inline u64 capture_dwarf(u64 ip, u64 sp, u64 bp, u32 exact)
{
    return unwind_store(ip, sp, bp, exact);
}

#if AS_SCACHE_WAYS > 0
static __always_inline struct as_scache *scache_way(u64 ip, u64 sp, u64 create)
{
    struct as_scache_set *set = scache.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, create);
    if (!set)
        return 0;
    u64 k = (ip ^ (sp << 7)) * 0x9e3779b97f4a7c15ULL;
    return &set->way[(k >> 40) & (AS_SCACHE_WAYS - 1)];
}

/* Cache the stack `id` that unwind_store just unwound from (ip, sp, bp) on this CPU. */
static __always_inline void scache_fill(u64 ip, u64 sp, u64 bp, u64 id)
{
    u32 zero = 0;
    struct as_slots *rec = uslots.lookup(&zero);
    u64 *g = ugen.lookup(&zero);
    if (!id || !rec || rec->bad || !rec->nslots)
        return;
    struct as_scache *w = scache_way(ip, sp, 0);
    if (!w)
        return;
    w->nslots = 0;
    __builtin_memcpy(&w->s, rec, sizeof(w->s));
    w->ip = ip;
    w->sp = sp;
    w->bp = bp;
    w->gen = g ? *g : 0;
    w->stack_id = id;
    w->vhash = rec->vh;
    w->need_bp = (u32)rec->need_bp;
    u32 ns = (u32)rec->nslots, span = 0;
#pragma clang loop unroll(disable)
    for (u32 j = 0; j < AS_SCACHE_SLOTS; j++) {
        if (j >= ns)
            break;
        u32 off = rec->off[j];
        if (off == AS_SLOT_NONE)
            continue;
        if (off & 7) { /* not a whole word of the buffer */
            span = AS_SCACHE_SPAN + 1;
            break;
        }
        if (off + 8 > span)
            span = off + 8;
    }
    w->span = span;
    w->nslots = ns;
}

/* The cached stack id of a return probe's (ip, sp, bp) when the words its unwind read are
 * unchanged; 0: unwind. */
static __always_inline u64 scache_lookup(u64 ip, u64 sp, u64 bp)
{
    struct as_scache *c = scache_way(ip, sp, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!c)
        return 0;
    u32 zero = 0;
    u64 *g = ugen.lookup(&zero);
    u64 gen = g ? *g : 0;
    u32 ns = c->nslots;
    if (ns == 0 || c->ip != ip || c->sp != sp || c->gen != gen || (c->need_bp && c->bp != bp))
        return 0;
    u64 h = 0;
    u32 span = c->span;
    struct as_sbuf *b = sbuf.lookup(&zero);
    if (b && span > 0 && span <= AS_SCACHE_SPAN) {
        if (bpf_probe_read_user(b->w, span, (void *)sp))
            return 0;
#pragma clang loop unroll(disable)
        for (u32 j = 0; j < AS_SCACHE_SLOTS; j++) {
            if (j >= ns)
                break;
            u32 off = c->s.off[j];
            if (off == AS_SLOT_NONE)
                continue;
            h += vh_mix(j, b->w[(off >> 3) & (AS_SCACHE_SPAN / 8 - 1)]);
        }
    } else {
#pragma clang loop unroll(disable)
        for (u32 j = 0; j < AS_SCACHE_SLOTS; j++) {
            if (j >= ns)
                break;
            u32 off = c->s.off[j];
            if (off == AS_SLOT_NONE)
                continue;
            u64 w = 0;
            if (bpf_probe_read_user(&w, sizeof(w), (void *)(sp + off)))
                return 0;
            h += vh_mix(j, w);
        }
    }
    if (h != c->vhash)
        return 0;
    count(AS_CNT_STACK_CACHED, 1);
    return c->stack_id;
}
#endif

#endif /* AS_UNWIND_DWARF_H */
