"""`allocscope watch`: follow a daemon for days, across restarts, one trace per incarnation.

The watcher runs until stopped (SIGINT, SIGTERM, SIGHUP: the recording under way is finished, a
complete trace). It follows the processes whose command line matches the pattern (--pgrep, like
`pgrep -f`; --pid: that process's exact command line), one at a time:

* a process already running when the watch starts, or one found by a look at /proc (every
  `SCAN_S`), is attached as `record --pid` would (what it allocated before is not seen);
* a process that execs a program of a watched name (the comm of every incarnation seen, and the
  pattern's first word) is stopped at its exec by the gate (tracer/watch/gate.py); if its command
  line matches and no other incarnation is alive, the probes attach to it while it is stopped and
  it is let go once they are live: traced from its first allocation. Any other is let go at once.

Each incarnation is recorded into its own trace `DIR/COMM-PID-YYYYmmdd-HHMMSS.allocscope`,
complete when it ends (its end named: tracer/process/ending.py); old traces rotate
(`--max-traces`); `--keep` bounds each trace's interval history (tracer/watch/keep.py);
`--when-rss` keeps a named snapshot when RSS passes a size (tracer/watch/triggers.py).
A target that ends at any moment is a one-line note, and the watch goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from common.endwords import oom_text
from common.errors import AllocscopeError, NoAllocatorError, TargetError, UsageError
from common.tracefile import format as F
from common.units import human_bytes

from ..base.options import RecordOptions
from ..process import procfs
from ..process.ending import describe_end
from ..process.target import target_from_pid
from ..record.recorder import Recorder, Summary
from ..record.signals import StopRequest
from . import triggers
from .claims import NameClaims

if TYPE_CHECKING:
    from .gate import ExecGate

DEBUG = bool(os.environ.get("ALLOCSCOPE_WATCH_DEBUG"))  # every exec the gate holds, and what is done with it
SCAN_S = 1.0  # how often /proc is looked at for a matching process the gate did not hold
STOPPED_SAY_S = 5.0  # a matching process stopped this long is said once (traced once it runs)
FOLLOW_S = 10.0  # a held incarnation is stopped at each library the loader maps, this long after its exec
WATCH_HOLD_S = 30.0  # a watched recording's small parts are written together this often (writer.py hold_s)


@dataclass
class WatchOptions:
    out_dir: str
    pattern: str | None = None  # --pgrep
    pid: int | None = None  # --pid: that process, then what runs its command line
    keep_s: float | None = None  # --keep: seconds of interval history kept per trace (None: all)
    max_traces: int = 20  # --max-traces: traces kept in out_dir (the oldest removed first)
    when_rss: int | None = None  # --when-rss: bytes
    on_trigger: str | None = None  # --on-trigger: a shell command run when a trigger fires
    on_end: str | None = None  # --on-end: a shell command run when a trace is complete
    hold: bool = True  # stop new incarnations at their exec (--no-hold: attach as found)
    comms: list[str] = field(default_factory=list)  # --comm: program names the gate holds


@dataclass
class Incarnation:
    """One traced incarnation: what the watch says of it at its end."""

    pid: int
    path: str
    held: bool
    summary: Summary | None = None
    error: str | None = None


def trace_name(comm: str, pid: int, wall: float) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", comm) or "target"
    return f"{safe}-{pid}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(wall))}.allocscope"


def is_trace(path: str) -> bool:
    try:
        with open(os.path.join(path, F.META), "rb") as f:
            return b'"allocscope.trace"' in f.read(4096)
    except OSError:
        return False


def traces_in(out_dir: str) -> list[str]:
    """The traces under out_dir, oldest first (by their names' time, then mtime)."""
    found = []
    for n in os.listdir(out_dir):
        p = os.path.join(out_dir, n)
        if n.endswith(".allocscope") and os.path.isdir(p) and not os.path.islink(p) and is_trace(p):
            found.append((os.stat(p).st_mtime, p))
    return [p for _, p in sorted(found)]


FAILED_ENDS = ("killed", "oom_killed")  # what rotation keeps longest: the nights that went wrong


def ended_badly(path: str) -> bool:
    """The trace's incarnation was killed or OOM-killed (meta.json `end.reason`)."""
    try:
        with open(os.path.join(path, F.META)) as f:
            end = json.load(f).get("end")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(end, dict) and end.get("reason") in FAILED_ENDS


def rotate(out_dir: str, max_traces: int, progress: Callable[[str], None]) -> list[str]:
    """Remove old traces so that a new one makes at most max_traces: the oldest of those whose
    incarnation ended well (exited, exec'd, stopped, not complete) first, then the oldest of the
    killed and OOM-killed, so that a night's failure outlives the restarts after it. Only
    directories that are allocscope traces are ever removed. Returns what was removed."""
    old = traces_in(out_dir)
    excess = max(0, len(old) - (max_traces - 1))
    if not excess:
        return []
    bad = {p for p in old if ended_badly(p)}
    gone = ([p for p in old if p not in bad] + [p for p in old if p in bad])[:excess]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
        for extra in (p + ".old",):
            if os.path.isdir(extra) and is_trace(extra):
                shutil.rmtree(extra, ignore_errors=True)
    kept = len(bad - set(gone))
    progress(
        f"rotated out {len(gone)} old trace(s) (--max-traces {max_traces})"
        + (f"; {kept} of killed or OOM-killed incarnations kept longest" if kept else "")
    )
    return gone


def command_pattern(pid: int) -> tuple[str, str]:
    """--pid: (the regex matching exactly its command line, its comm)."""
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


def oom_words(oom: dict) -> str:
    """'OOM-killed by the memory cgroup /x (limit 2.0 GiB, anon-rss 1.9 GiB at the kill)', from
    `recording.end.oom`: the report's words (common/endwords.py), the kernel's figure where its
    mark gave one."""
    anon = (oom.get("victim") or {}).get("anon_rss_bytes")
    return oom_text(oom, [f"anon-rss {human_bytes(anon)} at the kill"] if anon is not None else [])


class Watcher:
    """The watch: run() returns when stopped; incarnations lists what it traced."""

    def __init__(
        self,
        wopts: WatchOptions,
        ropts: RecordOptions,
        progress: Callable[[str], None],
        stop: StopRequest,
        listener=None,
    ) -> None:
        self.w = wopts
        self.ropts = ropts
        self.progress = progress
        self.stop = stop
        self.listener = listener  # an object with target_started/target_ended/observe (metrics), or None
        self.incarnations: list[Incarnation] = []
        self.pending: queue.Queue[tuple[int, bool]] = queue.Queue()  # (pid, held at its exec)
        self.seen: set[tuple[int, int]] = set()  # (pid, start time) traced or let go
        self.current: tuple[int, int] | None = None  # the incarnation being recorded (pid, start)
        self.gate: ExecGate | None = None
        self.claims = NameClaims()  # the program names the gate holds, one watch each per box
        self.unheld: set[str] = set()  # names another watch holds (said once)
        self.unready: dict[tuple[int, int], frozenset[str]] = {}  # found with no allocator: its code files then
        self.stopped_since: dict[tuple[int, int], float] = {}  # matching but stopped: since when (0: said)
        self._gate_thread: threading.Thread | None = None
        self._closing = threading.Event()
        self.observers: list[Callable] = []  # more observers of each snapshot (keep, triggers)
        self.hooks: list = []  # --on-end's commands not reaped yet (tracer/watch/triggers.py)
        self.recorder: Recorder | None = None
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
            raise UsageError(f"--pgrep pattern {self.pattern!r} is not a valid regular expression: {e}") from None

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
            self.progress(f"debug: pid {pid} held at its exec: {' '.join(args)!r}; gone {gone}; traced: {self.current}")
        if gone:
            gate.release(pid)
            self.progress(f"pid {pid} ended while held at its exec, before it could be traced")
            return
        if not self.rx.search(" ".join(args)):
            gate.release(pid)  # same program name, another command line: not ours
            return
        cur = self.current
        if cur is not None and procfs.is_alive(*cur):  # another instance beside the one traced: not followed
            gate.release(pid)
            self.progress(f"pid {pid} started while pid {cur[0]} is traced: let go, not traced")
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
            if key is None or key in self.seen or key == self.current:
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

    def _next(self) -> tuple[int, bool] | None:
        """The next incarnation to trace (pid, held), or None once stopped."""
        next_scan = 0.0
        while self.stop.reason is None:
            try:
                pid, held = self.pending.get(timeout=0.1)
                key = self._key(pid)
                if key is None or key in self.seen:
                    if held and self.gate is not None:
                        self.gate.release(pid)
                    if key is None:
                        self.progress(f"pid {pid} ended while held at its exec, before it could be traced")
                    continue
                return pid, held
            except queue.Empty:
                pass
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + SCAN_S
                found = self._scan()
                if found:
                    if len(found) > 1:
                        self.progress(f"{len(found)} processes match; following the oldest, pid {found[0]}")
                    return found[0], False
        return None

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

    def _claim(self, comm: str) -> bool:
        """Claim `comm` box-wide for the gate (tracer/watch/claims.py): False when another watch
        holds it (said once): its incarnations are then found by a look at /proc, not held."""
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
        os.makedirs(self.w.out_dir, mode=0o700, exist_ok=True)
        self.warm()
        if self.stop.reason is not None:
            return self.incarnations
        if self.w.hold:
            from .gate import ExecGate  # noqa: PLC0415 (BCC)

            self.gate = ExecGate([c for c in sorted(self.comms) if self._claim(c)])
            if DEBUG and self.gate.compiled_why:
                self.progress(f"debug: the exec gate was compiled here: {self.gate.compiled_why}")
            self._gate_thread = threading.Thread(target=self._gate_loop, name="exec gate", daemon=True)
            self._gate_thread.start()
        try:
            what = f"--pid {self.w.pid}'s command line" if self.w.pid is not None else f"--pgrep {self.pattern!r}"
            gated = sorted(self.gate.comms) if self.gate else []
            held = f"; new incarnations of {', '.join(gated)} are held at their exec" if gated else ""
            self.progress(f"watching {what}{held}; traces in {self.w.out_dir}; Ctrl-C to stop")
            while self.stop.reason is None:
                nxt = self._next()
                if nxt is None:
                    break
                self._trace(*nxt)
        finally:
            self._closing.set()
            if self._gate_thread is not None:
                self._gate_thread.join(timeout=2)
            if self.gate is not None:
                for pid, _ in list(self.pending.queue):
                    self.gate.release(pid)
                self.gate.close()
        return self.incarnations

    def _trace(self, pid: int, held: bool) -> None:
        key = self._key(pid)
        if key is None:
            if held and self.gate is not None:
                self.gate.release(pid)
            self.progress(f"pid {pid} ended before it could be traced")
            return
        self.seen.add(key)
        try:
            target = target_from_pid(pid)
        except AllocscopeError as e:
            if held and self.gate is not None:
                self.gate.release(pid)
            self.progress(f"pid {pid}: {e}")
            return
        rec_hook = None
        if held and self.gate is not None:
            gate = self.gate
            target.on_release = lambda: gate.release(pid, "the probes are live")
            gate.follow(pid, FOLLOW_S)  # the libraries it maps next: their unwind rows first
            rec_hook = lambda: gate.release_code(pid)
        if self.gate is not None and self._claim(target.comm):
            self.gate.watch(target.comm)
        wall = time.time()
        path = os.path.join(self.w.out_dir, trace_name(target.comm, pid, wall))
        rotate(self.w.out_dir, self.w.max_traces, self.progress)
        inc = Incarnation(pid, path, held)
        self.incarnations.append(inc)
        self.current = key
        opts = replace(self.ropts, output=path, force=False)
        if self.listener is not None:
            self.listener.target_started(pid, target.comm, path)
        t0 = time.monotonic()
        rec = Recorder(target, opts, self.progress, self.stop, observer=self._observe)
        rec.hold_s = WATCH_HOLD_S if opts.interval < WATCH_HOLD_S else 0.0
        rec.watch = self  # tracer/watch/keep.py and triggers.py reach the watch's options through it
        rec.on_code_mapped = rec_hook
        rec.observer_polls = False  # its observers are queued work: no 100 ms wakes for them
        self.recorder = rec
        reason = None
        try:
            inc.summary = rec.run()
            reason = (rec.end or {}).get("reason")
            self._said_end(inc, rec)
            if self.w.on_end:
                triggers.spawn(self, "--on-end", self.w.on_end, triggers.end_env(rec), self.hooks)
        except AllocscopeError as e:
            inc.error = str(e)
            if isinstance(e, NoAllocatorError) and not held:  # perhaps caught before its loader's work
                with contextlib.suppress(OSError):
                    self.unready[key] = code_files(pid)
                    self.seen.discard(key)
            self.progress(f"pid {pid}: {e}")
            if isinstance(e, TargetError) and "ended while" in str(e):  # before its recording began
                target.alive()
                reason = describe_end("target exited", target.exit_status, None)["reason"]
        finally:
            if rec.early is not None:
                rec.early.discard()
            target.close()
            if held and self.gate is not None:
                self.gate.unfollow(pid)
            if target.on_release is not None:  # never attached: let it go
                with contextlib.suppress(Exception):
                    target.on_release()
            self.current = None
            self.recorder = None
            self.stop.finalizing = False
            if self.listener is not None and reason is not None:
                self.listener.target_ended(reason)
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
        self.progress(
            f"pid {inc.pid} {how}: wrote {inc.path} ({s.intervals} intervals, "
            f"{s.seconds:.1f}s{', traced from its exec' if inc.held else ''})"
        )

    def _observe(self, snap) -> None:
        if self.listener is not None:
            self.listener.observe(snap)
        for obs in self.observers:
            obs(self, snap)


def code_files(pid: int) -> frozenset[str]:
    """The files `pid` maps executable (the program, ld.so, then its libraries as they come)."""
    return frozenset(m.path for m in procfs.read_maps(pid) if m.is_file and "x" in m.perms)


def give_back_memory() -> None:
    """Between incarnations, what the last recording freed goes back to the system: the
    cyclic garbage, Arrow's pool, and glibc's arenas (the recording's threads each had one).
    Without it a watch grew ~4.5 MiB per incarnation (bench/watch_soak.py)."""
    import ctypes  # noqa: PLC0415
    import gc  # noqa: PLC0415

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
