"""The live view of a recording in progress (`allocscope top`, `record`'s status line), built
snapshot by snapshot from what the recorder hands its observer — never from a trace file. Pure
data: reports.live.text formats it; the `top` command (allocscope/) draws it and reads the keys.

A snapshot is duck-typed (tracer.record.recorder.Snapshot; this layer never imports the tracer): `seq`,
`final`, `row` (the `intervals` row), `sites` ((stack id, tid, source) -> cumulative
(alloc_bytes, alloc_count, free_bytes, free_count, peak_live_bytes)), `changed` (the keys that
changed), `stack_columns` (the `stacks` columns of stacks first seen now), `names` (tid ->
thread name), `allocator`.

Costs, per snapshot: each stack is symbolized once, when it first appears (one Symbolizer for
the whole session keeps every module it parsed, so a refresh parses no ELF file); the changed
counters update per-site and per-thread sums; the view is computed from those sums for the
distinct sites (after folding), not for the blocks. The live-block map is never read: it can
hold millions of blocks, and the age of each site's oldest block is bounded from the counters
instead (`oldest_age_bound`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from common.tracefile.names import lost_events

from ..analysis import (
    DEVICE_SOURCES,
    UNKNOWN_STACK,
    Folding,
    FrameInfo,
    fit_growth,
    fit_window,
    fold_frames,
    group_of,
    sort_sites,
    symbolize_stack_rows,
    verdict,
    with_python_rows,
)

HISTORY_POINTS = 240  # intervals of per-site live bytes kept for the growth fit (8 min at 2 s)
TIMELINE_POINTS = 512  # intervals of RSS and live bytes kept for the timeline
AGE_POINTS = 64  # change points of a site's allocation count kept for its age bound
ZERO = (0, 0, 0, 0, 0)


class StackFrames:
    """Frames of the stacks a recording has named, each symbolized once: eagerly for every new
    stack (`resolve_new`, what `top` needs to fold stacks into sites) or on demand (`get`, what a
    status line showing one stack needs). One Symbolizer keeps every module it parsed."""

    def __init__(self, symbolizer=None) -> None:
        if symbolizer is None:
            from ..symbolize import Symbolizer  # noqa: PLC0415 (pyelftools: only when watching)

            symbolizer = Symbolizer()
        self.sym = symbolizer
        self.pending: dict[int, pd.DataFrame] = {}
        self.frames: dict[int, tuple[FrameInfo, ...]] = {0: UNKNOWN_STACK}
        self.resolved: dict[tuple[str, int], tuple[FrameInfo, ...]] = {}  # (module, offset) -> frames
        self.pyframes: list[pd.DataFrame] = []  # CPython's frames of stacks not symbolized yet
        self.pycode: list[pd.DataFrame] = []  # every code object named so far (docs/python.md)

    def add_python(self, parts) -> None:
        """CPython's frames of the stacks first seen now and the code objects they name first
        (Snapshot.python: (pyframes columns, pycode columns) pairs)."""
        for frames, codes in parts or ():
            # uint64 throughout: ids past 2**63 beside smaller ones would make a concat float
            if frames.get("stack_id"):
                self.pyframes.append(pd.DataFrame(frames).astype({"stack_id": "uint64", "code": "uint64"}))
            if codes.get("code"):
                self.pycode.append(pd.DataFrame(codes).astype({"code": "uint64"}))

    def _symbolize(self, rows: pd.DataFrame) -> None:
        out = symbolize_stack_rows(rows, self.sym, resolved=self.resolved)
        if self.pyframes:  # merged where the eval loop stands, as in a report
            fr = pd.concat(self.pyframes, ignore_index=True)
            self.pycode = [pd.concat(self.pycode, ignore_index=True)] if self.pycode else []
            with_python_rows(out, fr, self.pycode[0] if self.pycode else pd.DataFrame())
            done = {int(k) for k in out}  # compared as ints: isin() may go through floats past 2**63
            self.pyframes = [fr[[int(x) not in done for x in fr["stack_id"]]]]
        self.frames.update(out)

    def add(self, columns: dict[str, list] | None) -> None:
        """The `stacks` columns of a snapshot (its stacks first seen now)."""
        if not columns or not columns.get("stack_id"):
            return
        df = pd.DataFrame(columns)
        for sid, grp in df.groupby("stack_id", sort=False):
            if int(sid) not in self.frames:
                self.pending[int(sid)] = grp

    def resolve_new(self) -> list[int]:
        """Symbolize every stack added since the last call (one pass per module); their ids."""
        if not self.pending:
            return []
        new = list(self.pending)
        rows = pd.concat(self.pending.values(), ignore_index=True)
        self.pending = {}
        self._symbolize(rows)
        return new

    def get(self, sid: int) -> tuple[FrameInfo, ...]:
        """The frames of stack `sid`, symbolized now if they were not yet."""
        if sid not in self.frames:
            grp = self.pending.pop(sid, None)
            if grp is None:
                return UNKNOWN_STACK
            self._symbolize(grp)
        return self.frames.get(sid, UNKNOWN_STACK)


def oldest_age_bound(counts: list[tuple[float, int]], free_count: int, now_s: float) -> float | None:
    """A lower bound of the age of the oldest outstanding block of a site, from its counters
    alone: `counts` are (time, cumulative allocations) change points, `free_count` the blocks
    freed so far. Whatever blocks those frees were, they cannot all be among the first
    free_count + 1 allocated, so the oldest live block was allocated no later than the moment
    the allocation count reached free_count + 1: it is at least `now_s` minus that time old.
    Exact to the interval when the site frees in allocation order (a queue, a log); an
    underestimate otherwise. None when nothing is outstanding."""
    need = free_count + 1
    for t, c in counts:
        if c >= need:
            return max(0.0, now_s - t)
    return None


@dataclass
class SiteState:
    """One site (folded frames) — or location, function: LiveModel's `by` — summed over its
    (stack, thread, source) counters."""

    index: int
    frames: tuple[FrameInfo, ...]
    full_frames: tuple[FrameInfo, ...]
    stack: tuple[FrameInfo, ...] = ()  # full_frames folded
    stacks: set = field(default_factory=set)  # the distinct folded stacks summed here
    live: int = 0
    alloc_bytes: int = 0
    alloc_count: int = 0
    free_count: int = 0
    peak: int = 0
    by_tid: dict[int, int] = field(default_factory=dict)
    counts: list[tuple[float, int]] = field(default_factory=list)  # (elapsed_s, alloc_count) change points

    def note_count(self, t: float) -> None:
        """Keep the change points the age bound needs: those not yet passed by the frees, at
        most AGE_POINTS (thinned every other one, the first and last kept: a thinner list only
        gives a smaller bound, never a wrong one)."""
        if not self.counts or self.counts[-1][1] != self.alloc_count:
            self.counts.append((t, self.alloc_count))
        need = self.free_count + 1
        while len(self.counts) > 1 and self.counts[0][1] < need:
            self.counts.pop(0)
        if len(self.counts) > AGE_POINTS:
            self.counts = self.counts[:1] + self.counts[1:-1][1::2] + self.counts[-1:]


@dataclass
class ThreadState:
    tid: int
    live: int = 0
    alloc_count: int = 0
    sites: set[int] = field(default_factory=set)  # site indexes it allocated at


@dataclass
class LiveView:
    """What one refresh shows: computed by LiveModel.view, formatted by reports.live.text.

    row: the last `intervals` row (rss_*, live/heap/mmap/device bytes, lost_* and n_* counters);
    rss_peak_bytes: the highest RSS sampled while watching; timeline_rss / timeline_live: the
    last TIMELINE_POINTS samples; sites: one row per site (see LiveModel.view); threads: one row
    per allocating thread, live bytes desc; losses: the non-zero lost_* counters that count
    events (not bytes)."""

    seq: int
    final: bool
    elapsed_s: float
    interval_s: float
    row: dict
    allocator: str
    rss_peak_bytes: int
    timeline_rss: list[int]
    timeline_live: list[int]
    sites: pd.DataFrame
    threads: list[dict]
    losses: dict[str, int]
    names: dict[int, str]
    by: str = "stack"  # what a row of `sites` is: location, function or stack (LiveModel's `by`)
    # each allocator's own memory at the last snapshot: {name, source, resident, live, retained}
    allocators: list = field(default_factory=list)
    # the threads blocked now, by where they wait (reports/analysis/waits.py's wait_place): {location,
    # function, module, file, line, call?, inside?, threads, held_bytes (what they allocated and hold),
    # longest_s}, most held first
    waiting: list = field(default_factory=list)
    _sorted: dict[str, list[dict]] = field(default_factory=dict, repr=False)

    def ranked(self, sort: str) -> list[dict]:
        """The sites ranked by `sort` (live, growth, peak, age: reports.analysis.sort_sites),
        as dicts with `rank` 1..n."""
        if sort not in self._sorted:
            df = sort_sites(self.sites, sort) if len(self.sites) else self.sites
            rows = df.to_dict("records")
            for i, r in enumerate(rows, 1):
                r["rank"] = i
            self._sorted[sort] = rows
        return self._sorted[sort]

    @property
    def lost(self) -> int:
        return lost_events(self.losses)


SITE_COLUMNS = [
    "site",
    "full_frames",
    "stack",
    "n_stacks",
    "live_bytes",
    "live_count",
    "delta_bytes",
    "peak_live_bytes",
    "alloc_bytes",
    "alloc_count",
    "allocs_per_s",
    "growth_bytes_per_s",
    "growth_r2",
    "verdict",
    "oldest_age_s",
    "top_tid",
    "top_thread",
    "threads",
]


class LiveModel:
    """Sums a recording's snapshots by location (`by`: location, function or stack — frames
    folded as reports fold them, grouped by reports.analysis.stacks.group_of) and by thread. `update`
    takes every snapshot in order; `view` computes what a refresh shows."""

    def __init__(
        self, fold: Folding | None = None, symbolizer=None, history: int = HISTORY_POINTS, by: str = "location"
    ) -> None:
        self.fold = fold
        self.by = by
        self.stacks = StackFrames(symbolizer)
        self.site_of_stack: dict[int, SiteState] = {}
        self.sites: list[SiteState] = []
        self.by_frames: dict[tuple[FrameInfo, ...], SiteState] = {}
        self.threads: dict[int, ThreadState] = {}
        self.counters: dict[tuple, tuple] = {}
        self.names: dict[int, str] = {}
        self.history: deque[tuple[float, np.ndarray]] = deque(maxlen=max(2, history))  # (elapsed, live per site)
        self.counts_prev: np.ndarray = np.zeros(0, dtype=np.int64)  # alloc counts per site, previous snapshot
        self.counts_now: np.ndarray = np.zeros(0, dtype=np.int64)
        self.thread_prev: dict[int, tuple[int, int]] = {}  # tid -> (live, alloc_count) before
        self.thread_now: dict[int, tuple[int, int]] = {}
        self.timeline: deque[tuple[int, int]] = deque(maxlen=TIMELINE_POINTS)  # (rss, live)
        self.rss_peak = 0
        self.row: dict = {}
        self.seq = 0
        self.final = False
        self.allocator = ""
        self.elapsed: list[float] = []  # the last two snapshots' elapsed_s
        self.allocators: list[dict] = []  # the last snapshot's allocators (LiveView.allocators)
        self.waiting: list[dict] = []  # the last snapshot's blocked threads by where they wait

    # --- input ----------------------------------------------------------------------------

    def _site(self, sid: int) -> SiteState:
        site = self.site_of_stack.get(sid)
        if site is None:
            full = self.stacks.get(sid)
            folded = fold_frames(full, self.fold)
            frames = group_of(folded, self.by)
            site = self.by_frames.get(frames)
            if site is None:
                site = SiteState(len(self.sites), frames, full, folded)
                self.sites.append(site)
                self.by_frames[frames] = site
            site.stacks.add(folded)
            self.site_of_stack[sid] = site
        return site

    def update(self, snap) -> None:
        """Take one snapshot (every snapshot, in order: the counters are cumulative, deltas are
        between consecutive snapshots)."""
        self.stacks.add(snap.stack_columns)
        self.stacks.add_python(getattr(snap, "python", ()))
        self.stacks.resolve_new()
        row = snap.row
        t = float(row.get("elapsed_s", 0.0))
        touched: set[int] = set()
        for key in snap.changed:
            if key[2] in DEVICE_SOURCES:
                continue  # GPU memory: in the header (device_live_bytes), never in the host sums
            new = snap.sites[key]
            old = self.counters.get(key, ZERO)
            self.counters[key] = new
            sid, tid = int(key[0]), int(key[1])
            site = self._site(sid)
            d_live = (new[0] - new[2]) - (old[0] - old[2])
            d_count = new[1] - old[1]
            site.live += d_live
            site.alloc_bytes += new[0] - old[0]
            site.alloc_count += d_count
            site.free_count += new[3] - old[3]
            site.peak = max(site.peak, new[4])
            site.by_tid[tid] = site.by_tid.get(tid, 0) + d_live
            th = self.threads.get(tid)
            if th is None:
                th = self.threads[tid] = ThreadState(tid)
            th.live += d_live
            th.alloc_count += d_count
            th.sites.add(site.index)
            touched.add(site.index)
        for i in touched:
            site = self.sites[i]
            site.peak = max(site.peak, site.live)
            site.note_count(t)
        live = np.fromiter((s.live for s in self.sites), dtype=np.int64, count=len(self.sites))
        self.history.append((t, live))
        self.counts_prev = self.counts_now
        self.counts_now = np.fromiter((s.alloc_count for s in self.sites), dtype=np.int64, count=len(self.sites))
        self.thread_prev = self.thread_now
        self.thread_now = {tid: (th.live, th.alloc_count) for tid, th in self.threads.items()}
        self.elapsed = [*self.elapsed[-1:], t]
        self.names.update(snap.names)
        rss = int(row.get("rss_bytes", -1))
        if rss >= 0:
            self.rss_peak = max(self.rss_peak, rss)
        elif self.timeline:  # the target is gone: its last RSS stays on the timeline
            rss = self.timeline[-1][0]
        self.timeline.append((rss, int(row.get("live_bytes", 0))))
        self.row = row
        self.seq = snap.seq
        self.final = snap.final
        self.allocator = getattr(snap, "allocator", "") or self.allocator
        self.waiting = self._waiting(getattr(snap, "blocked", ()) or ())
        rows = getattr(snap, "allocators", ()) or ()
        if rows:
            self.allocators = [
                {
                    "source": r[0],
                    "name": r[1],
                    "resident": int(r[3]),
                    "live": int(r[4]),
                    "retained": max(0, int(r[3]) - int(r[4])),
                }
                for r in rows
            ]

    def _waiting(self, blocked) -> list[dict]:
        from ..analysis.waits import wait_place  # noqa: PLC0415 (named as the report names waits)

        groups: dict[str, dict] = {}
        for tid, sid, _since, waited, _state in blocked:
            place = wait_place(self.stacks.get(int(sid)))
            g = groups.setdefault(place["location"], {**place, "threads": 0, "held_bytes": 0, "longest_s": 0.0})
            g["threads"] += 1
            th = self.threads.get(int(tid))
            g["held_bytes"] += max(0, th.live) if th is not None else 0
            g["longest_s"] = max(g["longest_s"], int(waited) / 1e9)
        return sorted(groups.values(), key=lambda g: (-g["held_bytes"], -g["threads"], g["function"]))

    # --- output ---------------------------------------------------------------------------

    def _growth(self) -> tuple[np.ndarray, np.ndarray, float, int]:
        """Per site: slope (bytes/s) and R² of its live bytes over the last fit_window of the
        kept history, the window's seconds and points."""
        n_sites = len(self.sites)
        w = fit_window(len(self.history))
        if w < 2 or n_sites == 0:
            return np.zeros(n_sites), np.full(n_sites, np.nan), 0.0, w
        tail = list(self.history)[-w:]
        x = np.array([t for t, _ in tail], dtype=float)
        y = np.zeros((w, n_sites), dtype=float)
        for i, (_, v) in enumerate(tail):
            y[i, : len(v)] = v
        slope, r2 = fit_growth(x, y)
        return slope, r2, float(x[-1] - x[0]), w

    def view(self) -> LiveView:
        """The refresh: sites with columns SITE_COLUMNS — site (folded frames, innermost first; for a location or
        function its one frame), full_frames (one full stack of it, the first seen), stack (that stack folded),
        n_stacks (the distinct folded stacks summed in it), live_bytes, live_count, delta_bytes (change since
        the previous snapshot), peak_live_bytes, alloc_bytes, alloc_count, allocs_per_s (in the last interval),
        growth_bytes_per_s and growth_r2 (least-squares line over the last half of the kept history,
        reports.analysis.fit_growth), verdict (reports.analysis.verdict), oldest_age_s (lower bound,
        `oldest_age_bound`; NaN when nothing is outstanding), top_tid / top_thread (the thread holding most of
        it), threads ((tid, live bytes) desc) — and threads."""
        n = len(self.sites)
        now_t = self.elapsed[-1] if self.elapsed else 0.0
        dt = now_t - self.elapsed[0] if len(self.elapsed) == 2 else now_t
        live = self.history[-1][1] if self.history else np.zeros(0, dtype=np.int64)
        prev = np.zeros(n, dtype=np.int64)
        if len(self.history) >= 2:
            p = self.history[-2][1]
            prev[: len(p)] = p
        counts_prev = np.zeros(n, dtype=np.int64)
        counts_prev[: len(self.counts_prev)] = self.counts_prev
        slope, r2, window_s, window_points = self._growth()
        rows = []
        for s in self.sites:
            i = s.index
            by_tid = sorted(((tid, b) for tid, b in s.by_tid.items() if b), key=lambda x: (-x[1], x[0]))
            top_tid = by_tid[0][0] if by_tid else (max(s.by_tid, key=lambda t: s.by_tid[t]) if s.by_tid else None)
            g, q = float(slope[i]), float(r2[i])
            age = oldest_age_bound(s.counts, s.free_count, now_t)
            rows.append(
                {
                    "site": s.frames,
                    "full_frames": s.full_frames,
                    "stack": s.stack,
                    "n_stacks": len(s.stacks),
                    "live_bytes": int(live[i]),
                    "live_count": s.alloc_count - s.free_count,
                    "delta_bytes": int(live[i] - prev[i]),
                    "peak_live_bytes": s.peak,
                    "alloc_bytes": s.alloc_bytes,
                    "alloc_count": s.alloc_count,
                    "allocs_per_s": (s.alloc_count - int(counts_prev[i])) / dt if dt > 0 else 0.0,
                    "growth_bytes_per_s": g,
                    "growth_r2": q,
                    "verdict": verdict(int(live[i]), s.peak, g, q, window_s, window_points),
                    "oldest_age_s": math.nan if age is None else age,
                    "top_tid": top_tid,
                    "top_thread": self.names.get(top_tid, "?") if top_tid is not None else "-",
                    "threads": by_tid,
                }
            )
        sites = pd.DataFrame(rows, columns=SITE_COLUMNS)
        threads: list[dict[str, Any]] = []
        for tid, th in self.threads.items():
            before = self.thread_prev.get(tid, (0, 0))
            top = max(th.sites, key=lambda j: (self.sites[j].by_tid.get(tid, 0), -j)) if th.sites else None
            threads.append(
                {
                    "tid": tid,
                    "name": self.names.get(tid, "?"),
                    "live_bytes": th.live,
                    "delta_bytes": th.live - before[0],
                    "alloc_count": th.alloc_count,
                    "allocs_per_s": (th.alloc_count - before[1]) / dt if dt > 0 else 0.0,
                    "sites": len(th.sites),
                    "top_site": self.sites[top].frames if top is not None else UNKNOWN_STACK,
                }
            )
        threads.sort(key=lambda r: (-r["live_bytes"], -r["alloc_count"], r["tid"]))
        row = self.row
        losses = {k: int(v) for k, v in row.items() if k.startswith("lost_") and not k.endswith("_bytes") and v}
        return LiveView(
            self.seq,
            self.final,
            now_t,
            dt,
            row,
            self.allocator,
            self.rss_peak,
            [max(0, r) for r, _ in self.timeline],
            [lv for _, lv in self.timeline],
            sites,
            threads,
            losses,
            dict(self.names),
            self.by,
            list(self.allocators),
            list(self.waiting),
        )


