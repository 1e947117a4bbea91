"""One incarnation under `allocscope watch`, recorded in a thread of its own (tracer/watch/watcher.py
starts one per matching process, however many run at once): its trace, its end said in a line and
to --on-end, its figures on --metrics under its own worker label.

Each is a Recorder of its own (its own probes, filtered to its pid: probes/common.h's target is a
load-time constant, and the kernel puts a uprobe's breakpoints only into the processes a pid-filtered
probe names): N processes cost N loads of the prebuilt programs at the attach
(bench/results/2026-12-07-watch-fleet.md), and each one's events go to its own ring."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from common.endwords import oom_text
from common.errors import AllocscopeError, NoAllocatorError, TargetError
from common.listeners import SnapshotListener
from common.units import human_bytes

from ..base.options import RecordOptions
from ..process.ending import describe_end
from ..process.target import target_from_pid
from ..record.recorder import Recorder, Summary
from ..record.signals import StopRequest
from . import triggers
from .options import WatchOptions
from .traces import rotate, trace_name

if TYPE_CHECKING:
    from .gate import ExecGate

FOLLOW_S = 10.0  # a held incarnation is stopped at each library the loader maps, this long after its exec
WATCH_HOLD_S = 30.0  # a watched recording's small parts are written together this often (writer.py hold_s)


@dataclass
class Incarnation:
    """One traced incarnation: what the watch says of it at its end."""

    pid: int
    path: str
    held: bool
    summary: Summary | None = None
    error: str | None = None


def oom_words(oom: dict) -> str:
    """'OOM-killed by the memory cgroup /x (limit 2.0 GiB, anon-rss 1.9 GiB at the kill)', from
    `recording.end.oom`: the report's words (common/endwords.py), the kernel's figure where its
    mark gave one."""
    anon = (oom.get("victim") or {}).get("anon_rss_bytes")
    return oom_text(oom, [f"anon-rss {human_bytes(anon)} at the kill"] if anon is not None else [])


class FollowStop(StopRequest):
    """One recording's stop under the watch: the watch's own (a signal stops every recording), or
    this one's; `finalizing` is this recording's, told to the watch's (its signal handler's word)."""

    def __init__(self, watch: StopRequest) -> None:
        self.watch = watch
        self.own: str | None = None
        self._finalizing = False
        super().__init__(watch.quiet)

    @property  # type: ignore[override]
    def reason(self) -> str | None:
        return self.own or self.watch.reason

    @reason.setter
    def reason(self, value: str | None) -> None:
        self.own = value

    @property  # type: ignore[override]
    def finalizing(self) -> bool:
        return self._finalizing

    @finalizing.setter
    def finalizing(self, value: bool) -> None:
        """A second signal while a trace is being finished gets the watch's word."""
        self._finalizing = value
        if value:
            self.watch.finalizing = True


class Watch(Protocol):
    """What a recording under the watch uses of it (tracer/watch/watcher.py's Watcher): its options,
    its words, its gate, what it traces now and has traced, and where each recording reports."""

    options: WatchOptions
    ropts: RecordOptions
    stop: StopRequest
    progress: Callable[[str], None]
    gate: ExecGate | None
    listeners: SnapshotListener
    said_unserved: bool  # a process beyond --metrics' workers said once
    incarnations: list[Incarnation]
    tracing: dict[tuple[int, int], Tracing]
    seen: set[tuple[int, int]]
    unready: dict[tuple[int, int], frozenset[str]]
    observers: list[Callable]  # (watch, snap, rec) each snapshot: keep.py, triggers.py
    hooks: list  # --on-end's commands not reaped yet (triggers.py)
    code_files: Callable[[int], frozenset[str]]

    def claim(self, comm: str) -> bool: ...


