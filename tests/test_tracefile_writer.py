"""The trace writer's cost cuts (issue 33) keep what the trace promises: small parts plain and
read back with the exact schemas, large ones zstd; parts fsynced in batches of whole intervals
off the loop, every part before a meta.json; a SIGKILLed writer leaves a trace readable up to
its last complete interval; an fsync that fails ends the recording with a one-line error."""

from __future__ import annotations

import errno
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import OutputError
from common.tracefile import checksums as C
from common.tracefile import format as F
from common.tracefile import writer as W
from common.tracefile.conform import INTERVAL_COLUMNS
from common.tracefile.integrity import Damage
from common.tracefile.reader import load_trace
from common.tracefile.writer import SMALL_PART_BYTES, TraceWriter

META = {"format": F.FORMAT, "version": F.VERSION, "complete": False}


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def sites(seq: int, n: int) -> pa.Table:
    i = np.arange(n)
    return pa.table(
        {
            "seq": np.full(n, seq, np.int32),
            "stack_id": (i + 1).astype(np.uint64),
            "tid": np.full(n, 7, np.uint32),
            "source": ["heap"] * n,
            "alloc_bytes": i * 16,
            "alloc_count": i,
            "free_bytes": i * 8,
            "free_count": i // 2,
            "peak_live_bytes": i * 16,
        },
        schema=F.SCHEMAS["sites"],
    )


def interval(seq: int) -> pa.Table:
    row = {c: [0] for c in INTERVAL_COLUMNS}
    return pa.table({**row, "seq": [seq], "ts_ns": [seq * 10**9], "elapsed_s": [float(seq)], "live_bytes": [seq * 100]})


def write_interval(w: TraceWriter, seq: int, n_sites: int = 3) -> None:
    w.write_part("sites", seq, sites(seq, n_sites))
    w.write_part("intervals", seq, interval(seq))


def test_small_parts_plain_large_parts_zstd_both_read_back_exactly(tmp_path):
    path = tmp_path / "p.allocscope"
    w = TraceWriter(str(path))
    w.write_meta(META)
    small, large = sites(1, 3), sites(2, 20000)
    assert small.get_total_buffer_size() < SMALL_PART_BYTES <= large.get_total_buffer_size()
    w.write_part("sites", 1, small)
    w.write_part("intervals", 1, interval(1))
    w.write_part("sites", 2, large)
    w.write_part("intervals", 2, interval(2))
    w.write_meta({**META, "complete": True})
    w.close()
    parts = path / F.PARTS
    f1, f2 = pq.ParquetFile(parts / F.part_name("sites", 1)), pq.ParquetFile(parts / F.part_name("sites", 2))
    c1, c2 = f1.metadata.row_group(0).column(3), f2.metadata.row_group(0).column(3)  # `source`
    assert (c1.compression, c1.has_dictionary_page, c1.is_stats_set) == ("UNCOMPRESSED", False, False)
    assert f1.metadata.metadata is None or b"ARROW:schema" not in f1.metadata.metadata
    assert (c2.compression, c2.has_dictionary_page) == ("ZSTD", True)
    assert f1.read().schema.equals(F.SCHEMAS["sites"]) and f2.read().schema.equals(F.SCHEMAS["sites"])
    t = load_trace(str(path))
    assert t.warnings == [] and t.complete
    assert len(t.sites) == 20003 and t.sites["alloc_bytes"].sum() == (0 + 16 + 32) + 16 * 19999 * 20000 // 2
    assert t.intervals["live_bytes"].tolist() == [100, 200]
    for table, schema in F.SCHEMAS.items():  # every table's types survive without the stored schema
        buf = pa.BufferOutputStream()
        pq.write_table(schema.empty_table(), buf, **W.parquet_options(table, 0))
        assert pq.read_table(pa.BufferReader(buf.getvalue())).schema.equals(schema), table


