"""Formats of the live view (reports.live.model): the full screen of `allocscope top` as lines of
styled segments (allocscope/cli/screen.py draws them with curses), the `--batch` block, and
`record`'s one-line status. No terminal here: a screen is a list of lines, each a list of
(text, style) with style one of STYLES or ""."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.tracefile.names import NOT_LOST

from ..analysis import FrameInfo
from ..render.shared import ASCII_SPARKS, NOUNS, SORT_TITLES, sparkline
from ..units import human_bytes, human_delta, human_rate
from ..wrappers import frame_name
from .model import LiveView

STYLES = ("bold", "dim", "red", "yellow", "green", "cyan", "reverse")
SORTS = ("live", "growth", "peak", "age")  # the order the s key cycles through
MIN_WIDTH, MIN_HEIGHT = 60, 12
BATCH_FRAMES = 3  # innermost frames of a site in a --batch line

Segment = tuple[str, str]
Line = list[Segment]


@dataclass
class ScreenState:
    """What the person at the keyboard chose, and what the session says: everything a screen
    depends on besides the view."""

    target: str = ""  # "pid 4242 (provingd)"
    mode: str = "full"  # "full", "full, sampled 1 per 64 KiB", "residency"
    sort: str = "live"
    threads: bool = False  # the threads view (t)
    selected: int = 0  # the selected row (arrows, j/k)
    expanded: bool = False  # the selected site's full stack (enter)
    frozen: bool = False  # space: the display holds, the recording goes on
    message: str = ""  # set-up progress, a note
    ended: str = ""  # why the recording ended, once it has
    unicode: bool = True


def human_age(s: float | None) -> str:
    """12s, 3m05s, 2h10m; '-' when unknown."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    s = int(s)
    if s < 90:
        return f"{s}s"
    if s < 90 * 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


def age_text(s: float | None, unicode: bool) -> str:
    """The age column: a lower bound, so '≥12s' ('>=12s' without Unicode); '-' when unknown."""
    text = human_age(s)
    return text if text == "-" else ("≥" if unicode else ">=") + text


def frame_short(f: FrameInfo) -> str:
    loc = f" {os.path.basename(f.file)}:{f.line or '?'}" if f.file else ""
    return frame_name(f.function, loc, f.call, f.inside)


def site_text(frames: tuple[FrameInfo, ...], n: int | None = None) -> str:
    """The innermost `n` frames of a site (all when None), innermost first: 'f a.c:3 < g a.c:9'."""
    shown = frames if n is None else frames[:n]
    return " < ".join(frame_short(f) for f in shown) + (" < ..." if n is not None and len(frames) > n else "")


