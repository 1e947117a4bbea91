"""Why memory stays: the target's threads that were blocked (off-CPU) while holding memory, where
they waited, for how long, what they held — and what giving memory back cost.

The probes (probes/waits.h) keep, per (thread, user stack where it blocked), the waits at least
the recording's threshold long (`waits`), and at every snapshot the threads blocked then
(`blocked`). What a thread *holds* is what it allocated and has not freed: its sites' live bytes
at that snapshot (the `sites` table, per allocating thread). Joining the two gives "held while
waiting": at the snapshot where blocked threads held most, which threads, blocked where (the wait
stack's innermost frame outside the waiting machinery: pthread_cond_wait, futex, sem_wait,
std::sync, parking_lot... fold to their caller), for how long, holding what, by the location
that allocated it.

Handoff (issue 46): what a thread allocated and other threads free (the `flows` table) was
passed on. A blocked thread whose allocations other threads mostly free holds only what it has
not passed on yet: the memory of an allocation whose code it is still in (`still_owns`: its wait
stack and the allocation's stack part in the function that called the allocating one, the wait
after the allocation's line — a send that has not completed). The rest of what it allocated and
is live is `handed_on` (held by the threads that free it, or on their way), not "held" by an idle
thread. docs/waits.md says what allocation events alone can and cannot tell.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict

from common import allocators as registry
from common.tracefile.names import TLB_REASONS
from common.tracefile.reader import Trace

from .sources import is_device
from .stacks import UNKNOWN_STACK, FrameInfo, fold_frames, group_of, is_wrapper, located_extras, location_key

# Frames of the waiting machinery, folded out of a wait stack from the innermost end: what is
# left first is the code that decided to wait.
WAIT_WRAPPER_PATTERNS = [
    r"^_*(pthread|__pthread)_(cond_|mutex_|rwlock_|barrier_|spin_|join|timedjoin|clockjoin)",
    r"^_*(new_)?sem_(wait|timedwait|clockwait|post)",
    r"^_*do_futex_wait",
    r"^_*futex",
    r"^_*lll_",
    r"^_*(libc_|GI_)?(nanosleep|clock_nanosleep|usleep|sleep|poll|ppoll|select|pselect6?|epoll_wait|epoll_pwait2?|"
    r"read|write|pread64|pwrite64|readv|writev|recv|recvfrom|recvmsg|send|sendto|sendmsg|accept4?|connect|"
    r"wait4|waitpid|waitid|pause|sigwait|sigtimedwait|sigwaitinfo|syscall|syscall_cancel|syscall_cancel_arch|"
    r"internal_syscall_cancel|open|openat|open64|close|fsync|fdatasync|flock|fcntl|fcntl64|ioctl|msync)$",
    r"^_*(GI_|libc_)",
    r"^__condvar_",
    r"^__(lll|pthread|futex|libc|GI|new_sem|old_sem)",
    # C++: std::mutex, std::condition_variable, std::this_thread, std::future, std::thread::join
    r"^std::(mutex|condition_variable|__condvar|this_thread|__basic_future|future|shared_future|thread::join|"
    r"unique_lock|lock_guard|scoped_lock|counting_semaphore|binary_semaphore|__atomic_semaphore|"
    r"__platform_wait|__detail::__platform_wait|__detail::__waiter|__atomic_wait|latch|barrier|"
    r"shared_mutex|timed_mutex|recursive_mutex)",
    r"^(void |\S+ )?std::(condition_variable|mutex|unique_lock|__atomic_wait|__detail::__atomic_wait)",
    # Rust: std's locks, channels, thread parking and sleeping, parking_lot, crossbeam, tokio's park
    r"^std::(sync|sys|sys_common|thread|io|net|fs|panicking|rt)::",
    r"^<std::(sync|sys|thread|io|net)::",
    r"^core::(ops::function|option|result|ptr)::",
    r"^<core::",
    r"^parking_lot",
    r"^<parking_lot",
    r"^lock_api::",
    r"^<lock_api::",
    r"^crossbeam_(channel|utils|deque)::",
    r"^<crossbeam_",
    r"^tokio::(runtime::park|park|runtime::driver|runtime::io|runtime::time|loom|sync::)",
    r"^<tokio::(runtime::park|park|sync::)",
    r"^mio::",
    r"^<mio::",
    r"^futex_",
    r"^std::sync::mpmc",
]
_WAIT_RX = re.compile("|".join(WAIT_WRAPPER_PATTERNS))

# Modules whose frames are the waiting machinery, whatever the function (a libc without symbols
# for its internals gives `libc.so.6+0x...`).
_WAIT_MODULES = re.compile(
    r"^(libc|libpthread|ld-linux[\w-]*|libstdc\+\+|libgcc_s|" + registry.library_rx() + "|"
    r"libuv|libevent\w*)[.-]"
)

# Deallocation frames: a wait with one of them on its stack is a thread blocked inside free/drop
# (the dealloc-mutex case: frees serialized behind an allocator's lock).
_FREE_RX = re.compile(
    r"^(__libc_)?(free|cfree)$|^_int_free|^(" + registry.symbol_prefix_rx() + r")(free|sdallocx|dallocx|free_size)$|"
    r"^(sdallocx|dallocx)$|^operator delete|^__rust_dealloc$|"
    r"^__rdl_dealloc$|^__rustc::__rust_dealloc|^core::ptr::drop_in_place|^(__)?(munmap|madvise)$|^malloc_trim$|"
    + registry.internal_rx()
)


def is_wait_wrapper(f: FrameInfo) -> bool:
    if _WAIT_RX.search(f.function) or is_wrapper(f.function):
        return True
    return bool(f.module) and bool(_WAIT_MODULES.match(os.path.basename(f.module)))


_THREAD_ROOTS = frozenset(  # where every thread's stack begins (libc's): never the place a thread waits
    ("clone3", "clone", "__clone", "__clone3", "__clone_internal", "start_thread", "_start", "__libc_start_call_main")
    + ("__libc_start_main", "__libc_start_main_impl")
)


def fold_wait_frames(frames: tuple[FrameInfo, ...]) -> tuple[FrameInfo, ...]:
    """The wait stack without the waiting machinery at its innermost end (at least the outermost
    frame is kept). A thread of machinery frames only (jemalloc's background thread: allocator code
    on libc's) waits in its entry above the thread's start (background_thread_entry), never clone3."""
    cut = 0
    while cut < len(frames) - 1 and is_wait_wrapper(frames[cut]):
        cut += 1
    while cut > 0 and frames[cut].function in _THREAD_ROOTS:
        cut -= 1
    return frames[cut:]


def wait_group(frames: tuple[FrameInfo, ...]) -> tuple[FrameInfo, ...]:
    """Where a thread blocked with the stack `frames` (innermost first) waits, as a location (a
    one-frame tuple): the stack without the waiting machinery (fold_wait_frames), grouped as the
    report groups sites (`group_of`): a stripped module's frames stay under the code that called
    into them ("inside redis-check-rdb, called from aeMain"), never a bare return address. The
    report's waits and `top`'s "waiting" line (reports/live/model.py) both name waits by it."""
    return group_of(fold_wait_frames(frames), "location")


def wait_place(frames: tuple[FrameInfo, ...]) -> dict:
    """wait_group as the report's rows have it: {location, function, module, file, line, call?, inside?}."""
    return _loc(wait_group(frames))


def in_free(frames: tuple[FrameInfo, ...]) -> bool:
    return any(_FREE_RX.search(f.function) for f in frames)


def _loc(frames: tuple[FrameInfo, ...]) -> dict:
    f = frames[0] if frames else UNKNOWN_STACK[0]
    return {
        "location": location_key((f,)),
        "function": f.function,
        "module": f.module,
        "file": f.file,
        "line": f.line,
        **located_extras(f),
    }


OWN_MAX_DEPTH = 4  # still_owns: how far out from the allocating location the stacks may part


def still_owns(alloc: tuple[FrameInfo, ...], wait: tuple[FrameInfo, ...]) -> bool:
    """Whether a thread blocked at the folded wait stack `wait` still holds a block allocated at
    the folded site `alloc` (both innermost first) as its own work in progress. Compared from the
    outermost frame, the stacks part in a function that called both the allocation and the wait
    (a worker loop, a job; rayon's map_fold closure, `g(acc, f(elt))`, calling the map closure
    and then the for_each one), at most OWN_MAX_DEPTH frames out from the allocating location:
    at two lines of it, the wait after the allocation (a greater line; unknown lines: yes), or at
    one line (one expression). A thread whose stacks part further out (an idle pool thread: the
    job that allocated has returned to the pool's main loop) or that waits before the allocating
    line (at the top of its next iteration) has passed what it allocated on; one blocked inside
    the allocating code still owns it."""
    a, w = alloc[::-1], wait[::-1]
    k = 0
    while k < len(a) and k < len(w) and a[k] == w[k]:
        k += 1
    if k >= len(a) or k >= len(w):
        return True  # one stack inside the other: blocked inside the allocating code
    fa, fw = a[k], w[k]
    if (fa.function, fa.module) == (fw.function, fw.module):  # one function, two lines
        if len(a) - 1 - k > OWN_MAX_DEPTH:
            return False
        return fa.line is None or fw.line is None or fw.line > fa.line
    # the last frame in common called both from one line (one expression: `g(acc, f(elt))`)
    return k > 0 and len(a) - k <= OWN_MAX_DEPTH


def _handoffs(trace: Trace, names: dict[int, str]) -> dict[int, dict[int, int]]:
    """{allocating tid: {freeing tid: bytes}} of the threads that hand their memory on: those of
    a pool (one name pattern, `name_pattern`: synth-1..24 are synth-*) whose freed allocations
    other threads freed more of (in bytes) than each allocating thread did itself, over the whole
    recording (`flows`). Judged per pool, not per thread: a worker whose partitions are all still
    live downstream at the end was never seen handing one on, its pool was. The freeing threads
    are its own flows', else its pool's."""
    f = trace.final_flows()
    if f.empty:
        return {}
    pool: dict[int, str] = {}
    own: dict[str, int] = defaultdict(int)
    other: dict[str, int] = defaultdict(int)
    to: dict[int, dict[int, int]] = {}
    pool_to: dict[str, dict[int, int]] = {}
    for a, b, n in zip(f["alloc_tid"].tolist(), f["free_tid"].tolist(), f["bytes"].tolist()):
        a, b, n = int(a), int(b), int(n)
        k = pool.setdefault(a, name_pattern([names.get(a, str(a))]))
        if a == b:
            own[k] += n
        elif n > 0:
            other[k] += n
            to.setdefault(a, {})[b] = to.get(a, {}).get(b, 0) + n
            pool_to.setdefault(k, {})[b] = pool_to.get(k, {}).get(b, 0) + n
    handing = {k for k in other if other[k] > own.get(k, 0)}
    s = trace.sites
    tids = {int(t) for t in s["tid"].unique()} if not s.empty else set()
    return {
        t: to.get(t) or pool_to[k]
        for t in tids | set(pool)
        if (k := pool.get(t) or name_pattern([names.get(t, str(t))])) in handing
    }


def name_pattern(names: list[str]) -> str:
    """'synth-*' for synth-1..synth-24, 'finalizer/gpu' for those two names: digit runs as *, the
    distinct patterns joined by '/', most frequent first, then by name (at most 4)."""
    counts: dict[str, int] = {}
    for n in names:
        k = re.sub(r"\d+", "*", n)
        counts[k] = counts.get(k, 0) + 1
    pats = sorted(counts, key=lambda k: (-counts[k], k))
    return "/".join(pats[:4]) + ("/..." if len(pats) > 4 else "")


class _Locations:
    """stack_id -> wait location (folded wait stack) and allocation location (folded site)."""

    def __init__(self, stacks: dict[int, tuple[FrameInfo, ...]]) -> None:
        self.stacks = stacks
        self._wait: dict[int, tuple] = {}
        self._alloc: dict[int, tuple] = {}
        self._site: dict[int, tuple] = {}

    def wait(self, sid: int) -> tuple[tuple[FrameInfo, ...], tuple[FrameInfo, ...]]:
        """(the wait location as a one-frame tuple, the folded wait stack)."""
        if sid not in self._wait:
            frames = self.stacks.get(sid, UNKNOWN_STACK)
            self._wait[sid] = (wait_group(frames), fold_wait_frames(frames))
        return self._wait[sid]

    def alloc(self, sid: int) -> tuple[FrameInfo, ...]:
        if sid not in self._alloc:
            self._alloc[sid] = group_of(self.site(sid), "location")
        return self._alloc[sid]

    def site(self, sid: int) -> tuple[FrameInfo, ...]:
        """The folded allocation stack (the site) of `sid`."""
        if sid not in self._site:
            self._site[sid] = fold_frames(self.stacks.get(sid, UNKNOWN_STACK))
        return self._site[sid]


def _held_at(trace: Trace, tids: set[int], seqs: list[int]) -> dict[int, dict[int, dict[tuple, list[int]]]]:
    """seq -> tid -> (stack_id, source) -> [live bytes, live count] of the host memory each of
    `tids` allocated and had not freed at the end of each of `seqs` (ascending)."""
    s = trace.sites
    if s.empty or not tids:
        return {q: {} for q in seqs}
    s = s[s["tid"].isin(list(tids)) & ~is_device(s["source"])].sort_values("seq")
    cur: dict[tuple, tuple[int, int]] = {}
    out: dict[int, dict[int, dict[tuple, list[int]]]] = {}
    rows = list(
        zip(
            s["seq"].tolist(),
            s["stack_id"].tolist(),
            s["tid"].tolist(),
            s["source"].tolist(),
            (s["alloc_bytes"] - s["free_bytes"]).tolist(),
            (s["alloc_count"] - s["free_count"]).tolist(),
        )
    )
    i = 0
    for q in seqs:
        while i < len(rows) and rows[i][0] <= q:
            _, sid, tid, src, b, n = rows[i]
            cur[(int(sid), int(tid), src)] = (b, n)
            i += 1
        per: dict[int, dict[tuple, list[int]]] = defaultdict(dict)
        for (sid, tid, src), (b, n) in cur.items():
            if b > 0:
                per[tid][(sid, src)] = [b, n]
        out[q] = dict(per)
    return out


def _elapsed(trace: Trace) -> dict[int, float]:
    iv = trace.intervals
    return {int(q): float(e) for q, e in zip(iv["seq"], iv["elapsed_s"])} if "elapsed_s" in iv else {}


def held_while_waiting(trace: Trace, stacks: dict[int, tuple[FrameInfo, ...]], top: int = 10) -> dict:
    """The allocscope.report/1 `waits` object (see README, "Held while waiting"). Each
    `by_location` entry's `kept_bytes` is the part of its `held_bytes` allocated at locations
    whose function is not on the blocked thread's own wait stack: memory the threads allocated,
    returned from the allocating call and kept while they wait (a thread blocked inside the
    function that allocated, a sleep in the middle of building a buffer, is work in progress,
    not kept); `keeping_threads`: how many of its threads kept some."""
    meta_w = trace.meta.get("waits") or {}
    wait_min_ns = int(meta_w.get("wait_min_ns", 0) or 0)
    last = trace.intervals.iloc[-1].to_dict() if len(trace.intervals) else {}
    out: dict = {
        "traced": bool(wait_min_ns),
        "wait_min_ms": wait_min_ns / 1e6,
        "blocking_switches": int(last.get("n_waits", 0) or 0),
        "short_waits": int(last.get("n_waits_short", 0) or 0),
        "short_wait_s": int(last.get("n_wait_short_ns", 0) or 0) / 1e9,
        "lost": int(last.get("lost_wait_full", 0) or 0),
        "peak": None,
        "location_peaks": [],
        "timeline": [],
        "off_cpu": [],
        "freeing": freeing_costs(trace, stacks),
    }
    if not wait_min_ns:
        return out
    names = trace.thread_names()
    locs = _Locations(stacks)
    el = _elapsed(trace)
    bl = trace.blocked
    seqs = sorted(int(q) for q in bl["seq"].unique()) if not bl.empty else []
    held = _held_at(trace, {int(t) for t in bl["tid"].unique()} if seqs else set(), seqs)
    handoffs = _handoffs(trace, names) if seqs else {}
    per_seq: dict[int, list[dict]] = {}
    for q, g in bl.groupby("seq") if seqs else ():
        rows = []
        for tid, sid, waited, state in zip(
            g["tid"].tolist(), g["stack_id"].tolist(), g["waited_ns"].tolist(), g["state"].tolist()
        ):
            h = held.get(int(q), {}).get(int(tid), {})
            handed: dict[tuple, list[int]] = {}
            if int(tid) in handoffs:  # what it passed on is not its to hold
                wait = locs.wait(int(sid))[1]
                handed = {k: v for k, v in h.items() if not still_owns(locs.site(k[0]), wait)}
                h = {k: v for k, v in h.items() if k not in handed}
            rows.append(
                {
                    "tid": int(tid),
                    "stack_id": int(sid),
                    "waited_ns": int(waited),
                    "state": state,
                    "held": h,
                    "held_bytes": sum(v[0] for v in h.values()),
                    "handed": handed,
                    "handed_bytes": sum(v[0] for v in handed.values()),
                    "passed_to": handoffs.get(int(tid), {}) if handed else {},
                }
            )
        per_seq[int(q)] = rows
    # the timeline: blocked threads and what they held, per interval, per wait location
    for q in seqs:
        rows = per_seq[q]
        by: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for r in rows:
            k = location_key(locs.wait(r["stack_id"])[0])
            by[k][0] += 1
            by[k][1] += r["held_bytes"]
            by[k][2] += r["handed_bytes"]
        out["timeline"].append(
            {
                "seq": q,
                "elapsed_s": el.get(q),
                "blocked": len(rows),
                "holding": sum(1 for r in rows if r["held_bytes"]),
                "held_bytes": sum(r["held_bytes"] for r in rows),
                "handed_on_bytes": sum(r["handed_bytes"] for r in rows),
                "by_location": {
                    k: {"threads": v[0], "held_bytes": v[1], "handed_on_bytes": v[2]} for k, v in by.items()
                },
            }
        )
    if seqs:
        # the most held; of snapshots holding as much, the latest (its waits are the longest)
        peak_q = max(seqs, key=lambda q: (sum(r["held_bytes"] for r in per_seq[q]), q))
        out["peak"] = _peak(peak_q, per_seq[peak_q], el, names, locs, top)
        # each wait location at its own peak (the snapshot where the threads blocked there held most)
        best: dict[str, tuple] = {}
        for q in seqs:
            for k, v in out["timeline"][seqs.index(q)]["by_location"].items():
                if k not in best or (v["held_bytes"], v["threads"]) > best[k][1:]:
                    best[k] = (q, v["held_bytes"], v["threads"])
        own = []
        for k, (q, _, _) in best.items():
            at = _peak(q, per_seq[q], el, names, locs, top)
            own.append({**next(d for d in at["by_location"] if d["location"] == k), "seq": q, "elapsed_s": el.get(q)})
        own.sort(key=lambda d: (-d["held_bytes"], -d["threads"], d["location"]))
        out["location_peaks"] = own[:top]
    out["off_cpu"] = _off_cpu(trace, names, locs, top)
    return out


def _peak(q: int, rows: list[dict], el: dict, names: dict, locs: _Locations, top: int) -> dict:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[locs.wait(r["stack_id"])[0]].append(r)
    by_location = []
    for wloc, rs in groups.items():
        held: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        kept: list[int] = []  # per thread: what it allocated outside the functions on its own wait stack
        for r in rs:
            inside = {f.function for f in locs.wait(r["stack_id"])[1]}
            kept.append(0)
            for (sid, _src), (b, n) in r["held"].items():
                h = held[locs.alloc(sid)]
                h[0] += b
                h[1] += n
                if locs.alloc(sid)[0].function not in inside:
                    kept[-1] += b
        handed: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        passed: dict[int, int] = defaultdict(int)
        for r in rs:
            for (sid, _src), (b, n) in r["handed"].items():
                h = handed[locs.alloc(sid)]
                h[0] += b
                h[1] += n
            for t, b in r["passed_to"].items():
                passed[t] += b
        folded = locs.wait(rs[0]["stack_id"])[1]
        handing = [r for r in rs if r["handed_bytes"]]
        by_location.append(
            {
                **_loc(wloc),
                "threads": len(rs),
                "holding_threads": sum(1 for r in rs if r["held_bytes"]),
                "held_bytes": sum(r["held_bytes"] for r in rs),
                "handed_on_bytes": sum(r["handed_bytes"] for r in rs),
                "handing_threads": len(handing),
                "allocated_by": name_pattern([names.get(r["tid"], "?") for r in handing]) if handing else None,
                "passed_to": [
                    {"tid": t, "name": names.get(t, "?"), "bytes": b}
                    for t, b in sorted(passed.items(), key=lambda kv: -kv[1])
                ][:top],
                "passed_to_names": name_pattern([names.get(t, "?") for t in passed]) if passed else None,
                "handed_on": [
                    {**_loc(a), "bytes": v[0], "blocks": v[1]}
                    for a, v in sorted(handed.items(), key=lambda kv: -kv[1][0])
                ][:top],
                "kept_bytes": sum(kept),
                "keeping_threads": sum(1 for k in kept if k),
                "longest_s": max(r["waited_ns"] for r in rs) / 1e9,
                "in_free": in_free(locs.stacks.get(rs[0]["stack_id"], UNKNOWN_STACK)),
                "frames": [f.as_dict() for f in folded[:8]],
                "thread_list": [
                    {
                        "tid": r["tid"],
                        "name": names.get(r["tid"], "?"),
                        "waited_s": r["waited_ns"] / 1e9,
                        "state": r["state"],
                        "held_bytes": r["held_bytes"],
                        "handed_on_bytes": r["handed_bytes"],
                    }
                    for r in sorted(rs, key=lambda r: (-r["held_bytes"], -r["handed_bytes"]))
                ],
                "held": [
                    {**_loc(a), "bytes": v[0], "blocks": v[1]}
                    for a, v in sorted(held.items(), key=lambda kv: -kv[1][0])
                ][:top],
            }
        )
    by_location.sort(key=lambda d: (-d["held_bytes"], -d["threads"], d["location"]))
    return {
        "seq": q,
        "elapsed_s": el.get(q),
        "blocked": len(rows),
        "holding": sum(1 for r in rows if r["held_bytes"]),
        "held_bytes": sum(r["held_bytes"] for r in rows),
        "handed_on_bytes": sum(r["handed_bytes"] for r in rows),
        "by_location": by_location,
    }


def _off_cpu(trace: Trace, names: dict, locs: _Locations, top: int) -> list[dict]:
    w = trace.waits
    if w.empty:
        return []
    last = w.sort_values("seq").drop_duplicates(["tid", "stack_id"], keep="last")
    groups: dict[tuple, dict] = {}
    for tid, sid, n, tot, mx in zip(
        last["tid"].tolist(),
        last["stack_id"].tolist(),
        last["count"].tolist(),
        last["total_ns"].tolist(),
        last["max_ns"].tolist(),
    ):
        wloc, _ = locs.wait(int(sid))
        g = groups.setdefault(
            wloc, {"waits": 0, "total_ns": 0, "max_ns": 0, "tids": set(), "in_free": False, "per_tid": {}}
        )
        pt = g["per_tid"].setdefault(int(tid), {"waits": 0, "total_s": 0.0, "max_s": 0.0})
        pt["waits"] += int(n)
        pt["total_s"] += int(tot) / 1e9
        pt["max_s"] = max(pt["max_s"], int(mx) / 1e9)
        g["waits"] += int(n)
        g["total_ns"] += int(tot)
        g["max_ns"] = max(g["max_ns"], int(mx))
        g["tids"].add(int(tid))
        g["in_free"] = g["in_free"] or in_free(locs.stacks.get(int(sid), UNKNOWN_STACK))
    rows = sorted(groups.items(), key=lambda kv: -kv[1]["total_ns"])
    return [
        {
            **_loc(k),
            "waits": g["waits"],
            "total_s": g["total_ns"] / 1e9,
            "max_s": g["max_ns"] / 1e9,
            "n_threads": len(g["tids"]),
            "in_free": g["in_free"],
            "threads": sorted({names.get(t, "?") for t in g["tids"]})[:8],
            "by_thread": [{"tid": t, "name": names.get(t, "?"), **v} for t, v in sorted(g["per_tid"].items())],
        }
        for k, g in rows[: top * 2]
    ]


def freeing_costs(trace: Trace, stacks: dict[int, tuple[FrameInfo, ...]]) -> dict:
    """Time spent giving memory back: munmap/madvise/brk (by thread and kind; by the location
    that mapped the memory, for munmaps of memory mapped outside the allocators) and the
    allocators' purge calls (malloc_trim, mallctl purges...), by thread."""
    names = trace.thread_names()
    out: dict = {"by_thread": [], "by_location": [], "purges": [], "tlb": tlb_flushes(trace)}
    rel = trace.releases
    if not rel.empty:
        last = rel.sort_values("seq").drop_duplicates(["tid", "kind", "in_api", "stack_id"], keep="last")
        last = last[last["in_api"] != "malloc_trim"]
        g = (
            last.groupby(["tid", "kind"])
            .agg(
                calls=("calls", "sum"),
                requested_bytes=("requested_bytes", "sum"),
                released_bytes=("released_bytes", "sum"),
                duration_ns=("duration_ns", "sum"),
            )
            .reset_index()
        )
        g = g.sort_values(["duration_ns", "released_bytes"], ascending=False)
        out["by_thread"] = [
            {
                "tid": int(r.tid),
                "thread": names.get(int(r.tid), "?"),
                "kind": r.kind,
                "calls": int(r.calls),
                "requested_bytes": int(r.requested_bytes),
                "released_bytes": int(r.released_bytes),
                "duration_s": int(r.duration_ns) / 1e9,
            }
            for r in g.itertuples()
        ]
        mine = last[last["stack_id"] != 0]
        by: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
        for sid, n, b, d in zip(
            mine["stack_id"].tolist(),
            mine["calls"].tolist(),
            mine["requested_bytes"].tolist(),
            mine["duration_ns"].tolist(),
        ):
            k = group_of(fold_frames(stacks.get(int(sid), UNKNOWN_STACK)), "location")
            v = by[k]
            v[0] += int(n)
            v[1] += int(b)
            v[2] += int(d)
        out["by_location"] = [
            {**_loc(k), "calls": v[0], "requested_bytes": v[1], "duration_s": v[2] / 1e9}
            for k, v in sorted(by.items(), key=lambda kv: -kv[1][2])
        ]
    pu = trace.purges
    if not pu.empty:
        g = (
            pu.groupby(["tid", "function"])
            .agg(
                calls=("duration_ns", "size"),
                duration_ns=("duration_ns", "sum"),
                released_bytes=("released_bytes", "sum"),
            )
            .reset_index()
        )
        out["purges"] = [
            {
                "tid": int(r.tid),
                "thread": names.get(int(r.tid), "?"),
                "function": r.function,
                "calls": int(r.calls),
                "duration_s": int(r.duration_ns) / 1e9,
                "released_bytes": int(r.released_bytes),
            }
            for r in g.sort_values("duration_ns", ascending=False).itertuples()
        ]
    return out


def tlb_flushes(trace: Trace) -> dict[str, dict[str, int]]:
    """TLB flushes on the target's threads over the recording, by reason (tlb:tlb_flush):
    {reason: {flushes, pages, full}}, reasons with none left out; {} for a trace without them."""
    iv = trace.intervals
    if not len(iv):
        return {}
    last = iv.iloc[-1]
    out = {}
    for r in TLB_REASONS:
        k = f"tlb_{r}_flushes"
        if k in iv.columns and int(last[k] or 0):
            out[r] = {
                "flushes": int(last[k]),
                "pages": int(last.get(f"tlb_{r}_pages", 0) or 0),
                "full": int(last.get(f"tlb_{r}_full", 0) or 0),
            }
    return out
