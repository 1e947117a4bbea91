"""Memory handed back to the kernel: malloc_trim calls (what each released, measured from the
kernel's RSS counters) and the madvise/munmap/brk releases outside it, by thread."""

from __future__ import annotations

import pandas as pd

from common.tracefile.reader import Trace


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
        out.append(
            {
                "time": (int(r.ts_ns) - t0) / 1e9,
                "tid": int(r.tid),
                "thread": names.get(int(r.tid), "?"),
                "duration_s": int(r.len2) / 1e9,
                "returned": int(r.ret),
                "released_bytes": int(r.released_bytes),
                "rss_before_bytes": int(r.len),
                "rss_after_bytes": int(r.addr2),
            }
        )
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
    df = pd.DataFrame(
        {
            "time_s": (ev["ts_ns"].astype("int64") - t0) / 1e9,
            "tid": ev["tid"].astype(int),
            "thread": [names.get(int(t), "?") for t in ev["tid"]],
            "kind": ev["type"],
            "in_api": ev["in_api"],
            "requested_bytes": ev["len"].astype("int64").where(ev["type"] != "brk", 0),
            "released_bytes": ev["released_bytes"].astype("int64"),
        }
    )
    return df.sort_values("time_s").reset_index(drop=True)[cols]


def releases_by_thread(trace: Trace) -> list[dict]:
    """Per (thread, kind): calls and measured bytes released, largest first. Version 2 traces
    have them summed in the kernel (`releases`); version 1 traces, one event per syscall."""
    rel = trace.releases
    if not rel.empty:
        last = rel.sort_values("seq").drop_duplicates(["tid", "kind", "in_api", "stack_id"], keep="last")
        last = last[last["in_api"] != "malloc_trim"]
        names = trace.thread_names()
        df = pd.DataFrame(
            {
                "tid": last["tid"].astype(int),
                "thread": [names.get(int(t), "?") for t in last["tid"]],
                "kind": last["kind"],
                "calls": last["calls"].astype("int64"),
                "released_bytes": last["released_bytes"].astype("int64"),
                "requested_bytes": last["requested_bytes"].astype("int64"),
                "duration_ns": last["duration_ns"].astype("int64"),
            }
        )
        g = (
            df.groupby(["tid", "thread", "kind"])
            .agg(
                calls=("calls", "sum"),
                released_bytes=("released_bytes", "sum"),
                requested_bytes=("requested_bytes", "sum"),
                duration_ns=("duration_ns", "sum"),
            )
            .reset_index()
        )
    else:
        df = release_table(trace)
        if df.empty:
            return []
        g = (
            df.groupby(["tid", "thread", "kind"])
            .agg(
                calls=("released_bytes", "size"),
                released_bytes=("released_bytes", "sum"),
                requested_bytes=("requested_bytes", "sum"),
            )
            .reset_index()
        )
        g["duration_ns"] = 0
    g = g.sort_values("released_bytes", ascending=False)
    return [
        {
            "tid": int(r.tid),
            "thread": r.thread,
            "kind": r.kind,
            "calls": int(r.calls),
            "released_bytes": int(r.released_bytes),
            "requested_bytes": int(r.requested_bytes),
            "duration_s": int(r.duration_ns) / 1e9,
        }
        for r in g.itertuples()
    ]
