"""A self-contained HTML report: one file that opens offline (no CDN, every script, style and
datum inline).

Contents: totals; RSS vs live bytes over time (and GPU memory, a series of its own, when the
trace has some); the top sites' live bytes over time, stacked;
an icicle flame graph of live bytes with two views, "at the peak" (the stacks live at the end
of the interval where the live total was highest) and "at the end" (click a frame to zoom, the
top bar to zoom out); the site, thread and cross-thread flow tables; a GPU section when CUDA
memory was seen; malloc_trim calls; and, given a diff document, the diff table. Live bytes,
the stacked chart and the flame graph are host memory; GPU memory has columns of its own.
When most of the peak was freed by the end (report["at_peak"]["peak_first"], see
reports.analysis.peak_first), the page leads with the peak: the site table, the stacked
chart's legend and the flame graph's default view are by bytes held at the peak; otherwise by
the report's rank and at the end.

The page is reports/render/assets/report.html (a string.Template), report.css and report.js, filled
in and inlined here. Charts are drawn by uPlot 1.6.32 (npm `uplot`, MIT;
dist/uPlot.iife.min.js, 51 KB, and uPlot.min.css, vendored in reports/render/assets/ with its licence)
from a JSON blob in the page; the flame graph is a small SVG renderer (report.js) of the data
reports.render.flamegraph computes. Tables are rendered here, so they read without JavaScript.

For tests and sanity, every drawn chart gets `data-ink` (painted canvas pixels) and the flame
graph `data-nodes` (frames drawn) and `data-view` (peak|end), once its script has run.
"""
from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from ..analysis import Folding, FrameInfo, peak_seq, site_timeline, symbolize_stacks
from ..trace import Trace
from .flamegraph import folded_stacks
from .text import (
    COLUMN_TITLES,
    LOCATION_FRAME_KEYS,
    NOUNS,
    SORT_TITLES,
    folded_text,
    frame_text,
    human_bytes,
    human_delta,
    listed,
    location_text,
    peak_when,
    ratio_text,
)

ASSETS = Path(__file__).resolve().parent / "assets"
UPLOT_JS = "uPlot.iife.min.js"
UPLOT_CSS = "uPlot.min.css"
PAGE = "report.html"     # string.Template: $title, $sections, $data... (see to_html)
DIFF_PAGE = "diff.html"  # the same for to_diff_html
PAGE_CSS = "report.css"
PAGE_JS = "report.js"
TOP_SITES_CHART = 8      # sites drawn in the stacked chart; the rest are summed as "other"
TOP_SITES_TABLE = 200    # rows of the site table
FLAME_MIN_FRACTION = 1e-4  # flame-graph nodes smaller than this share of the total are left out
# (column, label, dashed): the host total is drawn dashed, over the parts it sums; GPU memory is
# a series of its own, never part of it. Series of CUDA memory only when the trace has some.
TIMELINE_SERIES = [("rss_bytes", "RSS", False), ("heap_live_bytes", "live, heap API", False),
                   ("mmap_live_bytes", "live, mmap/brk", False), ("cuda_host_live_bytes", "live, CUDA host", False),
                   ("live_bytes", "live, total", True), ("device_live_bytes", "GPU memory (device)", False)]
WHEN_SEEN = {"cuda_host_live_bytes", "device_live_bytes"}


def _asset(name: str, inline: bool = True) -> str:
    """The text of reports/render/assets/NAME; one to be `inline`d in a <script> or <style> must not
    close it."""
    text = (ASSETS / name).read_text(encoding="utf-8")
    if inline and ("</script" in text.lower() or "</style" in text.lower()):
        raise ValueError(f"asset {name} cannot be inlined (contains a closing tag)")
    return text


def _json_for_script(obj: Any) -> str:
    """JSON safe inside <script type=application/json>: no '<', '>' or '&' left unescaped."""
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _frame_key(f: FrameInfo | Mapping) -> tuple:
    """Identity of a frame, whether a FrameInfo or a report dict."""
    if isinstance(f, FrameInfo):
        return (f.function, f.module, f.file, f.line, f.call, f.inside)
    return (f.get("function"), f.get("module"), f.get("file"), f.get("line"), f.get("call"), f.get("inside"))


def _label_text(d: Mapping | None) -> str:
    """'k=v k=v' for a (possibly nested) label dict."""
    parts: list[str] = []
    for k, v in (d or {}).items():
        if isinstance(v, Mapping):
            parts.append(_label_text(v))
        elif v is not None and not isinstance(v, (list, tuple)):
            parts.append(f"{k}={v}")
    return " ".join(p for p in parts if p)


def _num(v: Any) -> int | float | None:
    """A JSON number (int when integral), None for a missing value."""
    if v is None or pd.isna(v):
        return None
    return int(v) if float(v).is_integer() else float(v)


# --------------------------------------------------------------------------------------------- data
def timeline_data(trace: Trace, report_doc: dict | None = None) -> dict:
    """x = elapsed seconds; one series per TIMELINE_SERIES column present (the CUDA ones only
    when not all zero), and with a report whose RSS split measures each allocator, one
    'retained by NAME' series per allocator that ever retained memory (resident in its own
    mappings and not live: rising after a burst of frees, falling when it purges). RSS samples
    taken after the target exited (negative) are gaps."""
    iv = trace.intervals
    series = []
    for col, label, dashed in TIMELINE_SERIES:
        if col not in iv or (col in WHEN_SEEN and not iv[col].fillna(0).astype("int64").any()):
            continue
        vals = [_num(v) for v in iv[col]]
        if col == "rss_bytes":
            vals = [v if v is not None and v >= 0 else None for v in vals]
        series.append({"label": label, "values": vals, "dash": dashed})
    allocs = ((report_doc or {}).get("rss_decomposition") or {}).get("allocators") or []
    for a in allocs:
        by_seq = {p["seq"]: p["retained"] for p in a.get("timeline") or []}
        if any(by_seq.values()):
            series.append({"label": f"retained by {a['name']}", "values": [by_seq.get(int(s)) for s in iv["seq"]],
                           "dash": False})
    return {"t": [float(x) for x in iv["elapsed_s"]], "series": series}


