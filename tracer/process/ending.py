"""How the target ended, from the kernel: its wait status (exit code or fatal signal) and whether
the OOM killer chose it, and in which memory cgroup, at what limit.

* The wait status of a process that is not our child: a pidfd opened while it ran answers
  PIDFD_GET_INFO with PIDFD_INFO_EXIT once it is reaped (Linux 6.15); before that, while it is a
  zombie, /proc/PID/stat's field 52 holds it (Linux 3.5). A launched command's comes from waitpid.
* An OOM kill: the target's memory cgroups, its own up to the root, are read when the recording
  starts (`CgroupWatch`, read by tracer/process/cgroups.py; cgroup v1's memory controller where
  the box mounts one, else v2): each one's limit and OOM counters (v2 `memory.events`; v1
  `memory.oom_control`'s `oom_kill` and `under_oom`, `memory.failcnt`, `memory.max_usage_in_bytes`).
  A target killed by SIGKILL whose own cgroup's `oom_kill` rose meanwhile was killed by an OOM
  killer: `scope` "cgroup" with the deepest cgroup that reached its limit (cgroups.at_limit),
  "global" only when none did (the machine was out of memory). A SIGKILL with no OOM kill
  counted there is "killed"; so is one on a box without a memory cgroup to read (an OOM kill
  elsewhere must not name this process). A target moved to another cgroup while recorded is
  followed there (CgroupWatch.follow, at each snapshot).
* Better, where the recording watched the kernel's oom:mark_victim (tracer/bpf/oom.py): the OOM
  killer's own mark of its victim. The target's pid (or a thread's) marked: OOM-killed, with the
  kernel's figures of its memory at the kill (`oom.victim`), whatever the counters say; not marked:
  not an OOM kill, even when another process of the same cgroup was the one chosen meanwhile
  (`oom.told_by` says which of the two told it).
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import time
from dataclasses import dataclass, field

from .cgroups import CGROUP_ROOT, V1_UNLIMITED, at_limit, chain, memory_cgroup, read_events, read_limit
from .procfs import stat_fields

PIDFD_INFO_EXIT = 1 << 3
PIDFD_INFO_SIZE = 64  # PIDFD_INFO_SIZE_VER0: mask, cgroupid, 11 ids, exit_code
PIDFD_GET_INFO = (3 << 30) | (PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11  # _IOWR(PIDFS_IOCTL_MAGIC, 11, ...)
REASONS = ("exited", "killed", "oom_killed", "exec", "stopped")


def pidfd_exit_status(fd: int) -> int | None:
    """The wait status of the process behind pidfd `fd` once reaped (None: not reaped yet, or a
    kernel without PIDFD_INFO_EXIT)."""
    buf = bytearray(struct.pack("<Q", PIDFD_INFO_EXIT) + bytes(PIDFD_INFO_SIZE - 8))
    try:
        fcntl.ioctl(fd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    (mask,) = struct.unpack_from("<Q", buf, 0)
    if not mask & PIDFD_INFO_EXIT:
        return None
    return struct.unpack_from("<i", buf, 60)[0]


def zombie_exit_status(pid: int, start: int) -> int | None:
    """The wait status of `pid` while it is a zombie (its start time `start` guards against reuse)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        if fields[0] != "Z" or (start and int(fields[19]) != start):
            return None
        return int(fields[49])
    except (IndexError, ValueError):
        return None


def exit_status(fd: int, pid: int, start: int, wait_s: float = 0.5) -> int | None:
    """The wait status of an ended process, by its pidfd (-1: none) or as a zombie; a zombie being
    reaped right now is asked again for up to `wait_s`."""
    end = time.monotonic() + wait_s
    while True:
        if fd >= 0:
            st = pidfd_exit_status(fd)
            if st is not None:
                return st
        st = zombie_exit_status(pid, start)
        if st is not None or time.monotonic() >= end or fd < 0:
            return st
        time.sleep(0.01)


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def vm_oom_kills() -> int:
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


PF_EXITING = 0x4  # include/linux/sched.h: set as do_exit() begins, before cgroup_exit()


def running(pid: int) -> bool:
    """The process is running and has not begun to exit (its /proc/PID/stat: not a zombie, no
    PF_EXITING)."""
    try:
        f = stat_fields(pid)
        return f[0] not in ("Z", "X", "x") and not int(f[6]) & PF_EXITING
    except (OSError, ValueError, IndexError):
        return False


@dataclass
class Cgroup:
    path: str  # as /proc/PID/cgroup says it ("/" the root)
    limit: int | None
    events: dict[str, int]
    dir: str = ""  # where its files are


