"""Ranked tables of sites, locations and functions: every per-group figure (live, peak,
growth, age, verdict, threads, sources, GPU memory) summed over the stacks of a group, and
their JSON form."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa

from common.errors import UsageError
from common.tracefile.reader import Trace

from .sources import CUDA_HOST_SOURCES, DEVICE_SOURCES, is_device
from .stacks import UNKNOWN_STACK, Folding, FrameInfo, SiteKey, fold_frames, frame_key_text, group_of, symbolize_stacks
from .timeline import (
    PEAK_FIRST_MAX_FRACTION,
    elapsed_s,
    end_time_ns,
    growth_table,
    json_num,
    key_timeline,
    peak_first,
    peak_rows,
    peak_seq,
    verdict,
)
from .touches import estimate_touches


def site_table(
    trace: Trace,
    stacks: dict[int, tuple[FrameInfo, ...]] | None = None,
    progress=None,
    fold: Folding | None = None,
    at_seq: int | None = None,
) -> pd.DataFrame:
    """One row per (site, thread, source) at the end of the recording (with `at_seq`: at the
    end of that interval), with `site` (frames folded by `fold_frames`) and `full_frames`.
    Columns: site, full_frames, stack_id, tid, source, alloc_bytes, alloc_count, free_bytes,
    free_count, live_bytes, live_count, peak_live_bytes, device (True for GPU memory,
    DEVICE_SOURCES: bytes that are not host memory)."""
    trace = estimate_touches(trace)
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


SORT_KEYS = ("live", "peak", "growth", "age")


def _site_lookup(st: pd.DataFrame, column: str = "site") -> Callable[[tuple], SiteKey]:
    """(stack_id, tid, source) -> site (or another `column`: the `group` rank_sites adds), for
    `key_timeline`, from a `site_table` frame."""
    m = {(int(a), int(b), c): site for a, b, c, site in zip(st["stack_id"], st["tid"], st["source"], st[column])}
    return lambda k: m.get((int(k[0]), int(k[1]), k[2]), UNKNOWN_STACK)


def site_timeline(
    trace: Trace, stacks=None, fold: Folding | None = None, device: bool = False, by: str = "stack"
) -> pd.DataFrame:
    """Live bytes per site over time: index = interval seq (1..n), one column per site
    (folded frames tuple; with `by` location or function, per stacks.group_of row), values =
    live host bytes at the end of that interval (with `device`: GPU memory instead)."""
    st = site_table(trace, stacks, fold=fold)
    group = {s: group_of(s, by) for s in set(st["site"])}
    st["group"] = [group[s] for s in st["site"]]
    return key_timeline(trace, _site_lookup(st, "group"), device=device)


def oldest_ages(
    trace: Trace, stacks: dict[int, SiteKey], fold: Folding | None = None, by: str = "stack"
) -> dict[SiteKey, float]:
    """site (or location, function: `by`, see stacks.group_of) -> age in seconds of its oldest
    allocation still outstanding at the end (from the final `live` table; a trace cut short
    has none, and its sites get no age)."""
    if not trace.live_rows:
        return {}
    end = end_time_ns(trace)
    # Hash aggregates over the (possibly millions of) live blocks, batch by batch; the result
    # has a row a stack.
    first: dict[int, int] = {}
    for b in trace.live_batches(["stack_id", "ts_ns"]):
        agg = (
            pa.table({"s": b["stack_id"], "t": b["ts_ns"].astype(np.int64, copy=False)})
            .group_by("s")
            .aggregate([("t", "min")])
        )
        for sid, ts in zip(agg["s"].to_pylist(), agg["t_min"].to_pylist()):
            first[sid] = min(ts, first.get(sid, ts))
    out: dict[SiteKey, float] = {}
    for sid, ts in first.items():
        site = group_of(fold_frames(stacks.get(int(sid), UNKNOWN_STACK), fold), by)
        age = max(0.0, (end - int(ts)) / 1e9)
        out[site] = max(out.get(site, 0.0), age)
    return out


DEVICE_SITE_KEYS = (
    "device_live_bytes",
    "device_live_count",
    "device_peak_bytes",
    "device_alloc_bytes",
    "device_alloc_count",
    "device_free_bytes",
    "device_free_count",
)

RANK_COLUMNS = [
    "rank",
    "site",
    "full_frames",
    "live_bytes",
    "live_count",
    "peak_live_bytes",
    "alloc_bytes",
    "alloc_count",
    "free_bytes",
    "free_count",
    "sources",
    "threads",
    "growth_bytes_per_s",
    "growth_r2",
    "oldest_age_s",
    "verdict",
    "timeline",
    "at_peak_bytes",
    *DEVICE_SITE_KEYS,
    "live_by_source",
    "stack",
    "stacks",
    "n_stacks",
    "at_peak_estimate_bytes",
]

DEVICE_SUMS = ("live_bytes", "live_count", "alloc_bytes", "alloc_count", "free_bytes", "free_count")


def sort_sites(df: pd.DataFrame, sort: str) -> pd.DataFrame:
    """Order rows of rank_sites by `sort` (see rank_sites); ties by live, peak, allocated bytes,
    then by the innermost frame so the order is deterministic."""
    tie = ["live_bytes", "peak_live_bytes", "alloc_bytes", "device_live_bytes", "device_peak_bytes"]
    df = df.assign(
        _growing=df["verdict"] == "growing",
        _age=df["oldest_age_s"].astype(float).fillna(-1.0),
        _name=[frame_key_text(s) for s in df["site"]],
    )
    first = {
        "live": [],
        "peak": ["peak_live_bytes"],
        "growth": ["_growing", "growth_bytes_per_s"],
        "age": ["_age"],
        "at_peak": ["at_peak_bytes", "peak_live_bytes"],
    }[sort]
    cols = first + [c for c in tie if c not in first and c in df.columns]  # the live view has no device_*
    df = df.sort_values(cols + ["_name"], ascending=[False] * len(cols) + [True], kind="mergesort")
    return df.drop(columns=["_growing", "_age", "_name"])


def rank_sites(
    trace: Trace, stacks=None, progress=None, sort: str = "live", fold: Folding | None = None, by: str = "stack"
) -> pd.DataFrame:
    """Sites ranked by `sort`. One row per site — with `by` ``location`` or ``function``, one
    row per location or function (stacks.group_of): every figure of a row is computed from the
    summed counters of its stacks, per interval, so its peak is the peak of the sum (or of one
    stack's own peak inside an interval, when higher), never a sum of peaks, and its growth and
    verdict are those of the summed series. Columns:

    rank (1-based), site (folded frames tuple, innermost first; for a location or function the
    one frame of `group_of`), full_frames (one unfolded
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
    end}, GPU memory included, sources with allocations only), stack (the folded stack of the
    row holding most: live bytes, then allocated bytes; the site itself when `by` is stack),
    stacks (the distinct folded stacks of the row in that order), n_stacks (their number).

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
    trace = estimate_touches(trace)
    st = site_table(trace, stacks, progress, fold=fold)
    if st.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    if stacks is None:
        stacks = {int(s): f for s, f in zip(st["stack_id"], st["full_frames"])}
    group = {s: group_of(s, by) for s in set(st["site"])}
    st["group"] = [group[s] for s in st["site"]]
    lookup = _site_lookup(st, "group")
    tl = key_timeline(trace, lambda k: (lookup(k), bool(k[2] in DEVICE_SOURCES)))
    series = {key: tl.iloc[:, i].to_numpy() for i, key in enumerate(tl.columns)}
    growth = growth_table(tl, elapsed_s(trace)).to_dict("index")
    ages = oldest_ages(trace, stacks, fold, by)
    at = peak_seq(trace)
    # residency mode: how much of each row's bytes at the peak is the first-touch estimate
    est: dict = {}
    if at is not None and (st["source"].astype(str) == "fault").any():
        etl = key_timeline(trace, lambda k: lookup(k) if k[2] == "fault" else None, device=False)
        est = {key: int(etl.iloc[at - 1, i]) for i, key in enumerate(etl.columns) if key is not None}
    no_growth = {"growth_bytes_per_s": 0.0, "growth_r2": math.nan, "window_s": 0.0, "window_points": 0}
    empty = np.zeros(0, dtype="int64")
    # Every per-site figure in a few vectorized group-bys (sites number in the thousands): the
    # counters split into host and GPU columns, keyed by the site's code.
    codes, uniques = pd.factorize(pd.Series(st["group"].tolist(), dtype=object))
    sites = uniques.tolist()
    sums = ["live_bytes", "live_count", "alloc_bytes", "alloc_count", "free_bytes", "free_count"]
    dev = st["device"].to_numpy(dtype=bool)
    x = st.assign(
        code=codes,
        **{f"device_{c}": np.where(dev, st[c], 0) for c in sums},
        **{c: np.where(dev, 0, st[c]) for c in sums},
        host_peak=np.where(dev, 0, st["peak_live_bytes"]),
        dev_peak=np.where(dev, st["peak_live_bytes"], 0),
    )
    agg = x.groupby("code", sort=False)[sums + [f"device_{c}" for c in sums] + ["host_peak", "dev_peak"]].agg(
        {**dict.fromkeys(sums + [f"device_{c}" for c in sums], "sum"), "host_peak": "max", "dev_peak": "max"}
    )
    # one unfolded stack of the site: the row that allocated most (host and GPU bytes alike)
    first_max = st["alloc_bytes"].groupby(codes, sort=False).idxmax()
    full = dict(zip(first_max.index, st["full_frames"].to_numpy()[first_max.to_numpy()]))
    threads: dict[int, list] = {}
    per_tid = (
        x.groupby(["code", "tid"], sort=False)[["live_bytes", "device_live_bytes"]]
        .sum()
        .reset_index()
        .sort_values(
            ["code", "live_bytes", "device_live_bytes", "tid"], ascending=[True, False, False, True], kind="mergesort"
        )
    )
    for c, t, a, b in zip(per_tid["code"], per_tid["tid"], per_tid["live_bytes"], per_tid["device_live_bytes"]):
        threads.setdefault(int(c), []).append((int(t), int(a), int(b)))
    by_source: dict[int, dict[str, int]] = {}
    per_src = st.assign(code=codes).groupby(["code", "source"], sort=True)["live_bytes"].sum()
    for (c, src), v in per_src.items():
        by_source.setdefault(int(c), {})[str(src)] = int(v)
    members = _member_stacks(x, by)
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
        rows.append(
            {
                "site": site,
                "full_frames": full[c],
                "live_bytes": live,
                "live_count": int(a.live_count),
                "peak_live_bytes": peak,
                "alloc_bytes": int(a.alloc_bytes),
                "alloc_count": int(a.alloc_count),
                "free_bytes": int(a.free_bytes),
                "free_count": int(a.free_count),
                "sources": sorted(by_source[int(c)]),
                "threads": threads[int(c)],
                "growth_bytes_per_s": slope,
                "growth_r2": r2,
                "oldest_age_s": ages.get(site, math.nan),
                "verdict": verdict(jl, jp, slope, r2, float(gr["window_s"]), int(gr["window_points"])),
                "timeline": [int(v) for v in line] if len(line) else [0] * len(tl),
                "at_peak_bytes": int(line[at - 1]) if at is not None and len(line) >= at else 0,
                "device_peak_bytes": dpeak,
                **{f"device_{k}": int(getattr(a, f"device_{k}")) for k in DEVICE_SUMS},
                "live_by_source": by_source[int(c)],
                "stack": members[int(c)][0],
                "stacks": members[int(c)],
                "n_stacks": len(members[int(c)]),
                "at_peak_estimate_bytes": est.get(site, 0),
            }
        )
    df = sort_sites(pd.DataFrame(rows), sort)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df[RANK_COLUMNS].reset_index(drop=True)