def ordered_sites(report_doc: dict) -> list[tuple[int, dict]]:
    """(number shown, row) in the page's order — rows are the report's locations (its sites
    when it is `by` stack, render.listed) —: by bytes held at the peak (`at_peak_rank`, every
    row) when the report leads with the peak, else by `rank`."""
    sites = listed(report_doc)[0]
    if (report_doc.get("at_peak") or {}).get("peak_first"):
        return [(s["at_peak_rank"], s) for s in sorted(sites, key=lambda s: s["at_peak_rank"])]
    return [(s["rank"], s) for s in sites]


def site_chart_data(trace: Trace, report_doc: dict, stacks: Mapping[int, tuple[FrameInfo, ...]],
                    top: int = TOP_SITES_CHART, fold: Folding | None = None) -> dict:
    """Live host bytes over time of the page's top `top` rows (`ordered_sites`: locations or
    sites, by rank, or by bytes at the peak when the report leads with it) plus 'other'; series
    in stacking order, bottom (#1) first. GPU memory is not stacked with them (it is its own
    timeline series)."""
    by = listed(report_doc)[1]
    tl = site_timeline(trace, dict(stacks), fold, by=by)
    elapsed = dict(zip(trace.intervals["seq"].astype(int), trace.intervals["elapsed_s"].astype(float)))
    if tl.empty:
        return {"t": [], "series": []}
    tl = tl.loc[[s for s in tl.index if int(s) in elapsed]]
    t = [elapsed[int(s)] for s in tl.index]
    by_key = {tuple(_frame_key(f) for f in site): site for site in tl.columns}
    chosen: list[tuple[str, tuple]] = []
    for shown, site in ordered_sites(report_doc):
        if len(chosen) >= top:
            break
        key = site.get("frames") or [] if by == "stack" else [
            {k: site.get(k) for k in LOCATION_FRAME_KEYS}]
        col = by_key.get(tuple(_frame_key(f) for f in key))
        if col is not None and tl[col].max() > 0:
            fn = site["frames"][0]["function"] if site.get("frames") else "?"
            chosen.append((f"#{shown} {fn}", col))
    series = [{"label": label, "values": [int(v) for v in tl[col]]} for label, col in chosen]
    rest = tl.drop(columns=[col for _, col in chosen])
    n_rest = int((rest.to_numpy() != 0).any(axis=0).sum()) if not rest.empty else 0
    if n_rest:
        series.append({"label": f"other ({n_rest} {NOUNS[by]})", "values": [int(v) for v in rest.sum(axis=1)]})
    return {"t": t, "series": series}


def flame_tree(trace: Trace, stacks: Mapping[int, tuple[FrameInfo, ...]],
               min_fraction: float = FLAME_MIN_FRACTION, fold: Folding | None = None,
               at_seq: int | None = None) -> dict:
    """The live-bytes folded stacks (at the end; with `at_seq`, at the end of that interval)
    as a tree {n: name, v: value, c: [children]} rooted at 'all', children largest first;
    nodes under `min_fraction` of the total are dropped (their bytes still count in their
    parents)."""
    root: dict = {"n": "all", "v": 0, "c": {}}
    for path, value in folded_stacks(trace, "live_bytes", stacks=stacks, fold=fold, at_seq=at_seq).items():
        if value <= 0:
            continue
        node = root
        node["v"] += value
        for name in path:
            node = node["c"].setdefault(name, {"n": name, "v": 0, "c": {}})
            node["v"] += value
    limit = root["v"] * min_fraction

    def finish(node: dict) -> dict:
        kids = sorted((k for k in node["c"].values() if k["v"] >= limit and k["v"] > 0),
                      key=lambda k: (-k["v"], k["n"]))
        out = {"n": node["n"], "v": node["v"]}
        if kids:
            out["c"] = [finish(k) for k in kids]
        return out

    return finish(root)


def flame_data(trace: Trace, report_doc: dict, stacks: Mapping[int, tuple[FrameInfo, ...]],
               fold: Folding | None = None) -> dict:
    """The flame graph's views: {"views": {"peak": tree at `peak_seq` (None when nothing was
    live), "end": tree at the end}, "default": "peak" when the report leads with the peak,
    else "end"}."""
    seq = peak_seq(trace)
    views = {"peak": flame_tree(trace, stacks, fold=fold, at_seq=seq) if seq is not None else None,
             "end": flame_tree(trace, stacks, fold=fold)}
    lead = bool((report_doc.get("at_peak") or {}).get("peak_first")) and views["peak"] is not None
    return {"views": views, "default": "peak" if lead else "end"}


# --------------------------------------------------------------------------------------------- tables
def _table(headers: list[str], rows: list[list[str]], numeric: set[int], cls: str = "") -> str:
    """An HTML table from already-escaped cells; columns in `numeric` are right-aligned."""
    th = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _bytes(n: float | None) -> str:
    return f'<span title="{_e(n)} bytes">{_e(human_bytes(n))}</span>'


def _frames_cell(frames: list[dict]) -> str:
    if not frames:
        return "?"
    first = f"<code>{_e(frame_text(frames[0]))}</code>"
    if len(frames) == 1:
        return first
    rest = "".join(f"<li><code>{_e(frame_text(f))}</code></li>" for f in frames[1:])
    return f'<details><summary>{first}</summary><ol class="frames">{rest}</ol></details>'


