"""What can have changed in the target since the last snapshot (issue #33: under --inject the
tracer's work per interval follows what changed, not what is live): whether /proc/PID/maps must
be read again, and whether the resident-page measures (HeapMeter, AllocatorMeter: page-table walks
that take the target's mmap_lock) must be taken again or their last figures still hold.

**The change key** of a snapshot (`TargetState.maps_key`), taken before any read of the maps:

* the agent's count of mmap-family calls (Injection.sys_marks): every mmap, munmap, mremap,
  releasing madvise and brk made through the functions it hooked — libc's, a static libc's, an
  allocator's own — counted after the call returned. A thread's stack is mapped by such a call.
  Only when every call of the family is hooked: one left to its syscall tracepoint is counted
  nowhere, and the key is then None: the maps are read every snapshot, as without --inject.
* the target's VM counters, from the /proc/PID/status read that gives the interval row its RSS
  figures anyway: VmSize (any mapping made, removed, grown or shrunk, the break moved), VmData,
  VmStk, VmExe, VmLib (an mprotect adding or taking away write or exec: glibc growing a thread
  heap, the loader's RELRO, a JIT), VmLck and VmPin (mlock). They see what the hooks do not:
  ld.so mapping a library, syscall(2) and inline system calls, mprotect (hooked nowhere).

The maps are read again when the key differs from the one taken before the last read
(MapsWatcher.read). Seen by neither: unhooked calls whose effects cancel in every counter within
one interval (a munmap and an mmap of the same size by syscall(2)), an mprotect between
read-only and PROT_NONE, a madvise or prctl that only splits or names a mapping. Of these only
the first changes what a reader takes from the maps (the heaps, the anonymous ranges, code to
resolve), so a read older than REREAD_S is taken again whatever the key says.

**The resident-page measures** are taken again when the change key, the maps read (their
generation) or the target's page counters (`pages_key`: VmRSS, RssAnon, RssFile, RssShmem,
VmSwap, VmPTE, HugetlbPages) differ from those of the last measure, or it is older than REREAD_S;
otherwise the last resident figures are reused (live bytes are always new). Why that is exact:
the measures count present pages within ranges taken from the maps, the untracked LRU and the
probes' regions, which change only by mapping changes (the key) or in the probes' handling of a
hooked call (the key). Within fixed ranges a page becomes present only by a fault, which adds to
RSS (or HugetlbPages), and stops being present by munmap, madvise or mremap — so a page can move
between ranges, or one be released while another faults in, without RSS changing only through an
mmap-family call, which the key counts — or by reclaim, which lowers RSS (an anonymous page
swapped out raises VmSwap as well). Left: a page released without a call (reclaim of a MADV_FREE
page, the THP shrinker) and another faulted in within one interval so that every counter ends
where it was, or a read fault mapping the shared zero page (not RSS; counted present by the pread
Pagemap of the heap meter). Those show at the next measure, at most REREAD_S later.

The page counters must be exact sums: from Linux 6.2 until a later fix (6.16) the RSS of
/proc/PID/status was read from per-CPU counters without summing them (a change of a few dozen
pages per CPU may not show).
procfs.rss_counters_exact() finds out once, on pages of the tracer's own; where they are not,
`pages_key` is None and the measures are taken every snapshot, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..process import procfs
from ..process.ending import PF_EXITING
from ..process.mappings import REREAD_S

MAPS_FIELDS = ("VmSize", "VmData", "VmStk", "VmExe", "VmLib", "VmLck", "VmPin")
PAGES_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSwap", "VmPTE", "HugetlbPages")


@dataclass
class TargetState:
    """One snapshot's look at the target, taken before any read of its maps."""

    rss: dict[str, int]  # the interval row's RSS figures (procfs.rss_of; {} when not read)
    maps_key: tuple | None = None  # None: unknown, the maps are read
    pages_key: tuple | None = None  # None: unknown, the resident pages are measured


SIGKILL_BIT = 1 << 8  # SIGKILL (9) in the SigPnd/ShdPnd masks of /proc/PID/status


def dying(st: dict[str, int | str], stat: list[str] | None) -> bool:
    """Whether /proc/PID/status (`st`) and /proc/PID/stat (`stat`, procfs.stat_fields; None: not
    read) show a process past the point where its RSS says what it holds: no mm any more (no
    VmRSS line: a zombie, or a leader that exited before its threads), a SIGKILL pending (the OOM
    killer's or a user's: the OOM reaper may empty its pages before any thread runs do_exit), or
    exiting (PF_EXITING, a zombie). Its RSS then falls towards zero as the kernel tears it down: a
    read taken then is not the process's memory (issue 50: on the GPU box a 24 GiB victim's last
    reads said RSS 0 and capped every estimate at the kill to nothing)."""
    if "VmRSS" not in st:
        return True
    for key in ("SigPnd", "ShdPnd"):
        try:
            if int(str(st.get(key) or "0"), 16) & SIGKILL_BIT:
                return True
        except ValueError:
            pass
    if stat is not None:
        try:
            return stat[0] in ("Z", "X", "x") or bool(int(stat[6]) & PF_EXITING)
        except (ValueError, IndexError):
            return False
    return False


def target_state(pid: int, marks: int | None) -> TargetState:
    """The row's RSS figures and the change keys from one read of /proc/PID/status; `marks`:
    Injection.sys_marks() read just before (None: no key). A dying process (`dying`) reads as
    not read: its RSS is the kernel's teardown, not what it held."""
    try:
        st = procfs.read_status(pid)
        stat = procfs.stat_fields(pid)
    except OSError:
        return TargetState({})
    if dying(st, stat):
        return TargetState({})
    rss = procfs.rss_of(st)
    if marks is None:
        return TargetState(rss)
    maps_key = (marks, *(st.get(f) for f in MAPS_FIELDS))
    pages_key = tuple(st.get(f) for f in PAGES_FIELDS) if procfs.rss_counters_exact() else None
    return TargetState(rss, maps_key, pages_key)


class MeasureGate:
    """What of the last resident-page measure still holds (module docstring): its ranges (the
    heaps, each allocator's own mappings) while no mapping can have changed, and its figures
    too while the page counters are the same and it is younger than REREAD_S."""

    def __init__(self) -> None:
        self.ranges_key: tuple | None = None
        self.pages_key: tuple | None = None
        self.ns = 0

    def check(self, state: TargetState, maps_generation: int, now_ns: int) -> tuple[bool, bool]:
        """(the ranges hold, the figures hold)"""
        rk = None if state.maps_key is None else (state.maps_key, maps_generation)
        ranges = rk is not None and rk == self.ranges_key
        pages = (
            ranges
            and state.pages_key is not None
            and state.pages_key == self.pages_key
            and now_ns - self.ns < REREAD_S * 1e9
        )
        return ranges, pages

    def taken(self, state: TargetState, maps_generation: int, now_ns: int) -> None:
        self.ranges_key = None if state.maps_key is None else (state.maps_key, maps_generation)
        self.pages_key, self.ns = state.pages_key, now_ns

    def forget(self) -> None:
        self.ranges_key = self.pages_key = None
