"""Page-exact accounting of mmap/munmap/mremap/brk replayed by tracer.record.regions."""

from __future__ import annotations

from common.pages import PAGE
from tracer.record.regions import MAP_ANONYMOUS, RegionTracker

ANON = MAP_ANONYMOUS | 0x02  # MAP_PRIVATE


def site(t: RegionTracker, sid: int, tid: int = 7, src: str = "mmap"):
    return t.sites[(sid, tid, src)]


def test_partial_munmap_is_page_exact():
    t = RegionTracker()
    t.mmap(0x10000, 5 * PAGE, ANON, -1, stack_id=1, tid=7, ts_ns=0, in_allocator=False)
    t.unmap(0x10000 + PAGE, PAGE, tid=7, ts_ns=1)
    t.unmap(0x10000 + 4 * PAGE, 100, tid=7, ts_ns=2)  # partial page: whole page goes
    assert t.live_bytes() == 3 * PAGE and t.live_count() == 1
    s = site(t, 1)
    assert (s.alloc_bytes, s.alloc_count, s.free_bytes, s.free_count) == (5 * PAGE, 1, 2 * PAGE, 0)
    t.unmap(0x10000, 5 * PAGE, tid=8, ts_ns=10)
    assert t.live_bytes() == 0 and site(t, 1).free_count == 1
    assert t.flows[(7, 8)][0] == 3 * PAGE and t.flows[(7, 8)][1] == 1


def test_allocator_mmaps_and_file_maps_are_not_allocations():
    t = RegionTracker()
    t.mmap(0x10000, 64 * PAGE, ANON, -1, 1, 7, 0, in_allocator=True)  # glibc chunk inside malloc
    t.mmap(0x90000, 4 * PAGE, 0x02, 3, 1, 7, 0, in_allocator=False)  # file mapping
    assert t.live_bytes() == 0
    assert t.unmap(0x10000, 64 * PAGE, 7, 1) == 0  # free() unmapping its chunk changes nothing
    assert t.released[-1][3] == 64 * PAGE


def test_map_fixed_over_tracked_range_frees_it():
    t = RegionTracker()
    t.mmap(0x10000, 4 * PAGE, ANON, -1, 1, 7, 0, False)
    t.mmap(0x10000 + 2 * PAGE, 4 * PAGE, ANON | 0x10, -1, 2, 7, 1, False)
    assert t.live_bytes() == 6 * PAGE
    assert site(t, 1).free_bytes == 2 * PAGE and site(t, 2).alloc_bytes == 4 * PAGE


def test_mremap_grow_move_and_shrink():
    t = RegionTracker()
    t.mmap(0x10000, 4 * PAGE, ANON, -1, 1, 7, 0, False)
    t.mremap(0x10000, 4 * PAGE, 0x80000, 9 * PAGE, 7, 1)  # grown and moved
    assert t.live() == [(0x80000, 9 * PAGE, 1, 7, 0, "mmap")]
    assert site(t, 1).alloc_bytes == 9 * PAGE and site(t, 1).alloc_count == 1
    t.mremap(0x80000, 9 * PAGE, 0x80000, 2 * PAGE, 7, 2)  # shrunk in place
    assert t.live_bytes() == 2 * PAGE and site(t, 1).free_bytes == 7 * PAGE
    assert site(t, 1).peak_live_bytes == 9 * PAGE


def test_brk_outside_allocator():
    t = RegionTracker(initial_brk=0x500000)
    t.set_brk(0x500000 + 3 * PAGE, stack_id=5, tid=7, ts_ns=0, in_allocator=False)
    t.set_brk(0x500000 + 10 * PAGE, stack_id=5, tid=7, ts_ns=1, in_allocator=True)  # malloc grows heap
    assert t.live_bytes() == 3 * PAGE
    t.set_brk(0x500000 + PAGE, stack_id=5, tid=7, ts_ns=2, in_allocator=False)
    assert t.live_bytes() == PAGE and site(t, 5, src="brk").free_bytes == 2 * PAGE
