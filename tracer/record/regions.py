"""Page-exact accounting of memory the target takes straight from the kernel: the rare shapes.

The probes account the common shapes of the mmap family in the kernel (probes/allocscope.c,
`regions`): a region mapped, unmapped whole or from its start, resized or moved by mremap, the
break moved up. The rare shapes — a munmap that does not start at a region (a partial unmap
splitting one, a range spanning a gap), MAP_FIXED, an mremap to a fixed address, the break
shrinking over tracked pages — come here as events, in order. `SlowPath` first takes the kernel
side's regions that the event touches out of the `regions` map (only those mapped before the
event: the kernel may have given the same pages to a newer mapping since), then `RegionTracker`
replays the event page by page on everything it holds. Regions it took stay here until they are
freed. Anonymous mappings made outside an allocator call are allocations of the stack that made
them; partial munmaps, MAP_FIXED over a tracked range, mremap shrink/grow/move and brk shrink are
charged to the page. Mappings an allocator makes inside malloc/realloc (glibc's mmapped chunks,
thread heaps) belong to that call and are never tracked, and a munmap of a range that was never
tracked changes nothing.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np

from common.pages import page_down, page_up

MAP_ANONYMOUS = 0x20
MAP_FIXED = 0x10


@dataclass
class _Alloc:
    """One mmap/brk allocation; it may be split into several pieces by partial unmaps."""

    aid: int
    stack_id: int
    tid: int
    ts_ns: int
    source: str  # 'mmap' | 'brk'
    pieces: int = 0


@dataclass
class SiteStat:
    alloc_bytes: int = 0
    alloc_count: int = 0
    free_bytes: int = 0
    free_count: int = 0
    peak_live_bytes: int = 0

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.alloc_bytes, self.alloc_count, self.free_bytes, self.free_count, self.peak_live_bytes)


class RegionTracker:
    def __init__(self, initial_brk: int | None = None) -> None:
        self._starts: list[int] = []  # sorted piece starts
        self._pieces: dict[int, tuple[int, _Alloc]] = {}  # start -> (end, alloc)
        self._next_aid = 1
        self.brk = initial_brk
        self.sites: dict[tuple[int, int, str], SiteStat] = {}
        self.flows: dict[tuple[int, int], list[int]] = {}  # (alloc tid, free tid) -> [bytes, count, wait_sum, wait_max]
        self.released: list[tuple[int, int, str, int]] = []  # (ts, tid, kind, bytes) outside tracked regions
        self.freed_sites: set[tuple[int, int, str]] = set()  # sites whose free_bytes changed (SlowPath reads it)

    # --- pieces ------------------------------------------------------------------------

    def _stat(self, a: _Alloc) -> SiteStat:
        key = (a.stack_id, a.tid, a.source)
        st = self.sites.get(key)
        if st is None:
            st = self.sites[key] = SiteStat()
        return st

    def _insert(self, lo: int, hi: int, a: _Alloc) -> None:
        bisect.insort(self._starts, lo)
        self._pieces[lo] = (hi, a)
        a.pieces += 1

    def _overlapping(self, lo: int, hi: int) -> list[int]:
        i = bisect.bisect_right(self._starts, lo) - 1
        if i < 0:
            i = 0
        out = []
        while i < len(self._starts) and self._starts[i] < hi:
            s = self._starts[i]
            if self._pieces[s][0] > lo:
                out.append(s)
            i += 1
        return out

    def _extract(self, lo: int, hi: int) -> list[tuple[int, int, _Alloc]]:
        """Remove [lo, hi) from the tracked pieces; return what was removed (clipped),
        keeping the parts outside [lo, hi). Piece counts of allocations are adjusted."""
        removed = []
        for s in self._overlapping(lo, hi):
            end, a = self._pieces.pop(s)
            self._starts.remove(s)
            a.pieces -= 1
            if s < lo:
                self._insert(s, lo, a)
            if end > hi:
                self._insert(hi, end, a)
            removed.append((max(s, lo), min(end, hi), a))
        return removed

    def _charge_free(self, parts: list[tuple[int, int, _Alloc]], tid: int, ts_ns: int) -> int:
        total = 0
        gone: set[int] = set()
        for lo, hi, a in parts:
            n = hi - lo
            total += n
            st = self._stat(a)
            st.free_bytes += n
            self.freed_sites.add((a.stack_id, a.tid, a.source))
            last = a.pieces == 0 and a.aid not in gone  # its last page went: one free
            if last:
                gone.add(a.aid)
                st.free_count += 1
            f = self.flows.setdefault((a.tid, tid), [0, 0, 0, 0])
            wait = max(0, ts_ns - a.ts_ns)
            f[0] += n
            if last:
                f[1] += 1
                f[2] += wait
                f[3] = max(f[3], wait)
        return total

    def _new_alloc(self, lo: int, hi: int, stack_id: int, tid: int, ts_ns: int, source: str) -> None:
        a = _Alloc(self._next_aid, stack_id, tid, ts_ns, source)
        self._next_aid += 1
        self._insert(lo, hi, a)
        st = self._stat(a)
        st.alloc_bytes += hi - lo
        st.alloc_count += 1
        st.peak_live_bytes = max(st.peak_live_bytes, st.alloc_bytes - st.free_bytes)

    def adopt(self, lo: int, hi: int, stack_id: int, tid: int, ts_ns: int, source: str) -> None:
        """Hold an allocation the kernel side counted (its site's alloc counters stay there):
        from now on its pages are freed here."""
        a = _Alloc(self._next_aid, stack_id, tid, ts_ns, source)
        self._next_aid += 1
        self._insert(lo, hi, a)
        self._stat(a)

    # --- syscalls ------------------------------------------------------------------------

    def unmap(self, addr: int, length: int, tid: int, ts_ns: int, why: str = "munmap") -> int:
        lo, hi = page_down(addr), page_up(addr + length)
        if hi <= lo:
            return 0
        freed = self._charge_free(self._extract(lo, hi), tid, ts_ns)
        if freed == 0:
            self.released.append((ts_ns, tid, why, hi - lo))
        return freed

    def mmap(
        self,
        addr: int,
        length: int,
        flags: int,
        fd: int,
        stack_id: int,
        tid: int,
        ts_ns: int,
        in_allocator: bool,
        prot: int = 3,
        source: str | None = None,
    ) -> None:
        """`source`: what the probes classified the mapping as ('' = not tracked); None: decide
        here, as the probes do (anonymous, outside an allocator call, not PROT_NONE)."""
        lo, hi = page_down(addr), page_up(addr + length)
        # The kernel replaces whatever was mapped there (MAP_FIXED); charge it as freed.
        self._charge_free(self._extract(lo, hi), tid, ts_ns)
        if source is None:
            # PROT_NONE: address space reserved (glibc's 64 MiB heap reservations), not memory.
            source = "" if in_allocator or not (flags & MAP_ANONYMOUS) or prot == 0 else "mmap"
        if not source or hi <= lo:
            return
        self._new_alloc(lo, hi, stack_id, tid, ts_ns, source)

    def mremap(self, old: int, old_len: int, new: int, new_len: int, tid: int, ts_ns: int) -> None:
        olo, ohi = page_down(old), page_up(old + old_len)
        new_len = page_up(new_len)
        pieces = self._extract(olo, ohi)
        if new != old:
            self._charge_free(self._extract(page_down(new), page_down(new) + new_len), tid, ts_ns)
        new_end = new + new_len
        shrunk: list[tuple[int, int, _Alloc]] = []
        last = None
        for lo, hi, a in pieces:
            nlo, nhi = new + (lo - olo), new + (hi - olo)
            if nlo >= new_end:
                shrunk.append((lo, hi, a))
                continue
            if nhi > new_end:
                shrunk.append((lo + (new_end - nlo), hi, a))
                nhi = new_end
            self._insert(nlo, nhi, a)
            if hi == ohi:
                last = (nlo, nhi, a)
        if shrunk:
            self._charge_free(shrunk, tid, ts_ns)
        # Grown: the new pages belong to the allocation that ended at the old end.
        if last is not None and new_end > last[1]:
            nlo, nhi, a = last
            self._pieces[nlo] = (new_end, a)
            st = self._stat(a)
            st.alloc_bytes += new_end - nhi
            st.peak_live_bytes = max(st.peak_live_bytes, st.alloc_bytes - st.free_bytes)

    def brk_moved(self, old: int, new: int, stack_id: int, tid: int, ts_ns: int) -> None:
        """The break moved from `old` to `new` outside an allocator call (the probes say both)."""
        self.brk = old
        self.set_brk(new, stack_id, tid, ts_ns, False)

    def set_brk(self, new_brk: int, stack_id: int, tid: int, ts_ns: int, in_allocator: bool) -> None:
        old = self.brk
        self.brk = new_brk
        if old is None or new_brk == old:
            return
        if new_brk > old:
            if not in_allocator:
                lo, hi = page_up(old), page_up(new_brk)
                if hi > lo:
                    self._new_alloc(lo, hi, stack_id, tid, ts_ns, "brk")
        else:
            self.unmap(page_up(new_brk), page_up(old) - page_up(new_brk), tid, ts_ns, "brk")

    # --- views ------------------------------------------------------------------------

    def live(self) -> list[tuple[int, int, int, int, int, str]]:
        """(start, bytes, stack_id, tid, ts_ns, source) of every tracked piece."""
        return [
            (s, end - s, a.stack_id, a.tid, a.ts_ns, a.source) for s in self._starts for end, a in [self._pieces[s]]
        ]

    def live_bytes(self) -> int:
        return sum(end - s for s, (end, _a) in self._pieces.items())

    def live_count(self) -> int:
        return len({id(a) for _e, a in self._pieces.values()})


class SlowPath:
    """Replays the rare shapes of the mmap family the probes hand over (see the module
    docstring), keeping the kernel side and the tracker apart: every region is held by exactly
    one of them. `taken_bytes` / `taken_count` are what the kernel side's totals still count but
    the tracker now holds."""

    def __init__(self, probes, tracker: RegionTracker, source_names: dict[int, str]) -> None:
        self.probes = probes
        self.tracker = tracker
        self.source_names = source_names
        self.source_ids = {v: k for k, v in source_names.items()}
        self.taken_bytes = 0
        self.taken_count = 0
        self.replayed = 0
        self._snap_ns = -1  # the kernel side's regions, as read at this time
        self._starts = np.empty(0, np.uint64)
        self._vals: np.ndarray = np.empty(0)  # their Region values, once read
        self._gone: set[int] = set()
        self._untracked: dict[int, int] = {}

    def _read(self) -> None:
        self._snap_ns = time.monotonic_ns()
        keys, vals = self.probes.read_regions()
        order = np.argsort(keys)
        self._starts, self._vals = keys[order], vals[order]
        self._gone = set()
        self._untracked = self.probes.read_untracked()

    def _forget_untracked(self, lo: int, hi: int) -> None:
        """Drop the kernel side's untracked entries a rare shape touches: one left behind could
        hide a tracked page the shape put there from a later munmap."""
        for start, end in list(self._untracked.items()):
            if start < hi and end > lo:
                self.probes.forget_untracked(start)
                del self._untracked[start]

    def take(self, lo: int, hi: int, before_ns: int) -> None:
        """Move the kernel side's regions overlapping [lo, hi) that were mapped before
        `before_ns` (the event's entry time) into the tracker."""
        for _attempt in range(8):
            if before_ns >= self._snap_ns:
                self._read()  # regions mapped since the last read may matter
            self._forget_untracked(lo, hi)
            i = max(int(np.searchsorted(self._starts, lo, side="right")) - 1, 0)
            j = int(np.searchsorted(self._starts, hi, side="left"))
            moved = False
            for k in range(i, j):
                start, v = int(self._starts[k]), self._vals[k]
                end = int(v["end"])
                if start in self._gone or end <= lo or int(v["ts_ns"]) >= before_ns:
                    continue
                if not self.probes.take_region(start):
                    moved = True  # the probes freed or moved it since the read: read again
                    break
                self._gone.add(start)
                self.tracker.adopt(
                    start,
                    end,
                    int(v["stack_id"]),
                    int(v["tid"]),
                    int(v["ts_ns"]),
                    self.source_names.get(int(v["source"]), "mmap"),
                )
                self.taken_bytes += end - start
                self.taken_count += 1
            if not moved:
                return
            self._snap_ns = -1

    def mmap(self, ev) -> None:
        lo, hi = page_down(ev.addr), page_up(ev.addr + ev.len)
        self.take(lo, hi, ev.ts_ns)
        src = self.source_names.get(ev.source, "") if ev.source else ""
        self.tracker.mmap(
            ev.addr, ev.len, ev.flags, ev.fd, ev.stack_id, ev.tid, ev.ts_ns, ev.in_api != 0, ev.prot, source=src
        )

    def munmap(self, ev) -> None:
        self.take(page_down(ev.addr), page_up(ev.addr + ev.len), ev.ts_ns)
        self.tracker.unmap(ev.addr, ev.len, ev.tid, ev.ts_ns)

    def mremap(self, ev) -> None:
        self.take(page_down(ev.addr), page_up(ev.addr + ev.len), ev.ts_ns)
        if ev.addr2 != ev.addr:  # the kernel replaced what was at the new address (MREMAP_FIXED)
            self.take(page_down(ev.addr2), page_up(ev.addr2 + ev.len2), ev.ts_ns)
        self.tracker.mremap(ev.addr, ev.len, ev.addr2, ev.len2, ev.tid, ev.ts_ns)

    def brk(self, ev) -> None:
        old, new = ev.len, ev.addr
        if new < old:
            self.take(page_up(new), page_up(old), ev.ts_ns)
        self.tracker.brk_moved(old, new, ev.stack_id, ev.tid, ev.ts_ns)

    def site_ext(self) -> None:
        """Tell the probes what the tracker freed per region site (their peaks subtract it)."""
        for key in self.tracker.freed_sites:
            st = self.tracker.sites.get(key)
            src = self.source_ids.get(key[2])
            if st is not None and src is not None:
                self.probes.set_site_ext(key[0], key[1], src, st.free_bytes)
        self.tracker.freed_sites.clear()
