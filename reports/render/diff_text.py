"""The diff (allocscope.diff/1, reports.analysis.diff.diff_document) as text: what
`allocscope diff` prints."""

from __future__ import annotations

from ..units import human_bytes, human_delta
from .shared import (
    COLUMN_TITLES,
    DIFF_ALLOCATOR_HEADERS,
    NOUNS,
    Style,
    collapsed_frames,
    findings_text,
    folded_text,
    frame_text,
    listed,
    location_text,
    table,
)

DIFF_SORT_TITLES = {
    "delta": "|peak delta|",
    "live": "|live-at-end delta|",
    "alloc": "|allocated delta|",
    "ratio": "B/A ratio",
    "excess": "|excess over linear scaling|",
    "device": "|GPU memory peak delta|",
}


def ratio_text(r: float | None, present_in: str) -> str:
    """B/A as 1.20x; 'new' for a site only in B, '-' when there is nothing to compare."""
    if r is None:
        return "new" if present_in == "b" else "-"
    return f"{r:.2f}x"


def _side_text(name: str, side: dict) -> str:
    """'A: comm pid N [k=v ...]' from one entry of a diff document's `traces`."""
    labels = " ".join(f"{k}={v}" for k, v in (side.get("labels") or {}).items())
    return f"{name}: {side.get('comm') or '?'} pid {side.get('pid')}" + (f" [{labels}]" if labels else "")


def _diff_totals(tot: dict) -> list[str]:
    rows = []
    for key, title in (
        ("live_bytes", "live now"),
        ("peak_live_bytes", "live peak"),
        ("rss_bytes", "RSS now"),
        ("peak_rss_bytes", "RSS peak"),
    ):
        rows.append([title, human_bytes(tot["a"][key]), human_bytes(tot["b"][key]), human_delta(tot["delta"][key])])
    if any(tot[x].get(k) for x in ("a", "b") for k in ("device_peak_bytes", "cuda_host_bytes")):
        for key, title in (
            ("device_bytes", "GPU now"),
            ("device_peak_bytes", "GPU peak"),
            ("cuda_host_bytes", "CUDA host"),
        ):
            rows.append(
                [
                    title,
                    human_bytes(tot["a"].get(key, 0)),
                    human_bytes(tot["b"].get(key, 0)),
                    human_delta(tot["delta"].get(key, 0)),
                ]
            )
    rows.append(
        ["lost", str(tot["a"]["lost_events"]), str(tot["b"]["lost_events"]), f"{tot['delta']['lost_events']:+d}"]
    )
    return ["  " + line for line in table(["", "A", "B", "delta"], rows, "lrrr")]


def _diff_gpu(doc: dict, top: int) -> list[str]:
    """The diff's GPU sites or locations (GPU memory in A or B), by |GPU peak delta|; [] when none."""
    every, by = listed(doc)
    sites = [x for x in every if x.get("a_device_peak_bytes") or x.get("b_device_peak_bytes")]
    sites.sort(key=lambda x: (-abs(x["device_peak_delta_bytes"]), -x["b_device_peak_bytes"]))
    if not sites:
        return []
    rows = [
        [
            human_bytes(x["a_device_peak_bytes"]),
            human_bytes(x["b_device_peak_bytes"]),
            human_delta(x["device_peak_delta_bytes"]),
            human_bytes(x["a_device_live_bytes"]),
            human_bytes(x["b_device_live_bytes"]),
            human_delta(x["device_live_delta_bytes"]),
            location_text(x) if by != "stack" else frame_text(x["frames"][0]) if x["frames"] else "?",
        ]
        for x in sites[:top]
    ]
    return [
        "",
        f"GPU memory by {NOUNS[by][:-1]} ({min(top, len(sites))} of {len(sites)}, by |GPU peak delta|; "
        "not in the host figures above)",
    ] + [
        "  " + line
        for line in table(
            ["A peak", "B peak", "delta", "A live", "B live", "live delta", COLUMN_TITLES[by]], rows, "rrrrrrl"
        )
    ]


