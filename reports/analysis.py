"""Turn a Trace into ranked tables. Functions are verbs returning DataFrames or plain dicts;
renderers (reports.render) only format what these return, and the CLI only calls these.

A *site* is the symbolized call stack with allocator and allocator-wrapper frames folded away
(innermost first); the same code gives the same site in every run, whatever the addresses.

Python API (notebooks get exactly what `allocscope report` prints):

    >>> from reports.trace import load_trace
    >>> from reports import analysis as A
    >>> t = load_trace("pw12.allocscope")
    >>> stacks = A.symbolize_stacks(t)            # symbolize once, pass to the others
    >>> A.rank_sites(t, stacks, sort="growth")    # one row per site: live, peak, growth, age, verdict
    >>> A.site_timeline(t, stacks)                # live bytes per site per interval
    >>> A.thread_table(t); A.thread_group_table(t); A.flow_table(t)
    >>> A.totals(t)                               # RSS, live, peaks, losses
    >>> A.build_report(t, sort="peak")            # the allocscope.report/1 document

Every DataFrame-returning function documents its columns. Byte counts are int64; times are
seconds (float) measured from the start of the recording unless stated otherwise.

Verdicts (see `verdict` for the exact rules): each site is *freed*, *transient*, *growing* or
*plateaued*, judged from its live-bytes timeline.
"""
from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import pyarrow as pa

from common.errors import UsageError
from common.tracefile.reader import Trace

REPORT_SCHEMA = "allocscope.report/1"

# Frames folded out of a site (they stay in `full_frames`): allocator entry points and the
# wrappers languages put around them.
WRAPPER_PATTERNS = [
    r"^operator new", r"^operator delete", r"^__rust_alloc", r"^__rust_realloc", r"^__rust_alloc_zeroed",
    r"^__rdl_alloc", r"^__rdl_realloc", r"^__rg_alloc", r"^alloc::alloc::", r"^alloc::raw_vec::",
    r"^<alloc::alloc::Global as core::alloc::Allocator>", r"^std::allocator", r"^__gnu_cxx::new_allocator",
    r"^std::__new_allocator", r"^std::_Vector_base<.*>::_M_allocate", r"^std::allocator_traits",
    r"^(__libc_)?(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc)$",
    r"^(__)?(mmap|mmap64|munmap|mremap|brk|sbrk|__brk|__sbrk|madvise|syscall)$",
    r"^(strdup|strndup|__strdup|__strndup)$",
    # Rust's alloc crate (Vec, RawVec, Box, String, their trait impls) and C++ standard containers:
    # with DWARF unwinding and inlines their internals are on the stack; the caller is the site.
    r"^alloc::", r"^<alloc::(vec|raw_vec|string|alloc|collections)::",
    (r"^(void |\S+ )?std::(vector|_Vector_base|__cxx11::basic_string|basic_string|deque|_Deque_base|"
     r"__cxx11::list|list|_List_base|_Rb_tree|map|multimap|set|multiset|unordered_map|unordered_set|"
     r"_Hashtable|__detail::_Hashtable_alloc|__detail::_Map_base|__shared_count|__shared_ptr|shared_ptr|"
     r"make_shared|allocate_shared|unique_ptr|make_unique|__allocated_ptr)\b"),
]
_WRAPPER_RX = re.compile("|".join(WRAPPER_PATTERNS))

# Application wrappers around malloc, folded out of sites like the language wrappers above: the
# code that asked for memory is the frame right outside them. (library, glob patterns matched
# against the whole function name, case-sensitive); listed in the report when they fold a frame.
APP_WRAPPERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("redis", ("zmalloc*", "ztrymalloc*", "zcalloc*", "ztrycalloc*", "zrealloc*", "ztryrealloc*", "zstrdup")),
    ("cpython", ("PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc", "_PyObject_Calloc",
                 "_PyObject_Realloc", "PyMem_*", "_PyMem_*", "pymalloc_alloc", "pymalloc_realloc",
                 "_PyObject_Arena*", "new_arena", "allocate_from_new_pool")),
    ("glib", ("g_malloc*", "g_realloc*", "g_try_malloc*", "g_try_realloc*", "g_slice_alloc*", "g_memdup*",
              "g_strdup*", "g_strndup")),
    ("openssl", ("CRYPTO_malloc", "CRYPTO_zalloc", "CRYPTO_realloc", "CRYPTO_clear_realloc", "CRYPTO_memdup",
                 "CRYPTO_strdup", "CRYPTO_strndup", "CRYPTO_secure_malloc", "CRYPTO_secure_zalloc")),
    ("xmalloc", ("xmalloc", "xcalloc", "xzalloc", "xrealloc", "xreallocarray", "xnmalloc", "xnrealloc",
                 "x2realloc", "x2nrealloc", "xcharalloc", "xmemdup", "xstrdup", "xstrndup")),
)
USER_FOLD = "--fold"  # the `from` of a pattern the user gave
_GLOB_CHARS = frozenset("*?[")
_OPEN, _CLOSE = "<([", ">)]"


def _split_fold(value: str) -> list[str]:
    """'a,b' -> ['a', 'b']; a comma inside <...>, (...) or [...] belongs to the name
    (`std::map<int, int>::insert`, `f(int, long)`)."""
    out, cur, depth = [], [], 0
    for ch in value:
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE and depth:
            depth -= 1
        cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out]


def parse_fold(values: str | list[str] | tuple[str, ...] | None) -> Folding:
    """The one normalizer of `--fold FUNC[,FUNC]` (repeatable) for every command: FUNC is an
    exact function name, or a glob (fnmatch `*`, `?`, `[...]`, case-sensitive) when it holds one
    of those; either way it is matched against the whole symbolized name (C++ names include
    their parameters: `Pool::get*`). Duplicates are dropped, order kept. UsageError for an empty
    name or a pattern without a literal character (it would fold every frame)."""
    if isinstance(values, str):
        values = [values]
    patterns: list[str] = []
    for value in values or ():
        for p in _split_fold(value):
            if not p:
                raise UsageError(f"--fold wants FUNC[,FUNC...] (e.g. --fold my_alloc,'pool_*'), not {value!r}")
            if not set(p) - _GLOB_CHARS - set("]!"):
                raise UsageError(f"--fold {p!r} would fold every frame: give a function name or a pattern "
                                 "with some of its letters (e.g. 'pool_*')")
            if p not in patterns:
                patterns.append(p)
    return Folding(tuple(patterns))


class Folding:
    """Which application wrappers are folded out of sites (allocator entry points and language
    wrappers, WRAPPER_PATTERNS, always are): the built-in APP_WRAPPERS plus the user's `--fold`
    patterns. Build it with `parse_fold`; `None` anywhere a `fold` is taken means the built-ins
    only."""

    def __init__(self, user: tuple[str, ...] = ()) -> None:
        self.user = tuple(user)
        self.patterns: list[tuple[str, str]] = [(lib, p) for lib, pats in APP_WRAPPERS for p in pats] + \
            [(USER_FOLD, p) for p in self.user]
        self._rx = [(src, p, re.compile(fnmatch.translate(p) if _GLOB_CHARS & set(p) else re.escape(p) + r"\Z"))
                    for src, p in self.patterns]
        self._any = re.compile("|".join(f"(?:{rx.pattern})" for _, _, rx in self._rx))
        self._cache: dict[str, tuple[str, str] | None] = {}

    def match(self, function: str) -> tuple[str, str] | None:
        """(library or '--fold', pattern) of the first pattern matching the whole name, or None."""
        hit = self._cache.get(function, False)
        if hit is False:
            hit = None
            if self._any.match(function):
                hit = next((src, p) for src, p, rx in self._rx if rx.match(function))
            self._cache[function] = hit
        return hit

    def __repr__(self) -> str:
        return f"Folding(user={self.user!r})"


DEFAULT_FOLDING = Folding()

# What the trace's `source` names (tracer/layout.py SOURCE_NAMES; tests/test_layout.py checks these
# against it) are, as far as the figures go. GPU memory is never host memory: it is kept out of
# every host figure (live, peak, threads, RSS) and reported in device_* figures of its own.
DEVICE_SOURCES = frozenset({"cuda-device"})
CUDA_HOST_SOURCES = ("cuda-pinned", "cuda-managed")  # host memory made by the CUDA driver
CUDA_SOURCES = frozenset({"cuda-device", *CUDA_HOST_SOURCES})
# Host memory the kernel counts in RssShmem (shared anonymous, memfd, tmpfs; pinned host memory
# is a shared mapping the driver makes) and in RssFile through a device file (managed memory is
# a mapping of /dev/nvidia-uvm; other character devices).
SHMEM_SOURCES = ("shmem", "cuda-pinned")
DEVICE_FILE_SOURCES = ("cuda-managed", "device")
# The live table's api of a cuMemHostRegister_v2: it pins memory the program already has (a
# malloc'd block, counted at its own site), so it adds nothing to RssShmem.
REGISTER_API = "cu_host_register"


def is_device(sources) -> np.ndarray:
    """Per source name: True for GPU memory (DEVICE_SOURCES)."""
    return np.isin(np.asarray(sources, dtype=object), list(DEVICE_SOURCES))

LOSS_ADVICE = {
    "lost_live_full": "the live-allocation map was full: raise --max-live",
    "lost_live_full_bytes": None,
    "lost_stack_full": "the stack map was full: some bytes are shown under '[stack lost]'",
    "lost_stack_err": "some stacks could not be read: those bytes are under '[stack lost]'",
    "lost_site_full": "the site map was full: bytes counted in totals but not per site",
    "lost_inflight_full": "no kernel memory for a thread's entry state: some calls were not seen",
    "lost_unmatched_ret": "returns without their entry (normal right after attach; large values mean missed calls)",
    "lost_stale_entry": "entries whose return was never seen (a thread left malloc abnormally)",
    "lost_ring_full": "the event ring overflowed: some mmap/munmap/thread events are missing",
    "lost_flow_full": "the thread-flow map was full: some cross-thread frees are not in the flow table",
    "lost_stack_truncated": "some stacks were cut short (deeper than 64 frames, or code the DWARF unwinder "
                            "cannot follow): their sites show the innermost frames only",
}