class StatusModel:
    """What `record`'s one-line status needs: the last interval row and the stack holding the
    most live bytes, symbolized only when it becomes the top one (a stack, not a folded site:
    the status line never symbolizes the stacks it does not show)."""

    def __init__(self, fold: Folding | None = None, symbolizer=None) -> None:
        self.fold = fold
        self.stacks = StackFrames(symbolizer)
        self.counters: dict[tuple, tuple] = {}
        self.by_stack: dict[int, int] = {}
        self.row: dict = {}

    def update(self, snap) -> None:
        self.stacks.add(snap.stack_columns)
        self.stacks.add_python(getattr(snap, "python", ()))
        for key in snap.changed:
            if key[2] in DEVICE_SOURCES:
                continue
            new = snap.sites[key]
            old = self.counters.get(key, ZERO)
            self.counters[key] = new
            sid = int(key[0])
            self.by_stack[sid] = self.by_stack.get(sid, 0) + (new[0] - new[2]) - (old[0] - old[2])
        self.row = snap.row

    def top(self) -> tuple[tuple[FrameInfo, ...], int] | None:
        """(folded frames, live bytes) of the stack holding the most, or None when none holds any."""
        if not self.by_stack:
            return None
        sid, live = max(self.by_stack.items(), key=lambda kv: (kv[1], -kv[0]))
        if live <= 0:
            return None
        return fold_frames(self.stacks.get(sid), self.fold), live

    @property
    def lost(self) -> int:
        return lost_events(self.row)
