"""What the text renderers (text.py, diff_text.py, the live view) and the HTML page share: the
names of frames and locations, the rows a report lists, aligned tables, sparklines, styles."""

from __future__ import annotations

import os

from ..units import human_bytes
from ..wrappers import frame_name

# the keys of a report location (or wait location) that make its frame, for frame_text
LOCATION_FRAME_KEYS = ("function", "module", "file", "line", "call", "inside")


# the first columns of a diff's allocator table, text and HTML
DIFF_ALLOCATOR_HEADERS = [
    "allocator",
    "A retained",
    "B retained",
    "delta",
    "A resident",
    "B resident",
    "A live",
    "B live",
]

SORT_TITLES = {"live": "live bytes", "peak": "peak live bytes", "growth": "growth", "age": "oldest allocation"}


class Style:
    """ANSI bold, dim, red and yellow when `color`, else the text as it is."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def _w(self, code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if self.color else s

    def bold(self, s: str) -> str:
        return self._w("1", s)

    def dim(self, s: str) -> str:
        return self._w("2", s)

    def red(self, s: str) -> str:
        return self._w("31", s)

    def yellow(self, s: str) -> str:
        return self._w("33", s)


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    """Aligned columns; `align` is a string of 'l'/'r' per column (default: numbers right)."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    align = align or "l" * len(headers)

    def fmt(r):
        return "  ".join(
            c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i]) for i, c in enumerate(r)
        ).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


_SPARKS = "▁▂▃▄▅▆▇█"


ASCII_SPARKS = "_.-=+*#@"


def sparkline(values: list[int], lo: float | None = None, hi: float | None = None, chars: str = _SPARKS) -> str:
    """A one-line sketch of a series, lowest value ▁, highest █ — or on the scale lo..hi when
    given (two series drawn on one scale compare); `chars`: the ramp, lowest first."""
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = (hi - lo) or 1
    top = len(chars) - 1
    return "".join(chars[max(0, min(top, int((v - lo) / span * top + 0.5)))] for v in values)


def frame_text(f: dict) -> str:
    loc = ""
    if f.get("file"):
        loc = f" {os.path.basename(f['file'])}:{f.get('line') or '?'}"
    mod = os.path.basename(f.get("module") or "")
    return frame_name(f["function"], loc, f.get("call"), f.get("inside")) + (f"  [{mod}]" if mod else "")


NOUNS = {"location": "locations", "function": "functions", "stack": "sites"}


COLUMN_TITLES = {"location": "location", "function": "function", "stack": "site (innermost)"}


def listed(doc: dict) -> tuple[list[dict], str]:
    """The rows a people-facing view of a report lists and their grouping: `locations` (by
    location or function) unless the document is `by` stack (or predates locations)."""
    by = doc.get("by") or "stack"
    if by == "stack" or "locations" not in doc:
        return doc["sites"], "stack"
    return doc["locations"], by


def collapsed_frames(frames: list[dict], limit: int) -> list[str]:
    """Frame lines of a stack with recursion collapsed (a repeated run printed once with ×N),
    at most `limit` entries, then a line saying how many frames are left."""
    from ..analysis.stacks import collapse_recursion  # noqa: PLC0415

    runs = collapse_recursion(frames)
    out, shown = [], 0
    for run, reps in runs[:limit]:
        shown += len(run) * reps
        if reps == 1:
            out.append(frame_text(run[0]))
        else:
            out += [f"┌ {frame_text(run[0])}" if len(run) > 1 else f"{frame_text(run[0])}  ×{reps}"]
            if len(run) > 1:
                out += [f"│ {frame_text(f)}" for f in run[1:-1]] + [f"└ {frame_text(run[-1])}  ×{reps} (recursion)"]
    if len(frames) > shown:
        out.append(f"... {len(frames) - shown} more frames")
    return out


def findings_text(findings: list[dict] | None, s: Style) -> list[str]:
    """The findings block (reports.analysis.findings): one numbered sentence each, the table it comes
    from in brackets; [] for a document without findings."""
    if not findings:
        return []
    out = [s.bold("Findings")]
    for i, f in enumerate(findings, 1):
        out.append(f"  {i}. {f['text']}" + s.dim(f"  [{f['table']}]"))
    return out + [""]


def location_text(loc: dict) -> str:
    """A location's one-line name: its frame, and '(no symbol...)' when its key is an address
    (stacks.key_quality; a location without line information is its whole function, which
    the missing file:line shows)."""
    f = {k: loc.get(k) for k in LOCATION_FRAME_KEYS} if "function" in loc else loc["frames"][0]
    quality = loc.get("key_quality", "line")
    note = "  (no symbol: one location per address)" if quality == "address" else ""
    if quality == "address" and f.get("module") == "python":  # reports.symbolize.python: not read in time
        note = "  (its code object was freed before the tracer read it: no name or line)"
    return frame_text(f) + note


def folded_text(folded: list[dict]) -> str:
    """The report's `folded` list as one line: what each wrapper pattern folded."""
    parts = []
    for f in folded:
        names = ", ".join(f["functions"]) or "no frame matched"
        src = f"--fold {f['pattern']}" if f["from"] == "--fold" else f"{f['from']} {f['pattern']}"
        parts.append(f"{names} [{src}]")
    return "; ".join(parts)


def equation_text(eq: dict, width: int = 0, after: dict[str, str] | None = None) -> str:
    """An equation of the RSS split (analysis/equations.py) as one line: 'RSS 136.1 MiB = live
    heap since the attach 134.1 MiB + ... + shmem 0 B'; a term of sign −1 is written ' − '.
    `width`: the whole's figure right-aligned to it; `after`: text after a term's figure, by label."""
    after = after or {}
    out = f"{eq['whole_label']} {human_bytes(eq['whole']):>{width}} ="
    for i, t in enumerate(eq["terms"]):
        op = "" if i == 0 and t["sign"] > 0 else (" −" if t["sign"] < 0 else " +")
        out += f"{op} {t['label']} {human_bytes(t['bytes'])}{after.get(t['label'], '')}"
    return out
