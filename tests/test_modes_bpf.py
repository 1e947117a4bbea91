"""Byte-weighted sampling and residency mode on targets with known allocations."""
from __future__ import annotations

from collections import defaultdict

import pytest
from support import cli, report_json

pytestmark = pytest.mark.bpf
PAGE = 4096


def by_function(rep: dict) -> dict[str, dict]:
    agg: dict[str, dict] = defaultdict(lambda: {"live_bytes": 0, "error": 0, "sources": set(), "alloc_count": 0})
    for s in rep["sites"]:
        a = agg[s["frames"][0]["function"]]
        a["live_bytes"] += s["live_bytes"]
        a["error"] += s.get("live_bytes_error", 0)
        a["alloc_count"] += s["alloc_count"]
        a["sources"] |= set(s["sources"])
    return agg


def test_sampled_estimates_within_error_bars(targets, tmp_path):
    out = tmp_path / "sampled.allocscope"
    cli("record", "-q", "--sample-bytes", "8192", "-o", str(out), "--", str(targets["sizes"]), check=True)
    rep = report_json(out)
    assert any("sampled trace" in a for a in rep["advice"])
    agg = by_function(rep)
    truth = {"small_blocks": 20000 * 1000, "medium_blocks": 1500 * 50000, "tiny_blocks": 100000 * 64}
    for fn, true in truth.items():
        est, err = agg[fn]["live_bytes"], agg[fn]["error"]
        assert err > 0
        assert abs(est - true) <= 2 * err, (fn, est, true, err)   # 2x the 95% bar: ~4 sigma
        assert abs(est - true) <= 0.15 * true, (fn, est, true)
    # blocks >= N are always sampled and exact
    assert agg["medium_blocks"]["live_bytes"] == 1500 * 50000
    assert agg["medium_blocks"]["alloc_count"] == 1500
    # far fewer small blocks were recorded than allocated
    assert agg["tiny_blocks"]["alloc_count"] < 100000 * 64 / 8192 * 2


def test_residency_mode_exact_mmaps_and_first_touches(targets, tmp_path):
    out = tmp_path / "residency.allocscope"
    cli("record", "-q", "--mode", "residency", "--fault-sample", "4", "--unwind", "fp", "-o", str(out), "--",
        str(targets["apis"]), check=True)
    rep = report_json(out)
    assert rep["recording"]["probes"]["attached"] == []
    assert any("residency mode" in a for a in rep["advice"])
    agg = by_function(rep)
    assert agg["map_partial"]["live_bytes"] == 3 * PAGE
    assert agg["map_remap"]["live_bytes"] == 9 * PAGE
    assert agg["map_shrink"]["live_bytes"] == 2 * PAGE
    assert agg["map_full_unmap"]["live_bytes"] == 0
    # glibc's mmapped chunk for malloc(1048583) is seen at the mmap syscall, page-rounded (with
    # frame pointers its stack ends inside glibc, which has none: its site is glibc's sysmalloc)
    assert any(x["live_bytes"] == 257 * PAGE and x["sources"] == ["mmap"] for x in rep["sites"])
    assert all("heap" not in s["sources"] for s in rep["sites"])   # no allocator probes
    assert any("fault" in s["sources"] for s in rep["sites"])     # sampled first touches
