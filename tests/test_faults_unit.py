"""Issue #7 without BPF: the pid-reuse guard, our own pid, the signal handler, diff of foreign,
future and damaged traces, and no network code anywhere."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import ROOT, cli, one_line_error
from synth import SynthTrace

from common.errors import TargetError
from tracer.process import procfs

# --- pid reuse and our own pid ------------------------------------------------------------------


def test_is_alive_checks_the_start_time():
    """A pid is the same process only with the same start time: a reused pid is not alive."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        start = procfs.starttime(p.pid)
        assert procfs.is_alive(p.pid, start)
        assert not procfs.is_alive(p.pid, start + 1)  # what a new process with this pid looks like
        assert not procfs.is_alive(p.pid, start - 1)
    finally:
        p.kill()
        p.wait()
    assert not procfs.is_alive(p.pid, start)  # gone (and reaped)


def test_is_alive_false_for_a_zombie():
    p = subprocess.Popen(["true"])
    start = procfs.starttime(p.pid)
    time.sleep(0.3)  # exited, not reaped
    try:
        assert procfs.state(p.pid) == "Z"
        assert not procfs.is_alive(p.pid, start)
    finally:
        p.wait()


def test_target_alive_uses_the_guard():
    from tracer.process.target import Target

    p = subprocess.Popen(["sleep", "30"])
    try:
        start = procfs.starttime(p.pid)
        assert Target(p.pid, start, "/bin/sleep", "sleep").alive()
        reused = Target(p.pid, start + 7, "/bin/sleep", "sleep")
        assert not reused.alive() and not reused.readable()
    finally:
        p.kill()
        p.wait()


