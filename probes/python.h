/* allocscope BPF, python.h: CPython's interpreter frames folded into an allocation's stack (the
 * runtime module of the probes; its user side is tracer/runtimes/python.py, docs/python.md).
 *
 * A thread running CPython has a PyThreadState; the tracer finds each thread's one from outside
 * (it walks _PyRuntime's interpreters and their threads in /proc/PID/mem) and keeps it in
 * `pythreads` (tid -> tstate address), with the version's layout in `pyconf`. At an allocation,
 * py_stack() walks that thread's interpreter frames (tstate -> current frame -> previous ...),
 * one read of each frame's first 80 bytes, and takes (code object, instruction pointer) of up to
 * AS_PY_DEPTH frames; shim frames (FRAME_OWNED_BY_CSTACK, 3.12+) are skipped and mark the frame
 * above them as the first of its C eval loop (3.11: the frame's is_entry). The frames are hashed
 * into the native stack's id: the same native stack under two Python lines is two stacks. A new
 * combined id gets a copy of the native stack in `stacks` (so everything reading stacks works
 * unchanged) and its Python frames in `pystacks`; a known one costs the walk and one lookup.
 *
 * Declarations only (see allocscope.c). */
#ifndef AS_PYTHON_H
#define AS_PYTHON_H
#include "common.h"

#ifndef AS_PY_DEPTH
#define AS_PY_DEPTH 32 /* Python frames kept a stack (a power of 2, <= 32: `entry` is a bitmask) */
#endif
#ifndef AS_PY_STACKS
#define AS_PY_STACKS 16384
#endif
#define AS_PY_THREADS 8192
#define AS_PY_FRAME_BYTES 80 /* the frame's first bytes: every field read lies in them (3.11-3.13) */

/* The interpreter's layout (offsets in bytes; -1: the version has no such field). */
struct as_pyconf {
    u32 on;             /* 1: walk the frames of the threads in `pythreads` */
    s32 tstate_frame;   /* tstate -> current frame (3.13), or -> cframe (3.11, 3.12) */
    s32 cframe_frame;   /* cframe -> current_frame; -1: none (3.13) */
    u32 frame_code;     /* f_code (3.11, 3.12), f_executable (3.13) */
    u32 frame_instr;    /* prev_instr (3.11, 3.12), instr_ptr (3.13) */
    u32 frame_previous; /* previous */
    u32 frame_owner;    /* owner (a byte) */
    s32 frame_is_entry; /* is_entry (a byte, 3.11); -1 */
    s32 owner_cstack;   /* FRAME_OWNED_BY_CSTACK (3.12+); -1 */
    u32 code_tag;       /* where a code object's identity words start (co_firstlineno's word) */
    u32 tag_file;       /* ... and the words of co_filename and co_name from there */
    u32 tag_name;
    u32 pad;
    u64 runtime;           /* &_PyRuntime: a thread not in `pythreads` is looked for from there */
    u32 rt_main_interp;    /* _PyRuntime._main_interpreter (the main PyInterpreterState, inside it) */
    u32 interp_threads;    /* PyInterpreterState.threads.head */
    u32 tstate_next;       /* PyThreadState.next */
    u32 tstate_native_tid; /* PyThreadState.native_thread_id */
    u32 multi;             /* 1: subinterpreters exist: a thread's state in the newest is looked for */
    u32 rt_interp_head;    /* _PyRuntime.interpreters.head (the newest interpreter) */
};

struct as_pyframe {
    u64 code;  /* PyCodeObject address */
    u64 instr; /* the frame's instruction pointer (an address inside the code's bytecode) */
    u64 tag;   /* the code object's identity when the stack was stored (py_tag) */
};

struct as_pystack {
    u64 native; /* the native stack's id in `stacks` */
    u32 n;      /* frames, innermost first */
    u32 entry;  /* bit i: frame i is the first its _PyEval_EvalFrameDefault call ran */
    u32 cut;    /* 1: the walk stopped with frames left (deeper than AS_PY_DEPTH, or unreadable) */
    u32 pad;
    struct as_pyframe f[AS_PY_DEPTH];
};

