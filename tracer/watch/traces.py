"""The watch's traces on disk: their names (COMM-PID-DATE-TIME.allocscope), which of DIR's entries
are traces, and their rotation (--max-traces: those of killed and OOM-killed incarnations last)."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable

from common.tracefile import format as F

ROTATING = threading.Lock()  # processes followed at once start their traces at once: one rotation at a time


def trace_name(comm: str, pid: int, wall: float) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", comm) or "target"
    return f"{safe}-{pid}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(wall))}.allocscope"


def is_trace(path: str) -> bool:
    try:
        with open(os.path.join(path, F.META), "rb") as f:
            return b'"allocscope.trace"' in f.read(4096)
    except OSError:
        return False


def traces_in(out_dir: str) -> list[str]:
    """The traces under out_dir, oldest first (by their names' time, then mtime)."""
    found = []
    for n in os.listdir(out_dir):
        p = os.path.join(out_dir, n)
        if n.endswith(".allocscope") and os.path.isdir(p) and not os.path.islink(p) and is_trace(p):
            found.append((os.stat(p).st_mtime, p))
    return [p for _, p in sorted(found)]


FAILED_ENDS = ("killed", "oom_killed")  # what rotation keeps longest: the nights that went wrong


def ended_badly(path: str) -> bool:
    """The trace's incarnation was killed or OOM-killed (meta.json `end.reason`)."""
    try:
        with open(os.path.join(path, F.META)) as f:
            end = json.load(f).get("end")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(end, dict) and end.get("reason") in FAILED_ENDS


def rotate(out_dir: str, max_traces: int, progress: Callable[[str], None], busy: Iterable[str] = ()) -> list[str]:
    """Remove old traces so that a new one makes at most max_traces: the oldest of those whose
    incarnation ended well (exited, exec'd, stopped, not complete) first, then the oldest of the
    killed and OOM-killed, so that a night's failure outlives the restarts after it. Only
    directories that are allocscope traces are ever removed, never one being written (`busy`:
    the other processes followed now). Returns what was removed."""
    with ROTATING:
        return _rotate(out_dir, max_traces, progress, {os.path.realpath(p) for p in busy})


def _rotate(out_dir: str, max_traces: int, progress: Callable[[str], None], busy: set[str]) -> list[str]:
    old = [p for p in traces_in(out_dir) if os.path.realpath(p) not in busy]
    excess = min(len(old), max(0, len(old) + len(busy) - (max_traces - 1)))
    if not excess:
        return []
    bad = {p for p in old if ended_badly(p)}
    gone = ([p for p in old if p not in bad] + [p for p in old if p in bad])[:excess]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
        for extra in (p + ".old",):
            if os.path.isdir(extra) and is_trace(extra):
                shutil.rmtree(extra, ignore_errors=True)
    kept = len(bad - set(gone))
    progress(
        f"rotated out {len(gone)} old trace(s) (--max-traces {max_traces})"
        + (f"; {kept} of killed or OOM-killed incarnations kept longest" if kept else "")
    )
    return gone
