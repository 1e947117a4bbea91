"""A damaged trace never reads as a clean answer (issue 53 item 5): every part is checked against
the size and CRC-32 the writer listed (parts/checksums); a part overwritten, emptied, truncated
or missing is said on stderr (one whole line each), at the top of the report (the `damaged`
finding, the JSON's `integrity`), the findings that read its table are withheld, and `report` /
`diff` exit 5 unless --allow-damaged. What a killed recording leaves, a trace written before the
checksums and a `watch --keep` trace read as before; an unreadable trace exits 5 (README's table)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import cli, one_line_error
from synth import MONO0, SynthTrace

from common.errors import TraceFileError
from common.tracefile import checksums as C
from common.tracefile import integrity as I
from common.tracefile.writer import TraceWriter
from reports.analysis import build_report
from reports.trace import load_trace
from tracer.watch.keep import cut

MIB = 1 << 20
PEAK = "_sdsnewlen sds.c:70 held 10.0 MiB (80.0%)"  # finding 1 of the clean trace


def _trace(path: Path) -> str:
    """What the issue saw on redis: one location holds 80% at the end, another grows beside it."""
    t = SynthTrace(path)
    sds = t.stack(
        ["_sdsnewlen", "createStringObject", "processCommand", "main"],
        files=["/src/sds.c", "/src/object.c", "/src/server.c", None],
        lines=[70, 101, 4000, None],
    )
    dct = t.stack(["dictExpand", "dictAdd", "main"], files=["/src/dict.c", "/src/dict.c", None], lines=[155, 300, None])
    t.thread(101, "redis-server")
    for i in range(1, 6):
        t.interval(
            {(sds, 101): (i * 2 * MIB, i * 100, 0, 0), (dct, 101): (i * MIB // 2, i, 0, 0)}, rss=(20 + 3 * i) * MIB
        )
    for k in range(10):
        t.live_block(sds, 101, MIB, at_s=0.5 + k * 0.4)
    for k in range(5):
        t.live_block(dct, 101, MIB // 2, at_s=0.5 + k)
    return t.close()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return Path(_trace(tmp_path_factory.mktemp("clean") / "r.allocscope"))


@pytest.fixture
def trace(clean, tmp_path) -> Path:
    """A fresh copy of the clean trace, to damage."""
    out = tmp_path / "d.allocscope"
    shutil.copytree(clean, out)
    return out


def report(path: Path, *args: str):
    p = cli("report", str(path), *args)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def overwrite_middle(part: Path, n: int = 200, seed: int = 53) -> None:
    data = bytearray(part.read_bytes())
    assert len(data) > n + 100, len(data)
    mid = len(data) // 2 - n // 2
    rng = random.Random(seed)
    new = bytes(rng.randrange(256) for _ in range(n))
    assert new != bytes(data[mid : mid + n])
    data[mid : mid + n] = new
    part.write_bytes(bytes(data))


def test_the_clean_trace_is_verified_and_answers(clean):
    p = report(clean)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "  1. At the end (12.5 MiB live), " + PEAK in p.stdout
    rep = json.loads(report(clean, "--format", "json").stdout)
    integ = rep["integrity"]
    assert list(rep)[:3] == ["schema", "integrity", "findings"]  # said first
    assert integ["status"] == "verified" and integ["checksums"] == "crc32" and integ["damaged"] == []
    assert integ["parts_verified"] == len(os.listdir(clean / "parts")) - 1  # every part but the list
    assert integ["note"] is None and integ["withheld"] == []


def test_200_random_bytes_in_a_stacks_part(trace):
    overwrite_middle(trace / "parts" / "stacks-000001.parquet")
    p = report(trace)
    assert p.returncode == 5, p.stderr
    err = p.stderr.splitlines()
    assert err[0] == (
        f"allocscope: {trace}: damaged part parts/stacks-000001.parquet: not as written: its bytes changed "
        f"(CRC-32 {C.crc_file(str(trace / 'parts' / 'stacks-000001.parquet'))[1]:08x}, "
        f"written {C.parse((trace / 'parts' / C.NAME).read_bytes())[0]['stacks-000001.parquet'].crc:08x})"
    )
    assert err[1].startswith(f"allocscope: damaged trace ({trace}: 1 part): ") and err[1].endswith(
        "--allow-damaged exits 0 with such a report"
    )
    assert len(err) == 2
    # said first, the findings from the stacks withheld: no answer from partial data
    findings = p.stdout.split("Findings\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert findings[0].startswith(
        "  1. Damaged trace: 1 part not as written or missing, of table stacks; withheld as they read from it: "
        "the findings on what held the peak and what grows;"
    ), findings
    assert len(findings) == 1 and PEAK not in p.stdout
    allowed = report(trace, "--allow-damaged")
    assert allowed.returncode == 0 and allowed.stdout == p.stdout  # the same report, the damage still said
    assert allowed.stderr.splitlines() == err[:1]
    rep = json.loads(report(trace, "--format", "json", "--allow-damaged").stdout)
    integ = rep["integrity"]
    assert integ["status"] == "damaged" and integ["damaged_tables"] == ["stacks"]
    assert [(d["part"], d["table"]) for d in integ["damaged"]] == [("stacks-000001.parquet", "stacks")]
    assert integ["withheld"] == ["peak", "growing"] and [f["kind"] for f in rep["findings"]] == ["damaged"]


def test_every_sites_part_emptied(trace):
    sites = sorted((trace / "parts").glob("sites-*.parquet"))
    sizes = {p.name: p.stat().st_size for p in sites}
    for p in sites:
        p.write_bytes(b"")
    p = report(trace)
    assert p.returncode == 5
    # one whole line per part on stderr, none on stdout
    lines = p.stderr.splitlines()
    assert lines[:-1] == [
        f"allocscope: {trace}: damaged part parts/{n}: empty (written {sizes[n]} bytes)" for n in sorted(sizes)
    ]
    assert re.fullmatch(rf"allocscope: damaged trace \({re.escape(str(trace))}: 5 parts\): .* report", lines[-1])
    assert "sites-0" not in p.stdout and "warning" not in p.stdout
    assert "No problem found" not in p.stdout
    assert "Damaged trace: 5 parts not as written or missing, of table sites (5); withheld" in p.stdout
    html = report(trace, "--format", "html", "--allow-damaged")
    assert html.returncode == 0 and "Damaged trace: 5 parts not as written or missing, of table sites" in html.stdout


def test_a_missing_part(trace, clean):
    (trace / "parts" / "intervals-000003.parquet").unlink()  # the trace would read on without it
    t = load_trace(trace)
    assert [d.text() for d in t.integrity.damaged] == [
        "parts/intervals-000003.parquet: missing (the checksum list has it)"
    ]
    assert t.intervals["seq"].tolist() == [1, 2, 4, 5]
    p = report(trace)
    assert p.returncode == 5
    assert p.stderr.splitlines()[0] == (
        f"allocscope: {trace}: damaged part parts/intervals-000003.parquet: missing (the checksum list has it)"
    )
    d = cli("diff", str(clean), str(trace), "--format", "json")
    assert d.returncode == 5, d.stderr
    doc = json.loads(d.stdout)
    assert doc["traces"]["a"]["integrity"]["status"] == "verified"
    assert doc["traces"]["b"]["integrity"]["damaged_tables"] == ["intervals"]
    assert doc["warnings"][0] == "B: damaged trace: 1 part not as written or missing, of table intervals"
    assert [f["kind"] for f in doc["findings"]] == ["damaged"]
    assert cli("diff", str(clean), str(trace), "--allow-damaged").returncode == 0


def test_a_lost_checksum_list_is_damage_to_every_table(trace):
    (trace / "parts" / C.NAME).unlink()
    rep = json.loads(report(trace, "--format", "json", "--allow-damaged").stdout)
    assert rep["integrity"]["damaged_tables"] == ["*"]
    assert rep["integrity"]["damaged"][0]["problem"].startswith("missing: meta.json says the parts are listed")
    assert [f["kind"] for f in rep["findings"]] == ["damaged"]  # every finding withheld
    assert report(trace).returncode == 5


def test_a_trace_written_before_the_checksums_reads_as_before(trace):
    (trace / "parts" / C.NAME).unlink()
    meta = json.loads((trace / "meta.json").read_text())
    del meta["checksums"]
    (trace / "meta.json").write_text(json.dumps(meta))
    p = report(trace)
    assert p.returncode == 0 and p.stderr == "" and PEAK in p.stdout
    integ = json.loads(report(trace, "--format", "json").stdout)["integrity"]
    assert integ["status"] == "not_verifiable" and integ["checksums"] is None and integ["parts_verified"] == 0
    assert integ["note"] == "parts not verifiable: the trace was written before allocscope kept their checksums"


def test_a_killed_recordings_unlisted_last_part_is_not_damage(tmp_path):
    """A SIGKILL between a part's rename and its line: the part reads, 'not verifiable', the
    report exits 0 saying the trace is incomplete (tests/test_tracefile_writer.py kills a real
    writer)."""
    t = SynthTrace(tmp_path / "k.allocscope")
    s = t.stack(["f", "main"])
    for i in (1, 2, 3):
        t.interval({(s, 1): (100 * i, i, 0, 0)})
    path = Path(t.close(complete=False))
    lst = path / "parts" / C.NAME
    lines = lst.read_bytes().splitlines(keepends=True)
    assert lines[-1].startswith(b"intervals-000003.parquet ")
    lst.write_bytes(b"".join(lines[:-1]) + lines[-1][:7])  # and its line cut short by the kill
    p = report(path, "--format", "json")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    rep = json.loads(p.stdout)
    assert rep["integrity"]["status"] == "verified" and rep["integrity"]["parts_unverified"] == [
        "intervals-000003.parquet"
    ]
    assert "written after the last checksum" in rep["integrity"]["note"]
    assert rep["totals"]["intervals"] == 3 and not rep["recording"]["complete"]
    # the same part unlisted in a complete trace is not one the recording wrote
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "complete": True}))
    t2 = load_trace(path)
    assert [d.part for d in t2.integrity.damaged] == ["intervals-000003.parquet"]
    assert "not in the checksum list" in t2.integrity.damaged[0].problem


def test_an_incomplete_trace_may_lose_what_comes_after_its_last_interval(tmp_path):
    """A power loss can take the parts of the last seconds while their lines are on disk: in an
    incomplete trace a listed part after the last interval read is not damage (it would not be
    read); one before it is."""
    t = SynthTrace(tmp_path / "p.allocscope")
    s = t.stack(["f", "main"])
    for i in (1, 2, 3, 4):
        t.interval({(s, 1): (100 * i, i, 0, 0)})
    path = Path(t.close(complete=False))
    (path / "parts" / "intervals-000004.parquet").unlink()  # the last interval's, and a site row of it
    (path / "parts" / "sites-000004.parquet").unlink()
    got = load_trace(path)
    assert got.integrity.status == "verified" and got.last_seq == 3
    (path / "parts" / "intervals-000002.parquet").unlink()
    got = load_trace(path)
    assert [d.part for d in got.integrity.damaged] == ["intervals-000002.parquet"]
    meta = json.loads((path / "meta.json").read_text())  # complete: every listed part is owed
    (path / "meta.json").write_text(json.dumps({**meta, "complete": True}))
    assert [d.part for d in load_trace(path).integrity.damaged] == [
        "intervals-000002.parquet",
        "intervals-000004.parquet",
        "sites-000004.parquet",
    ]


def test_watch_keep_parts_still_verify_and_a_damaged_merged_part_is_said(tmp_path):
    """watch --keep exchanges the parts directory (TraceWriter.replace_parts): the new one has
    its own list, the merged and reduced parts in it."""
    t = SynthTrace(tmp_path / "w.allocscope")
    grow = t.stack(["grow_forever", "main"])
    for i in range(1, 31):
        t.interval({(grow, 1): (1000 * i, i, 0, 0)}, rss=64 << 20)
    t.w.write_meta({**t.meta, "complete": False})
    now = time.monotonic_ns()
    rec = SimpleNamespace(writer=t.w, kept=None, triggers=[])
    assert cut(rec, (now - (MONO0 + int(20.5e9))) / 1e9, (now - (MONO0 + int(26.5e9))) / 1e9)
    t.interval({(grow, 1): (31000, 31, 0, 0)}, rss=64 << 20)  # appended to the new list
    path = Path(t.close())
    t1 = load_trace(path)
    parts = sorted(n for n in os.listdir(path / "parts") if n != C.NAME)
    assert t1.integrity.status == "verified" and t1.integrity.verified == len(parts)
    assert sorted(C.parse((path / "parts" / C.NAME).read_bytes())[0]) == parts
    merged = path / "parts" / "sites-000020.parquet"  # the base: written by keep.py, not the writer
    data = bytearray(merged.read_bytes())
    data[len(data) // 2] ^= 0x10
    merged.write_bytes(bytes(data))
    assert [d.part for d in load_trace(path).integrity.damaged] == ["sites-000020.parquet"]


def test_a_keep_exchange_while_reading_reads_again(tmp_path, monkeypatch):
    """`report` of a trace that watch --keep is recording: the parts directory exchanged between
    the reader's listing and its checksum list is no damage; the trace is read again."""
    t = SynthTrace(tmp_path / "x.allocscope")
    grow = t.stack(["grow_forever", "main"])
    for i in range(1, 31):
        t.interval({(grow, 1): (1000 * i, i, 0, 0)}, rss=64 << 20)
    t.w.write_meta({**t.meta, "complete": False})
    now = time.monotonic_ns()
    rec = SimpleNamespace(writer=t.w, kept=None, triggers=[])
    real, calls = I.Integrity.open, []

    def open_after_a_cut(pdir, meta):  # the reader has listed the old parts; the cut comes now
        if not calls:
            assert cut(rec, (now - (MONO0 + int(20.5e9))) / 1e9, (now - (MONO0 + int(26.5e9))) / 1e9)
        calls.append(real(pdir, meta))
        return calls[-1]

    monkeypatch.setattr(I.Integrity, "open", staticmethod(open_after_a_cut))
    got = load_trace(t.path)
    assert len(calls) == 2 and calls[0].status == "damaged"  # old names, the new list: read again
    assert calls[1] is got.integrity
    assert got.integrity.status == "verified" and got.integrity.damaged == []
    assert got.intervals["seq"].tolist() == list(range(20, 31))  # 20: the base of the cut
    t.close()


