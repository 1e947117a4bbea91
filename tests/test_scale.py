"""Scale without BPF: a live table of a million rows through the report path (exact totals,
never a pandas conversion of the table), and the streamed Parquet part the tracer writes it
with (row groups, nothing written for no rows, disk full)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from synth import MONO0, SynthTrace

from common.errors import OutputError
from common.tracefile import checksums as C
from common.tracefile import format as F
from common.tracefile.writer import TraceWriter
from reports import analysis as A
from reports.trace import load_trace

N = 1_000_000
MAIN = (0x555500000000, 0x555500000000 + (4 << 30))  # brk heap, 4 GiB
ARENA = (0x7F0004000000, 0x7F0004000000 + (64 << 20))  # one thread-arena heap
OUTSIDE = 0x7F1000000000  # neither: an `other` block


def _million(tmp_path):
    """A trace whose live table has N rows: 3 stacks x 3 threads, blocks in the main heap, in a
    thread arena, outside both, and a few mmap regions (not heap-API: never in an arena)."""
    rng = np.random.default_rng(6)
    t = SynthTrace(tmp_path / "million.allocscope")
    stacks = [t.stack([f"fill_{k}", "worker_main", "start_thread"]) for k in "abc"]
    for tid in (101, 102, 103):
        t.thread(tid, f"worker-{tid - 100}")
    sid = np.asarray(stacks, dtype=np.uint64)[rng.integers(0, 3, N)]
    tid = rng.integers(101, 104, N).astype(np.uint32)
    size = rng.integers(1, 4097, N).astype(np.int64)
    at_s = np.round(rng.uniform(0.0, 2.5, N), 3)
    where = rng.choice(3, N, p=[0.7, 0.29, 0.01])  # main, arena, outside
    base = np.array([MAIN[0], ARENA[0], OUTSIDE], dtype=np.uint64)[where]
    addr = base + (np.arange(N, dtype=np.uint64) * np.uint64(48)) % np.uint64(60 << 20)
    t.live_blocks(sid, tid, size, at_s, addrs=addr)
    mmap_sid = stacks[0]
    t.live_blocks(
        np.full(3, mmap_sid),
        np.full(3, 101),
        np.full(3, 1 << 20),
        0.5,
        addrs=np.uint64(0x7F2000000000) + np.arange(3, dtype=np.uint64) * np.uint64(1 << 21),
        source="mmap",
        api="mmap",
    )
    # Site counters (cumulative) agree with the live blocks: nothing freed.
    per = {}
    for s in stacks:
        for th in (101, 102, 103):
            m = (sid == s) & (tid == th)
            per[(s, th, "heap")] = (int(size[m].sum()), int(m.sum()), 0, 0)
    per[(mmap_sid, 101, "mmap")] = (3 << 20, 3, 0, 0)
    t.interval({k: (v[0] // 2, v[1] // 2, 0, 0) for k, v in per.items()}, rss=3 << 30)
    t.interval({}, rss=3 << 30)
    t.interval(per, rss=3 << 30)
    t.heaps(
        [
            (MAIN[0], MAIN[1], MAIN[1], "main", "main", 2 << 30, 0),
            (ARENA[0], ARENA[1], ARENA[1], "thread", f"{ARENA[0] + 0x20:#x}", 64 << 20, 0),
        ]
    )
    t.close()
    return t.path, {"sid": sid, "tid": tid, "size": size, "at_s": at_s, "where": where, "stacks": stacks}


def test_report_on_a_million_live_blocks_is_exact(tmp_path):
    path, x = _million(tmp_path)
    t = load_trace(path)
    assert t.live_rows == N + 3 and not t.warnings
    doc = A.build_report(t)
    assert "live" not in t.__dict__, "the report built a DataFrame of the live table"

    total = int(x["size"].sum()) + (3 << 20)
    assert doc["totals"]["live_count"] == N + 3
    assert doc["totals"]["live_bytes"] == total
    assert sum(s["live_bytes"] for s in doc["sites"]) == total
    assert sum(s["live_count"] for s in doc["sites"]) == N + 3
    # Oldest outstanding allocation per site: the earliest block of its stack, 3 intervals end.
    for k, s in enumerate(x["stacks"]):
        site = next(d for d in doc["sites"] if d["frames"][0]["function"] == f"fill_{'abc'[k]}")
        first = x["at_s"][x["sid"] == s].min()
        if k == 0:
            first = min(first, 0.5)  # the mmap regions belong to stack a too
        assert site["oldest_age_s"] == round(3.0 - first, 3), (k, site["oldest_age_s"], first)
    assert sum(th["live_bytes"] for th in doc["threads"]) == total

    arenas = {a["id"]: a for a in doc["arenas"]}
    for wid, aid in ((0, "main"), (1, f"{ARENA[0] + 0x20:#x}"), (2, "other")):
        m = x["where"] == wid
        assert arenas[aid]["live_bytes"] == int(x["size"][m].sum()), aid
        assert arenas[aid]["threads"] == sorted({int(v) for v in x["tid"][m]}), aid
    assert arenas["main"]["retained_bytes"] == (2 << 30) - int(x["size"][x["where"] == 0].sum())

    # The DataFrame, when asked for, has the same rows, and the same report comes from it.
    df = t.live
    assert len(df) == N + 3 and int(df["size"].sum()) == total
    assert str(df["source"].dtype) == "category" and str(df["api"].dtype) == "category"
    pd.testing.assert_frame_equal(A.arena_table(t), A.arena_table(load_trace(path)))


def test_old_style_live_part_reads_the_same(tmp_path):
    """A live part written the way traces were before (one row group, dictionary encoding for
    every column, plain strings) reads and reports the same as the streamed one."""
    path, _ = _million(tmp_path)
    parts = os.path.join(path, "parts")
    name = next(n for n in os.listdir(parts) if n.startswith("live-"))
    new = A.build_report(load_trace(path))
    tab = pq.read_table(os.path.join(parts, name))
    pq.write_table(tab, os.path.join(parts, name), compression="zstd", row_group_size=1 << 21)
    with open(os.path.join(parts, C.NAME), "ab") as f:  # its checksum, as the writer lists it (issue 53)
        f.write(C.line(name, *C.crc_file(os.path.join(parts, name))))
    old = A.build_report(load_trace(path))
    assert json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)  # (NaN == NaN there)


def test_streamed_part_is_row_groups_and_nothing_for_no_rows(tmp_path):
    w = TraceWriter(str(tmp_path / "s.allocscope"))
    schema = F.SCHEMAS["live"]

    def batch(n, base):
        return pa.record_batch(
            [
                pa.array(np.full(n, 1, np.int32)),
                pa.array(np.arange(base, base + n, dtype=np.uint64)),
                pa.array(np.full(n, 8, np.int64)),
                pa.array(np.zeros(n, np.uint64)),
                pa.array(np.full(n, 7, np.uint32)),
                pa.array(np.arange(n, dtype=np.int64) + MONO0),
                pa.repeat("malloc", n),
                pa.repeat("heap", n),
            ],
            schema=schema,
        )

    assert w.write_part_batches("live", 1, schema, iter([batch(1000, 0), batch(0, 0), batch(500, 5000)])) == 1500
    assert w.write_part_batches("live", 2, schema, iter([])) == 0
    w.close()
    parts = sorted(os.listdir(tmp_path / "s.allocscope" / "parts"))
    assert parts == [C.NAME, F.part_name("live", 1)]  # nothing for no rows, no temporary file left
    f = pq.ParquetFile(tmp_path / "s.allocscope" / "parts" / parts[1])
    assert f.metadata.num_row_groups == 2 and f.metadata.num_rows == 1500
    got = f.read()
    assert got.schema.equals(schema)
    assert got["addr"].to_pylist() == list(range(1000)) + list(range(5000, 5500))
    assert all((tmp_path / "s.allocscope" / "parts" / p).stat().st_mode & 0o777 == 0o600 for p in parts)


def test_streamed_part_whose_source_fails_leaves_nothing(tmp_path):
    w = TraceWriter(str(tmp_path / "f.allocscope"))
    schema = F.SCHEMAS["live"]

    def batches():
        yield pa.RecordBatch.from_pydict(
            {
                "seq": [1],
                "addr": [1],
                "size": [8],
                "stack_id": [0],
                "tid": [7],
                "ts_ns": [MONO0],
                "api": ["malloc"],
                "source": ["heap"],
            },
            schema=schema,
        )
        raise RuntimeError("map read failed")

    with pytest.raises(RuntimeError, match="map read failed"):
        w.write_part_batches("live", 1, schema, batches())
    w.close()
    assert os.listdir(tmp_path / "f.allocscope" / "parts") == []


@pytest.mark.root  # mounts a small tmpfs
def test_streamed_part_disk_full(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(d)], check=True)
    try:
        w = TraceWriter(str(d / "full.allocscope"))
        schema = F.SCHEMAS["live"]
        rng = np.random.default_rng(1)

        def batches():  # incompressible addresses: ~8 MiB, far more than fits
            for _ in range(8):
                n = 1 << 17
                yield pa.record_batch(
                    [
                        pa.array(np.full(n, 1, np.int32)),
                        pa.array(rng.integers(0, 1 << 62, n).astype(np.uint64)),
                        pa.array(np.full(n, 8, np.int64)),
                        pa.array(np.zeros(n, np.uint64)),
                        pa.array(np.full(n, 7, np.uint32)),
                        pa.array(rng.integers(0, 1 << 62, n).astype(np.int64)),
                        pa.repeat("malloc", n),
                        pa.repeat("heap", n),
                    ],
                    schema=schema,
                )

        with pytest.raises(OutputError, match=r"disk full while writing .*; the intervals already written are kept"):
            w.write_part_batches("live", 1, schema, batches())
        w.close()
        assert os.listdir(d / "full.allocscope" / "parts") == []  # the temporary file is gone
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
