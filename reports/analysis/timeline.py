"""Figures over time: per-key live-byte series, elapsed seconds, the growth fit and the
verdict rules, and the interval of the process's peak."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import numpy as np
import pandas as pd

from common.tracefile.reader import Trace

from .sources import is_device
from .touches import estimate_touches

# Verdict rules (documented in `verdict`).
FIT_TAIL_FRACTION = 0.5  # growth is fitted over the last half of the recording...

MIN_FIT_POINTS = 4  # ...but over at least this many intervals; fewer: never "growing"

GROWTH_MIN_R2 = 0.8  # a line must explain >= 80% of the variance to call it growth

GROWTH_MIN_RISE = 0.10  # and the rise over the fit window must be >= 10% of the live bytes

TRANSIENT_MAX_FRACTION = 0.25  # live at the end <= 25% of the peak: the peak was mostly freed

PEAK_FIRST_MAX_FRACTION = 0.25  # the same for the whole process: reports lead with the peak (peak_first)

TIMELINE_POINTS = 50  # at most this many points of each site's timeline in the JSON


def key_timeline(trace: Trace, keycol_fn: Callable[[tuple], Hashable], device: bool | None = None) -> pd.DataFrame:
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
    ss_tot = (yc**2).sum(axis=0)
    ss_res = ((yc - np.outer(xc, slope)) ** 2).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), 1.0)
    if len(x) < 3:
        r2 = np.full(k, np.nan)
    return slope, np.clip(r2, 0.0, 1.0)


def verdict(
    live_bytes: int,
    peak_live_bytes: int,
    growth_bytes_per_s: float,
    growth_r2: float | None,
    window_s: float,
    window_points: int,
) -> str:
    """What a site's memory did, at a glance. The first rule that matches wins:

    1. ``freed``: nothing of it is live at the end (live bytes == 0).
    2. ``transient``: live at the end <= 25% of its peak: it peaked, then most was freed.
    3. ``growing``: over the fit window (the last half of the recording, at least 4 intervals;
       never with fewer intervals) the least-squares slope of its live bytes is > 0, the fit
       is good (R² >= 0.8, so noise is not called growth) and the rise the line predicts over
       the window (slope x window seconds) is >= 10% of its live bytes at the end.
    4. ``new``: fewer than 4 intervals of history (a recording or a live view just begun):
       too early to tell a rise from a plateau — the growth figure is the rise so far.
    5. ``plateaued``: anything else: memory is held, not released, not clearly rising.
    """
    if live_bytes <= 0:
        return "freed"
    if live_bytes <= TRANSIENT_MAX_FRACTION * peak_live_bytes:
        return "transient"
    if (
        window_points >= MIN_FIT_POINTS
        and growth_bytes_per_s > 0
        and growth_r2 is not None
        and not math.isnan(growth_r2)
        and growth_r2 >= GROWTH_MIN_R2
        and growth_bytes_per_s * window_s >= GROWTH_MIN_RISE * live_bytes
    ):
        return "growing"
    if window_points < MIN_FIT_POINTS:
        return "new"
    return "plateaued"


def growth_table(timeline: pd.DataFrame, elapsed: pd.Series) -> pd.DataFrame:
    """Per timeline column (index: the column keys): growth_bytes_per_s and growth_r2 of the
    line fitted over the last `fit_window` intervals, window_s (seconds the window spans) and
    window_points."""
    n = len(timeline)
    w = fit_window(n)
    if timeline.shape[1] == 0 or w == 0:
        return pd.DataFrame(
            columns=["growth_bytes_per_s", "growth_r2", "window_s", "window_points"], index=timeline.columns
        )
    tail = timeline.iloc[n - w :]
    x = elapsed.reindex(tail.index).to_numpy(dtype=float)
    slope, r2 = fit_growth(x, tail.to_numpy())
    return pd.DataFrame(
        {"growth_bytes_per_s": slope, "growth_r2": r2, "window_s": float(x[-1] - x[0]), "window_points": w},
        index=timeline.columns,
    )


def peak_rows(iv: pd.DataFrame) -> np.ndarray:
    """Boolean mask of the `intervals` rows that are peak snapshots (tracer/record/peaks.py: the
    per-stack counters read when the live total passed its high-water mark, between two interval
    snapshots); all False in a trace made before them."""
    if "peak_snapshot" not in iv:
        return np.zeros(len(iv), dtype=bool)
    return iv["peak_snapshot"].fillna(0).to_numpy() == 1


PEAK_MARGIN_FRACTION, PEAK_MARGIN_MIN_BYTES = 0.01, 1 << 20  # tracer/record/peaks.py, when meta.json has none


def peak_margin(trace: Trace, hwm: int) -> int:
    """The margin of the peak snapshots (tracer/record/peaks.py): a peak snapshot's live total is within
    it of the high-water mark `hwm`; 0 for a trace made before them (the peak is then a sample of
    the interval snapshots)."""
    p = trace.meta.get("peaks")
    if not isinstance(p, dict):
        return 0
    frac = float(p.get("margin_fraction", PEAK_MARGIN_FRACTION))
    return max(int(hwm * frac), int(p.get("margin_min_bytes", PEAK_MARGIN_MIN_BYTES)))


def peak_seq(trace: Trace) -> int | None:
    """The interval (seq) at whose end the process's live total (`intervals.live_bytes`) was
    highest — the first of equal ones; None when nothing was ever live. With peak snapshots in
    the trace this is one of them whenever the total passed its high-water mark between two
    interval snapshots: the composition within the margin (`peak_margin`) of the true peak."""
    iv = estimate_touches(trace).intervals
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


def timeline_points(n: int, max_points: int = TIMELINE_POINTS) -> list[int]:
    """Indices (0-based) of at most `max_points` evenly spaced intervals out of n, first and
    last included: the points of each site's `timeline` in the JSON."""
    if n <= max_points:
        return list(range(n))
    return sorted({round(i) for i in np.linspace(0, n - 1, max_points)})


def json_num(v: float, digits: int) -> float | None:
    """A float for JSON: rounded, None for NaN."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), digits)
