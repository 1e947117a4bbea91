"""Fuzz the trace reader (hypothesis): mutated traces — bit flips, truncations, deleted, emptied,
swapped and renumbered parts, garbage meta.json — load with a clean TraceFileError or as a trace
(with warnings where something was skipped), and every loaded trace goes through the report,
its text rendering and the diff without any other exception. A trace whose parts changed
(meta.json and parts/checksums as written) never reads as written: its damage is said and the
report's findings withheld (issue 53).

Two sources: a synthetic trace written by the real writer with every table filled, and (BPF,
root) a real recording of tests/targets/faults.c. Derandomized, so CI sees the same examples
every run; ALLOCSCOPE_FUZZ_EXAMPLES=N runs more (random) examples locally.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ROOT, TARGETS_SRC, attached, build, wait_for
from synth import SynthTrace

from common.errors import TraceFileError
from common.tracefile import checksums as C
from reports.analysis import build_report, symbolize_stacks
from reports.analysis.diff import diff_document, summarize
from reports.render.diff_text import diff_to_text
from reports.render.text import to_text
from reports.trace import load_trace

EXTRA = int(os.environ.get("ALLOCSCOPE_FUZZ_EXAMPLES", "0"))
SETTINGS = {
    "deadline": None,
    "derandomize": not EXTRA,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


def _synth(path: Path) -> str:
    t = SynthTrace(path, labels={"pw": "4"})
    a = t.stack(
        ["malloc", "make_partition", "worker", "start_thread"],
        files=[None, "/src/p.c", "/src/w.c", None],
        lines=[None, 42, 7, None],
    )
    b = t.stack(["operator new(unsigned long)", "Cache::insert", "main"])
    m = t.stack(["mmap", "map_arena", "worker", "start_thread"])
    t.thread(101, "main")
    t.thread(102, "pworker-1")
    t.interval({(a, 102): (4000, 4, 1000, 1), (b, 101): (100, 1, 0, 0)}, rss=10 << 20)
    t.trim(101, at_s=1.5, duration_s=0.01)
    t.interval(
        {(a, 102): (9000, 9, 1000, 1), (m, 102, "mmap"): (1 << 20, 1, 0, 0)},
        rss=12 << 20,
        flows={(102, 101): (1000, 1, 5_000_000, 5_000_000)},
        lost={"lost_ring_full": 3},
    )
    t.interval(
        {(a, 102): (9000, 9, 9000, 9), (b, 101): (300, 3, 0, 0)},
        rss=11 << 20,
        flows={(102, 101): (9000, 9, 9_000_000, 5_000_000)},
    )
    t.live_block(b, 101, 100, at_s=0.5)
    t.live_block(b, 101, 200, at_s=2.5)
    t.live_block(m, 102, 1 << 20, at_s=1.5, source="mmap", api="mmap")
    return t.close()


@pytest.fixture(scope="module")
def synth_trace(tmp_path_factory) -> Path:
    return Path(_synth(tmp_path_factory.mktemp("fuzz-synth") / "synth.allocscope"))


@pytest.fixture(scope="module")
def recorded_trace(tmp_path_factory) -> Path:
    """A real recording: heap blocks, mmaps, threads, a fork, flows, the final live table."""
    d = tmp_path_factory.mktemp("fuzz-real")
    exe = d / "faults"
    build(exe, TARGETS_SRC / "faults.c")
    tgt = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out = d / "real.allocscope"
    tr = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "allocscope",
            "record",
            "--pid",
            str(tgt.pid),
            "-o",
            str(out),
            "--interval",
            "0.3",
            "-q",
        ],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert tgt.stdout.readline().startswith("ready")
        wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="attach")
        for cmd in ("hold 50 100", "threads 20", "mmapsig 3", "free", "leak 5 999", "stacks 5"):
            tgt.stdin.write(cmd + "\n")
            tgt.stdin.flush()
            assert tgt.stdout.readline().startswith("ok")
        wait_for(lambda: (out / "parts" / "intervals-000003.parquet").exists(), what="3 intervals")
        tr.send_signal(signal.SIGINT)
        assert tr.wait(60) == 0, tr.stderr.read()
    finally:
        for p in (tr, tgt):
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


# --- mutations ---------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
META_KEYS = [
    "format",
    "version",
    "complete",
    "labels",
    "target",
    "probes",
    "clock",
    "interval_s",
    "end_reason",
    "limits",
    "intervals",
    "created",
    "host",
]

MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("empty"), st.integers(0, 10**6)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("renumber"), st.integers(0, 10**6), st.integers(0, 999999)),
    st.tuples(st.just("garbage_meta"), st.binary(max_size=64)),
    st.tuples(st.just("meta_value"), st.sampled_from(META_KEYS), JSON),
    st.tuples(st.just("meta_json"), JSON),
)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def mutate(root: Path, m: tuple) -> None:
    files = _files(root)
    kind = m[0]
    meta = root / "meta.json"
    if kind in ("flip", "truncate", "delete", "empty", "swap", "renumber"):
        if not files:
            return
        f = files[m[1] % len(files)]
        if kind == "flip":
            data = bytearray(f.read_bytes())
            if data:
                data[int(m[2] * len(data))] ^= 1 << m[3]
                f.write_bytes(bytes(data))
        elif kind == "truncate":
            data = f.read_bytes()
            f.write_bytes(data[: int(m[2] * len(data))])
        elif kind == "delete":
            f.unlink()
        elif kind == "empty":
            f.write_bytes(b"")
        elif kind == "swap":
            g = files[m[2] % len(files)]
            a, b = f.read_bytes(), g.read_bytes()
            f.write_bytes(b)
            g.write_bytes(a)
        elif kind == "renumber" and f.parent.name == "parts":
            table = f.name.rsplit("-", 1)[0]
            f.rename(f.with_name(f"{table}-{m[2]:06d}.parquet"))
    elif kind == "garbage_meta":
        meta.write_bytes(m[1])
    elif kind == "meta_value":
        try:
            doc = json.loads(meta.read_bytes())
        except (ValueError, OSError):  # garbage, or deleted by a mutation before
            return
        if isinstance(doc, dict):
            doc[m[1]] = m[2]
            meta.write_text(json.dumps(doc))
    elif kind == "meta_json":
        meta.write_text(json.dumps(m[1]))


def check(path: Path, reference, stacks=None, damaged: bool = False) -> None:
    """Only a TraceFileError, or a trace every report accepts (the diff too, when the stacks are
    not given: it symbolizes the trace itself; `reference`: the unmutated trace, summarized).
    `damaged`: its parts were changed (meta.json and the checksum list as written): the reader
    must say so, and the report withhold its findings (issue 53)."""
    try:
        t = load_trace(path)
    except TraceFileError as e:
        assert "\n" not in str(e), str(e)
        return
    assert isinstance(t.warnings, list)
    if damaged:
        assert t.integrity.status == "damaged", "a changed part read as written"
    rep = build_report(t, stacks=stacks)
    if damaged:
        assert rep["findings"][0]["kind"] == "damaged" and rep["integrity"]["damaged"], rep["integrity"]
    to_text(rep)
    json.dumps(rep, default=str)
    if stacks is None:  # diff_traces(reference trace, t), its side summarized once per test
        diff_to_text(diff_document(reference, summarize(t)))


def _run(base: Path, tmp: Path, mutations: list, stacks=None) -> None:
    """Check a fresh copy of the trace `base` with `mutations` applied against its reference."""
    work = tmp / "t.allocscope"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(base, work)
    before = {p.relative_to(work): p.read_bytes() for p in _files(work)}
    for m in mutations:
        mutate(work, m)
    after = {p.relative_to(work): p.read_bytes() for p in _files(work)}
    same = [Path("meta.json"), Path("parts") / C.NAME]
    damaged = all(before.get(p) == after.get(p) for p in same) and before != after
    check(work, _reference.get(base), stacks, damaged)


_reference: dict[Path, object] = {}  # the unmutated trace's diff side (summarize), once per test


def test_fuzz_synthetic_trace(synth_trace, tmp_path):
    _reference[synth_trace] = summarize(load_trace(synth_trace))
    check(synth_trace, _reference[synth_trace])  # the unmutated trace reads cleanly

    @settings(max_examples=EXTRA or 60, **SETTINGS)
    @given(st.lists(MUTATION, min_size=1, max_size=3))
    def run(mutations):
        _run(synth_trace, tmp_path, mutations)

    t0 = time.monotonic()
    run()
    print(f"synthetic: {time.monotonic() - t0:.1f}s")


@pytest.mark.bpf
def test_fuzz_recorded_trace(recorded_trace, tmp_path):
    ref = load_trace(recorded_trace)
    assert not ref.warnings and ref.complete
    stacks = symbolize_stacks(ref)  # symbolize once: the fuzz is about the reader, not the ELF files
    check(recorded_trace, ref, stacks)

    @settings(max_examples=EXTRA or 30, **SETTINGS)
    @given(st.lists(MUTATION, min_size=1, max_size=3))
    def run(mutations):
        _run(recorded_trace, tmp_path, mutations, stacks)

    t0 = time.monotonic()
    run()
    print(f"recorded: {time.monotonic() - t0:.1f}s")


@pytest.mark.bpf
def test_recorded_trace_with_200_bytes_overwritten_in_its_stacks_part(recorded_trace, tmp_path):
    """Issue 53 on a real recording: every part verified as written; 200 random bytes in the
    middle of its largest stacks part are said (stderr, the report's first finding) and exit 5,
    --allow-damaged exits 0 with the same report."""
    ref = load_trace(recorded_trace)
    parts = [n for n in os.listdir(recorded_trace / "parts") if n != C.NAME]
    assert ref.integrity.status == "verified" and ref.integrity.verified == len(parts), ref.integrity
    work = tmp_path / "d.allocscope"
    shutil.copytree(recorded_trace, work)
    part = max((work / "parts").glob("stacks-*.parquet"), key=lambda p: p.stat().st_size)
    data = bytearray(part.read_bytes())
    assert len(data) > 400, len(data)
    mid = len(data) // 2 - 100
    rng = random.Random(53)
    new = bytes(rng.randrange(256) for _ in range(200))
    assert new != bytes(data[mid : mid + 200])
    data[mid : mid + 200] = new
    part.write_bytes(bytes(data))
    p = subprocess.run(
        [sys.executable, "-m", "allocscope", "report", str(work)], cwd=str(ROOT), capture_output=True, text=True
    )
    assert p.returncode == 5, p.stderr
    assert p.stderr.splitlines()[0].startswith(f"allocscope: {work}: damaged part parts/{part.name}: not as written")
    assert "  1. Damaged trace: 1 part not as written or missing, of table stacks" in p.stdout
    q = subprocess.run(
        [sys.executable, "-m", "allocscope", "report", str(work), "--allow-damaged"],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
    )
    assert q.returncode == 0 and q.stdout == p.stdout, q.stderr