def _location_cell(loc: dict, doc: dict) -> str:
    """A location: its frame, and (unfolded) the stacks that reach it, holding most first, each
    with its live bytes and its frames."""
    head = f"<code>{_e(location_text(loc))}</code>"
    by_rank = {x["rank"]: x for x in doc.get("sites") or []}
    stacks = [by_rank[r] for r in loc.get("stacks") or [] if r in by_rank][:STACKS_LISTED]
    n = loc.get("n_stacks", len(stacks))
    skip = 0 if loc.get("inside") else 1  # a stripped module's frames under their caller: shown
    items = "".join(
        f'<li>{_bytes(x["live_bytes"])} live, {_e(x["live_count"])} blocks'
        f'<ol class="frames">{"".join(f"<li><code>{_e(frame_text(f))}</code></li>" for f in x["frames"][skip:])}'
        '</ol></li>' for x in stacks)
    more = f" ({len(stacks)} shown)" if n > len(stacks) else ""
    return (f'<details><summary>{head} <span class="note">{n} stack{"s" if n != 1 else ""}{more}</span></summary>'
            f'<ol class="stacks">{items}</ol></details>')


STACKS_LISTED = 10  # stacks listed under a location in the page's table


def sites_table(doc: dict, limit: int = TOP_SITES_TABLE) -> str:
    """The location table (the site table with `by` stack) in the page's order
    (`ordered_sites`), with each row's bytes at the peak beside its live bytes at the end;
    host memory, and when the report has GPU memory, two columns of it apart (device: live at
    the end, device peak)."""
    every, by = listed(doc)
    sites = ordered_sites(doc)[:limit]
    device = bool((doc.get("gpu") or {}).get("device_ranks"))
    rows = [[_e(n), _bytes(s.get("at_peak_bytes")), _bytes(s["live_bytes"]), _e(s["live_count"]),
             _bytes(s["peak_live_bytes"]), _bytes(s["alloc_bytes"]), _e(s["alloc_count"])]
            + ([_bytes(s.get("device_live_bytes")), _bytes(s.get("device_peak_bytes"))] if device else [])
            + [_e(",".join(s.get("sources") or [])),
               _e(", ".join(f"{t['name']}({t['tid']})" for t in (s.get("threads") or [])[:3])),
               _frames_cell(s.get("frames") or []) if by == "stack" else _location_cell(s, doc)] for n, s in sites]
    note = "" if len(sites) == len(every) else \
        f'<p class="note">showing {len(sites)} of {len(every)} {NOUNS[by]}</p>'
    heads = ["#", "at peak", "live", "blocks", "peak", "allocated", "allocs"] + \
        (["device", "device peak"] if device else []) + ["source", "threads",
                                                          "site (innermost frame first)" if by == "stack"
                                                          else f"{COLUMN_TITLES[by]} (and the stacks reaching it)"]
    return _table(heads, rows, set(range(9 if device else 7)), "sites") + note


def gpu_html(doc: dict) -> str:
    """The GPU section: GPU memory by site, pinned and managed host memory by site, threads
    with GPU memory (the text report's GPU section)."""
    gpu, tot = doc.get("gpu") or {}, doc.get("totals") or {}
    every, by = listed(doc)
    by_rank = {s["rank"]: s for s in every}
    loc = by != "stack" and "device_location_ranks" in gpu
    noun = NOUNS[by][:-1] if loc else "site"
    def cell(s: dict) -> str:
        return f"<code>{_e(location_text(s))}</code>" if loc else _frames_cell(s.get("frames") or [])
    out = [f'<p>GPU memory <b>{_bytes(tot.get("device_bytes"))}</b> live at the end in '
           f'{_e(tot.get("device_count"))} allocations, peak <b>{_bytes(tot.get("device_peak_bytes"))}</b>; '
           f'pinned and managed host memory through the driver API {_bytes(tot.get("cuda_host_bytes"))}. '
           "GPU memory is in no host figure (live, peak, RSS, threads' live bytes).</p>"]
    dev = [by_rank[r] for r in gpu.get("device_location_ranks" if loc else "device_ranks") or []]
    if dev:
        out.append(f"<h3>Device memory by {noun}</h3>" + _table(
            ["#", "device live", "blocks", "device peak", "allocated", "allocs", "threads", noun],
            [[_e(s["rank"]), _bytes(s["device_live_bytes"]), _e(s["device_live_count"]),
              _bytes(s["device_peak_bytes"]), _bytes(s["device_alloc_bytes"]), _e(s["device_alloc_count"]),
              _e(", ".join(f"{t['name']}({t['tid']})" for t in s["threads"] if t.get("device_live_bytes"))),
              cell(s)] for s in dev], {0, 1, 2, 3, 4, 5}, "gpu-sites"))
    host = [by_rank[r] for r in gpu.get("host_location_ranks" if loc else "host_ranks") or []]
    if host:
        out.append(f"<h3>Pinned and managed host memory by {noun}</h3>" + _table(
            ["#", "pinned", "managed", f"{noun} live", "threads", noun],
            [[_e(s["rank"]), _bytes(s["live_by_source"].get("cuda-pinned", 0)),
              _bytes(s["live_by_source"].get("cuda-managed", 0)), _bytes(s["live_bytes"]),
              _e(", ".join(f"{t['name']}({t['tid']})" for t in s["threads"] if t.get("live_bytes"))),
              cell(s)] for s in host], {0, 1, 2, 3}, "gpu-host"))
    return "".join(out)


def sites_heading(doc: dict) -> str:
    noun = NOUNS[listed(doc)[1]].capitalize()
    if (doc.get("at_peak") or {}).get("peak_first"):
        tot = doc.get("totals") or {}
        return (f"{noun} by bytes held at the peak ({peak_when(doc)}; live at the end "
                f"{human_bytes(tot.get('live_bytes'))}: most of the peak was freed)")
    return f"{noun} by {SORT_TITLES.get(doc.get('sort') or 'live', 'live bytes')}"


