"""One /proc/PID/maps read per snapshot, none when nothing can have changed the mappings, and the
resident-page measures only when something they measure can have changed (issue #33,
tracer/record/readgate.py): the snapshot's readers (the maps watcher, the heap meter, the
allocator meter) on a child process whose mappings and pages the test changes, the agent's count
of mmap-family calls faked. Reads of the maps and page scans counted; figures exact."""

from __future__ import annotations

import mmap
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tracer.allocators import retention
from tracer.allocators.retention import AllocatorMeter, Owner
from tracer.base.options import RecordOptions
from tracer.process import procfs
from tracer.process.mappings import MapsWatcher
from tracer.record import trace_tables
from tracer.record.readgate import SIGKILL_BIT, dying, target_state
from tracer.record.snapshot import Snapshots

P = mmap.PAGESIZE
CHILD = r"""
import ctypes, mmap, sys
P = mmap.PAGESIZE
held = {}
for line in sys.stdin:
    cmd, name, *a = line.split()
    if cmd == "map":  # map NAME PAGES TOUCHED
        m = mmap.mmap(-1, int(a[0]) * P, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_NOHUGEPAGE)  # one page a fault
        c = ctypes.c_char.from_buffer(m)
        addr = ctypes.addressof(c)
        del c
        held[name] = m
        a = [0, a[1]]
    else:  # unmap NAME, touch NAME FROM TO
        if cmd == "unmap":
            held.pop(name).close()
        addr = 0
    if cmd in ("map", "touch"):  # touch NAME FROM TO
        m = held[name]
        for i in range(int(a[0]), int(a[1])):
            m[i * P] = 1
    print(addr, flush=True)
"""


class Child:
    def __init__(self) -> None:
        pipe = subprocess.PIPE
        self.p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=pipe, stdout=pipe, text=True)
        self.pid = self.p.pid

    def do(self, *words) -> int:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(" ".join(map(str, words)) + "\n")
        self.p.stdin.flush()
        return int(self.p.stdout.readline())

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


class FakeAgent:
    """Injection.sys_marks: the agent's count of mmap-family calls through its hooks."""

    def __init__(self) -> None:
        self.marks = 0

    def sys_marks(self) -> int:
        return self.marks


class FakeProbes:
    """The probes' untracked LRU (an allocator's own mappings) and regions (none)."""

    def __init__(self) -> None:
        self.untracked: dict[int, int] = {}

    def read_regions(self):
        return np.empty(0, np.uint64), np.empty(0, np.uint64)

    def read_untracked(self) -> dict[int, int]:
        return dict(self.untracked)


class Parts:
    def __init__(self) -> None:
        self.written: list[tuple[str, int]] = []

    def write_part(self, name: str, seq: int, _part) -> None:
        self.written.append((name, seq))


@pytest.fixture
def counted(monkeypatch):
    """Counts of /proc/PID/maps reads and resident-page scans (allocator meter, heap meter)."""
    n = {"maps": 0, "scans": 0}
    read_maps, meter, pagemap = procfs.read_maps, retention.resident_meter, trace_tables.Pagemap

    def reading(pid):
        n["maps"] += 1
        return read_maps(pid)

    def scanning(real):
        def f(*a, **k):
            n["scans"] += 1
            return real(*a, **k)

        return f

    monkeypatch.setattr(procfs, "read_maps", reading)
    monkeypatch.setattr(retention, "resident_meter", scanning(meter))
    monkeypatch.setattr(trace_tables, "Pagemap", scanning(pagemap))
    return n


def snapshots(pid: int, agent) -> Snapshots:
    rec = SimpleNamespace(
        injection=agent,
        target=SimpleNamespace(pid=pid),
        maps=MapsWatcher(pid),
        retention=AllocatorMeter(pid, 1 << 18, [Owner("heap", "jemalloc", "jemalloc", True)]),
        writer=Parts(),
        probes=SimpleNamespace(maps=FakeProbes()),
        tracker=SimpleNamespace(live=lambda: []),
    )
    return Snapshots(rec, rec.target, RecordOptions())


def snap(s: Snapshots, seq: int, counted: dict) -> tuple[int, int, int, int]:
    """The readers of the maps in one snapshot, in Snapshots.snapshot's order: the `maps` part, the
    stacks' refresh, the resident-page measures. (maps reads, scans, mapped, resident) of it."""
    before = dict(counted)
    st = s._look(True, False)
    s.rec.maps.part(seq, True, st.maps_key)
    s.rec.maps.refresh(seq, st.maps_key)  # new stacks to resolve
    s._measure(seq, False, st)
    assert ("allocators", seq) in s.rec.writer.written
    _src, _label, mapped, resident, _live, _n = s.rec.retention.last[0]
    return counted["maps"] - before["maps"], counted["scans"] - before["scans"], mapped, resident