def _member_stacks(x: pd.DataFrame, by: str) -> dict[int, list[SiteKey]]:
    """code -> the distinct folded stacks (`site`) of that row of rank_sites, holding most
    first: host live bytes, allocated bytes, GPU live bytes, then their text. `x`: the site
    table with the row's `code` and the host/GPU split columns."""
    if by == "stack":
        return {int(c): [s] for c, s in zip(x["code"], x["site"])}
    scode, stacks = pd.factorize(pd.Series(x["site"].tolist(), dtype=object))
    g = (
        x.assign(scode=scode)
        .groupby(["code", "scode"], sort=False)[["live_bytes", "alloc_bytes", "device_live_bytes"]]
        .sum()
        .reset_index()
    )
    stacks = stacks.tolist()
    g["_name"] = [frame_key_text(stacks[i]) for i in g["scode"]]
    g = g.sort_values(
        ["code", "live_bytes", "alloc_bytes", "device_live_bytes", "_name"],
        ascending=[True, False, False, False, True],
        kind="mergesort",
    )
    out: dict[int, list[SiteKey]] = {}
    for c, i in zip(g["code"], g["scode"]):
        out.setdefault(int(c), []).append(stacks[i])
    return out


def site_dict(r, names: dict[int, str], points: list[int]) -> dict:
    """One row of rank_sites as an allocscope.report/1 site."""
    return {
        "rank": int(r.rank),
        "live_bytes": int(r.live_bytes),
        "live_count": int(r.live_count),
        "peak_live_bytes": int(r.peak_live_bytes),
        "alloc_bytes": int(r.alloc_bytes),
        "alloc_count": int(r.alloc_count),
        "free_bytes": int(r.free_bytes),
        "free_count": int(r.free_count),
        "sources": list(r.sources),
        "growth_bytes_per_s": json_num(r.growth_bytes_per_s, 3),
        "growth_r2": json_num(r.growth_r2, 4),
        "oldest_age_s": json_num(r.oldest_age_s, 3),
        "verdict": r.verdict,
        "timeline": [r.timeline[i] for i in points if i < len(r.timeline)],
        "frames": [f.as_dict() for f in r.stack],
        "full_frames": [f.as_dict() for f in r.full_frames],
        "threads": [
            {"tid": t, "name": names.get(t, "?"), "live_bytes": b, "device_live_bytes": d} for t, b, d in r.threads
        ],
        "at_peak_bytes": int(r.at_peak_bytes),
        **({"at_peak_estimate_bytes": int(r.at_peak_estimate_bytes)} if r.at_peak_estimate_bytes else {}),
        **{c: int(getattr(r, c)) for c in DEVICE_SITE_KEYS},
        "live_by_source": dict(r.live_by_source),
    }