@dataclass(frozen=True)
class FrameInfo:
    function: str
    module: str
    file: str | None
    line: int | None
    # Inlined into the next (outer) frame, at the same address; not part of equality.
    inlined: bool = field(default=False, compare=False)

    def as_dict(self) -> dict:
        return {"function": self.function, "module": self.module, "file": self.file, "line": self.line}


UNKNOWN_STACK = (FrameInfo("[stack lost]", "", None, None),)


def symbolize_stacks(trace: Trace, progress=None) -> dict[int, tuple[FrameInfo, ...]]:
    """stack_id -> frames innermost first, every frame symbolized (offline, pyelftools). A frame
    whose address lies in inlined code expands to the inlined functions (`inlined=True`, innermost
    first) followed by the function they were inlined into."""
    from .embedded import load as embedded_symbols  # noqa: PLC0415
    from .symbolize import Symbolizer  # noqa: PLC0415

    if trace.stacks.empty:
        return {0: UNKNOWN_STACK}
    return symbolize_stack_rows(trace.stacks, Symbolizer(progress=progress), lambda: embedded_symbols(trace))


def symbolize_stack_rows(st: pd.DataFrame, sym, embedded: Callable | None = None,
                         resolved: dict[tuple[str, int], tuple[FrameInfo, ...]] | None = None
                         ) -> dict[int, tuple[FrameInfo, ...]]:
    """symbolize_stacks for rows of the `stacks` table (`st`), with the caller's `sym` (a
    reports.symbolize.Symbolizer: it keeps every module it parsed, so a caller that symbolizes
    stacks as they come — `allocscope top` — parses each ELF file once). `embedded`: returns the
    trace's embedded symbols (reports.embedded), called only when a module file is missing.
    `resolved`: (module, offset) -> frames already looked up, kept by such a caller between
    calls (and filled here), so an address shared by many stacks is looked up once."""
    from .symbolize import Frame, unknown_name  # noqa: PLC0415

    if st.empty:
        return {0: UNKNOWN_STACK}
    st = st.drop_duplicates(["stack_id", "idx"]).sort_values(["stack_id", "idx"])
    resolved = {} if resolved is None else resolved
    table = None  # the embedded symbols, read when needed
    todo = st[(st["offset"] >= 0) & st["function"].isna()]
    for (module, build_id), grp in todo.groupby(["module", "build_id"], sort=False, dropna=False):
        build_id = build_id if isinstance(build_id, str) else None
        offsets = sorted(o for o in {int(o) for o in grp["offset"]} if (module, o) not in resolved)
        if not offsets:
            continue
        res = sym.symbolize(module, offsets, build_id=build_id or None, return_addresses=True)
        for off in offsets:
            found = res.get(off) or []
            if found and found[-1].function == unknown_name(module, off):
                # not a call's return address: a signal handler returns to the first byte of
                # the trampoline (__restore_rt), whose ip - 1 is outside any function
                exact = sym.symbolize(module, [off], build_id=build_id or None, return_addresses=False)
                found = exact.get(off) or found
            if (not found or found[-1].function == unknown_name(module, off)) and embedded is not None:
                table = table if table is not None else embedded()  # module file missing
                name = table.lookup(build_id, module, off)
                found = [Frame(name, module, None, None, off)] if name else found
            resolved[(module, off)] = tuple(
                FrameInfo(f.function, module, f.file, f.line, inlined=f.inlined) for f in found) or (
                FrameInfo(f"{os.path.basename(module)}+{off:#x}", module, None, None),)
    out: dict[int, tuple[FrameInfo, ...]] = {0: UNKNOWN_STACK}
    for sid, grp in st.groupby("stack_id", sort=False):
        frames = []
        for module, off, ip, fn, file, line in zip(grp["module"], grp["offset"], grp["ip"], grp["function"],
                                                   grp["file"], grp["line"]):
            if isinstance(fn, str):
                frames.append(FrameInfo(fn, module, file if isinstance(file, str) else None,
                                        None if pd.isna(line) else int(line)))
            elif off >= 0:
                frames.extend(resolved[(module, int(off))])
            else:
                frames.append(FrameInfo(f"{module or '[anon]'}@{int(ip):#x}", module, None, None))
        out[int(sid)] = tuple(frames)
    return out


_PREFIX_RX = re.compile(r"^(__GI_|__libc_|__)+")


def is_wrapper(function: str) -> bool:
    """An allocator entry point, syscall wrapper or language allocation shim."""
    return bool(_WRAPPER_RX.search(function) or _WRAPPER_RX.search(_PREFIX_RX.sub("", function)))


_ENTRY_RX = re.compile(r"^(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|"
                       r"valloc|pvalloc|malloc_trim|mmap|mmap64|munmap|mremap|brk|sbrk|madvise)$")


def is_allocator_entry(function: str) -> bool:
    """An allocator's public entry point or a libc memory syscall wrapper (after glibc's
    __GI_/__libc_ prefixes): the frames inside one of these are the allocator's internals."""
    return bool(_ENTRY_RX.match(_PREFIX_RX.sub("", function)))


def fold_frames(frames: tuple[FrameInfo, ...], fold: Folding | None = None) -> tuple[FrameInfo, ...]:
    """Drop the innermost frames that belong to the allocator: its internals (sysmalloc,
    _int_malloc... — frames of the same module inside an allocator entry point), the entry
    point itself (malloc, libc's mmap wrapper...), and the wrappers right around it: language
    ones (operator new, __rust_alloc, alloc::raw_vec::*, std::vector internals...) and the
    application wrappers of `fold` (built-in: zmalloc, PyObject_Malloc, g_malloc...; plus the
    user's --fold). Only an exact entry-point name swallows the frames inside it, and wrappers
    fold only as an unbroken run from the allocator's side, so a wrapper-looking frame far up
    a statically linked program (one module) never folds the program away. At least the
    outermost frame is kept."""
    fold = fold or DEFAULT_FOLDING
    cut = 0
    for j, f in enumerate(frames[:-1]):
        if is_allocator_entry(f.function) and \
                all(g.module == f.module or is_wrapper(g.function) for g in frames[:j]):
            cut = j + 1
    while cut < len(frames) - 1 and (is_wrapper(frames[cut].function) or fold.match(frames[cut].function)):
        cut += 1
    return frames[cut:]


def folded_wrappers(stacks: Iterable[tuple[FrameInfo, ...]], fold: Folding | None = None) -> list[dict]:
    """What the application-wrapper patterns folded out of these stacks (full frames, e.g.
    `symbolize_stacks(...).values()`), for the report's
    `folded`: one entry per pattern that folded a frame, and per user pattern even when it
    folded none — {"pattern", "from" (library of a built-in, or '--fold'), "functions" (the
    names it folded, sorted)}, built-ins in APP_WRAPPERS order, then the user's."""
    fold = fold or DEFAULT_FOLDING
    hits: dict[tuple[str, str], set[str]] = {(USER_FOLD, p): set() for p in fold.user}
    seen: set[tuple[FrameInfo, ...]] = set()
    for frames in stacks:
        if frames in seen:
            continue
        seen.add(frames)
        for f in frames[:len(frames) - len(fold_frames(frames, fold))]:
            m = None if is_wrapper(f.function) else fold.match(f.function)
            if m is not None:
                hits.setdefault(m, set()).add(f.function)
    return [{"pattern": p, "from": src, "functions": sorted(hits[(src, p)])}
            for src, p in fold.patterns if (src, p) in hits]


def site_table(trace: Trace, stacks: dict[int, tuple[FrameInfo, ...]] | None = None, progress=None,
               fold: Folding | None = None, at_seq: int | None = None) -> pd.DataFrame:
    """One row per (site, thread, source) at the end of the recording (with `at_seq`: at the
    end of that interval), with `site` (frames folded by `fold_frames`) and `full_frames`.
    Columns: site, full_frames, stack_id, tid, source, alloc_bytes, alloc_count, free_bytes,
    free_count, live_bytes, live_count, peak_live_bytes, device (True for GPU memory,
    DEVICE_SOURCES: bytes that are not host memory)."""
    if stacks is None:
        stacks = symbolize_stacks(trace, progress)
    if at_seq is None:
        df = trace.final_sites()
    else:  # the cumulative counters as they stood then: the rows up to that interval
        df = replace(trace, sites=trace.sites[trace.sites["seq"] <= at_seq], live=None).final_sites()
    full = [stacks.get(int(s), UNKNOWN_STACK) for s in df["stack_id"]]
    df["full_frames"] = full
    df["site"] = [fold_frames(f, fold) for f in full]
    df["device"] = is_device(df["source"])
    return df


SiteKey = tuple[FrameInfo, ...]
SORT_KEYS = ("live", "peak", "growth", "age")

# Verdict rules (documented in `verdict`).
FIT_TAIL_FRACTION = 0.5      # growth is fitted over the last half of the recording...
MIN_FIT_POINTS = 4           # ...but over at least this many intervals; fewer: never "growing"
GROWTH_MIN_R2 = 0.8          # a line must explain >= 80% of the variance to call it growth
GROWTH_MIN_RISE = 0.10       # and the rise over the fit window must be >= 10% of the live bytes
TRANSIENT_MAX_FRACTION = 0.25  # live at the end <= 25% of the peak: the peak was mostly freed
PEAK_FIRST_MAX_FRACTION = 0.25  # the same for the whole process: reports lead with the peak (peak_first)
TIMELINE_POINTS = 50         # at most this many points of each site's timeline in the JSON