@dataclass
class CgroupWatch:
    """The target's memory cgroups (its own first) and the machine's OOM kill count, as they were
    when the recording started; `oom()` compares them with now."""

    cgroups: list[Cgroup] = field(default_factory=list)
    vm_oom_kill: int = 0

    @classmethod
    def of(cls, pid: int) -> CgroupWatch:
        return cls([Cgroup(path, read_limit(d), read_events(d), d) for path, d in chain(pid)], vm_oom_kills())

    def follow(self, pid: int) -> bool:
        """The target moved to another memory cgroup since (a pid written into cgroup.procs after
        its start): its cgroups now, those new to us counted from now. True when they changed.
        A process that has begun to exit is not followed: the kernel moves it to the root cgroup
        as it exits (cgroup v1's /proc/PID/cgroup says "memory:/" from then on), and an OOM kill
        told from the root would be the whole machine's (issue 50's soak: 2 of 9 cgroup OOM kills
        called global, the snapshot come while the victim was exiting)."""
        now = chain(pid)
        if not now or [p for p, _ in now] == [g.path for g in self.cgroups] or not running(pid):
            return False  # running() read after chain(): a chain read before the exit began
        known = {g.path: g for g in self.cgroups}
        self.cgroups = [known.get(p) or Cgroup(p, read_limit(d), read_events(d), d) for p, d in now]
        return True

    def limit(self) -> tuple[str, int] | None:
        """The tightest memory limit over the target (the cgroup and its bytes), None when none."""
        limited = [(g.limit, g.path) for g in self.cgroups if g.limit is not None]
        if not limited:
            return None
        lim, path = min(limited)
        return path, lim

    def scope(self) -> dict:
        """Where an OOM kill came from: the deepest of the target's cgroups that reached its limit
        since the start (tracer/process/cgroups.py at_limit: v2 its `oom` count rose; v1 a memcg
        OOM under way, or its failcnt rose with its high-water mark at the limit), else the whole
        machine: "global" only when no memory cgroup of the target was at its limit."""
        for g in self.cgroups:
            if at_limit(g.limit, g.events, read_events(g.dir)):
                return {"scope": "cgroup", "cgroup": g.path, "limit_bytes": g.limit}
        return {"scope": "global", "cgroup": None, "limit_bytes": None}

    def oom(self) -> dict | None:
        """`recording.end.oom` when the kernel counted an OOM kill in the target's own memory
        cgroup since the start (any OOM killer: the cgroup's or the machine's), else None. Without
        a memory cgroup to read nothing is claimed: another process's OOM kill elsewhere on the
        box must not name this one."""
        if not self.cgroups:
            return None
        leaf = self.cgroups[0]
        if read_events(leaf.dir).get("oom_kill", 0) <= leaf.events.get("oom_kill", 0):
            return None
        return self.scope() | {"told_by": "cgroup_counters"}


@dataclass
class OomMark:
    """What the kernel's oom:mark_victim said of the target while it was watched: `victim` (its
    mark, tracer/bpf/oom.py) or None (the OOM killer did not choose it)."""

    victim: dict | None


def _oom(watch: CgroupWatch | None, mark: OomMark | None) -> dict | None:
    """`end.oom` of a target that died of SIGKILL (or of an unknown status), None: not an OOM kill.
    The kernel's mark decides where it was watched; else the cgroup's counters."""
    if mark is not None:
        if mark.victim is None:
            return None
        where = (
            watch.scope()
            if watch is not None and watch.cgroups
            else {"scope": None, "cgroup": None, "limit_bytes": None}
        )
        return where | {"told_by": "mark_victim", "victim": mark.victim}
    return watch.oom() if watch is not None else None


def describe_end(
    reason: str,
    status: int | None,
    watch: CgroupWatch | None,
    when_s: float | None = None,
    mark: OomMark | None = None,
) -> dict:
    """meta.json's `end`: {"reason", "exit_code", "signal", "oom", "time"} from the recorder's
    reason ("target exited", "duration", "target exec'd...", a signal's name...), the target's
    wait status (None: not known) and, where oom:mark_victim was watched, its `mark`."""
    out: dict = {"reason": "stopped", "exit_code": None, "signal": None, "oom": None, "time": when_s}
    if reason.startswith("target exec"):
        out["reason"] = "exec"
        return out
    if reason != "target exited":
        return out  # --duration, a signal to the tracer, the target still running
    out["reason"] = "exited"
    if status is not None:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            out["signal"] = signal_name(sig)
            out["reason"] = "killed"
            if sig == signal.SIGKILL:
                oom = _oom(watch, mark)
                if oom is not None:
                    out["reason"], out["oom"] = "oom_killed", oom
        elif os.WIFEXITED(status):
            out["exit_code"] = os.WEXITSTATUS(status)
    elif mark is not None or (watch is not None and watch.cgroups):
        # no wait status (an older kernel, reaped already): the kernel's mark, or its count of
        # OOM kills in the target's own cgroup, still tells one
        oom = _oom(watch, mark)
        if oom is not None:
            out.update(reason="oom_killed", signal="SIGKILL", oom=oom)
    return out


__all__ = [
    "CGROUP_ROOT",
    "REASONS",
    "V1_UNLIMITED",
    "Cgroup",
    "CgroupWatch",
    "OomMark",
    "describe_end",
    "memory_cgroup",
    "read_events",
    "read_limit",
]
