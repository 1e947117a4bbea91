"""`allocscope watch`: follow a daemon for days, across restarts, one trace per incarnation.

The watcher runs until stopped (SIGINT, SIGTERM, SIGHUP: the recording under way is finished, a
complete trace). It follows every process whose command line matches the pattern (--pgrep, like `pgrep -f`;
--pid: that process's exact command line), all at once, each recorded in a thread of its own
(tracer/watch/incarnation.py):

* a process already running when the watch starts, or one found by a look at /proc (every
  `SCAN_S`), is attached as `record --pid` would (what it allocated before is not seen);
* a process that execs a program of a watched name (the comm of every incarnation seen, and the
  pattern's first word) is stopped at its exec by the gate (tracer/watch/gate.py); if its command
  line matches, the probes attach to it while it is stopped and it is let go once they are live:
  traced from its first allocation. Any other is let go at once.

Each incarnation is recorded into its own trace `DIR/COMM-PID-YYYYmmdd-HHMMSS.allocscope`,
complete when it ends (its end named: tracer/process/ending.py); old traces rotate
(`--max-traces`, tracer/watch/traces.py); `--keep` bounds each trace's interval history (tracer/watch/keep.py);
`--when-rss` keeps a named snapshot when RSS passes a size (tracer/watch/triggers.py).
A target that ends at any moment is a one-line note, and the watch goes on.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.errors import TargetError, UsageError
from common.listeners import Listeners, SnapshotListener

from ..base.options import RecordOptions
from ..process import procfs
from ..record.signals import StopRequest
from .claims import NameClaims
from .incarnation import Incarnation, Tracing, give_back_memory, oom_words
from .options import WatchOptions
from .traces import FAILED_ENDS, ended_badly, is_trace, rotate, trace_name, traces_in

if TYPE_CHECKING:
    from .gate import ExecGate

DEBUG = bool(os.environ.get("ALLOCSCOPE_WATCH_DEBUG"))  # every exec the gate holds, and what is done with it
SCAN_S = 1.0  # how often /proc is looked at for a matching process the gate did not hold
STOPPED_SAY_S = 5.0  # a matching process stopped this long is said once (traced once it runs)


def command_pattern(pid: int) -> tuple[str, str]:
    """--pid: (the regex matching exactly its command line, its comm). A pid that cannot be
    traced is an error now, as for `record --pid`, not a watch that finds nothing: one it cannot
    read, and one of the watch's own parents (never matched, like `--pgrep`'s)."""
    procfs.check_target(pid)
    if pid in procfs.ancestors(os.getpid()):
        raise TargetError(f"pid {pid} ({procfs.comm(pid)}) is a parent of this watch: give the daemon's pid")
    try:
        args = procfs.cmdline(pid)
        comm = procfs.comm(pid)
    except OSError:
        raise TargetError(f"no process with pid {pid}") from None
    if not args:
        raise TargetError(f"pid {pid} has no command line (a kernel thread or a zombie)")
    return "^" + re.escape(" ".join(args)) + "$", comm


def first_word_comm(pattern: str) -> str | None:
    """The program name a pattern's first word names ('^/usr/bin/provingd --pw' -> 'provingd'),
    when it is a plain word; None when it is a regex of its own."""
    word = pattern.lstrip("^").split(" ", 1)[0]
    base = os.path.basename(word)
    return base[:15] if re.fullmatch(r"[A-Za-z0-9_.+-]+", base) else None


class Watcher:
    """The watch: run() returns when stopped; incarnations lists what it traced."""

    def __init__(
        self,
        wopts: WatchOptions,
        ropts: RecordOptions,
        progress: Callable[[str], None],
        stop: StopRequest,
        listeners: SnapshotListener | None = None,
    ) -> None:
        self.options = wopts  # the watch's own (--keep, --max-traces, --when-rss...)
        self.ropts = ropts  # each recording's
        self.progress = progress
        self.stop = stop
        # told each incarnation's start, snapshots and end, by pid (common/listeners.py: --metrics)
        self.listeners: SnapshotListener = listeners if listeners is not None else Listeners()
        self.said_unserved = False  # a process beyond --metrics' workers said once
        self.incarnations: list[Incarnation] = []
        self.pending: queue.Queue[tuple[int, bool]] = queue.Queue()  # (pid, held at its exec)
        self.seen: set[tuple[int, int]] = set()  # (pid, start time) traced or let go
        self.tracing: dict[tuple[int, int], Tracing] = {}  # the incarnations being recorded now
        self.waiting: set[tuple[int, int]] = set()  # matching beyond --max-processes (said once)
        self.gate: ExecGate | None = None
        self.claims = NameClaims()  # the program names the gate holds, one watch each per box
        self.claiming = threading.Lock()  # recordings' threads claim their comm as they start
        self.unheld: set[str] = set()  # names another watch holds (said once)
        self.unready: dict[tuple[int, int], frozenset[str]] = {}  # found with no allocator: its code files then
        self.stopped_since: dict[tuple[int, int], float] = {}  # matching but stopped: since when (0: said)
        self._gate_thread: threading.Thread | None = None
        self._closing = threading.Event()
        self.observers: list[Callable] = []  # more observers of each snapshot (keep, triggers): (watch, snap, rec)
        self.hooks: list = []  # --on-end's commands not reaped yet (tracer/watch/triggers.py)
        self.code_files: Callable[[int], frozenset[str]] = code_files  # for incarnation.py (no import of this module)
        if wopts.pid is not None:
            self.pattern, comm = command_pattern(wopts.pid)
            self.comms = {comm, *wopts.comms}
        else:
            assert wopts.pattern is not None
            self.pattern = wopts.pattern
            word = first_word_comm(wopts.pattern)
            self.comms = {c for c in (word, *wopts.comms) if c}
        try:
            self.rx = re.compile(self.pattern)
        except re.error as e:
            raise UsageError(
                f"--pgrep pattern {shlex.quote(self.pattern)} is not a valid regular expression: {e}"
            ) from None

    @property
    def recorders(self) -> list:
        """The recordings under way (one per process followed now)."""
        return [t.recorder for t in list(self.tracing.values()) if t.recorder is not None]

    # --- finding incarnations -----------------------------------------------------------------

    def _key(self, pid: int) -> tuple[int, int] | None:
        try:
            return pid, procfs.starttime(pid)
        except (OSError, ValueError, IndexError):
            return None

    def _on_held(self, pid: int) -> None:
        """In the gate's thread: a watched program was stopped at its exec."""
        gate = self.gate
        assert gate is not None
        try:
            args = procfs.cmdline(pid)
            gone = procfs.state(pid) in ("Z", "X", "x")
        except (OSError, ValueError, IndexError):
            args, gone = [], True
        if DEBUG:
            self.progress(f"debug: pid {pid} held at its exec: {' '.join(args)!r}; gone {gone}")
        if gone:
            gate.release(pid)
            self.progress(f"pid {pid} ended while held at its exec, before it could be traced")
            return
        if not self.rx.search(" ".join(args)):
            gate.release(pid)  # same program name, another command line: not ours
            return
        self.pending.put((pid, True))

    def _gate_loop(self) -> None:
        gate = self.gate
        assert gate is not None
        while not self._closing.is_set():
            try:
                gate.poll(100)
                gate.release_stale()
                while True:
                    held = gate.events.get_nowait()
                    self._on_held(held.pid)
            except queue.Empty:
                continue
            except Exception as e:  # noqa: BLE001 - the gate's thread must never die silently
                self.progress(f"exec gate: {type(e).__name__}: {e}")
                time.sleep(0.2)

    def _scan(self) -> list[int]:
        """Matching processes not traced yet, oldest first. One stopped (another watch's gate
        holding it at its exec, a debugger) is looked at again once it runs; one whose code had
        no allocator yet (caught before the loader mapped its libraries), once that code changed."""
        out = []
        for pid, _ in procfs.pgrep(self.pattern):
            key = self._key(pid)
            if key is None or key in self.seen or key in self.tracing:
                continue
            try:
                if procfs.state(pid) in ("T", "t"):
                    self._stopped(pid, key)
                    continue
                if self.unready.get(key) == code_files(pid):
                    continue
            except (OSError, IndexError):
                continue
            out.append((key[1], pid))
        return [pid for _, pid in sorted(out)]

    def _stopped(self, pid: int, key: tuple[int, int]) -> None:
        """A matching process stopped: said once when it stays so (a debugger, job control), not
        for the moment another watch's gate holds it."""
        since = self.stopped_since.setdefault(key, time.monotonic())
        if since and time.monotonic() - since >= STOPPED_SAY_S:
            self.stopped_since[key] = 0.0
            self.progress(f"pid {pid} matches but has been stopped for {STOPPED_SAY_S:.0f} s: traced once it runs")

    def _due(self, next_scan: float) -> tuple[list[tuple[int, bool]], float]:
        """The incarnations to trace now, (pid, held) each: those the gate held (waited for up to
        0.1 s), and every matching process a look at /proc found (every SCAN_S); the next look's time."""
        out: list[tuple[int, bool]] = []
        try:
            out.append(self.pending.get(timeout=0.1))
            while True:
                out.append(self.pending.get_nowait())
        except queue.Empty:
            pass
        now = time.monotonic()
        if now >= next_scan:
            next_scan = now + SCAN_S
            out += [(pid, False) for pid in self._scan()]
        return out, next_scan

    # --- the watch ----------------------------------------------------------------------------

    def warm(self) -> None:
        """Build the probes once before watching (their compile is cached, tracer/bpf/cache.py): an
        incarnation held at its exec then waits for a load from the cache, not for a compile."""
        from ..bpf.early import EarlyProbes  # noqa: PLC0415 (BCC)

        t = time.perf_counter()
        EarlyProbes(os.getpid(), self.ropts, False).result().close()
        self.progress(f"probes built in {time.perf_counter() - t:.1f}s ({self.ropts.mode} mode)")

    def run(self) -> list[Incarnation]:
        try:
            return self._run()
        finally:
            self.claims.close()

    def claim(self, comm: str) -> bool:
        """Claim `comm` box-wide for the gate (tracer/watch/claims.py): False when another watch
        holds it (said once): its incarnations are then found by a look at /proc, not held."""
        with self.claiming:
            other = self.claims.claim(comm)
            if other is None:
                return True
            if comm not in self.unheld:
                self.unheld.add(comm)
                who = f"pid {other}" if other else "another process"
                self.progress(
                    f"another allocscope watch ({who}) holds {comm} at its exec (two gates would let each "
                    f"other's holds go): here its incarnations are found by a look at /proc every {SCAN_S:.0f} s, "
                    "not held (their first moments are not seen)"
                )
            return False

    def _run(self) -> list[Incarnation]:
        os.makedirs(self.options.out_dir, mode=0o700, exist_ok=True)
        self.warm()
        if self.stop.reason is not None:
            return self.incarnations
        if self.options.hold:
            from .gate import ExecGate  # noqa: PLC0415 (BCC)

            self.gate = ExecGate([c for c in sorted(self.comms) if self.claim(c)])
            if DEBUG and self.gate.compiled_why:
                self.progress(f"debug: the exec gate was compiled here: {self.gate.compiled_why}")
            self._gate_thread = threading.Thread(target=self._gate_loop, name="exec gate", daemon=True)
            self._gate_thread.start()
        try:
            what = (
                f"--pid {self.options.pid}'s command line"
                if self.options.pid is not None
                else f"--pgrep {shlex.quote(self.pattern)}"
            )
            gated = sorted(self.gate.comms) if self.gate else []
            held = f"; new incarnations of {', '.join(gated)} are held at their exec" if gated else ""
            self.progress(f"watching {what}{held}; traces in {self.options.out_dir}; Ctrl-C to stop")
            next_scan = 0.0
            while self.stop.reason is None:
                due, next_scan = self._due(next_scan)
                for pid, was_held in due:
                    self._start(pid, was_held)
                for key, t in list(self.tracing.items()):
                    if t.done.is_set():
                        del self.tracing[key]
        finally:
            self.stop.request("the watch ended")  # an error here too: every recording finishes its trace
            for t in list(self.tracing.values()):
                t.thread.join()
            self.tracing.clear()
            self._closing.set()
            if self._gate_thread is not None:
                self._gate_thread.join(timeout=2)
            if self.gate is not None:
                for pid, _ in list(self.pending.queue):
                    self.gate.release(pid)
                self.gate.close()
        return self.incarnations

    def _start(self, pid: int, held: bool) -> None:
        """Trace `pid` in a thread of its own, unless it ended or is traced already."""
        key = self._key(pid)
        if key is None or key in self.seen or key in self.tracing:
            if held and self.gate is not None:
                self.gate.release(pid)
            if key is None:
                self.progress(f"pid {pid} ended {'while held at its exec, ' if held else ''}before it could be traced")
            return
        if sum(not t.done.is_set() for t in self.tracing.values()) >= self.options.max_processes:
            if held and self.gate is not None:
                self.gate.release(pid)  # not seen: found again by a look at /proc once there is room
            if key not in self.waiting:
                self.waiting.add(key)
                self.progress(
                    f"pid {pid} matches but {self.options.max_processes} processes are recorded already "
                    "(--max-processes): traced once one of them ends"
                )
            return
        self.seen.add(key)
        t = self.tracing[key] = Tracing(self, key, held)
        t.start()


def code_files(pid: int) -> frozenset[str]:
    """The files `pid` maps executable (the program, ld.so, then its libraries as they come)."""
    return frozenset(m.path for m in procfs.read_maps(pid) if m.is_file and "x" in m.perms)


__all__ = [
    "FAILED_ENDS",
    "Incarnation",
    "Watcher",
    "WatchOptions",
    "code_files",
    "ended_badly",
    "give_back_memory",
    "is_trace",
    "oom_words",
    "rotate",
    "trace_name",
    "traces_in",
]
