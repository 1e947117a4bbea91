"""`allocscope diff --format html`: one offline page with the report page's assets — findings,
both runs' timelines on one chart, the locations with A/B bars, a differential flame graph, the
waits, allocators and thread groups side by side."""

from __future__ import annotations

from collections.abc import Mapping

from ..analysis import Folding, FrameInfo, peak_seq, symbolize_stacks
from ..trace import Trace
from ..units import human_bytes, human_delta
from .flamegraph import folded_stacks
from .html import DIFF_HEADER, FLAME_MIN_FRACTION, json_number, page
from .html_cells import esc, findings_html, label_text
from .html_diff_tables import diff_allocators_table, diff_groups_table, diff_locations_table, diff_waits_table
from .shared import NOUNS, listed


# --------------------------------------------------------------------------------------------- the diff page
def diff_timeline_data(trace_a: Trace, trace_b: Trace) -> dict:
    """Both runs' live and RSS bytes on one chart: x = seconds since each run's own start (the
    union of both runs' interval ends), one series per run and figure, null where that run has
    no sample (drawn across: `span`). RSS samples after a target exited are gaps."""

    def points(trace: Trace, col: str) -> dict[float, int | float | None]:
        iv = trace.intervals
        if col not in iv or "elapsed_s" not in iv:
            return {}
        out: dict[float, int | float | None] = {}
        for t, v in zip(iv["elapsed_s"], iv[col]):
            n = json_number(v)
            out[round(float(t), 6)] = None if n is None or (col == "rss_bytes" and n < 0) else n
        return out

    cols = [("live_bytes", "live"), ("rss_bytes", "RSS")]
    per = [
        (f"{name} {label}", points(tr, col), name == "B")
        for name, tr in (("A", trace_a), ("B", trace_b))
        for col, label in cols
    ]
    xs = sorted({x for _, p, _ in per for x in p})
    return {
        "t": xs,
        "series": [
            {"label": label, "values": [p.get(x) for x in xs], "dash": "RSS" in label, "span": True}
            for label, p, _ in per
            if p
        ],
    }


def diff_flame_tree(
    trace_a: Trace,
    trace_b: Trace,
    stacks_a: Mapping[int, tuple[FrameInfo, ...]],
    stacks_b: Mapping[int, tuple[FrameInfo, ...]],
    fold: Folding | None = None,
    min_fraction: float = FLAME_MIN_FRACTION,
) -> dict | None:
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
        kids = sorted(
            (k for k in node["c"].values() if k["v"] >= limit and k["v"] > 0), key=lambda k: (-k["v"], k["n"])
        )
        out = {"n": node["n"], "v": node["v"], "a": node["a"]}
        if kids:
            out["c"] = [finish(k) for k in kids]
        return out

    return finish(root)


def to_diff_html(
    trace_a: Trace,
    trace_b: Trace,
    diff_doc: dict,
    *,
    stacks_a: Mapping[int, tuple[FrameInfo, ...]] | None = None,
    stacks_b: Mapping[int, tuple[FrameInfo, ...]] | None = None,
    fold: Folding | None = None,
    title: str | None = None,
) -> str:
    """`allocscope diff --format html`: one offline page (the report page's assets): the
    findings, both runs' memory over time on one chart (seconds since each run's start; live
    and RSS), the locations with A/B bars and flags, a differential flame graph of each run's
    stacks at its peak (width by B; red grew, blue shrank), held while waiting, allocators and
    thread groups, A vs B. `diff_doc` is diff_traces(trace_a, trace_b, ...); `stacks_a/b`
    the symbolized stacks when the caller has them (diff.Side.stacks)."""
    stacks_a = symbolize_stacks(trace_a) if stacks_a is None else stacks_a
    stacks_b = symbolize_stacks(trace_b) if stacks_b is None else stacks_b
    tree = diff_flame_tree(trace_a, trace_b, stacks_a, stacks_b, fold)
    data = {
        "timeline": diff_timeline_data(trace_a, trace_b),
        "flame": {"views": {"diff": tree}, "default": "diff", "diff": True},
    }
    ta, tb = diff_doc["traces"]["a"], diff_doc["traces"]["b"]
    la, lb = label_text(ta.get("labels")), label_text(tb.get("labels"))
    title = title or f"allocscope diff — {la or 'A'} vs {lb or 'B'}"
    tot = diff_doc["totals"]
    cards = "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(human_bytes(tot["b"][key]))}</div>'
        f'<div class="s">A {esc(human_bytes(tot["a"][key]))}, {esc(human_delta(tot["delta"][key]))}</div></div>'
        for k, key in (
            ("B live peak", "peak_live_bytes"),
            ("B RSS peak", "peak_rss_bytes"),
            ("B live now", "live_bytes"),
            ("B RSS now", "rss_bytes"),
        )
    )
    cards += (
        f'<div class="card"><div class="k">lost events</div><div class="v">'
        f'{esc(tot["a"]["lost_events"])} / {esc(tot["b"]["lost_events"])}</div><div class="s">A / B</div></div>'
    )
    per = diff_doc.get("per")
    per_html = ""
    if per:
        ratio = f"{per['b']:g}/{per['a']:g} = {per['expected_ratio']:.2f}"
        per_html = (
            f'<p class="note">normalized per {esc(per["label"])}: a location scaling linearly has B/A = '
            f"{esc(ratio)}; ! = grew more than {esc(per['flag_scaling'])}x that</p>"
        )
    notes = "".join(f'<p class="warn">{esc(w)}</p>' for w in diff_doc.get("warnings") or [])
    legend = (
        '<p class="legend-diff note">width: bytes live in B at its peak; colour: '
        '<span style="background:hsl(0,80%,62%)">grew in B</span>'
        '<span style="background:hsl(0,0%,90%)">about the same</span>'
        '<span style="background:hsl(220,80%,70%)">shrank in B</span></p>'
    )
    noun = NOUNS[listed(diff_doc)[1]]
    sections = [
        (
            "timeline",
            "Memory over time, A and B (seconds since each run's start)",
            '<div class="chart" id="chart-timeline"></div>',
        ),
        (
            "locations",
            f"{noun.capitalize()} by peak live bytes, A vs B" + (" (! = grew out of proportion)" if per else ""),
            diff_locations_table(diff_doc),
        ),
        (
            "flame",
            "Differential flame graph: the stacks at each run's peak (click a frame to zoom)",
            legend + '<div class="views" id="flame-views"></div><div id="flame-graph"></div>',
        ),
    ]
    for sid, head, content in (
        (
            "waits",
            "Held while waiting, A vs B (at each one's peak of memory held by blocked threads)",
            diff_waits_table(diff_doc),
        ),
        (
            "allocators",
            "What each allocator keeps, A vs B (resident in its own mappings, not live = retained)",
            diff_allocators_table(diff_doc),
        ),
        ("groups", "Thread groups (digits in names replaced by N)", diff_groups_table(diff_doc)),
    ):
        if content:
            sections.append((sid, head, content))
    ids = {sid for sid, _, _ in sections} | {"totals"}
    return page(
        DIFF_HEADER,
        title,
        sections,
        data,
        path_a=esc(ta.get("path")),
        path_b=esc(tb.get("path")),
        side_a=esc(f"{ta.get('comm') or '?'} pid {ta.get('pid')}" + (f"  [{la}]" if la else "")),
        side_b=esc(f"{tb.get('comm') or '?'} pid {tb.get('pid')}" + (f"  [{lb}]" if lb else "")),
        per=per_html,
        findings=findings_html(diff_doc.get("findings"), ids),
        cards=cards,
        notes=notes,
    )
