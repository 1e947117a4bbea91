"""Readers for /proc/PID: cheap, no locks held on the target beyond what the kernel takes."""

from __future__ import annotations

import mmap
import os
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache

from common.errors import PermissionProblem, TargetError, UsageError

PF_KTHREAD = 0x00200000
PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str  # '' for anonymous, '[heap]', '[stack]', or a file path (may end in ' (deleted)')

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path.startswith("/")

    @property
    def is_anonymous(self) -> bool:
        """Private or shared memory backed by no file: no inode, and no name or one given with
        prctl(PR_SET_VMA_ANON_NAME) ('[anon:NAME]', as glibc names its arenas with the
        glibc.mem.decorate_maps tunable). '[heap]' and '[stack]' are not."""
        return self.inode == 0 and (self.path == "" or self.path.startswith("[anon"))


def read_maps(pid: int) -> list[Mapping]:
    out = []
    with open(f"/proc/{pid}/maps", "rb") as f:
        for raw in f:
            parts = raw.decode("utf-8", "replace").rstrip("\n").split(None, 5)
            if len(parts) < 5:
                continue
            lo, hi = parts[0].split("-")
            out.append(
                Mapping(
                    int(lo, 16),
                    int(hi, 16),
                    parts[1],
                    int(parts[2], 16),
                    int(parts[4]),
                    parts[5] if len(parts) > 5 else "",
                )
            )
    return out


def read_status(pid: int) -> dict[str, int | str]:
    """Fields of /proc/PID/status; the kB ones converted to bytes."""
    out: dict[str, int | str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            val = val.strip()
            if val.endswith(" kB"):
                out[key] = int(val[:-3]) * 1024
            else:
                out[key] = val
    return out


def rss(pid: int) -> dict[str, int]:
    """RSS split, in bytes: rss, anon, file, shmem, hwm (peak RSS the kernel saw)."""
    return rss_of(read_status(pid))


def rss_of(s: dict[str, int | str]) -> dict[str, int]:
    """rss() from fields of /proc/PID/status already read."""
    return {
        "rss_bytes": int(s.get("VmRSS", 0)),
        "rss_anon_bytes": int(s.get("RssAnon", 0)),
        "rss_file_bytes": int(s.get("RssFile", 0)),
        "rss_shmem_bytes": int(s.get("RssShmem", 0)),
        "hwm_bytes": int(s.get("VmHWM", 0)),
    }


@lru_cache(maxsize=1)
def rss_counters_exact() -> bool:
    """Whether /proc/PID/status shows every page faulted in at once (recent kernels sum the per-CPU
    RSS counters for it; from 6.2 until that fix (6.16) they were read unsummed, and older kernels
    cached them per thread): 64
    pages of our own touched one by one, RssAnon read after each (False, the cautious answer,
    also when something else of ours freed memory meanwhile)."""
    n = 64
    try:
        buf = mmap.mmap(-1, n * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return False
    try:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            buf.madvise(mmap.MADV_NOHUGEPAGE)  # one page a fault, whatever the THP settings
        before = rss_of(read_status(os.getpid()))["rss_anon_bytes"]
        for i in range(n):
            buf[i * PAGE] = 1
            now = rss_of(read_status(os.getpid()))["rss_anon_bytes"]
            if now <= before:
                return False
            before = now
        return True
    except OSError:
        return False
    finally:
        buf.close()


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat split after the parenthesised comm (field 3 is index 0)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    return data[data.rindex(")") + 2 :].split()


def starttime(pid: int) -> int:
    """Start time in clock ticks after boot: with the pid, identifies one process for life."""
    return int(stat_fields(pid)[19])


def state(pid: int) -> str:
    return stat_fields(pid)[0]


def comm(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid else f"/proc/{pid}/comm"
    with open(path) as f:
        return f.read().rstrip("\n")


def thread_names(pid: int) -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            out[int(t)] = comm(pid, int(t))
        except OSError:
            pass
    return out


def exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]


def is_alive(pid: int, start: int) -> bool:
    """True while the process that had `start` as its start time is running (not a zombie)."""
    try:
        f = stat_fields(pid)
    except (OSError, ValueError, IndexError):
        return False
    return int(f[19]) == start and f[0] not in ("Z", "X", "x")


def ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1:
        out.add(pid)
        try:
            pid = int(stat_fields(pid)[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def check_target(pid: int) -> None:
    """Raise TargetError unless pid is a live user-space process other than us."""
    if pid <= 0:
        raise UsageError(f"--pid must be a positive process id, not {pid}")
    if pid == os.getpid():
        raise TargetError(f"pid {pid} is allocscope itself; give the daemon's pid")
    try:
        f = stat_fields(pid)
    except FileNotFoundError:
        raise TargetError(f"no process with pid {pid}") from None
    except OSError as e:
        raise TargetError(f"cannot read /proc/{pid}: {e.strerror}") from None
    if int(f[6]) & PF_KTHREAD:
        raise TargetError(f"pid {pid} is a kernel thread ({comm(pid)}); it has no user-space allocator")
    if f[0] in ("Z", "X", "x"):
        raise TargetError(f"pid {pid} is a zombie (exited, not yet reaped); nothing left to trace")
    if int(read_status(pid).get("Tgid", pid)) != pid:
        tgid = read_status(pid).get("Tgid")
        raise TargetError(f"{pid} is a thread of process {tgid}; give the process id {tgid}")
    try:  # the kernel's ptrace read check: what every reader of its maps and memory meets next
        with open(f"/proc/{pid}/maps", "rb") as maps:
            maps.read(1)
    except PermissionError:
        who = (
            "even to root (a process of another user namespace, or one a security module guards)"
            if os.geteuid() == 0
            else "(run allocscope as root)"
        )
        raise PermissionProblem(
            f"cannot read the memory map of pid {pid} ({comm(pid)}): permission denied {who}"
        ) from None
    except FileNotFoundError:
        raise TargetError(f"no process with pid {pid}") from None


def pgrep(pattern: str) -> list[tuple[int, str]]:
    """Processes whose full command line matches `pattern` (a regex, like pgrep -f), excluding
    this tracer and its ancestors (the shell or sudo that started it), and kernel threads."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise UsageError(f"--pgrep pattern {shlex.quote(pattern)} is not a valid regular expression: {e}") from None
    mine = ancestors(os.getpid())
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in mine:
            continue
        try:
            args = cmdline(pid)
            if not args or state(pid) in ("Z", "X"):
                continue
        except (OSError, ValueError, IndexError):
            continue
        line = " ".join(args)
        if rx.search(line):
            found.append((pid, line))
    return sorted(found)