@pytest.fixture
def fsyncs(monkeypatch):
    """The names fsynced, in order ('parts/' for the parts directory, '.' for the trace's)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        seen.append(os.path.basename(target) + ("/" if os.path.isdir(target) else ""))
        real(fd)

    monkeypatch.setattr(W.os, "fsync", fsync)
    return seen


def test_fsyncs_batched_whole_intervals_and_every_part_before_meta(tmp_path, fsyncs):
    clock = Clock()
    path = tmp_path / "s.allocscope"
    w = TraceWriter(str(path), sync_s=5.0, clock=clock)
    w.write_meta(META)
    assert fsyncs == [".meta.json.tmp", "s.allocscope/"]
    fsyncs.clear()
    for seq in range(1, 6):  # intervals 1..5 at t = 0..4 s: none fsynced in the loop
        write_interval(w, seq)
        clock.t += 1.0
    assert fsyncs == []
    write_interval(w, 6)  # t = 5 s: intervals 1..6 go to the fsync thread as one batch
    w._wait_batch()
    assert fsyncs == [F.part_name(t, s) for s in range(1, 7) for t in ("sites", "intervals")] + ["parts/", C.NAME]
    assert w.syncs == 1
    fsyncs.clear()
    write_interval(w, 7)
    w.write_part("sites", 8, sites(8, 2))  # an interval cut short: its parts are synced before meta too
    w.write_meta({**META, "complete": True})
    assert fsyncs == [
        F.part_name("sites", 7),
        F.part_name("intervals", 7),
        F.part_name("sites", 8),
        "parts/",
        C.NAME,  # their checksums, after their renames
        ".meta.json.tmp",
        "s.allocscope/",
    ]
    w.close()
    assert sorted(os.listdir(path / F.PARTS)) == sorted(
        [F.part_name(t, s) for s in range(1, 8) for t in ("sites", "intervals")] + [F.part_name("sites", 8), C.NAME]
    )


def test_sync_s_zero_fsyncs_every_part_before_its_rename(tmp_path, fsyncs):
    w = TraceWriter(str(tmp_path / "z.allocscope"), sync_s=0)
    write_interval(w, 1)
    one = ["parts/", C.NAME]  # its rename, then its line in the checksum list
    assert fsyncs == [f".{F.part_name('sites', 1)}.tmp", *one, f".{F.part_name('intervals', 1)}.tmp", *one]
    w.close()
    assert w._pool is None  # no fsync thread


def test_failed_fsync_is_a_one_line_error(tmp_path, monkeypatch):
    clock = Clock()
    w = TraceWriter(str(tmp_path / "e.allocscope"), sync_s=1.0, clock=clock)
    w.write_meta(META)

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(W.os, "fsync", fsync)
    clock.t = 1.0
    write_interval(w, 1)  # handed to the fsync thread, which fails
    with pytest.raises(OutputError, match=r"cannot write .*e\.allocscope/sites-000001\.parquet: Input/output error"):
        w.write_meta({**META, "complete": True})
    w.close()


def test_sigkilled_writer_leaves_every_finished_interval(tmp_path):
    """A writer killed at a random point (no fsync yet for the last seconds' parts) leaves a trace
    that reads up to its last `intervals` part, every table whole, no warning but 'incomplete'."""
    path = tmp_path / "k.allocscope"
    pid = os.fork()
    if pid == 0:  # the child writes intervals as fast as it can until killed
        try:
            w = TraceWriter(str(path))
            w.write_meta(META)
            seq = 0
            while True:
                seq += 1
                w.write_part("sites", seq, sites(seq, 1 + seq % 50))
                w.write_part(
                    "threads",
                    seq,
                    pa.table(
                        {"seq": [seq], "ts_ns": [seq], "tid": [7], "name": ["t"], "event": ["seen"]},
                        schema=F.SCHEMAS["threads"],
                    ),
                )
                w.write_part("intervals", seq, interval(seq))
        finally:
            os._exit(1)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if sum(n.startswith("intervals-") for n in os.listdir(path / F.PARTS)) >= 30:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    t = load_trace(str(path))
    last = t.last_seq
    assert last >= 30
    upto = t.intervals["elapsed_s"].iloc[-1]  # a time, as the report's header gives the duration, not a seq
    assert t.warnings == [
        f"trace is incomplete (recording was interrupted); read up to +{upto:.1f} s, its last snapshot"
    ]
    assert t.intervals["seq"].tolist() == list(range(1, last + 1))
    assert sorted(set(t.sites["seq"])) == list(range(1, last + 1))
    assert len(t.sites) == sum(1 + s % 50 for s in range(1, last + 1))
    assert t.threads["seq"].tolist() == list(range(1, last + 1))
    # every part read verified against its checksum, but the one a kill can leave unlisted
    # (renamed, its line not appended yet): not verifiable, and no damage
    it = t.integrity
    assert it.status == "verified" and it.damaged == [], it.damaged
    assert len(it.unverified) <= 1 and it.verified + len(it.unverified) == 3 * last, it.unverified


def test_held_parts_read_back_exactly_one_file_per_table_per_hold(tmp_path):
    """hold_s (issue 33, --inject): small parts are written together every hold_s seconds, the
    first interval at once; a large part writes what is held first; the trace reads back the
    same rows as one written part by part, and a reader stops at the last `intervals` part
    written (what a SIGKILL would leave)."""
    clock = Clock()
    held, plain = tmp_path / "h.allocscope", tmp_path / "p.allocscope"
    wh = TraceWriter(str(held), hold_s=5.0, clock=clock)
    wp = TraceWriter(str(plain))
    for w in (wh, wp):
        w.write_meta({**META, "version": 6})
    for seq in range(1, 12):
        for w in (wh, wp):
            w.write_part("sites", seq, sites(seq, seq if seq != 9 else 20000))  # 9: a large part
            if seq % 4 == 0:
                w.write_part(
                    "flows",
                    seq,
                    pa.table(
                        {
                            "seq": [seq],
                            "alloc_tid": [1],
                            "free_tid": [2],
                            "bytes": [seq],
                            "count": [1],
                            "wait_ns_sum": [0],
                            "wait_ns_max": [0],
                        },
                        schema=F.SCHEMAS["flows"],
                    ),
                )
            w.write_part("intervals", seq, interval(seq))
        clock.t += 1.0
        if seq == 7:  # intervals 1 (at once) and 1..6 (t = 5 s) written; 7 held
            assert load_trace(str(held)).intervals["seq"].tolist() == list(range(1, 7))
    assert sorted(os.listdir(held / F.PARTS)) == sorted(
        [F.part_name("sites", 1), F.part_name("intervals", 1)]  # the first interval at once
        + [F.part_name("sites", 6), F.part_name("flows", 4), F.part_name("intervals", 6)]  # t = 5 s
        + [F.part_name("sites", 8), F.part_name("flows", 8), F.part_name("intervals", 8)]  # before the large one
        + [F.part_name("sites", 9)]  # the large part, at once; 9..11 held: a SIGKILL now loses them
        + [C.NAME]
    )
    assert wh.parts_written == 9 and wp.parts_written == 11 * 2 + 2
    assert load_trace(str(held)).intervals["seq"].tolist() == list(range(1, 9))  # what a kill leaves
    for w in (wh, wp):
        w.write_meta({**META, "version": 6, "complete": True})
        w.close()
    a, b = load_trace(str(held)), load_trace(str(plain))
    assert a.warnings == [] == b.warnings
    for table in ("intervals", "sites", "flows"):
        assert getattr(a, table).equals(getattr(b, table)), table
    assert len(a.sites) == sum(range(1, 12)) - 9 + 20000


def test_reader_refuses_a_held_part_with_rows_of_an_earlier_part(tmp_path):
    """Version 6: a part holds the rows after its table's part before it, up to its name; rows
    outside that are a foreign part, skipped with a warning (as before for one interval)."""
    w = TraceWriter(str(tmp_path / "r.allocscope"))
    w.write_meta({**META, "version": 6, "complete": True})
    w.write_part("sites", 2, pa.concat_tables([sites(1, 2), sites(2, 1)]))
    w.write_part("sites", 3, pa.concat_tables([sites(2, 1), sites(3, 1)]))  # 2 belongs to the part before
    for seq in (1, 2, 3):
        w.write_part("intervals", seq, interval(seq))
    w.close()
    t = load_trace(str(tmp_path / "r.allocscope"))
    assert t.sites["seq"].tolist() == [1, 1, 2]
    assert t.warnings == []  # damage is not a warning: the reports withhold what reads it
    assert t.integrity.damaged == [
        Damage(
            F.part_name("sites", 3),
            "sites",
            "not a valid sites part, skipped (its rows are of interval 2..3, its name says 3)",
        )
    ]


def test_a_trace_being_written_reads_as_such_not_as_interrupted(tmp_path):
    """`report` of the trace a watch (or a record) is writing now said 'ended: interrupted' and
    'recording was interrupted': the writer holds the directory's lock while it writes, so the
    reader tells a recording under way from one that was cut short."""
    path = tmp_path / "w.allocscope"
    w = TraceWriter(str(path))
    w.write_meta(META)
    write_interval(w, 1)
    write_interval(w, 2)
    w._wait_batch()
    t = load_trace(str(path))
    assert t.warnings == ["trace is still being recorded; read up to +2.0 s, its last snapshot so far"]
    assert t.meta["end_reason"] == "still being recorded" and not t.complete
    w.close()  # the writer gone without finishing (as if killed): cut short
    t = load_trace(str(path))
    assert t.warnings == ["trace is incomplete (recording was interrupted); read up to +2.0 s, its last snapshot"]
    assert "end_reason" not in t.meta