def _gpu_ranks(sites: pd.DataFrame) -> tuple[list[int], list[int]]:
    """(ranks of the rows that allocated GPU memory, by GPU bytes live at the end, then their
    GPU peak; ranks of the rows that hold cuda-pinned or cuda-managed host memory, by those
    bytes live at the end)."""
    dev, host = [], []
    for r in sites.itertuples():
        if r.device_alloc_count:
            dev.append((-int(r.device_live_bytes), -int(r.device_peak_bytes), int(r.rank)))
        if any(x in CUDA_HOST_SOURCES for x in r.sources):
            held = sum(int(r.live_by_source.get(x, 0)) for x in CUDA_HOST_SOURCES)
            host.append((-held, int(r.rank)))
    return [x[-1] for x in sorted(dev)], [x[-1] for x in sorted(host)]


def gpu_summary(trace: Trace, tot: dict, sites: pd.DataFrame, locations: pd.DataFrame | None = None) -> dict:
    """The report's `gpu` block: seen (any CUDA memory: a site of a cuda-* source, or GPU or
    driver-API host memory in the totals), driver (the libcuda.so the probes were attached to,
    meta.json probes.cuda.module; None when none was), probed (the driver calls attached),
    skipped ({call: why}), device_ranks (ranks of the sites that allocated GPU memory, by GPU
    bytes live at the end, then their GPU peak), host_ranks (ranks of the sites that allocated
    cuda-pinned or cuda-managed host memory, by those bytes live at the end); with
    `locations` (rank_sites by location), device_location_ranks and host_location_ranks: the
    same for them."""
    cuda = (trace.meta.get("probes") or {}).get("cuda") or {}
    dev, host = _gpu_ranks(sites)
    seen = bool(dev or host or tot.get("device_peak_bytes") or tot.get("cuda_host_bytes"))
    out = {
        "seen": seen,
        "driver": cuda.get("module") or None,
        "probed": list(cuda.get("attached") or []),
        "skipped": dict(cuda.get("skipped") or {}),
        "device_ranks": dev,
        "host_ranks": host,
    }
    if locations is not None:
        out["device_location_ranks"], out["host_location_ranks"] = _gpu_ranks(locations)
    return out


