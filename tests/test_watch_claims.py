"""One watch per program name per box (tracer/watch/claims.py): a name is claimed by an exclusive
flock on a file named after its first 15 bytes; the holder's pid is said to the one refused, and
the claim ends with the holder, SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from support import ROOT, wait_for

from common.errors import PermissionProblem
from tracer.watch.claims import NameClaims, lock_name


def test_one_claim_per_name(tmp_path):
    a, b = NameClaims(str(tmp_path / "run")), NameClaims(str(tmp_path / "run"))
    assert a.claim("provingd") is None
    assert a.claim("provingd") is None  # ours already
    assert b.claim("provingd") == os.getpid()  # the holder's pid, for the message
    assert b.claim("redis-server") is None  # another name: free
    # the kernel's comm is the first 15 bytes: names that differ after them are one name
    assert a.claim("partition-worker-1") is None
    assert b.claim("partition-worker-2") == os.getpid()
    assert oct((tmp_path / "run").stat().st_mode & 0o777) == "0o700"
    f = tmp_path / "run" / lock_name("provingd")
    assert f.read_text() == f"{os.getpid()}\nprovingd\n" and oct(f.stat().st_mode & 0o777) == "0o600"
    a.close()
    assert b.claim("provingd") is None  # free once its holder let go
    b.close()


def test_a_killed_holder_lets_go(tmp_path):
    run = str(tmp_path / "run")
    code = (
        "import sys, time; from tracer.watch.claims import NameClaims\n"
        f"c = NameClaims({run!r}); assert c.claim('provingd') is None; print('claimed', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "claimed\n"
        c = NameClaims(run)
        assert c.claim("provingd") == p.pid
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert c.claim("provingd") is None
        c.close()
    finally:
        p.kill()


def test_a_place_that_cannot_hold_claims_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(PermissionProblem, match=r"^cannot claim 'provingd' for this watch in .*ALLOCSCOPE_RUN_DIR"):
        NameClaims(str(tmp_path / "file" / "run")).claim("provingd")
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)  # anyone could take the claims there: not used
    with pytest.raises(PermissionProblem, match="writable by others"):
        NameClaims(str(tmp_path / "open")).claim("provingd")


def test_the_scan_waits_for_a_stopped_or_unready_process(tmp_path):
    """`watch` finding a process by /proc: one stopped (another watch's gate holds it at its exec)
    is looked at again once it runs; one that had no allocator yet, once its code files change."""
    from tracer.base.options import RecordOptions
    from tracer.process import procfs
    from tracer.record.signals import StopRequest
    from tracer.watch.watcher import Watcher, WatchOptions, code_files

    p = subprocess.Popen(["sleep", "3117"])
    try:
        # Popen returns once the exec has begun, before the kernel sets the new command line: a
        # scan in that moment sees an empty one (the watch's next scan finds it; here, wait)
        wait_for(lambda: procfs.cmdline(p.pid) == ["sleep", "3117"], 10, "sleep's command line")
        w = Watcher(WatchOptions(str(tmp_path / "t"), pattern="^sleep 3117$"), RecordOptions(), print, StopRequest())
        assert w._scan() == [p.pid]
        p.send_signal(signal.SIGSTOP)
        wait_state(p.pid, "T")
        said = []
        w.progress = said.append
        assert w._scan() == [] and said == []  # stopped: not now (and a moment's stop is not said)
        key = (p.pid, w._key(p.pid)[1])
        w.stopped_since[key] -= 6  # stopped for 6 s
        assert w._scan() == [] and w._scan() == []
        assert said == [f"pid {p.pid} matches but has been stopped for 5 s: traced once it runs"]
        p.send_signal(signal.SIGCONT)
        wait_state(p.pid, "S")
        w.unready[key] = code_files(p.pid)
        assert w._scan() == []  # its code as when it had no allocator
        w.unready[key] = frozenset({"/usr/bin/sleep"})
        assert w._scan() == [p.pid]  # its code changed since: looked at again
    finally:
        p.kill()
        p.wait()


def wait_state(pid: int, want: str) -> None:
    import time

    for _ in range(500):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == want:
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never reached state {want}")
