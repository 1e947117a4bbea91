"""The target's forked children while recording (issue 53, item 8: "0 B live" on a forking
daemon whose work is in its children, PostgreSQL's backends). allocscope follows one process;
its children are not traced, so a recording must at least say that they are there and busy.

`ChildWatch.poll()`, at the attach and each interval, reads the target's children: those the
probes saw it fork (task:task_newtask, probes/lifetime.bpf.c `forks`: `forked`), those seen
before still there, and at the attach (or at every poll when the target has few threads, or no
probe tells) /proc/PID/task/*/children (every thread's; the /proc scan of every PPid where the
kernel lacks that file). For each, its CPU time (utime + stime) and resident memory; `meta()` is the
`children` key of meta.json: how many were seen, their pids, their CPU during the recording
beside the target's own, their peak RSS. A child that lived between two polls is not seen, but
its CPU is counted once the target has waited for it (the target's cutime + cstime).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..process import procfs

TICK = os.sysconf("SC_CLK_TCK")
MAX_LISTED = 32  # children listed in meta.json (all are counted)
FEW_THREADS = 16  # up to this many threads, every thread's children file is read at each poll


@dataclass
class _Child:
    pid: int
    start: int  # starttime: (pid, start) is one process for life
    comm: str
    exe: str
    cpu0: int  # CPU ticks at the attach: 0 when forked since, else when first seen
    cpu: int  # CPU ticks when last seen
    rss_max: int = 0
    anon_max: int = 0
    alive: bool = True


def _cpu_ticks(fields: list[str]) -> int:
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def _reaped_ticks(fields: list[str]) -> int:
    return int(fields[13]) + int(fields[14])  # cutime, cstime: the children it waited for


def _boot_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICK)  # starttime's clock


class ChildWatch:
    """The children of process `pid` (the target), seen at each poll."""

    def __init__(self, pid: int, forked: Callable[[], tuple[list[int], int]] | None = None) -> None:
        self.pid = pid
        self.forked = forked  # () -> (pids forked since the last call, forks in all)
        self.forks: int | None = None  # forks in all, as the probes counted them (None: not told)
        self.fork_pids: set[int] = set()  # the pids the probes named
        self.children: dict[tuple[int, int], _Child] = {}
        self.polls = 0
        self.own_cpu0: int | None = None
        self.own_cpu = 0
        self.reaped0: int | None = None
        self.reaped = 0
        self.t0 = _boot_ticks()  # children started after this were forked during the recording
        self.scan = not os.path.exists(f"/proc/{pid}/task/{pid}/children")  # no CONFIG_PROC_CHILDREN

    def _child_pids(self) -> set[int]:
        out = {c.pid for c in self.children.values() if c.alive}
        if self.forked is not None:
            try:
                pids, self.forks = self.forked()
                out.update(pids)
                self.fork_pids.update(pids)
            except (OSError, KeyError, ValueError):
                self.forked = None  # read /proc from now on
        if self.forked is not None and self.polls > 1 and not self._few_threads():
            return out  # each thread's children file costs ~0.1 ms: read at the attach only
        if self.scan:
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        if int(procfs.stat_fields(int(d))[1]) == self.pid:
                            out.add(int(d))
                    except (OSError, ValueError, IndexError):
                        pass
            return out
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/children") as f:
                    out.update(int(x) for x in f.read().split())
            except (OSError, ValueError):
                pass
        return out

    def _unseen(self) -> int:
        """Children the probes saw forked that no poll found (each gone within an interval)."""
        if self.forks is None:
            return 0
        seen = {c.pid for c in self.children.values()}
        return len(self.fork_pids - seen) + max(0, self.forks - len(self.fork_pids))

    def _few_threads(self) -> bool:
        try:
            return len(os.listdir(f"/proc/{self.pid}/task")) <= FEW_THREADS
        except OSError:
            return False

    def poll(self) -> None:
        """Read the children now (and the target's own CPU time)."""
        self.polls += 1
        try:
            fields = procfs.stat_fields(self.pid)
            own, reaped = _cpu_ticks(fields), _reaped_ticks(fields)
            if self.own_cpu0 is None or self.reaped0 is None:
                self.own_cpu0, self.reaped0 = own, reaped
            self.own_cpu, self.reaped = own, reaped
        except (OSError, ValueError, IndexError):
            pass
        now = self._child_pids()
        for seen in self.children.values():
            seen.alive = False  # until read again below
        for pid in now:
            try:
                fields = procfs.stat_fields(pid)
                if int(fields[1]) != self.pid or fields[0] == "X":
                    continue  # gone, or its pid reused (a zombie stays: its CPU is not reaped yet)
                key = (pid, int(fields[19]))
                cpu = _cpu_ticks(fields)
                mem = procfs.rss(pid)
                cpu0 = 0 if key[1] >= self.t0 else cpu
                c = self.children.get(key) or _Child(pid, key[1], procfs.comm(pid), procfs.exe(pid), cpu0, cpu)
                self.children[key] = c
            except (OSError, ValueError, IndexError):
                continue
            c.cpu, c.alive = cpu, True
            c.rss_max = max(c.rss_max, mem["rss_bytes"])
            c.anon_max = max(c.anon_max, mem["rss_anon_bytes"])

    def meta(self) -> dict:
        """meta.json's `children`: seen (how many), forked (how many forks the probes counted, the
        attach's included; None without them), unseen (of those, the ones no poll found), alive
        (at the last poll), the target's own CPU seconds during the recording and its children's
        (those alive at the last poll: since the
        attach or their fork, as last read; those gone: what the target's wait for them counted,
        seen or not), their peak RSS and anonymous RSS summed, and the first MAX_LISTED of them
        (pid, comm, exe, cpu_s as last read, rss_max_bytes, alive)."""
        kids = sorted(self.children.values(), key=lambda c: (-(c.cpu - c.cpu0), c.pid))
        alive = sum(c.cpu - c.cpu0 for c in kids if c.alive)
        reaped = self.reaped - (self.reaped0 if self.reaped0 is not None else self.reaped)
        return {
            "seen": len(kids),
            "forked": self.forks,
            "unseen": self._unseen(),
            "alive": sum(c.alive for c in kids),
            "polls": self.polls,
            "target_cpu_s": round((self.own_cpu - (self.own_cpu0 or self.own_cpu)) / TICK, 3),
            "cpu_s": round((alive + reaped) / TICK, 3),
            "rss_max_bytes": sum(c.rss_max for c in kids),
            "anon_max_bytes": sum(c.anon_max for c in kids),
            "listed": [
                {
                    "pid": c.pid,
                    "comm": c.comm,
                    "exe": c.exe,
                    "cpu_s": round((c.cpu - c.cpu0) / TICK, 3),
                    "rss_max_bytes": c.rss_max,
                    "anon_max_bytes": c.anon_max,
                    "alive": c.alive,
                }
                for c in kids[:MAX_LISTED]
            ],
        }
