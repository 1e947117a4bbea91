"""Compare two traces of (usually) the same program: which call sites and thread pools hold
more memory in run B than in run A, and which grew out of proportion to a scaling label.

    >>> from reports.trace import load_trace
    >>> from reports.analysis.diff import diff_traces, diff_sites, summarize
    >>> a, b = load_trace("pw10.allocscope"), load_trace("pw12.allocscope")
    >>> doc = diff_traces(a, b, per="pw")         # the allocscope.diff/1 document
    >>> diff_sites(summarize(a), summarize(b))    # the same, as a DataFrame (columns below)

Sites are matched by their symbolized, folded frames, each reduced to (function, module
basename, file basename, line): never by address or stack id, which ASLR, other builds paths
and other PIDs change. Locations (reports.analysis.stacks.group_of: the innermost frame of a site) are
matched the same way, so a place reached through other stacks in B than in A — a work-stealing
pool's — is one row with its whole B/A: what the text shows by default (`by`).

Everything per trace comes from reports.analysis (rank_sites, thread_group_table, totals), so a
diff shows the same numbers as the two reports.

Normalization (``per=LABEL``): both traces carry a numeric label (``--label pw=10``), and a
site whose memory scales linearly with it has B/A ~= label_b / label_a (the *expected ratio*).
A site is *flagged* when its ``scaling`` (its B/A peak ratio divided by the expected ratio; a
site absent from A scales infinitely) is > 1.5 and its peak grew by at least 1% of the sum of
|delta| over all sites: it grew out of proportion and by an amount that matters.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from common.errors import UsageError
from common.tracefile.reader import Trace

from . import (
    GROUPINGS,
    Folding,
    FrameInfo,
    SiteKey,
    advice,
    folded_wrappers,
    frame_key_text,
    key_quality,
    located_extras,
    location_key,
    rank_sites,
    rss_decomposition,
    symbolize_stacks,
    thread_group_table,
    totals,
)
from .diff_findings import diff_findings
from .integrity import diff_integrity
from .touches import estimate_touches
from .waits import held_while_waiting

DIFF_SCHEMA = "allocscope.diff/1"
DIFF_SORTS = ("delta", "live", "alloc", "ratio", "excess", "device")
FLAG_SCALING = 1.5  # flagged: grew more than 1.5x what linear scaling with the label predicts
FLAG_MATERIAL = 0.01  # ...and its delta is at least 1% of the sum of |delta| over all sites

SITE_DIFF_COLUMNS = [
    "site",
    "in",
    "a_peak_live_bytes",
    "b_peak_live_bytes",
    "delta_bytes",
    "ratio",
    "a_live_bytes",
    "b_live_bytes",
    "live_delta_bytes",
    "a_alloc_bytes",
    "b_alloc_bytes",
    "alloc_delta_bytes",
    "a_alloc_count",
    "b_alloc_count",
    "alloc_count_delta",
    "a_verdict",
    "b_verdict",
    "a_growth_bytes_per_s",
    "b_growth_bytes_per_s",
    "expected_b_peak_live_bytes",
    "excess_bytes",
    "scaling",
    "flagged",
    "a_device_peak_bytes",
    "b_device_peak_bytes",
    "device_peak_delta_bytes",
    "a_device_live_bytes",
    "b_device_live_bytes",
    "device_live_delta_bytes",
]
_SITE_VALUES = ["peak_live_bytes", "live_bytes", "alloc_bytes", "alloc_count", "device_peak_bytes", "device_live_bytes"]
TOTAL_KEYS = [
    "live_bytes",
    "live_count",
    "peak_live_bytes",
    "rss_bytes",
    "peak_rss_bytes",
    "hwm_bytes",
    "lost_events",
    "duration_s",
    "intervals",
    "device_bytes",
    "device_peak_bytes",
    "device_count",
    "cuda_host_bytes",
]


def match_frame(f: FrameInfo) -> FrameInfo:
    """A frame reduced to what is the same in every run: function, module and file basenames,
    line."""
    return FrameInfo(f.function, os.path.basename(f.module or ""), os.path.basename(f.file) if f.file else None, f.line)


def normalize_stacks(stacks: dict[int, SiteKey]) -> dict[int, SiteKey]:
    """stack_id -> frames reduced by `match_frame`, so rank_sites groups (and sums) exactly the
    stacks that match across runs."""
    return {sid: tuple(match_frame(f) for f in frames) for sid, frames in stacks.items()}


@dataclass
class Side:
    """One trace, summarized for a diff: its sites (rank_sites over matched frames, wrappers
    folded by `fold`), thread groups (thread_group_table), totals (analysis.totals) and its
    stacks (matched frames, unfolded)."""

    trace: Trace
    sites: pd.DataFrame
    groups: pd.DataFrame
    totals: dict
    stacks: dict[int, SiteKey] = field(default_factory=dict)
    locations: pd.DataFrame | None = None  # rank_sites by location (or function)


def summarize(trace: Trace, progress=None, fold: Folding | None = None, by: str = "location") -> Side:
    """Everything a diff needs from one trace; `fold` (analysis.parse_fold): the wrappers to
    fold besides the built-in ones, the same for both sides so that their sites match; `by`:
    how `locations` are grouped (location or function; stack: by location)."""
    trace = estimate_touches(trace)
    stacks = normalize_stacks(symbolize_stacks(trace, progress))
    loc_by = "location" if by == "stack" else by
    return Side(
        trace,
        rank_sites(trace, stacks, fold=fold),
        thread_group_table(trace),
        totals(trace),
        stacks,
        rank_sites(trace, stacks, fold=fold, by=loc_by),
    )


def label_value(trace: Trace, label: str, which: str) -> float:
    """The numeric value of `label` in a trace; UsageError when missing, not a number, or <= 0."""
    labels = trace.labels
    if label not in labels:
        have = ", ".join(f"{k}={v}" for k, v in labels.items()) or "none"
        raise UsageError(
            f"--per {label}: trace {which} ({trace.path}) has no label {label} (its labels: {have}); "
            f"record with --label {label}=N"
        )
    try:
        value = float(labels[label])
    except (TypeError, ValueError):
        raise UsageError(f"--per {label}: trace {which} has {label}={labels[label]!r}, not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--per {label}: trace {which} has {label}={labels[label]!r}; it must be > 0")
    return value


def _ratio(a: int, b: int) -> float:
    """b / a; inf for a site new in B, NaN when both are 0."""
    if a:
        return b / a
    return math.inf if b else math.nan


def _site_rows(a: pd.DataFrame, b: pd.DataFrame) -> list[dict]:
    """Outer join of two rank_sites frames on `site`: one dict per site with a_*/b_* values."""
    ra = {r["site"]: r for r in a.to_dict("records")}
    rb = {r["site"]: r for r in b.to_dict("records")}
    rows = []
    for site in list(ra) + [s for s in rb if s not in ra]:
        x, y = ra.get(site), rb.get(site)
        row = {"site": site, "in": "both" if x and y else ("a" if x else "b")}
        for col in _SITE_VALUES:
            row[f"a_{col}"] = int(x[col]) if x else 0
            row[f"b_{col}"] = int(y[col]) if y else 0
        for col in ("verdict", "growth_bytes_per_s"):
            row[f"a_{col}"] = x[col] if x else None
            row[f"b_{col}"] = y[col] if y else None
        rows.append(row)
    return rows


def _add_deltas(row: dict, expected: float | None) -> None:
    """delta, ratio and (with an expected ratio) the normalized columns of one site row."""
    row["delta_bytes"] = row["b_peak_live_bytes"] - row["a_peak_live_bytes"]
    row["ratio"] = _ratio(row["a_peak_live_bytes"], row["b_peak_live_bytes"])
    row["live_delta_bytes"] = row["b_live_bytes"] - row["a_live_bytes"]
    row["alloc_delta_bytes"] = row["b_alloc_bytes"] - row["a_alloc_bytes"]
    row["alloc_count_delta"] = row["b_alloc_count"] - row["a_alloc_count"]
    row["device_peak_delta_bytes"] = row["b_device_peak_bytes"] - row["a_device_peak_bytes"]
    row["device_live_delta_bytes"] = row["b_device_live_bytes"] - row["a_device_live_bytes"]
    if expected is None:
        row.update(expected_b_peak_live_bytes=None, excess_bytes=None, scaling=math.nan)
        return
    row["expected_b_peak_live_bytes"] = round(row["a_peak_live_bytes"] * expected)
    row["excess_bytes"] = row["b_peak_live_bytes"] - row["expected_b_peak_live_bytes"]
    row["scaling"] = row["ratio"] / expected


def _flag(rows: list[dict], expected: float | None) -> None:
    """Set `flagged` (see the module docstring)."""
    total = sum(abs(r["delta_bytes"]) for r in rows)
    for r in rows:
        r["flagged"] = bool(
            expected is not None
            and r["scaling"] > FLAG_SCALING
            and r["delta_bytes"] > 0
            and r["delta_bytes"] >= FLAG_MATERIAL * total
        )


def _sort_key(sort: str):
    """Row -> sort key (ascending) for a diff sort name; ties by B peak, then frames text."""
    primary = {
        "delta": lambda r: -abs(r["delta_bytes"]),
        "live": lambda r: -abs(r["live_delta_bytes"]),
        "alloc": lambda r: -abs(r["alloc_delta_bytes"]),
        "ratio": lambda r: -r["ratio"] if not math.isnan(r["ratio"]) else math.inf,
        "excess": lambda r: -abs(r["excess_bytes"] or 0),
        "device": lambda r: -abs(r["device_peak_delta_bytes"]),
    }[sort]
    return lambda r: (primary(r), -r["b_peak_live_bytes"], -r["b_device_peak_bytes"], frame_key_text(r["site"]))


def diff_sites(a: Side, b: Side, per: str | None = None, sort: str = "delta", locations: bool = False) -> pd.DataFrame:
    """Sites of A and B matched by frames (with `locations`: their locations, Side.locations,
    matched by the location's frame). One row per site; columns:

    site (matched frames tuple), in ('both'|'a'|'b'), a_/b_peak_live_bytes, delta_bytes (b - a
    peak), ratio (b/a peak; inf: new in B; NaN: 0 in both), a_/b_live_bytes (at the end),
    live_delta_bytes, a_/b_alloc_bytes, alloc_delta_bytes, a_/b_alloc_count, alloc_count_delta,
    a_/b_verdict and a_/b_growth_bytes_per_s (None where absent; see analysis.verdict), and with
    `per`: expected_b_peak_live_bytes (A peak x expected ratio), excess_bytes (B peak minus that),
    scaling (ratio / expected ratio); flagged (see the module docstring); a_/b_device_peak_bytes,
    device_peak_delta_bytes, a_/b_device_live_bytes, device_live_delta_bytes: the site's GPU
    memory (analysis.rank_sites' device_* columns), compared apart — every other column is host
    memory, and flags judge host memory only.

    sort: delta (|delta_bytes|), live (|live_delta_bytes|), alloc (|alloc_delta_bytes|), ratio
    (highest B/A first, new sites first), excess (|excess_bytes|, needs `per`), device
    (|device_peak_delta_bytes|); all descending.
    """
    if sort not in DIFF_SORTS:
        raise UsageError(f"unknown sort {sort!r}; choose one of {', '.join(DIFF_SORTS)}")
    if sort == "excess" and per is None:
        raise UsageError("--sort excess needs --per LABEL (the excess is over linear scaling with LABEL)")
    expected = normalization(a.trace, b.trace, per)["expected_ratio"] if per else None
    rows = _site_rows(a.locations, b.locations) if locations else _site_rows(a.sites, b.sites)
    for r in rows:
        _add_deltas(r, expected)
    _flag(rows, expected)
    rows.sort(key=_sort_key(sort))
    return pd.DataFrame(rows, columns=SITE_DIFF_COLUMNS)


def diff_thread_groups(a: Side, b: Side) -> pd.DataFrame:
    """Thread groups (analysis.thread_group) of A and B side by side, by |peak delta| desc.
    Columns: group, a_threads, b_threads, a_live_bytes, b_live_bytes, live_delta_bytes,
    a_peak_live_bytes, b_peak_live_bytes, peak_delta_bytes (host memory), a_device_live_bytes,
    b_device_live_bytes, device_live_delta_bytes (GPU memory)."""
    cols = ["threads", "live_bytes", "peak_live_bytes", "device_live_bytes"]
    ga = a.groups.set_index("group")[cols].add_prefix("a_")
    gb = b.groups.set_index("group")[cols].add_prefix("b_")
    df = ga.join(gb, how="outer").fillna(0).astype("int64").reset_index()
    df["live_delta_bytes"] = df["b_live_bytes"] - df["a_live_bytes"]
    df["peak_delta_bytes"] = df["b_peak_live_bytes"] - df["a_peak_live_bytes"]
    df["device_live_delta_bytes"] = df["b_device_live_bytes"] - df["a_device_live_bytes"]
    df = df.assign(_abs=df["peak_delta_bytes"].abs()).sort_values(
        ["_abs", "group"], ascending=[False, True], kind="mergesort"
    )
    return df[
        [
            "group",
            "a_threads",
            "b_threads",
            "a_live_bytes",
            "b_live_bytes",
            "live_delta_bytes",
            "a_peak_live_bytes",
            "b_peak_live_bytes",
            "peak_delta_bytes",
            "a_device_live_bytes",
            "b_device_live_bytes",
            "device_live_delta_bytes",
        ]
    ].reset_index(drop=True)


def _header(side: Side) -> dict:
    """One trace of the `traces` block: which trace, which process, its labels."""
    t = side.trace
    tgt = t.meta.get("target") or {}
    return {
        "path": t.path,
        "labels": t.labels,
        "pid": tgt.get("pid"),
        "comm": tgt.get("comm"),
        "exe": tgt.get("exe"),
        "complete": t.complete,
        "warnings": list(t.warnings),
    }


def _program(side: Side) -> str:
    tgt = side.trace.meta.get("target") or {}
    return os.path.basename(tgt.get("exe") or "") or str(tgt.get("comm") or "?")


def _warnings(a: Side, b: Side) -> list[str]:
    out = []
    pa_, pb = _program(a), _program(b)
    if pa_ != pb:
        out.append(f"A and B are different programs ({pa_} vs {pb}): only sites with the same symbolized frames match")
    for name, s in (("A", a), ("B", b)):
        out += [f"{name}: {w}" for w in s.trace.warnings]
        out += [f"{name} lost events, its numbers are lower bounds: {line}" for line in advice(s.trace, s.totals)]
    return out


def _jnum(v):
    """A JSON-safe value: plain Python types, None for NaN/inf."""
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _site_json(row: dict, location: bool = False) -> dict:
    out: dict[str, Any] = {"frames": [f.as_dict() for f in row["site"]]}
    if location:
        f = row["site"][0]
        out.update(
            location=location_key(row["site"]),
            function=f.function,
            module=f.module,
            file=f.file,
            line=f.line,
            **located_extras(f),
            key_quality=key_quality(f),
        )
    out.update({k: _jnum(row[k]) for k in SITE_DIFF_COLUMNS if k != "site"})
    for k in ("ratio", "scaling"):
        if out[k] is not None:
            out[k] = round(out[k], 4)
    return out


def _totals_json(a: Side, b: Side, expected: float | None) -> dict:
    ta = {k: a.totals[k] for k in TOTAL_KEYS}
    tb = {k: b.totals[k] for k in TOTAL_KEYS}
    out: dict[str, Any] = {"a": ta, "b": tb, "delta": {k: tb[k] - ta[k] for k in TOTAL_KEYS}}
    if expected is not None:
        out["expected_b_peak_live_bytes"] = round(ta["peak_live_bytes"] * expected)
    return out


ALLOCATOR_KEYS = ("resident", "live", "retained", "released", "live_before_attach", "before_or_retained")


def diff_allocators(a: Side, b: Side) -> list[dict]:
    """What each allocator keeps in A and B (analysis.rss_decomposition's `allocators`, matched
    by name): {name, in, a_/b_ and delta_ of resident, live, retained, released,
    live_before_attach (0 where no census measured it)}, by |retained
    delta|; [] when neither trace measures it."""

    def by_name(side: Side) -> dict[str, dict]:
        dec = rss_decomposition(side.trace) or {}
        return {x["name"]: x for x in dec.get("allocators") or []}

    xa, xb = by_name(a), by_name(b)
    rows = []
    for name in list(xa) + [n for n in xb if n not in xa]:
        pa_, pb = xa.get(name), xb.get(name)
        row: dict[str, Any] = {"name": name, "in": "both" if pa_ and pb else ("a" if pa_ else "b")}
        for k in ALLOCATOR_KEYS:
            row[f"a_{k}"], row[f"b_{k}"] = int((pa_ or {}).get(k) or 0), int((pb or {}).get(k) or 0)
            row[f"{k}_delta"] = row[f"b_{k}"] - row[f"a_{k}"]
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["retained_delta"]), -r["b_resident"], r["name"]))
    return rows


def diff_waits(a: Side, b: Side) -> list[dict]:
    """Waiting and holding, A vs B, per wait location (reports/analysis/waits.py): at each side's peak of
    held-while-waiting, the threads blocked there and the bytes they held (a_/b_threads,
    a_/b_held_bytes, held_delta; a_/b_kept_bytes: the part allocated outside the functions on
    the wait stack, see waits.held_while_waiting), the most threads blocked there at any snapshot
    (a_/b_max_threads) and the off-CPU time there over the whole recording (a_/b_wait_s); by
    |held_delta|, then |max_threads delta|. [] when neither recording traced waits."""
    wa, wb = held_while_waiting(a.trace, a.stacks), held_while_waiting(b.trace, b.stacks)
    if not wa["traced"] and not wb["traced"]:
        return []
    rows: dict[str, dict] = {}

    def row(d: dict) -> dict:
        return rows.setdefault(
            d["location"],
            {k: d.get(k) for k in ("location", "function", "module", "file", "line")}
            | {f"{x}_{k}": 0 for x in "ab" for k in ("threads", "held_bytes", "kept_bytes", "max_threads")}
            | {"a_wait_s": 0.0, "b_wait_s": 0.0},
        )

    for x, w in (("a", wa), ("b", wb)):
        for d in (w.get("peak") or {}).get("by_location") or []:
            r = row(d)
            r[f"{x}_threads"], r[f"{x}_held_bytes"] = d["threads"], d["held_bytes"]
            r[f"{x}_kept_bytes"] = d.get("kept_bytes", 0)
        for d in w.get("off_cpu") or []:
            row(d)[f"{x}_wait_s"] = d["total_s"]
        for t in w.get("timeline") or []:
            for key, v in t["by_location"].items():
                if key in rows:
                    rows[key][f"{x}_max_threads"] = max(rows[key][f"{x}_max_threads"], v["threads"])
    out = list(rows.values())
    for r in out:
        r["held_delta"] = r["b_held_bytes"] - r["a_held_bytes"]
        r["threads_delta"] = r["b_max_threads"] - r["a_max_threads"]
    out.sort(key=lambda r: (-abs(r["held_delta"]), -abs(r["threads_delta"]), -r["b_wait_s"], r["location"]))
    return out


def normalization(trace_a: Trace, trace_b: Trace, per: str) -> dict:
    """The `per` block: label, its values a and b in the two traces, expected_ratio (b / a: the
    B/A ratio of a site that scales linearly with the label), flag_scaling, flag_material."""
    va, vb = label_value(trace_a, per, "A"), label_value(trace_b, per, "B")
    return {
        "label": per,
        "a": va,
        "b": vb,
        "expected_ratio": vb / va,
        "flag_scaling": FLAG_SCALING,
        "flag_material": FLAG_MATERIAL,
    }


def diff_traces(
    trace_a: Trace,
    trace_b: Trace,
    per: str | None = None,
    sort: str = "delta",
    progress=None,
    fold: Folding | None = None,
    by: str = "location",
) -> dict:
    """The allocscope.diff/1 document: `allocscope diff A B --format json`.

    Keys: schema; a, b (the labels of each trace); traces (a, b: path, labels, pid, comm, exe,
    complete, warnings); per (label, a, b, expected_ratio, flag thresholds; null without
    `per`); sort; folded (what wrapper patterns folded out of either trace's sites, as the
    report's `folded`; `fold` adds the user's); warnings (e.g. different programs); totals (a,
    b, delta: live/peak/RSS/losses, and GPU memory apart: device_bytes, device_peak_bytes,
    device_count, cuda_host_bytes; expected_b_peak_live_bytes with `per`); sites (see
    diff_sites; `frames` instead of `site`, NaN/inf ratios as null), ordered by `sort`;
    by (what the text lists: location, function or stack); locations (the same figures and
    flag per location — per function with `by` function —, with its `location` key, function,
    module, file, line and key_quality; flags judged among locations), ordered by `sort`;
    thread_groups (see diff_thread_groups); allocators (see diff_allocators); waits (see
    diff_waits); findings (reports.analysis.diff_findings.diff_findings: the answer first, at most 6
    sentences, each naming the table it comes from).
    """
    if by not in GROUPINGS:
        raise UsageError(f"unknown grouping {by!r}; choose one of {', '.join(GROUPINGS)}")
    return diff_document(
        summarize(trace_a, progress, fold, by), summarize(trace_b, progress, fold, by), per, sort, fold, by
    )


def diff_document(
    a: Side, b: Side, per: str | None = None, sort: str = "delta", fold: Folding | None = None, by: str = "location"
) -> dict:
    """diff_traces from two summarized traces (`summarize`), for a caller that keeps the
    Sides (their symbolized stacks: the HTML page draws its flame graph from them)."""
    trace_a, trace_b = a.trace, b.trace
    sites = diff_sites(a, b, per, sort)
    locs = diff_sites(a, b, per, sort, locations=True)
    norm = normalization(trace_a, trace_b, per) if per else None
    doc = {
        "schema": DIFF_SCHEMA,
        "a": a.trace.labels,
        "b": b.trace.labels,
        "traces": {"a": _header(a), "b": _header(b)},
        "per": norm,
        "sort": sort,
        "folded": folded_wrappers([*a.stacks.values(), *b.stacks.values()], fold),
        "warnings": _warnings(a, b),
        "totals": _totals_json(a, b, norm["expected_ratio"] if norm else None),
        "by": by,
        "sites": [_site_json(r) for r in sites.to_dict("records")],
        "locations": [_site_json(r, location=True) for r in locs.to_dict("records")],
        "thread_groups": [{k: _jnum(v) for k, v in r.items()} for r in diff_thread_groups(a, b).to_dict("records")],
        "allocators": diff_allocators(a, b),
        "waits": diff_waits(a, b),
    }
    out = {"schema": DIFF_SCHEMA, "findings": diff_findings(doc), **doc}
    return diff_integrity(out, trace_a.integrity, trace_b.integrity)  # damaged tables' findings withheld
