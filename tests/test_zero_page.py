"""The kernel's zero pages are no RSS (issue 46): a read through /proc/PID/mem — how glibc's census
reads the heaps — maps the shared zero page into untouched or trimmed pages, or the huge zero page
where transparent huge pages apply; the pagemap meter must not count them as resident, as
PAGEMAP_SCAN (PAGE_IS_PFNZERO) does not. Needs root (pagemap shows page frames to root only)."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from tracer.allocators.arenas import HUGE, PAGE, Pagemap, PageScan, zero_pfns

pytestmark = pytest.mark.root


def _read_through_mem(addr: int, n: int) -> None:
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        assert len(os.pread(fd, n, addr)) == n
    finally:
        os.close(fd)


@pytest.mark.parametrize("huge", [False, True], ids=["zero-page", "huge-zero-page"])
def test_pages_read_but_never_written_are_not_resident(huge):
    small, big = zero_pfns()
    assert small is not None  # root: the frames are shown
    size = 8 * HUGE
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        ref = ctypes.c_char.from_buffer(m)
        base = ctypes.addressof(ref)
        del ref
        at = (base + HUGE - 1) // HUGE * HUGE
        if huge:
            if big is None:
                pytest.skip("no huge zero page here (transparent huge pages off)")
            m.madvise(mmap.MADV_HUGEPAGE, 0, size)
        n = 4 * HUGE
        _read_through_mem(at, n)
        m[at - base + 3 * PAGE] = 1  # one page written: that one is resident
        with Pagemap(os.getpid()) as pm:
            got = pm.resident(at, at + n)
            pm.zero = pm.huge_zero = None
            naive = pm.resident(at, at + n)
        with PageScan(os.getpid()) as ps:
            scan = ps.resident(at, at + n)
        written = HUGE if huge else PAGE  # a write into a huge zero page gets a huge page of its own
        assert got == scan and got <= written, (got, scan)
        assert naive >= n - written  # what the meter counted before: every page read
    finally:
        m.close()
