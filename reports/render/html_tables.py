"""The tables of the report and diff pages, rendered here (escaped, with their numbers
right-aligned) so the pages read without JavaScript; the findings block that links to them."""
from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from ..units import human_bytes, human_delta
from .diff_text import ratio_text
from .shared import COLUMN_TITLES, NOUNS, SORT_TITLES, frame_text, listed, location_text
from .text import peak_when

TOP_SITES_TABLE = 200    # rows of the site table


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def ordered_sites(report_doc: dict) -> list[tuple[int, dict]]:
    """(number shown, row) in the page's order — rows are the report's locations (its sites
    when it is `by` stack, render.listed) —: by bytes held at the peak (`at_peak_rank`, every
    row) when the report leads with the peak, else by `rank`."""
    sites = listed(report_doc)[0]
    if (report_doc.get("at_peak") or {}).get("peak_first"):
        return [(s["at_peak_rank"], s) for s in sorted(sites, key=lambda s: s["at_peak_rank"])]
    return [(s["rank"], s) for s in sites]


# --------------------------------------------------------------------------------------------- tables
def _table(headers: list[str], rows: list[list[str]], numeric: set[int], cls: str = "") -> str:
    """An HTML table from already-escaped cells; columns in `numeric` are right-aligned."""
    th = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _bytes(n: float | None) -> str:
    return f'<span title="{esc(n)} bytes">{esc(human_bytes(n))}</span>'


def _frames_cell(frames: list[dict]) -> str:
    if not frames:
        return "?"
    first = f"<code>{esc(frame_text(frames[0]))}</code>"
    if len(frames) == 1:
        return first
    rest = "".join(f"<li><code>{esc(frame_text(f))}</code></li>" for f in frames[1:])
    return f'<details><summary>{first}</summary><ol class="frames">{rest}</ol></details>'


