"""Ctrl-C at any moment of `allocscope record`'s start-up is honoured: while the probes are being
compiled and attached it stops there — one line, exit 130, nothing recorded, the trace already at
the output path left where it was, the target unharmed; once they are attached it finishes a
short, complete trace."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from support import cli_bg, wait_for
from synth import SynthTrace

pytestmark = pytest.mark.bpf


def _old_trace(path: Path) -> bytes:
    t = SynthTrace(path, labels={"run": "old"})
    s = t.stack(["old_site", "main"])
    t.interval({(s, 1): (4096, 1, 0, 0)})
    t.close()
    return (path / "meta.json").read_bytes()


@pytest.fixture
def compiling(monkeypatch):
    """Start-up long enough to be interrupted: the probes compiled by BCC (several seconds here),
    neither loaded from the prebuilt store nor from the object cache (live within about a second,
    which a fixed delay would miss: CI's SIGINT at 1.0 s once came after the probes were live)."""
    monkeypatch.setenv("ALLOCSCOPE_PREBUILT", "0")
    monkeypatch.setenv("ALLOCSCOPE_BPF_CACHE", "0")


@pytest.mark.parametrize("delay", [0.3, 1.5])
def test_sigint_while_starting_records_nothing(targets, procs, tmp_path, delay, compiling):
    tgt = procs(targets["busy"])
    tgt.expect("ready")
    out = tmp_path / "run.allocscope"
    before = _old_trace(out)
    tr = cli_bg("record", "--pid", str(tgt.pid), "-o", str(out))
    time.sleep(delay)  # BCC is still compiling
    tr.send_signal(signal.SIGINT)
    rc = tr.wait(60)
    err = tr.stderr.read()
    assert rc == 130, (rc, err)
    assert err.count("\n") == 1 and err.startswith("allocscope: interrupted (SIGINT) while "), err
    assert "nothing was recorded" in err and f"{out} was left as it was" in err, err
    assert "Traceback" not in err and "Aborted" not in err
    assert (out / "meta.json").read_bytes() == before  # the old trace, untouched
    assert not Path(str(out) + ".old").exists()
    assert tgt.p.poll() is None  # the target runs on


def test_sigint_once_attached_finishes_a_short_trace(targets, procs, tmp_path):
    tgt = procs(targets["busy"])
    tgt.expect("ready")
    out = tmp_path / "run.allocscope"
    _old_trace(out)
    tr = cli_bg("record", "--pid", str(tgt.pid), "-o", str(out))
    old = Path(str(out) + ".old")
    wait_for(
        lambda: (out / "meta.json").exists() and old.exists() or tr.poll() is not None,
        timeout=120,
        what="the new trace started",
    )
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] is True and meta["end_reason"] == "SIGINT" and meta["intervals"] >= 1
    assert json.loads((old / "meta.json").read_text())["labels"] == {"run": "old"}
    assert tgt.p.poll() is None


def test_sigint_while_starting_a_launched_command(tmp_path, compiling):
    """Launch mode: the child, still blocked before exec, is killed; nothing is left running."""
    import subprocess

    out = tmp_path / "launch.allocscope"
    tr = cli_bg("record", "-o", str(out), "--", "sleep", "30")
    time.sleep(1.0)
    child = subprocess.run(["pgrep", "-P", str(tr.pid)], capture_output=True, text=True).stdout.split()
    tr.send_signal(signal.SIGINT)
    rc = tr.wait(60)
    err = tr.stderr.read()
    assert rc == 130 and "nothing was recorded" in err, (rc, err)
    assert not out.exists()
    for pid in child:  # killed and reaped before record exits (not left for PTRACE_O_EXITKILL)
        assert not Path(f"/proc/{pid}").exists(), Path(f"/proc/{pid}/stat").read_text()
