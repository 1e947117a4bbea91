"""Where the allocator keeps memory resident: glibc arenas and mapped chunks, measured cheaply.

* Heaps are found from /proc/PID/maps: the main arena is `[heap]` (brk); a thread-arena heap is
  an anonymous mapping aligned to 64 MiB (HEAP_MAX_SIZE on 64-bit), its unused tail reserved
  PROT_NONE. The 8 bytes at its start are `heap_info.ar_ptr`, read from /proc/PID/mem — the only
  target memory allocscope reads — to group several heaps of one arena.
* Residency comes from /proc/PID/pagemap (bit 63: present; the kernel's zero pages, which a read
  of an untouched page maps, left out: zero_pfns) for those ranges only: 8 bytes read per
  4 KiB page, never a walk of every mapping like /proc/PID/smaps (seconds on a 200 GB daemon,
  holding its mmap lock). A per-call page budget bounds the cost; above it, evenly spaced
  windows are sampled and the result is marked estimated.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from common.pages import PAGE, page_down, page_up

from ..process.procfs import Mapping

HEAP_MAX = 64 << 20  # glibc HEAP_MAX_SIZE on 64-bit
WINDOW = 512  # pages read per sampling window (4 KiB of pagemap)
DEFAULT_BUDGET = 1 << 20  # pages per measurement (4 GiB of address space, 8 MiB of pagemap)


@dataclass
class Heap:
    start: int
    end: int  # end of the read-write part
    reserved_end: int  # end including the PROT_NONE tail
    kind: str  # 'main' | 'thread'
    arena: str  # 'main' or the arena address (hex) from heap_info.ar_ptr


def find_heaps(pid: int, maps: list[Mapping]) -> list[Heap]:
    """glibc heaps of the process: the brk heap and every thread-arena heap.

    A thread heap is the 64 MiB-aligned reservation glibc maps with MAP_NORESERVE: its read-write
    part from the aligned start, then the PROT_NONE rest (none once grown to 64 MiB). The kernel
    merges an adjacent mapping of the same kind into that read-write part (allocscope's own
    --inject agent tables, mapped below a heap, did: the census lost a whole arena), so the heap
    is the last 64 MiB boundary inside a read-write mapping, not the mapping's start."""
    ms = sorted(maps, key=lambda m: m.start)
    heaps: list[Heap] = []
    for m in ms:
        if m.path == "[heap]":
            heaps.append(Heap(m.start, m.end, m.end, "main", "main"))
    candidates = []  # (heap start, end of its read-write part, end of the reservation)
    for i, m in enumerate(ms):
        if not (m.is_anonymous and m.perms.startswith("rw")):
            continue
        start = (m.end - 1) // HEAP_MAX * HEAP_MAX
        if start < m.start:
            continue  # no 64 MiB boundary inside
        reserved = m.end
        if reserved < start + HEAP_MAX and i + 1 < len(ms):
            nxt = ms[i + 1]
            if nxt.is_anonymous and nxt.perms.startswith("---") and nxt.start == m.end:
                reserved = min(nxt.end, start + HEAP_MAX)
        if reserved != start + HEAP_MAX:
            continue  # not a whole 64 MiB heap reservation
        candidates.append((start, m.end, reserved))
    if not candidates:
        return heaps
    ptrs = _read_words(pid, [start for start, _, _ in candidates])
    ranges = [(start, end) for start, end, _ in candidates]
    for (start, end, reserved), ar in zip(candidates, ptrs):
        # ar_ptr points into the first heap of its arena (the malloc_state follows heap_info).
        if ar is None or not any(lo <= ar < hi for lo, hi in ranges):
            continue
        heaps.append(Heap(start, end, reserved, "thread", f"{ar:#x}"))
    return heaps


def _read_words(pid: int, addrs: list[int]) -> list[int | None]:
    out: list[int | None] = []
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return [None] * len(addrs)
    try:
        for a in addrs:
            try:
                b = os.pread(fd, 8, a)
                out.append(int.from_bytes(b, "little") if len(b) == 8 else None)
            except OSError:
                out.append(None)
    finally:
        os.close(fd)
    return out


PFN_MASK = (1 << 55) - 1


HUGE = 2 << 20  # a PMD's worth of pages: the huge zero page's span


