"""One reader of a process's memory cgroups (cgroup v1's memory controller where the box mounts one,
else cgroup v2): which they are, from its own up to the root, each one's limit, OOM counters and,
on v1, whether it was at its limit. Used by the end of a recording (tracer/process/ending.py: was
an OOM kill the cgroup's or the whole machine's?) and by --metrics (reports/live/prometheus.py,
handed `tightest_limit` by allocscope/cli/listeners.py: `allocscope_cgroup_memory_limit_bytes`).

cgroup v2 counts a cgroup that hit its limit in `memory.events` (`oom`: the limit was reached and
an allocation was about to fail; `oom_kill`). v1 has no such count: `memory.oom_control` has
`oom_kill` (processes of the cgroup killed by any OOM killer) and `under_oom` (a memcg OOM under
way), `memory.failcnt` counts charges refused at the limit (reclaim usually follows, so it rises
on any cgroup that runs full), `memory.max_usage_in_bytes` is its high-water mark. A v1 cgroup
was *at its limit* when a memcg OOM is under way, or when its failcnt rose and its high-water mark
reached the limit (within LIMIT_SLACK): see at_limit().
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"
V1_UNLIMITED = 1 << 62  # memory.limit_in_bytes of a v1 cgroup without a limit (PAGE_COUNTER_MAX pages)
LIMIT_SLACK = 1 << 20  # a v1 high-water mark this close to the limit reached it (charges come in batches)


def memory_cgroup(pid: int) -> tuple[str, str] | None:
    """(the process's memory cgroup path, the hierarchy's mount): cgroup v1's memory controller
    where the box has one, else cgroup v2's unified hierarchy; None without either."""
    v1 = v2 = None
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctrl, path = line.rstrip("\n").split(":", 2)
                if ctrl == "" and line.startswith("0::"):
                    v2 = path or "/"
                elif "memory" in ctrl.split(","):
                    v1 = path or "/"
    except (OSError, ValueError):
        return None
    if v1 is not None and os.path.isdir(os.path.join(CGROUP_ROOT, "memory")):
        return v1, os.path.join(CGROUP_ROOT, "memory")
    if v2 is not None and os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return v2, CGROUP_ROOT
    return None


def chain(pid: int) -> list[tuple[str, str]]:
    """The process's memory cgroups, its own first, up to the root: (path as /proc/PID/cgroup says
    it, its directory); [] without a memory cgroup to read."""
    found = memory_cgroup(pid)
    if found is None:
        return []
    path, mount = found
    out = []
    while True:
        d = mount + (path if path != "/" else "")
        if os.path.isdir(d):
            out.append((path, d))
        if path == "/":
            return out
        path = os.path.dirname(path) or "/"


def _number(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def read_limit(d: str) -> int | None:
    """A memory cgroup's limit in bytes: v2's memory.max, v1's memory.limit_in_bytes (None: none)."""
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            with open(os.path.join(d, name)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if not text.isdigit():
            return None
        return int(text) if int(text) < V1_UNLIMITED else None
    return None


def read_events(d: str) -> dict[str, int]:
    """A memory cgroup's OOM counters: cgroup v2's memory.events; or v1's memory.oom_control
    (`oom_kill`, `under_oom`) with `memory.failcnt` as `failcnt` (and as `oom`, for readers of the
    v2 name) and `memory.max_usage_in_bytes` as `max_usage`; {} when missing."""
    out: dict[str, int] = {}
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(d, name)) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if v.strip().isdigit():
                        out[k] = int(v)
        except OSError:
            continue
        if name == "memory.oom_control":
            for key, file in (("failcnt", "memory.failcnt"), ("max_usage", "memory.max_usage_in_bytes")):
                n = _number(os.path.join(d, file))
                if n is not None:
                    out[key] = n
            if "failcnt" in out:
                out["oom"] = out["failcnt"]
        return out
    return out


def is_v1(events: dict[str, int]) -> bool:
    return "under_oom" in events or "failcnt" in events


def at_limit(limit: int | None, before: dict[str, int], now: dict[str, int]) -> bool:
    """Whether a cgroup with `limit` reached it between `before` and `now` (its read_events()):
    v2, its `oom` count rose; v1, a memcg OOM is under way, or its failcnt rose and its high-water
    mark is at the limit. A cgroup without a limit never is."""
    if limit is None:
        return False
    if not is_v1(now):
        return now.get("oom", 0) > before.get("oom", 0)
    if now.get("under_oom", 0):
        return True
    rose = now.get("failcnt", 0) > before.get("failcnt", 0)
    return rose and now.get("max_usage", 0) >= limit - LIMIT_SLACK


def tightest_limit(pid: int) -> int | None:
    """The tightest memory limit over the process's memory cgroups, its own to the root (None: none)."""
    limits = [lim for _, d in chain(pid) if (lim := read_limit(d)) is not None]
    return min(limits) if limits else None
