"""The end of a recording (Recorder.run, after the poll loop): the last snapshot, the children's
last poll, the agent taken out, a launched target resumed and waited for, how the target ended
(tracer/process/ending.py: its wait status, the OOM killer's mark, its memory cgroups'
counters), meta.json complete, and the Summary the command prints. `rec` is the Recorder
(tracer/record/recorder.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.tracefile.names import lost_events

from ..process.ending import OomMark, describe_end
from .injecting import uninject
from .meta import trace_meta


@dataclass
class Summary:
    path: str
    seconds: float
    intervals: int
    end_reason: str
    live_bytes: int
    live_count: int
    sites: int
    lost: int
    bytes_written: int
    end: dict | None = None  # meta.json `end` (how the target ended, tracer/process/ending.py)
    cut_short: int = 0  # stacks cut short while an unwind table was built (lost_stack_pending): no event lost
    truncated: int = 0  # stacks cut short past 64 frames or an unfollowable frame (lost_stack_truncated): no loss


def finish(rec, probes) -> None:
    """After the loop: the final snapshot, how the target ended (rec.end), meta.json complete."""
    t = rec.target
    rec.stop.finalizing = True
    rec.end_reason = rec.end_reason or rec.stop.reason
    if rec.injection is not None:
        rec.injection.enable(False)  # no new samples: the last snapshot sees all there are
    probes.maps.drain_events()
    t_final = time.perf_counter()
    rec.snapshots.snapshot(final=True)
    if rec.children is not None:
        rec.children.poll()
    rec.final_snapshot_s = time.perf_counter() - t_final
    uninject(rec)
    if t.child is not None:  # launched
        t.child.resume()
        rec.target_exit = t.child.wait(timeout=0.2)
    rec.end = describe_end(
        rec.end_reason or "", exit_status(rec), rec.cgroups, (time.monotonic_ns() - rec.t0_ns) / 1e9, oom_mark(rec)
    )
    last = rec.snapshots.last_alive
    if last is not None and rec.end["reason"] != "stopped":
        rec.end["last_alive"] = {"seq": last[0], "elapsed_s": (last[1] - rec.t0_ns) / 1e9}
    rec.bpf_stats = probes.program_stats()
    if rec.unwinder is not None:
        rec.unwinder.finish()  # the last truncation counts; builds still running stopped
    rec.writer.write_meta(trace_meta(rec, True))


def summary(rec) -> Summary:
    """What the command prints of a recording that ended (its last `intervals` row)."""
    row = rec.snapshots.last_row
    return Summary(
        rec.opts.output,
        (time.monotonic_ns() - rec.t0_ns) / 1e9,
        rec.seq - (rec.peaks.written if rec.peaks is not None else 0),  # as the report counts them
        rec.end_reason or "",
        row["live_bytes"],
        row["live_count"],
        len(rec.snapshots.sites.current),
        lost_events(row),
        rec.writer.bytes_written,
        rec.end,
        int(row.get("lost_stack_pending", 0)),
        int(row.get("lost_stack_truncated", 0)),
    )


def exit_status(rec) -> int | None:
    """The target's wait status once it ended (None: not known)."""
    t = rec.target
    if t.child is not None:
        rc = t.child.returncode if t.child.returncode is not None else rec.target_exit
        if rc is None or rc == -1 and not t.child.exiting:
            return None
        return (-rc) & 0x7F if rc < 0 else (rc & 0xFF) << 8
    return t.exit_status


def oom_mark(rec, wait_s: float = 10.0) -> OomMark | None:
    """What oom:mark_victim says of the target (oomwatch.py): last known alive when the probes
    went live, or at its last measure."""
    last = rec.snapshots.last_alive
    alive_ns = max(rec.t0_ns if rec.started else 0, last[1] if last is not None else 0)
    pids = {rec.target.pid} | set(rec.snapshots.threads.names)
    return rec.ooms.mark(pids, rec.t0_ns, alive_ns, wait_s)


def ended_text(rec) -> str:
    """How a target that ended during the attach ended (the mark's program is loaded by then
    unless it must be compiled: not waited for long)."""
    end = describe_end("target exited", exit_status(rec), rec.cgroups, None, oom_mark(rec, wait_s=0.5))
    if end["reason"] == "oom_killed":
        return "OOM-killed"
    if end["signal"]:
        return f"killed by {end['signal']}"
    return f"exit code {end['exit_code']}" if end["exit_code"] is not None else "exited"