def flame_section(doc: dict, flame: dict) -> str:
    """The view buttons (only with a peak to show) and the graph's element."""
    tot = doc.get("totals") or {}
    buttons = ""
    if flame["views"]["peak"] is not None:
        buttons = (f'<button type="button" data-view="peak">at the peak ({_e(peak_when(doc))})</button>'
                   f'<button type="button" data-view="end">at the end (live {_e(human_bytes(tot.get("live_bytes")))})'
                   "</button>")
    return f'<div class="views" id="flame-views">{buttons}</div><div id="flame-graph"></div>'


def threads_table(doc: dict) -> str:
    """Threads by live host bytes; with GPU memory in the report, its live and peak bytes apart."""
    device = bool((doc.get("gpu") or {}).get("device_ranks"))
    rows = [[_e(t["tid"]), _e(t["name"]), _bytes(t["live_bytes"]), _e(t["live_count"]), _bytes(t["peak_live_bytes"]),
             _bytes(t["alloc_bytes"]), _e(t["alloc_count"])]
            + ([_bytes(t.get("device_live_bytes")), _bytes(t.get("device_peak_bytes"))] if device else [])
            for t in doc.get("threads") or []]
    return _table(["tid", "name", "live", "blocks", "peak", "allocated", "allocs"]
                  + (["device", "device peak"] if device else []), rows,
                  {0, 2, 3, 4, 5, 6} | ({7, 8} if device else set()))


def flows_table(doc: dict) -> str:
    rows = [[_e(f"{f['alloc_thread']}({f['alloc_tid']})"), _e(f"{f['free_thread']}({f['free_tid']})"),
             _bytes(f["bytes"]), _e(f["count"]), _e(f"{f['mean_wait_s']:.3f}s"), _e(f"{f['max_wait_s']:.3f}s")]
            for f in doc.get("flows") or []]
    return _table(["allocated by", "freed by", "bytes", "blocks", "mean wait", "max wait"], rows, {2, 3, 4, 5})


def waits_html(doc: dict) -> str:
    """"Held while waiting" (reports/analysis/waits.py): at the peak of memory held by blocked threads,
    where they wait, how many, what they hold (by where it was allocated), then the off-CPU
    time by wait location and what giving memory back cost; '' when waits were not traced."""
    w = doc.get("waits") or {}
    if not w.get("traced"):
        return ""
    pk = w.get("peak")
    parts = []
    if pk:
        when = f"+{pk['elapsed_s']:.1f}s, " if pk.get("elapsed_s") is not None else ""
        parts.append(f"<p>{_e(when)}interval {_e(pk['seq'])}: {_e(pk['blocked'])} threads blocked, "
                     f"{_e(pk['holding'])} of them holding {_bytes(pk['held_bytes'])} "
                     f"(waits of at least {_e(w['wait_min_ms'])} ms)</p>")
        rows = [[_frames_cell([d]) + (" <em>in free</em>" if d.get("in_free") else ""), _e(d["threads"]),
                 _bytes(d["held_bytes"]), _e(f"{d['longest_s']:.2f}s"),
                 "<br>".join(f"{_e(h['function'])} {_bytes(h['bytes'])} in {_e(h['blocks'])}" for h in d["held"][:4]),
                 _e(", ".join(f"{t['name']}({t['tid']})" for t in d["thread_list"][:8]))]
                for d in pk["by_location"][:TOP_SITES_TABLE]]
        parts.append(_table(["waiting in", "threads", "held", "longest", "what they hold (allocated at)", "threads"],
                            rows, {1, 2, 3}))
    else:
        parts.append("<p>No thread was blocked at a snapshot.</p>")
    if w.get("off_cpu"):
        parts.append("<h3>Off-CPU time by where threads blocked (whole recording)</h3>")
        parts.append(_table(["waiting in", "waits", "total", "longest", "threads"],
                            [[_frames_cell([d]), _e(d["waits"]), _e(f"{d['total_s']:.2f}s"), _e(f"{d['max_s']:.2f}s"),
                              _e(", ".join(d["threads"][:6]))] for d in w["off_cpu"][:TOP_SITES_TABLE]], {1, 2, 3}))
    fr = w.get("freeing") or {}
    rows = [[_e(f"{r['thread']}({r['tid']})"), _e(r["kind"]), _e(r["calls"]), _bytes(r["requested_bytes"]),
             _bytes(r["released_bytes"]), _e(f"{r['duration_s'] * 1e3:.2f}ms")] for r in fr.get("by_thread") or []]
    rows += [[_e(f"{p['thread']}({p['tid']})"), _e(p["function"]), _e(p["calls"]), "-", _bytes(p["released_bytes"]),
              _e(f"{p['duration_s'] * 1e3:.2f}ms")] for p in fr.get("purges") or []]
    if rows:
        parts.append("<h3>What giving memory back cost</h3>")
        parts.append(_table(["thread", "call", "calls", "asked", "released", "time"], rows, {2, 3, 4, 5}))
    return "".join(parts)


def trims_table(doc: dict) -> str:
    rows = [[_e(f"{x['time']:.3f}s"), _e(f"{x['thread']}({x['tid']})"), _e(f"{x['duration_s'] * 1e3:.2f}ms"),
             _e(x.get("returned")), _bytes(x.get("released_bytes"))] for x in doc.get("trims") or []]
    return _table(["time", "thread", "duration", "returned", "released"], rows, {0, 2, 3, 4})


