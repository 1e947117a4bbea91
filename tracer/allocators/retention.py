"""What each allocator keeps resident: its own mappings, measured every interval.

An allocator's own memory is what it maps inside its own calls: glibc's heaps and mmapped chunks,
jemalloc's extents, tcmalloc's spans, mimalloc's segments. The kernel side never tracks those as
regions (an mmap inside malloc belongs to that call) and remembers them in the `untracked` LRU
(start -> end, with file mappings and PROT_NONE reservations beside them). Each interval the tracer
merges that LRU into its own copy (the LRU may drop old entries; the copy keeps them while a mapping
is still there), keeps the anonymous part of each range (/proc/PID/maps), takes out what is a
traced region or a glibc heap, and gives each range to an allocator:

* glibc: its heaps (tracer/allocators/arenas.py: `[heap]`, the 64 MiB-aligned thread heaps) and the ranges
  that start with one of its mmapped chunks (the chunk header: IS_MMAPPED set, its size plus the
  alignment gap equal to the mapping's length; 16 bytes read from /proc/PID/mem per new range);
  `[heap]` is tcmalloc's where tcmalloc serves malloc (it grows the break with sbrk);
* any other range: the allocator other than glibc (the one serving malloc first when several).

What a family's retained memory is, whether the break is its where it serves malloc (`owns_brk`)
and where it alone maps (`segment_area`) are facts of its module in common/allocators/.

Residency is read with ioctl(PAGEMAP_SCAN) (runs of present pages, exact) where the kernel has it,
else from /proc/PID/pagemap within the page budget. Live bytes per allocator are its sites' live
bytes (source `heap` for the one serving malloc, `heap:KIND[:PREFIX]` for the others). Memory an
allocator mapped before the attach is not in the LRU; mimalloc's is found by its shape
(its family's `segment_area`, `area_ranges`: its segments are mapped at 32 MiB-aligned hint
addresses between 2 and 30 TiB, where nothing else maps), so pages a burst after the attach touches in segments reserved
before it count as mimalloc's, not other anonymous memory. Other allocators' memory from before
the attach stays other anonymous memory.
"""

from __future__ import annotations

import bisect
import os
import time
from dataclasses import dataclass

from common import allocators as registry

from ..process import procfs
from .arenas import Heap, find_heaps, merge_ranges, resident_meter


@dataclass
class Owner:
    source: str  # "heap" or "heap:KIND[:PREFIX]"
    kind: str  # a family's name (common/allocators) | static | custom
    label: str  # KIND[:PREFIX]
    serves_malloc: bool