def test_a_large_streamed_part_is_listed(tmp_path):
    """write_part_batches (the live table: a part of unknown size) is read back for its CRC."""
    t = SynthTrace(tmp_path / "s.allocscope")
    s = t.stack(["f", "main"])
    t.interval({(s, 1): (8 * 3000, 3000, 0, 0)})
    for _ in range(3000):
        t.live_block(s, 1, 8, at_s=0.5)
    path = Path(t.close())
    listed = C.parse((path / "parts" / C.NAME).read_bytes())[0]
    live = path / "parts" / "live-000001.parquet"
    assert listed["live-000001.parquet"] == C.Sum(*C.crc_file(str(live)))
    assert load_trace(path).integrity.status == "verified"


@pytest.mark.root  # to read as another user
def test_an_unreadable_trace_exits_5(clean):
    """click's readable check made this exit 2 (usage); the README's table says 5 (trace file)."""
    top = tempfile.mkdtemp(prefix="allocscope-unreadable-")
    try:
        os.chmod(top, 0o755)
        path = Path(top) / "r.allocscope"
        shutil.copytree(clean, path)
        os.chmod(path, 0o700)  # as the writer makes it: root's
        p = cli("report", str(path), preexec_fn=lambda: os.setuid(65534))
        one_line_error(p, "Permission denied", code=5)
        assert p.stderr == f"allocscope: cannot read {path}/meta.json: Permission denied\n"
        p = cli("diff", str(path), str(path), preexec_fn=lambda: os.setuid(65534))
        one_line_error(p, "Permission denied", code=5)
    finally:
        shutil.rmtree(top)


def test_the_exit_code_of_a_trace_file_is_the_readmes():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert re.search(r"\b5 trace file\b", readme) and TraceFileError.exit_code == 5


def test_the_library_withholds_too(trace):
    """build_report itself (reports.trace users, not only the CLI) withholds and says it."""
    (trace / "parts" / "sites-000002.parquet").write_bytes(b"PAR1")
    t = load_trace(trace)
    assert t.warnings == [] and t.integrity.tables == ["sites"]
    rep = build_report(t)
    assert rep["integrity"]["damaged"] == [
        {"part": "sites-000002.parquet", "table": "sites", "problem": "truncated (4 of the 1082 bytes written)"}
    ]
    assert [f["kind"] for f in rep["findings"]] == ["damaged"]


def test_a_writer_that_wrote_nothing_has_no_list(tmp_path):
    w = TraceWriter(str(tmp_path / "n.allocscope"))
    w.write_meta({"format": "allocscope.trace", "version": 6, "complete": False})
    w.close()
    assert os.listdir(tmp_path / "n.allocscope" / "parts") == []
    with pytest.raises(TraceFileError, match="no finished interval"):
        load_trace(tmp_path / "n.allocscope")