def arenas_table(doc: dict) -> str:
    rows = [[_e(a["id"]), _e(a["kind"]), _bytes(a["live_bytes"]), _bytes(a.get("live_before_bytes")),
             _bytes(a["resident_bytes"]), _bytes(a["retained_bytes"]), _e(a.get("heaps", "")),
             _e(", ".join(str(t) for t in a["threads"][:8]))]
            for a in doc.get("arenas") or []]
    return _table(["arena", "kind", "live", "before attach", "resident", "retained", "heaps", "threads"], rows,
                  {2, 3, 4, 5, 6})


def allocators_table(doc: dict) -> str:
    """What each allocator keeps (rss_decomposition.allocators): resident in its own mappings,
    live, retained, released to the kernel; '' when the trace does not measure it."""
    allocs = (doc.get("rss_decomposition") or {}).get("allocators") or []
    rows = [[_e(a["name"]), _e(a.get("module") or ""), _e("yes" if a.get("serves_malloc") else ""),
             _bytes(a["resident"]), _bytes(a["live"]), _bytes(a.get("live_before_attach")), _bytes(a["retained"]),
             _bytes(a["released"])] for a in allocs]
    if not rows:
        return ""
    return _table(["allocator", "module", "serves malloc", "resident", "live", "before attach", "retained",
                   "released"], rows, {3, 4, 5, 6, 7}, "allocators")


def decomposition_html(doc: dict) -> str:
    d = doc.get("rss_decomposition")
    if not d:
        return ""
    parts = [("live heap since the attach", d["live_heap_bytes"])]
    if d.get("live_before_attach_known"):
        parts.append(("live before the attach", d.get("live_before_attach_bytes", 0)))
    parts += [("retained by allocator (free)", d["retained_bytes"]), ("other anonymous", d["other_anon_bytes"]),
              ("file", d["file_bytes"]), ("shmem", d["shmem_bytes"])]
    cells = " + ".join(f"{_e(k)} <b>{_bytes(v)}</b>" for k, v in parts)
    out = f'<p class="decomp">RSS <b>{_bytes(d["rss_bytes"])}</b> = {cells}</p>'
    if d.get("unseparated"):
        out += (f'<p class="decomp">{_e(", ".join(d["unseparated"]))}: memory from before the attach is in other '
                f'anonymous, {_e(d["unseparated_note"])}</p>')
    if d.get("shmem_attributed_bytes") or d.get("file_device_bytes"):
        def srcs(by: dict) -> str:
            return _e(", ".join(f"{k} {human_bytes(v)}" for k, v in by.items()) or "none")
        out += (f'<p class="decomp">shmem {_bytes(d["shmem_bytes"])} = <b>{_bytes(d["shmem_attributed_bytes"])}</b>'
                f' at sites ({srcs(d["shmem_sources"])}) + {_bytes(d["shmem_unattributed_bytes"])} not traced; '
                f'file {_bytes(d["file_bytes"])} = <b>{_bytes(d["file_device_bytes"])}</b> device-mapped '
                f'({srcs(d["file_device_sources"])}) + {_bytes(d["file_regular_bytes"])} regular files</p>')
    return out


def diff_table(diff_doc: dict) -> str:
    a, b = _label_text(diff_doc.get("a")) or "A", _label_text(diff_doc.get("b")) or "B"
    every, by = listed(diff_doc)
    rows = []
    for s in every:
        delta = s.get("delta_bytes") or 0
        delta_cell = f'<span class="{"up" if delta > 0 else "down"}">{"+" if delta > 0 else ""}{_bytes(delta)}</span>'
        rows.append([_bytes(s.get("a_peak_live_bytes")), _bytes(s.get("b_peak_live_bytes")), delta_cell,
                     _frames_cell(s.get("frames") or []) if by == "stack" else f"<code>{_e(location_text(s))}</code>"])
    return (f'<p>A: <b>{_e(a)}</b> &nbsp; B: <b>{_e(b)}</b></p>' +
            _table(["peak A", "peak B", "delta", COLUMN_TITLES[by]], rows, {0, 1, 2}, "diff"))