/* 0: walks, 1: frames read, 2: stacks stored, 3: lost (`stacks` or `pystacks` full), 4: frames
 * cut (more than AS_PY_DEPTH) */
#define AS_PYCNT_WALKS 0
#define AS_PYCNT_FRAMES 1
#define AS_PYCNT_STORED 2
#define AS_PYCNT_LOST 3
#define AS_PYCNT_CUT 4

#define AS_PY_THREAD_WALK 32         /* thread states looked at for a thread not in `pythreads` */
#define AS_PY_REWALK_NS 200000000ULL /* a thread found in none: looked for again after this */

BPF_ARRAY(pyconf, struct as_pyconf, 1);
BPF_HASH(pythreads, u32, u64, AS_PY_THREADS);
BPF_TABLE("lru_hash", u32, u64, pynotstate, AS_PY_THREADS); /* tid -> when none was found */
BPF_F_TABLE("hash", u64, struct as_pystack, pystacks, AS_PY_STACKS, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(pycounts, u64, 8);

/* The walk's state lives in this per-CPU value, not in registers: the verifier does not track
 * map memory, so a shim frame, an entry flag or a frame count does not split its states (kept in
 * registers they multiplied along the loop past its complexity limit). */
struct as_pywork {
    struct as_pystack st;
    u64 w[16];   /* the frame's first bytes */
    u64 frame;   /* the next frame to read */
    u64 h;       /* the hash so far */
    u64 next_ts; /* the thread's state in the interpreter walked next (the main one), 0: none */
};
BPF_PERCPU_ARRAY(pywork, struct as_pywork, 1);

static __always_inline void py_count(u32 i, u64 n)
{
    u64 *c = pycounts.lookup(&i);
    if (c)
        *c += n;
}

static __always_inline u64 py_byte(u64 *w, u32 off)
{
    return (w[(off >> 3) & 15] >> ((off & 7) * 8)) & 0xff;
}

/* A thread state's current frame (3.13: tstate->current_frame; 3.11, 3.12: through its cframe),
 * 0 when it runs none or it cannot be read. */
static __always_inline u64 py_tstate_frame(struct as_pyconf *c, u64 ts)
{
    u64 frame = 0;
    if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(ts + c->tstate_frame)))
        return 0;
    if (c->cframe_frame >= 0 && frame && bpf_probe_read_user(&frame, sizeof(frame), (void *)(frame + c->cframe_frame)))
        return 0;
    return frame;
}

/* One frame of the walk: 0 when it ends here. */
static __always_inline int py_frame(struct as_pyconf *c, struct as_pywork *p)
{
    u64 fr = p->frame;
    u32 n = p->st.n;
    if (!fr && p->next_ts) { /* a subinterpreter's frames ended: the main interpreter's that entered it */
        fr = py_tstate_frame(c, p->next_ts);
        p->next_ts = 0;
        p->frame = fr;
    }
    if (!fr)
        return 0;
    if (bpf_probe_read_user(p->w, AS_PY_FRAME_BYTES, (void *)fr))
        return 0; /* p->frame stays set: the stack is said cut */
    u64 next = p->w[(c->frame_previous >> 3) & 15];
    if (c->owner_cstack >= 0 && py_byte(p->w, c->frame_owner) == (u64)c->owner_cstack) {
        if (n > 0)
            p->st.entry |= 1u << ((n - 1) & 31); /* the frame above a shim began its eval loop */
        p->frame = next;
        return 1;
    }
    if (n >= AS_PY_DEPTH) { /* a Python frame past the kept ones (a shim there is no loss: read first) */
        py_count(AS_PYCNT_CUT, 1);
        return 0;
    }
    p->frame = next;
    u64 code = p->w[(c->frame_code >> 3) & 15], instr = p->w[(c->frame_instr >> 3) & 15];
    u32 i = n;
    asm volatile("" : "+r"(i)); /* the compiler must not drop the mask (it knows n < AS_PY_DEPTH) */
    i &= AS_PY_DEPTH - 1;
    p->st.f[i].code = code;
    p->st.f[i].instr = instr;
    if (c->frame_is_entry >= 0)
        p->st.entry |= (u32)(py_byte(p->w, (u32)c->frame_is_entry) != 0) << (n & 31);
    u64 h = p->h ^ code;
    h *= 0x100000001b3ULL;
    h ^= instr * 0x9e3779b97f4a7c15ULL;
    p->h = h ^ (h >> 31);
    p->st.n = n + 1;
    return 1;
}

