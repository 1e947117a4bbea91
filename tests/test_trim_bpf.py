"""After malloc_trim(0), glibc's arena is what is still resident, not the size of its free chunks
(issue 46): the trim target fragments the main arena, trims, and prints smaps' Rss of [heap]."""

from __future__ import annotations

import re

import pytest
from support import cli, report_json

pytestmark = pytest.mark.bpf


def test_trimmed_arena_counts_resident_pages(targets, tmp_path):
    out = tmp_path / "trim.allocscope"
    p = cli("record", "-q", "-o", str(out), "--", str(targets["trim"]), check=True)
    m = re.search(r"heap rss=(\d+) live=(\d+)", p.stdout)
    assert m, p.stdout
    heap_rss, live = int(m[1]), int(m[2])
    released = int(re.search(r"trim1 ret=1 released=(\d+)", p.stdout)[1])
    assert released > 50 << 20 and heap_rss < 16 << 20, p.stdout  # the trim gave back most of it
    rep = report_json(out)  # ALLOCSCOPE_INVARIANTS=fail (conftest): any part beyond its whole fails here
    assert rep["recording"]["invariants"] == []
    main = next(a for a in rep["arenas"] if a["id"] == "main")
    assert abs(main["resident_bytes"] - heap_rss) <= 0.15 * heap_rss + (1 << 20), (main, heap_rss)
    # the blocks still allocated: 401 of 4000 bytes (chunk bytes in the census: a little more)
    assert abs(main["live_bytes"] - live) <= 0.02 * live, (main, live)
    # retained: the free bytes on the pages still resident, not the free chunks' sizes (~75 MiB)
    free_resident = heap_rss - live - (main["live_before_bytes"] or 0)
    assert abs(main["retained_bytes"] - free_resident) <= 0.15 * free_resident + (1 << 20), (main, heap_rss, live)
    glibc = next(a for a in rep["rss_decomposition"]["allocators"] if a["kind"] == "glibc")
    assert glibc["resident"] <= rep["rss_decomposition"]["rss_bytes"]
    assert glibc["retained"] == main["retained_bytes"]
    for f in rep["findings"]:
        assert all(float(x) <= 100 for x in re.findall(r"(\d+(?:\.\d+)?)%", f["text"])), f["text"]