# --------------------------------------------------------------------------------------------- page
def to_html(trace: Trace, report_doc: dict, diff_doc: dict | None = None, *,
            stacks: Mapping[int, tuple[FrameInfo, ...]] | None = None, title: str | None = None,
            fold: Folding | None = None) -> str:
    """The whole page. `report_doc` is build_report(trace, fold=fold); `stacks` is
    symbolize_stacks(trace) when the caller already has it; `diff_doc` adds the diff section."""
    if stacks is None:
        stacks = symbolize_stacks(trace)
    flame = flame_data(trace, report_doc, stacks, fold)
    data = {"timeline": timeline_data(trace, report_doc),
            "sites": site_chart_data(trace, report_doc, stacks, fold=fold), "flame": flame}
    tgt = report_doc.get("target") or {}
    tot = report_doc.get("totals") or {}
    rec = report_doc.get("recording") or {}
    labels = _label_text(tgt.get("labels"))
    title = title or f"allocscope — pid {tgt.get('pid')} {tgt.get('comm') or ''}".strip()
    cards = [("live now", human_bytes(tot.get("live_bytes")), f"{tot.get('live_count', 0)} blocks"),
             ("live peak", human_bytes(tot.get("peak_live_bytes")), ""),
             ("RSS now", human_bytes(tot.get("rss_bytes")), f"peak sampled {human_bytes(tot.get('peak_rss_bytes'))}"),
             ("RSS high-water", human_bytes(tot.get("hwm_bytes")), "kernel VmHWM"),
             ("duration", f"{float(tot.get('duration_s') or 0):.1f}s", f"{tot.get('intervals', 0)} intervals"),
             ("lost events", str(tot.get("lost_events", 0)), "")]
    gpu = report_doc.get("gpu") or {}
    if gpu.get("seen"):
        cards[2:2] = [("GPU now", human_bytes(tot.get("device_bytes")),
                       f"peak {human_bytes(tot.get('device_peak_bytes'))}; not in live"),
                      ("CUDA host", human_bytes(tot.get("cuda_host_bytes")), "pinned + managed, in live")]
    cards_html = "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div>'
                         f'<div class="s">{_e(s)}</div></div>' for k, v, s in cards)
    notes = [("warn", w) for w in rec.get("warnings") or []] + [("warn", a) for a in report_doc.get("advice") or []]
    if report_doc.get("folded"):
        notes.append(("note", "folded out of sites: " + folded_text(report_doc["folded"])))
    notes_html = "".join(f'<p class="{c}">{_e(t)}</p>' for c, t in notes)
    sections: list[tuple[str, str, str]] = [
        ("timeline", "Memory over time", '<div class="chart" id="chart-timeline"></div>'),
        ("site-timeline", f"Top {NOUNS[listed(report_doc)[1]]} over time (live bytes, stacked; top {TOP_SITES_CHART})",
         '<div class="chart" id="chart-sites"></div>'),
        ("flame", "Live bytes by stack (click a frame to zoom, the top bar to zoom out)",
         flame_section(report_doc, flame)),
        ("sites", sites_heading(report_doc), sites_table(report_doc)),
        *([("waits", "Held while waiting", waits_html(report_doc))] if waits_html(report_doc) else []),
        ("threads", "Threads by live bytes", threads_table(report_doc)),
        *([("gpu", "GPU memory", gpu_html(report_doc))] if gpu.get("seen") else []),
        ("flows", "Frees by allocating → freeing thread", flows_table(report_doc)),
    ]
    if allocators_table(report_doc):
        sections.append(("allocators", "What each allocator keeps (resident in its own mappings)",
                         allocators_table(report_doc)))
    if report_doc.get("arenas"):
        sections.append(("arenas", "Allocator arenas by retained bytes", arenas_table(report_doc)))
    if report_doc.get("trims"):
        sections.append(("trims", "malloc_trim calls", trims_table(report_doc)))
    if diff_doc is not None:
        sections.append(("diff", f"Diff: peak live bytes per {NOUNS[listed(diff_doc)[1]][:-1]}", diff_table(diff_doc)))
    body = "".join(f'<section id="{sid}"><h2>{_e(h)}</h2>{content}</section>' for sid, h, content in sections)
    return Template(_asset(PAGE, inline=False)).substitute(
        title=_e(title), uplot_css=_asset(UPLOT_CSS), report_css=_asset(PAGE_CSS),
        findings=findings_html(report_doc.get("findings"), {sid for sid, _, _ in sections}),
        exe=_e(tgt.get("exe")), labels=(" &nbsp; " + _e(labels)) if labels else "",
        allocator_kind=_e(rec.get("allocator_kind")), allocator=_e(rec.get("allocator")),
        cuda=(f' &nbsp; CUDA driver <code>{_e(gpu["driver"])}</code> ({len(gpu.get("probed") or [])} calls probed)'
              if gpu.get("driver") else ""),
        end_reason=_e(rec.get("end_reason") or "interrupted"), cards=cards_html,
        decomposition=decomposition_html(report_doc), notes=notes_html, sections=body,
        data=_json_for_script(data), uplot_js=_asset(UPLOT_JS), report_js=_asset(PAGE_JS))


# --------------------------------------------------------------------------------------------- findings
def findings_html(findings: list[dict] | None, sections: set[str]) -> str:
    """The findings (reports.analysis.findings) as a list on top of the page, each linking to the
    section of its table when the page has it."""
    if not findings:
        return ""
    items = "".join(f"<li>{_e(f['text'])}"
                    + (f' <a href="#{_e(f["section"])}">{_e(f["table"])}</a>' if f.get("section") in sections
                       else f' <span class="note">{_e(f["table"])}</span>') + "</li>" for f in findings)
    return f'<ol class="findings" id="findings">{items}</ol>'


# --------------------------------------------------------------------------------------------- the diff page
def diff_timeline_data(trace_a: Trace, trace_b: Trace) -> dict:
    """Both runs' live and RSS bytes on one chart: x = seconds since each run's own start (the
    union of both runs' interval ends), one series per run and figure, null where that run has
    no sample (drawn across: `span`). RSS samples after a target exited are gaps."""
    def points(trace: Trace, col: str) -> dict[float, int | None]:
        iv = trace.intervals
        if col not in iv or "elapsed_s" not in iv:
            return {}
        out: dict[float, int | None] = {}
        for t, v in zip(iv["elapsed_s"], iv[col]):
            n = _num(v)
            out[round(float(t), 6)] = None if n is None or (col == "rss_bytes" and n < 0) else n
        return out

    cols = [("live_bytes", "live"), ("rss_bytes", "RSS")]
    per = [(f"{name} {label}", points(tr, col), name == "B")
           for name, tr in (("A", trace_a), ("B", trace_b)) for col, label in cols]
    xs = sorted({x for _, p, _ in per for x in p})
    return {"t": xs, "series": [{"label": label, "values": [p.get(x) for x in xs], "dash": "RSS" in label,
                                 "span": True} for label, p, _ in per if p]}