def _site_lookup(st: pd.DataFrame) -> Callable[[tuple], SiteKey]:
    """(stack_id, tid, source) -> site, for `_timeline`, from a `site_table` frame."""
    m = {(int(a), int(b), c): site for a, b, c, site in zip(st["stack_id"], st["tid"], st["source"], st["site"])}
    return lambda k: m.get((int(k[0]), int(k[1]), k[2]), UNKNOWN_STACK)


def _timeline(trace: Trace, keycol_fn: Callable[[tuple], Hashable], device: bool | None = None) -> pd.DataFrame:
    """live bytes per interval (rows: seq 1..n) per group (columns), forward-filled cumulative.
    `keycol_fn` maps a (stack_id, tid, source) key to its group. `device`: only GPU memory
    (True), only host memory (False), both (None)."""
    s = trace.sites
    if device is not None and not s.empty:
        s = s[is_device(s["source"]) == device]
    if s.empty:
        return pd.DataFrame(index=pd.RangeIndex(1, trace.last_seq + 1, name="seq"))
    s = s.assign(live=s["alloc_bytes"] - s["free_bytes"])
    key = list(zip(s["stack_id"], s["tid"], s["source"]))
    piv = pd.DataFrame({"seq": s["seq"].to_numpy(), "key": key, "live": s["live"].to_numpy()})
    wide = piv.pivot_table(index="seq", columns="key", values="live", aggfunc="last")
    wide = wide.reindex(range(1, trace.last_seq + 1)).ffill().fillna(0)
    groups = [keycol_fn(k) for k in wide.columns]
    codes: dict = {}
    idx = [codes.setdefault(g, len(codes)) for g in groups]
    summed = wide.T.groupby(np.array(idx), sort=False).sum().T.astype("int64")
    by_code = {v: k for k, v in codes.items()}
    summed.columns = pd.Index([by_code[c] for c in summed.columns], tupleize_cols=False)
    summed.index.name = "seq"
    return summed


def site_timeline(trace: Trace, stacks=None, fold: Folding | None = None, device: bool = False) -> pd.DataFrame:
    """Live bytes per site over time: index = interval seq (1..n), one column per site
    (folded frames tuple), values = live host bytes at the end of that interval (with
    `device`: GPU memory instead)."""
    return _timeline(trace, _site_lookup(site_table(trace, stacks, fold=fold)), device=device)


def elapsed_s(trace: Trace) -> pd.Series:
    """Seconds since the start of the recording at the end of every interval, indexed by seq
    1..n (gaps, e.g. an unreadable part, are interpolated)."""
    iv = trace.intervals.set_index("seq")
    idx = pd.RangeIndex(1, trace.last_seq + 1, name="seq")
    if "elapsed_s" in iv:
        el = iv["elapsed_s"].astype(float).reindex(idx)
    else:
        el = pd.Series(np.nan, index=idx)
    fallback = pd.Series(idx.to_numpy() * float(trace.meta.get("interval_s") or 1.0), index=idx)
    return el.interpolate(limit_area="inside").fillna(fallback)


def end_time_ns(trace: Trace) -> int:
    """CLOCK_MONOTONIC time of the last interval (the clock of `live.ts_ns`)."""
    last = trace.intervals.iloc[-1]
    if "ts_ns" in trace.intervals and not pd.isna(last["ts_ns"]):
        return int(last["ts_ns"])
    t0 = int((trace.meta.get("clock") or {}).get("monotonic_ns", 0))
    return t0 + int(float(last.get("elapsed_s", 0.0)) * 1e9)


def fit_window(n: int) -> int:
    """Number of trailing intervals the growth line is fitted over (see `verdict`)."""
    return min(n, max(MIN_FIT_POINTS, math.ceil(n * FIT_TAIL_FRACTION)))


