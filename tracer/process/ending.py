"""How the target ended, from the kernel: its wait status (exit code or fatal signal) and whether
the OOM killer chose it, and in which memory cgroup, at what limit.

* The wait status of a process that is not our child: a pidfd opened while it ran answers
  PIDFD_GET_INFO with PIDFD_INFO_EXIT once it is reaped (Linux 6.15); before that, while it is a
  zombie, /proc/PID/stat's field 52 holds it (Linux 3.5). A launched command's comes from waitpid.
* An OOM kill: the target's memory cgroups, its own up to the root, are read when the recording
  starts (`CgroupWatch`; cgroup v1's memory controller where the box mounts one, else v2): each
  one's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) and OOM counters (v2 `memory.events`:
  `oom` the cgroup hit its limit, `oom_kill` processes in it killed by an OOM killer; v1
  `memory.oom_control`'s `oom_kill`, `memory.failcnt`). A target killed by SIGKILL whose own
  cgroup's `oom_kill` rose meanwhile was killed by an OOM killer: `scope` "cgroup" with the
  deepest cgroup whose `oom` rose and that has a limit (the one that was full), "global" when none
  did (the machine was out of memory). A SIGKILL with no OOM kill counted there is "killed"; so is
  one on a box without a memory cgroup to read (an OOM kill elsewhere must not name this process).
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
    """A memory cgroup's OOM counters: cgroup v2's memory.events, or v1's memory.oom_control
    (its `oom_kill`) with memory.failcnt as `oom` (missing: {})."""
    out: dict[str, int] = {}
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(path, name)) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if v.strip().isdigit():
                        out[k] = int(v)
        except OSError:
            continue
        if name == "memory.oom_control":
            try:
                with open(os.path.join(path, "memory.failcnt")) as f:
                    out["oom"] = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return out
    return out


V1_UNLIMITED = 1 << 62  # memory.limit_in_bytes of a v1 cgroup without a limit (PAGE_COUNTER_MAX pages)


def read_limit(path: str) -> int | None:
    """A memory cgroup's limit in bytes: v2's memory.max, v1's memory.limit_in_bytes (None: none)."""
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            with open(os.path.join(path, name)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if not text.isdigit():
            return None
        return int(text) if int(text) < V1_UNLIMITED else None
    return None


def vm_oom_kills() -> int:
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def memory_cgroup(pid: int) -> tuple[str, str] | None:
    """(the target's memory cgroup path, the hierarchy's mount): cgroup v1's memory controller
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
        found = memory_cgroup(pid)
        groups = []
        if found is not None:
            path, mount = found
            while True:
                d = mount + (path if path != "/" else "")
                if os.path.isdir(d):
                    groups.append(Cgroup(path, read_limit(d), read_events(d), d))
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

    def scope(self) -> dict:
        """Where an OOM kill came from: the deepest of the target's cgroups with a limit whose
        `oom` count rose since the start, else the whole machine."""
        for g in self.cgroups:
            if g.limit is not None and read_events(g.dir).get("oom", 0) > g.events.get("oom", 0):
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