def diff_flame_tree(trace_a: Trace, trace_b: Trace, stacks_a: Mapping[int, tuple[FrameInfo, ...]],
                    stacks_b: Mapping[int, tuple[FrameInfo, ...]], fold: Folding | None = None,
                    min_fraction: float = FLAME_MIN_FRACTION) -> dict | None:
    """The differential flame graph: the live-bytes folded stacks of each run at its own peak
    (analysis.peak_seq), merged by frame names into one tree {n, v: B's bytes, a: A's bytes,
    c: children}: width by B, colour by B vs A (report.js). Nodes under `min_fraction` of B's
    total are dropped; paths only in A count in their ancestors' `a`. None when B had nothing live."""
    root: dict = {"n": "all", "v": 0, "a": 0, "c": {}}
    for trace, stacks, key in ((trace_b, stacks_b, "v"), (trace_a, stacks_a, "a")):
        seq = peak_seq(trace)
        if seq is None:
            continue
        for path, value in folded_stacks(trace, "live_bytes", stacks=stacks, fold=fold, at_seq=seq).items():
            if value <= 0:
                continue
            node = root
            node[key] += value
            for name in path:
                node = node["c"].setdefault(name, {"n": name, "v": 0, "a": 0, "c": {}})
                node[key] += value
    if not root["v"]:
        return None
    limit = root["v"] * min_fraction

    def finish(node: dict) -> dict:
        kids = sorted((k for k in node["c"].values() if k["v"] >= limit and k["v"] > 0),
                      key=lambda k: (-k["v"], k["n"]))
        out = {"n": node["n"], "v": node["v"], "a": node["a"]}
        if kids:
            out["c"] = [finish(k) for k in kids]
        return out

    return finish(root)


def _bars(a: int, b: int, top: int) -> str:
    """Two bars, A over B, on the scale of the table's largest peak."""
    def w(x: int) -> str:
        return f"{100 * x / top:.1f}" if top else "0"
    return (f'<div class="bar a" style="width:{w(a)}%" title="A {_e(human_bytes(a))}"></div>'
            f'<div class="bar b" style="width:{w(b)}%" title="B {_e(human_bytes(b))}"></div>')


def diff_locations_table(doc: dict, limit: int = TOP_SITES_TABLE) -> str:
    """The diff's locations (sites with `by` stack): flagged first, then in the document's
    order, with A/B peak bars on one scale, the delta, B/A, and with `per` the scaling."""
    every, by = listed(doc)
    rows_in = sorted(every, key=lambda x: not x.get("flagged"))[:limit]
    per = doc.get("per")
    top = max((max(x["a_peak_live_bytes"], x["b_peak_live_bytes"]) for x in rows_in), default=0)
    body = []
    for i, x in enumerate(rows_in, 1):
        d = x["delta_bytes"]
        cells = ["!" if x.get("flagged") else "", _e(i), _bytes(x["a_peak_live_bytes"]), _bytes(x["b_peak_live_bytes"]),
                 _bars(x["a_peak_live_bytes"], x["b_peak_live_bytes"], top),
                 f'<span class="{"up" if d > 0 else "down" if d < 0 else ""}">{_e(human_delta(d))}</span>',
                 _e(ratio_text(x["ratio"], x["in"]))]
        if per:
            cells.append("-" if x.get("scaling") is None else _e(f"{x['scaling']:.2f}x"))
        cells += [_bytes(x["a_live_bytes"]), _bytes(x["b_live_bytes"]),
                  _e(f"{x.get('a_verdict') or '-'}→{x.get('b_verdict') or '-'}"),
                  _frames_cell(x.get("frames") or []) if by == "stack" else f"<code>{_e(location_text(x))}</code>"]
        body.append((cells, bool(x.get("flagged"))))
    heads = ["", "#", "A peak", "B peak", "A / B", "delta", "B/A"] + (["vs linear"] if per else []) + \
        ["A live", "B live", "verdict A→B", COLUMN_TITLES[by]]
    numeric = {1, 2, 3, 5, 6} | ({7, 8, 9} if per else {7, 8})
    th = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(heads))
    trs = ""
    for cells, fl in body:
        tds = "".join(f'<td class="num">{c}</td>' if i in numeric else f'<td class="bars">{c}</td>' if i == 4
                      else f"<td>{c}</td>" for i, c in enumerate(cells))
        trs += ('<tr class="flagged">' if fl else "<tr>") + tds + "</tr>"
    note = "" if len(rows_in) == len(every) else f'<p class="note">showing {len(rows_in)} of {len(every)}</p>'
    return f'<table class="diff-locations"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>{note}'


def diff_waits_table(doc: dict) -> str:
    rows = [w for w in doc.get("waits") or [] if w["a_held_bytes"] or w["b_held_bytes"] or w["a_max_threads"]
            or w["b_max_threads"]]
    return _table(["waiting in", "A threads", "B threads", "A held", "B held", "delta", "A max threads",
                   "B max threads", "A off-CPU", "B off-CPU"],
                  [[_frames_cell([w]), _e(w["a_threads"]), _e(w["b_threads"]), _bytes(w["a_held_bytes"]),
                    _bytes(w["b_held_bytes"]), _e(human_delta(w["held_delta"])), _e(w["a_max_threads"]),
                    _e(w["b_max_threads"]), _e(f"{w['a_wait_s']:.1f}s"), _e(f"{w['b_wait_s']:.1f}s")]
                   for w in rows[:TOP_SITES_TABLE]], set(range(1, 10)), "diff-waits") if rows else ""


def diff_allocators_table(doc: dict) -> str:
    rows = doc.get("allocators") or []
    return _table(["allocator", "A retained", "B retained", "delta", "A resident", "B resident", "A live", "B live",
                   "A released", "B released"],
                  [[_e(x["name"]), _bytes(x["a_retained"]), _bytes(x["b_retained"]),
                    _e(human_delta(x["retained_delta"])), _bytes(x["a_resident"]), _bytes(x["b_resident"]),
                    _bytes(x["a_live"]), _bytes(x["b_live"]), _bytes(x["a_released"]), _bytes(x["b_released"])]
                   for x in rows], set(range(1, 10)), "diff-allocators") if rows else ""


