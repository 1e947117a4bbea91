"""Byte-weighted sampling and residency mode on targets with known allocations."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

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


def record_sampled(out: Path, target: Path, sample_bytes: int, sessions: str) -> None:
    """Record `target` from its start with --sample-bytes and --uprobe-sessions on|off into `out`."""
    cli(
        "record",
        "-q",
        "--sample-bytes",
        str(sample_bytes),
        "--uprobe-sessions",
        sessions,
        "-o",
        str(out),
        "--",
        str(target),
        check=True,
    )


@pytest.mark.parametrize("sessions", ["on", "off"])
def test_sampled_estimates_within_error_bars(targets, tmp_path, sessions):
    """The same estimates through uprobe sessions (an unsampled call takes no return probe) and
    through classic return probes (the fallback of kernels before 6.13)."""
    out = tmp_path / "sampled.allocscope"
    record_sampled(out, targets["sizes"], 8192, sessions)
    rep = report_json(out)
    probes = rep["recording"]["probes"]
    assert probes["returns"] == ("session" if sessions == "on" else "classic")
    assert probes["returns_why"] == ("" if sessions == "on" else "--uprobe-sessions off")
    assert len(rep["recording"]["allocators"]) == 1  # libc once, though /lib and /usr/lib both name it
    # the heap's growth (brk) inside unsampled mallocs is the allocator's, not the program's
    assert set(rep["totals"]["live_by_source"]) <= {"heap", "mmap"}
    assert rep["totals"]["live_by_source"].get("mmap", 0) < 1 << 20
    assert any("sampled trace" in a for a in rep["advice"])
    agg = by_function(rep)
    truth = {"small_blocks": 20000 * 1000, "medium_blocks": 1500 * 50000, "tiny_blocks": 100000 * 64}
    for fn, true in truth.items():
        est, err = agg[fn]["live_bytes"], agg[fn]["error"]
        assert err > 0
        assert abs(est - true) <= 2 * err, (fn, est, true, err)  # 2x the 95% bar: ~4 sigma
        assert abs(est - true) <= 0.15 * true, (fn, est, true)
    # blocks >= N are always sampled and exact
    assert agg["medium_blocks"]["live_bytes"] == 1500 * 50000
    assert agg["medium_blocks"]["alloc_count"] == 1500
    # far fewer small blocks were recorded than allocated
    assert agg["tiny_blocks"]["alloc_count"] < 100000 * 64 / 8192 * 2


@pytest.mark.parametrize("sessions", ["on", "off"])
def test_sampled_realloc_frees_the_tracked_block(targets, tmp_path, sessions):
    """A sampled block realloc'ed to an unsampled size: the new block is not recorded, the old
    one is freed exactly (in a session the entry keeps the return probe for such a call)."""
    out = tmp_path / "shrink.allocscope"
    record_sampled(out, targets["shrink"], 16384, sessions)
    rep = report_json(out)
    assert rep["recording"]["probes"]["returns"] == ("session" if sessions == "on" else "classic")
    agg = by_function(rep)
    big = agg["big_blocks"]
    assert big["alloc_count"] == 200 and big["live_bytes"] == 0
    assert sum(s["free_count"] for s in rep["sites"] if s["frames"][0]["function"] == "big_blocks") == 200
    # 200 x 100 B: sampled with p = 100/16384 each, so almost never; an estimate if it was
    assert agg["shrink_blocks"]["alloc_count"] <= 10
    est, err, true = agg["tiny_blocks"]["live_bytes"], agg["tiny_blocks"]["error"], 50000 * 64
    assert abs(est - true) <= 2 * err, (est, true, err)


def test_session_skips_return_probes_of_unsampled_calls(targets, tmp_path):
    """The point of the session: the program runs once per call (entry) plus once per sampled
    call (return), where classic probes run entry and return for every call. Counted by the
    kernel (kernel.bpf_stats_enabled)."""
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats.read_text().strip()
    stats.write_text("1")
    try:
        runs = {}
        for sessions in ("on", "off"):
            out = tmp_path / f"{sessions}.allocscope"
            record_sampled(out, targets["sizes"], 8192, sessions)
            meta = json.loads((out / "meta.json").read_text())
            rep = report_json(out)
            allocs = sum(s["alloc_count"] for s in rep["sites"] if "heap" in s["sources"])
            runs[sessions] = ({k: v["run_cnt"] for k, v in meta["bpf_stats"].items()}, allocs)
    finally:
        stats.write_text(was)
    calls = 20000 + 1500 + 100000  # the target's mallocs; libc's own add a few dozen
    on, on_allocs = runs["on"]
    assert calls <= on["heap_session"] - on_allocs <= calls + 200, on  # entries only ...
    assert 2400 < on_allocs < 6000  # ... plus one run per sampled call
    off, _ = runs["off"]
    assert "heap_session" not in off
    assert calls <= off["alloc_return"] <= calls + 200 and calls <= off["heap_entry"] <= calls + 200, off


def test_residency_mode_exact_mmaps_and_first_touches(targets, tmp_path):
    out = tmp_path / "residency.allocscope"
    cli(
        "record",
        "-q",
        "--mode",
        "residency",
        "--fault-sample",
        "4",
        "--unwind",
        "fp",
        "-o",
        str(out),
        "--",
        str(targets["apis"]),
        check=True,
    )
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
    assert all("heap" not in s["sources"] for s in rep["sites"])  # no allocator probes
    assert any("fault" in s["sources"] for s in rep["sites"])  # sampled first touches