def fit_growth(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares line through every column of `y` (m points x k series) over `x` (m,):
    (slope per column in y-units per x-unit, R² per column). R² is 1.0 for a series the line
    fits exactly (a constant included) and NaN with fewer than 3 points."""
    y = np.asarray(y, dtype=float).reshape(len(x), -1)
    k = y.shape[1]
    if len(x) < 2:
        return np.zeros(k), np.full(k, np.nan)
    xc = np.asarray(x, dtype=float) - np.mean(x)
    sxx = float(xc @ xc)
    if sxx == 0:
        return np.zeros(k), np.full(k, np.nan)
    yc = y - y.mean(axis=0)
    slope = (xc @ yc) / sxx
    ss_tot = (yc ** 2).sum(axis=0)
    ss_res = ((yc - np.outer(xc, slope)) ** 2).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), 1.0)
    if len(x) < 3:
        r2 = np.full(k, np.nan)
    return slope, np.clip(r2, 0.0, 1.0)


def verdict(live_bytes: int, peak_live_bytes: int, growth_bytes_per_s: float, growth_r2: float | None,
            window_s: float, window_points: int) -> str:
    """What a site's memory did, at a glance. The first rule that matches wins:

    1. ``freed``: nothing of it is live at the end (live bytes == 0).
    2. ``transient``: live at the end <= 25% of its peak: it peaked, then most was freed.
    3. ``growing``: over the fit window (the last half of the recording, at least 4 intervals;
       never with fewer intervals) the least-squares slope of its live bytes is > 0, the fit
       is good (R² >= 0.8, so noise is not called growth) and the rise the line predicts over
       the window (slope x window seconds) is >= 10% of its live bytes at the end.
    4. ``plateaued``: anything else: memory is held, not released, not clearly rising.
    """
    if live_bytes <= 0:
        return "freed"
    if live_bytes <= TRANSIENT_MAX_FRACTION * peak_live_bytes:
        return "transient"
    if (window_points >= MIN_FIT_POINTS and growth_bytes_per_s > 0 and growth_r2 is not None
            and not math.isnan(growth_r2) and growth_r2 >= GROWTH_MIN_R2
            and growth_bytes_per_s * window_s >= GROWTH_MIN_RISE * live_bytes):
        return "growing"
    return "plateaued"


def growth_table(timeline: pd.DataFrame, elapsed: pd.Series) -> pd.DataFrame:
    """Per timeline column (index: the column keys): growth_bytes_per_s and growth_r2 of the
    line fitted over the last `fit_window` intervals, window_s (seconds the window spans) and
    window_points."""
    n = len(timeline)
    w = fit_window(n)
    if timeline.shape[1] == 0 or w == 0:
        return pd.DataFrame(columns=["growth_bytes_per_s", "growth_r2", "window_s", "window_points"],
                            index=timeline.columns)
    tail = timeline.iloc[n - w:]
    x = elapsed.reindex(tail.index).to_numpy(dtype=float)
    slope, r2 = fit_growth(x, tail.to_numpy())
    return pd.DataFrame({"growth_bytes_per_s": slope, "growth_r2": r2,
                         "window_s": float(x[-1] - x[0]), "window_points": w}, index=timeline.columns)


def oldest_ages(trace: Trace, stacks: dict[int, SiteKey], fold: Folding | None = None) -> dict[SiteKey, float]:
    """site -> age in seconds of its oldest allocation still outstanding at the end (from the
    final `live` table; a trace cut short has none, and its sites get no age)."""
    if not trace.live_rows:
        return {}
    end = end_time_ns(trace)
    # Hash aggregates over the (possibly millions of) live blocks, batch by batch; the result
    # has a row a stack.
    first: dict[int, int] = {}
    for b in trace.live_batches(["stack_id", "ts_ns"]):
        agg = pa.table({"s": b["stack_id"], "t": b["ts_ns"].astype(np.int64, copy=False)}) \
            .group_by("s").aggregate([("t", "min")])
        for sid, ts in zip(agg["s"].to_pylist(), agg["t_min"].to_pylist()):
            first[sid] = min(ts, first.get(sid, ts))
    out: dict[SiteKey, float] = {}
    for sid, ts in first.items():
        site = fold_frames(stacks.get(int(sid), UNKNOWN_STACK), fold)
        age = max(0.0, (end - int(ts)) / 1e9)
        out[site] = max(out.get(site, 0.0), age)
    return out


RANK_COLUMNS = ["rank", "site", "full_frames", "live_bytes", "live_count", "peak_live_bytes", "alloc_bytes",
                "alloc_count", "free_bytes", "free_count", "sources", "threads", "growth_bytes_per_s",
                "growth_r2", "oldest_age_s", "verdict", "timeline", "at_peak_bytes",
                "device_live_bytes", "device_live_count", "device_peak_bytes", "device_alloc_bytes",
                "device_alloc_count", "device_free_bytes", "device_free_count", "live_by_source"]
DEVICE_SUMS = ("live_bytes", "live_count", "alloc_bytes", "alloc_count", "free_bytes", "free_count")


def peak_seq(trace: Trace) -> int | None:
    """The interval (seq) at whose end the process's live total (`intervals.live_bytes`) was
    highest — the first of equal ones; None when nothing was ever live."""
    iv = trace.intervals
    if iv.empty or "live_bytes" not in iv:
        return None
    iv = iv.sort_values("seq")
    lb = iv["live_bytes"].to_numpy()
    i = int(np.argmax(lb))
    return int(iv["seq"].iloc[i]) if lb[i] > 0 else None


def peak_first(tot: dict) -> bool:
    """Whether people-facing reports (text, HTML) lead with the sites that held the peak: most
    of the peak was freed by the end, i.e. live at the end <= PEAK_FIRST_MAX_FRACTION (25%) of
    the peak live bytes (`totals`) — a daemon that shut down cleanly, a burst that is over.
    The target's exit alone is no reason: a program that exits holding leaks has them live at
    the end, and they are what its report is for."""
    peak = int(tot.get("peak_live_bytes") or 0)
    return peak > 0 and int(tot.get("live_bytes") or 0) <= PEAK_FIRST_MAX_FRACTION * peak


def sort_sites(df: pd.DataFrame, sort: str) -> pd.DataFrame:
    """Order rows of rank_sites by `sort` (see rank_sites); ties by live, peak, allocated bytes,
    then by the innermost frame so the order is deterministic."""
    tie = ["live_bytes", "peak_live_bytes", "alloc_bytes", "device_live_bytes", "device_peak_bytes"]
    df = df.assign(_growing=df["verdict"] == "growing",
                   _age=df["oldest_age_s"].astype(float).fillna(-1.0),
                   _name=[frame_key_text(s) for s in df["site"]])
    first = {"live": [], "peak": ["peak_live_bytes"], "growth": ["_growing", "growth_bytes_per_s"],
             "age": ["_age"], "at_peak": ["at_peak_bytes", "peak_live_bytes"]}[sort]
    cols = first + [c for c in tie if c not in first and c in df.columns]  # the live view has no device_*
    df = df.sort_values(cols + ["_name"], ascending=[False] * len(cols) + [True], kind="mergesort")
    return df.drop(columns=["_growing", "_age", "_name"])


def frame_key_text(site: SiteKey) -> str:
    """A stable one-line text of a site, for deterministic tie-breaking and messages."""
    return " < ".join(f"{f.function}@{os.path.basename(f.file or '')}:{f.line or ''}" for f in site)


def rank_sites(trace: Trace, stacks=None, progress=None, sort: str = "live",
               fold: Folding | None = None) -> pd.DataFrame:
    """Sites ranked by `sort`. One row per site; columns:

    rank (1-based), site (folded frames tuple, innermost first), full_frames (one unfolded
    stack of the site), live_bytes, live_count (outstanding at the end), peak_live_bytes
    (highest live bytes seen), alloc_bytes, alloc_count, free_bytes, free_count (totals over
    the recording), sources (sorted list of the trace's source names: 'heap', 'mmap', 'brk',
    'fault', 'shmem', 'cuda-pinned', 'cuda-managed', 'device', 'cuda-device'), threads (list of
    (tid, live_bytes, device_live_bytes), live desc), growth_bytes_per_s, growth_r2
    (least-squares slope of live bytes over the last half of the recording and its R², NaN when
    too short), oldest_age_s (age at the end of its oldest outstanding allocation, NaN when
    unknown), verdict (see `verdict`), timeline (list of live bytes at the end of every
    interval), at_peak_bytes (its live bytes at the end of the interval where the process's
    live total was highest, `peak_seq`; 0 when none), device_live_bytes, device_live_count,
    device_peak_bytes, device_alloc_bytes, device_alloc_count, device_free_bytes,
    device_free_count (the same for its GPU memory), live_by_source ({source: live bytes at the
    end}, GPU memory included, sources with allocations only).

    Host and GPU memory never mix: every figure without `device_` counts host memory only (GPU
    memory, DEVICE_SOURCES, is in the device_* columns), so a site of GPU memory alone has
    live_bytes 0. Its verdict and growth are then those of its GPU memory (a site is judged on
    the memory it has; its `timeline` stays the host series, all zero).

    sort: ``live`` (live bytes at the end), ``peak`` (peak live bytes), ``growth`` (growing
    sites first, then by slope), ``age`` (oldest outstanding allocation first); ties by live,
    peak and allocated bytes, device live and peak bytes, all descending. `fold`: see
    fold_frames (None: built-ins only).
    """
    if sort not in SORT_KEYS:
        raise UsageError(f"unknown sort {sort!r}; choose one of {', '.join(SORT_KEYS)}")
    st = site_table(trace, stacks, progress, fold=fold)
    if st.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    if stacks is None:
        stacks = {int(s): f for s, f in zip(st["stack_id"], st["full_frames"])}
    lookup = _site_lookup(st)
    tl = _timeline(trace, lambda k: (lookup(k), bool(k[2] in DEVICE_SOURCES)))
    series = {key: tl.iloc[:, i].to_numpy() for i, key in enumerate(tl.columns)}
    growth = growth_table(tl, elapsed_s(trace)).to_dict("index")
    ages = oldest_ages(trace, stacks, fold)
    at = peak_seq(trace)
    no_growth = {"growth_bytes_per_s": 0.0, "growth_r2": math.nan, "window_s": 0.0, "window_points": 0}
    empty = np.zeros(0, dtype="int64")
    # Every per-site figure in a few vectorized group-bys (sites number in the thousands): the
    # counters split into host and GPU columns, keyed by the site's code.
    codes, uniques = pd.factorize(pd.Series(st["site"].tolist(), dtype=object))
    sites = uniques.tolist()
    sums = ["live_bytes", "live_count", "alloc_bytes", "alloc_count", "free_bytes", "free_count"]
    dev = st["device"].to_numpy(dtype=bool)
    x = st.assign(code=codes, **{f"device_{c}": np.where(dev, st[c], 0) for c in sums},
                  **{c: np.where(dev, 0, st[c]) for c in sums},
                  host_peak=np.where(dev, 0, st["peak_live_bytes"]), dev_peak=np.where(dev, st["peak_live_bytes"], 0))
    by = x.groupby("code", sort=False)
    agg = by[sums + [f"device_{c}" for c in sums] + ["host_peak", "dev_peak"]] \
        .agg({**dict.fromkeys(sums + [f"device_{c}" for c in sums], "sum"), "host_peak": "max", "dev_peak": "max"})
    # one unfolded stack of the site: the row that allocated most (host and GPU bytes alike)
    first_max = st["alloc_bytes"].groupby(codes, sort=False).idxmax()
    full = dict(zip(first_max.index, st["full_frames"].to_numpy()[first_max.to_numpy()]))
    threads: dict[int, list] = {}
    per_tid = x.groupby(["code", "tid"], sort=False)[["live_bytes", "device_live_bytes"]].sum().reset_index() \
        .sort_values(["code", "live_bytes", "device_live_bytes", "tid"], ascending=[True, False, False, True],
                     kind="mergesort")
    for c, t, a, b in zip(per_tid["code"], per_tid["tid"], per_tid["live_bytes"], per_tid["device_live_bytes"]):
        threads.setdefault(int(c), []).append((int(t), int(a), int(b)))
    by_source: dict[int, dict[str, int]] = {}
    per_src = st.assign(code=codes).groupby(["code", "source"], sort=True)["live_bytes"].sum()
    for (c, src), v in per_src.items():
        by_source.setdefault(int(c), {})[str(src)] = int(v)
    rows = []
    for c, a in zip(agg.index, agg.itertuples(index=False)):
        site = sites[c]
        line, dline = series.get((site, False), empty), series.get((site, True), empty)
        live, dlive = int(a.live_bytes), int(a.device_live_bytes)
        peak = int(max(line.max(initial=0), a.host_peak, live))
        dpeak = int(max(dline.max(initial=0), a.dev_peak, dlive))
        # judged on its host memory, or on its GPU memory when it has no host allocations
        judged = (site, not a.alloc_count and bool(a.device_alloc_count))
        gr = growth.get(judged, no_growth)
        slope, r2 = float(gr["growth_bytes_per_s"]), float(gr["growth_r2"])
        jl, jp = (dlive, dpeak) if judged[1] else (live, peak)
        rows.append({
            "site": site, "full_frames": full[c],
            "live_bytes": live, "live_count": int(a.live_count), "peak_live_bytes": peak,
            "alloc_bytes": int(a.alloc_bytes), "alloc_count": int(a.alloc_count),
            "free_bytes": int(a.free_bytes), "free_count": int(a.free_count),
            "sources": sorted(by_source[int(c)]), "threads": threads[int(c)],
            "growth_bytes_per_s": slope, "growth_r2": r2,
            "oldest_age_s": ages.get(site, math.nan),
            "verdict": verdict(jl, jp, slope, r2, float(gr["window_s"]), int(gr["window_points"])),
            "timeline": [int(v) for v in line] if len(line) else [0] * len(tl),
            "at_peak_bytes": int(line[at - 1]) if at is not None and len(line) >= at else 0,
            "device_peak_bytes": dpeak, **{f"device_{k}": int(getattr(a, f"device_{k}")) for k in DEVICE_SUMS},
            "live_by_source": by_source[int(c)],
        })
    df = sort_sites(pd.DataFrame(rows), sort)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df[RANK_COLUMNS].reset_index(drop=True)


def _thread_peaks(trace: Trace, group_of_tid: Callable[[int], Hashable], st: pd.DataFrame,
                  device: bool = False) -> dict:
    """group -> peak live bytes of its host memory (`device`: of its GPU memory): the highest
    of its summed timeline and of any one key's peak."""
    tl = _timeline(trace, lambda k: group_of_tid(int(k[1])), device=device)
    peaks = tl.max().to_dict() if tl.shape[1] else {}
    st = st[is_device(st["source"]) == device]
    for tid, kp in st.groupby("tid")["peak_live_bytes"].max().items():
        g = group_of_tid(int(tid))
        peaks[g] = max(int(peaks.get(g, 0)), int(kp))
    return peaks


def _split_device(st: pd.DataFrame) -> pd.DataFrame:
    """Final site rows with their counters split by memory: host rows keep theirs in live_bytes,
    live_count, alloc_bytes, alloc_count (0 in a GPU row), GPU rows in device_live_bytes,
    device_live_count, device_alloc_bytes, device_alloc_count (0 in a host row)."""
    dev = is_device(st["source"])
    cols = ["live_bytes", "live_count", "alloc_bytes", "alloc_count"]
    return st.assign(**{f"device_{c}": np.where(dev, st[c], 0) for c in cols},
                     **{c: np.where(dev, 0, st[c]) for c in cols})


THREAD_COLUMNS = ["tid", "name", "live_bytes", "live_count", "peak_live_bytes", "alloc_bytes", "alloc_count",
                  "device_live_bytes", "device_live_count", "device_peak_bytes", "device_alloc_bytes",
                  "device_alloc_count"]


def thread_table(trace: Trace) -> pd.DataFrame:
    """Per allocating thread, ranked by live bytes. Columns: tid, name (last known name, '?'
    if never seen), live_bytes, live_count (outstanding at the end, allocated by this thread),
    peak_live_bytes, alloc_bytes, alloc_count — host memory only — and device_live_bytes,
    device_live_count, device_peak_bytes, device_alloc_bytes, device_alloc_count: the same for
    the GPU memory (DEVICE_SOURCES) it allocated."""
    st = trace.final_sites()
    names = trace.thread_names()
    if st.empty:
        return pd.DataFrame(columns=THREAD_COLUMNS)
    peaks = _thread_peaks(trace, int, st)
    dpeaks = _thread_peaks(trace, int, st, device=True)
    sums = ["live_bytes", "live_count", "alloc_bytes", "alloc_count"]
    g = _split_device(st).groupby("tid")[sums + [f"device_{c}" for c in sums]].sum().reset_index()
    g["peak_live_bytes"] = [int(max(peaks.get(int(t), 0), lb)) for t, lb in zip(g["tid"], g["live_bytes"])]
    g["device_peak_bytes"] = [int(max(dpeaks.get(int(t), 0), lb)) for t, lb in zip(g["tid"], g["device_live_bytes"])]
    g["name"] = [names.get(int(t), "?") for t in g["tid"]]
    g = g.sort_values(["live_bytes", "peak_live_bytes", "device_live_bytes", "tid"],
                      ascending=[False, False, False, True])
    return g[THREAD_COLUMNS].reset_index(drop=True)


_DIGITS_RX = re.compile(r"\d+")


def thread_group(name: str) -> str:
    """The name pattern of a thread: digit runs replaced by N (pworker-1..pworker-12 ->
    pworker-N), so pools of different sizes compare."""
    return _DIGITS_RX.sub("N", name)


THREAD_GROUP_COLUMNS = ["group", "threads", "live_bytes", "live_count", "peak_live_bytes", "alloc_bytes",
                        "alloc_count", "device_live_bytes", "device_peak_bytes"]


def thread_group_table(trace: Trace) -> pd.DataFrame:
    """Threads grouped by `thread_group` of their name, ranked by live bytes. Columns: group,
    threads (number of distinct tids: every thread seen or allocating), live_bytes, live_count,
    peak_live_bytes (peak of the group's summed live bytes), alloc_bytes, alloc_count (host
    memory only), device_live_bytes, device_peak_bytes (its GPU memory)."""
    st = trace.final_sites()
    names = trace.thread_names()
    tids = set(names) | {int(t) for t in st["tid"]}
    if not tids:
        return pd.DataFrame(columns=THREAD_GROUP_COLUMNS)
    group_of = {t: thread_group(names.get(t, "?")) for t in tids}
    peaks = _thread_peaks(trace, lambda t: group_of.get(t, "?"), st)
    dpeaks = _thread_peaks(trace, lambda t: group_of.get(t, "?"), st, device=True)
    st = _split_device(st).assign(group=[group_of[int(t)] for t in st["tid"]])
    counts = pd.Series(list(group_of.values())).value_counts()
    sums = (st.groupby("group")[["live_bytes", "live_count", "alloc_bytes", "alloc_count", "device_live_bytes"]]
            .sum().reindex(sorted(counts.index), fill_value=0))
    rows = [{"group": g, "threads": int(counts[g]), "live_bytes": int(s.live_bytes), "live_count": int(s.live_count),
             "peak_live_bytes": int(max(peaks.get(g, 0), s.live_bytes)), "alloc_bytes": int(s.alloc_bytes),
             "alloc_count": int(s.alloc_count), "device_live_bytes": int(s.device_live_bytes),
             "device_peak_bytes": int(max(dpeaks.get(g, 0), s.device_live_bytes))} for g, s in sums.iterrows()]
    df = pd.DataFrame(rows, columns=THREAD_GROUP_COLUMNS)
    df = df.sort_values(["live_bytes", "peak_live_bytes", "group"], ascending=[False, False, True], kind="mergesort")
    return df.reset_index(drop=True)


def flow_table(trace: Trace) -> pd.DataFrame:
    """Frees by (allocating thread, freeing thread), bytes desc. Columns: alloc_tid,
    alloc_thread, free_tid, free_thread (names), bytes, count (freed), mean_wait_s, max_wait_s
    (time between the allocation and its free)."""
    f = trace.final_flows()
    names = trace.thread_names()
    if f.empty:
        return pd.DataFrame(columns=["alloc_tid", "alloc_thread", "free_tid", "free_thread", "bytes", "count",
                                     "mean_wait_s", "max_wait_s"])
    f = f.copy()
    f["alloc_thread"] = [names.get(int(t), "?") for t in f["alloc_tid"]]
    f["free_thread"] = [names.get(int(t), "?") for t in f["free_tid"]]
    f["mean_wait_s"] = np.where(f["count"] > 0, f["wait_ns_sum"] / f["count"].clip(lower=1) / 1e9, 0.0)
    f["max_wait_s"] = f["wait_ns_max"] / 1e9
    return f.sort_values(["bytes", "alloc_tid", "free_tid"], ascending=[False, True, True])[
        ["alloc_tid", "alloc_thread", "free_tid", "free_thread", "bytes", "count", "mean_wait_s", "max_wait_s"]
    ].reset_index(drop=True)


def losses(trace: Trace) -> dict[str, int]:
    """Every lost_* counter at the end of the recording (cumulative)."""
    last = trace.intervals.iloc[-1]
    return {c: int(last[c]) for c in trace.intervals.columns if c.startswith("lost_") and not pd.isna(last[c])}


def _col_max(df: pd.DataFrame, col: str) -> int:
    return int(df[col].max()) if col in df and len(df) else 0


def _last(row: pd.Series, col: str) -> int:
    """An integer column of an intervals row; 0 when the trace has no such column."""
    v = row.get(col)
    return 0 if v is None or pd.isna(v) else int(v)


def source_layer(source: str) -> str:
    """What a source is: heap (the malloc family of any allocator: heap, heap:jemalloc:_rjem_...),
    kernel (mmap, brk, shmem, device files: memory straight from the kernel), cuda-host (pinned,
    managed), device (GPU memory), custom (a user's --alloc-fn: a layer above the others, its
    objects live in slabs they counted), fault (residency mode's sampled first touches)."""
    if source.startswith("custom:"):
        return "custom"
    if source in DEVICE_SOURCES:
        return "device"
    if source == "heap" or source.startswith("heap:"):
        return "heap"
    if source in CUDA_HOST_SOURCES:
        return "cuda-host"
    if source == "fault":
        return "fault"
    return "kernel"


def by_source(st: pd.DataFrame) -> dict[str, dict]:
    """{source: {layer, live_bytes, live_count, alloc_bytes, alloc_count}} at the end, sources
    in name order: the layers kept apart (a pool's objects beside the heap its slabs came from)."""
    if st.empty:
        return {}
    g = st.groupby("source")[["live_bytes", "live_count", "alloc_bytes", "alloc_count"]].sum().sort_index()
    return {str(src): {"layer": source_layer(str(src)), **{k: int(v) for k, v in row.items()}}
            for src, row in g.iterrows()}


def only_sources(trace: Trace, patterns: list[str]) -> Trace:
    """The trace with its sites (and live blocks) reduced to the sources matching `patterns`
    (exact names or globs: heap, 'heap*', 'custom:*'); UsageError when one matches nothing."""
    if not patterns:
        return trace
    have = sorted(set(trace.sites["source"].astype(str))) if len(trace.sites) else []
    keep: set[str] = set()
    for pat in patterns:
        hit = [s for s in have if fnmatch.fnmatchcase(s, pat)]
        if not hit:
            raise UsageError(f"--source {pat!r} matches no source of {trace.path} "
                             f"(it has: {', '.join(have) or 'none'})")
        keep |= set(hit)
    sites = trace.sites[trace.sites["source"].astype(str).isin(keep)]
    live = trace.live
    live = live[live["source"].astype(str).isin(keep)] if len(live) else live
    return replace(trace, sites=sites, live=live, live_table=None)


def parse_sources(values) -> list[str]:
    """--source values (repeatable, comma-separated) as a list of patterns."""
    out = [v.strip() for value in values or () for v in value.split(",")]
    if any(not v for v in out):
        raise UsageError("--source wants a source name or glob (heap, mmap, 'custom:*', 'heap:*')")
    return out


def live_by_source(trace: Trace, st: pd.DataFrame | None = None) -> dict[str, int]:
    """{source: live bytes at the end} summed over every site (GPU memory included), sources in
    name order, those that allocated anything only. `st`: trace.final_sites(), when at hand."""
    st = trace.final_sites() if st is None else st
    if st.empty:
        return {}
    return {str(k): int(v) for k, v in st.groupby("source")["live_bytes"].sum().sort_index().items()}


def totals(trace: Trace) -> dict:
    """Whole-process numbers: live_bytes, live_count (tracked and outstanding at the end),
    peak_live_bytes, rss_bytes (last sample while the target was readable), peak_rss_bytes
    (highest sample), hwm_bytes (kernel VmHWM), lost_events (sum of the lost_* counters except
    byte counts), losses (the non-zero lost_* counters), heap_live_bytes, mmap_live_bytes,
    duration_s, intervals — host memory only — and, kept apart: device_bytes (GPU memory live
    at the end, `intervals.device_live_bytes`), device_peak_bytes (its highest), device_count
    (GPU allocations live at the end, from the sites), cuda_host_bytes (pinned and managed host
    memory made through the CUDA driver API at the end, `intervals.cuda_host_live_bytes`; part of
    live_bytes), live_by_source (`live_by_source`). 0 for a trace made before GPU memory was
    traced."""
    iv = trace.intervals
    alive = iv[iv["rss_bytes"] >= 0] if "rss_bytes" in iv else iv.iloc[0:0]
    last = iv.iloc[-1]
    lost = losses(trace)
    peak_cols = [c for c in ("live_bytes", "heap_peak_bytes") if c in iv]
    st = trace.final_sites()
    device_count = int(st.loc[is_device(st["source"]), "live_count"].sum()) if len(st) else 0
    return {
        "live_bytes": int(last["live_bytes"]),
        # the kernel's block count holds the driver API's GPU allocations too: not host blocks
        "live_count": int(last["live_count"]) - device_count,
        "peak_live_bytes": max((_col_max(iv, c) for c in peak_cols), default=0),
        "rss_bytes": int(alive["rss_bytes"].iloc[-1]) if len(alive) else 0,
        "peak_rss_bytes": _col_max(alive, "rss_bytes"),
        "hwm_bytes": _col_max(alive, "hwm_bytes"),
        "lost_events": int(sum(v for k, v in lost.items() if not k.endswith("_bytes"))),
        "losses": {k: v for k, v in lost.items() if v},
        "heap_live_bytes": int(last.get("heap_live_bytes", 0)),
        "mmap_live_bytes": int(last.get("mmap_live_bytes", 0)),
        "duration_s": float(last.get("elapsed_s", 0.0)),
        "intervals": int(last["seq"]),
        "device_bytes": _last(last, "device_live_bytes"),
        "device_peak_bytes": max(_col_max(iv, "device_peak_bytes"), _col_max(iv, "device_live_bytes")),
        "device_count": device_count,
        "cuda_host_bytes": _last(last, "cuda_host_live_bytes"),
        "live_by_source": live_by_source(trace, st),
        "by_source": by_source(st),
    }


ARENA_COLUMNS = ["id", "kind", "live_bytes", "resident_bytes", "retained_bytes", "threads", "heaps",
                 "size_bytes", "estimated"]


def arena_table(trace: Trace) -> pd.DataFrame:
    """Allocator arenas at the end of the recording, ranked by retained bytes. Columns: id
    ('main', the arena address of a glibc thread arena, 'mmap' for the allocator's own mmapped
    chunks, 'other' for heap-API blocks outside those, e.g. jemalloc extents), kind
    (main|thread|mmap|other), live_bytes (blocks allocated after attach and still live),
    resident_bytes (pagemap at the end; None when unknown), retained_bytes (resident − live,
    at least 0: memory the allocator keeps that the program does not hold), threads (tids that
    allocated the live blocks), heaps (glibc heaps in the arena), size_bytes (mapped read-write),
    estimated (residency sampled, not read page by page, or a chunk range shared with CUDA host
    memory whose pages were taken off). The tracer measures every live block outside glibc's
    heaps as an allocator chunk, the pinned and managed memory the CUDA driver maps too: a range
    of such memory alone is left out, so RSS decomposition never calls it retained."""
    h = trace.heaps
    if h is None or h.empty:
        return pd.DataFrame(columns=ARENA_COLUMNS)
    h = h.sort_values("start").reset_index(drop=True)
    starts = h["start"].to_numpy(dtype=np.uint64)
    ends = h["reserved_end"].to_numpy(dtype=np.uint64)
    is_mmap = (h["kind"] == "mmap").to_numpy()
    n = len(h)
    other = n  # heap-API blocks in no known range
    live_sum: dict[int, int] = {}
    tids: dict[int, set[int]] = {}
    # Bytes of other blocks (CUDA host memory the driver mapped: the tracer measures every live
    # block outside glibc's heaps as an allocator chunk) in `mmap` ranges, page-rounded, and
    # whether a range holds any heap-API block at all.
    foreign = np.zeros(n, dtype=np.int64)
    has_heap = np.zeros(n, dtype=bool)
    page_mask = np.uint64(~(4096 - 1) & 0xFFFFFFFFFFFFFFFF)
    # One pass over the live blocks, batch by batch, no per-row Python: the range of each block
    # (or none), then exact hash aggregates per range.
    for b in trace.live_batches(["source", "addr", "size", "tid"]):
        addr, size, tid = b["addr"].astype(np.uint64, copy=False), b["size"], b["tid"]
        row = np.full(len(addr), -1, dtype=np.int32)
        if n <= 16:  # a few ranges (they never overlap): two compares a range
            for j in range(n):
                row[(addr >= starts[j]) & (addr < ends[j])] = j
        else:
            i = np.searchsorted(starts, addr, side="right") - 1
            ic = np.maximum(i, 0)
            ok = (i >= 0) & (addr < ends[ic])
            row[ok] = ic[ok]
        heap = b["heap"]
        if not heap.all():
            f = ~heap & (row >= 0)
            f[f] = is_mmap[row[f]]
            if f.any():
                lo, hi = addr[f] & page_mask, (addr[f] + size[f].astype(np.uint64) + np.uint64(4095)) & page_mask
                np.add.at(foreign, row[f], np.minimum(hi, ends[row[f]]).astype(np.int64) - lo.astype(np.int64))
            addr, size, tid, row = addr[heap], size[heap], tid[heap], row[heap]
        has_heap[row[row >= 0]] = True
        grp = np.where(row >= 0, row, other).astype(np.int32)
        tab = pa.table({"g": grp, "size": size.astype(np.int64, copy=False), "tid": tid})
        sums = tab.group_by("g").aggregate([("size", "sum")])
        for g, v in zip(sums["g"].to_pylist(), sums["size_sum"].to_pylist()):
            live_sum[g] = live_sum.get(g, 0) + v
        pairs = tab.group_by(["g", "tid"]).aggregate([])
        for g, t in zip(pairs["g"].to_pylist(), pairs["tid"].to_pylist()):
            tids.setdefault(g, set()).add(t)
    # an `mmap` range of CUDA host memory alone is no allocator chunk; one shared with chunks
    # (neighbouring mappings merged) loses those pages' bytes, an estimate from then on
    keep = ~(is_mmap & (foreign > 0) & ~has_heap)
    resident = h["resident_bytes"].to_numpy(dtype=np.int64) - foreign
    estimated = h["estimated"].to_numpy().astype(bool) | (foreign > 0)
    ids = np.where(h["kind"] == "main", "main", np.where(is_mmap, "mmap", h["arena"]))
    rows = []
    for aid in dict.fromkeys(ids[keep]):
        idx = np.flatnonzero((ids == aid) & keep)
        lb = int(sum(live_sum.get(int(j), 0) for j in idx))
        res = int(np.maximum(resident[idx], 0).sum())
        kind = str(h["kind"].iloc[idx[0]])
        rows.append({"id": str(aid), "kind": kind, "live_bytes": lb, "resident_bytes": res,
                     "retained_bytes": max(0, res - lb), "threads": sorted(set().union(*(tids.get(int(j), set())
                                                                                          for j in idx))),
                     "heaps": int(len(idx)) if kind != "mmap" else 0,
                     "size_bytes": int((h["end"].to_numpy()[idx] - h["start"].to_numpy()[idx]).sum()),
                     "estimated": bool(estimated[idx].any())})
    if other in live_sum:
        rows.append({"id": "other", "kind": "other", "live_bytes": int(live_sum[other]),
                     "resident_bytes": None, "retained_bytes": 0, "threads": sorted(tids.get(other, [])),
                     "heaps": 0, "size_bytes": 0, "estimated": False})
    df = pd.DataFrame(rows, columns=ARENA_COLUMNS)
    return df.sort_values(["retained_bytes", "live_bytes"], ascending=False).reset_index(drop=True)


def live_bytes_by_api(trace: Trace) -> dict[str, int]:
    """{api: bytes} of the final live table (the blocks outstanding at the end), summed in
    Arrow; {} for a trace without one (cut short)."""
    tab = trace.live_table
    if tab is None:
        df = trace.live
        return {str(k): int(v) for k, v in df.groupby("api", observed=True)["size"].sum().items()} if len(df) else {}
    out: dict[str, int] = {}
    # batch by batch: each row group of a part has its own dictionary of api names
    for b in tab.select(["api", "size"]).to_batches():
        api = b.column(0)
        key, names = (api.indices, api.dictionary.to_pylist()) if pa.types.is_dictionary(api.type) else (api, None)
        agg = pa.table({"k": key, "s": b.column(1)}).group_by("k").aggregate([("s", "sum")])
        for k, v in zip(agg["k"].to_pylist(), agg["s_sum"].to_pylist()):
            name = str(names[k] if names is not None else k)
            out[name] = out.get(name, 0) + int(v)
    return out


def shared_split(trace: Trace, shmem_bytes: int, file_bytes: int, by_source: dict[str, int] | None = None) -> dict:
    """Who holds RssShmem and the device share of RssFile at the end, host memory only:
    shmem_attributed_bytes (live bytes of shmem and cuda-pinned sites — shared anonymous, memfd
    and tmpfs mappings, pinned host memory — less the ranges cuMemHostRegister_v2 pinned in
    place, which are anonymous memory counted at their own site; at most RssShmem),
    shmem_unattributed_bytes (the rest of RssShmem: shared memory mapped before the attach or by
    means not traced, e.g. SysV shmat), shmem_sources ({source: live bytes} of those sites),
    file_device_bytes (live bytes of cuda-managed and device sites — mappings of device files:
    managed memory is /dev/nvidia-uvm — at most RssFile), file_regular_bytes (the rest of
    RssFile: executables, libraries, data files), file_device_sources. Live bytes are mapped
    sizes: pinned memory is resident at once, but a shared mapping never touched is not, so
    the attributed share is an upper bound where such mappings are sparse. `by_source`:
    live_by_source(trace), when at hand."""
    by_src = live_by_source(trace) if by_source is None else by_source
    shm = {k: by_src[k] for k in SHMEM_SOURCES if by_src.get(k)}
    registered = live_bytes_by_api(trace).get(REGISTER_API, 0) if shm.get("cuda-pinned") else 0
    if registered:
        shm["cuda-pinned"] = max(0, shm["cuda-pinned"] - registered)
    dev = {k: by_src[k] for k in DEVICE_FILE_SOURCES if by_src.get(k)}
    shm_att = min(max(shmem_bytes, 0), sum(shm.values()))
    file_dev = min(max(file_bytes, 0), sum(dev.values()))
    return {"shmem_attributed_bytes": shm_att, "shmem_unattributed_bytes": max(0, shmem_bytes - shm_att),
            "shmem_sources": shm, "file_device_bytes": file_dev,
            "file_regular_bytes": max(0, file_bytes - file_dev), "file_device_sources": dev}


def rss_decomposition(trace: Trace, arenas: pd.DataFrame | None = None,
                      by_source: dict[str, int] | None = None) -> dict | None:
    """RSS at the end split as: live heap (held by the program, resident) + retained by the
    allocator (resident, not held) + other anonymous (stacks, the program's own mmaps, memory of
    allocators we cannot see into) + file-backed + shared memory. The first two are measured
    (pagemap of the allocator's ranges); other anonymous is RssAnon minus the allocator's
    resident bytes. Shared memory and file are split further by `shared_split` (the shmem and
    pinned sites' share of RssShmem, the device-file share of RssFile). GPU memory is never in
    RSS and never here. None when the trace has no end-of-run residency. `by_source`:
    live_by_source(trace), when at hand."""
    arenas = arena_table(trace) if arenas is None else arenas
    iv = trace.intervals
    if "rss_anon_bytes" not in iv:
        return None
    alive = iv[iv["rss_bytes"] >= 0]
    if alive.empty:
        return None
    last = alive.iloc[-1]
    split = shared_split(trace, int(last["rss_shmem_bytes"]), int(last["rss_file_bytes"]), by_source)
    if arenas.empty or arenas["resident_bytes"].isna().all():
        # Not glibc (jemalloc, tcmalloc...): its retention cannot be told apart from other
        # anonymous memory; the live heap is what the program holds.
        held = min(int(last["heap_live_bytes"]), int(last["rss_anon_bytes"]))
        parts = {"live_heap_bytes": held, "retained_bytes": 0,
                 "other_anon_bytes": max(0, int(last["rss_anon_bytes"]) - held),
                 "file_bytes": int(last["rss_file_bytes"]), "shmem_bytes": int(last["rss_shmem_bytes"])}
        return {"rss_bytes": int(last["rss_bytes"]), **parts, "sum_bytes": sum(parts.values()),
                "allocator_resident_bytes": None, "retained_known": False, **split}
    known = arenas[arenas["resident_bytes"].notna()]
    resident = int(known["resident_bytes"].sum())
    held = int(np.minimum(known["live_bytes"].to_numpy(dtype=np.int64),
                          known["resident_bytes"].to_numpy(dtype=np.int64)).sum())
    retained = int(known["retained_bytes"].sum())
    other_anon = max(0, int(last["rss_anon_bytes"]) - resident)
    parts = {"live_heap_bytes": held, "retained_bytes": retained, "other_anon_bytes": other_anon,
             "file_bytes": int(last["rss_file_bytes"]), "shmem_bytes": int(last["rss_shmem_bytes"])}
    total = sum(parts.values())
    return {"rss_bytes": int(last["rss_bytes"]), **parts, "sum_bytes": total,
            "allocator_resident_bytes": resident, "retained_known": True, **split}


def residency_advice(arenas: pd.DataFrame, dec: dict | None) -> list[str]:
    """Plain advice from the arena table and the RSS decomposition."""
    if dec is None or not dec["rss_bytes"]:
        return []
    rss = dec["rss_bytes"]
    out = []
    thread = arenas[arenas["kind"] == "thread"]
    t_ret = int(thread["retained_bytes"].sum())
    m_ret = int(arenas.loc[arenas["kind"] == "main", "retained_bytes"].sum())
    if t_ret > 0.2 * rss and thread["id"].nunique() > 1:
        out.append(f"{thread['id'].nunique()} glibc thread arenas retain {t_ret >> 20} MiB "
                   f"({100 * t_ret // rss}% of RSS) that the program freed: cap them with MALLOC_ARENA_MAX=2..4, "
                   "or call malloc_trim(0) after bursts")
    if m_ret > 0.2 * rss:
        out.append(f"the main heap retains {m_ret >> 20} MiB ({100 * m_ret // rss}% of RSS) of freed memory: "
                   "malloc_trim(0) returns whole free pages; if it sits at the top of the heap, lower "
                   "M_TRIM_THRESHOLD (GLIBC_TUNABLES=glibc.malloc.trim_threshold=...)")
    if dec["live_heap_bytes"] > 0.5 * rss:
        out.append("most resident memory is live data the program holds: see the top sites")
    if dec["other_anon_bytes"] > 0.5 * rss:
        out.append("most resident memory is anonymous memory outside the allocator's heaps "
                   "(mmap regions, thread stacks, another allocator): see the mmap sites")
    if dec["shmem_bytes"] > 0.2 * rss:
        out.append(f"{dec['shmem_bytes'] >> 20} MiB is shared memory (e.g. pinned CUDA host memory shows as RssShmem)"
                   + (f": {dec['shmem_attributed_bytes'] >> 20} MiB of it at the shmem and cuda-pinned sites, "
                      f"{dec['shmem_unattributed_bytes'] >> 20} MiB mapped before the attach or not traced"
                      if "shmem_attributed_bytes" in dec else ""))
    return out


def _trace_t0(trace: Trace) -> int:
    return int((trace.meta.get("clock") or {}).get("monotonic_ns", 0))


def trims(trace: Trace) -> list[dict]:
    """malloc_trim calls in time order: time (s from start), tid, thread, duration_s, returned
    (glibc's return value), released_bytes — the drop of the target's anonymous RSS between the
    call's entry and return, measured from the kernel's RSS counters (kmem:rss_stat), not the
    sum of the ranges glibc madvised (it madvises released ranges again and still returns 1) —
    and rss_before_bytes / rss_after_bytes."""
    ev = trace.events
    if ev.empty:
        return []
    names = trace.thread_names()
    t0 = _trace_t0(trace)
    out = []
    for r in ev[ev["type"] == "trim"].sort_values("ts_ns").itertuples():
        out.append({"time": (int(r.ts_ns) - t0) / 1e9, "tid": int(r.tid), "thread": names.get(int(r.tid), "?"),
                    "duration_s": int(r.len2) / 1e9, "returned": int(r.ret),
                    "released_bytes": int(r.released_bytes),
                    "rss_before_bytes": int(r.len), "rss_after_bytes": int(r.addr2)})
    return out


RELEASE_KINDS = ("madvise", "munmap", "brk")


def release_table(trace: Trace) -> pd.DataFrame:
    """Memory handed back to the kernel outside malloc_trim, one row per syscall: time_s, tid,
    thread, kind (madvise|munmap|brk), in_api (allocator call it ran inside, '' if none),
    requested_bytes (length asked for), released_bytes (measured drop of anonymous RSS)."""
    ev = trace.events
    cols = ["time_s", "tid", "thread", "kind", "in_api", "requested_bytes", "released_bytes"]
    if ev.empty:
        return pd.DataFrame(columns=cols)
    ev = ev[ev["type"].isin(RELEASE_KINDS) & (ev["in_api"] != "malloc_trim")]
    names = trace.thread_names()
    t0 = _trace_t0(trace)
    df = pd.DataFrame({
        "time_s": (ev["ts_ns"].astype("int64") - t0) / 1e9, "tid": ev["tid"].astype(int),
        "thread": [names.get(int(t), "?") for t in ev["tid"]], "kind": ev["type"], "in_api": ev["in_api"],
        "requested_bytes": ev["len"].astype("int64").where(ev["type"] != "brk", 0),
        "released_bytes": ev["released_bytes"].astype("int64")})
    return df.sort_values("time_s").reset_index(drop=True)[cols]


def releases_by_thread(trace: Trace) -> list[dict]:
    """Per (thread, kind): calls and measured bytes released, largest first. Version 2 traces
    have them summed in the kernel (`releases`); version 1 traces, one event per syscall."""
    rel = trace.releases
    if not rel.empty:
        last = rel.sort_values("seq").drop_duplicates(["tid", "kind", "in_api"], keep="last")
        last = last[last["in_api"] != "malloc_trim"]
        names = trace.thread_names()
        df = pd.DataFrame({"tid": last["tid"].astype(int), "thread": [names.get(int(t), "?") for t in last["tid"]],
                           "kind": last["kind"], "calls": last["calls"].astype("int64"),
                           "released_bytes": last["released_bytes"].astype("int64"),
                           "requested_bytes": last["requested_bytes"].astype("int64")})
        g = df.groupby(["tid", "thread", "kind"]).agg(calls=("calls", "sum"), released_bytes=("released_bytes", "sum"),
                                                      requested_bytes=("requested_bytes", "sum")).reset_index()
    else:
        df = release_table(trace)
        if df.empty:
            return []
        g = df.groupby(["tid", "thread", "kind"]).agg(calls=("released_bytes", "size"),
                                                      released_bytes=("released_bytes", "sum"),
                                                      requested_bytes=("requested_bytes", "sum")).reset_index()
    g = g.sort_values("released_bytes", ascending=False)
    return [{"tid": int(r.tid), "thread": r.thread, "kind": r.kind, "calls": int(r.calls),
             "released_bytes": int(r.released_bytes), "requested_bytes": int(r.requested_bytes)}
            for r in g.itertuples()]


def advice(trace: Trace, tot: dict) -> list[str]:
    """One line per non-zero loss counter: what was lost and what to do about it."""
    out = []
    for k, v in tot["losses"].items():
        if k == "lost_live_full_bytes":
            continue
        msg = LOSS_ADVICE.get(k) or "some events were not recorded; the numbers are lower bounds"
        out.append(f"{k}={v}: {msg}")
    if tot["losses"].get("lost_live_full_bytes"):
        out.append(f"{tot['losses']['lost_live_full_bytes']} bytes were allocated but not tracked (live map full)")
    return out


def timeline_points(n: int, max_points: int = TIMELINE_POINTS) -> list[int]:
    """Indices (0-based) of at most `max_points` evenly spaced intervals out of n, first and
    last included: the points of each site's `timeline` in the JSON."""
    if n <= max_points:
        return list(range(n))
    return sorted({round(i) for i in np.linspace(0, n - 1, max_points)})


def _num(v: float, digits: int) -> float | None:
    """A float for JSON: rounded, None for NaN."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), digits)


def site_dict(r, names: dict[int, str], points: list[int]) -> dict:
    """One row of rank_sites as an allocscope.report/1 site."""
    return {
        "rank": int(r.rank), "live_bytes": int(r.live_bytes), "live_count": int(r.live_count),
        "peak_live_bytes": int(r.peak_live_bytes), "alloc_bytes": int(r.alloc_bytes),
        "alloc_count": int(r.alloc_count), "free_bytes": int(r.free_bytes), "free_count": int(r.free_count),
        "sources": list(r.sources),
        "growth_bytes_per_s": _num(r.growth_bytes_per_s, 3), "growth_r2": _num(r.growth_r2, 4),
        "oldest_age_s": _num(r.oldest_age_s, 3), "verdict": r.verdict,
        "timeline": [r.timeline[i] for i in points if i < len(r.timeline)],
        "frames": [f.as_dict() for f in r.site],
        "full_frames": [f.as_dict() for f in r.full_frames],
        "threads": [{"tid": t, "name": names.get(t, "?"), "live_bytes": b, "device_live_bytes": d}
                    for t, b, d in r.threads],
        "at_peak_bytes": int(r.at_peak_bytes),
        **{c: int(getattr(r, c)) for c in DEVICE_SITE_KEYS},
        "live_by_source": dict(r.live_by_source),
    }


DEVICE_SITE_KEYS = ("device_live_bytes", "device_live_count", "device_peak_bytes", "device_alloc_bytes",
                    "device_alloc_count", "device_free_bytes", "device_free_count")


def gpu_summary(trace: Trace, tot: dict, sites: pd.DataFrame) -> dict:
    """The report's `gpu` block: seen (any CUDA memory: a site of a cuda-* source, or GPU or
    driver-API host memory in the totals), driver (the libcuda.so the probes were attached to,
    meta.json probes.cuda.module; None when none was), probed (the driver calls attached),
    skipped ({call: why}), device_ranks (ranks of the sites that allocated GPU memory, by GPU
    bytes live at the end, then their GPU peak), host_ranks (ranks of the sites that allocated
    cuda-pinned or cuda-managed host memory, by those bytes live at the end)."""
    cuda = (trace.meta.get("probes") or {}).get("cuda") or {}
    dev, host = [], []
    for r in sites.itertuples():
        if r.device_alloc_count:
            dev.append((-int(r.device_live_bytes), -int(r.device_peak_bytes), int(r.rank)))
        if any(x in CUDA_HOST_SOURCES for x in r.sources):
            held = sum(int(r.live_by_source.get(x, 0)) for x in CUDA_HOST_SOURCES)
            host.append((-held, int(r.rank)))
    seen = bool(dev or host or tot.get("device_peak_bytes") or tot.get("cuda_host_bytes"))
    return {"seen": seen, "driver": cuda.get("module") or None, "probed": list(cuda.get("attached") or []),
            "skipped": dict(cuda.get("skipped") or {}), "device_ranks": [x[-1] for x in sorted(dev)],
            "host_ranks": [x[-1] for x in sorted(host)]}


def at_peak(trace: Trace, tot: dict, sites: pd.DataFrame) -> tuple[dict, dict[int, int]]:
    """The report's `at_peak` block — seq and elapsed_s of `peak_seq` (None when nothing was
    live), live_bytes (the process's live total then), peak_first (see `peak_first`),
    max_fraction (its threshold) — and rank -> at_peak_rank: the rank_sites rows ordered by
    their bytes at that moment, then by their own peak (ties as rank_sites breaks them)."""
    seq = peak_seq(trace)
    live = trace.intervals.set_index("seq")["live_bytes"]
    block = {"seq": seq, "elapsed_s": None if seq is None else _num(float(elapsed_s(trace)[seq]), 3),
             "live_bytes": 0 if seq is None else int(live[seq]), "peak_first": peak_first(tot),
             "max_fraction": PEAK_FIRST_MAX_FRACTION}
    order = sort_sites(sites, "at_peak")["rank"].tolist() if len(sites) else []
    return block, {int(r): i for i, r in enumerate(order, 1)}


def sampling_error(live_bytes: int, sample_bytes: int) -> int:
    """95% error bar of a byte-weighted-sampled estimate (sample one block per N bytes on
    average, weight max(size, N)): for blocks smaller than N the estimate's variance is about
    bytes * N, so ±1.96 * sqrt(bytes * N)."""
    return int(1.96 * (max(live_bytes, 0) * sample_bytes) ** 0.5) if sample_bytes else 0


def mode_notes(trace: Trace) -> list[str]:
    """What a sampled or residency-mode trace can and cannot answer (shown on top of reports)."""
    meta = trace.meta
    out = []
    if meta.get("mode") == "residency":
        n = (meta.get("sampling") or {}).get("fault_sample", 0)
        out.append(f"residency mode: no allocator probes. Sites of source 'fault' count first touches of pages "
                   f"(sampled 1 in {n}, each standing for {n} pages; cumulative — pages given back are not "
                   "subtracted); sites of source 'mmap'/'brk' are exact and live. Frees of heap blocks, "
                   "per-block sizes and thread flows are not seen.")
    sb = (meta.get("sampling") or {}).get("sample_bytes", 0)
    if sb:
        out.append(f"sampled trace: one sample per {sb} bytes on average; heap bytes are unbiased estimates "
                   "(see live_bytes_error, a 95% bound) and block counts are sample counts")
    return out


def build_report(trace: Trace, progress=None, sort: str = "live", stacks=None, fold: Folding | None = None) -> dict:
    """The allocscope.report/1 document: what `report --format json` prints. Sites are ordered
    (and `rank`ed) by `sort` (see rank_sites) whatever `at_peak.peak_first` says (that is for
    the text and HTML renderers, which lead with `at_peak_rank` then); each site's `timeline`
    holds its live bytes at the intervals listed once in `timeline_seq`. `stacks` (from
    symbolize_stacks) saves symbolizing again when the caller has them; `fold` (parse_fold)
    adds wrappers to fold, listed in `folded`."""
    if stacks is None:
        stacks = symbolize_stacks(trace, progress)
    sites = rank_sites(trace, stacks, sort=sort, fold=fold)
    threads = thread_table(trace)
    names = trace.thread_names()
    tot = totals(trace)
    peak, peak_rank = at_peak(trace, tot, sites)
    sample_bytes = int((trace.meta.get("sampling") or {}).get("sample_bytes", 0) or 0)
    arenas = arena_table(trace)
    dec = rss_decomposition(trace, arenas, tot["live_by_source"])
    meta = trace.meta
    tgt = meta.get("target") or {}
    points = timeline_points(trace.last_seq)
    return {
        "schema": REPORT_SCHEMA,
        "target": {"pid": tgt.get("pid"), "comm": tgt.get("comm"), "exe": tgt.get("exe"),
                   "labels": dict(meta.get("labels") or {})},
        "recording": {"complete": trace.complete, "end_reason": meta.get("end_reason"),
                      "interval_s": meta.get("interval_s"), "allocator": (meta.get("probes") or {}).get("allocator"),
                      "allocator_kind": (meta.get("probes") or {}).get("allocator_kind"),
                      "probes": meta.get("probes"), "warnings": trace.warnings},
        "totals": tot,
        "advice": mode_notes(trace) + advice(trace, tot) + residency_advice(arenas, dec),
        "sort": sort,
        "timeline_seq": [i + 1 for i in points],
        "at_peak": peak,
        "folded": folded_wrappers(stacks.values(), fold),
        "sites": [dict(site_dict(r, names, points), at_peak_rank=peak_rank[int(r.rank)],
                       **({"live_bytes_error": sampling_error(int(r.live_bytes), sample_bytes)}
                          if sample_bytes else {}))
                  for r in sites.itertuples()],
        "gpu": gpu_summary(trace, tot, sites),
        "threads": [{k: (r[k] if k == "name" else int(r[k])) for k in THREAD_COLUMNS}
                    for r in threads.to_dict("records")],
        "thread_groups": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                          for row in thread_group_table(trace).to_dict("records")],
        "flows": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                  for row in flow_table(trace).to_dict("records")],
        "arenas": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                   for row in arenas.to_dict("records")],
        "rss_decomposition": dec,
        "trims": trims(trace),
        "releases": releases_by_thread(trace),
    }
