"""Calls in flight while the probes attach (issue 53, item 6: a 112 MiB "mmap" location in redis,
a two-frame stack dated at the attach). The attachrace target (tests/targets/attachrace.c) runs
while the tracer attaches: one thread mallocs and frees a 40 MiB block (glibc maps and unmaps it
inside malloc and free), the other maps 24 MiB with MAP_POPULATE and unmaps it (milliseconds in
the kernel each, usually one in flight when the probes go live). No mapping of either may be
live at the end, and every mmap site must be the program's own (map_loop), never a malloc
chunk's nor a stack cut short at the attach."""

from __future__ import annotations

import re
import signal
import time

import pytest
from support import functions, record_attached, report_json, stop_tracer

pytestmark = pytest.mark.bpf

PAGE = 4096
CHUNK = (40 << 20) | 3 * PAGE | 123
MAP = (24 << 20) | 5 * PAGE


def test_calls_in_flight_at_the_attach_are_no_allocations(targets, tmp_path, procs, tracers):
    tgt = procs(targets["attachrace"])
    tgt.expect("ready")
    time.sleep(0.2)  # both loops running before the tracer starts
    out = tmp_path / "race.allocscope"
    tr = record_attached(tracers, tgt.pid, out, "--interval", "0.5")
    time.sleep(0.3)  # calls after the attach: counted
    tgt.signal(signal.SIGUSR1)
    m = re.match(r"stopped chunks=(\d+) maps=(\d+)", tgt.expect("stopped"))
    stop_tracer(tr, 0.6)
    assert int(m[1]) > 100 and int(m[2]) > 10, m[0]
    rep = report_json(out)
    assert rep["recording"]["children"] is None  # threads, no forked child
    mmap_sites = [s for s in rep["sites"] if {"mmap", "brk"} & set(s["sources"])]
    # the program's own mappings after the attach are counted, each at map_loop, all unmapped
    own = [s for s in mmap_sites if "map_loop" in functions(s["frames"])]
    n = sum(s["alloc_count"] for s in own)
    assert n >= 3, own
    assert sum(s["alloc_bytes"] for s in own) == n * MAP
    assert sum(s["live_bytes"] for s in own) == 0, own
    # nothing else: no malloc chunk taken for the program's mmap, no site made up at the attach
    made_up = [(functions(s["frames"]), s["alloc_bytes"], s["live_bytes"]) for s in mmap_sites if s not in own]
    assert made_up == [], made_up
    # the chunks are the heap's: every one after the attach, freed
    heap = [s for s in rep["sites"] if "chunk_loop" in functions(s["frames"])]
    assert {src for s in heap for src in s["sources"]} == {"heap"}, heap
    chunks = sum(s["alloc_count"] for s in heap)
    assert chunks >= 10 and sum(s["alloc_bytes"] for s in heap) == chunks * CHUNK
    assert sum(s["live_bytes"] for s in heap) == 0, heap
