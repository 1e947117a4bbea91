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

The page is assets/page.html around report-header.html (string.Templates), report.css and
report.js, filled in and inlined here (`page`). Charts are drawn by uPlot 1.6.32 (npm `uplot`,
MIT; dist/uPlot.iife.min.js, 51 KB, and uPlot.min.css, vendored in assets/ with its licence)
from a JSON blob in the page; the flame graph is a small SVG renderer (report.js) of the data
reports.render.flamegraph computes. Tables are rendered in Python (html_tables.py,
html_diff_tables.py, from html_cells.py's pieces), so they read without JavaScript. The diff page
is html_diff.py's, around diff-header.html.

For tests and sanity, every drawn chart gets `data-ink` (painted canvas pixels) and the flame
graph `data-nodes` (frames drawn) and `data-view` (peak|end), once its script has run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from ..analysis import Folding, FrameInfo, peak_seq, site_timeline, symbolize_stacks
from ..analysis.ending import end_text
from ..trace import Trace
from ..units import human_bytes
from .flamegraph import folded_stacks
from .html_cells import esc, findings_html, label_text
from .html_diff_tables import diff_table
from .html_tables import (
    allocators_table,
    arenas_table,
    decomposition_html,
    flame_section,
    flows_table,
    gpu_html,
    ordered_sites,
    sites_heading,
    sites_table,
    threads_table,
    trims_table,
    waits_html,
)
from .shared import LOCATION_FRAME_KEYS, NOUNS, folded_text, listed

ASSETS = Path(__file__).resolve().parent / "assets"


UPLOT_JS = "uPlot.iife.min.js"


UPLOT_CSS = "uPlot.min.css"


PAGE = "page.html"  # string.Template: the page around a header: $title, $header, $sections, $data...


REPORT_HEADER = "report-header.html"  # string.Template: the report page's header (see to_html)
DIFF_HEADER = "diff-header.html"  # the same for to_diff_html


PAGE_CSS = "report.css"


PAGE_JS = "report.js"


TOP_SITES_CHART = 8  # sites drawn in the stacked chart; the rest are summed as "other"


FLAME_MIN_FRACTION = 1e-4  # flame-graph nodes smaller than this share of the total are left out


# (column, label, dashed): the host total is drawn dashed, over the parts it sums; GPU memory is
# a series of its own, never part of it. Series of CUDA memory only when the trace has some.
TIMELINE_SERIES = [
    ("rss_bytes", "RSS", False),
    ("heap_live_bytes", "live, heap API", False),
    ("mmap_live_bytes", "live, mmap/brk", False),
    ("cuda_host_live_bytes", "live, CUDA host", False),
    ("live_bytes", "live, total", True),
    ("device_live_bytes", "GPU memory (device)", False),
]


WHEN_SEEN = {"cuda_host_live_bytes", "device_live_bytes"}


def asset(name: str, inline: bool = True) -> str:
    """The text of reports/render/assets/NAME; one to be `inline`d in a <script> or <style> must not
    close it."""
    text = (ASSETS / name).read_text(encoding="utf-8")
    if inline and ("</script" in text.lower() or "</style" in text.lower()):
        raise ValueError(f"asset {name} cannot be inlined (contains a closing tag)")
    return text


def json_for_script(obj: Any) -> str:
    """JSON safe inside <script type=application/json>: no '<', '>' or '&' left unescaped."""
    return (
        json.dumps(obj, separators=(",", ":"), allow_nan=False)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


def _frame_key(f: FrameInfo | Mapping) -> tuple:
    """Identity of a frame, whether a FrameInfo or a report dict."""
    if isinstance(f, FrameInfo):
        return (f.function, f.module, f.file, f.line, f.call, f.inside)
    return (f.get("function"), f.get("module"), f.get("file"), f.get("line"), f.get("call"), f.get("inside"))


def json_number(v: Any) -> int | float | None:
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
        vals = [json_number(v) for v in iv[col]]
        if col == "rss_bytes":
            vals = [v if v is not None and v >= 0 else None for v in vals]
        series.append({"label": label, "values": vals, "dash": dashed})
    allocs = ((report_doc or {}).get("rss_decomposition") or {}).get("allocators") or []
    for a in allocs:
        by_seq = {p["seq"]: p["retained"] for p in a.get("timeline") or []}
        if any(by_seq.values()):
            series.append(
                {"label": f"retained by {a['name']}", "values": [by_seq.get(int(s)) for s in iv["seq"]], "dash": False}
            )
    return {"t": [float(x) for x in iv["elapsed_s"]], "series": series}


def site_chart_data(
    trace: Trace,
    report_doc: dict,
    stacks: Mapping[int, tuple[FrameInfo, ...]],
    top: int = TOP_SITES_CHART,
    fold: Folding | None = None,
) -> dict:
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
        key = site.get("frames") or [] if by == "stack" else [{k: site.get(k) for k in LOCATION_FRAME_KEYS}]
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


def flame_tree(
    trace: Trace,
    stacks: Mapping[int, tuple[FrameInfo, ...]],
    min_fraction: float = FLAME_MIN_FRACTION,
    fold: Folding | None = None,
    at_seq: int | None = None,
) -> dict:
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
        kids = sorted(
            (k for k in node["c"].values() if k["v"] >= limit and k["v"] > 0), key=lambda k: (-k["v"], k["n"])
        )
        out = {"n": node["n"], "v": node["v"]}
        if kids:
            out["c"] = [finish(k) for k in kids]
        return out

    return finish(root)


def flame_data(
    trace: Trace, report_doc: dict, stacks: Mapping[int, tuple[FrameInfo, ...]], fold: Folding | None = None
) -> dict:
    """The flame graph's views: {"views": {"peak": tree at `peak_seq` (None when nothing was
    live), "end": tree at the end}, "default": "peak" when the report leads with the peak,
    else "end"}."""
    seq = peak_seq(trace)
    views = {
        "peak": flame_tree(trace, stacks, fold=fold, at_seq=seq) if seq is not None else None,
        "end": flame_tree(trace, stacks, fold=fold),
    }
    lead = bool((report_doc.get("at_peak") or {}).get("peak_first")) and views["peak"] is not None
    return {"views": views, "default": "peak" if lead else "end"}


# --------------------------------------------------------------------------------------------- page
def to_html(
    trace: Trace,
    report_doc: dict,
    diff_doc: dict | None = None,
    *,
    stacks: Mapping[int, tuple[FrameInfo, ...]] | None = None,
    title: str | None = None,
    fold: Folding | None = None,
) -> str:
    """The whole page. `report_doc` is build_report(trace, fold=fold); `stacks` is
    symbolize_stacks(trace) when the caller already has it; `diff_doc` adds the diff section."""
    if stacks is None:
        stacks = symbolize_stacks(trace)
    flame = flame_data(trace, report_doc, stacks, fold)
    data = {
        "timeline": timeline_data(trace, report_doc),
        "sites": site_chart_data(trace, report_doc, stacks, fold=fold),
        "flame": flame,
    }
    tgt = report_doc.get("target") or {}
    tot = report_doc.get("totals") or {}
    rec = report_doc.get("recording") or {}
    labels = label_text(tgt.get("labels"))
    title = title or f"allocscope — pid {tgt.get('pid')} {tgt.get('comm') or ''}".strip()
    cards = [
        ("live now", human_bytes(tot.get("live_bytes")), f"{tot.get('live_count', 0)} blocks"),
        ("live peak", human_bytes(tot.get("peak_live_bytes")), peak_card_note(report_doc)),
        ("RSS now", human_bytes(tot.get("rss_bytes")), f"peak sampled {human_bytes(tot.get('peak_rss_bytes'))}"),
        ("RSS high-water", human_bytes(tot.get("hwm_bytes")), "kernel VmHWM"),
        ("duration", f"{float(tot.get('duration_s') or 0):.1f}s", f"{tot.get('intervals', 0)} intervals"),
        ("lost events", str(tot.get("lost_events", 0)), ""),
    ]
    gpu = report_doc.get("gpu") or {}
    if gpu.get("seen"):
        cards[2:2] = [
            (
                "GPU now",
                human_bytes(tot.get("device_bytes")),
                f"peak {human_bytes(tot.get('device_peak_bytes'))}; not in live",
            ),
            ("CUDA host", human_bytes(tot.get("cuda_host_bytes")), "pinned + managed, in live"),
        ]
    cards_html = "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div>'
        f'<div class="s">{esc(s)}</div></div>'
        for k, v, s in cards
    )
    notes = [("warn", w) for w in rec.get("warnings") or []] + [("warn", a) for a in report_doc.get("advice") or []]
    if report_doc.get("folded"):
        notes.append(("note", "folded out of sites: " + folded_text(report_doc["folded"])))
    notes_html = "".join(f'<p class="{c}">{esc(t)}</p>' for c, t in notes)
    sections: list[tuple[str, str, str]] = [
        ("timeline", "Memory over time", '<div class="chart" id="chart-timeline"></div>'),
        (
            "site-timeline",
            f"Top {NOUNS[listed(report_doc)[1]]} over time (live bytes, stacked; top {TOP_SITES_CHART})",
            '<div class="chart" id="chart-sites"></div>',
        ),
        (
            "flame",
            "Live bytes by stack (click a frame to zoom, the top bar to zoom out)",
            flame_section(report_doc, flame),
        ),
        ("sites", sites_heading(report_doc), sites_table(report_doc)),
        *([("waits", "Held while waiting", waits_html(report_doc))] if waits_html(report_doc) else []),
        ("threads", "Threads by live bytes", threads_table(report_doc)),
        *([("gpu", "GPU memory", gpu_html(report_doc))] if gpu.get("seen") else []),
        ("flows", "Frees by allocating → freeing thread", flows_table(report_doc)),
    ]
    if allocators_table(report_doc):
        sections.append(
            ("allocators", "What each allocator keeps (resident in its own mappings)", allocators_table(report_doc))
        )
    if report_doc.get("arenas"):
        sections.append(("arenas", "Allocator arenas by retained bytes", arenas_table(report_doc)))
    if report_doc.get("trims"):
        sections.append(("trims", "malloc_trim calls", trims_table(report_doc)))
    if diff_doc is not None:
        sections.append(("diff", f"Diff: peak live bytes per {NOUNS[listed(diff_doc)[1]][:-1]}", diff_table(diff_doc)))
    return page(
        REPORT_HEADER,
        title,
        sections,
        data,
        findings=findings_html(report_doc.get("findings"), {sid for sid, _, _ in sections}),
        exe=esc(tgt.get("exe")),
        labels=(" &nbsp; " + esc(labels)) if labels else "",
        allocator_kind=esc(rec.get("allocator_kind")),
        allocator=esc(rec.get("allocator")),
        cuda=(
            f" &nbsp; CUDA driver <code>{esc(gpu['driver'])}</code> ({len(gpu.get('probed') or [])} calls probed)"
            if gpu.get("driver")
            else ""
        ),
        end_reason=esc(end_text(rec.get("end"), rec.get("end_reason"))),
        cards=cards_html,
        decomposition=decomposition_html(report_doc),
        notes=notes_html,
    )


def page(header: str, title: str, sections: list[tuple[str, str, str]], data: dict, **fields: str) -> str:
    """An offline page (assets/page.html, uPlot and the report's style and script inline):
    `title`, the header asset `header` filled with `fields`, the (id, heading, HTML) `sections`
    and `data`, the charts' JSON."""
    filled = Template(asset(header, inline=False).rstrip("\n")).substitute(**fields)
    body = "".join(f'<section id="{sid}"><h2>{esc(h)}</h2>{content}</section>' for sid, h, content in sections)
    return Template(asset(PAGE, inline=False)).substitute(
        title=esc(title),
        header=filled,
        uplot_css=asset(UPLOT_CSS),
        report_css=asset(PAGE_CSS),
        sections=body,
        data=json_for_script(data),
        uplot_js=asset(UPLOT_JS),
        report_js=asset(PAGE_JS),
    )


def peak_card_note(doc: dict) -> str:
    """The live peak card's line: when the composition shown at the peak (the flame graph's
    button, the held-at-the-peak table) was taken, and its figure when it is not the card's
    (the kernel's high-water between two snapshots), and that first touches are an estimate."""
    p, tot = doc.get("at_peak") or {}, doc.get("totals") or {}
    if p.get("seq") is None:
        return ""
    when = f"{p['elapsed_s']:.1f}s" if p.get("elapsed_s") is not None else f"interval {p['seq']}"
    note = f"at {when}"
    if int(p.get("live_bytes") or 0) != int(tot.get("peak_live_bytes") or 0):
        note += f"; composition shown {human_bytes(p.get('live_bytes'))}"
    if p.get("touch_estimate_bytes"):
        note += f"; {human_bytes(p['touch_estimate_bytes'])} estimated from first touches"
    return note
