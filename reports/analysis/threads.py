"""Per-thread and per-thread-group tables, and the flows of memory between threads."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable

import numpy as np
import pandas as pd

from common.tracefile.reader import Trace

from .sources import is_device
from .timeline import key_timeline


def _thread_peaks(
    trace: Trace, group_of_tid: Callable[[int], Hashable], st: pd.DataFrame, device: bool = False
) -> dict:
    """group -> peak live bytes of its host memory (`device`: of its GPU memory): the highest
    of its summed timeline and of any one key's peak."""
    tl = key_timeline(trace, lambda k: group_of_tid(int(k[1])), device=device)
    peaks = tl.max().to_dict() if tl.shape[1] else {}
    st = st[is_device(st["source"]) == device]
    for tid, kp in st.groupby("tid")["peak_live_bytes"].max().items():
        g = group_of_tid(int(tid))
        peaks[g] = max(int(peaks.get(g, 0)), int(kp))
    return peaks


def split_device(st: pd.DataFrame) -> pd.DataFrame:
    """Final site rows with their counters split by memory: host rows keep theirs in live_bytes,
    live_count, alloc_bytes, alloc_count (0 in a GPU row), GPU rows in device_live_bytes,
    device_live_count, device_alloc_bytes, device_alloc_count (0 in a host row)."""
    dev = is_device(st["source"])
    cols = ["live_bytes", "live_count", "alloc_bytes", "alloc_count"]
    return st.assign(
        **{f"device_{c}": np.where(dev, st[c], 0) for c in cols}, **{c: np.where(dev, 0, st[c]) for c in cols}
    )


# a thread's (or thread group's) host-memory columns, in both tables
HOST_COLUMNS = ["live_bytes", "live_count", "peak_live_bytes", "alloc_bytes", "alloc_count"]

THREAD_COLUMNS = [
    "tid",
    "name",
    *HOST_COLUMNS,
    "device_live_bytes",
    "device_live_count",
    "device_peak_bytes",
    "device_alloc_bytes",
    "device_alloc_count",
]


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
    g = split_device(st).groupby("tid")[sums + [f"device_{c}" for c in sums]].sum().reset_index()
    g["peak_live_bytes"] = [int(max(peaks.get(int(t), 0), lb)) for t, lb in zip(g["tid"], g["live_bytes"])]
    g["device_peak_bytes"] = [int(max(dpeaks.get(int(t), 0), lb)) for t, lb in zip(g["tid"], g["device_live_bytes"])]
    g["name"] = [names.get(int(t), "?") for t in g["tid"]]
    g = g.sort_values(
        ["live_bytes", "peak_live_bytes", "device_live_bytes", "tid"], ascending=[False, False, False, True]
    )
    return g[THREAD_COLUMNS].reset_index(drop=True)


_DIGITS_RX = re.compile(r"\d+")


def thread_group(name: str) -> str:
    """The name pattern of a thread: digit runs replaced by N (pworker-1..pworker-12 ->
    pworker-N), so pools of different sizes compare."""
    return _DIGITS_RX.sub("N", name)


THREAD_GROUP_COLUMNS = [
    "group",
    "threads",
    *HOST_COLUMNS,
    "device_live_bytes",
    "device_peak_bytes",
]


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
    st = split_device(st).assign(group=[group_of[int(t)] for t in st["tid"]])
    counts = pd.Series(list(group_of.values())).value_counts()
    sums = (
        st.groupby("group")[["live_bytes", "live_count", "alloc_bytes", "alloc_count", "device_live_bytes"]]
        .sum()
        .reindex(sorted(counts.index), fill_value=0)
    )
    rows = [
        {
            "group": g,
            "threads": int(counts[g]),
            "live_bytes": int(s.live_bytes),
            "live_count": int(s.live_count),
            "peak_live_bytes": int(max(peaks.get(g, 0), s.live_bytes)),
            "alloc_bytes": int(s.alloc_bytes),
            "alloc_count": int(s.alloc_count),
            "device_live_bytes": int(s.device_live_bytes),
            "device_peak_bytes": int(max(dpeaks.get(g, 0), s.device_live_bytes)),
        }
        for g, s in sums.iterrows()
    ]
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
        return pd.DataFrame(
            columns=[
                "alloc_tid",
                "alloc_thread",
                "free_tid",
                "free_thread",
                "bytes",
                "count",
                "mean_wait_s",
                "max_wait_s",
            ]
        )
    f = f.copy()
    f["alloc_thread"] = [names.get(int(t), "?") for t in f["alloc_tid"]]
    f["free_thread"] = [names.get(int(t), "?") for t in f["free_tid"]]
    f["mean_wait_s"] = np.where(f["count"] > 0, f["wait_ns_sum"] / f["count"].clip(lower=1) / 1e9, 0.0)
    f["max_wait_s"] = f["wait_ns_max"] / 1e9
    return f.sort_values(["bytes", "alloc_tid", "free_tid"], ascending=[False, True, True])[
        ["alloc_tid", "alloc_thread", "free_tid", "free_thread", "bytes", "count", "mean_wait_s", "max_wait_s"]
    ].reset_index(drop=True)
