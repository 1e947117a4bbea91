"""A self-contained HTML report: one file that opens offline (no CDN, every script, style and
datum inline).

Contents: totals; RSS vs live bytes over time; the top sites' live bytes over time, stacked;
an icicle flame graph of live bytes (click a frame to zoom, the top bar to zoom out); the site,
thread and cross-thread flow tables; malloc_trim calls; and, given a diff document, the diff
table.

Charts are drawn by uPlot 1.6.32 (npm `uplot`, MIT; dist/uPlot.iife.min.js, 51 KB, and
uPlot.min.css, vendored in reports/assets/ with its licence)
from a JSON blob in the page; the flame graph is a small inline SVG renderer of the data
reports.folded computes. Tables are rendered here, so they read without JavaScript.

For tests and sanity, every drawn chart gets `data-ink` (painted canvas pixels) and the flame
graph `data-nodes` (frames drawn), once its script has run.
"""
from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from common.tracefile.reader import Trace

from .analysis import FrameInfo, site_timeline, symbolize_stacks
from .folded import folded_stacks
from .render import frame_text, human_bytes

ASSETS = Path(__file__).resolve().parent / "assets"
UPLOT_JS = "uPlot.iife.min.js"
UPLOT_CSS = "uPlot.min.css"
TOP_SITES_CHART = 8      # sites drawn in the stacked chart; the rest are summed as "other"
TOP_SITES_TABLE = 200    # rows of the site table
FLAME_MIN_FRACTION = 1e-4  # flame-graph nodes smaller than this share of the total are left out
# (column, label, dashed): the total is drawn last, dashed, over the two parts it sums.
TIMELINE_SERIES = [("rss_bytes", "RSS", False), ("heap_live_bytes", "live, heap API", False),
                   ("mmap_live_bytes", "live, mmap/brk", False), ("live_bytes", "live, total", True)]


