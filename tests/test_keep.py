"""watch --keep on a trace written by the real writer (tracer/watch/keep.py): old intervals
dropped and old parts merged in one atomic step, the final state of every table the same as
before, the peak interval and the base kept, and far fewer files."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from synth import MONO0, SynthTrace

from reports.analysis import build_report
from reports.trace import load_trace
from tracer.watch.keep import cut


def _trace(tmp_path):
    t = SynthTrace(tmp_path / "k.allocscope")
    grow = t.stack(["grow_forever", "main"])
    once = t.stack(["allocated_once", "main"])
    burst = t.stack(["burst_then_free", "main"])
    for i in range(1, 31):
        sites = {(grow, 1): (1000 * i, i, 0, 0)}
        if i == 3:
            sites[(once, 2)] = (4096, 1, 0, 0)  # never changes again: must outlive the cut
        if i == 8:
            sites[(burst, 3)] = (10 << 20, 10, 0, 0)  # the peak: intervals 8-11
        if i == 12:
            sites[(burst, 3)] = (10 << 20, 10, 10 << 20, 10)
        t.interval(sites, rss=64 << 20)
    return t


def test_keep_drops_old_intervals_merges_old_parts_and_keeps_the_state(tmp_path):
    t = _trace(tmp_path)
    path = t.path
    t.w.write_meta({**t.meta, "complete": False})
    before = load_trace(path)
    files_before = len(os.listdir(os.path.join(path, "parts")))
    now = time.monotonic_ns()
    # rows of interval s are at MONO0 + s seconds: keep what is newer than interval 20, merge
    # what is older than interval 26
    keep_s = (now - (MONO0 + int(20.5e9))) / 1e9
    merge_s = (now - (MONO0 + int(26.5e9))) / 1e9
    rec = SimpleNamespace(writer=t.w, kept=None, triggers=[])
    assert cut(rec, keep_s, merge_s)
    after = load_trace(path)
    # the base (20) and the peak (11: the burst still live, the grower largest) kept, then 21..30
    assert sorted(after.intervals["seq"].tolist()) == [11, 20, *range(21, 31)]
    assert rec.kept["dropped_intervals"] == 18 and rec.kept["pinned"] == [11, 20], rec.kept
    cols = ["stack_id", "tid", "source", "alloc_bytes", "alloc_count", "free_bytes", "free_count"]
    f0 = before.final_sites()[cols].sort_values(cols).reset_index(drop=True)
    f1 = after.final_sites()[cols].sort_values(cols).reset_index(drop=True)
    assert f0.equals(f1)  # the live state since the attach, whole
    files_after = len(os.listdir(os.path.join(path, "parts")))
    assert files_after < files_before / 3, (files_before, files_after)
    t.meta["kept"] = rec.kept
    t.close()
    rep = build_report(load_trace(path))
    assert rep["totals"]["intervals"] == 12 and rep["totals"]["intervals_dropped"] == 18
    assert rep["totals"]["peak_live_bytes"] == before.intervals["live_bytes"].max()
    # the composition at the peak: the burst was live at interval 11
    at_peak = after.sites[(after.sites["seq"] == 11)]
    assert int((at_peak["alloc_bytes"] - at_peak["free_bytes"]).max()) == 10 << 20
