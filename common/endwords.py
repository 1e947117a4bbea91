"""The words for an OOM kill (`recording.end.oom`), one wording for the report's header and
findings (reports/analysis/ending.py) and the watch's line at each end (tracer/watch/watcher.py)."""

from __future__ import annotations

from collections.abc import Iterable

from .units import human_bytes


def oom_text(oom: dict, more: Iterable[str] = ()) -> str:
    """'OOM-killed by the memory cgroup /x (limit 2.0 GiB)', 'OOM-killed (the whole machine was
    out of memory)', or 'OOM-killed' (the kernel marked it; no memory cgroup to say where); `more`
    adds clauses inside the parentheses."""
    head, parts = "OOM-killed", []
    if oom.get("scope") == "cgroup":
        head += f" by the memory cgroup {oom.get('cgroup')}"
        if oom.get("limit_bytes"):
            parts.append(f"limit {human_bytes(oom['limit_bytes'])}")
    elif oom.get("scope") == "global":
        parts.append("the whole machine was out of memory")
    parts += more
    return head + (f" ({', '.join(parts)})" if parts else "")
