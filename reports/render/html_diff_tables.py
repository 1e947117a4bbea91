"""The diff's tables, rendered here like the report page's (html_tables.py): the report page's
diff section and the diff page's locations, waits, allocators and thread groups."""

from __future__ import annotations

from ..units import human_bytes, human_delta
from .diff_text import ratio_text
from .html_cells import TOP_SITES_TABLE, bytes_cell, esc, frames_cell, html_table, label_text
from .shared import COLUMN_TITLES, DIFF_ALLOCATOR_HEADERS, listed, location_text


def diff_table(diff_doc: dict) -> str:
    a, b = label_text(diff_doc.get("a")) or "A", label_text(diff_doc.get("b")) or "B"
    every, by = listed(diff_doc)
    rows = []
    for s in every:
        delta = s.get("delta_bytes") or 0
        delta_cell = (
            f'<span class="{"up" if delta > 0 else "down"}">{"+" if delta > 0 else ""}{bytes_cell(delta)}</span>'
        )
        rows.append(
            [
                bytes_cell(s.get("a_peak_live_bytes")),
                bytes_cell(s.get("b_peak_live_bytes")),
                delta_cell,
                frames_cell(s.get("frames") or []) if by == "stack" else f"<code>{esc(location_text(s))}</code>",
            ]
        )
    return f"<p>A: <b>{esc(a)}</b> &nbsp; B: <b>{esc(b)}</b></p>" + html_table(
        ["peak A", "peak B", "delta", COLUMN_TITLES[by]], rows, {0, 1, 2}, "diff"
    )


def _bars(a: int, b: int, top: int) -> str:
    """Two bars, A over B, on the scale of the table's largest peak."""

    def w(x: int) -> str:
        return f"{100 * x / top:.1f}" if top else "0"

    return (
        f'<div class="bar a" style="width:{w(a)}%" title="A {esc(human_bytes(a))}"></div>'
        f'<div class="bar b" style="width:{w(b)}%" title="B {esc(human_bytes(b))}"></div>'
    )


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
        cells = [
            "!" if x.get("flagged") else "",
            esc(i),
            bytes_cell(x["a_peak_live_bytes"]),
            bytes_cell(x["b_peak_live_bytes"]),
            _bars(x["a_peak_live_bytes"], x["b_peak_live_bytes"], top),
            f'<span class="{"up" if d > 0 else "down" if d < 0 else ""}">{esc(human_delta(d))}</span>',
            esc(ratio_text(x["ratio"], x["in"])),
        ]
        if per:
            cells.append("-" if x.get("scaling") is None else esc(f"{x['scaling']:.2f}x"))
        cells += [
            bytes_cell(x["a_live_bytes"]),
            bytes_cell(x["b_live_bytes"]),
            esc(f"{x.get('a_verdict') or '-'}→{x.get('b_verdict') or '-'}"),
            frames_cell(x.get("frames") or []) if by == "stack" else f"<code>{esc(location_text(x))}</code>",
        ]
        body.append((cells, bool(x.get("flagged"))))
    heads = (
        ["", "#", "A peak", "B peak", "A / B", "delta", "B/A"]
        + (["vs linear"] if per else [])
        + ["A live", "B live", "verdict A→B", COLUMN_TITLES[by]]
    )
    numeric = {1, 2, 3, 5, 6} | ({7, 8, 9} if per else {7, 8})
    th = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(heads))
    trs = ""
    for cells, fl in body:
        tds = "".join(
            f'<td class="num">{c}</td>' if i in numeric else f'<td class="bars">{c}</td>' if i == 4 else f"<td>{c}</td>"
            for i, c in enumerate(cells)
        )
        trs += ('<tr class="flagged">' if fl else "<tr>") + tds + "</tr>"
    note = "" if len(rows_in) == len(every) else f'<p class="note">showing {len(rows_in)} of {len(every)}</p>'
    return f'<table class="diff-locations"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>{note}'


def diff_waits_table(doc: dict) -> str:
    rows = [
        w
        for w in doc.get("waits") or []
        if w["a_held_bytes"] or w["b_held_bytes"] or w["a_max_threads"] or w["b_max_threads"]
    ]
    return (
        html_table(
            [
                "waiting in",
                "A threads",
                "B threads",
                "A held",
                "B held",
                "delta",
                "A max threads",
                "B max threads",
                "A off-CPU",
                "B off-CPU",
            ],
            [
                [
                    frames_cell([w]),
                    esc(w["a_threads"]),
                    esc(w["b_threads"]),
                    bytes_cell(w["a_held_bytes"]),
                    bytes_cell(w["b_held_bytes"]),
                    esc(human_delta(w["held_delta"])),
                    esc(w["a_max_threads"]),
                    esc(w["b_max_threads"]),
                    esc(f"{w['a_wait_s']:.1f}s"),
                    esc(f"{w['b_wait_s']:.1f}s"),
                ]
                for w in rows[:TOP_SITES_TABLE]
            ],
            set(range(1, 10)),
            "diff-waits",
        )
        if rows
        else ""
    )


def diff_allocators_table(doc: dict) -> str:
    rows = doc.get("allocators") or []
    return (
        html_table(
            [
                *DIFF_ALLOCATOR_HEADERS,
                "A released",
                "B released",
            ],
            [
                [
                    esc(x["name"]),
                    bytes_cell(x["a_retained"]),
                    bytes_cell(x["b_retained"]),
                    esc(human_delta(x["retained_delta"])),
                    bytes_cell(x["a_resident"]),
                    bytes_cell(x["b_resident"]),
                    bytes_cell(x["a_live"]),
                    bytes_cell(x["b_live"]),
                    bytes_cell(x["a_released"]),
                    bytes_cell(x["b_released"]),
                ]
                for x in rows
            ],
            set(range(1, 10)),
            "diff-allocators",
        )
        if rows
        else ""
    )


def diff_groups_table(doc: dict) -> str:
    rows = doc.get("thread_groups") or []
    return (
        html_table(
            ["group", "A threads", "B threads", "A live", "B live", "A peak", "B peak", "peak delta"],
            [
                [
                    esc(g["group"]),
                    esc(g["a_threads"]),
                    esc(g["b_threads"]),
                    bytes_cell(g["a_live_bytes"]),
                    bytes_cell(g["b_live_bytes"]),
                    bytes_cell(g["a_peak_live_bytes"]),
                    bytes_cell(g["b_peak_live_bytes"]),
                    esc(human_delta(g["peak_delta_bytes"])),
                ]
                for g in rows
            ],
            set(range(1, 8)),
            "diff-groups",
        )
        if rows
        else ""
    )