def _pfn_of(addr: int) -> int | None:
    """The page frame mapped at `addr` in this process (None: not present, or frames hidden)."""
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        e = int.from_bytes(os.pread(fd, 8, addr // PAGE * 8), "little")
    finally:
        os.close(fd)
    return (e & PFN_MASK) or None if e >> 63 else None


@lru_cache(maxsize=1)
def zero_pfns() -> tuple[int | None, int | None]:
    """(the page frame of the kernel's shared zero page, the first frame of its huge zero page),
    each None when not found (pagemap hides frames without CAP_SYS_ADMIN; no transparent huge
    pages). A read of untouched anonymous memory maps one of them, and so does a read through
    /proc/PID/mem (glibc's census reads every heap that way): present in pagemap, but no RSS."""
    out: list[int | None] = []
    for size, huge in ((PAGE, False), (2 * HUGE, True)):
        try:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError:
            out.append(None)
            continue
        try:
            ref = ctypes.c_char.from_buffer(m)
            base = ctypes.addressof(ref)
            del ref
            at = (base + HUGE - 1) // HUGE * HUGE if huge else base
            if huge:
                m.madvise(mmap.MADV_HUGEPAGE, at - base, HUGE)
            _ = m[at - base]  # a read fault: the zero page (a huge one where THP applies)
            pfn = _pfn_of(at)
            out.append(pfn if not huge or (pfn is not None and pfn != out[0] and pfn % 512 == 0) else None)
        except (OSError, ValueError, AttributeError):
            out.append(None)
        finally:
            m.close()
    return out[0], out[1]


class Pagemap:
    """Resident bytes of address ranges of one process, from /proc/PID/pagemap: present pages,
    the shared zero page left out (it is no RSS; a read through /proc/PID/mem maps it)."""

    def __init__(self, pid: int, budget_pages: int = DEFAULT_BUDGET) -> None:
        self.fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
        self.budget = budget_pages
        self.pages_read = 0
        self.estimated = False
        self.zero, self.huge_zero = zero_pfns()

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Pagemap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _present(self, first_page: int, n: int) -> int:
        data = os.pread(self.fd, 8 * n, 8 * first_page)
        self.pages_read += len(data) // 8
        arr = np.frombuffer(data[: len(data) // 8 * 8], dtype="<u8")
        present = (arr >> np.uint64(63)).astype(bool)
        if self.zero is not None or self.huge_zero is not None:
            pfn = arr & np.uint64(PFN_MASK)
            if self.zero is not None:
                present &= pfn != np.uint64(self.zero)
            if self.huge_zero is not None:
                present &= (pfn < np.uint64(self.huge_zero)) | (pfn >= np.uint64(self.huge_zero + 512))
        return int(np.count_nonzero(present))

    def resident(self, start: int, end: int, budget: int | None = None) -> int:
        """Resident bytes in [start, end). Exact while the range fits the budget (pages);
        beyond it, `budget // WINDOW` evenly spaced windows are read and scaled."""
        lo, hi = start // PAGE, (end + PAGE - 1) // PAGE
        n = hi - lo
        if n <= 0:
            return 0
        budget = self.budget if budget is None else budget
        try:
            if n <= budget:
                present = 0
                for off in range(0, n, 1 << 16):
                    present += self._present(lo + off, min(1 << 16, n - off))
                return present * PAGE
            self.estimated = True
            windows = max(1, budget // WINDOW)
            step = n // windows
            seen = present = 0
            for w in range(windows):
                k = min(WINDOW, n - w * step)
                present += self._present(lo + w * step, k)
                seen += k
            return int(present / max(seen, 1) * n) * PAGE
        except OSError:
            return 0

    def resident_many(self, ranges: list[tuple[int, int]]) -> list[int]:
        """Resident bytes of each range, the page budget shared by all of them: exact when
        their total fits, otherwise each range is sampled in proportion to its size."""
        total = sum(max(0, (hi - lo) // PAGE) for lo, hi in ranges)
        if total <= self.budget:
            return [self.resident(lo, hi, budget=total) for lo, hi in ranges]
        return [
            self.resident(lo, hi, budget=max(WINDOW, self.budget * ((hi - lo) // PAGE) // total)) for lo, hi in ranges
        ]


def merge_ranges(ranges) -> list[tuple[int, int]]:
    """(lo, hi) ranges (any iterable) sorted, with overlapping and touching ones merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def outside_heaps(addr: np.ndarray, heaps: list[Heap]) -> np.ndarray:
    """Boolean mask of the addresses that lie in no glibc heap (start .. reserved end)."""
    addr = np.asarray(addr, dtype=np.uint64)
    hs = sorted((h.start, h.reserved_end) for h in heaps)
    if not hs or len(addr) == 0:
        return np.ones(len(addr), dtype=bool)
    starts = np.array([h[0] for h in hs], dtype=np.uint64)
    ends = np.array([h[1] for h in hs], dtype=np.uint64)
    i = np.searchsorted(starts, addr, side="right") - 1
    return ~((i >= 0) & (addr < ends[np.clip(i, 0, None)]))


def chunk_ranges(blocks: tuple[np.ndarray, np.ndarray], heaps: list[Heap]) -> list[tuple[int, int]]:
    """Page ranges of live heap-API blocks (addresses, sizes) that lie outside every glibc heap:
    the allocator's own mmapped chunks (glibc serves requests above the mmap threshold that way).
    Vectorized: millions of live blocks are normal."""
    addr = np.asarray(blocks[0], dtype=np.uint64)
    size = np.asarray(blocks[1], dtype=np.uint64)
    if len(addr) == 0:
        return []
    out = outside_heaps(addr, heaps)
    addr, size = addr[out], size[out]
    mask = np.uint64(~(PAGE - 1) & 0xFFFFFFFFFFFFFFFF)
    lo = (addr - np.uint64(16)) & mask
    hi = (addr + size + np.uint64(PAGE - 1)) & mask
    return merge_ranges(list(zip(lo.tolist(), hi.tolist())))


# --- ioctl(PAGEMAP_SCAN) (Linux 6.7+): present pages as run-length ranges -------------------------
# struct pm_scan_arg {size, flags, start, end, walk_end, vec, vec_len, max_pages,
#                     category_inverted, category_mask, category_anyof_mask, return_mask}: 12 u64
# struct page_region {start, end, categories}: 3 u64
PM_SCAN_ARG = struct.Struct("<12Q")
PAGEMAP_SCAN = (3 << 30) | (PM_SCAN_ARG.size << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, ...)
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_PFNZERO = 1 << 5  # the shared zero page (a read of untouched anonymous memory): not RSS
SCAN_REGIONS = 4096  # page_region entries per ioctl (96 KiB buffer)


class PageScan:
    """Resident bytes of address ranges through ioctl(PAGEMAP_SCAN) on /proc/PID/pagemap: the
    kernel walks the page tables and hands back runs of present pages, so the cost follows the
    number of runs and the page-table walk, not 8 bytes per page copied out. Exact, no budget.
    `PageScan.available(pid)` says whether this kernel has it (else: Pagemap)."""

    def __init__(self, pid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
        self.buf = ctypes.create_string_buffer(24 * SCAN_REGIONS)
        self.arg = ctypes.create_string_buffer(PM_SCAN_ARG.size)
        self.calls = 0
        self.zero_page = True  # PAGE_IS_PFNZERO understood (6.8+); cleared when refused

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PageScan:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _scan(self, start: int, end: int) -> tuple[int, int]:
        """(present bytes found, where the walk ended) for one ioctl over [start, end)."""
        if self.zero_page:  # present and not the zero page
            inv, mask = PAGE_IS_PFNZERO, PAGE_IS_PRESENT | PAGE_IS_PFNZERO
        else:
            inv, mask = 0, PAGE_IS_PRESENT
        PM_SCAN_ARG.pack_into(
            self.arg,
            0,
            PM_SCAN_ARG.size,
            0,
            start,
            end,
            0,
            ctypes.addressof(self.buf),
            SCAN_REGIONS,
            0,
            inv,
            mask,
            0,
            PAGE_IS_PRESENT,
        )
        n = fcntl.ioctl(self.fd, PAGEMAP_SCAN, self.arg, True)
        self.calls += 1
        walk_end = PM_SCAN_ARG.unpack_from(self.arg, 0)[4]
        if n <= 0:
            return 0, walk_end
        regions = np.frombuffer(memoryview(self.buf), dtype="<u8", count=3 * n).reshape(n, 3).astype(np.int64)
        if n == SCAN_REGIONS:  # the vector filled: walk_end may be the start of the PMD it was in,
            walk_end = max(walk_end, int(regions[-1, 1]))  # before runs it already reported
        return int((regions[:, 1] - regions[:, 0]).sum()), walk_end

    def resident(self, start: int, end: int) -> int:
        lo, hi = page_down(start), page_up(end)
        total = 0
        while lo < hi:
            try:
                got, walk_end = self._scan(lo, hi)
            except OSError as e:
                if self.zero_page and e.errno == errno.EINVAL:
                    self.zero_page = False  # a kernel without PAGE_IS_PFNZERO
                    continue
                raise
            total += got
            if walk_end <= lo:
                break
            lo = walk_end
        return total

    def resident_many(self, ranges: list[tuple[int, int]]) -> list[int]:
        return [self.resident(lo, hi) for lo, hi in ranges]

    @staticmethod
    def available(pid: int) -> bool:
        try:
            with PageScan(pid) as ps:
                ps.resident(0, PAGE)
            return True
        except OSError:
            return False


def resident_meter(pid: int, budget_pages: int = DEFAULT_BUDGET):
    """PageScan where the kernel has PAGEMAP_SCAN (exact, cheap), else the pread Pagemap."""
    try:
        return PageScan(pid) if _has_scan() else Pagemap(pid, budget_pages)
    except OSError:
        return Pagemap(pid, budget_pages)


@lru_cache(maxsize=1)
def _has_scan() -> bool:
    return PageScan.available(os.getpid())
