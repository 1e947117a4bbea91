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


BUILDING = "start-up: start building the probes"  # --verbose: the probes' thread has started


def _interrupt(tr, moment: str) -> str:
    """SIGINT at `moment` of the start-up: "python" while the interpreter and the CLI start (0.2 s
    in), "probes" as the probes' thread starts loading them (--verbose says so; live comes ~0.5-1 s
    later here, the prebuilt programs' load and verification: no fixed delay would be sure to land
    in it). The lines it printed (and prints until it exits), but for the start-up phases."""
    lines = []
    if moment == "python":
        time.sleep(0.2)
    else:
        for line in tr.stderr:
            lines.append(line)
            if BUILDING in line:
                break
    tr.send_signal(signal.SIGINT)
    rc = tr.wait(60)
    lines += tr.stderr.readlines()
    tr.rc = rc
    assert not any("recording pid" in line for line in lines), lines  # it was interrupted while starting
    return "".join(line for line in lines if "allocscope: start-up: " not in line)


@pytest.mark.parametrize("moment", ["python", "probes"])
def test_sigint_while_starting_records_nothing(targets, procs, tmp_path, moment):
    tgt = procs(targets["busy"])
    tgt.expect("ready")
    out = tmp_path / "run.allocscope"
    before = _old_trace(out)
    tr = cli_bg("record", "--verbose", "--pid", str(tgt.pid), "-o", str(out))
    err = _interrupt(tr, moment)
    rc = tr.rc
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


def test_sigint_while_starting_a_launched_command(tmp_path):
    """Launch mode: the child, still blocked before exec, never runs the program (a recording
    that did not start runs nothing) and is reaped; nothing is left running."""
    import subprocess

    out = tmp_path / "launch.allocscope"
    ran = tmp_path / "ran"
    tr = cli_bg("record", "--verbose", "-o", str(out), "--", "sh", "-c", f"echo ran > {ran}; exec sleep 30")
    for line in tr.stderr:  # forked (blocked before exec) before the probes are built
        if BUILDING in line:
            break
    child = subprocess.run(["pgrep", "-P", str(tr.pid)], capture_output=True, text=True).stdout.split()
    assert child, "the launched command is forked before the probes are built"
    tr.send_signal(signal.SIGINT)
    rc = tr.wait(60)
    err = "".join(line for line in tr.stderr.readlines() if "allocscope: start-up: " not in line)
    assert rc == 130 and "nothing was recorded" in err, (rc, err)
    assert err.count("\n") == 1, err  # no word of a program killed: none ran
    assert not out.exists()
    assert not ran.exists()
    for pid in child:  # killed and reaped before record exits (not left for PTRACE_O_EXITKILL)
        assert not Path(f"/proc/{pid}").exists(), Path(f"/proc/{pid}/stat").read_text()