def fit(text: str, width: int) -> str:
    """`text` cut to `width` characters (the cut marked with '~')."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def rate(n: float) -> str:
    return f"{n:.1f}" if n < 100 else f"{n:.0f}"


def mode_text(mode: str, sample_bytes: int = 0, fault_sample: int = 0) -> str:
    if mode == "residency":
        return f"residency, 1 fault in {fault_sample}"
    return f"full, sampled 1 per {human_bytes(sample_bytes)}" if sample_bytes else "full"


def losses_text(view: LiveView) -> str:
    """'lost 0', 'lost 12 (ring_full 12)'; stacks cut short (while an unwind table was built, or
    too deep) are no loss (common/tracefile/names.py NOT_LOST): said after it, ', 37 stacks cut short'."""
    lost = {k: v for k, v in view.losses.items() if k not in NOT_LOST}
    text = "lost 0"
    if lost:
        parts = ", ".join(f"{k.removeprefix('lost_')} {v}" for k, v in sorted(lost.items()))
        text = f"lost {view.lost} ({parts})"
    cut = view.losses.get("lost_stack_pending", 0) + view.losses.get("lost_stack_truncated", 0)
    return text + (f", {cut} stacks cut short" if cut else "")


def allocators_text(view: LiveView) -> str:
    """'alloc jemalloc:_rjem_ 48.0 MiB live / 72.0 MiB retained; glibc ...': each allocator's own
    memory at the last interval (retained = resident in its mappings and not live); '' when
    the recording does not measure it."""
    if not view.allocators:
        return ""
    shown = [a for a in sorted(view.allocators, key=lambda a: -a["resident"]) if a["resident"] or a["live"]]
    return (
        "alloc "
        + "; ".join(f"{a['name']} {human_bytes(a['live'])} live / {human_bytes(a['retained'])} retained" for a in shown)
        if shown
        else ""
    )


def wait_label(w: dict) -> str:
    """A wait place (reports/analysis/waits.py's wait_place) in a few words, named as the report
    names it: 'channel_push', 'inside redis-check-rdb, called from aeMain'."""
    return frame_name(w["function"], "", w.get("call"), w.get("inside"))


def waiting_text(view: LiveView, n: int = 3) -> str:
    """'waiting: channel_push 8 thr holding 64.0 MiB (longest 3.2s); sem_wait 3 thr 768 B': the
    threads blocked now by where they wait (reports/analysis/waits.py's folding) and what they hold; ''
    when none is blocked (or waits are not traced)."""
    if not view.waiting:
        return ""
    parts = [
        f"{wait_label(w)} {w['threads']} thr holding {human_bytes(w['held_bytes'])} (longest {w['longest_s']:.1f}s)"
        for w in view.waiting[:n]
    ]
    more = f"; +{len(view.waiting) - n} more" if len(view.waiting) > n else ""
    return "waiting: " + "; ".join(parts) + more


# --- --batch ----------------------------------------------------------------------------------


def batch_block(view: LiveView, sort: str, top: int, clock: str) -> str:
    """One interval as a compact block: a line of totals (wall clock, seconds since the attach,
    RSS, live and its change, heap/mmap/GPU, losses), then the `top` sites by `sort`, one line
    each: live, change since the last interval, peak, growth rate and verdict, oldest block age
    (lower bound), allocations/s, the thread holding most, the innermost frames."""
    r = view.row
    live_delta = (view.timeline_live[-1] - view.timeline_live[-2]) if len(view.timeline_live) > 1 else None
    rss = r.get("rss_bytes", -1)
    head = (
        f"== {clock} +{view.elapsed_s:.1f}s  RSS {human_bytes(rss) if rss >= 0 else '-'} "
        f"(peak {human_bytes(view.rss_peak_bytes)})  live {human_bytes(r.get('live_bytes', 0))}"
        + (f" ({human_delta(live_delta)})" if live_delta is not None else "")
        + f"  heap {human_bytes(r.get('heap_live_bytes', 0))}  mmap {human_bytes(r.get('mmap_live_bytes', 0))}"
        + (f"  GPU {human_bytes(r['device_live_bytes'])}" if r.get("device_live_bytes") else "")
        + f"  {losses_text(view)}"
        + ("  [final]" if view.final else "")
    )
    kept = allocators_text(view)
    ranked = view.ranked(sort)
    shown = f"top {top} of {len(ranked)}" if len(ranked) > top else f"{len(ranked)}"  # as the report's "Top N of M"
    out = [head, f"   {shown} {NOUNS[view.by]} by {SORT_TITLES[sort]}"]
    if ranked:
        out.append(
            f"   {'LIVE':>10}  {'CHANGE':>10}  {'PEAK':>10}  {'GROWTH/s':>12}  {'VERDICT':<9}  {'AGE':>8}  "
            f"{'ALLOC/s':>8}  {'THREAD':<15}  {COLUMN[view.by]}"
        )
    for s in ranked[:top]:
        out.append(
            f"   {human_bytes(s['live_bytes']):>10}  {human_delta(s['delta_bytes']):>10}  "
            f"{human_bytes(s['peak_live_bytes']):>10}  {human_rate(s['growth_bytes_per_s']):>12}  "
            f"{s['verdict']:<9}  {age_text(s['oldest_age_s'], False):>8}  {rate(s['allocs_per_s']):>8}  "
            f"{fit(s['top_thread'], 15):<15}  {site_text(s['site'], BATCH_FRAMES)}"
        )
    if kept:
        out.append(f"   {kept}")
    waiting = waiting_text(view)
    if waiting:
        out.append(f"   {waiting}")
    return "\n".join(out) + "\n"


# --- record's status line ---------------------------------------------------------------------


def status_text(
    elapsed_s: float, row: dict, lost: int, top: tuple[tuple[FrameInfo, ...], int] | None, width: int
) -> str:
    """`record`'s one-line live status: elapsed, RSS, live, lost, the stack holding most."""
    rss = row.get("rss_bytes", -1)
    text = (
        f"allocscope: {human_age(elapsed_s)}  RSS {human_bytes(rss) if rss >= 0 else '-'}  "
        f"live {human_bytes(row.get('live_bytes', 0))}  lost {lost}"
    )
    if top is not None:
        frames, live = top
        text += f"  top: {frame_short(frames[0]) if frames else '?'} {human_bytes(live)}"
    return fit(text, width)


# --- the full screen ----------------------------------------------------------------------------

COLUMN = {"location": "LOCATION", "function": "FUNCTION", "stack": "SITE"}


def _columns(threads: bool, unicode: bool, by: str = "stack") -> list[tuple[str, int, str, Callable[[dict], Segment]]]:
    """(header, width, align, cell(row) -> (text, style)) of the table; the last column takes
    what is left."""
    if threads:
        return [
            ("TID", 8, "r", lambda t: (str(t["tid"]), "")),
            ("THREAD", 16, "l", lambda t: (t["name"], "")),
            ("LIVE", 10, "r", lambda t: (human_bytes(t["live_bytes"]), "bold")),
            ("CHANGE", 10, "r", lambda t: (human_delta(t["delta_bytes"]), _delta_style(t["delta_bytes"]))),
            ("ALLOC/s", 8, "r", lambda t: (rate(t["allocs_per_s"]), "")),
            (COLUMN[by] + "S", 6, "r", lambda t: (str(t["sites"]), "")),
            ("TOP " + COLUMN[by], 0, "l", lambda t: (site_text(t["top_site"]), "")),
        ]
    return [
        ("#", 3, "r", lambda s: (str(s["rank"]), "")),
        ("LIVE", 10, "r", lambda s: (human_bytes(s["live_bytes"]), "bold")),
        ("CHANGE", 10, "r", lambda s: (human_delta(s["delta_bytes"]), _delta_style(s["delta_bytes"]))),
        ("PEAK", 10, "r", lambda s: (human_bytes(s["peak_live_bytes"]), "")),
        ("GROWTH/s", 11, "r", lambda s: (human_rate(s["growth_bytes_per_s"]), "")),
        ("VERDICT", 9, "l", lambda s: (s["verdict"], VERDICT_STYLES.get(s["verdict"], ""))),
        ("AGE", 7, "r", lambda s: (age_text(s["oldest_age_s"], unicode), "")),
        ("ALLOC/s", 8, "r", lambda s: (rate(s["allocs_per_s"]), "")),
        ("THREAD", 12, "l", lambda s: (s["top_thread"], "")),
        *([("STACKS", 6, "r", lambda s: (str(s["n_stacks"]), ""))] if by != "stack" else []),
        ("SITE (innermost first)" if by == "stack" else COLUMN[by], 0, "l", lambda s: (site_text(s["site"]), "")),
    ]


# narrow terminals drop these columns first, in this order
DROP_ORDER = ("STACKS", "PEAK", "GROWTH/s", "AGE", "ALLOC/s", "THREAD", "SITES", "LOCATIONS", "FUNCTIONS", "CHANGE")
VERDICT_STYLES = {"growing": "red", "plateaued": "yellow", "new": "cyan", "transient": "dim", "freed": "dim"}
SITE_MIN = 36  # characters the last column keeps before others are dropped (a function and its file:line)


def _delta_style(n: int) -> str:
    return "red" if n > 0 else "green" if n < 0 else "dim"


def _table(
    rows: list[dict], threads: bool, state: ScreenState, width: int, height: int, by: str = "stack"
) -> list[Line]:
    cols = _columns(threads, state.unicode, by)
    for name in DROP_ORDER:
        if sum(c[1] + 2 for c in cols[:-1]) + SITE_MIN <= width:
            break
        cols = [c for c in cols if c[0] != name]
    last = max(0, width - sum(c[1] + 2 for c in cols[:-1]))
    cols = [*cols[:-1], (cols[-1][0], last, "l", cols[-1][3])]

    def cells(texts: list[Segment]) -> Line:
        line: Line = []
        for (_, w, align, _), (text, style) in zip(cols, texts):
            text = fit(text, w)
            line.append(((text.rjust(w) if align == "r" else text.ljust(w)) + "  ", style))
        return line

    out = [[(seg[0], "reverse") for seg in cells([(c[0], "") for c in cols])]]
    room = max(0, height - 1)
    first = max(0, state.selected - room + 1)
    for i, r in enumerate(rows[first : first + room], first):
        line = cells([c[3](r) for c in cols])
        out.append([(t, "reverse") for t, _ in line] if i == state.selected else line)
    return out


def _header(view: LiveView | None, state: ScreenState, width: int) -> list[Line]:
    title = [("allocscope top", "bold"), (f"  {state.target}", "")]
    if view is None:
        return [title, [(state.message or "starting...", "yellow")]]
    r = view.row
    title += [
        (f"  {view.allocator}" if view.allocator else "", "dim"),
        (f"  mode {state.mode}", ""),
        (f"  {human_age(view.elapsed_s)}", "bold"),
        (f"  #{view.seq}", "dim"),
    ]
    if state.frozen:
        title.append(("  FROZEN (space)", "reverse"))
    rss = r.get("rss_bytes", -1)
    split = "  ".join(f"{k} {human_bytes(max(0, r.get(f'rss_{k}_bytes', 0)))}" for k in ("anon", "file", "shmem"))
    mem = [
        ("RSS ", ""),
        (human_bytes(rss) if rss >= 0 else "-", "bold"),
        (f"  peak {human_bytes(view.rss_peak_bytes)}", ""),
        (f"  {split}", "dim"),
    ]
    live = [
        ("live ", ""),
        (human_bytes(r.get("live_bytes", 0)), "bold"),
        (f"  heap {human_bytes(r.get('heap_live_bytes', 0))}  mmap {human_bytes(r.get('mmap_live_bytes', 0))}", ""),
    ]
    if r.get("device_live_bytes"):
        live.append((f"  GPU {human_bytes(r['device_live_bytes'])}", "cyan"))
    live.append(("  " + losses_text(view), "red" if view.losses else "dim"))
    kept = allocators_text(view)
    n = max(8, width - 16)
    rss_line, live_line = view.timeline_rss[-n:], view.timeline_live[-n:]
    hi = max([*rss_line, *live_line, 1])
    chars = None if state.unicode else ASCII_SPARKS
    spark: dict[str, Any] = {"lo": 0, "hi": hi, **({"chars": chars} if chars else {})}
    waiting = waiting_text(view)
    return [
        title,
        mem,
        live,
        *([[(kept, "")]] if kept else []),
        *([[(waiting, "yellow")]] if waiting else []),
        [("RSS  ", "dim"), (sparkline(rss_line, **spark), "green"), (f" {human_bytes(max(0, rss))}", "dim")],
        [("live ", "dim"), (sparkline(live_line, **spark), "cyan"), (f" {human_bytes(r.get('live_bytes', 0))}", "dim")],
    ]


def _stack(view: LiveView, site: dict, state: ScreenState, height: int) -> list[Line]:
    """The selected row's full stack (for a location, the first stack seen reaching it, and how
    many do), folded frames dim, and the threads holding it."""
    full, folded = site["full_frames"], len(site["full_frames"]) - len(site.get("stack") or site["site"])
    noun = NOUNS[view.by][:-1]
    out: list[Line] = [
        [(f"{noun} #{site['rank']} by {SORT_TITLES[state.sort]}: ", "bold"), (site_text(site["site"], 1), "bold")]
        + (
            [(f"  reached by {site['n_stacks']} stacks; the first seen:", "dim")]
            if view.by != "stack" and site.get("n_stacks", 1) > 1
            else []
        ),
        [
            (
                f"live {human_bytes(site['live_bytes'])}  peak {human_bytes(site['peak_live_bytes'])}  "
                f"{site['live_count']} blocks  {site['verdict']} {human_rate(site['growth_bytes_per_s'])}  "
                f"age {age_text(site['oldest_age_s'], state.unicode)}  {rate(site['allocs_per_s'])} allocs/s",
                "",
            )
        ],
        [(f"full stack, innermost first (dim: folded out of the {noun})  enter: back", "dim")],
    ]
    holders = ", ".join(f"{view.names.get(t, '?')} ({t}) {human_bytes(b)}" for t, b in site["threads"][:6])
    room = max(1, height - len(out) - 1)
    for i, f in enumerate(full[:room]):
        mod = os.path.basename(f.module or "")
        out.append(
            [
                (
                    f"  {i:>3}  {frame_short(f)}"
                    + (f"  [{mod}]" if mod else "")
                    + ("  (inlined)" if f.inlined else ""),
                    "dim" if i < folded else "",
                )
            ]
        )
    if len(full) > room:
        out.append([(f"  ... {len(full) - room} more frames", "dim")])
    out.append([("threads holding it: ", "bold"), (holders or "-", "")])
    return out


def keys_text(unicode: bool) -> str:
    enter, arrows = ("⏎", "↑↓/jk") if unicode else ("enter", "j/k")
    return f"s sort  t threads  {enter} stack  {arrows} select  space freeze  q quit"


def screen_lines(view: LiveView | None, state: ScreenState, width: int, height: int) -> list[Line]:
    """The whole screen, `height` lines at most, each fitting `width` characters."""
    if width < MIN_WIDTH or height < MIN_HEIGHT:
        lines = [
            [(f"terminal too small: {width}x{height}", "reverse")],
            [(f"allocscope top needs {MIN_WIDTH}x{MIN_HEIGHT}", "")],
        ]
        if state.ended:
            lines.append([(state.ended, "yellow")])
        return _clip(lines, width, height)
    lines = _header(view, state, width)
    footer: list[Line] = []
    if state.ended:
        footer.append([(state.ended, "reverse")])
    elif state.message and view is not None:
        footer.append([(state.message, "yellow")])
    footer.append([(keys_text(state.unicode), "dim")])
    room = height - len(lines) - len(footer) - 1
    if view is not None:
        if state.threads:
            state.selected = max(0, min(state.selected, len(view.threads) - 1))
            lines.append([(f"threads by live bytes ({len(view.threads)})", "bold"), (f"   t: {NOUNS[view.by]}", "dim")])
            lines += _table(view.threads, True, state, width, room, view.by)
        else:
            ranked = view.ranked(state.sort)
            state.selected = max(0, min(state.selected, len(ranked) - 1))
            if state.expanded and ranked:
                lines += _stack(view, ranked[state.selected], state, room + 1)
            else:
                lines.append(
                    [
                        (f"{NOUNS[view.by]} by {SORT_TITLES[state.sort]} ({len(ranked)})", "bold"),
                        (f"   sort: {state.sort}   s: next sort", "dim"),
                    ]
                )
                lines += _table(ranked, False, state, width, room, view.by)
    lines = lines[: height - len(footer)]
    lines += [[]] * (height - len(lines) - len(footer)) + footer
    return _clip(lines, width, height)


def _clip(lines: list[Line], width: int, height: int) -> list[Line]:
    """Every line cut to `width` characters, at most `height` lines."""
    out = []
    for line in lines[:height]:
        left, cut = width, []
        for text, style in line:
            if left <= 0:
                break
            text = text[:left]
            cut.append((text, style))
            left -= len(text)
        out.append(cut)
    return out


def screen_text(lines: list[Line]) -> str:
    """A screen as plain text without its empty lines (the last frame, printed when the view
    closes; tests)."""
    text = ("".join(t for t, _ in line).rstrip() for line in lines)
    return "".join(t + "\n" for t in text if t)
