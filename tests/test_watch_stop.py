"""Each recording of `watch` (one per process followed at once, tracer/watch/incarnation.py) stops on
the watch's signal and on a reason of its own, and its finishing is told to the watch's handler;
no BPF."""

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
