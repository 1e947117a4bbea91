"""What a recording's set-up finds before the probes attach (Recorder.run, while BCC builds them
in a thread): the target's maps, its allocators (the one serving malloc first) and their plans,
the user's --alloc-fn/--free-fn functions placed, the source ids they are counted under; and the
start-up phases' times (--verbose). `rec` is the Recorder (tracer/record/recorder.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from common.errors import NoAllocatorError

from ..allocators.custom import Located, locate
from ..allocators.discovery import Allocator, find_allocators, plan_allocator
from ..allocators.retention import AllocatorMeter, Owner
from ..process import procfs
from ..process.ending import CgroupWatch
from ..process.target import launch_maps
from .late_attach import source_id


@dataclass
class Found:
    """What scan() found, for the attach."""

    maps: list[procfs.Mapping]  # what is probed (a held program: with its libraries, by path)
    real_maps: list[procfs.Mapping]  # what the target has mapped now
    held: bool  # stopped at its exec by the watch (tracer/watch/gate.py)
    alloc: Allocator  # the allocator serving malloc
    sources: dict[str, int]  # the other allocators' source ids
    custom: list[tuple[Located, int, int]]  # (the user's function, its source id, its probe offset)
    brk: int | None  # the heap's end (None: launched, or no heap yet)


def scan(rec) -> Found:
    """The target's maps and allocators: rec.plans, rec.retention, rec.cgroups set; the maps
    seeded (an attach to a running process). NoAllocatorError where no malloc is found."""
    t = rec.target
    launched = t.child is not None
    rec.cgroups = CgroupWatch.of(t.pid)  # how an OOM kill will be told, if one comes
    maps = launch_maps(t) if launched else procfs.read_maps(t.pid)
    real_maps = maps
    # stopped at its exec by the watch (tracer/watch/gate.py): only the program and ld.so are
    # mapped yet; its libraries are found as launch mode finds them, and probed by path
    held = t.on_release is not None
    if held:
        have = {m.path for m in maps}
        maps = maps + [m for m in launch_maps(t) if m.path not in have]
    allocators = find_allocators(t.exe, maps, t.pid)
    if not allocators or not allocators[0].serves_malloc:
        raise NoAllocatorError(
            f"no malloc/free found in {t.exe} or its libraries (statically linked and stripped?); nothing to probe"
        )
    alloc = allocators[0]
    rec.snapshots.heaps.glibc = alloc.kind == "glibc"
    if rec.opts.mode != "residency":
        rec.retention = AllocatorMeter(
            t.pid,
            rec.opts.residency_budget_pages,
            [Owner(a.source, a.kind, a.label, a.serves_malloc) for a in allocators],
        )
    located = [locate(fn, t.exe, maps) for fn in rec.custom_fns]
    rec.plans = [plan_allocator(a) for a in allocators]
    sources = {a.source: source_id(rec.source_names, a.source) for a in allocators[1:]}
    custom = [(loc, source_id(rec.source_names, loc.fn.source), place_custom(loc)) for loc in located]
    brk = None
    if not launched:
        rec.maps.seed(real_maps)
        heap = next((m for m in maps if m.path == "[heap]"), None)
        brk = heap.end if heap else None
    return Found(maps, real_maps, held, alloc, sources, custom, brk)


def place_custom(loc: Located) -> int:
    """The probe offset of a user's function (placed like the allocator's)."""
    from ..allocators.placement import ARG_REGS, place_probe  # noqa: PLC0415 (capstone)

    return place_probe(loc.path, loc.offset, loc.size, tuple(ARG_REGS[a] for a in loc.fn.reads())).offset


class Phases:
    """The start-up's phases and their times, in order (Recorder.phases); --verbose prints each."""

    def __init__(self, verbose: bool, progress) -> None:
        self.verbose = verbose
        self.progress = progress
        self.done: list[tuple[str, float]] = []  # (phase, seconds)
        self._t = time.perf_counter()

    def start(self) -> None:
        """The clock of the next phase starts now."""
        self._t = time.perf_counter()

    def end(self, name: str) -> None:
        """End the phase running now (`name`: what it was); "live" is said as the process's age."""
        now = time.perf_counter()
        self.done.append((name, now - self._t))
        self._t = now
        if self.verbose:
            ms = process_age_ms() if name == "live" else 1000 * self.done[-1][1]
            self.progress(f"start-up: {name} {ms:.0f} ms" + (" since the process started" if name == "live" else ""))

    def add(self, name: str, secs: float) -> None:
        """A phase timed elsewhere (the probes' build, in their thread)."""
        self.done.append((name, secs))
        if self.verbose:
            self.progress(f"start-up: {name} {1000 * secs:.0f} ms")


def process_age_ms() -> float:
    """How long this process has run (its start time in /proc: 10 ms resolution)."""
    try:
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        up = float(Path("/proc/uptime").read_text().split()[0])
        return 1000 * (up - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