def _asset(name: str) -> str:
    text = (ASSETS / name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
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
        return (f.function, f.module, f.file, f.line)
    return (f.get("function"), f.get("module"), f.get("file"), f.get("line"))


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
def timeline_data(trace: Trace) -> dict:
    """x = elapsed seconds; one series per TIMELINE_SERIES column present. RSS samples taken
    after the target exited (negative) are gaps."""
    iv = trace.intervals
    series = []
    for col, label, dashed in TIMELINE_SERIES:
        if col not in iv:
            continue
        vals = [_num(v) for v in iv[col]]
        if col == "rss_bytes":
            vals = [v if v is not None and v >= 0 else None for v in vals]
        series.append({"label": label, "values": vals, "dash": dashed})
    return {"t": [float(x) for x in iv["elapsed_s"]], "series": series}


def site_chart_data(trace: Trace, report_doc: dict, stacks: Mapping[int, tuple[FrameInfo, ...]],
                    top: int = TOP_SITES_CHART) -> dict:
    """Live bytes over time of the report's top `top` sites (by rank) plus 'other'; series in
    stacking order, bottom (rank 1) first."""
    tl = site_timeline(trace, dict(stacks))
    elapsed = dict(zip(trace.intervals["seq"].astype(int), trace.intervals["elapsed_s"].astype(float)))
    if tl.empty:
        return {"t": [], "series": []}
    tl = tl.loc[[s for s in tl.index if int(s) in elapsed]]
    t = [elapsed[int(s)] for s in tl.index]
    by_key = {tuple(_frame_key(f) for f in site): site for site in tl.columns}
    chosen: list[tuple[str, tuple]] = []
    for site in report_doc.get("sites") or []:
        if len(chosen) >= top:
            break
        col = by_key.get(tuple(_frame_key(f) for f in site.get("frames") or []))
        if col is not None and tl[col].max() > 0:
            fn = site["frames"][0]["function"] if site.get("frames") else "?"
            chosen.append((f"#{site['rank']} {fn}", col))
    series = [{"label": label, "values": [int(v) for v in tl[col]]} for label, col in chosen]
    rest = tl.drop(columns=[col for _, col in chosen])
    n_rest = int((rest.to_numpy() != 0).any(axis=0).sum()) if not rest.empty else 0
    if n_rest:
        series.append({"label": f"other ({n_rest} sites)", "values": [int(v) for v in rest.sum(axis=1)]})
    return {"t": t, "series": series}


def flame_tree(trace: Trace, stacks: Mapping[int, tuple[FrameInfo, ...]],
               min_fraction: float = FLAME_MIN_FRACTION) -> dict:
    """The live-bytes folded stacks as a tree {n: name, v: value, c: [children]} rooted at
    'all', children largest first; nodes under `min_fraction` of the total are dropped (their
    bytes still count in their parents)."""
    root: dict = {"n": "all", "v": 0, "c": {}}
    for path, value in folded_stacks(trace, "live_bytes", stacks=stacks).items():
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


def sites_table(doc: dict, limit: int = TOP_SITES_TABLE) -> str:
    sites = (doc.get("sites") or [])[:limit]
    rows = [[_e(s["rank"]), _bytes(s["live_bytes"]), _e(s["live_count"]), _bytes(s["peak_live_bytes"]),
             _bytes(s["alloc_bytes"]), _e(s["alloc_count"]), _e(",".join(s.get("sources") or [])),
             _e(", ".join(f"{t['name']}({t['tid']})" for t in (s.get("threads") or [])[:3])),
             _frames_cell(s.get("frames") or [])] for s in sites]
    note = "" if len(sites) == len(doc.get("sites") or []) else \
        f'<p class="note">showing {len(sites)} of {len(doc["sites"])} sites</p>'
    return _table(["#", "live", "blocks", "peak", "allocated", "allocs", "source", "threads",
                   "site (innermost frame first)"], rows, {0, 1, 2, 3, 4, 5}, "sites") + note


def threads_table(doc: dict) -> str:
    rows = [[_e(t["tid"]), _e(t["name"]), _bytes(t["live_bytes"]), _e(t["live_count"]), _bytes(t["peak_live_bytes"]),
             _bytes(t["alloc_bytes"]), _e(t["alloc_count"])] for t in doc.get("threads") or []]
    return _table(["tid", "name", "live", "blocks", "peak", "allocated", "allocs"], rows, {0, 2, 3, 4, 5, 6})


def flows_table(doc: dict) -> str:
    rows = [[_e(f"{f['alloc_thread']}({f['alloc_tid']})"), _e(f"{f['free_thread']}({f['free_tid']})"),
             _bytes(f["bytes"]), _e(f["count"]), _e(f"{f['mean_wait_s']:.3f}s"), _e(f"{f['max_wait_s']:.3f}s")]
            for f in doc.get("flows") or []]
    return _table(["allocated by", "freed by", "bytes", "blocks", "mean wait", "max wait"], rows, {2, 3, 4, 5})


def trims_table(doc: dict) -> str:
    rows = [[_e(f"{x['time']:.3f}s"), _e(f"{x['thread']}({x['tid']})"), _e(f"{x['duration_s'] * 1e3:.2f}ms"),
             _e(x.get("returned")), _bytes(x.get("released_bytes"))] for x in doc.get("trims") or []]
    return _table(["time", "thread", "duration", "returned", "released"], rows, {0, 2, 3, 4})


def arenas_table(doc: dict) -> str:
    rows = [[_e(a["id"]), _e(a["kind"]), _bytes(a["live_bytes"]), _bytes(a["resident_bytes"]),
             _bytes(a["retained_bytes"]), _e(a.get("heaps", "")), _e(", ".join(str(t) for t in a["threads"][:8]))]
            for a in doc.get("arenas") or []]
    return _table(["arena", "kind", "live", "resident", "retained", "heaps", "threads"], rows, {2, 3, 4, 5})


def decomposition_html(doc: dict) -> str:
    d = doc.get("rss_decomposition")
    if not d:
        return ""
    parts = [("live heap", d["live_heap_bytes"]), ("retained by allocator", d["retained_bytes"]),
             ("other anonymous", d["other_anon_bytes"]), ("file", d["file_bytes"]), ("shmem", d["shmem_bytes"])]
    cells = " + ".join(f"{_e(k)} <b>{_bytes(v)}</b>" for k, v in parts)
    return f'<p class="decomp">RSS <b>{_bytes(d["rss_bytes"])}</b> = {cells}</p>'


def diff_table(diff_doc: dict) -> str:
    a, b = _label_text(diff_doc.get("a")) or "A", _label_text(diff_doc.get("b")) or "B"
    rows = []
    for s in diff_doc.get("sites") or []:
        delta = s.get("delta_bytes") or 0
        delta_cell = f'<span class="{"up" if delta > 0 else "down"}">{"+" if delta > 0 else ""}{_bytes(delta)}</span>'
        rows.append([_bytes(s.get("a_peak_live_bytes")), _bytes(s.get("b_peak_live_bytes")), delta_cell,
                     _frames_cell(s.get("frames") or [])])
    return (f'<p>A: <b>{_e(a)}</b> &nbsp; B: <b>{_e(b)}</b></p>' +
            _table(["peak A", "peak B", "delta", "site"], rows, {0, 1, 2}, "diff"))


# --------------------------------------------------------------------------------------------- page
def to_html(trace: Trace, report_doc: dict, diff_doc: dict | None = None, *,
            stacks: Mapping[int, tuple[FrameInfo, ...]] | None = None, title: str | None = None) -> str:
    """The whole page. `report_doc` is build_report(trace); `stacks` is symbolize_stacks(trace)
    when the caller already has it; `diff_doc` adds the diff section."""
    if stacks is None:
        stacks = symbolize_stacks(trace)
    data = {"timeline": timeline_data(trace), "sites": site_chart_data(trace, report_doc, stacks),
            "flame": flame_tree(trace, stacks)}
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
    cards_html = "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div>'
                         f'<div class="s">{_e(s)}</div></div>' for k, v, s in cards)
    notes = [("warn", w) for w in rec.get("warnings") or []] + [("warn", a) for a in report_doc.get("advice") or []]
    notes_html = "".join(f'<p class="{c}">{_e(t)}</p>' for c, t in notes)
    sections = [
        ("timeline", "Memory over time", '<div class="chart" id="chart-timeline"></div>'),
        ("site-timeline", f"Top sites over time (live bytes, stacked; top {TOP_SITES_CHART})",
         '<div class="chart" id="chart-sites"></div>'),
        ("flame", "Live bytes by stack (click a frame to zoom, the top bar to zoom out)",
         '<div id="flame-graph"></div>'),
        ("sites", "Sites by live bytes", sites_table(report_doc)),
        ("threads", "Threads by live bytes", threads_table(report_doc)),
        ("flows", "Frees by allocating → freeing thread", flows_table(report_doc)),
    ]
    if report_doc.get("arenas"):
        sections.append(("arenas", "Allocator arenas by retained bytes", arenas_table(report_doc)))
    if report_doc.get("trims"):
        sections.append(("trims", "malloc_trim calls", trims_table(report_doc)))
    if diff_doc is not None:
        sections.append(("diff", "Diff: peak live bytes per site", diff_table(diff_doc)))
    body = "".join(f'<section id="{sid}"><h2>{_e(h)}</h2>{content}</section>' for sid, h, content in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="allocscope">
<title>{_e(title)}</title>
<style>{_asset(UPLOT_CSS)}</style>
<style>{_CSS}</style>
</head><body>
<header><h1>{_e(title)}</h1>
<p class="sub">exe <code>{_e(tgt.get('exe'))}</code>{(' &nbsp; ' + _e(labels)) if labels else ''} &nbsp;
allocator {_e(rec.get('allocator_kind'))} <code>{_e(rec.get('allocator'))}</code> &nbsp;
ended: {_e(rec.get('end_reason') or 'interrupted')}</p>
<div class="cards">{cards_html}</div>{decomposition_html(report_doc)}{notes_html}</header>
<main>{body}</main>
<script type="application/json" id="allocscope-data">{_json_for_script(data)}</script>
<script>{_asset(UPLOT_JS)}</script>
<script>{_JS}</script>
</body></html>
"""


_CSS = """
:root { --fg:#1d2433; --dim:#5b6475; --line:#d8dde6; --bg:#fff; --alt:#f6f8fb; --accent:#2b6cb0; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:var(--fg);
       background:var(--bg); }
header, main { max-width:1360px; margin:0 auto; padding:0 20px; }
h1 { font-size:22px; margin:18px 0 4px; }
h2 { font-size:17px; margin:28px 0 10px; padding-bottom:4px; border-bottom:1px solid var(--line); }
.sub { color:var(--dim); margin:0 0 12px; }
code { font:12.5px/1.4 ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace; }
.cards { display:flex; flex-wrap:wrap; gap:10px; }
.card { border:1px solid var(--line); border-radius:6px; padding:8px 14px; min-width:150px; background:var(--alt); }
.card .k { color:var(--dim); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.card .v { font-size:20px; font-weight:600; }
.card .s { color:var(--dim); font-size:12px; min-height:1em; }
.warn { color:#8a5a00; background:#fff7e0; border-left:3px solid #e0a100; padding:4px 10px; margin:8px 0; }
.note { color:var(--dim); }
.chart { width:100%; min-height:60px; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:var(--alt); font-weight:600; white-space:nowrap; }
td.num, th.num { text-align:right; white-space:nowrap; font-variant-numeric:tabular-nums; }
tbody tr:hover { background:#eef4ff; }
details summary { cursor:pointer; }
ol.frames { margin:4px 0 2px; padding-left:22px; color:var(--dim); }
.up { color:#b42318; } .down { color:#067647; }
#flame-graph svg { display:block; width:100%; font:11.5px ui-monospace,"DejaVu Sans Mono",Menlo,monospace; }
#flame-graph rect { stroke:#fff; stroke-width:.5; cursor:pointer; }
#flame-graph text { pointer-events:none; fill:#222; }
.empty { color:var(--dim); font-style:italic; }
"""

_JS = r"""
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("allocscope-data").textContent);
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function hb(n) {            // human bytes, as reports.render.human_bytes
    if (n == null) return "-";
    let s = n < 0 ? "-" : "", v = Math.abs(n), i = 0;
    while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
    return s + (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + UNITS[i];
  }
  const COLORS = ["#2b6cb0", "#dd6b20", "#38a169", "#d53f8c", "#805ad5", "#d69e2e", "#319795", "#e53e3e",
                  "#718096", "#975a16"];
  const BYTE_INCRS = [];     // y ticks at 1, 2, 4... 512 of B, KiB, MiB...
  for (let k = 0; k < 6; k++) for (let m = 1; m < 1024; m *= 2) BYTE_INCRS.push(m * Math.pow(1024, k));
  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }
  function markInk(u) {       // painted pixels of the plot canvas: data-ink on the chart element
    const c = u.ctx.canvas, px = u.ctx.getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
    u.root.parentNode.dataset.ink = String(n);
  }
  function empty(el, msg) { el.innerHTML = '<p class="empty">' + msg + "</p>"; el.dataset.ink = "0"; }

  function chart(el, spec, stacked) {
    if (!spec.t.length || !spec.series.length) return empty(el, "no data");
    const raw = [spec.t].concat(spec.series.map(s => s.values));
    let data = raw, bands = [];
    if (stacked) {            // cumulative sums, rank 1 at the bottom; bands fill between neighbours
      const acc = spec.t.map(() => 0);
      data = [spec.t].concat(spec.series.map(s => s.values.map((v, i) => (acc[i] += v || 0))));
      for (let i = 2; i < data.length; i++) bands.push({series: [i, i - 1]});
    }
    const series = [{label: "elapsed", value: (u, v) => v == null ? "-" : v.toFixed(2) + " s"}].concat(
      spec.series.map((s, k) => ({
        label: s.label, stroke: COLORS[k % COLORS.length], width: stacked ? 1 : 2,
        fill: stacked ? alpha(COLORS[k % COLORS.length], 0.55) : undefined,
        value: (u, v, si, i) => i == null ? "-" : hb(raw[si][i]),
        dash: s.dash ? [7, 4] : undefined, points: {show: false}, spanGaps: false,
      })));
    const opts = {
      width: Math.max(320, el.clientWidth), height: 320, series: series, bands: bands,
      scales: {x: {time: false}, y: {range: (u, lo, hi) => [0, hi > 0 ? hi * 1.05 : 1]}},
      axes: [{label: "elapsed (s)"},
             {size: 80, incrs: BYTE_INCRS, values: (u, ticks) => ticks.map(v => hb(v).replace(".0 ", " "))}],
      legend: {live: true}, cursor: {drag: {x: true, y: false}},
      hooks: {draw: [markInk], ready: [u => u.setLegend({idx: spec.t.length - 1})]},
    };
    const u = new uPlot(opts, data, el);
    window.addEventListener("resize", () => u.setSize({width: Math.max(320, el.clientWidth), height: 320}));
  }

  function flame(el, root) {
    if (!root || !root.v) return empty(el, "no live bytes at the end of the recording");
    (function link(n, p) { n.p = p; (n.c || []).forEach(c => link(c, n)); })(root, null);
    const NS = "http://www.w3.org/2000/svg", H = 18, total = root.v;
    function depth(n) { return 1 + Math.max(0, ...(n.c || []).map(depth)); }
    function color(name) {
      let h = 0;
      for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
      return "hsl(" + (10 + h % 45) + "," + (65 + h % 20) + "%," + (58 + (h >> 8) % 14) + "%)";
    }
    function draw(focus) {
      const W = Math.max(320, el.clientWidth), svg = document.createElementNS(NS, "svg");
      const rows = depth(focus);
      svg.setAttribute("viewBox", "0 0 " + W + " " + rows * H);
      svg.setAttribute("height", String(rows * H));
      let nodes = 0;
      function add(n, x, w, d) {
        if (w < 0.5) return;
        const g = document.createElementNS(NS, "g"), r = document.createElementNS(NS, "rect");
        r.setAttribute("x", x); r.setAttribute("y", d * H); r.setAttribute("width", w); r.setAttribute("height", H - 1);
        r.setAttribute("fill", n === root ? "#c9d3e3" : color(n.n));
        const t = document.createElementNS(NS, "title");
        t.textContent = n.n + " — " + hb(n.v) + " (" + (100 * n.v / total).toFixed(2) + "%)";
        g.appendChild(t); g.appendChild(r);
        const chars = Math.floor((w - 6) / 7);
        if (chars >= 3) {
          const tx = document.createElementNS(NS, "text");
          tx.setAttribute("x", x + 3); tx.setAttribute("y", d * H + 13);
          const label = n.n + " " + hb(n.v);
          tx.textContent = label.length > chars ? label.slice(0, chars - 1) + "…" : label;
          g.appendChild(tx);
        }
        g.addEventListener("click", () => draw(n === focus && n.p ? n.p : n));
        svg.appendChild(g); nodes++;
        let cx = x;
        (n.c || []).forEach(c => { const cw = w * c.v / n.v; add(c, cx, cw, d + 1); cx += cw; });
      }
      add(focus, 0, W, 0);
      el.replaceChildren(svg);
      el.dataset.nodes = String(nodes);
    }
    draw(root);
  }

  chart(document.getElementById("chart-timeline"), D.timeline, false);
  chart(document.getElementById("chart-sites"), D.sites, true);
  flame(document.getElementById("flame-graph"), D.flame);
  document.body.dataset.rendered = "1";
})();
"""