def diff_to_text(doc: dict, top: int = 20, color: bool = False, frames_per_site: int = 6) -> str:
    """The allocscope.diff/1 document as text. With a `per` label, flagged sites (grown out of
    proportion) come first."""
    s = Style(color)
    a, b, per = doc["traces"]["a"], doc["traces"]["b"], doc.get("per")
    out = [
        s.bold(f"allocscope diff — {_side_text('A', a)}  vs  {_side_text('B', b)}"),
        f"  A {a['path']}",
        f"  B {b['path']}",
    ]
    out += [s.yellow(f"warning: {w}") for w in doc.get("warnings") or []]
    if doc.get("folded"):
        out.append(s.dim("folded out of sites: " + folded_text(doc["folded"])))
    if doc.get("source_filter"):
        out.append(s.yellow("sites of sources " + ", ".join(doc["source_filter"]) + " only"))
    if per:
        noun = NOUNS[listed(doc)[1]][:-1]
        out.append(
            f"normalized per {per['label']}: a {noun} scaling linearly has B/A = {per['b']:g}/{per['a']:g}"
            f" = {per['expected_ratio']:.2f}; ! = grew more than {per['flag_scaling']:g}x that, by at least"
            f" {per['flag_material']:.0%} of the total change"
        )
    if doc.get("findings"):
        out += [""] + findings_text(doc["findings"], s)[:-1]
    out += ["", s.bold("Totals")] + _diff_totals(doc["totals"]) + [""]
    every, by = listed(doc)
    sites = sorted(every, key=lambda x: not x.get("flagged"))[:top]
    flagged = sum(1 for x in every if x.get("flagged"))
    order = f"{flagged} flagged first, then by " if per else "by "
    out.append(
        s.bold(f"Top {len(sites)} of {len(every)} {NOUNS[by]}, {order}{DIFF_SORT_TITLES[doc['sort']]}")
        + (
            s.dim(f"  ({len(doc['sites'])} distinct stacks; --by stack matches those)")
            if by != "stack" and len(doc["sites"]) != len(every)
            else ""
        )
    )
    heads = (
        ["", "#", "A peak", "B peak", "delta", "B/A"]
        + (["vs linear"] if per else [])
        + ["A live", "B live", "verdict A→B", COLUMN_TITLES[by]]
    )
    rows = []
    for i, x in enumerate(sites, 1):
        row = [
            "!" if x.get("flagged") else "",
            str(i),
            human_bytes(x["a_peak_live_bytes"]),
            human_bytes(x["b_peak_live_bytes"]),
            human_delta(x["delta_bytes"]),
            ratio_text(x["ratio"], x["in"]),
        ]
        if per:
            row.append("-" if x.get("scaling") is None else f"{x['scaling']:.2f}x")
        row += [
            human_bytes(x["a_live_bytes"]),
            human_bytes(x["b_live_bytes"]),
            f"{x.get('a_verdict') or '-'}→{x.get('b_verdict') or '-'}",
            location_text(x) if by != "stack" else frame_text(x["frames"][0]) if x["frames"] else "?",
        ]
        rows.append(row)
    out += ["  " + line for line in table(heads, rows, "lrrrrr" + ("r" if per else "") + "rrll")]
    out.append("")
    for i, x in enumerate(sites[: min(top, 10)], 1):
        if not x["delta_bytes"]:
            continue
        mark = s.red("! ") if x.get("flagged") else ""
        out.append(
            mark
            + s.bold(f"#{i} {human_delta(x['delta_bytes'])} peak")
            + f"  ({human_bytes(x['a_peak_live_bytes'])} → {human_bytes(x['b_peak_live_bytes'])})"
        )
        if by != "stack":
            out.append(f"    {location_text(x)}")
            continue
        out += [f"    {line}" for line in collapsed_frames(x["frames"], frames_per_site)]
    gpu = _diff_gpu(doc, top)
    if gpu:
        out += ([] if out[-1] == "" else [""]) + [s.bold(gpu[1]), *gpu[2:]]
    allocs = doc.get("allocators") or []
    if allocs:
        out += ["", s.bold("What each allocator keeps (resident in its own mappings, free = retained)")]
        out += [
            "  " + line
            for line in table(
                [
                    *DIFF_ALLOCATOR_HEADERS,
                    "A before attach",
                    "B before attach",
                    "A released",
                    "B released",
                ],
                [
                    [
                        x["name"],
                        human_bytes(x["a_retained"]),
                        human_bytes(x["b_retained"]),
                        human_delta(x["retained_delta"]),
                        human_bytes(x["a_resident"]),
                        human_bytes(x["b_resident"]),
                        human_bytes(x["a_live"]),
                        human_bytes(x["b_live"]),
                        human_bytes(x["a_live_before_attach"]),
                        human_bytes(x["b_live_before_attach"]),
                        human_bytes(x["a_released"]),
                        human_bytes(x["b_released"]),
                    ]
                    for x in allocs
                ],
                "lrrrrrrrrrrr",
            )
        ]
    waits = [
        w
        for w in doc.get("waits") or []
        if w["a_held_bytes"] or w["b_held_bytes"] or w["a_max_threads"] or w["b_max_threads"]
    ]
    if waits:
        out += ["", s.bold("Held while waiting, A vs B (at each one's peak of memory held by blocked threads)")]
        out += [
            "  " + line
            for line in table(
                [
                    "waiting in",
                    "A thr",
                    "B thr",
                    "A held",
                    "B held",
                    "delta",
                    "A max thr",
                    "B max thr",
                    "A wait",
                    "B wait",
                ],
                [
                    [
                        frame_text(w),
                        str(w["a_threads"]),
                        str(w["b_threads"]),
                        human_bytes(w["a_held_bytes"]),
                        human_bytes(w["b_held_bytes"]),
                        human_delta(w["held_delta"]),
                        str(w["a_max_threads"]),
                        str(w["b_max_threads"]),
                        f"{w['a_wait_s']:.1f}s",
                        f"{w['b_wait_s']:.1f}s",
                    ]
                    for w in waits[:top]
                ],
                "lrrrrrrrrr",
            )
        ]
    groups = doc.get("thread_groups") or []
    if groups:
        out += ["", s.bold("Thread groups (digits in names replaced by N)")]
        out += [
            "  " + line
            for line in table(
                ["group", "A thr", "B thr", "A live", "B live", "A peak", "B peak", "peak delta"],
                [
                    [
                        g["group"],
                        str(g["a_threads"]),
                        str(g["b_threads"]),
                        human_bytes(g["a_live_bytes"]),
                        human_bytes(g["b_live_bytes"]),
                        human_bytes(g["a_peak_live_bytes"]),
                        human_bytes(g["b_peak_live_bytes"]),
                        human_delta(g["peak_delta_bytes"]),
                    ]
                    for g in groups[:top]
                ],
                "lrrrrrrr",
            )
        ]
    return "\n".join(out) + "\n"
