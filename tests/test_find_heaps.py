"""find_heaps (tracer/allocators/arenas.py) on /proc/PID/maps layouts taken from real processes:
the word at each candidate heap's start (heap_info.ar_ptr) comes from a stand-in for the target's
memory. The merged layout is the one a CI run recorded under --inject, where the census then
lost one of census.c's five arenas (its 40 MB counted as other anonymous memory)."""

from __future__ import annotations

import pytest

from tracer.allocators import arenas
from tracer.allocators.arenas import HEAP_MAX, find_heaps
from tracer.process.procfs import Mapping


def anon(start: int, end: int, perms: str) -> Mapping:
    return Mapping(start, end, perms, 0, 0, "")


@pytest.fixture
def words(monkeypatch):
    """heap_info.ar_ptr of each heap: its own malloc_state (first heap of an arena) at +0x30."""
    memory: dict[int, int] = {}
    monkeypatch.setattr(arenas, "_read_words", lambda pid, addrs: [memory.get(a) for a in addrs])
    return memory


def test_a_heap_merged_with_the_mapping_below_it_is_found(words):
    plain, merged = 0x7FF28C000000, 0x7FF2A4000000
    words[plain] = plain + 0x30
    words[merged] = merged + 0x30
    maps = [
        anon(plain, plain + 0x2637000, "rw-p"),
        anon(plain + 0x2637000, plain + HEAP_MAX, "---p"),
        # the agent's tables (rw, MAP_NORESERVE) mapped just below the heap: one mapping with it
        anon(0x7FF2A36CC000, 0x7FF2A663A000, "rw-p"),
        anon(0x7FF2A663A000, 0x7FF2A8000000, "---p"),
        anon(0x7FF2A8425000, 0x7FF2A8C27000, "rw-p"),  # a thread stack, not a heap
    ]
    heaps = {h.start: h for h in find_heaps(1, maps) if h.kind == "thread"}
    assert sorted(heaps) == [plain, merged]
    h = heaps[merged]
    assert (h.end, h.reserved_end, h.arena) == (0x7FF2A663A000, merged + HEAP_MAX, f"{merged + 0x30:#x}")
    assert heaps[plain].end == plain + 0x2637000


def test_grown_heaps_and_what_is_not_a_heap(words):
    full, lone = 0x7F0000000000, 0x7F0010000000
    words[full] = full + 0x30
    words[lone] = 0xDEAD000  # points into no heap: some other aligned anonymous mapping
    maps = [
        anon(full - 0x1000, full + HEAP_MAX, "rw-p"),  # grown to 64 MiB, merged below: no PROT_NONE tail
        anon(lone, lone + 0x100000, "rw-p"),
        anon(lone + 0x100000, lone + HEAP_MAX, "---p"),
        anon(0x7F0020000000, 0x7F0020000000 + 3 * HEAP_MAX + 0x5000, "rw-p"),  # a big buffer, no reservation
        Mapping(0x7F0030000000, 0x7F0030000000 + 0x21000, "rw-p", 0, 0, "[heap]"),
    ]
    heaps = find_heaps(1, maps)
    assert [(h.kind, h.start, h.end) for h in heaps] == [
        ("main", 0x7F0030000000, 0x7F0030021000),
        ("thread", full, full + HEAP_MAX),
    ]