def test_maps_read_once_and_only_after_a_change(counted):
    c = Child()
    try:
        agent = FakeAgent()
        s = snapshots(c.pid, agent)
        a = c.do("map", "a", 16, 4)  # an allocator's mapping (the probes' untracked LRU has it)
        s.rec.probes.maps.untracked[a] = a + 16 * P
        exact = procfs.rss_counters_exact()
        # the first snapshot: one read shared by every reader, both meters scan
        assert snap(s, 1, counted) == (1, 2, 16 * P, 4 * P)
        # nothing changed: no read; no scan where the RSS counters are exact sums
        assert snap(s, 2, counted) == (0, 0 if exact else 2, 16 * P, 4 * P)
        # pages faulted in, no mapping change: no read; scanned again over the same ranges
        c.do("touch", "a", 4, 7)
        assert snap(s, 3, counted) == (0, 2, 16 * P, 7 * P)
        # a mapping the hooks did not see (VmSize changed): read; not the allocator's
        c.do("map", "b", 8, 2)
        assert snap(s, 4, counted) == (1, 2, 16 * P, 7 * P)
        assert snap(s, 5, counted) == (0, 0 if exact else 2, 16 * P, 7 * P)
        # an allocator's munmap and mmap of the same size (no VM counter moves): the hooks count
        # them, the probes' LRU has the new one: read, its pages measured
        c.do("unmap", "b")
        agent.marks += 2
        b = c.do("map", "b", 8, 5)
        s.rec.probes.maps.untracked[b] = b + 8 * P
        assert snap(s, 6, counted) == (1, 2, 24 * P, 12 * P)
        assert s.rec.maps.reads == 3
    finally:
        c.close()


def test_without_a_change_count_every_snapshot_reads_once(counted):
    """Without --inject (or with a call of the family left to its tracepoint: sys_marks None)
    nothing says what changed: one read a snapshot, shared, and the measures every time."""
    c = Child()
    try:
        s = snapshots(c.pid, None)
        a = c.do("map", "a", 16, 4)
        s.rec.probes.maps.untracked[a] = a + 16 * P
        for seq in (1, 2, 3):
            assert snap(s, seq, counted) == (1, 2, 16 * P, 4 * P)
    finally:
        c.close()


def test_a_dying_process_reads_as_not_measured():
    """A process being torn down (no mm, a SIGKILL pending, PF_EXITING, a zombie) gives no RSS
    figures: its RSS falls towards zero as the kernel (or the OOM reaper) frees its pages, and a
    read taken then must not stand for what it held at the kill (readgate.dying). A live child:
    its figures; the same child SIGKILLed and not yet waited for (a zombie): none."""
    alive = {"VmRSS": 4 << 20, "SigPnd": "0000000000000000", "ShdPnd": "0000000000000000"}
    running = ["S", "1", "1", "1", "0", "-1", str(0x400000)]
    assert not dying(alive, running)
    assert dying({k: v for k, v in alive.items() if k != "VmRSS"}, running)  # no mm: a zombie leader
    assert dying(alive | {"SigPnd": f"{SIGKILL_BIT:016x}"}, running)  # the OOM killer's SIGKILL, pending
    assert dying(alive | {"ShdPnd": f"{SIGKILL_BIT | 0x4000:016x}"}, running)
    assert not dying(alive | {"ShdPnd": f"{0x4000:016x}"}, running)  # SIGTERM pending: alive still
    assert dying(alive, ["Z", *running[1:]])
    assert dying(alive, [*running[:6], str(0x400004)])  # PF_EXITING
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; b = bytearray(8 << 20); sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        for _ in range(200):
            st = target_state(child.pid, None).rss
            if st.get("rss_anon_bytes", 0) >= 8 << 20:
                break
            time.sleep(0.02)
        assert st["rss_anon_bytes"] >= 8 << 20 and st["rss_bytes"] >= st["rss_anon_bytes"]
        child.kill()
        for _ in range(200):
            if procfs.stat_fields(child.pid)[0] == "Z":
                break
            time.sleep(0.01)
        assert target_state(child.pid, None).rss == {}
    finally:
        child.kill()
        child.wait()
