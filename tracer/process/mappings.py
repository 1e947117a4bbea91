"""The target's memory map while recording: what is mapped where, for resolving stack addresses
to (module, build ID, file offset), and the `maps` table of the trace whenever it changes."""

from __future__ import annotations

import bisect
import os
import time

import pyarrow as pa

from common.elf import build_id
from common.tracefile import format as F

from . import procfs

DELETED = " (deleted)"


def live_file(pid: int, m: procfs.Mapping) -> str:
    """A path that opens the file behind mapping `m` of `pid`: its own path, or for a file deleted
    (or replaced by an upgrade) since it was mapped, /proc/PID/map_files/START-END while the
    process lives (root); the gone path otherwise."""
    if not m.path.endswith(DELETED):
        return m.path
    mf = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
    return mf if pid and os.path.exists(mf) else m.path.removesuffix(DELETED)


def mapping_build_id(pid: int, m: procfs.Mapping) -> str:
    """Build ID of the file behind `m` (live_file): a deleted daemon binary's too."""
    return build_id(live_file(pid, m))


class MapIndex:
    """Resolve absolute addresses to (module, build id, file offset) with one maps snapshot."""

    def __init__(self, maps: list[procfs.Mapping], pid: int = 0) -> None:
        self.maps = sorted(maps, key=lambda m: m.start)
        self.starts = [m.start for m in self.maps]
        self.pid = pid  # a deleted module's build ID is read through /proc/PID/map_files

    def updated(self, maps: list[procfs.Mapping]) -> MapIndex:
        """A new index where `maps` win and older mappings they do not overlap are kept, so
        addresses in code that was unmapped since (dlclose, exit) still resolve."""
        new = sorted(maps, key=lambda m: m.start)
        starts = [m.start for m in new]
        keep = []
        for m in self.maps:
            i = bisect.bisect_left(starts, m.end)
            if i == 0 or new[i - 1].end <= m.start:
                keep.append(m)
        return MapIndex(new + keep, self.pid)

    def find(self, ip: int) -> procfs.Mapping | None:
        i = bisect.bisect_right(self.starts, ip) - 1
        if i >= 0 and self.maps[i].start <= ip < self.maps[i].end:
            return self.maps[i]
        return None

    def resolve(self, ip: int) -> tuple[str, str, int]:
        m = self.find(ip)
        if m is None:
            return "", "", -1
        if not m.is_file:
            return m.path, "", -1
        return m.path.removesuffix(DELETED), mapping_build_id(self.pid, m), ip - m.start + m.offset

    def is_code(self, ip: int) -> bool:
        m = self.find(ip)
        return m is not None and "x" in m.perms


REREAD_S = 10.0  # a keyed read older than this is taken again whatever the key says (tracer/record/readgate.py)


class MapsWatcher:
    """The target's maps as last read, the index built from every version seen, and the
    versions not yet written to the trace. `on_change(maps)` is told of each new version (the
    DWARF unwinder loads the rows of new code; the CUDA probes attach to a new driver).

    A snapshot's readers of /proc/PID/maps (this watcher, the heap and allocator meters, the
    final live table and census) share one read through `read(seq, key)`: at most one per
    snapshot, none when `key` says nothing can have changed the mappings since the last read
    (tracer/record/readgate.py)."""

    def __init__(self, pid: int, on_change=None, still_ours=None) -> None:
        self.pid = pid
        self.still_ours = still_ours or (lambda: True)  # False once the pid is another program
        self.current: list[procfs.Mapping] = []
        self.index = MapIndex([], pid)
        self.dirty = True  # read again at the next snapshot
        self.unwritten: list[procfs.Mapping] | None = None
        self.on_change = on_change or (lambda maps: None)
        self.last: list[procfs.Mapping] | None = None  # as last read, whoever read it
        self.last_seq = 0  # the snapshot it was read for (0: read outside a snapshot)
        self.last_key: tuple | None = None  # the change key taken before that read (None: none)
        self.last_ns = 0
        self.generation = 0  # bumped whenever a read differs from the one before
        self.reads = 0

    def read(self, seq: int = 0, key: tuple | None = None) -> list[procfs.Mapping]:
        """/proc/PID/maps for snapshot `seq` (0: outside one: read now). Not read again within a
        snapshot, nor while `key` (readgate.TargetState.maps_key, taken before this call; None:
        unknown) equals the key taken before the last read and that read is younger than
        REREAD_S. A read equal to the last returns the last list itself. OSError: unreadable."""
        now = time.monotonic_ns()
        last = self.last
        if (
            last is not None
            and seq
            and (
                self.last_seq == seq
                or (key is not None and key == self.last_key and now - self.last_ns < REREAD_S * 1e9)
            )
        ):
            return last
        maps = procfs.read_maps(self.pid)
        self.reads += 1
        if maps == last:
            maps = last
        else:
            self.generation += 1
        self.last, self.last_seq, self.last_key, self.last_ns = maps, seq, key if seq else None, now
        return maps

    def seed(self, maps: list[procfs.Mapping]) -> None:
        """The maps read before the attach (pid mode): the first `maps` part."""
        self.current = maps
        self.index = MapIndex(maps, self.pid)
        self.unwritten = maps

    def refresh(self, seq: int = 0, key: tuple | None = None) -> list[procfs.Mapping] | None:
        """The maps of snapshot `seq` (read(seq, key); 0: read now); the new version when it
        changed, None otherwise or when it cannot be read."""
        try:
            maps = self.read(seq, key)
        except OSError:
            return None
        if not self.still_ours() or maps == self.current:
            return None
        self.current = maps
        self.index = self.index.updated(maps)
        self.on_change(maps)
        return maps

    def now(self) -> None:
        """Read them at once (code was mapped), to be written at the next snapshot."""
        changed = self.refresh()
        if changed is not None:
            self.unwritten = changed

    def part(self, seq: int, readable: bool, key: tuple | None = None) -> pa.Table | None:
        """The `maps` part of this snapshot: the latest version, if any is unwritten."""
        changed = None
        if self.dirty or seq == 1:
            changed = self.refresh(seq, key) if readable else None
            self.dirty = False
        changed = self.unwritten or changed
        self.unwritten = None
        if changed is None:
            return None
        return pa.table(
            {
                "seq": [seq] * len(changed),
                "start": [m.start for m in changed],
                "end": [m.end for m in changed],
                "perms": [m.perms for m in changed],
                "offset": [m.offset for m in changed],
                "inode": [m.inode for m in changed],
                "path": [m.path for m in changed],
                "build_id": [mapping_build_id(self.pid, m) if m.is_file and "x" in m.perms else "" for m in changed],
            },
            schema=F.SCHEMAS["maps"],
        )


def heap_end(pid: int) -> int | None:
    """Where the break of process `pid` is now: its [heap] mapping's end (None: no heap yet, or
    unreadable)."""
    try:
        maps = procfs.read_maps(pid)
    except OSError:
        return None
    return next((m.end for m in maps if m.path == "[heap]"), None)
