"""The recording's poll loop (Recorder.run, between the set-up and the end): the ring's events
polled, the unwinder and the Python frames ticked, a peak wake read, a snapshot every interval,
until a reason to stop (the target's exit, --duration, a signal). `rec` is the Recorder
(tracer/record/recorder.py)."""

from __future__ import annotations

import time

BUSY_WAKE_NS = 100_000_000  # the loop's longest sleep while something needs it (wake_cap)
IDLE_WAKE_NS = 1_000_000_000  # ... and while nothing does: events, signals and the snapshot wake it


def poll_loop(rec, probes) -> None:
    """Poll events, snapshot every interval, until a reason to stop (rec.end_reason, rec.stop)."""
    t = rec.target
    interval_ns = int(rec.opts.interval * 1e9)
    deadline = rec.t0_ns + int(rec.opts.duration * 1e9) if rec.opts.duration else None
    first = rec.opts.first_snapshot_s
    next_snap = rec.t0_ns + (interval_ns if first is None else int(min(first, rec.opts.interval) * 1e9))
    while rec.end_reason is None and rec.stop.reason is None:
        now = time.monotonic_ns()
        until = next_snap if deadline is None else min(next_snap, deadline)
        wait_ms = int(max(0, min(until - now, wake_cap(rec))) // 1_000_000)
        peak_ms = rec.peaks.wait_ms(now) if rec.peaks is not None else None
        probes.maps.poll_events(wait_ms if peak_ms is None else min(wait_ms, peak_ms))
        rec.ring.replay_slow()
        if rec.unwinder is not None:
            rec.unwinder.tick()  # the modules stacks were cut short at: built, loaded
        if rec.python is not None:
            rec.python.tick()  # threads started since: their frames
        now = time.monotonic_ns()
        if rec.peaks is not None and rec.peaks.due(now):
            rec.peaks.read()  # the live total passed its high-water mark: the sites now
            now = time.monotonic_ns()
        if not t.alive():
            rec.end_reason = "target exited"
        elif deadline is not None and now >= deadline:
            rec.end_reason = "duration"
        elif now >= next_snap:
            rec.snapshots.snapshot()
            if rec.children is not None:
                rec.children.poll()  # forked children: not traced, but said
            if rec.cgroups is not None:
                rec.cgroups.follow(t.pid)  # moved to another memory cgroup: its OOM kill is told there
            next_snap += interval_ns
            if next_snap < now:  # the snapshot took longer than an interval
                next_snap = now + interval_ns


def wake_cap(rec) -> int:
    """The longest the loop sleeps in one poll (ns). Ring events (a peak wake, code mapped,
    the last thread's exit), signals (EINTR), the next snapshot and --duration wake it
    anyway; a 100 ms cap is kept only for what is polled: pending unwind modules, a
    launched child (held at exit), an observer (`top`: its keys), the exit being seen.
    Each wake costs the tracer ~0.1 ms of CPU (issue 33)."""
    if (
        rec.group_exit
        or (rec.observer is not None and rec.observer_polls)
        or rec.target.child is not None
        or (rec.unwinder is not None and rec.unwinder.waiting())
    ):
        return BUSY_WAKE_NS
    return IDLE_WAKE_NS