def _location_cell(loc: dict, doc: dict) -> str:
    """A location: its frame, and (unfolded) the stacks that reach it, holding most first, each
    with its live bytes and its frames."""
    head = f"<code>{esc(location_text(loc))}</code>"
    by_rank = {x["rank"]: x for x in doc.get("sites") or []}
    stacks = [by_rank[r] for r in loc.get("stacks") or [] if r in by_rank][:STACKS_LISTED]
    n = loc.get("n_stacks", len(stacks))
    skip = 0 if loc.get("inside") else 1  # a stripped module's frames under their caller: shown
    items = "".join(
        f'<li>{_bytes(x["live_bytes"])} live, {esc(x["live_count"])} blocks'
        f'<ol class="frames">{"".join(f"<li><code>{esc(frame_text(f))}</code></li>" for f in x["frames"][skip:])}'
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
    rows = [[esc(n), _bytes(s.get("at_peak_bytes")), _bytes(s["live_bytes"]), esc(s["live_count"]),
             _bytes(s["peak_live_bytes"]), _bytes(s["alloc_bytes"]), esc(s["alloc_count"])]
            + ([_bytes(s.get("device_live_bytes")), _bytes(s.get("device_peak_bytes"))] if device else [])
            + [esc(",".join(s.get("sources") or [])),
               esc(", ".join(f"{t['name']}({t['tid']})" for t in (s.get("threads") or [])[:3])),
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
        return f"<code>{esc(location_text(s))}</code>" if loc else _frames_cell(s.get("frames") or [])
    out = [f'<p>GPU memory <b>{_bytes(tot.get("device_bytes"))}</b> live at the end in '
           f'{esc(tot.get("device_count"))} allocations, peak <b>{_bytes(tot.get("device_peak_bytes"))}</b>; '
           f'pinned and managed host memory through the driver API {_bytes(tot.get("cuda_host_bytes"))}. '
           "GPU memory is in no host figure (live, peak, RSS, threads' live bytes).</p>"]
    dev = [by_rank[r] for r in gpu.get("device_location_ranks" if loc else "device_ranks") or []]
    if dev:
        out.append(f"<h3>Device memory by {noun}</h3>" + _table(
            ["#", "device live", "blocks", "device peak", "allocated", "allocs", "threads", noun],
            [[esc(s["rank"]), _bytes(s["device_live_bytes"]), esc(s["device_live_count"]),
              _bytes(s["device_peak_bytes"]), _bytes(s["device_alloc_bytes"]), esc(s["device_alloc_count"]),
              esc(", ".join(f"{t['name']}({t['tid']})" for t in s["threads"] if t.get("device_live_bytes"))),
              cell(s)] for s in dev], {0, 1, 2, 3, 4, 5}, "gpu-sites"))
    host = [by_rank[r] for r in gpu.get("host_location_ranks" if loc else "host_ranks") or []]
    if host:
        out.append(f"<h3>Pinned and managed host memory by {noun}</h3>" + _table(
            ["#", "pinned", "managed", f"{noun} live", "threads", noun],
            [[esc(s["rank"]), _bytes(s["live_by_source"].get("cuda-pinned", 0)),
              _bytes(s["live_by_source"].get("cuda-managed", 0)), _bytes(s["live_bytes"]),
              esc(", ".join(f"{t['name']}({t['tid']})" for t in s["threads"] if t.get("live_bytes"))),
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
        buttons = (f'<button type="button" data-view="peak">at the peak ({esc(peak_when(doc))})</button>'
                   f'<button type="button" data-view="end">at the end (live {esc(human_bytes(tot.get("live_bytes")))})'
                   "</button>")
    return f'<div class="views" id="flame-views">{buttons}</div><div id="flame-graph"></div>'


def threads_table(doc: dict) -> str:
    """Threads by live host bytes; with GPU memory in the report, its live and peak bytes apart."""
    device = bool((doc.get("gpu") or {}).get("device_ranks"))
    rows = [[esc(t["tid"]), esc(t["name"]), _bytes(t["live_bytes"]), esc(t["live_count"]), _bytes(t["peak_live_bytes"]),
             _bytes(t["alloc_bytes"]), esc(t["alloc_count"])]
            + ([_bytes(t.get("device_live_bytes")), _bytes(t.get("device_peak_bytes"))] if device else [])
            for t in doc.get("threads") or []]
    return _table(["tid", "name", "live", "blocks", "peak", "allocated", "allocs"]
                  + (["device", "device peak"] if device else []), rows,
                  {0, 2, 3, 4, 5, 6} | ({7, 8} if device else set()))


def flows_table(doc: dict) -> str:
    rows = [[esc(f"{f['alloc_thread']}({f['alloc_tid']})"), esc(f"{f['free_thread']}({f['free_tid']})"),
             _bytes(f["bytes"]), esc(f["count"]), esc(f"{f['mean_wait_s']:.3f}s"), esc(f"{f['max_wait_s']:.3f}s")]
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
        parts.append(f"<p>{esc(when)}interval {esc(pk['seq'])}: {esc(pk['blocked'])} threads blocked, "
                     f"{esc(pk['holding'])} of them holding {_bytes(pk['held_bytes'])} "
                     f"(waits of at least {esc(w['wait_min_ms'])} ms)</p>")
        rows = [[_frames_cell([d]) + (" <em>in free</em>" if d.get("in_free") else ""), esc(d["threads"]),
                 _bytes(d["held_bytes"]), esc(f"{d['longest_s']:.2f}s"),
                 "<br>".join(f"{esc(h['function'])} {_bytes(h['bytes'])} in {esc(h['blocks'])}" for h in d["held"][:4]),
                 esc(", ".join(f"{t['name']}({t['tid']})" for t in d["thread_list"][:8]))]
                for d in pk["by_location"][:TOP_SITES_TABLE]]
        parts.append(_table(["waiting in", "threads", "held", "longest", "what they hold (allocated at)", "threads"],
                            rows, {1, 2, 3}))
    else:
        parts.append("<p>No thread was blocked at a snapshot.</p>")
    if w.get("off_cpu"):
        parts.append("<h3>Off-CPU time by where threads blocked (whole recording)</h3>")
        parts.append(_table(["waiting in", "waits", "total", "longest", "threads"],
                            [[_frames_cell([d]), esc(d["waits"]), esc(f"{d['total_s']:.2f}s"),
                              esc(f"{d['max_s']:.2f}s"), esc(", ".join(d["threads"][:6]))]
                             for d in w["off_cpu"][:TOP_SITES_TABLE]], {1, 2, 3}))
    fr = w.get("freeing") or {}
    rows = [[esc(f"{r['thread']}({r['tid']})"), esc(r["kind"]), esc(r["calls"]), _bytes(r["requested_bytes"]),
             _bytes(r["released_bytes"]), esc(f"{r['duration_s'] * 1e3:.2f}ms")] for r in fr.get("by_thread") or []]
    rows += [[esc(f"{p['thread']}({p['tid']})"), esc(p["function"]), esc(p["calls"]), "-", _bytes(p["released_bytes"]),
              esc(f"{p['duration_s'] * 1e3:.2f}ms")] for p in fr.get("purges") or []]
    if rows:
        parts.append("<h3>What giving memory back cost</h3>")
        parts.append(_table(["thread", "call", "calls", "asked", "released", "time"], rows, {2, 3, 4, 5}))
    return "".join(parts)


def trims_table(doc: dict) -> str:
    rows = [[esc(f"{x['time']:.3f}s"), esc(f"{x['thread']}({x['tid']})"), esc(f"{x['duration_s'] * 1e3:.2f}ms"),
             esc(x.get("returned")), _bytes(x.get("released_bytes"))] for x in doc.get("trims") or []]
    return _table(["time", "thread", "duration", "returned", "released"], rows, {0, 2, 3, 4})


def arenas_table(doc: dict) -> str:
    rows = [[esc(a["id"]), esc(a["kind"]), _bytes(a["live_bytes"]), _bytes(a.get("live_before_bytes")),
             _bytes(a["resident_bytes"]), _bytes(a["retained_bytes"]), esc(a.get("heaps", "")),
             esc(", ".join(str(t) for t in a["threads"][:8]))]
            for a in doc.get("arenas") or []]
    return _table(["arena", "kind", "live", "before attach", "resident", "retained", "heaps", "threads"], rows,
                  {2, 3, 4, 5, 6})


def allocators_table(doc: dict) -> str:
    """What each allocator keeps (rss_decomposition.allocators): resident in its own mappings,
    live, retained, released to the kernel; '' when the trace does not measure it."""
    allocs = (doc.get("rss_decomposition") or {}).get("allocators") or []
    rows = [[esc(a["name"]), esc(a.get("module") or ""), esc("yes" if a.get("serves_malloc") else ""),
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
    parts.append(("retained by allocator (free)", d["retained_bytes"]))
    if d.get("before_or_retained_bytes"):
        parts.append(("before the attach or retained", d["before_or_retained_bytes"]))
    parts += [("other anonymous", d["other_anon_bytes"]),
              ("file", d["file_bytes"]), ("shmem", d["shmem_bytes"])]
    cells = " + ".join(f"{esc(k)} <b>{_bytes(v)}</b>" for k, v in parts)
    out = f'<p class="decomp">RSS <b>{_bytes(d["rss_bytes"])}</b> = {cells}</p>'
    if d.get("unseparated"):
        where = "in its own mappings and in other anonymous" if d.get("before_or_retained_bytes") else \
            "in other anonymous"
        out += (f'<p class="decomp">{esc(", ".join(d["unseparated"]))}: memory from before the attach is {where}, '
                f'{esc(d["unseparated_note"])}</p>')
    if d.get("shmem_attributed_bytes") or d.get("file_device_bytes"):
        def srcs(by: dict) -> str:
            return esc(", ".join(f"{k} {human_bytes(v)}" for k, v in by.items()) or "none")
        out += (f'<p class="decomp">shmem {_bytes(d["shmem_bytes"])} = <b>{_bytes(d["shmem_attributed_bytes"])}</b>'
                f' at sites ({srcs(d["shmem_sources"])}) + {_bytes(d["shmem_unattributed_bytes"])} not traced; '
                f'file {_bytes(d["file_bytes"])} = <b>{_bytes(d["file_device_bytes"])}</b> device-mapped '
                f'({srcs(d["file_device_sources"])}) + {_bytes(d["file_regular_bytes"])} regular files</p>')
    return out


def diff_table(diff_doc: dict) -> str:
    a, b = label_text(diff_doc.get("a")) or "A", label_text(diff_doc.get("b")) or "B"
    every, by = listed(diff_doc)
    rows = []
    for s in every:
        delta = s.get("delta_bytes") or 0
        delta_cell = f'<span class="{"up" if delta > 0 else "down"}">{"+" if delta > 0 else ""}{_bytes(delta)}</span>'
        rows.append([_bytes(s.get("a_peak_live_bytes")), _bytes(s.get("b_peak_live_bytes")), delta_cell,
                     _frames_cell(s.get("frames") or []) if by == "stack" else f"<code>{esc(location_text(s))}</code>"])
    return (f'<p>A: <b>{esc(a)}</b> &nbsp; B: <b>{esc(b)}</b></p>' +
            _table(["peak A", "peak B", "delta", COLUMN_TITLES[by]], rows, {0, 1, 2}, "diff"))


# --------------------------------------------------------------------------------------------- findings
def findings_html(findings: list[dict] | None, sections: set[str]) -> str:
    """The findings (reports.analysis.findings) as a list on top of the page, each linking to the
    section of its table when the page has it."""
    if not findings:
        return ""
    items = "".join(f"<li>{esc(f['text'])}"
                    + (f' <a href="#{esc(f["section"])}">{esc(f["table"])}</a>' if f.get("section") in sections
                       else f' <span class="note">{esc(f["table"])}</span>') + "</li>" for f in findings)
    return f'<ol class="findings" id="findings">{items}</ol>'


# --------------------------------------------------------------------------------------------- the diff page's
def _bars(a: int, b: int, top: int) -> str:
    """Two bars, A over B, on the scale of the table's largest peak."""
    def w(x: int) -> str:
        return f"{100 * x / top:.1f}" if top else "0"
    return (f'<div class="bar a" style="width:{w(a)}%" title="A {esc(human_bytes(a))}"></div>'
            f'<div class="bar b" style="width:{w(b)}%" title="B {esc(human_bytes(b))}"></div>')


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
        cells = ["!" if x.get("flagged") else "", esc(i), _bytes(x["a_peak_live_bytes"]),
                 _bytes(x["b_peak_live_bytes"]),
                 _bars(x["a_peak_live_bytes"], x["b_peak_live_bytes"], top),
                 f'<span class="{"up" if d > 0 else "down" if d < 0 else ""}">{esc(human_delta(d))}</span>',
                 esc(ratio_text(x["ratio"], x["in"]))]
        if per:
            cells.append("-" if x.get("scaling") is None else esc(f"{x['scaling']:.2f}x"))
        cells += [_bytes(x["a_live_bytes"]), _bytes(x["b_live_bytes"]),
                  esc(f"{x.get('a_verdict') or '-'}→{x.get('b_verdict') or '-'}"),
                  _frames_cell(x.get("frames") or []) if by == "stack" else f"<code>{esc(location_text(x))}</code>"]
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
                  [[_frames_cell([w]), esc(w["a_threads"]), esc(w["b_threads"]), _bytes(w["a_held_bytes"]),
                    _bytes(w["b_held_bytes"]), esc(human_delta(w["held_delta"])), esc(w["a_max_threads"]),
                    esc(w["b_max_threads"]), esc(f"{w['a_wait_s']:.1f}s"), esc(f"{w['b_wait_s']:.1f}s")]
                   for w in rows[:TOP_SITES_TABLE]], set(range(1, 10)), "diff-waits") if rows else ""


def diff_allocators_table(doc: dict) -> str:
    rows = doc.get("allocators") or []
    return _table(["allocator", "A retained", "B retained", "delta", "A resident", "B resident", "A live", "B live",
                   "A released", "B released"],
                  [[esc(x["name"]), _bytes(x["a_retained"]), _bytes(x["b_retained"]),
                    esc(human_delta(x["retained_delta"])), _bytes(x["a_resident"]), _bytes(x["b_resident"]),
                    _bytes(x["a_live"]), _bytes(x["b_live"]), _bytes(x["a_released"]), _bytes(x["b_released"])]
                   for x in rows], set(range(1, 10)), "diff-allocators") if rows else ""


def diff_groups_table(doc: dict) -> str:
    rows = doc.get("thread_groups") or []
    return _table(["group", "A threads", "B threads", "A live", "B live", "A peak", "B peak", "peak delta"],
                  [[esc(g["group"]), esc(g["a_threads"]), esc(g["b_threads"]), _bytes(g["a_live_bytes"]),
                    _bytes(g["b_live_bytes"]), _bytes(g["a_peak_live_bytes"]), _bytes(g["b_peak_live_bytes"]),
                    esc(human_delta(g["peak_delta_bytes"]))] for g in rows], set(range(1, 8)), "diff-groups") \
        if rows else ""


def label_text(d: Mapping | None) -> str:
    """'k=v k=v' for a (possibly nested) label dict."""
    parts: list[str] = []
    for k, v in (d or {}).items():
        if isinstance(v, Mapping):
            parts.append(label_text(v))
        elif v is not None and not isinstance(v, (list, tuple)):
            parts.append(f"{k}={v}")
    return " ".join(p for p in parts if p)
