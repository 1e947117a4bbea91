"""Residency mode's sampled first touches as an estimate of what they keep resident.

The kernel counts first touches (page faults, sampled 1 in N, each standing for N pages) per
stack and thread, cumulatively: a page freed and touched again counts again, so the raw counters
of a sort that reuses its memory grow without bound (issue 50: a composition at the peak 1.8x
the process's RSS high-water). Reports never sum them with live bytes. Instead, at the end of every
interval, the touches stand for at most what the exact rows (mmap, brk, shmem: live and exact)
leave of the anonymous and shared RSS then:

    estimate(t) = min(touches(t), max(0, RssAnon(t) + RssShmem(t) − exact live(t)))

and that estimate is the latest touches (a page touched again replaces the one freed before it:
the touches of the most recent intervals are kept, the oldest dropped first), shared among the
fault rows in proportion to what each touched in those intervals. Each fault row of `sites` is
rewritten so that alloc_bytes stays the cumulative touches and alloc − free is the estimate at
every interval; `intervals.live_bytes` gains the estimate (column `touch_estimate_bytes`), so
totals, the peak, the tables and the findings use one figure, never above the RSS.

    >>> trace = estimate_touches(trace)   # a no-op outside residency mode, and when done once
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from common.pages import PAGE
from common.tracefile.reader import Trace

FAULT = "fault"
MARK = "touches_estimated"  # meta.json key set on the rewritten trace (never written to disk)


def is_residency(trace: Trace) -> bool:
    return trace.meta.get("mode") == "residency"


def _budget(iv: pd.DataFrame, seqs: pd.RangeIndex) -> np.ndarray:
    """Per seq: anonymous + shared RSS less the exact live bytes (at least 0); an interval whose
    RSS was not read takes the last one read."""
    x = iv.drop_duplicates("seq", keep="last").set_index("seq").reindex(seqs)
    rss = x["rss_bytes"].where(x["rss_bytes"] >= 0) if "rss_bytes" in x else pd.Series(np.nan, index=seqs)
    anon = (x.get("rss_anon_bytes", 0) + x.get("rss_shmem_bytes", 0)).where(rss.notna())
    anon = anon.ffill().fillna(0).to_numpy(dtype=np.float64)
    live = x["live_bytes"].ffill().fillna(0).to_numpy(dtype=np.float64)
    return np.maximum(0.0, anon - live)


def latest_share(cum: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """cum: cumulative touches, intervals × rows; cap: per interval. The estimate per interval
    and row: the latest min(total, cap) bytes of touches, shared by what each row touched in
    the intervals they fall in (the oldest interval kept counts in part)."""
    t_n, _ = cum.shape
    total = cum.sum(axis=1)
    keep = np.minimum(total, cap)
    gone = total - keep  # the oldest touches, dropped
    prev = np.vstack([np.zeros((1, cum.shape[1])), cum[:-1]])
    step = total - np.concatenate([[0.0], total[:-1]])
    out = np.zeros_like(cum)
    for t in range(t_n):
        if keep[t] <= 0:
            continue
        k = int(np.searchsorted(total, gone[t], side="right"))  # the interval the cut falls in
        if k > t:
            continue
        frac = (total[k] - gone[t]) / step[k] if step[k] > 0 else 0.0
        out[t] = cum[t] - cum[k] + frac * (cum[k] - prev[k])
    return np.maximum(out, 0.0)


def estimate_touches(trace: Trace) -> Trace:
    """The trace with its fault rows and live totals as estimates (see the module's docstring);
    the trace itself outside residency mode, without fault rows, or when done already."""
    if not is_residency(trace) or trace.meta.get(MARK) or trace.sites.empty:
        return trace
    s = trace.sites
    is_f = (s["source"].astype(str) == FAULT).to_numpy()
    if not is_f.any():
        return trace
    f = s[is_f]
    seqs = pd.RangeIndex(1, trace.last_seq + 1, name="seq")
    key = list(zip(f["stack_id"], f["tid"]))
    frame = pd.DataFrame(
        {"seq": f["seq"].to_numpy(), "key": key, "b": f["alloc_bytes"].to_numpy(), "c": f["alloc_count"].to_numpy()}
    )
    wide_b = frame.pivot_table(index="seq", columns="key", values="b", aggfunc="last").reindex(seqs).ffill().fillna(0)
    wide_c = frame.pivot_table(index="seq", columns="key", values="c", aggfunc="last").reindex(seqs).ffill().fillna(0)
    cum = wide_b.to_numpy(dtype=np.float64)
    iv = trace.intervals.sort_values("seq")
    est = latest_share(cum, _budget(iv, seqs))
    est_i = np.minimum(np.rint(est), cum).astype(np.int64)
    peak = np.maximum.accumulate(est_i, axis=0)
    cnt = wide_c.to_numpy(dtype=np.int64)
    cols = list(wide_b.columns)
    n_t, n_k = cum.shape
    # rows only where a key's counters changed (as the tracer writes them): a long watch keeps
    # thousands of intervals, and the readers forward-fill
    cum_i = cum.astype(np.int64)
    changed = np.ones_like(est_i, dtype=bool)
    changed[1:] = (est_i[1:] != est_i[:-1]) | (cum_i[1:] != cum_i[:-1]) | (cnt[1:] != cnt[:-1])
    rows = pd.DataFrame(
        {
            "seq": np.repeat(np.asarray(seqs, dtype=np.int64), n_k),
            "stack_id": np.tile(np.array([c[0] for c in cols], dtype=np.uint64), n_t),
            "tid": np.tile(np.array([c[1] for c in cols], dtype=np.int64), n_t),
            "source": FAULT,
            "alloc_bytes": cum_i.ravel(),
            "alloc_count": cnt.ravel(),
            "free_bytes": (cum_i - est_i).ravel(),
            "free_count": np.maximum(0, cnt - est_i // PAGE).ravel(),
            "peak_live_bytes": peak.ravel(),
        }
    )
    rows = rows[changed.ravel() & (rows["alloc_bytes"] > 0).to_numpy()]
    rows = rows.astype({c: s[c].dtype for c in rows.columns if c in s.columns and c != "source"})
    if isinstance(s["source"].dtype, pd.CategoricalDtype):
        rows["source"] = pd.Categorical(rows["source"], categories=s["source"].cat.categories)
    sites = pd.concat([s[~is_f], rows[[c for c in s.columns if c in rows.columns]]], ignore_index=True)
    total = pd.Series(est_i.sum(axis=1), index=seqs)
    ivx = trace.intervals.copy()
    add = ivx["seq"].map(total).fillna(0).astype(np.int64)
    ivx["touch_estimate_bytes"] = add
    ivx["touches_bytes"] = ivx["seq"].map(pd.Series(cum.sum(axis=1), index=seqs)).fillna(0).astype(np.int64)
    ivx["live_bytes"] = ivx["live_bytes"] + add
    return replace(trace, sites=sites, intervals=ivx, meta={**trace.meta, MARK: True})
