"""The recording: set the probes up, poll their events, snapshot every interval, finalize. The
Recorder holds a recording's state and runs the set-up; its parts are modules of their own:
setup.py (what the set-up finds before the attach, the start-up phases), loop.py (the poll
loop), snapshot.py and peak_snapshot.py (each interval), finish.py (the end: how the target
ended, meta.json complete, the Summary), oomwatch.py (the OOM killer's marks).

Everything the reports need to symbolize later is written as the recording goes: for every
stack, each frame's module path, build ID and file offset, resolved against /proc/PID/maps as it
was when the stack was first seen; the maps themselves whenever they change. The tables are
made by the small writers of tracer/record/trace_tables.py; the target is found or launched by
tracer/process/target.py; the options and their defaults are tracer/base/options.py.

Signals: from the moment a recording starts setting up, SIGINT, SIGTERM and SIGHUP are
honoured. One that arrives while the probes are being compiled and attached stops the setup,
detaches what was attached and raises Interrupted (nothing recorded, a trace already at the
output path left where it was); one that arrives later ends the recording with a complete trace.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.errors import AllocscopeError, Interrupted, TargetError
from common.tracefile.writer import SYNC_S, NullWriter, TraceWriter, prepare_output

from ..allocators.custom import CustomFn, parse_all
from ..allocators.discovery import Plan
from ..allocators.retention import (
    AllocatorMeter,
)
from ..base import layout as L
from ..base.options import DEFAULTS, RecordOptions
from ..process import procfs
from ..process.ending import CgroupWatch
from ..process.mappings import MapsWatcher, heap_end
from ..process.target import Target, release
from ..runtimes.python import PythonFrames, start_python
from ..unwind.unwinder import Unwinder, start_unwinder
from .children import ChildWatch
from .events import RingEvents
from .finish import Summary, ended_text, finish, summary
from .injecting import inject_agent, uninject
from .late_attach import attach_cuda, attach_new_allocators
from .loop import poll_loop
from .meta import trace_meta
from .oomwatch import OomWatch
from .peaks import PeakWatch
from .regions import RegionTracker, SlowPath
from .setup import Phases, process_age_ms, scan
from .signals import StopRequest
from .snapshot import Snapshot, Snapshots
from .validate import validate

if TYPE_CHECKING:
    from ..bpf.attach import AttachReport
    from ..bpf.probes import Probes
    from ..inject.injection import Injection

SRC = L.SOURCE_NAMES
HOLD_S = SYNC_S  # --inject, intervals of 1 s or more: small parts written together this often (_start_writer)


class Recorder:
    """One recording of one target. run() sets the probes up, records until the target exits,
    --duration passes or a signal comes, writes the final snapshot and returns a Summary."""

    def __init__(
        self,
        target: Target,
        opts: RecordOptions,
        progress=None,
        stop: StopRequest | None = None,
        observer: Callable[[Snapshot], None] | None = None,
        early=None,
    ) -> None:
        self.early = early  # tracer.bpf.early.EarlyProbes: the probes being built since the CLI knew the target
        self.target = target
        self.opts = opts
        self.progress = progress or (lambda msg: None)
        self.stop = stop or StopRequest(quiet=opts.quiet)
        self.observer = observer
        self.end_reason: str | None = None  # target exited / duration / exec; signals: stop.reason
        # the kernel side and the trace, set up by run()
        self.probes: Probes | None = None
        self.unwinder: Unwinder | None = None
        self.python: PythonFrames | None = None  # CPython's frames (tracer/runtimes/python.py)
        self.attach_report: AttachReport | None = None
        self.children: ChildWatch | None = None  # the target's forked children (meta.json `children`)
        self.writer: NullWriter | TraceWriter = NullWriter()
        self.t0_ns = time.monotonic_ns()
        self.wall0 = time.time()
        self.seq = 0
        # what the tracer keeps between snapshots
        self.maps = MapsWatcher(target.pid, on_change=self._maps_changed, still_ours=self._still_ours)
        self.tracker = RegionTracker()  # regions taken over from the kernel side (rare shapes)
        self.slow: SlowPath | None = None
        self.ring = RingEvents(self)  # the ring's events, as they come
        self.retention: AllocatorMeter | None = None  # each allocator's own mappings, every interval
        self.snapshots = Snapshots(self, target, opts)  # the trace tables' writers, every interval
        self.peaks: PeakWatch | None = None  # peak snapshots (tracer/record/peaks.py), once the probes are live
        self.cuda_module: str | None = None  # the libcuda.so.1 probed, once the target maps it
        self.source_names: dict[int, str] = dict(SRC)  # + the ids given out below (meta.json `sources`)
        self.plans: list[Plan] = []  # the allocators probed (the one serving malloc first)
        self.custom_fns: list[CustomFn] = parse_all(opts.alloc_fns, opts.free_fns)
        self.exec_seen = False
        self.group_exit = False  # the probes saw the target's last thread exit (RingEvents)
        self.attach_window_returns = 0
        self.final_snapshot_s = 0.0
        self.target_exit: int | None = None
        self.bpf_stats: dict = {}
        self.injection: Injection | None = None  # --inject: the agent in the target
        self.hold_s: float | None = None  # the writer's hold (None: HOLD_S under --inject, else none)
        self.observer_polls = True  # the observer needs the loop's 100 ms wakes (`top`: its keys); watch: no
        self.watch: Any = None  # the Watcher recording this incarnation (tracer/watch/), if any
        # watch: called once a code mapping's maps and unwind rows are in (the gate holds the loader)
        self.on_code_mapped: Callable[[], None] | None = None
        self.kept: dict | None = None  # watch --keep: what was dropped (meta.json `kept`, tracer/watch/keep.py)
        self.triggers: list[dict] = []  # watch --when-rss: the named snapshots (meta.json `triggers`)
        self.started = False  # the trace is being written: the target's end ends the recording
        self.cgroups: CgroupWatch | None = None  # the target's memory cgroups at the start (OOM kills)
        # the kernel's oom:mark_victim (tracer/bpf/oom.py), loaded in a thread from the start
        self.ooms = OomWatch()
        self.end: dict | None = None  # meta.json `end` (tracer/process/ending.py), at the end
        self.phases = Phases(opts.verbose, self.progress)  # start-up: its phases' times

    # --- maps ---------------------------------------------------------------------------------

    def _still_ours(self) -> bool:
        """False once the probes saw the target exec or exit: /proc/PID is another program."""
        if self.probes is not None and self.probes.maps.target_gone():
            self.exec_seen = self.exec_seen or self.target.alive()
            return False
        return True

    def _maps_changed(self, maps: list[procfs.Mapping]) -> None:
        if self.unwinder is not None:
            self.unwinder.update(maps)  # dlopen'd code gets its unwind tables
        if self.python is not None:
            self.python.update(maps)  # libpython mapped since
        if self.attach_report is not None and self.probes is not None:
            self.probes.uprobes.update_addresses(maps)  # modules mapped since: their entries' addresses
            attach_new_allocators(self, maps)
        attach_cuda(self, maps)  # the CUDA driver dlopen'd since

    # --- lifecycle --------------------------------------------------------------------------

    def _check_stop(self, step: str) -> None:
        """During set-up: a signal ends it here, with nothing recorded."""
        if self.stop.reason is not None:
            kept = (
                f"; {self.opts.output} was left as it was"
                if self.opts.output and os.path.lexists(self.opts.output)
                else ""
            )
            raise Interrupted(
                f"interrupted ({self.stop.reason}) while {step}: the probes were detached and "
                f"nothing was recorded{kept}"
            )

    def _start_writer(self) -> None:
        """The trace, once the probes are live: only now is an old trace moved to TRACE.old."""
        if self.opts.output:
            prepare_output(self.opts.output, self.opts.force)
            # --inject is for daemons that must keep their throughput, and the tracer shares their
            # CPUs: its small parts are held and written every HOLD_S (with the fsync batch), not
            # one Parquet file per table per interval (issue 33; what a SIGKILL loses: writer.py)
            hold = HOLD_S if self.opts.inject and self.opts.interval >= 1.0 else 0.0
            if self.hold_s is not None:  # the watch's: a day of recording in few files (tracer/watch/)
                hold = self.hold_s
            self.writer = TraceWriter(self.opts.output, hold_s=hold)
        self.writer.write_meta(trace_meta(self, False))

    def run(self) -> Summary:
        """Record; a target that ends before the recording started (while the probes were being
        built or attached: a daemon racing to its OOM kill) is one TargetError, never a traceback."""
        try:
            return self._run()
        except AllocscopeError:
            raise
        except Exception as e:
            if self.started or self.target.alive():
                raise
            t = self.target
            raise TargetError(
                f"process {t.pid} ({t.comm}) ended while allocscope was attaching "
                f"({ended_text(self)}); nothing was recorded ({type(e).__name__} in the attach)"
            ) from None
        finally:
            self.ooms.close()

    def _run(self) -> Summary:
        self.phases.start()
        if self.opts.verbose:
            self.progress(f"start-up: before the recorder (interpreter, CLI, target) {process_age_ms():.0f} ms")
        # pyarrow imports pandas when it builds its first table (~0.3-0.6 s of CPU): import it
        # before the probes attach, not inside the first interval of the recording — in a thread,
        # while BCC builds the probes (libbcc runs without the GIL), joined before the attach.
        pandas = threading.Thread(target=_import_pandas, name="import pandas", daemon=True)
        pandas.start()
        self.ooms.start()
        if self.early is None:  # built here, beside the scans below
            from ..bpf.early import EarlyProbes  # noqa: PLC0415

            self.early = EarlyProbes(self.target.pid, self.opts, self.target.child is not None)
        self.phases.end("start building the probes (in a thread)")
        t = self.target
        launched = t.child is not None
        found = scan(self)  # beside the build: the maps, the allocators, the user's functions
        maps, held = found.maps, found.held
        self.phases.end("maps, allocators, symbol scans")
        self._check_stop("starting")
        early, self.early = self.early, None
        t_wait = time.perf_counter()
        probes: Probes = early.result()
        self.probes = probes
        waited = time.perf_counter() - t_wait
        for name, secs in [
            *probes.timings.items(),
            ("probes built (since the command knew the target)", early.seconds),
            ("waited for them here", waited),
        ]:
            self.phases.add(name, secs)
        self.phases.start()
        try:
            self._check_stop("compiling the probes")
            if self.opts.inject:
                inj = self.injection = inject_agent(self, found.sources)
                self.snapshots.waits.ignore_tids = {inj.watchdog_tid}  # its poll is not the program's wait
                maps = procfs.read_maps(t.pid)  # with the agent's mappings: there before the attach
                self.maps.seed(maps)
                self.phases.end(f"inject the agent (threads stopped {inj.stopped_ms[0]:.1f} ms)")
            probes.maps.open_events(self.ring.on_event)
            self.unwinder = start_unwinder(probes, maps, launched or held, self.progress)
            if held and self.unwinder is not None:  # the program and ld.so are mapped already
                self.unwinder.update(found.real_maps)
            self.phases.end("unwind tables")
            if self.opts.python_frames:
                self.python = start_python(t.pid, probes, self.progress, [] if launched else procfs.read_maps(t.pid))
            pandas.join()
            self.phases.end("import pandas (the rest, in a thread since the start)")
            if t.child is not None and self.unwinder is not None:  # launched
                t.child.on_exec = self.maps.now  # exe and ld.so are mapped: their unwind tables

                def hold() -> None:
                    probes.maps.drain_events()
                    self.maps.now()

                t.child.on_hold = hold
            self.slow = SlowPath(probes.maps, self.tracker, SRC)
            probes.seed(procfs.rss(t.pid) if not launched else {}, found.brk)
            self._check_stop("loading the unwind tables")
            self.attach_report = probes.uprobes.attach(
                self.plans, found.custom, found.sources, maps, agent=self.injection
            )
            if self.injection is not None:
                self.injection.enable()
            attach_cuda(self, maps)
            # the mmap family counts from here: calls in flight now are memory from before the attach
            probes.maps.go_live(None if launched else heap_end(t.pid))
            self.children = ChildWatch(t.pid, probes.maps.take_forks)
            self.children.poll()
            self.phases.end("attach")
            self.peaks = PeakWatch(probes.maps, lambda: procfs.rss(t.pid))
            self.snapshots.site_reader.start(probes.maps, self.peaks)
            self.peaks.arm()
            self.phases.end("live")
            self.ooms.live.set()
            self._check_stop("attaching the probes")
            # Returns seen while probes were being attached belong to calls that began before
            # the attach: like pre-attach allocations, they are not losses.
            self.attach_window_returns = probes.maps.read_counters()["lost_unmatched_ret"]
            # The clock (and --duration) starts once the probes are live, not while BCC compiles.
            self.t0_ns = time.monotonic_ns()
            self.wall0 = time.time()
            if self.unwinder is not None:
                self.unwinder.t0_ns = self.t0_ns  # `unwind.pending` times are since this
            if not launched and not t.alive():  # it ended while the probes were attached: no trace
                raise TargetError(
                    f"process {t.pid} ({t.comm}) ended while allocscope was attaching ({ended_text(self)}); "
                    "nothing was recorded"
                )
            # the names before the trace is announced (meta.json): a test or a user acting on it at
            # once (exec renames the thread) must not find the new name taken for the old one's
            self.snapshots.threads.seen(1, self.t0_ns, procfs.thread_names(t.pid) if not launched else {})
            # stopped at the attach: read before the trace is announced (one who sees meta.json may
            # continue it at once), said after the "recording" line
            stopped = not launched and not held and _stopped(t.pid, self.opts.inject)
            self._start_writer()
            self.started = True
            snaps = self.snapshots
            if snaps.heaps.glibc and not launched and not held:  # the blocks from before the attach still allocated
                snaps.census_thread = threading.Thread(
                    target=snaps.census, args=("attach",), name="census", daemon=True
                )
                snaps.census_thread.start()  # beside the loop: the ring keeps being drained
            release(t)
            self.progress(
                f"recording pid {t.pid} ({t.comm}); allocator {found.alloc.kind} {found.alloc.shown}; Ctrl-C to stop"
            )
            if stopped:
                self.progress(
                    f"pid {t.pid} is stopped (SIGSTOP, job control or a debugger): "
                    "it allocates nothing until it is continued"
                )
            poll_loop(self, probes)
            finish(self, probes)
        finally:
            if self.unwinder is not None:
                self.unwinder.close()
            if self.python is not None:
                self.python.close()
            uninject(self)
            self.snapshots.site_reader.close()
            probes.close()
            self.writer.close()
            release(t, start=self.started)  # a launched program runs only if its recording did
        return summary(self)


def _import_pandas() -> None:
    import pandas  # noqa: F401, PLC0415


def _stopped(pid: int, inject: bool) -> bool:
    """The target is stopped now (state T; t, a debugger's stop, unless --inject's own ptrace
    could be it): a recording of it would look like one of an idle program."""
    try:
        return procfs.state(pid) in (("T",) if inject else ("T", "t"))
    except (OSError, IndexError):
        return False


def record(
    target: Target,
    opts: RecordOptions,
    progress=None,
    stop: StopRequest | None = None,
    observer: Callable[[Snapshot], None] | None = None,
    early=None,
) -> Summary:
    """Record `target` (tracer.process.target) until it exits, opts.duration passes or a signal comes.
    `stop`: the caller's installed StopRequest (the CLI's); without one, one is installed for
    the recording and the previous handlers are restored after. `early`: the probes the caller
    started building (tracer.bpf.early.EarlyProbes), else they are built here."""
    own = stop is None
    if stop is None:
        stop = StopRequest(quiet=opts.quiet).install()
    rec = None
    try:
        validate(opts)
        rec = Recorder(target, opts, progress, stop, observer, early=early)
        return rec.run()
    except BaseException:
        left = rec.early if rec is not None else early
        if left is not None:
            left.discard()  # the recording never took the probes: free them
        if target.child is not None and target.child.poll() is None:
            # a launched command, blocked before exec or released already (it is, while the probes
            # are compiled): killed and reaped now, not left for PTRACE_O_EXITKILL after we are gone
            target.child.kill()
        raise
    finally:
        target.close()  # its pidfd
        if target.release_fd >= 0:
            os.close(target.release_fd)
            target.release_fd = -1
        if own:
            stop.restore()


__all__ = [
    "DEFAULTS",
    "AllocscopeError",
    "RecordOptions",
    "Recorder",
    "Snapshot",
    "StopRequest",
    "Summary",
    "record",
    "validate",
]
