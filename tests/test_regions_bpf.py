"""The mmap family accounted in the kernel: an mmap/munmap storm (tests/targets/storm.c) is exact
per site and thread, the common shapes send no event to the tracer, and the rare shapes are the
only events, counted (n_slow). The same through --inject's hooks (tracer/inject/agent/agent.c, the mmap
family): the same figures, no syscall tracepoint attached, one marker call per reported call."""

from __future__ import annotations

from collections import defaultdict

import pytest
from support import record_run, report_json

from reports.trace import load_trace

pytestmark = pytest.mark.bpf

PAGE = 4096
PAIRS = 40_000
# innermost function -> (live bytes, alloc bytes, allocations, frees)
EXPECTED = {
    "storm_pair": (0, PAIRS // 4 * (1 + 2 + 3 + 4) * PAGE, PAIRS, PAIRS),
    "storm_keep": (37 * 3 * PAGE, 37 * 3 * PAGE, 37, 0),
    "storm_head": (11 * 4 * PAGE, 11 * 6 * PAGE, 11, 0),
    "storm_span": (0, 5 * 2 * 2 * PAGE, 10, 10),
    "storm_remap": (7 * 5 * PAGE, 7 * 5 * PAGE, 7, 0),
    "storm_middle": (13 * 5 * PAGE, 13 * 7 * PAGE, 13, 0),
    "storm_fixed": (3 * 2 * PAGE, 3 * 4 * PAGE, 3, 0),
    "storm_fixed_over": (3 * 2 * PAGE, 3 * 2 * PAGE, 3, 0),
    "storm_brk": (3 * PAGE, 5 * PAGE, 1, 0),
}
RARE = 13 + 3 + 1  # storm_middle's munmaps, storm_fixed_over's MAP_FIXED, storm_brk's shrink


def by_function(rep: dict) -> dict[str, dict]:
    agg: dict[str, dict] = defaultdict(
        lambda: {
            "live_bytes": 0,
            "alloc_bytes": 0,
            "alloc_count": 0,
            "free_count": 0,
            "peak": 0,
            "threads": set(),
            "sources": set(),
        }
    )
    for s in rep["sites"]:
        a = agg[s["frames"][0]["function"]]
        a["live_bytes"] += s["live_bytes"]
        a["alloc_bytes"] += s["alloc_bytes"]
        a["alloc_count"] += s["alloc_count"]
        a["free_count"] += s["alloc_count"] - s["live_count"]
        a["peak"] = max(a["peak"], s["peak_live_bytes"])
        a["threads"] |= {t["name"] for t in s["threads"]}
        a["sources"] |= set(s["sources"])
    return agg


def check_storm(rep: dict, mode: str) -> None:
    """`mode`: full, residency, inject (full through the agent's hooks)"""
    agg = by_function(rep)
    for fn, (live, alloc_bytes, allocs, frees) in EXPECTED.items():
        if mode == "residency" and fn == "storm_pair":
            continue  # its first touches are charged to the same site (checked below)
        a = agg[fn]
        assert (a["live_bytes"], a["alloc_bytes"], a["alloc_count"], a["free_count"]) == (
            live,
            alloc_bytes,
            allocs,
            frees,
        ), (fn, a)
        assert a["threads"] == {"stormer"}, (fn, a["threads"])
        assert a["sources"] == ({"brk"} if fn == "storm_brk" else {"mmap"}), (fn, a["sources"])
    if mode in ("full", "inject"):
        assert agg["storm_pair"]["peak"] == 4 * PAGE  # one block at a time, the largest 4 pages
    assert agg["storm_keep"]["peak"] == 37 * 3 * PAGE
    assert rep["totals"]["lost_events"] == 0, rep["totals"]


@pytest.mark.parametrize("mode", ["full", "residency", "inject"])
def test_mmap_storm_accounted_in_kernel(targets, tmp_path, procs, tracers, mode):
    out = tmp_path / f"storm-{mode}.allocscope"
    record_run(
        procs,
        tracers,
        out,
        [targets["storm"], "--pairs", str(PAIRS), "--linger"],
        record_args=("--inject",) if mode == "inject" else ("--mode", mode, "--fault-duty", "1"),
    )
    rep = report_json(out)
    check_storm(rep, mode)
    if mode == "inject":  # every call through the hooks, none through a tracepoint
        probes = rep["recording"]["probes"]
        inj = probes["inject"]
        assert inj["tracepoints"] == [] and not [x for x in probes["tracepoints"] if x.startswith("syscalls:")]
        assert set(inj["mmap_family"]["hooked"]) == {"mmap", "munmap", "mremap", "madvise", "brk"}, inj
        assert all(h.endswith("libc.so.6") for hs in inj["mmap_family"]["hooked"].values() for h in hs)
        # markers: mmap 1, munmap 2, brk 2 (the storm makes no madvise); the loader's, the
        # program's and the tracer's start-up calls before the hooks (not counted) aside
        storm = PAIRS * 3 + 37 + 11 * 3 + 5 * (2 + 2) + 7 * 2 + 13 * 3 + 3 * 2 + 2 * 2
        assert storm <= inj["counters"]["sys_marks"] <= storm + 20, (inj["counters"], storm)
    t = load_trace(out)
    last = t.intervals.iloc[-1]
    # Every common shape stayed in the kernel; the rare ones, and only they, reached the tracer.
    slow = t.events[t.events["type"].isin(["mmap", "munmap", "mremap", "brk"])]
    assert int(last["n_slow"]) == RARE == len(slow), slow
    assert sorted(slow["type"]) == sorted(["munmap"] * 13 + ["mmap"] * 3 + ["brk"])
    assert int(last["n_region_ops"]) >= 2 * PAIRS
    if mode == "residency":
        # page faults: one perf sample in 16 per thread, stacks through the stack cache
        faults = t.final_sites()
        faults = faults[faults["source"] == "fault"]
        samples = int(last["n_fault_samples"])
        assert int(faults["alloc_count"].sum()) == 16 * samples
        assert 16 * samples <= int(last["n_faults"]) < 16 * (samples + 2)  # the stormer + main
        assert int(last["n_faults"]) >= PAIRS  # each pair touches its first page
        agg = by_function(rep)
        # the storm_pair site: PAIRS mmaps, all unmapped, plus ~PAIRS sampled first touches
        touched = agg["storm_pair"]["alloc_count"] - PAIRS
        assert abs(touched - PAIRS) <= 0.02 * PAIRS, touched
        assert agg["storm_pair"]["sources"] == {"mmap", "fault"}
        assert int(last["n_stack_cached"]) >= 0.9 * samples, (int(last["n_stack_cached"]), samples)
        assert agg["storm_pair"]["threads"] == {"stormer"}