def test_target_alive_polls_a_pidfd_not_proc(monkeypatch):
    """Issue 33: the recorder asks alive() ~3 times a snapshot; after the first (the start-time
    guard) the answer comes from a pidfd, never /proc/PID/stat again; a zombie and a reaped
    process are not alive, and stay so."""
    from tracer.process.target import Target

    p = subprocess.Popen(["sleep", "30"])
    t = Target(p.pid, procfs.starttime(p.pid), "/bin/sleep", "sleep")
    reads = []
    real = procfs.stat_fields
    monkeypatch.setattr(procfs, "stat_fields", lambda pid: reads.append(pid) or real(pid))
    try:
        assert t.alive()
        assert len(reads) == 1  # the guard, once
        assert all(t.alive() for _ in range(50)) and len(reads) == 1
        p.kill()
        deadline = time.monotonic() + 5
        while procfs.state(p.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not t.alive() and not t.readable()  # a zombie, not reaped yet
    finally:
        p.wait()
    assert not t.alive()
    t.close()


def test_check_target_refuses_our_own_pid():
    with pytest.raises(TargetError, match="allocscope itself"):
        procfs.check_target(os.getpid())


def test_record_refuses_its_own_pid_via_pgrep_ancestors():
    """--pgrep never matches the tracer or the processes that started it."""
    assert os.getpid() in procfs.ancestors(os.getpid())
    assert os.getppid() in procfs.ancestors(os.getpid())


# --- the signal handler ---------------------------------------------------------------------------


def test_signal_handler_never_raises_and_keeps_the_first_reason(capsys):
    from tracer.record.recorder import StopRequest

    r = StopRequest()
    r.handle(signal.SIGINT, None)
    assert r.reason == "SIGINT"
    r.handle(signal.SIGTERM, None)  # a second signal while stopping: same reason, no exception
    assert r.reason == "SIGINT"
    r.finalizing = True
    r.handle(signal.SIGINT, None)
    r.handle(signal.SIGINT, None)
    assert r.reason == "SIGINT"
    err = capsys.readouterr().err
    assert "finalizing the trace, please wait" in err


# --- diff of foreign, future and damaged traces ----------------------------------------------------


def _trace(path, exe: str = "/usr/bin/synthd", labels=None) -> str:
    t = SynthTrace(path, exe=exe, labels=labels)
    s = t.stack(["make_buf", "main"])
    t.interval({(s, 1): (4096, 1, 0, 0)})
    t.interval({(s, 1): (8192, 2, 0, 0)})
    return t.close()


def test_diff_of_two_programs_is_allowed_but_said(tmp_path):
    a = _trace(tmp_path / "a.allocscope", exe="/usr/bin/redis-server")
    b = _trace(tmp_path / "b.allocscope", exe="/usr/sbin/nginx")
    p = cli("diff", a, b, "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert any(w.startswith("A and B are different programs (redis-server vs nginx)") for w in doc["warnings"])
    p = cli("diff", a, b)
    assert p.returncode == 0 and "different programs (redis-server vs nginx)" in p.stdout


def test_diff_future_version(tmp_path):
    a = _trace(tmp_path / "a.allocscope")
    b = _trace(tmp_path / "b.allocscope")
    meta = json.loads(Path(b, "meta.json").read_text())
    meta["version"] = 99
    with open(os.path.join(b, "meta.json"), "w") as f:
        json.dump(meta, f)
    one_line_error(cli("diff", a, b), "newer allocscope", code=5)
    one_line_error(cli("diff", b, a), "newer allocscope", code=5)


def test_diff_corrupt_part_is_skipped_with_warning(tmp_path):
    a = _trace(tmp_path / "a.allocscope")
    b = _trace(tmp_path / "b.allocscope")
    part = os.path.join(b, "parts", "sites-000002.parquet")
    data = Path(part).read_bytes()
    with open(part, "wb") as f:
        f.write(data[: len(data) // 3])
    p = cli("diff", a, b, "--format", "json")
    assert p.returncode == 5, p.stderr  # damaged: said, and exit 5 (issue 53)
    p = cli("diff", a, b, "--format", "json", "--allow-damaged")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    warnings = doc["warnings"]
    assert any(w.startswith("B: damaged trace: 1 part") for w in warnings), warnings
    assert [d["part"] for d in doc["traces"]["b"]["integrity"]["damaged"]] == ["sites-000002.parquet"]


def test_diff_corrupt_meta(tmp_path):
    a = _trace(tmp_path / "a.allocscope")
    b = _trace(tmp_path / "b.allocscope")
    with open(os.path.join(a, "meta.json"), "wb") as f:
        f.write(b"\x00\xff garbage")
    one_line_error(cli("diff", a, b), "corrupt", code=5)


# --- no network -----------------------------------------------------------------------------------

NET = re.compile(
    r"^\s*(import socket|from socket\b|import socketserver|from socketserver\b|import http\.server"
    r"|from http\.server\b|import asyncio|from asyncio\b|import urllib|from urllib\b|import requests)"
    r"|\bsocket\.socket\(|\.listen\(\s*\d*\s*\)|\.bind\(\s*\(|start_server\(",
    re.M,
)


# The one exception: `--metrics HOST:PORT` (issue 44, docs/fleet.md) serves Prometheus from this
# module, and only when asked.
SERVES_METRICS = ROOT / "reports" / "live" / "prometheus.py"  # the --metrics exporter (common/listeners.py)


def test_no_network_code_anywhere():
    """The tracer and the reports open no socket, bind nothing, listen nowhere, fetch nothing
    (the --metrics exporter aside)."""
    hits = []
    for pkg in ("allocscope", "tracer", "reports", "probes"):
        for dirpath, _, files in os.walk(ROOT / pkg):
            for f in files:
                if f.endswith((".py", ".c", ".h")) and Path(dirpath, f) != SERVES_METRICS:
                    text = Path(dirpath, f).read_text(encoding="utf-8", errors="replace")
                    hits += [f"{pkg}/{f}: {m.group(0).strip()}" for m in NET.finditer(text)]
    assert not hits, hits


def test_part_of_another_table_under_a_live_name_is_skipped(tmp_path):
    """The live table is read with its strings as dictionaries: a part of another table renamed
    to a live part (no `api` column) is skipped as damage, not a crash (found by the fuzzer)."""
    from common.tracefile import checksums as C
    from reports.trace import load_trace

    path = _trace(tmp_path / "a.allocscope")
    parts = Path(path, "parts")
    (parts / "live-000002.parquet").write_bytes((parts / "sites-000002.parquet").read_bytes())
    with open(parts / C.NAME, "ab") as f:  # listed as written: the reader reads it (issue 53)
        f.write(C.line("live-000002.parquet", *C.crc_file(str(parts / "live-000002.parquet"))))
    t = load_trace(path)
    assert [d.text() for d in t.integrity.damaged if d.part == "live-000002.parquet"] == [
        "parts/live-000002.parquet: not a valid live part, skipped (no column addr)"
    ], t.integrity.damaged
    assert t.live_rows == 0