def subtract_ranges(ranges: list[tuple[int, int]], cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` less every byte of `cuts` (both sorted, cuts merged)."""
    out: list[tuple[int, int]] = []
    j = 0
    for lo, hi in ranges:
        cur = lo
        while j < len(cuts) and cuts[j][1] <= cur:
            j += 1
        k = j
        while k < len(cuts) and cuts[k][0] < hi:
            if cuts[k][0] > cur:
                out.append((cur, cuts[k][0]))
            cur = max(cur, cuts[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def area_ranges(maps: list[procfs.Mapping], area: tuple[int, int]) -> list[tuple[int, int]]:
    """The read-write anonymous mappings starting in `area` [lo, hi) (a family's `segment_area`)."""
    lo, hi = area
    return merge_ranges(
        (m.start, m.end) for m in maps if m.is_anonymous and m.perms.startswith("rw") and lo <= m.start < hi
    )


def intersect_ranges(ranges: list[tuple[int, int]], vmas: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    j = 0
    for lo, hi in ranges:
        while j < len(vmas) and vmas[j][1] <= lo:
            j += 1
        k = j
        while k < len(vmas) and vmas[k][0] < hi:
            a, b = max(lo, vmas[k][0]), min(hi, vmas[k][1])
            if a < b:
                out.append((a, b))
            k += 1
    return out


class AllocatorMeter:
    """Resident, mapped and live bytes per allocator, every interval (the `allocators` table)."""

    def __init__(self, pid: int, budget_pages: int, owners: list[Owner]) -> None:
        self.pid, self.budget = pid, budget_pages
        self.owners = owners
        self.known: dict[int, int] = {}  # untracked ranges seen (start -> end), ours
        self.glibc_chunk: dict[tuple[int, int], bool] = {}  # range -> starts with a glibc mmapped chunk
        self.last: list[tuple] = []
        self.per: dict[str, list[tuple[int, int]]] = {}  # each allocator's ranges at the last measure

    def _glibc(self) -> Owner | None:
        return next((o for o in self.owners if o.kind == "glibc"), None)

    def _other(self) -> Owner | None:
        others = [o for o in self.owners if o.kind != "glibc"]
        others.sort(key=lambda o: not o.serves_malloc)
        return others[0] if others else None

    def _is_glibc_chunk(self, fd: int, lo: int, hi: int) -> bool:
        key = (lo, hi)
        if key not in self.glibc_chunk:
            try:
                b = os.pread(fd, 16, lo)
            except OSError:
                b = b""
            ok = False
            if len(b) == 16:
                prev, size = int.from_bytes(b[:8], "little"), int.from_bytes(b[8:], "little")
                ok = bool(size & 2) and prev % 16 == 0 and prev + (size & ~7) == hi - lo
            self.glibc_chunk[key] = ok
        return self.glibc_chunk[key]

    def measure(
        self,
        untracked: dict[int, int],
        regions: list[tuple[int, int]],
        live_by_source: dict[str, int],
        maps: list[procfs.Mapping] | None = None,
    ) -> tuple[list[tuple], float]:
        """Rows (source, kind, mapped_bytes, resident_bytes, live_bytes, ranges) and the ms taken."""
        t0 = time.perf_counter()
        self.per = self._ranges(untracked, regions, procfs.read_maps(self.pid) if maps is None else maps)
        return self._resident(live_by_source), (time.perf_counter() - t0) * 1e3

    def remeasure(self, live_by_source: dict[str, int]) -> tuple[list[tuple], float]:
        """measure() over the last measure's ranges: when nothing they are made of (the maps, the
        untracked LRU, the regions) can have changed since (tracer/record/readgate.py)."""
        t0 = time.perf_counter()
        return self._resident(live_by_source), (time.perf_counter() - t0) * 1e3

    def relive(self, live_by_source: dict[str, int]) -> list[tuple]:
        """The last measure's rows with the live bytes of now: when nothing the measure reads
        can have changed since (tracer/record/readgate.py), its mapped and resident bytes hold."""
        self.last = [(*r[:4], int(live_by_source.get(r[0], 0)), r[5]) for r in self.last]
        return self.last

    def _ranges(
        self, untracked: dict[int, int], regions: list[tuple[int, int]], maps: list[procfs.Mapping]
    ) -> dict[str, list[tuple[int, int]]]:
        """Each allocator's own ranges (its source -> merged ranges)."""
        self.known.update(untracked)
        anon = merge_ranges((m.start, m.end) for m in maps if m.is_anonymous)
        mapped = merge_ranges((m.start, m.end) for m in maps)
        # forget ranges no longer mapped at all (their munmap came while the LRU had dropped them)
        starts = [lo for lo, _hi in mapped]
        keep = {}
        for lo, hi in self.known.items():
            i = bisect.bisect_right(starts, lo) - 1  # the mapping at or before lo, or the next one
            if (i >= 0 and mapped[i][1] > lo) or (i + 1 < len(mapped) and mapped[i + 1][0] < hi):
                keep[lo] = hi
        self.known = keep
        if len(self.glibc_chunk) > 2 * len(keep) + 64:
            self.glibc_chunk = {k: v for k, v in self.glibc_chunk.items() if keep.get(k[0]) == k[1]}
        heaps: list[Heap] = find_heaps(self.pid, maps)
        glibc, other = self._glibc(), self._other()
        brk_owner = glibc
        fam = registry.family(other.kind) if other is not None else None
        if other is not None and fam is not None and fam.owns_brk and other.serves_malloc:
            brk_owner = other
        cuts = merge_ranges([(h.start, h.reserved_end) for h in heaps] + list(regions))
        per: dict[str, list[tuple[int, int]]] = {o.source: [] for o in self.owners}
        for h in heaps:
            owner = brk_owner if h.kind == "main" else glibc
            if owner is not None:
                per[owner.source].append((h.start, h.end))
        ranges = subtract_ranges(intersect_ranges(merge_ranges(self.known.items()), anon), cuts)
        for o in self.owners:  # mimalloc: its segments by their shape, those from before the attach too
            area = f.segment_area if (f := registry.family(o.kind)) is not None else None
            if area is not None:
                seg = subtract_ranges(area_ranges(maps, area), cuts)
                per[o.source] += seg
                ranges = subtract_ranges(ranges, seg)
        if ranges:
            fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY) if glibc is not None and other is not None else -1
            try:
                for lo, hi in ranges:
                    if other is None or (fd >= 0 and self._is_glibc_chunk(fd, lo, hi)):
                        if glibc is not None:
                            per[glibc.source].append((lo, hi))
                    else:
                        per[other.source].append((lo, hi))
            finally:
                if fd >= 0:
                    os.close(fd)
        return {src: merge_ranges(rs) for src, rs in per.items()}

    def _resident(self, live_by_source: dict[str, int]) -> list[tuple]:
        rows = []
        with resident_meter(self.pid, self.budget) as pm:
            for o in self.owners:
                rs = self.per.get(o.source, [])
                res = sum(pm.resident_many(rs)) if rs else 0
                rows.append(
                    (
                        o.source,
                        o.label,
                        sum(hi - lo for lo, hi in rs),
                        res,
                        int(live_by_source.get(o.source, 0)),
                        len(rs),
                    )
                )
        self.last = rows
        return rows


def live_by_source(sites: dict) -> dict[str, int]:
    """{source: live bytes} of the heap-API sources, from the cumulative site counters."""
    out: dict[str, int] = {}
    for (_sid, _tid, src), v in sites.items():
        if src == "heap" or src.startswith("heap:"):
            out[src] = out.get(src, 0) + v[0] - v[2]
    return out


def read_cstring(pid: int, addr: int, limit: int = 96) -> str:
    """A NUL-terminated string of the target (mallctl's name), '' when unreadable."""
    if not addr:
        return ""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return ""
    try:
        b = os.pread(fd, limit, addr)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def purge_function(kind: str, pid: int, arg: int) -> tuple[str, str]:
    """(function, name) of a purge call of an allocator of `kind`, from its first argument (how
    its family names it: `purge_function`, `purge_arg`; malloc_trim's for the others)."""
    f = registry.family(kind)
    function, what = (f.purge_function, f.purge_arg) if f is not None else ("malloc_trim", "int")
    if what == "cstring":  # jemalloc's mallctl name
        return function, read_cstring(pid, arg)
    if what == "force_bit":  # mi_collect(bool force)
        return function, "force" if arg & 1 else ""
    if what == "none":  # tcmalloc: ReleaseFreeMemory() and ReleaseToSystem(n) share one program
        return function, ""
    return function, str(arg)


class PurgeLog:
    """The `purges` table: each allocator's purge calls, as they come."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add(
        self, ts_ns: int, tid: int, source: str, function: str, name: str, duration_ns: int, before: int, after: int
    ) -> None:
        self.rows.append((ts_ns, tid, source, function, name, duration_ns, before, after, before - after))

    def part(self, seq: int):
        if not self.rows:
            return None
        import pyarrow as pa  # noqa: PLC0415

        from common.tracefile import format as F  # noqa: PLC0415

        rows, self.rows = self.rows, []
        names = F.SCHEMAS["purges"].names
        cols = {n: [seq] * len(rows) if i == 0 else [r[i - 1] for r in rows] for i, n in enumerate(names)}
        return pa.table(cols, schema=F.SCHEMAS["purges"])


def allocator_part(seq: int, rows: list[tuple]):
    import pyarrow as pa  # noqa: PLC0415

    from common.tracefile import format as F  # noqa: PLC0415

    names = F.SCHEMAS["allocators"].names
    cols = {n: [seq] * len(rows) if i == 0 else [r[i - 1] for r in rows] for i, n in enumerate(names)}
    return pa.table(cols, schema=F.SCHEMAS["allocators"])
