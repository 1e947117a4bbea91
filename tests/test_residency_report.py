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
    t.live_block(s, 7, 2 * MiB, 0.5, addr=0x7F0000001000)
    t.live_block(s, 7, MiB, 0.5, addr=0x7F0004000100)
    if heaps:
        rows = [
            dict(zip(["start", "end", "reserved_end", "kind", "arena", "resident_bytes", "estimated"], h), seq=1)
            for h in heaps
        ]
        t.w.write_part("heaps", 1, pa.Table.from_pylist(rows, schema=F.SCHEMAS["heaps"]))
    t.close()
    return load_trace(str(tmp_path / "r.allocscope"))


def test_glibc_arenas_ranked_by_retained_and_rss_adds_up(tmp_path):
    tr = _trace(
        tmp_path,
        [
            (0x7F0000000000, 0x7F0001000000, 0x7F0004000000, "thread", "0x7f0000000030", 10 * MiB, 0),
            (0x7F0004000000, 0x7F0004800000, 0x7F0008000000, "thread", "0x7f0004000030", 2 * MiB, 0),
        ],
    )
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


def _attached_trace(tmp_path, launched: bool):
    """jemalloc serving malloc, no census possible: its mappings held 30 MiB resident when the
    probes attached (blocks from before the attach, or free: nobody can tell), 50 MiB at the
    end with 5 MiB live since the attach."""
    t = SynthTrace(tmp_path / f"a{int(launched)}.allocscope")
    t.meta["target"]["launched"] = launched
    t.meta["probes"]["allocators"] = [
        {
            "kind": "jemalloc",
            "source": "heap",
            "module": "/usr/lib/libjemalloc.so.2",
            "prefix": "",
            "serves_malloc": True,
        }
    ]
    s = t.stack(["fill", "worker"])
    for seq, (res, live) in enumerate([(30 * MiB, 0), (50 * MiB, 5 * MiB)], start=1):
        t.interval({(s, 7): (live, 5, 0, 0)}, rss=80 * MiB)
        t.w.write_part(
            "allocators",
            seq,
            pa.Table.from_pylist(
                [
                    {
                        "seq": seq,
                        "source": "heap",
                        "kind": "jemalloc",
                        "mapped_bytes": 64 * MiB,
                        "resident_bytes": res,
                        "live_bytes": live,
                        "ranges": 3,
                    }
                ],
                schema=F.SCHEMAS["allocators"],
            ),
        )
    t.live_block(s, 7, 5 * MiB, 0.5)
    t.close()
    return load_trace(str(tmp_path / f"a{int(launched)}.allocscope"))


def test_attached_without_census_never_calls_pre_attach_memory_retained(tmp_path):
    d = rss_decomposition(_attached_trace(tmp_path, launched=False))
    a = d["allocators"][0]
    # what the mappings held at the attach is "before the attach or retained"; only the growth
    # beyond it that is not live since the attach is retained
    assert (a["live"], a["before_or_retained"], a["retained"], a["live_before_attach"]) == (
        5 * MiB,
        30 * MiB,
        15 * MiB,
        None,
    )
    assert (d["retained_bytes"], d["before_or_retained_bytes"], d["live_heap_bytes"]) == (15 * MiB, 30 * MiB, 5 * MiB)
    assert d["sum_bytes"] == d["rss_bytes"] == 80 * MiB
    (tmp_path / "t").mkdir()
    text = to_text(build_report(_attached_trace(tmp_path / "t", launched=False)))
    # every part of the allocator's resident, the line sums to it (issue 46: no part missing)
    assert (
        "jemalloc         resident   50.0 MiB = live 5.0 MiB + retained (free) 15.0 MiB"
        " + before the attach or retained 30.0 MiB" in text
    ), text
    # launched: nothing predates the attach, resident - live is retained
    d = rss_decomposition(_attached_trace(tmp_path, launched=True))
    assert (d["retained_bytes"], d["before_or_retained_bytes"]) == (45 * MiB, 0)
    # ...and the report never speaks of memory "from before the attach" (`gzip`, `xz` launched:
    # "glibc: memory from before the attach is in other anon ... not separable without a census")
    assert d["unseparated"] == [], d["unseparated"]
    (tmp_path / "l").mkdir()
    text = to_text(build_report(_attached_trace(tmp_path / "l", launched=True)))
    assert "before the attach" not in text, text


def test_a_launched_programs_unseen_chunks_are_the_allocators_own():
    """The census of a launched xz found 656 bytes in use no traced call returned (glibc's tcache):
    the RSS line called them "live before the attach", of a program traced from its exec."""
    from reports.analysis.equations import rss_equation

    dec = {
        "live_heap_bytes": 0,
        "live_before_attach_known": True,
        "live_before_attach_bytes": 656,
        "retained_bytes": 0,
        "other_anon_bytes": 0,
        "file_bytes": 0,
        "shmem_bytes": 0,
        "rss_bytes": 656,
    }
    labels = [t["label"] for t in rss_equation({**dec, "launched": True})["terms"]]
    assert "allocator internals (in use, never returned by a call)" in labels and "live before the attach" not in labels
    labels = [t["label"] for t in rss_equation({**dec, "launched": False})["terms"]]
    assert "live before the attach" in labels


def test_not_probed_says_each_reason_once():
    """A watch's residency trace of redis listed eleven functions each followed by
    '(residency mode: no allocator probes)'; one reason, its functions together."""
    from reports.render.text import skipped_text

    skipped = {
        "malloc": "residency mode: no allocator probes",
        "free": "residency mode: no allocator probes",
        "pvalloc": "not defined by libjemalloc.so.2",
        "calloc": "residency mode: no allocator probes",
    }
    assert skipped_text(skipped) == (
        "malloc, free, calloc (residency mode: no allocator probes), pvalloc (not defined by libjemalloc.so.2)"
    )


def test_the_record_summary_line_says_the_reports_live_in_residency_mode(tmp_path):
    """`record --mode residency -- xz -9`: the line said 'live 673.2 MiB' (the dictionary's mapped
    bytes) where the report said 'live now 135.2 MiB' (mapped, not yet touched, taken off)."""
    from allocscope.cli.recording import summary_text
    from tracer.record.finish import Summary

    t = SynthTrace(tmp_path / "x.allocscope")
    t.meta["mode"] = "residency"
    s = t.stack(["mmap", "lzma_alloc", "main"])
    t.interval({(s, 7, "mmap"): (100 * MiB, 1, 0, 0)}, rss=20 * MiB)  # mapped 100, resident 20
    path = t.close()
    rep = build_report(load_trace(path))
    assert rep["totals"]["live_bytes"] == 20 * MiB, rep["totals"]
    line = summary_text(Summary(path, 1.0, 1, "target exited", 100 * MiB, 1, 1, 0, 4096), "residency")
    assert "; live 20.0 MiB in 1 blocks at 1 sites;" in line, line
    assert "; live 100.0 MiB in 1 blocks" in summary_text(Summary(path, 1.0, 1, "x", 100 * MiB, 1, 1, 0, 4096))
