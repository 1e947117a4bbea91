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

Mapped is not resident either: the exact rows count a mapping whole from its mmap, its pages
only as they are first touched (issue 50's soak: 64 MiB partitions filled over seconds, the
composition at the peak 1.50 GiB beside a 1.44 GiB RSS high-water). At every interval whose exact
live bytes exceed the whole RSS then (read alive; after the target's end, its RSS at an OOM kill
as the kernel's mark gave it; not known otherwise: column `rss_known`), the excess is mapped but
not resident (not yet touched), at least:

    untouched(t) = max(0, exact live(t) − RSS(t))

it is taken off the exact rows in proportion to their live bytes then (their free_bytes gain it:
alloc_bytes stays what was mapped; which mapping is untouched is not measured, the share is an
estimate), and off `intervals.live_bytes` (column `untouched_bytes` says how much), so that a
residency-mode composition is never above the RSS, hence never above its high-water.

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
COUNTERS = ("alloc_bytes", "alloc_count", "free_bytes", "free_count", "peak_live_bytes")  # a site row's


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


def kill_rss(meta: dict) -> int | None:
    """The RSS at an OOM kill as the kernel's mark gave it (anon + file + shmem RSS of
    `end.oom.victim`), None without one."""
    v = ((meta.get("end") or {}).get("oom") or {}).get("victim") or {}
    if v.get("anon_rss_bytes") is None:
        return None
    return int(v["anon_rss_bytes"]) + int(v.get("file_rss_bytes") or 0) + int(v.get("shmem_rss_bytes") or 0)


def measured_rss(iv: pd.DataFrame, seqs: pd.RangeIndex, meta: dict) -> np.ndarray:
    """Per seq: the whole RSS where it is known: read alive then (an interval between two reads
    takes the last); after the last read alive (the target gone), the RSS at its OOM kill where
    the kernel's mark gave it; NaN elsewhere (before the first read, or after the last without a
    mark: what was mapped then was not measured)."""
    if "rss_bytes" not in iv:
        return np.full(len(seqs), np.nan)
    x = iv.drop_duplicates("seq", keep="last").set_index("seq").reindex(seqs)
    read = x["rss_bytes"].where(x["rss_bytes"] >= 0)
    out = read.ffill().to_numpy(dtype=np.float64, copy=True)
    alive = np.flatnonzero(read.notna().to_numpy())
    if len(alive):
        kill = kill_rss(meta)
        out[alive[-1] + 1 :] = np.nan if kill is None else float(kill)
    return out


def untouched_bytes(iv: pd.DataFrame, seqs: pd.RangeIndex, meta: dict | None = None) -> np.ndarray:
    """Per seq: the exact live bytes (`live_bytes` as recorded) beyond the whole RSS then (see
    measured_rss): mapped, not resident (not yet touched); 0 where the RSS is not known."""
    x = iv.drop_duplicates("seq", keep="last").set_index("seq").reindex(seqs)
    live = x["live_bytes"].ffill().fillna(0).to_numpy(dtype=np.float64)
    rss = measured_rss(iv, seqs, meta or {})
    return np.where(np.isnan(rss), 0.0, np.maximum(0.0, live - np.nan_to_num(rss))).astype(np.int64)


def _wide(frame: pd.DataFrame, col: str, seqs: pd.RangeIndex) -> pd.DataFrame:
    return frame.pivot_table(index="seq", columns="key", values=col, aggfunc="last").reindex(seqs).ffill().fillna(0)


def _untouched_off(x: pd.DataFrame, seqs: pd.RangeIndex, untouched: np.ndarray) -> pd.DataFrame:
    """The exact rows `x` with untouched(t) taken off their live bytes at every seq, in
    proportion to each row's live bytes then (free_bytes gain it; peak_live_bytes, once a row
    was cut, is the running peak of what it kept)."""
    if x.empty or not untouched.any():
        return x
    key = list(zip(x["stack_id"], x["tid"], x["source"].astype(str)))
    frame = pd.DataFrame({"seq": x["seq"].to_numpy(), "key": key})
    for c in ("alloc_bytes", "alloc_count", "free_bytes", "free_count", "peak_live_bytes"):
        frame[c] = x[c].to_numpy()
    w = {
        c: _wide(frame, c, seqs) for c in ("alloc_bytes", "alloc_count", "free_bytes", "free_count", "peak_live_bytes")
    }
    cols = list(w["alloc_bytes"].columns)
    a = w["alloc_bytes"].to_numpy(dtype=np.int64)
    fr = w["free_bytes"][cols].to_numpy(dtype=np.int64)
    live = np.maximum(0, a - fr)
    tot = live.sum(axis=1)
    take = np.minimum(untouched, tot).astype(np.float64)
    share = np.divide(live, tot[:, None], out=np.zeros(live.shape), where=tot[:, None] > 0)
    cut = np.minimum(np.floor(share * take[:, None]).astype(np.int64), live)
    # what flooring left goes to each interval's largest row: the cuts sum to take exactly
    big = live.argmax(axis=1) if live.shape[1] else np.zeros(len(live), dtype=np.int64)
    rows_t = np.arange(len(live))
    cut[rows_t, big] = np.minimum(live[rows_t, big], cut[rows_t, big] + (take.astype(np.int64) - cut.sum(axis=1)))
    hit = cut.any(axis=0)
    if not hit.any():
        return x
    cols_hit = [c for c, h in zip(cols, hit) if h]
    a, fr, cut = a[:, hit], fr[:, hit], cut[:, hit]
    cnt = w["alloc_count"][cols_hit].to_numpy(dtype=np.int64)
    fcnt = w["free_count"][cols_hit].to_numpy(dtype=np.int64)
    kept = np.maximum(0, a - fr - cut)
    was_cut = np.maximum.accumulate(cut > 0, axis=0)
    peak = np.where(was_cut, np.maximum.accumulate(kept, axis=0), w["peak_live_bytes"][cols_hit].to_numpy(np.int64))
    free = fr + cut
    changed = np.ones_like(a, dtype=bool)
    changed[1:] = (
        (a[1:] != a[:-1]) | (free[1:] != free[:-1]) | (cnt[1:] != cnt[:-1]) | (fcnt[1:] != fcnt[:-1])
        | (peak[1:] != peak[:-1])
    )  # fmt: skip
    n_t, n_k = a.shape
    rows = pd.DataFrame(
        {
            "seq": np.repeat(np.asarray(seqs, dtype=np.int64), n_k),
            "stack_id": np.tile(np.array([c[0] for c in cols_hit], dtype=np.uint64), n_t),
            "tid": np.tile(np.array([c[1] for c in cols_hit], dtype=np.int64), n_t),
            "source": np.tile(np.array([c[2] for c in cols_hit], dtype=object), n_t),
            "alloc_bytes": a.ravel(),
            "alloc_count": cnt.ravel(),
            "free_bytes": free.ravel(),
            "free_count": fcnt.ravel(),
            "peak_live_bytes": peak.ravel(),
        }
    )
    rows = rows[changed.ravel() & (rows["alloc_bytes"] > 0).to_numpy()]
    rows = rows.astype({c: x[c].dtype for c in rows.columns if c in x.columns and c != "source"})
    if isinstance(x["source"].dtype, pd.CategoricalDtype):
        rows["source"] = pd.Categorical(rows["source"], categories=x["source"].cat.categories)
    gone = pd.Series(key, index=x.index).isin(set(cols_hit)).to_numpy()
    return pd.concat([x[~gone], rows[[c for c in x.columns if c in rows.columns]]], ignore_index=True)


def _fault_rows(s: pd.DataFrame, is_f: np.ndarray, seqs: pd.RangeIndex, iv: pd.DataFrame):
    """The fault rows rewritten as estimates (see the module's docstring), and the estimate's
    total and the cumulative touches per seq."""
    f = s[is_f]
    key = list(zip(f["stack_id"], f["tid"]))
    frame = pd.DataFrame(
        {"seq": f["seq"].to_numpy(), "key": key, "b": f["alloc_bytes"].to_numpy(), "c": f["alloc_count"].to_numpy()}
    )
    wide_b = frame.pivot_table(index="seq", columns="key", values="b", aggfunc="last").reindex(seqs).ffill().fillna(0)
    wide_c = frame.pivot_table(index="seq", columns="key", values="c", aggfunc="last").reindex(seqs).ffill().fillna(0)
    cum = wide_b.to_numpy(dtype=np.float64)
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
    return rows[[c for c in s.columns if c in rows.columns]], est_i.sum(axis=1), cum.sum(axis=1)


def estimate_touches(trace: Trace) -> Trace:
    """The trace with its fault rows and live totals as estimates, and mapped pages not yet
    touched taken off the exact rows (see the module's docstring); the trace itself outside
    residency mode, or when done already."""
    if not is_residency(trace) or trace.meta.get(MARK) or trace.intervals.empty:
        return trace
    s = trace.sites
    seqs = pd.RangeIndex(1, trace.last_seq + 1, name="seq")
    iv = trace.intervals.sort_values("seq")
    untouched = untouched_bytes(iv, seqs, trace.meta)
    is_f = (s["source"].astype(str) == FAULT).to_numpy() if len(s) else np.zeros(0, dtype=bool)
    parts = [_untouched_off(s[~is_f], seqs, untouched)] if len(s) else [s]
    est_total = cum_total = np.zeros(len(seqs), dtype=np.int64)
    if is_f.any():
        rows, est_total, cum_total = _fault_rows(s, is_f, seqs, iv)
        parts.append(rows)
    sites = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    ivx = trace.intervals.copy()

    def per_seq(v: np.ndarray) -> pd.Series:
        return ivx["seq"].map(pd.Series(v, index=seqs)).fillna(0).astype(np.int64)

    ivx["touch_estimate_bytes"] = per_seq(est_total)
    ivx["touches_bytes"] = per_seq(cum_total)
    ivx["untouched_bytes"] = per_seq(untouched)
    ivx["rss_known"] = ivx["seq"].map(pd.Series(~np.isnan(measured_rss(iv, seqs, trace.meta)), index=seqs))
    ivx["rss_known"] = ivx["rss_known"].fillna(False).astype(bool)
    ivx["live_bytes"] = ivx["live_bytes"] - ivx["untouched_bytes"] + ivx["touch_estimate_bytes"]
    return replace(trace, sites=sites, intervals=ivx, meta={**trace.meta, MARK: True})
