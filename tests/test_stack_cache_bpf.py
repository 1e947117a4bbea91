"""The probes' per-thread stack cache (probes/unwind_dwarf.h): a return probe reuses a cached
stack only when every stack word the cached unwind read is unchanged. tests/targets/samesp.c
reaches one malloc through two callers whose frames are identical, so (return address, sp) are
the same both ways; only the callers' return addresses differ."""

from __future__ import annotations

import pytest
from support import functions, record_run, report_json

pytestmark = pytest.mark.bpf


def test_cache_tells_callers_apart_at_the_same_sp(targets, tmp_path, procs, tracers):
    from reports.trace import load_trace

    out = tmp_path / "samesp.allocscope"
    record_run(procs, tracers, out, [targets["samesp"], "--wait-signal"])

    rep = report_json(out)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    by_caller: dict[str, list[int]] = {}
    for s in rep["sites"]:
        fns = functions(s["frames"])
        if "leaf" not in fns:
            continue
        caller = fns[fns.index("leaf") + 1]
        g = by_caller.setdefault(caller, [0, 0])
        g[0] += s["live_bytes"]
        g[1] += s["live_count"]
    assert by_caller == {"via_a": [300 * 111 + 150 * 333, 450], "via_b": [300 * 222 + 150 * 444, 450]}, by_caller

    last = load_trace(out).intervals.iloc[-1]
    assert last["n_allocs"] == 900 and last["lost_stack_truncated"] == 0
    # the two runs of 300 hit the cache; the alternating run misses at every switch of caller
    assert 590 <= last["n_stack_cached"] <= 900 - 150, last["n_stack_cached"]
