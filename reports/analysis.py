"""Turn a Trace into ranked tables. Functions are verbs returning DataFrames or plain dicts;
renderers (reports.render) only format what these return.

A *site* is the symbolized call stack with allocator and allocator-wrapper frames folded away
(innermost first); the same code gives the same site in every run, whatever the addresses.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .trace import Trace

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
]
_WRAPPER_RX = re.compile("|".join(WRAPPER_PATTERNS))

LOSS_ADVICE = {
    "lost_live_full": "the live-allocation map was full: raise --max-live",
    "lost_live_full_bytes": None,
    "lost_stack_full": "the stack map was full: some bytes are shown under '[stack lost]'",
    "lost_stack_err": "some stacks could not be read: those bytes are under '[stack lost]'",
    "lost_site_full": "the site map was full: bytes counted in totals but not per site",
    "lost_inflight_full": "too many threads inside malloc at once: some calls were not seen",
    "lost_unmatched_ret": "returns without their entry (normal right after attach; large values mean missed calls)",
    "lost_stale_entry": "entries whose return was never seen (a thread left malloc abnormally)",
    "lost_ring_full": "the event ring overflowed: some mmap/munmap/thread events are missing",
    "lost_flow_full": "the thread-flow map was full: some cross-thread frees are not in the flow table",
}


@dataclass(frozen=True)
class FrameInfo:
    function: str
    module: str
    file: str | None
    line: int | None

    def as_dict(self) -> dict:
        return {"function": self.function, "module": self.module, "file": self.file, "line": self.line}


UNKNOWN_STACK = (FrameInfo("[stack lost]", "", None, None),)


def symbolize_stacks(trace: Trace, progress=None) -> dict[int, tuple[FrameInfo, ...]]:
    """stack_id -> frames innermost first, every frame symbolized (offline, pyelftools)."""
    from .symbolize import Symbolizer  # noqa: PLC0415

    st = trace.stacks
    if st.empty:
        return {0: UNKNOWN_STACK}
    st = st.drop_duplicates(["stack_id", "idx"]).sort_values(["stack_id", "idx"])
    sym = Symbolizer(progress=progress)
    resolved: dict[tuple[str, int], FrameInfo] = {}
    todo = st[(st["offset"] >= 0) & st["function"].isna()]
    for (module, build_id), grp in todo.groupby(["module", "build_id"], sort=False):
        offsets = sorted(set(int(o) for o in grp["offset"]))
        res = sym.symbolize(module, offsets, build_id=build_id or None, return_addresses=True)
        for off in offsets:
            frames = res.get(off) or []
            f = frames[0] if frames else None
            resolved[(module, off)] = FrameInfo(
                f.function if f else f"{os.path.basename(module)}+{off:#x}", module,
                f.file if f else None, f.line if f else None)
    out: dict[int, tuple[FrameInfo, ...]] = {0: UNKNOWN_STACK}
    for sid, grp in st.groupby("stack_id", sort=False):
        frames = []
        for module, off, ip, fn, file, line in zip(grp["module"], grp["offset"], grp["ip"], grp["function"],
                                                   grp["file"], grp["line"]):
            if isinstance(fn, str):
                frames.append(FrameInfo(fn, module, file if isinstance(file, str) else None,
                                        None if pd.isna(line) else int(line)))
            elif off >= 0:
                frames.append(resolved[(module, int(off))])
            else:
                frames.append(FrameInfo(f"{module or '[anon]'}@{int(ip):#x}", module, None, None))
        out[int(sid)] = tuple(frames)
    return out


_PREFIX_RX = re.compile(r"^(__GI_|__libc_|__)+")


def is_wrapper(function: str) -> bool:
    """An allocator entry point, syscall wrapper or language allocation shim."""
    return bool(_WRAPPER_RX.search(function) or _WRAPPER_RX.search(_PREFIX_RX.sub("", function)))


def fold_frames(frames: tuple[FrameInfo, ...]) -> tuple[FrameInfo, ...]:
    """Drop the innermost frames that are allocator entry points or wrappers around them
    (operator new, __rust_alloc, alloc::raw_vec::*, libc's mmap wrapper...). At least the
    outermost frame is kept."""
    i = 0
    while i < len(frames) - 1 and is_wrapper(frames[i].function):
        i += 1
    return frames[i:]


def site_table(trace: Trace, stacks: dict[int, tuple[FrameInfo, ...]] | None = None, progress=None) -> pd.DataFrame:
    """One row per (site, thread, source) at the end of the recording, with `site` (folded
    frames tuple) and `full_frames`. Columns: site, full_frames, stack_id, tid, source,
    alloc_bytes, alloc_count, free_bytes, free_count, live_bytes, live_count, peak_live_bytes."""
    if stacks is None:
        stacks = symbolize_stacks(trace, progress)
    df = trace.final_sites()
    full = [stacks.get(int(s), UNKNOWN_STACK) for s in df["stack_id"]]
    df["full_frames"] = full
    df["site"] = [fold_frames(f) for f in full]
    return df


def _timeline(trace: Trace, keycol_fn) -> pd.DataFrame:
    """live bytes per interval (rows: seq) per group (columns), forward-filled cumulative."""
    s = trace.sites
    if s.empty:
        return pd.DataFrame()
    s = s.assign(live=s["alloc_bytes"] - s["free_bytes"])
    key = list(zip(s["stack_id"], s["tid"], s["source"]))
    piv = pd.DataFrame({"seq": s["seq"].to_numpy(), "key": key, "live": s["live"].to_numpy()})
    wide = piv.pivot_table(index="seq", columns="key", values="live", aggfunc="last")
    wide = wide.reindex(range(1, trace.last_seq + 1)).ffill().fillna(0)
    groups = [keycol_fn(k) for k in wide.columns]
    codes: dict = {}
    idx = [codes.setdefault(g, len(codes)) for g in groups]
    summed = wide.T.groupby(np.array(idx), sort=False).sum().T
    by_code = {v: k for k, v in codes.items()}
    summed.columns = [by_code[c] for c in summed.columns]
    return summed


def site_timeline(trace: Trace, stacks=None) -> pd.DataFrame:
    """Live bytes per site over time: index = interval seq (1..n), one column per site
    (folded frames tuple), values = live bytes at the end of that interval."""
    st = site_table(trace, stacks)
    key_to_site = {(int(a), int(b), c): site for a, b, c, site in
                   zip(st["stack_id"], st["tid"], st["source"], st["site"])}
    return _timeline(trace, lambda k: key_to_site.get((int(k[0]), int(k[1]), k[2]), UNKNOWN_STACK))


def rank_sites(trace: Trace, stacks=None, progress=None) -> pd.DataFrame:
    """Sites ranked by live bytes at the end. Columns: site, full_frames, live_bytes, live_count,
    peak_live_bytes, alloc_bytes, alloc_count, free_bytes, free_count, sources, threads
    (list of (tid, live_bytes) by live desc), rank."""
    st = site_table(trace, stacks, progress)
    if st.empty:
        return pd.DataFrame(columns=["rank", "site", "full_frames", "live_bytes", "live_count", "peak_live_bytes",
                                     "alloc_bytes", "alloc_count", "free_bytes", "free_count", "sources", "threads"])
    key_to_site = {(int(a), int(b), c): site for a, b, c, site in
                   zip(st["stack_id"], st["tid"], st["source"], st["site"])}
    tl = _timeline(trace, lambda k: key_to_site.get((int(k[0]), int(k[1]), k[2]), UNKNOWN_STACK))
    peaks_tl = tl.max().to_dict() if not tl.empty else {}
    rows = []
    for site, g in st.groupby("site", sort=False):
        by_tid = g.groupby("tid")["live_bytes"].sum().sort_values(ascending=False)
        rows.append({
            "site": site,
            "full_frames": g["full_frames"].iloc[int(np.argmax(g["alloc_bytes"].to_numpy()))],
            "live_bytes": int(g["live_bytes"].sum()), "live_count": int(g["live_count"].sum()),
            "peak_live_bytes": int(max(peaks_tl.get(site, 0), g["peak_live_bytes"].max(), g["live_bytes"].sum())),
            "alloc_bytes": int(g["alloc_bytes"].sum()), "alloc_count": int(g["alloc_count"].sum()),
            "free_bytes": int(g["free_bytes"].sum()), "free_count": int(g["free_count"].sum()),
            "sources": sorted(set(g["source"])),
            "threads": [(int(t), int(b)) for t, b in by_tid.items()],
        })
    df = pd.DataFrame(rows).sort_values(["live_bytes", "peak_live_bytes", "alloc_bytes"], ascending=False)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df.reset_index(drop=True)


def thread_table(trace: Trace) -> pd.DataFrame:
    """Per allocating thread: tid, name, live_bytes, live_count, peak_live_bytes, alloc_bytes,
    alloc_count, ranked by live bytes."""
    st = trace.final_sites()
    names = trace.thread_names()
    if st.empty:
        return pd.DataFrame(columns=["tid", "name", "live_bytes", "live_count", "peak_live_bytes",
                                     "alloc_bytes", "alloc_count"])
    tl = _timeline(trace, lambda k: int(k[1]))
    peaks = tl.max().to_dict() if not tl.empty else {}
    g = st.groupby("tid").agg(live_bytes=("live_bytes", "sum"), live_count=("live_count", "sum"),
                              alloc_bytes=("alloc_bytes", "sum"), alloc_count=("alloc_count", "sum"),
                              key_peak=("peak_live_bytes", "max")).reset_index()
    g["peak_live_bytes"] = [int(max(peaks.get(int(t), 0), kp, lb)) for t, kp, lb in
                            zip(g["tid"], g["key_peak"], g["live_bytes"])]
    g["name"] = [names.get(int(t), "?") for t in g["tid"]]
    g = g.drop(columns="key_peak").sort_values(["live_bytes", "peak_live_bytes"], ascending=False)
    return g[["tid", "name", "live_bytes", "live_count", "peak_live_bytes", "alloc_bytes", "alloc_count"]].reset_index(drop=True)


def flow_table(trace: Trace) -> pd.DataFrame:
    """Frees by (allocating thread, freeing thread): bytes, count, mean and max wait."""
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
    return f.sort_values("bytes", ascending=False)[
        ["alloc_tid", "alloc_thread", "free_tid", "free_thread", "bytes", "count", "mean_wait_s", "max_wait_s"]
    ].reset_index(drop=True)


def losses(trace: Trace) -> dict[str, int]:
    last = trace.intervals.iloc[-1]
    return {c: int(last[c]) for c in trace.intervals.columns if c.startswith("lost_")}


def totals(trace: Trace) -> dict:
    iv = trace.intervals
    alive = iv[iv.get("rss_bytes", pd.Series(dtype=int)) >= 0] if "rss_bytes" in iv else iv
    last = iv.iloc[-1]
    lost = losses(trace)
    rss_now = int(alive["rss_bytes"].iloc[-1]) if len(alive) else 0
    return {
        "live_bytes": int(last["live_bytes"]),
        "live_count": int(last["live_count"]),
        "peak_live_bytes": int(max(iv["live_bytes"].max(), iv["heap_peak_bytes"].max())),
        "rss_bytes": rss_now,
        "peak_rss_bytes": int(alive["rss_bytes"].max()) if len(alive) else 0,
        "hwm_bytes": int(alive["hwm_bytes"].max()) if len(alive) else 0,
        "lost_events": int(sum(v for k, v in lost.items() if k != "lost_live_full_bytes")),
        "losses": {k: v for k, v in lost.items() if v},
        "heap_live_bytes": int(last["heap_live_bytes"]),
        "mmap_live_bytes": int(last["mmap_live_bytes"]),
        "duration_s": float(last["elapsed_s"]),
        "intervals": int(last["seq"]),
    }


def trims(trace: Trace) -> list[dict]:
    ev = trace.events
    if ev.empty:
        return []
    names = trace.thread_names()
    t0 = int((trace.meta.get("clock") or {}).get("monotonic_ns", 0))
    out = []
    for r in ev[ev["type"] == "trim"].sort_values("ts_ns").itertuples():
        out.append({"time": (int(r.ts_ns) - t0) / 1e9, "tid": int(r.tid), "thread": names.get(int(r.tid), "?"),
                    "duration_s": int(r.len2) / 1e9, "returned": int(r.ret), "released_bytes": None})
    return out


def advice(trace: Trace, tot: dict) -> list[str]:
    out = []
    for k, v in tot["losses"].items():
        msg = LOSS_ADVICE.get(k)
        if msg and v:
            out.append(f"{k}={v}: {msg}")
    if tot["losses"].get("lost_live_full_bytes"):
        out.append(f"{tot['losses']['lost_live_full_bytes']} bytes were allocated but not tracked (live map full)")
    return out


def build_report(trace: Trace, progress=None) -> dict:
    """The allocscope.report/1 document (see README): what `report --format json` prints."""
    stacks = symbolize_stacks(trace, progress)
    sites = rank_sites(trace, stacks)
    threads = thread_table(trace)
    names = trace.thread_names()
    tot = totals(trace)
    meta = trace.meta
    tgt = meta.get("target") or {}
    site_list = []
    for r in sites.itertuples():
        site_list.append({
            "rank": int(r.rank), "live_bytes": int(r.live_bytes), "live_count": int(r.live_count),
            "peak_live_bytes": int(r.peak_live_bytes), "alloc_bytes": int(r.alloc_bytes),
            "alloc_count": int(r.alloc_count), "free_bytes": int(r.free_bytes), "free_count": int(r.free_count),
            "sources": list(r.sources),
            "frames": [f.as_dict() for f in r.site],
            "full_frames": [f.as_dict() for f in r.full_frames],
            "threads": [{"tid": t, "name": names.get(t, "?"), "live_bytes": b} for t, b in r.threads],
        })
    return {
        "schema": REPORT_SCHEMA,
        "target": {"pid": tgt.get("pid"), "comm": tgt.get("comm"), "exe": tgt.get("exe"),
                   "labels": dict(meta.get("labels") or {})},
        "recording": {"complete": trace.complete, "end_reason": meta.get("end_reason"),
                      "interval_s": meta.get("interval_s"), "allocator": (meta.get("probes") or {}).get("allocator"),
                      "allocator_kind": (meta.get("probes") or {}).get("allocator_kind"),
                      "probes": meta.get("probes"), "warnings": trace.warnings},
        "totals": tot,
        "advice": advice(trace, tot),
        "sites": site_list,
        "threads": [{"tid": int(r.tid), "name": r.name, "live_bytes": int(r.live_bytes),
                     "live_count": int(r.live_count), "peak_live_bytes": int(r.peak_live_bytes),
                     "alloc_bytes": int(r.alloc_bytes), "alloc_count": int(r.alloc_count)}
                    for r in threads.itertuples()],
        "flows": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                  for row in flow_table(trace).to_dict("records")],
        "arenas": [],
        "trims": trims(trace),
    }