/* A code object's identity: its first line's word and its file and name pointers, hashed. The
 * tracer reads the code objects later, at a snapshot: a module body's code is freed once run and
 * its address may hold another code object by then; the tag tells them apart (tracer/runtimes/
 * python.py keys a code object by address and tag). Read only when a stack is stored. */
static __always_inline void py_tags(struct as_pyconf *c, struct as_pywork *p)
{
    u32 base = c->code_tag, fi = c->tag_file, ni = c->tag_name;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < AS_PY_DEPTH; i++) {
        if (i >= p->st.n)
            break;
        u32 j = i;
        asm volatile("" : "+r"(j));
        j &= AS_PY_DEPTH - 1;
        u64 tag = 0;
        if (!bpf_probe_read_user(p->w, 64, (void *)(p->st.f[j].code + base)))
            tag = p->w[0] ^ (p->w[fi & 7] * 0x9e3779b97f4a7c15ULL) ^ (p->w[ni & 7] * 0xbf58476d1ce4e5b9ULL);
        p->st.f[j].tag = tag;
    }
}

/* An event for the tracer, woken at once (AS_EV_PYSTACK: a new stack stored, read its code
 * objects while they live; AS_EV_PYTHREAD: a thread's state found). Rare: once per stored stack
 * or found thread; a full ring leaves the work to the next snapshot or walk. */
static __always_inline void py_event(u32 type, u32 tid, u64 addr)
{
    struct as_event *e = events.ringbuf_reserve(sizeof(struct as_event));
    if (!e)
        return;
    __builtin_memset(e, 0, sizeof(*e));
    e->type = type;
    e->tid = tid;
    e->addr = addr;
    events.ringbuf_submit(e, 0);
}

/* Thread `tid`'s state among the first AS_PY_THREAD_WALK of interpreter `interp` (newest first),
 * 0 when none. */
static __always_inline u64 py_tstate_in(struct as_pyconf *c, u64 interp, u32 tid)
{
    u64 ts = 0;
    if (bpf_probe_read_user(&ts, sizeof(ts), (void *)(interp + c->interp_threads)))
        return 0;
#pragma clang loop unroll(disable)
    for (u32 k = 0; k < AS_PY_THREAD_WALK; k++) {
        u64 id = 0;
        if (!ts || bpf_probe_read_user(&id, sizeof(id), (void *)(ts + c->tstate_native_tid)))
            return 0;
        if (id == tid)
            return ts;
        if (bpf_probe_read_user(&ts, sizeof(ts), (void *)(ts + c->tstate_next)))
            return 0;
    }
    return 0;
}

/* A thread that entered a subinterpreter (`_xxsubinterpreters.run_string`, mod_wsgi's) runs
 * there on its state in that interpreter, made when it entered (3.13: each time), which neither
 * the tracer's walk nor `pythreads` may know yet: in a process with subinterpreters (pyconf.multi)
 * the newest interpreter's states are looked through at each walk; the thread's frames there are
 * walked first, then the main interpreter's that entered it (`next_ts`). */
