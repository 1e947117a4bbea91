"""How the target ended, from the kernel: its wait status (exit code or fatal signal) and whether
the OOM killer chose it, and in which memory cgroup, at what limit.

* The wait status of a process that is not our child: a pidfd opened while it ran answers
  PIDFD_GET_INFO with PIDFD_INFO_EXIT once it is reaped (Linux 6.15); before that, while it is a
  zombie, /proc/PID/stat's field 52 holds it (Linux 3.5). A launched command's comes from waitpid.
* An OOM kill: the memory cgroups from the target's own up to the root are read when the
  recording starts (`CgroupWatch`): each one's `memory.max` and `memory.events` (`oom`: the
  cgroup hit its limit and reclaim failed; `oom_kill`: processes in it killed by an OOM killer),
  and /proc/vmstat's `oom_kill` (every OOM kill of the machine). A target killed by SIGKILL whose
  cgroup's `oom_kill` rose meanwhile was killed by the OOM killer: `scope` "cgroup" with the
  deepest cgroup whose `oom` rose and that has a limit (the one that was full), "global" when
  none did (the whole machine was out of memory). A SIGKILL with no OOM kill counted is "killed".
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import time
from dataclasses import dataclass, field

PIDFD_INFO_EXIT = 1 << 3
PIDFD_INFO_SIZE = 64  # PIDFD_INFO_SIZE_VER0: mask, cgroupid, 11 ids, exit_code
PIDFD_GET_INFO = (3 << 30) | (PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11  # _IOWR(PIDFS_IOCTL_MAGIC, 11, ...)
CGROUP_ROOT = "/sys/fs/cgroup"
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


def read_events(path: str) -> dict[str, int]:
    """A cgroup's memory.events (missing: {})."""
    out: dict[str, int] = {}
    try:
        with open(os.path.join(path, "memory.events")) as f:
            for line in f:
                k, _, v = line.partition(" ")
                out[k] = int(v)
    except (OSError, ValueError):
        return {}
    return out


def read_limit(path: str) -> int | None:
    """A cgroup's memory.max in bytes (None: "max", or not a memory cgroup)."""
    try:
        with open(os.path.join(path, "memory.max")) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def vm_oom_kills() -> int:
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def cgroup_of(pid: int) -> str | None:
    """The target's cgroup v2 path ("/system.slice/x.service"), None without cgroup v2."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip() or "/"
    except OSError:
        return None
    return None


@dataclass
class Cgroup:
    path: str  # as /proc/PID/cgroup says it ("/" the root)
    limit: int | None
    events: dict[str, int]


@dataclass
class CgroupWatch:
    """The target's memory cgroups (its own first) and the machine's OOM kill count, as they were
    when the recording started; `end()` compares them with now."""

    cgroups: list[Cgroup] = field(default_factory=list)
    vm_oom_kill: int = 0

    @classmethod
    def of(cls, pid: int) -> CgroupWatch:
        path = cgroup_of(pid)
        groups = []
        while path is not None:
            d = CGROUP_ROOT + (path if path != "/" else "")
            if os.path.isdir(d):
                groups.append(Cgroup(path, read_limit(d), read_events(d)))
            if path == "/":
                break
            path = os.path.dirname(path) or "/"
        return cls(groups, vm_oom_kills())

    def limit(self) -> tuple[str, int] | None:
        """The tightest memory limit over the target (the cgroup and its bytes), None when none."""
        limited = [(g.limit, g.path) for g in self.cgroups if g.limit is not None]
        if not limited:
            return None
        lim, path = min(limited)
        return path, lim

    def oom(self) -> dict | None:
        """`recording.end.oom` when an OOM kill was counted over the target since the start, else None."""
        if not self.cgroups:
            killed = vm_oom_kills() > self.vm_oom_kill
            return {"scope": "global", "cgroup": None, "limit_bytes": None} if killed else None
        leaf = self.cgroups[0]
        now = read_events(CGROUP_ROOT + (leaf.path if leaf.path != "/" else ""))
        if now.get("oom_kill", 0) <= leaf.events.get("oom_kill", 0) and vm_oom_kills() <= self.vm_oom_kill:
            return None
        for g in self.cgroups:  # the deepest one that hit its limit
            d = CGROUP_ROOT + (g.path if g.path != "/" else "")
            if g.limit is not None and read_events(d).get("oom", 0) > g.events.get("oom", 0):
                return {"scope": "cgroup", "cgroup": g.path, "limit_bytes": g.limit}
        return {"scope": "global", "cgroup": None, "limit_bytes": None}


def describe_end(reason: str, status: int | None, watch: CgroupWatch | None, when_s: float | None = None) -> dict:
    """meta.json's `end`: {"reason", "exit_code", "signal", "oom", "time"} from the recorder's
    reason ("target exited", "duration", "target exec'd...", a signal's name...) and the target's
    wait status (None: not known)."""
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
            if sig == signal.SIGKILL and watch is not None:
                oom = watch.oom()
                if oom is not None:
                    out["reason"], out["oom"] = "oom_killed", oom
        elif os.WIFEXITED(status):
            out["exit_code"] = os.WEXITSTATUS(status)
    elif watch is not None and watch.cgroups:
        # no wait status (an older kernel, reaped already): the kernel's count of OOM kills in the
        # target's own cgroup still tells one
        oom = watch.oom()
        if oom is not None:
            out.update(reason="oom_killed", signal="SIGKILL", oom=oom)
    return out
