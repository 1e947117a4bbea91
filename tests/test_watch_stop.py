"""Each recording of `watch` (one per process followed at once, tracer/watch/incarnation.py) stops on
the watch's signal and on a reason of its own, and its finishing is told to the watch's handler;
--max-processes bounds how many run at once. No BPF."""

from __future__ import annotations

import signal

from tracer.record.signals import StopRequest
from tracer.watch.incarnation import FollowStop


def test_a_recording_stops_on_the_watchs_signal_and_on_its_own():
    watch = StopRequest(quiet=True)
    a, b = FollowStop(watch), FollowStop(watch)
    assert a.reason is None and b.reason is None and not watch.finalizing
    a.request("target exited")  # one recording's own end: not the watch's, not the other's
    assert (a.reason, b.reason, watch.reason) == ("target exited", None, None)
    a.finalizing = True
    assert watch.finalizing  # a second signal now gets the watch's word
    watch.handle(signal.SIGTERM, None)
    assert (a.reason, b.reason, watch.reason) == ("target exited", "SIGTERM", "SIGTERM")


def test_max_processes_bounds_the_recordings_at_once(tmp_path, monkeypatch):
    """--max-processes 2: a third matching process is not recorded while two are (said once, not
    marked seen), and is once one of them ended."""
    import subprocess
    import threading

    import tracer.watch.watcher as W

    started: list[int] = []

    class FakeTracing:
        def __init__(self, watcher, key, held) -> None:
            self.pid, self.done, self.held = key[0], threading.Event(), held

        def start(self) -> None:
            started.append(self.pid)

    monkeypatch.setattr(W, "Tracing", FakeTracing)
    said: list[str] = []
    w = W.Watcher(
        W.WatchOptions(out_dir=str(tmp_path), pattern="^sleep 3[0-9]{2}$", max_processes=2),
        None,  # type: ignore[arg-type]
        said.append,
        StopRequest(quiet=True),
    )
    procs = [subprocess.Popen(["sleep", str(300 + i)]) for i in range(3)]
    try:
        a, b, c = (p.pid for p in procs)
        for pid in (a, b, c, c):
            w._start(pid, False)
        assert started == [a, b]
        assert said == [
            f"pid {c} matches but 2 processes are recorded already (--max-processes): traced once one of them ends"
        ]
        assert w._key(c) not in w.seen  # a later look at /proc finds it again
        w.tracing[w._key(a)].done.set()  # a's recording ended
        w._start(c, False)
        assert started == [a, b, c] and len(said) == 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