static __always_inline u64 py_sub_tstate(struct as_pyconf *c, u32 tid, u64 ts, struct as_pywork *p)
{
    u64 head = 0;
    if (!c->multi || bpf_probe_read_user(&head, sizeof(head), (void *)(c->runtime + c->rt_interp_head)) || !head ||
        head == c->runtime + c->rt_main_interp)
        return ts;
    u64 sub = py_tstate_in(c, head, tid);
    if (!sub || sub == ts)
        return ts;
    p->next_ts = ts;
    return sub;
}

/* The PyThreadState of thread `tid` when the tracer has not named it yet (a thread started since
 * its last walk: a ThreadPoolExecutor's worker started on the first submit allocates at once): the
 * main interpreter's thread states, newest first (a new thread's is at the head), up to
 * AS_PY_THREAD_WALK, their native_thread_id compared. Found: kept in `pythreads` and told to the
 * tracer (AS_EV_PYTHREAD: its walk then owns the entry, removed when the thread is gone). Not
 * found (a native thread: a BLAS pool, a C library's own): not looked for again for
 * AS_PY_REWALK_NS. 0 when none. */
static __always_inline u64 py_find_tstate(struct as_pyconf *c, u32 tid)
{
    if (!c->runtime)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 *last = pynotstate.lookup(&tid);
    if (last && now - *last < AS_PY_REWALK_NS)
        return 0;
    u64 ts = py_tstate_in(c, c->runtime + c->rt_main_interp, tid);
    if (!ts) {
        pynotstate.update(&tid, &now);
        return 0;
    }
    pythreads.update(&tid, &ts);
    py_event(AS_EV_PYTHREAD, tid, ts);
    return ts;
}

/* The stack id of an allocation by thread `tid` whose native stack is `sid`: `sid` itself when
 * the thread runs no Python (or the walk finds no frame), else the id of native + Python frames. */
static __always_inline u64 py_stack(u32 tid, u64 sid)
{
    u32 zero = 0;
    struct as_pyconf *c = pyconf.lookup(&zero);
    if (!c || !c->on || !sid)
        return sid;
    u64 *known = pythreads.lookup(&tid);
    u64 ts = known ? *known : 0;
    if (!ts)
        ts = py_find_tstate(c, tid);
    if (!ts)
        return sid;
    struct as_pywork *p = pywork.lookup(&zero);
    if (!p)
        return sid;
    py_count(AS_PYCNT_WALKS, 1);
    p->next_ts = 0;
    ts = py_sub_tstate(c, tid, ts, p);
    p->frame = py_tstate_frame(c, ts);
    p->h = sid;
    p->st.n = 0;
    p->st.entry = 0;
#pragma clang loop unroll(disable)
    for (u32 k = 0; k < AS_PY_DEPTH + 8; k++) { /* + shim frames */
        if (!py_frame(c, p))
            break;
    }
    u32 n = p->st.n;
    if (n == 0)
        return sid;
    py_count(AS_PYCNT_FRAMES, n);
    /* said in the report: a cut stack must not read as whole (frames left, or the main
     * interpreter's that entered a subinterpreter not walked yet) */
    p->st.cut = p->frame != 0 || p->next_ts != 0;
    u64 h = p->h ^ p->st.cut;
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdULL;
    if (h == 0 || h == sid)
        h = sid ^ 1;
    if (pystacks.lookup(&h))
        return h;
    struct as_stack *nat = stacks.lookup(&sid);
    if (!nat)
        return sid;
    int err = stacks.insert(&h, nat);
    if (err != 0 && err != -EEXIST) {
        py_count(AS_PYCNT_LOST, 1);
        return sid;
    }
    p->st.native = sid;
    py_tags(c, p);
    err = pystacks.insert(&h, &p->st);
    if (err != 0 && err != -EEXIST) {
        py_count(AS_PYCNT_LOST, 1);
        return sid; /* the copy in `stacks` stays unnamed: harmless */
    }
    py_count(AS_PYCNT_STORED, 1);
    py_event(AS_EV_PYSTACK, tid, h);
    return h;
}

#endif /* AS_PYTHON_H */
