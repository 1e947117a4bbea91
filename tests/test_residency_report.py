"""RSS decomposition and arena ranking on synthetic traces (no BPF)."""
from __future__ import annotations

import pyarrow as pa
from synth import SynthTrace

from common.tracefile import format as F
from reports.analysis import arena_table, build_report, rss_decomposition
from reports.render.text import to_text
from reports.trace import load_trace

MiB = 1 << 20


def _trace(tmp_path, heaps: list[tuple] | None):
    t = SynthTrace(tmp_path / "r.allocscope")
    s = t.stack(["fill", "worker"])
    t.interval({(s, 7): (3 * MiB, 3, 0, 0)}, rss=40 * MiB)
    t.live_block(s, 7, 2 * MiB, 0.5, addr=0x7f0000001000)
    t.live_block(s, 7, MiB, 0.5, addr=0x7f0004000100)
    if heaps:
        rows = [dict(zip(["start", "end", "reserved_end", "kind", "arena", "resident_bytes", "estimated"], h),
                     seq=1) for h in heaps]
        t.w.write_part("heaps", 1, pa.Table.from_pylist(rows, schema=F.SCHEMAS["heaps"]))
    t.close()
    return load_trace(str(tmp_path / "r.allocscope"))


def test_glibc_arenas_ranked_by_retained_and_rss_adds_up(tmp_path):
    tr = _trace(tmp_path, [(0x7f0000000000, 0x7f0001000000, 0x7f0004000000, "thread", "0x7f0000000030", 10 * MiB, 0),
                           (0x7f0004000000, 0x7f0004800000, 0x7f0008000000, "thread", "0x7f0004000030", 2 * MiB, 0)])
    a = arena_table(tr)
    assert list(a["id"]) == ["0x7f0000000030", "0x7f0004000030"]
    assert list(a["live_bytes"]) == [2 * MiB, MiB]
    assert list(a["retained_bytes"]) == [8 * MiB, MiB]
    assert a["threads"].iloc[0] == [7]
    d = rss_decomposition(tr, a)
    assert d["retained_known"] and d["retained_bytes"] == 9 * MiB and d["live_heap_bytes"] == 3 * MiB
    assert d["other_anon_bytes"] == 40 * MiB - 12 * MiB
    assert d["sum_bytes"] == d["rss_bytes"] == 40 * MiB


def test_other_allocator_retention_not_separable(tmp_path):
    tr = _trace(tmp_path, None)
    d = rss_decomposition(tr)
    assert d["retained_known"] is False and d["retained_bytes"] == 0
    assert d["live_heap_bytes"] == 3 * MiB and d["sum_bytes"] == d["rss_bytes"] == 40 * MiB
    text = to_text(build_report(tr))
    assert "not separable" in text