def at_peak(trace: Trace, tot: dict, sites: pd.DataFrame) -> tuple[dict, dict[int, int]]:
    """The report's `at_peak` block — seq and elapsed_s of `peak_seq` (None when nothing was
    live), live_bytes (the process's live total then; at least the sum of the sites' bytes at
    that moment: the kernel's total and its per-site counters are read a moment apart, and in a
    burst the sites can run ahead, so no site holds more than 100 % of it), peak_first (see `peak_first`),
    max_fraction (its threshold), peak_snapshot (True when that moment is a peak snapshot, read
    when the live total passed its high-water mark, not an interval's end), margin_bytes (the
    peak snapshots' margin: live_bytes is within it of totals.peak_live_bytes; 0 in a trace
    without them) — and rank -> at_peak_rank: the rank_sites rows ordered by their bytes at
    that moment, then by their own peak (ties as rank_sites breaks them)."""
    trace = estimate_touches(trace)
    seq = peak_seq(trace)
    iv = trace.intervals
    live = iv.set_index("seq")["live_bytes"]
    snap = dict(zip(iv["seq"].astype(int), peak_rows(iv)))
    block = {
        "seq": seq,
        "elapsed_s": None if seq is None else json_num(float(elapsed_s(trace)[seq]), 3),
        "live_bytes": 0 if seq is None else max(int(live[seq]), int(sites["at_peak_bytes"].sum()) if len(sites) else 0),
        # no snapshot caught anything live (a peak between two of them): no peak table to lead with
        "peak_first": peak_first(tot) and seq is not None,
        "max_fraction": PEAK_FIRST_MAX_FRACTION,
        "peak_snapshot": bool(seq is not None and snap.get(seq)),
        "margin_bytes": int(tot.get("peak_margin_bytes") or 0),
    }
    if "touch_estimate_bytes" in iv and seq is not None:
        # residency mode: first touches stand for an estimate (analysis/touches.py)
        est = int(iv.set_index("seq")["touch_estimate_bytes"].get(seq, 0))
        block.update(estimate=True, touch_estimate_bytes=est, exact_bytes=max(0, int(live[seq]) - est))
        if "untouched_bytes" in iv:  # mapped, not yet touched: not in live_bytes (analysis/touches.py)
            block["untouched_bytes"] = int(iv.set_index("seq")["untouched_bytes"].get(seq, 0))
            block["rss_known"] = bool(iv.set_index("seq")["rss_known"].get(seq, False))
    order = sort_sites(sites, "at_peak")["rank"].tolist() if len(sites) else []
    return block, {int(r): i for i, r in enumerate(order, 1)}


def sampling_error(live_bytes: int, sample_bytes: int) -> int:
    """95% error bar of a byte-weighted-sampled estimate (sample one block per N bytes on
    average, weight max(size, N)): for blocks smaller than N the estimate's variance is about
    bytes * N, so ±1.96 * sqrt(bytes * N)."""
    return int(1.96 * (max(live_bytes, 0) * sample_bytes) ** 0.5) if sample_bytes else 0
