/* allocscope: DWARF (CFI) unwinding of the user stack inside the probe (BCC dialect).
 *
 * Included by allocscope.c when AS_UNWIND_DWARF is defined, after scratch, count() and
 * store_stack(). Layouts are in allocscope.h; tracer/unwind.py builds and loads the rows.
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
 * Compile-time parameters:
 *   AS_UNWIND_ROWS   rows in `urows`                  (default 2097152, 16 MiB)
 *   AS_UNWIND_MAPS   prefixes in `umaps`              (default 65536)
 *   AS_UNWIND_STEPS  binary search steps: a slice has at most 2^steps rows (default 20)
 */
#ifndef AS_UNWIND_ROWS
#define AS_UNWIND_ROWS 2097152
#endif
#ifndef AS_UNWIND_MAPS
#define AS_UNWIND_MAPS 65536
#endif
#ifndef AS_UNWIND_STEPS
#define AS_UNWIND_STEPS 20
#endif

BPF_ARRAY(urows, struct as_urow, AS_UNWIND_ROWS);
BPF_F_TABLE("lpm_trie", struct as_umap_key, struct as_umap, umaps, AS_UNWIND_MAPS, BPF_F_NO_PREALLOC);

/* Outcome of one step. */
#define AS_STEP_OK 0
#define AS_STEP_END 1   /* outermost frame reached */
#define AS_STEP_TRUNC 2 /* cannot go on */

struct as_ustate {
    u64 ip, sp, bp;
    u32 exact; /* ip is the pc of the frame (frame 0 of a syscall, interrupted code), not a
                  return address: look its own row up, not the call's (ip - 1) */
    u32 fp;    /* this frame was found by a frame-pointer step */
};

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

static __always_inline int read_word(u64 addr, u64 *out)
{
    return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
}

/* One frame up from `s`. */
static __always_inline int unwind_step(struct as_ustate *s)
{
    u64 pc = s->exact ? s->ip : s->ip - 1;
    struct as_umap_key key = {.prefixlen = 64};
#pragma unroll
    for (int b = 0; b < 8; b++)
        key.addr[b] = (u8)(pc >> (56 - 8 * b)); /* big-endian: the trie matches from the top */
    struct as_urow row = {};
    struct as_umap *m = umaps.lookup(&key);
    if (m)
        find_row(m, (u32)(pc - m->bias), &row);

    u64 cfa = 0, ra = 0;
    u8 t = row.cfa_type;
    if (t == AS_CFA_RSP) {
        cfa = s->sp + ((s64)row.cfa_off << 3);
    } else if (t == AS_CFA_RBP) {
        if (s->bp == 0)
            return AS_STEP_TRUNC;
        cfa = s->bp + ((s64)row.cfa_off << 3);
    } else if (t == AS_CFA_PLT) {
        cfa = s->sp + 8 + (((s->ip & 15) >= (u64)row.cfa_off) ? 8 : 0);
    } else if (t == AS_CFA_SIGNAL) {
        /* rt_sigreturn frame: struct ucontext at rsp; uc_mcontext.rbp/rsp/rip at 120/160/168 */
        u64 nbp = 0, nsp = 0, nip = 0;
        if (read_word(s->sp + 120, &nbp) || read_word(s->sp + 160, &nsp) ||
            read_word(s->sp + 168, &nip))
            return AS_STEP_TRUNC;
        s->ip = nip;
        s->sp = nsp;
        s->bp = nbp;
        s->exact = 1; /* the interrupted instruction itself */
        s->fp = 0;
        return nip ? AS_STEP_OK : AS_STEP_END;
    } else if (t == AS_CFA_STOP) {
        return AS_STEP_END;
    } else if (t != AS_CFA_NONE) {
        return AS_STEP_TRUNC; /* AS_CFA_UNSUPPORTED */
    } else { /* no row: frame-pointer step */
        u64 obp = s->bp, nbp = 0;
        if (obp == 0)
            return AS_STEP_END;
        if (obp < s->sp || read_word(obp, &nbp) || read_word(obp + 8, &ra))
            return AS_STEP_END; /* not a frame chain: where frame pointers end too */
        s->ip = ra;
        s->sp = obp + 16;
        s->bp = nbp;
        s->exact = 0;
        s->fp = 1;
        return ra ? AS_STEP_OK : AS_STEP_END;
    }
    if (cfa <= s->sp && row.cfa_type != AS_CFA_PLT)
        return AS_STEP_TRUNC; /* the stack grows down: a caller's frame is above */
    if (read_word(cfa - 8, &ra))
        return AS_STEP_TRUNC;
    if (row.rbp_off == AS_RBP_UNKNOWN) {
        s->bp = 0;
    } else if (row.rbp_off != 0) {
        u64 nbp = 0;
        if (read_word(cfa + ((s64)(s8)row.rbp_off << 3), &nbp))
            return AS_STEP_TRUNC;
        s->bp = nbp;
    }
    s->ip = ra;
    s->sp = cfa;
    s->exact = 0;
    s->fp = 0;
    return ra ? AS_STEP_OK : AS_STEP_END;
}

/* Unwind from (ip, sp, bp) into scratch and store the stack. */
static __always_inline u64 capture_dwarf(u64 ip, u64 sp, u64 bp, u32 exact)
{
    u32 zero = 0;
    struct as_stack *st = scratch.lookup(&zero);
    if (!st)
        return 0;
    struct as_ustate s = {.ip = ip, .sp = sp, .bp = bp, .exact = exact};
    u64 fpmask = 0;
    u32 n = 0, flags = AS_STACK_DWARF;
    if (ip == 0) {
        count(AS_LOST_STACK_ERR, 1);
        return 0;
    }
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < AS_MAX_DEPTH; i++) {
        st->ips[i & (AS_MAX_DEPTH - 1)] = s.ip;
        if (s.fp)
            fpmask |= 1ULL << (i & 63);
        n = i + 1;
        int r = unwind_step(&s);
        if (r == AS_STEP_END)
            break;
        if (r == AS_STEP_TRUNC || i == AS_MAX_DEPTH - 1) {
            flags |= AS_STACK_TRUNCATED;
            break;
        }
    }
    if (n < AS_MAX_DEPTH)
        st->ips[n & (AS_MAX_DEPTH - 1)] = 0; /* store_stack hashes up to the first zero */
    if (flags & AS_STACK_TRUNCATED)
        count(AS_LOST_STACK_TRUNCATED, 1);
    st->depth = n;
    st->flags = flags;
    st->extra = fpmask;
    return store_stack(st);
}
