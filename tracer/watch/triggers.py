"""`watch --when-rss SIZE [--on-trigger CMD]`: when an incarnation's RSS passes SIZE, the snapshot
of that moment is kept as a named one, and a command runs; `watch --on-end CMD`: a command runs
when an incarnation's trace is complete, with how it ended.

The seed's diagnosis began with a loop printing RSS every 5 seconds; this is that loop's alarm with
the composition attached. The first snapshot whose RSS is at or above SIZE is the trigger: it is
written at once (held parts included) with meta.json's `triggers` naming it ({name: "rss", seq,
elapsed_s, wall_s, rss_bytes, threshold_bytes}), so the trace on disk already holds it when the
command runs; `watch --keep` never drops it (tracer/watch/keep.py); `report --at rss` gives its
stacks as pprof or folded. It fires once per incarnation. The command runs through /bin/sh in a
session of its own, never waited for by the recording, with ALLOCSCOPE_TRACE (the trace's path),
ALLOCSCOPE_PID, ALLOCSCOPE_RSS_BYTES and ALLOCSCOPE_TRIGGER in its environment.

`--on-end` runs the same way once a trace is complete on disk (meta.json `end` written: the target
exited, was killed or OOM-killed, exec'd, or the watch stops), with ALLOCSCOPE_TRACE, ALLOCSCOPE_PID,
ALLOCSCOPE_END (`recording.end.reason`: exited, killed, oom_killed, exec, stopped),
ALLOCSCOPE_EXIT_CODE, ALLOCSCOPE_SIGNAL, ALLOCSCOPE_OOM_CGROUP (empty unless set) and
ALLOCSCOPE_RSS_BYTES (the last RSS measured while it was alive): the night's OOM kill pages
someone, or its trace is copied off the box, the moment it is written.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

from common.units import human_bytes

TRIGGER = "rss"
SPAWNING = threading.Lock()


def install(watcher) -> None:
    if watcher.options.when_rss is None:
        return
    children: list[subprocess.Popen] = []

    def observe(watch, snap, rec) -> None:
        rss = int(snap.row.get("rss_bytes", -1))
        if rss < watch.options.when_rss or any(t["name"] == TRIGGER for t in rec.triggers):
            return
        fire(watch, rec, snap, rss, children)

    watcher.observers.append(observe)


def fire(watch, rec, snap, rss: int, children: list) -> None:
    """The trigger: kept in the trace at once, said in a line, --on-trigger run."""
    opts = watch.options
    trig = {
        "name": TRIGGER,
        "seq": int(snap.seq),
        "elapsed_s": float(snap.row.get("elapsed_s", 0.0)),
        "wall_s": time.time(),
        "rss_bytes": rss,
        "threshold_bytes": int(opts.when_rss),
    }
    rec.triggers.append(trig)
    from ..record.meta import trace_meta  # noqa: PLC0415

    rec.writer.write_held()
    rec.writer.write_meta(trace_meta(rec, False))
    watch.progress(
        f"pid {rec.target.pid}: RSS {human_bytes(rss)} passed --when-rss {human_bytes(opts.when_rss)} "
        f"at +{trig['elapsed_s']:.1f}s: "
        f"kept as snapshot '{TRIGGER}' of {rec.opts.output} (report --at {TRIGGER})"
    )
    if opts.on_trigger:
        env = {
            "ALLOCSCOPE_TRACE": rec.opts.output,
            "ALLOCSCOPE_PID": str(rec.target.pid),
            "ALLOCSCOPE_RSS_BYTES": str(rss),
            "ALLOCSCOPE_TRIGGER": TRIGGER,
        }
        spawn(watch, "--on-trigger", opts.on_trigger, env, children)


def end_env(rec) -> dict[str, str]:
    """--on-end's environment for the finished recording `rec`."""
    end = rec.end or {}
    oom = end.get("oom") or {}

    def text(v) -> str:
        return "" if v is None else str(v)

    return {
        "ALLOCSCOPE_TRACE": rec.opts.output,
        "ALLOCSCOPE_PID": str(rec.target.pid),
        "ALLOCSCOPE_END": text(end.get("reason")),
        "ALLOCSCOPE_EXIT_CODE": text(end.get("exit_code")),
        "ALLOCSCOPE_SIGNAL": text(end.get("signal")),
        "ALLOCSCOPE_OOM_CGROUP": text(oom.get("cgroup")),
        "ALLOCSCOPE_RSS_BYTES": str(int(rec.snapshots.last_rss.get("rss_bytes", 0))),
    }


def spawn(watch, option: str, cmd: str, env: dict[str, str], children: list) -> None:
    """`cmd` through /bin/sh in a session of its own, `env` added to ours; never waited for
    (`children` keeps it to be reaped). One that cannot start is said in a line."""
    with SPAWNING:  # the recordings of processes followed at once end in threads of their own
        _spawn(watch, option, cmd, env, children)


def _spawn(watch, option: str, cmd: str, env: dict[str, str], children: list) -> None:
    for c in list(children):  # reap the commands that ended
        if c.poll() is not None:
            children.remove(c)
    try:
        children.append(
            subprocess.Popen(
                ["/bin/sh", "-c", cmd],
                env=dict(os.environ, **env),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        )
    except OSError as e:
        watch.progress(f"{option} could not start: {e.strerror or e}")