class Tracing:
    """The recording of one process, in a thread (`start`); `done` once its trace is complete."""

    def __init__(self, watcher: Watch, key: tuple[int, int], held: bool) -> None:
        self.watcher = watcher
        self.key = key
        self.pid = key[0]
        self.held = held
        self.stop = FollowStop(watcher.stop)
        self.recorder: Recorder | None = None
        self.path = ""  # its trace, once named
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._thread, name=f"watch pid {self.pid}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _thread(self) -> None:
        try:
            self._trace()
        except Exception as e:  # noqa: BLE001 - one process's recording must never end the watch
            # nor leave a held process stopped for good (issue 50's soak: its traces folder deleted)
            let_go = self._let_go()
            first = (str(e).splitlines() or [""])[0][:200]
            self.watcher.progress(f"pid {self.pid}: its recording failed ({type(e).__name__}: {first}){let_go}")
        finally:
            self.done.set()

    def _let_go(self) -> str:
        """A held process whose recording failed runs on, untraced: '; it runs untraced' then."""
        gate = self.watcher.gate
        if not self.held or gate is None:
            return ""
        with contextlib.suppress(Exception):
            gate.unfollow(self.pid)
        with contextlib.suppress(Exception):
            gate.release(self.pid, "its recording failed")
        return "; it runs untraced"

    def _out_dir(self) -> bool:
        """The traces folder is there: made again when it was removed under the watch (said in a
        line), else False with a line (it cannot be written: this incarnation runs untraced)."""
        out = self.watcher.options.out_dir
        if os.path.isdir(out):
            return True
        try:
            os.makedirs(out, mode=0o700, exist_ok=True)
        except OSError as e:
            self.watcher.progress(
                f"pid {self.pid}: cannot write its trace: {out} is gone and cannot be made again "
                f"({e.strerror or e}){self._let_go()}"
            )
            return False
        self.watcher.progress(f"{out} was removed under the watch: made it again")
        return True

    def _release(self) -> None:
        if self.held and self.watcher.gate is not None:
            self.watcher.gate.release(self.pid)

    def _trace(self) -> None:
        w, pid, held = self.watcher, self.pid, self.held
        gate = w.gate if held else None
        try:
            target = target_from_pid(pid)
        except AllocscopeError as e:
            self._release()
            w.progress(f"pid {pid}: {e}")
            return
        rec_hook = None
        if gate is not None:
            target.on_release = lambda: gate.release(pid, "the probes are live")
            gate.follow(pid, FOLLOW_S)  # the libraries it maps next: their unwind rows first
            rec_hook = lambda: gate.release_code(pid)
        if w.gate is not None and w.claim(target.comm):
            w.gate.watch(target.comm)
        if not self._out_dir():
            target.close()
            return
        path = os.path.join(w.options.out_dir, trace_name(target.comm, pid, time.time()))
        busy = [t.path for t in list(w.tracing.values()) if t is not self and t.path]
        rotate(w.options.out_dir, w.options.max_traces, w.progress, busy)
        self.path = path
        inc = Incarnation(pid, path, held)
        w.incarnations.append(inc)
        opts = replace(w.ropts, output=path, force=False)
        served = w.listeners.target_started(pid, target.comm, path)
        if served is False and not w.said_unserved:
            w.said_unserved = True
            w.progress(f"pid {pid} is traced but not on --metrics: it serves a bounded number of processes at once")
        t0 = time.monotonic()
        rec = Recorder(target, opts, w.progress, self.stop, observer=self._observe)
        rec.hold_s = WATCH_HOLD_S if opts.interval < WATCH_HOLD_S else 0.0
        rec.watch = w  # tracer/watch/keep.py and triggers.py reach the watch's options through it
        rec.on_code_mapped = rec_hook
        rec.observer_polls = False  # its observers are queued work: no 100 ms wakes for them
        self.recorder = rec
        reason = None
        try:
            inc.summary = rec.run()
            reason = (rec.end or {}).get("reason")
            self._said_end(inc, rec)
            if w.options.on_end:
                triggers.spawn(w, "--on-end", w.options.on_end, triggers.end_env(rec), w.hooks)
        except AllocscopeError as e:
            inc.error = str(e)
            if isinstance(e, NoAllocatorError) and not held:  # perhaps caught before its loader's work
                with contextlib.suppress(OSError):
                    w.unready[self.key] = w.code_files(pid)
                    w.seen.discard(self.key)
            w.progress(f"pid {pid}: {e}")
            if isinstance(e, TargetError) and "ended while" in str(e):  # before its recording began
                target.alive()
                reason = describe_end("target exited", target.exit_status, None)["reason"]
        finally:
            if rec.early is not None:
                rec.early.discard()
            target.close()
            if gate is not None:
                gate.unfollow(pid)
            if target.on_release is not None:  # never attached: let it go
                with contextlib.suppress(Exception):
                    target.on_release()
            w.listeners.target_ended(reason or "stopped", pid)  # every start gets its end
        give_back_memory()
        if self.stop.reason is None and time.monotonic() - t0 < 0.5:
            time.sleep(0.2)  # a pid that ends at once: the gate's next event, not a busy loop

    def _said_end(self, inc: Incarnation, rec: Recorder) -> None:
        s = inc.summary
        assert s is not None
        end = rec.end or {}
        how = {"killed": f"killed by {end.get('signal')}", "exited": f"exited (code {end.get('exit_code')})"}.get(
            str(end.get("reason")), str(end.get("reason") or s.end_reason)
        )
        if end.get("reason") == "oom_killed":
            how = oom_words(end.get("oom") or {})
        self.watcher.progress(
            f"pid {inc.pid} {how}: wrote {inc.path} ({s.intervals} intervals, "
            f"{s.seconds:.1f}s{', traced from its exec' if inc.held else ''})"
        )

    def _observe(self, snap) -> None:
        w, rec = self.watcher, self.recorder
        w.listeners.observe(snap, self.pid)
        if rec is not None:
            for obs in w.observers:
                obs(w, snap, rec)


GIVE_BACK = threading.Lock()


def give_back_memory() -> None:
    """Between incarnations, what the last recording freed goes back to the system: the
    cyclic garbage, Arrow's pool, and glibc's arenas (the recording's threads each had one).
    Without it a watch grew ~4.5 MiB per incarnation (bench/watch_soak.py)."""
    import ctypes  # noqa: PLC0415
    import gc  # noqa: PLC0415

    with GIVE_BACK:
        gc.collect()
        try:
            import pyarrow as pa  # noqa: PLC0415

            pa.default_memory_pool().release_unused()
        except Exception:  # noqa: BLE001 - an older pyarrow: nothing to give back there
            pass
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass
