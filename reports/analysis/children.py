"""The target's forked children (issue 53, item 8). allocscope follows one process; a daemon that
forks workers (PostgreSQL's backends, a prefork server) does its allocating in them, and its own
recording says "0 B live" with nothing wrong in it. The recording counts the children it saw
(meta.json `children`, tracer/record/children.py); the report says, at the top, when the work
was theirs: `recording.children` in the JSON, a line in `recording.warnings`.
"""

from __future__ import annotations

from ..units import human_bytes

BUSY_S = 0.05  # children's CPU seconds under which they are not said to do the work
PIDS_SHOWN = 8


def children_summary(meta: dict) -> dict | None:
    """meta.json's `children` with `work_in_children`: True when the children used at least
    BUSY_S of CPU during the recording and at least as much as the target itself. None when the
    recording did not look (an older trace), or saw no child and the target reaped none that used
    BUSY_S of CPU (children living between two reads are known by the CPU the target reaped)."""
    info = meta.get("children")
    if not isinstance(info, dict):
        return None
    cpu, own = float(info.get("cpu_s") or 0), float(info.get("target_cpu_s") or 0)
    if not info.get("seen") and not info.get("unseen") and cpu < BUSY_S:
        return None
    return {**info, "work_in_children": cpu >= BUSY_S and cpu >= own}


def children_warnings(summary: dict | None) -> list[str]:
    """The line said at the top of the report when the work is in the children, else []."""
    if not summary or not summary["work_in_children"]:
        return []
    listed = summary.get("listed") or []
    pids = [str(c["pid"]) for c in listed[:PIDS_SHOWN]]
    unseen = int(summary.get("unseen") or 0)
    more = summary["seen"] - len(pids) + unseen
    n = summary["seen"] + unseen
    cpu = f"{summary['cpu_s']:.2f}s of CPU against {summary['target_cpu_s']:.2f}s in the target"
    what = f"{n} forked {'child' if n == 1 else 'children'}" if n else "forked children"
    if not pids:  # each lived between two of the recorder's reads: known by the CPU the target reaped
        return [
            f"the work is in {what}, each gone within an interval ({cpu}); "
            "allocscope follows one process: record a longer-lived child with --pid, "
            "or the program in a mode where it does not fork"
        ]
    return [
        f"the work is in {what} "
        f"(pids {', '.join(pids)}{f' and {more} more' if more > 0 else ''}): {cpu}, "
        f"their own memory up to {human_bytes(summary.get('anon_max_bytes') or 0)} (anonymous RSS); "
        f"allocscope follows one process: record a child with --pid {pids[0]}, "
        "or the program in a mode where it does not fork"
    ]
