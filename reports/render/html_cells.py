"""What the tables of the report and diff pages are built from: escaping, a table with its numbers
right-aligned, cells of bytes and of frames; and the two pieces both pages share, the labels line
and the findings block on top."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from ..units import human_bytes
from .shared import frame_text

TOP_SITES_TABLE = 200  # rows of the site table


def esc(x: Any) -> str:
    """`x` as HTML text, escaped ('' for None)."""
    return html.escape("" if x is None else str(x))


def html_table(headers: list[str], rows: list[list[str]], numeric: set[int], cls: str = "") -> str:
    """An HTML table from already-escaped cells; columns in `numeric` are right-aligned."""
    th = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def bytes_cell(n: float | None) -> str:
    """Bytes in human units, the exact count on hover."""
    return f'<span title="{esc(n)} bytes">{esc(human_bytes(n))}</span>'


def frames_cell(frames: list[dict]) -> str:
    """A stack: its innermost frame, the others folded under it."""
    if not frames:
        return "?"
    first = f"<code>{esc(frame_text(frames[0]))}</code>"
    if len(frames) == 1:
        return first
    rest = "".join(f"<li><code>{esc(frame_text(f))}</code></li>" for f in frames[1:])
    return f'<details><summary>{first}</summary><ol class="frames">{rest}</ol></details>'


def label_text(d: Mapping | None) -> str:
    """'k=v k=v' for a (possibly nested) label dict."""
    parts: list[str] = []
    for k, v in (d or {}).items():
        if isinstance(v, Mapping):
            parts.append(label_text(v))
        elif v is not None and not isinstance(v, (list, tuple)):
            parts.append(f"{k}={v}")
    return " ".join(p for p in parts if p)


def findings_html(findings: list[dict] | None, sections: set[str]) -> str:
    """The findings (reports.analysis.findings) as a list on top of the page, each linking to the
    section of its table when the page has it."""
    if not findings:
        return ""
    items = "".join(
        f"<li>{esc(f['text'])}"
        + (
            f' <a href="#{esc(f["section"])}">{esc(f["table"])}</a>'
            if f.get("section") in sections
            else f' <span class="note">{esc(f["table"])}</span>'
        )
        + "</li>"
        for f in findings
    )
    return f'<ol class="findings" id="findings">{items}</ol>'
