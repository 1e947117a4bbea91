"""`watch --when-rss SIZE [--on-trigger CMD]`: when an incarnation's RSS passes SIZE, the snapshot
of that moment is kept as a named one, and a command runs.

The seed's diagnosis began with a loop printing RSS every 5 seconds; this is that loop's alarm with
the composition attached. The first snapshot whose RSS is at or above SIZE is the trigger: it is
written at once (held parts included) with meta.json's `triggers` naming it ({name: "rss", seq,
elapsed_s, wall_s, rss_bytes, threshold_bytes}), so the trace on disk already holds it when the
command runs; `watch --keep` never drops it (tracer/watch/keep.py); `report --at rss` gives its
stacks as pprof or folded. It fires once per incarnation. The command runs through /bin/sh in a
session of its own, never waited for by the recording, with ALLOCSCOPE_TRACE (the trace's path),
ALLOCSCOPE_PID, ALLOCSCOPE_RSS_BYTES and ALLOCSCOPE_TRIGGER in its environment.
"""

from __future__ import annotations

import os
import subprocess
import time

TRIGGER = "rss"


def install(watcher) -> None:
    if watcher.w.when_rss is None:
        return
    children: list[subprocess.Popen] = []

    def observe(w, snap) -> None:
        for c in list(children):  # reap the commands that ended
            if c.poll() is not None:
                children.remove(c)
        rec = w.recorder
        rss = int(snap.row.get("rss_bytes", -1))
        if rec is None or rss < w.w.when_rss or any(t["name"] == TRIGGER for t in rec.triggers):
            return
        fire(w, rec, snap, rss, children)

    watcher.observers.append(observe)


def fire(w, rec, snap, rss: int, children: list) -> None:
    trig = {
        "name": TRIGGER,
        "seq": int(snap.seq),
        "elapsed_s": float(snap.row.get("elapsed_s", 0.0)),
        "wall_s": time.time(),
        "rss_bytes": rss,
        "threshold_bytes": int(w.w.when_rss),
    }
    rec.triggers.append(trig)
    from ..record.meta import trace_meta  # noqa: PLC0415

    rec.writer.write_held()
    rec.writer.write_meta(trace_meta(rec, False))
    w.progress(
        f"pid {rec.target.pid}: RSS {rss} bytes passed --when-rss {w.w.when_rss} at +{trig['elapsed_s']:.1f}s: "
        f"kept as snapshot '{TRIGGER}' of {rec.opts.output} (report --at {TRIGGER})"
    )
    if w.w.on_trigger:
        env = dict(
            os.environ,
            ALLOCSCOPE_TRACE=rec.opts.output,
            ALLOCSCOPE_PID=str(rec.target.pid),
            ALLOCSCOPE_RSS_BYTES=str(rss),
            ALLOCSCOPE_TRIGGER=TRIGGER,
        )
        try:
            children.append(
                subprocess.Popen(
                    ["/bin/sh", "-c", w.w.on_trigger],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            )
        except OSError as e:
            w.progress(f"--on-trigger could not start: {e.strerror or e}")
