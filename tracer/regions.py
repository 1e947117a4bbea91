"""Page-exact accounting of memory the target takes straight from the kernel.

The BPF program ships every mmap, munmap, mremap and brk of the target through the ring buffer;
this tracker replays them in order. Anonymous mappings made outside an allocator call become
allocations of the stack that made them; partial munmaps, MAP_FIXED over a tracked range,
mremap shrink/grow/move and brk shrink are charged to the page. Mappings an allocator makes
inside malloc/realloc (glibc's mmapped chunks, thread heaps) belong to that call and are never
tracked here, and a munmap of a range we never tracked changes nothing.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

PAGE = 4096
MAP_ANONYMOUS = 0x20
MAP_FIXED = 0x10


def page_up(n: int) -> int:
    return (n + PAGE - 1) & ~(PAGE - 1)


def page_down(n: int) -> int:
    return n & ~(PAGE - 1)


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
        self._starts: list[int] = []               # sorted piece starts
        self._pieces: dict[int, tuple[int, _Alloc]] = {}  # start -> (end, alloc)
        self._next_aid = 1
        self.brk = initial_brk
        self.sites: dict[tuple[int, int, str], SiteStat] = {}
        self.flows: dict[tuple[int, int], list[int]] = {}  # (alloc tid, free tid) -> [bytes, count, wait_sum, wait_max]
        self.released: list[tuple[int, int, str, int]] = []  # (ts, tid, kind, bytes) outside tracked regions

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

    # --- syscalls ------------------------------------------------------------------------

    def unmap(self, addr: int, length: int, tid: int, ts_ns: int, why: str = "munmap") -> int:
        lo, hi = page_down(addr), page_up(addr + length)
        if hi <= lo:
            return 0
        freed = self._charge_free(self._extract(lo, hi), tid, ts_ns)
        if freed == 0:
            self.released.append((ts_ns, tid, why, hi - lo))
        return freed

    def mmap(self, addr: int, length: int, flags: int, fd: int, stack_id: int, tid: int,
             ts_ns: int, in_allocator: bool, prot: int = 3) -> None:
        lo, hi = page_down(addr), page_up(addr + length)
        # The kernel replaces whatever was mapped there (MAP_FIXED); charge it as freed.
        self._charge_free(self._extract(lo, hi), tid, ts_ns)
        # PROT_NONE: address space reserved (glibc's 64 MiB heap reservations), not memory.
        if in_allocator or not (flags & MAP_ANONYMOUS) or prot == 0 or hi <= lo:
            return
        self._new_alloc(lo, hi, stack_id, tid, ts_ns, "mmap")

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
        return [(s, end - s, a.stack_id, a.tid, a.ts_ns, a.source)
                for s in self._starts for end, a in [self._pieces[s]]]

    def live_bytes(self) -> int:
        return sum(end - s for s, (end, _a) in self._pieces.items())

    def live_count(self) -> int:
        return len({id(a) for _e, a in self._pieces.values()})