def diff_groups_table(doc: dict) -> str:
    rows = doc.get("thread_groups") or []
    return _table(["group", "A threads", "B threads", "A live", "B live", "A peak", "B peak", "peak delta"],
                  [[_e(g["group"]), _e(g["a_threads"]), _e(g["b_threads"]), _bytes(g["a_live_bytes"]),
                    _bytes(g["b_live_bytes"]), _bytes(g["a_peak_live_bytes"]), _bytes(g["b_peak_live_bytes"]),
                    _e(human_delta(g["peak_delta_bytes"]))] for g in rows], set(range(1, 8)), "diff-groups") \
        if rows else ""


def to_diff_html(trace_a: Trace, trace_b: Trace, diff_doc: dict, *,
                 stacks_a: Mapping[int, tuple[FrameInfo, ...]] | None = None,
                 stacks_b: Mapping[int, tuple[FrameInfo, ...]] | None = None, fold: Folding | None = None,
                 title: str | None = None) -> str:
    """`allocscope diff --format html`: one offline page (the report page's assets): the
    findings, both runs' memory over time on one chart (seconds since each run's start; live
    and RSS), the locations with A/B bars and flags, a differential flame graph of each run's
    stacks at its peak (width by B; red grew, blue shrank), held while waiting, allocators and
    thread groups, A vs B. `diff_doc` is diff_traces(trace_a, trace_b, ...); `stacks_a/b`
    the symbolized stacks when the caller has them (diff.Side.stacks)."""
    stacks_a = symbolize_stacks(trace_a) if stacks_a is None else stacks_a
    stacks_b = symbolize_stacks(trace_b) if stacks_b is None else stacks_b
    tree = diff_flame_tree(trace_a, trace_b, stacks_a, stacks_b, fold)
    data = {"timeline": diff_timeline_data(trace_a, trace_b),
            "flame": {"views": {"diff": tree}, "default": "diff", "diff": True}}
    ta, tb = diff_doc["traces"]["a"], diff_doc["traces"]["b"]
    la, lb = _label_text(ta.get("labels")), _label_text(tb.get("labels"))
    title = title or f"allocscope diff — {la or 'A'} vs {lb or 'B'}"
    tot = diff_doc["totals"]
    cards = "".join(
        f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(human_bytes(tot["b"][key]))}</div>'
        f'<div class="s">A {_e(human_bytes(tot["a"][key]))}, {_e(human_delta(tot["delta"][key]))}</div></div>'
        for k, key in (("B live peak", "peak_live_bytes"), ("B RSS peak", "peak_rss_bytes"),
                       ("B live now", "live_bytes"), ("B RSS now", "rss_bytes")))
    cards += (f'<div class="card"><div class="k">lost events</div><div class="v">'
              f'{_e(tot["a"]["lost_events"])} / {_e(tot["b"]["lost_events"])}</div><div class="s">A / B</div></div>')
    per = diff_doc.get("per")
    per_html = ""
    if per:
        ratio = f"{per['b']:g}/{per['a']:g} = {per['expected_ratio']:.2f}"
        per_html = (f'<p class="note">normalized per {_e(per["label"])}: a location scaling linearly has B/A = '
                    f'{_e(ratio)}; ! = grew more than {_e(per["flag_scaling"])}x that</p>')
    notes = "".join(f'<p class="warn">{_e(w)}</p>' for w in diff_doc.get("warnings") or [])
    legend = ('<p class="legend-diff note">width: bytes live in B at its peak; colour: '
              '<span style="background:hsl(0,80%,62%)">grew in B</span>'
              '<span style="background:hsl(0,0%,90%)">about the same</span>'
              '<span style="background:hsl(220,80%,70%)">shrank in B</span></p>')
    noun = NOUNS[listed(diff_doc)[1]]
    sections = [
        ("timeline", "Memory over time, A and B (seconds since each run's start)",
         '<div class="chart" id="chart-timeline"></div>'),
        ("locations", f"{noun.capitalize()} by peak live bytes, A vs B" + (" (! = grew out of proportion)"
                                                                           if per else ""),
         diff_locations_table(diff_doc)),
        ("flame", "Differential flame graph: the stacks at each run's peak (click a frame to zoom)",
         legend + '<div class="views" id="flame-views"></div><div id="flame-graph"></div>'),
    ]
    for sid, head, content in (("waits", "Held while waiting, A vs B (at each one's peak of memory held by blocked "
                                         "threads)", diff_waits_table(diff_doc)),
                               ("allocators", "What each allocator keeps, A vs B (resident in its own mappings, "
                                              "not live = retained)", diff_allocators_table(diff_doc)),
                               ("groups", "Thread groups (digits in names replaced by N)",
                                diff_groups_table(diff_doc))):
        if content:
            sections.append((sid, head, content))
    body = "".join(f'<section id="{sid}"><h2>{_e(h)}</h2>{content}</section>' for sid, h, content in sections)
    ids = {sid for sid, _, _ in sections} | {"totals"}
    return Template(_asset(DIFF_PAGE, inline=False)).substitute(
        title=_e(title), uplot_css=_asset(UPLOT_CSS), report_css=_asset(PAGE_CSS),
        path_a=_e(ta.get("path")), path_b=_e(tb.get("path")),
        side_a=_e(f"{ta.get('comm') or '?'} pid {ta.get('pid')}" + (f"  [{la}]" if la else "")),
        side_b=_e(f"{tb.get('comm') or '?'} pid {tb.get('pid')}" + (f"  [{lb}]" if lb else "")),
        per=per_html, findings=findings_html(diff_doc.get("findings"), ids),
        cards=cards, notes=notes, sections=body,
        data=_json_for_script(data), uplot_js=_asset(UPLOT_JS), report_js=_asset(PAGE_JS))
