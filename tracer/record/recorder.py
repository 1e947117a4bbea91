"""The recording: set the probes up, poll their events, snapshot every interval, finalize.

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

import ctypes as ct
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from common.elf import build_id
from common.errors import AllocscopeError, Interrupted, TargetError
from common.tracefile import format as F
from common.tracefile.writer import NullWriter, TraceWriter, prepare_output
from common.version import tool_version

from ..allocators.cuda import find_driver
from ..allocators.custom import CustomFn, Located, locate, parse_all
from ..allocators.discovery import Plan, allocators_in, code_files, file_id, find_allocators, plan_allocator
from ..allocators.retention import (
    AllocatorMeter,
    Owner,
    PurgeLog,
    allocator_part,
    keep_purge,
    live_by_source,
    purge_function,
)
from ..base import layout as L
from ..base.options import DEFAULTS, RecordOptions
from ..process import procfs
from ..process.mappings import MapsWatcher
from ..process.target import Target, launch_maps, release
from ..unwind.tables import start_unwinder
from .embed_symbols import SymbolEmbedder
from .peaks import PeakReading, PeakWatch
from .regions import RegionTracker, SlowPath
from .signals import StopRequest
from .trace_tables import (
    EventLog,
    HeapMeter,
    LiveTable,
    ReleaseTable,
    SiteKey,
    SiteTable,
    StackTable,
    ThreadTable,
    WaitTable,
    flow_part,
    table_part,
)
from .validate import validate

SRC = L.SOURCE_NAMES
EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK, EV_TRIM, EV_NAME, EV_EXIT, EV_EXEC, EV_CODE, EV_PEAK = (
    L.enum(n) for n in ("AS_EV_MMAP", "AS_EV_MUNMAP", "AS_EV_MREMAP", "AS_EV_BRK", "AS_EV_TRIM",
                        "AS_EV_THREAD_NAME", "AS_EV_THREAD_EXIT", "AS_EV_EXEC", "AS_EV_CODE", "AS_EV_PEAK"))
SLOW_EVENTS = (EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK)


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


@dataclass
class Snapshot:
    """What an observer (allocscope top) is handed after each interval."""
    seq: int
    final: bool
    row: dict                                # the `intervals` row
    sites: dict[SiteKey, tuple]              # cumulative (alloc_bytes, alloc_count, free_bytes, free_count, peak)
    changed: list[SiteKey]                   # the sites that changed in this interval
    stack_columns: dict[str, list] | None    # the `stacks` columns of stacks first seen now
    names: dict[int, str]                    # thread names
    allocator: str = ""                      # what is probed: "glibc /lib/.../libc.so.6", "+ CUDA driver"
    # each allocator's own mappings at this interval: (source, label, mapped, resident, live, ranges)
    allocators: tuple = ()
    # the threads blocked at least --wait-min now: (tid, stack_id, since_ns, waited_ns, state)
    blocked: tuple = ()


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


class Recorder:
    """One recording of one target. run() sets the probes up, records until the target exits,
    --duration passes or a signal comes, writes the final snapshot and returns a Summary."""

    def __init__(self, target: Target, opts: RecordOptions, progress=None, stop: StopRequest | None = None,
                 observer: Callable[[Snapshot], None] | None = None, early=None) -> None:
        self.early = early  # tracer.bpf.early.EarlyProbes: the probes being built since the CLI knew the target
        self.target = target
        self.opts = opts
        self.progress = progress or (lambda msg: None)
        self.stop = stop or StopRequest(quiet=opts.quiet)
        self.observer = observer
        self.end_reason: str | None = None  # target exited / duration / exec; signals: stop.reason
        # the kernel side and the trace, set up by run()
        self.probes = None
        self.unwinder = None
        self.attach_report = None
        self.writer = NullWriter()
        self.t0_ns = time.monotonic_ns()
        self.wall0 = time.time()
        self.seq = 0
        # what the tracer keeps between snapshots
        self.maps = MapsWatcher(target.pid, on_change=self._maps_changed, still_ours=self._still_ours)
        self.tracker = RegionTracker()            # regions taken over from the kernel side (rare shapes)
        self.slow: SlowPath | None = None
        self.slow_events: list[L.Event] = []      # queued by on_event, replayed after each poll
        self.sites = SiteTable()
        self.stacks = StackTable()
        self.threads = ThreadTable()
        self.events = EventLog()
        self.releases = ReleaseTable()
        self.waits = WaitTable(max(0, round(opts.wait_min_ms * 1e6)))
        self.heaps = HeapMeter(target.pid, opts.residency_budget_pages, glibc=False)
        self.retention: AllocatorMeter | None = None  # each allocator's own mappings, every interval
        self.purges = PurgeLog()
        self.peaks: PeakWatch | None = None       # peak snapshots (tracer/record/peaks.py), once the probes are live
        self.peak_changed: list[SiteKey] = []     # sites a peak snapshot wrote, for the observer
        self.peak_stack_columns: list[dict[str, list]] = []  # the stacks columns those peak snapshots wrote
        self.census_rows: list[tuple] = []        # glibc's arenas (tracer/allocators/census.py), not written yet
        self.census_info: dict[str, dict] = {}    # meta.json `census`: how each one went
        self.census_thread: threading.Thread | None = None
        self.embedder = SymbolEmbedder() if opts.embed_symbols else None
        self.cuda_module: str | None = None       # the libcuda.so.1 probed, once the target maps it
        self.source_names: dict[int, str] = dict(SRC)  # + the ids given out below (meta.json `sources`)
        self.plans: list[Plan] = []               # the allocators probed (the one serving malloc first)
        self.custom_fns: list[CustomFn] = parse_all(opts.alloc_fns, opts.free_fns)
        self.exec_seen = False
        self.attach_window_returns = 0
        self.last_row: dict = {}
        self.last_rss: dict[str, int] = {}
        self.final_snapshot_s = 0.0
        self.target_exit: int | None = None
        self.bpf_stats: dict = {}
        self.injection = None  # --inject: tracer.inject.injection.Injection (the agent in the target)
        self.phases: list[tuple[str, float]] = []  # start-up: (phase, seconds), in order (--verbose prints them)
        self._phase_t0 = self._phase_t = time.perf_counter()

    # --- events (called from the ring buffer poll) --------------------------------------------

    def on_event(self, ev: L.Event) -> None:
        typ, tid, ts = ev.type, ev.tid, ev.ts_ns
        released = 0
        if typ == EV_PEAK:
            if self.peaks is not None:
                self.peaks.wake()  # read in the loop, once the poll returns
            return
        if typ in SLOW_EVENTS:
            self.slow_events.append(ev)  # replayed in order once the poll returns (replay_slow)
            if typ == EV_MMAP and ev.prot & 0x4 and not ev.in_api:
                self.maps.now()  # code mapped MAP_FIXED (ld.so, dlopen): read maps now
        elif typ == EV_CODE:
            self.maps.now()  # a library's code was mapped: read maps now
        elif typ in (EV_NAME, EV_EXIT):
            self.threads.event(self.seq + 1, ts, tid, ev.comm.decode("utf-8", "replace"),
                               "rename" if typ == EV_NAME else "exit")
            return
        elif typ == EV_EXEC:
            # The program was replaced: the allocator we probe and every live block are gone.
            self.exec_seen = True
            self.threads.exec_renamed(tid, ev.comm.decode("utf-8", "replace"))
            if self.end_reason is None:
                self.end_reason = "target exec'd another program"
        elif typ == EV_TRIM:
            released = _s64(ev.len) - _s64(ev.addr2)  # anon RSS before - after: measured
            if not self._purge(ev):
                return  # another allocator's purge call: the `purges` table only
        self.events.add(ev, released)

    def _purge(self, ev: L.Event) -> bool:
        """A purge call (malloc_trim, mallctl, MallocExtension_Release*, mi_collect) to the
        `purges` table; True when it is glibc's malloc_trim (kept in `events` as before)."""
        source = self.source_names.get(ev.source, "heap") if ev.source else "heap"
        plan = next((pl for pl in self.plans if pl.allocator.source == source), None)
        kind = plan.allocator.kind if plan is not None else "glibc"
        function, name = purge_function(kind, self.target.pid, ev.addr)
        if keep_purge(function, name):
            self.purges.add(ev.ts_ns, ev.tid, source, function, name, ev.len2, _s64(ev.len), _s64(ev.addr2))
        return function == "malloc_trim"

    def replay_slow(self) -> None:
        """The rare mmap-family shapes the probes handed over, in order (tracer/record/regions.py)."""
        if not self.slow_events:
            return
        evs, self.slow_events = self.slow_events, []
        replay = {EV_MMAP: self.slow.mmap, EV_MUNMAP: self.slow.munmap, EV_MREMAP: self.slow.mremap,
                  EV_BRK: self.slow.brk}
        for ev in evs:
            replay[ev.type](ev)
        self.slow.site_ext()

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
        if self.attach_report is not None:
            self.probes.uprobes.update_addresses(maps)  # modules mapped since: their entries' addresses
            self._attach_new_allocators(maps)
        self._attach_cuda(maps)  # the CUDA driver dlopen'd since

    def _source_id(self, name: str) -> int:
        for sid, n in self.source_names.items():
            if n == name:
                return sid
        sid = max(L.enum("AS_SRC_DYNAMIC") - 1, *self.source_names) + 1
        self.source_names[sid] = name
        return sid

    def _attach_new_allocators(self, maps: list[procfs.Mapping]) -> None:
        """Allocators in modules mapped since the attach (dlopen): probed too, each with its own
        source (heap:KIND[:PREFIX])."""
        probed = {(file_id(pl.allocator.path), pl.allocator.prefix) for pl in self.plans}
        new = [a for path in code_files(maps)
               for a in allocators_in(path, False) if (file_id(a.path), a.prefix) not in probed]
        if not new or self.opts.mode == "residency":
            return
        plans = []
        for a in new:
            a.source = f"heap:{a.label}"
            plans.append(plan_allocator(a))
        sources = {pl.allocator.source: self._source_id(pl.allocator.source) for pl in plans}
        self.probes.uprobes.attach_more(plans, sources, maps)
        self.plans += plans
        if self.retention is not None:
            self.retention.owners += [Owner(pl.allocator.source, pl.allocator.kind, pl.allocator.label, False)
                                      for pl in plans]
        self.progress("allocators loaded since: " + ", ".join(f"{pl.allocator.label} in {pl.allocator.path}"
                                                            for pl in plans))

    def _attach_cuda(self, maps: list[procfs.Mapping]) -> None:
        """Probe the CUDA driver's allocation calls once the target maps libcuda.so.1."""
        if self.cuda_module is not None or self.attach_report is None:
            return
        path = find_driver(maps)
        if path is not None:
            self.cuda_module = path
            cuda = self.probes.attach_cuda(path)
            self.progress(f"CUDA driver {path}: {len(cuda.get('attached', []))} calls probed")

    # --- snapshot -------------------------------------------------------------------------

    def _peak_snapshot(self, p: PeakReading) -> None:
        """A peak snapshot (tracer/record/peaks.py) as its own interval: the sites as read at the wake,
        the stacks they name first, an `intervals` row marked peak_snapshot 1."""
        self.seq += 1
        seq, w = self.seq, self.writer
        changed = self.sites.update([p.sites], self.tracker, self.source_names)
        self.peak_changed += changed
        part = self.sites.part(seq, changed)
        if part is not None:
            w.write_part("sites", seq, part)
        new_ids = self.stacks.new_ids({k[0] for k in changed})
        if new_ids:
            if self.target.readable() and not self.exec_seen:
                self.maps.refresh()
            cols = self.stacks.columns(self.probes.maps.read_stacks(new_ids), self.maps.index)
            self.peak_stack_columns.append(cols)  # the observer (top) has not seen these stacks yet
            w.write_part("stacks", seq, pa.table(cols, schema=F.SCHEMAS["stacks"]))
            if self.embedder is not None:
                w.write_part(F.SYMBOLS, seq, self.embedder.part(seq, cols))
        heap_live, heap_peak, reg_bytes, reg_count, cuda_host, dev_live, dev_peak = p.totals[:7]
        counters = self._counters(dict(p.counters))
        mm_live = reg_bytes - self.slow.taken_bytes + self.tracker.live_bytes()
        mem = p.rss
        row = {"seq": seq, "ts_ns": p.ts_ns, "elapsed_s": (p.ts_ns - self.t0_ns) / 1e9,
               **{k: mem.get(k, -1) for k in ("rss_bytes", "rss_anon_bytes", "rss_file_bytes", "rss_shmem_bytes",
                                               "hwm_bytes")},
               "heap_live_bytes": heap_live, "heap_peak_bytes": heap_peak, "mmap_live_bytes": mm_live,
               "cuda_host_live_bytes": cuda_host, "device_live_bytes": dev_live, "device_peak_bytes": dev_peak,
               "live_bytes": heap_live + mm_live + cuda_host,
               "live_count": counters["n_allocs"] - counters["n_frees"] + reg_count - self.slow.taken_count
               + self.tracker.live_count(),
               "target_alive": 1, "arena_resident_bytes": -1, "residency_ms": p.read_ns / 1e6,
               "measured_ns": p.ts_ns, "peak_snapshot": 1}
        row.update(counters)
        w.write_part("intervals", seq, pa.table({k: [v] for k, v in row.items()}))

    def snapshot(self, final: bool = False) -> None:
        if self.peaks is not None:
            if self.peaks.woken:
                self.peaks.read()  # a wake not served yet: its reading is of now, still the high
            p = self.peaks.take()
            if p is not None:
                self._peak_snapshot(p)
        self.seq += 1
        seq = self.seq
        now = time.monotonic_ns()
        w = self.writer
        alive = self.target.alive()
        readable = self.target.readable() and not self.exec_seen  # after exec: another program's maps

        part = self.maps.part(seq, readable)
        if part is not None:
            w.write_part("maps", seq, part)
        # sites: the kernel side plus what the rare-shape tracker allocated and freed
        self.replay_slow()
        changed = self.sites.update([self.probes.maps.read_sites(), self.probes.maps.read_fault_sites()], self.tracker,
                                    self.source_names)
        part = self.sites.part(seq, changed)
        if part is not None:
            w.write_part("sites", seq, part)
        releases = self.releases.part(seq, self.probes.maps.read_releases())
        waits, blocked = self.waits.parts(seq, self.probes.maps.read_waits(), self.probes.maps.read_offcpu(), now) \
            if self.waits.wait_min_ns else (None, None)
        wait_stacks, wait_tids = self.waits.take_new()
        # stacks first seen now (sites, events, waits and releases may name them)
        stack_columns = None
        new_ids = self.stacks.new_ids({k[0] for k in changed} | self.events.stack_ids() | wait_stacks |
                                      self.releases.stack_ids())
        if new_ids:
            if readable:
                self.maps.refresh()
            stack_columns = self.stacks.columns(self.probes.maps.read_stacks(new_ids), self.maps.index)
            w.write_part("stacks", seq, pa.table(stack_columns, schema=F.SCHEMAS["stacks"]))
            if self.embedder is not None:  # symbol tables of the modules on these stacks
                w.write_part(F.SYMBOLS, seq, self.embedder.part(seq, stack_columns))
        if readable:  # names of allocating threads not seen yet
            self.threads.look_up(self.target.pid, {k[1] for k in self.sites.current} | self.events.tids() | wait_tids,
                                 seq, now)
        for name, part in (("threads", self.threads.part(seq)), ("events", self.events.part(seq)),
                           ("flows", flow_part(seq, self.probes.maps.read_flows(), self.tracker))):
            if part is not None:
                w.write_part(name, seq, part)
        if final:
            live_pid = self.target.pid if readable and self.heaps.glibc else None
            live = LiveTable(self.probes.maps, self.tracker, self.source_names)
            self.heaps.live_blocks = live.write(w, seq, live_pid)
            if self.census_thread is not None:
                self.census_thread.join()
            if live_pid is not None:
                self._census("end")
        if self.census_rows:
            rows, self.census_rows = self.census_rows, []
            w.write_part("census", seq, table_part("census", rows, seq))
        for name, part in (("releases", releases), ("waits", waits), ("blocked", blocked)):
            if part is not None:
                w.write_part(name, seq, part)
        part = self.purges.part(seq)
        if part is not None:
            w.write_part("purges", seq, part)
        row = self._interval_row(seq, now, alive, readable, final)
        w.write_part("intervals", seq, pa.table({k: [v] for k, v in row.items()}))
        if self.peaks is not None:
            self.peaks.take(row["live_bytes"])  # a slow rise re-arms the wake from this snapshot's live
        if self.peak_changed:  # the observer sees every change since its last snapshot
            changed = list(dict.fromkeys(self.peak_changed + changed))
            self.peak_changed = []
        if self.peak_stack_columns:  # stacks a peak snapshot saw first: the observer gets them now
            parts = [*self.peak_stack_columns, *([stack_columns] if stack_columns else [])]
            stack_columns = {k: [v for c in parts for v in c[k]] for k in parts[0]}
            self.peak_stack_columns = []
        if self.observer is not None:
            self.observer(Snapshot(seq, final, row, self.sites.current, changed, stack_columns,
                                   dict(self.threads.names), self._allocator_text(),
                                   tuple(self.retention.last) if self.retention is not None else (),
                                   tuple(self.waits.blocked)))

    def _census(self, when: str) -> None:
        """glibc's arenas read from outside (tracer/allocators/census.py): the rows go with the next snapshot."""
        if not self.opts.census_budget_s or self.opts.mode == "residency":
            return
        from ..allocators.census import run_census  # noqa: PLC0415

        try:
            rows, info = run_census(self.target.pid, budget_s=self.opts.census_budget_s)
        except Exception as e:  # noqa: BLE001 - the census is an extra: a bug in it never costs the recording
            self.census_info[when] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            return
        self.census_info[when] = info
        self.census_rows += [(when, *c.row()) for c in rows]

    def _allocator_text(self) -> str:
        rep = self.attach_report
        text = f"{rep.allocator_kind} {rep.allocator}" if rep is not None else ""
        return text + (" + CUDA driver" if self.cuda_module else "")

    def _counters(self, counters: dict[str, int]) -> dict[str, int]:
        """The `intervals` counters from the kernel's (read_counters)."""
        counters.update(self.probes.maps.read_tlb())
        counters["n_attach_window_returns"] = self.attach_window_returns
        counters["lost_unmatched_ret"] -= self.attach_window_returns
        if self.opts.mode == "residency":
            counters["n_faults"] = self.probes.faults.count()
        return counters

    def _interval_row(self, seq: int, now: int, alive: bool, readable: bool, final: bool) -> dict:
        counters = self._counters(self.probes.maps.read_counters())
        heap_live, heap_peak, reg_bytes, reg_count, cuda_host, dev_live, dev_peak = self.probes.maps.read_totals()
        heap_count = counters["n_allocs"] - counters["n_frees"]
        mm_live = reg_bytes - self.slow.taken_bytes + self.tracker.live_bytes()
        mm_count = reg_count - self.slow.taken_count + self.tracker.live_count()
        try:
            mem = procfs.rss(self.target.pid) if readable else {}
        except OSError:
            mem = {}
        self.last_rss = mem or self.last_rss
        arena_res, res_ms = -1, 0.0
        if readable:
            arena_res, res_ms, part = self.heaps.measure(seq, final)
            if part is not None:
                self.writer.write_part("heaps", seq, part)
            res_ms += self._measure_allocators(seq)
        measured = time.monotonic_ns()  # the residency figures are of this instant, not of `now`
        row = {"seq": seq, "ts_ns": now, "elapsed_s": (now - self.t0_ns) / 1e9,
               "rss_bytes": mem.get("rss_bytes", -1), "rss_anon_bytes": mem.get("rss_anon_bytes", -1),
               "rss_file_bytes": mem.get("rss_file_bytes", -1), "rss_shmem_bytes": mem.get("rss_shmem_bytes", -1),
               "hwm_bytes": mem.get("hwm_bytes", -1),
               "heap_live_bytes": heap_live, "heap_peak_bytes": heap_peak, "mmap_live_bytes": mm_live,
               "cuda_host_live_bytes": cuda_host, "device_live_bytes": dev_live, "device_peak_bytes": dev_peak,
               "live_bytes": heap_live + mm_live + cuda_host, "live_count": heap_count + mm_count,
               "target_alive": int(alive), "arena_resident_bytes": arena_res, "residency_ms": res_ms,
               "measured_ns": measured if readable else now, "peak_snapshot": 0}
        row.update(counters)
        self.last_row = row
        return row

    def _measure_allocators(self, seq: int) -> float:
        """Each allocator's resident, mapped and live bytes (the `allocators` part); its ms."""
        if self.retention is None:
            return 0.0
        keys, vals = self.probes.maps.read_regions()
        regions = [(s, v[0]) for s, v in zip(keys.tolist(), vals.tolist())]
        regions += [(r[0], r[0] + r[1]) for r in self.tracker.live()]
        try:
            rows, ms = self.retention.measure(self.probes.maps.read_untracked(), regions,
                                              live_by_source(self.sites.current))
        except OSError:
            return 0.0
        self.writer.write_part("allocators", seq, allocator_part(seq, rows))
        return ms

    # --- lifecycle --------------------------------------------------------------------------

    def _meta(self, complete: bool) -> dict:
        t, o, rep = self.target, self.opts, self.attach_report
        unwind = {"mode": self.probes.unwind if self.probes is not None else o.unwind, "requested": o.unwind}
        if self.probes is not None and self.probes.unwind_error:
            unwind["fallback_reason"] = self.probes.unwind_error
        if self.unwinder is not None:
            unwind.update(self.unwinder.meta())
        meta = {
            "format": F.FORMAT, "version": F.VERSION, "complete": complete,
            "tool": {"name": "allocscope", "version": tool_version()},
            "created": self.wall0,
            "clock": {"monotonic_ns": self.t0_ns, "wall_s": self.wall0},
            "interval_s": o.interval,
            "labels": o.labels,
            "target": {"pid": t.pid, "comm": t.comm, "exe": t.exe, "exe_build_id": build_id(t.exe),
                       "launched": t.child is not None,
                       **({"argv": t.argv or procfs.cmdline(t.pid)} if o.keep_cmdline else {})},
            "host": {"kernel": platform.release(), "hostname": platform.node(),
                     "page_size": os.sysconf("SC_PAGE_SIZE")},
            "probes": {"allocator": rep.allocator, "allocator_kind": rep.allocator_kind,
                       "attached": rep.attached, "aliases": rep.aliases, "skipped": rep.skipped,
                       "tracepoints": rep.tracepoints, "placement": rep.placement, "cuda": rep.cuda,
                       "allocators": rep.allocators, "custom": rep.custom,
                       "returns": rep.returns, "returns_why": rep.returns_why,
                       "uprobes": rep.uprobes, "uprobes_why": rep.uprobes_why, "heap": rep.heap,
                       **({"inject": self.injection.report(getattr(self.probes, "sys_tracepoints_kept", []))}
                          if self.injection is not None else {})},
            "sources": {str(k): v for k, v in self.source_names.items() if k >= L.enum("AS_SRC_DYNAMIC")},
            "limits": {"max_live": o.max_live, "max_stacks": o.max_stacks, "max_sites": o.max_sites,
                       "max_regions": o.max_regions},
            "mode": o.mode,
            "sampling": {"sample_bytes": o.sample_bytes,
                         "fault_sample": o.fault_sample if o.mode == "residency" else 0},
            "unwind": unwind,
            "waits": {"wait_min_ns": self.waits.wait_min_ns},
            **({"peaks": self.peaks.meta()} if self.peaks is not None else {}),
            **({"census": self.census_info} if self.census_info else {}),
        }
        if complete:
            meta.update({"end_reason": self.end_reason, "intervals": self.seq,
                         "duration_s": (time.monotonic_ns() - self.t0_ns) / 1e9,
                         "target_exit": self.target_exit, "exec_seen": self.exec_seen,
                         "final_snapshot_s": round(self.final_snapshot_s, 3)})
            if self.bpf_stats:
                meta["bpf_stats"] = self.bpf_stats  # with sysctl kernel.bpf_stats_enabled=1
        return meta

    def _check_stop(self, step: str) -> None:
        """During set-up: a signal ends it here, with nothing recorded."""
        if self.stop.reason is not None:
            kept = f"; {self.opts.output} was left as it was" if self.opts.output and \
                os.path.lexists(self.opts.output) else ""
            raise Interrupted(f"interrupted ({self.stop.reason}) while {step}: the probes were detached and "
                              f"nothing was recorded{kept}")

    def _start_writer(self) -> None:
        """The trace, once the probes are live: only now is an old trace moved to TRACE.old."""
        if self.opts.output:
            prepare_output(self.opts.output, self.opts.force)
            self.writer = TraceWriter(self.opts.output)
        self.writer.write_meta(self._meta(False))

    def _phase(self, name: str) -> None:
        """End the start-up phase running now (`name`: what it was); --verbose prints it."""
        now = time.perf_counter()
        self.phases.append((name, now - self._phase_t))
        self._phase_t = now
        if self.opts.verbose:
            ms = process_age_ms() if name == "live" else 1000 * self.phases[-1][1]
            self.progress(f"start-up: {name} {ms:.0f} ms" + (" since the process started" if name == "live" else ""))

    def run(self) -> Summary:
        self._phase_t0 = self._phase_t = time.perf_counter()
        if self.opts.verbose:
            self.progress(f"start-up: before the recorder (interpreter, CLI, target) {process_age_ms():.0f} ms")
        # pyarrow imports pandas when it builds its first table (~0.3-0.6 s of CPU): import it
        # before the probes attach, not inside the first interval of the recording — in a thread,
        # while BCC builds the probes (libbcc runs without the GIL), joined before the attach.
        pandas = threading.Thread(target=_import_pandas, name="import pandas", daemon=True)
        pandas.start()
        if self.early is None:  # built here, beside the scans below
            from ..bpf.early import EarlyProbes  # noqa: PLC0415

            self.early = EarlyProbes(self.target.pid, self.opts, self.target.child is not None)
        self._phase("start building the probes (in a thread)")
        t = self.target
        launched = t.child is not None
        maps = launch_maps(t) if launched else procfs.read_maps(t.pid)
        allocators = find_allocators(t.exe, maps)
        if not allocators or not allocators[0].serves_malloc:
            raise TargetError(f"no malloc/free found in {t.exe} or its libraries "
                              "(statically linked and stripped?); nothing to probe")
        alloc = allocators[0]
        self.heaps.glibc = alloc.kind == "glibc"
        if self.opts.mode != "residency":
            self.retention = AllocatorMeter(t.pid, self.opts.residency_budget_pages,
                                            [Owner(a.source, a.kind, a.label, a.serves_malloc) for a in allocators])
        located = [locate(fn, t.exe, maps) for fn in self.custom_fns]
        self.plans = [plan_allocator(a) for a in allocators]
        sources = {a.source: self._source_id(a.source) for a in allocators[1:]}
        custom = [(loc, self._source_id(loc.fn.source), _place_custom(loc)) for loc in located]
        brk = None
        if not launched:
            self.maps.seed(maps)
            heap = next((m for m in maps if m.path == "[heap]"), None)
            brk = heap.end if heap else None
        self._phase("maps, allocators, symbol scans")
        self._check_stop("starting")
        early, self.early = self.early, None
        t_wait = time.perf_counter()
        self.probes = early.result()
        waited = time.perf_counter() - t_wait
        for name, secs in [*self.probes.timings.items(), ("probes built (since the command knew the target)",
                                                         early.seconds), ("waited for them here", waited)]:
            self.phases.append((name, secs))
            if self.opts.verbose:
                self.progress(f"start-up: {name} {1000 * secs:.0f} ms")
        self._phase_t = time.perf_counter()
        try:
            self._check_stop("compiling the probes")
            if self.opts.inject:
                self.injection = self._inject(sources)
                self.waits.ignore_tids = {self.injection.watchdog_tid}  # its poll is not the program's wait
                maps = procfs.read_maps(t.pid)  # with the agent's mappings: there before the attach
                self.maps.seed(maps)
                self._phase(f"inject the agent (threads stopped {self.injection.stopped_ms[0]:.1f} ms)")
            self.probes.maps.open_events(self.on_event)
            self.unwinder = start_unwinder(self.probes, maps, launched, self.progress)
            self._phase("unwind tables")
            pandas.join()
            self._phase("import pandas (the rest, in a thread since the start)")
            if launched and self.unwinder is not None:
                t.child.on_exec = self.maps.now  # exe and ld.so are mapped: their unwind tables
                t.child.on_hold = lambda: (self.probes.maps.drain_events(), self.maps.now())
            self.slow = SlowPath(self.probes.maps, self.tracker, SRC)
            self.probes.seed(procfs.rss(t.pid) if not launched else {}, brk)
            self._check_stop("loading the unwind tables")
            self.attach_report = self.probes.uprobes.attach(self.plans, custom, sources, maps, agent=self.injection)
            if self.injection is not None:
                self.injection.enable()
            self._attach_cuda(maps)
            self._phase("attach")
            self.peaks = PeakWatch(self.probes.maps, lambda: procfs.rss(t.pid))
            self.peaks.arm()
            self._phase("live")
            self._check_stop("attaching the probes")
            # Returns seen while probes were being attached belong to calls that began before
            # the attach: like pre-attach allocations, they are not losses.
            self.attach_window_returns = self.probes.maps.read_counters()["lost_unmatched_ret"]
            # The clock (and --duration) starts once the probes are live, not while BCC compiles.
            self.t0_ns = time.monotonic_ns()
            self.wall0 = time.time()
            if self.unwinder is not None:
                self.unwinder.t0_ns = self.t0_ns  # `unwind.pending` times are since this
            self._start_writer()
            if self.heaps.glibc and not launched:  # the blocks from before the attach still allocated
                self.census_thread = threading.Thread(target=self._census, args=("attach",), name="census",
                                                      daemon=True)
                self.census_thread.start()  # beside the loop: the ring keeps being drained
            self.threads.seen(1, self.t0_ns, procfs.thread_names(t.pid) if not launched else {})
            release(t)
            self.progress(f"recording pid {t.pid} ({t.comm}); allocator {alloc.kind} {alloc.path}; Ctrl-C to stop")
            self._loop()
            self.stop.finalizing = True
            self.end_reason = self.end_reason or self.stop.reason
            if self.injection is not None:
                self.injection.enable(False)  # no new samples: the last snapshot sees all there are
            self.probes.maps.drain_events()
            t_final = time.perf_counter()
            self.snapshot(final=True)
            self.final_snapshot_s = time.perf_counter() - t_final
            self._uninject()
            if launched:
                t.child.resume()
                self.target_exit = t.child.wait(timeout=0.2)
            self.bpf_stats = self.probes.program_stats()
            if self.unwinder is not None:
                self.unwinder.finish()  # the last truncation counts; builds still running stopped
            self.writer.write_meta(self._meta(True))
        finally:
            if self.unwinder is not None:
                self.unwinder.close()
            self._uninject()
            self.probes.close()
            self.writer.close()
            release(t)
        row = self.last_row
        lost = sum(v for k, v in row.items() if k.startswith("lost_"))
        return Summary(self.opts.output, (time.monotonic_ns() - self.t0_ns) / 1e9, self.seq, self.end_reason or "",
                       row["live_bytes"], row["live_count"], len(self.sites.current), lost, self.writer.bytes_written)

    def _inject(self, sources: dict[str, int]):
        """--inject: the agent into the target, its hooks on every allocator entry that takes one
        safely, sampling still off (on once the markers' probes are attached)."""
        from ..bpf.attach import heap_cookie  # noqa: PLC0415
        from ..inject.hooks import hook_specs  # noqa: PLC0415
        from ..inject.injection import inject  # noqa: PLC0415

        cookies = {(pl.allocator.path, pr.symbol): heap_cookie(pr.program, sources.get(pl.allocator.source))
                   for pl in self.plans for pr in pl.probes}
        specs, skipped = hook_specs(self.plans, cookies)
        quiet = self.probes.bpf[b"quiet_tid"]

        def hush(tid: int) -> None:  # the thread running our system calls: not the program's mmaps
            quiet[ct.c_int(0)] = ct.c_uint32(tid)

        inj = inject(self.target.pid, specs, skipped, self.opts.sample_bytes, hush)
        hooked = {h.spec.symbol for h in inj.hooks}
        if not any(s in hooked for s in ("malloc", "free")) and self.plans and self.plans[0].allocator.prefix == "":
            inj.detach()
            raise TargetError("--inject: malloc and free cannot be hooked safely here: "
                              + "; ".join(f"{k}: {v}" for k, v in inj.refused.items() if k in ("malloc", "free")))
        if inj.refused:
            self.progress("--inject: not hooked: " + "; ".join(f"{k} ({v})" for k, v in list(inj.refused.items())[:6]))
        return inj

    def _uninject(self) -> None:
        """The hooks out of the target (idempotent); a failure is said, never raised from here."""
        if self.injection is None or self.injection.detached:
            return
        try:
            how = self.injection.detach()
        except Exception as e:  # noqa: BLE001 - the recording is kept; the watchdog still unhooks
            self.progress(f"--inject: could not take the hooks back ({e}); the agent's watchdog will "
                          "when allocscope exits")
            return
        if how == "watchdog":
            self.progress("--inject: the agent's watchdog had already put the entries back")

    def _loop(self) -> None:
        """Poll events, snapshot every interval, until a reason to stop."""
        t = self.target
        interval_ns = int(self.opts.interval * 1e9)
        deadline = self.t0_ns + int(self.opts.duration * 1e9) if self.opts.duration else None
        first = self.opts.first_snapshot_s
        next_snap = self.t0_ns + (interval_ns if first is None else int(min(first, self.opts.interval) * 1e9))
        while self.end_reason is None and self.stop.reason is None:
            now = time.monotonic_ns()
            wait_ms = int(max(0, min(next_snap - now, 100_000_000) // 1_000_000))
            peak_ms = self.peaks.wait_ms(now) if self.peaks is not None else None
            self.probes.maps.poll_events(wait_ms if peak_ms is None else min(wait_ms, peak_ms))
            self.replay_slow()
            if self.unwinder is not None:
                self.unwinder.tick()  # the modules stacks were cut short at: built, loaded
            now = time.monotonic_ns()
            if self.peaks is not None and self.peaks.due(now):
                self.peaks.read()  # the live total passed its high-water mark: the sites now
                now = time.monotonic_ns()
            if not t.alive():
                self.end_reason = "target exited"
            elif deadline is not None and now >= deadline:
                self.end_reason = "duration"
            elif now >= next_snap:
                self.snapshot()
                next_snap += interval_ns
                if next_snap < now:  # the snapshot took longer than an interval
                    next_snap = now + interval_ns


def _import_pandas() -> None:
    import pandas  # noqa: F401, PLC0415


def process_age_ms() -> float:
    """How long this process has run (its start time in /proc: 10 ms resolution)."""
    try:
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        up = float(Path("/proc/uptime").read_text().split()[0])
        return 1000 * (up - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def record(target: Target, opts: RecordOptions, progress=None, stop: StopRequest | None = None,
           observer: Callable[[Snapshot], None] | None = None, early=None) -> Summary:
    """Record `target` (tracer.process.target) until it exits, opts.duration passes or a signal comes.
    `stop`: the caller's installed StopRequest (the CLI's); without one, one is installed for
    the recording and the previous handlers are restored after. `early`: the probes the caller
    started building (tracer.bpf.early.EarlyProbes), else they are built here."""
    own = stop is None
    if own:
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
        if target.child is not None and target.child.poll() is None and target.release_fd >= 0:
            target.child.kill()  # never leave a launched child blocked before exec
        raise
    finally:
        if target.release_fd >= 0:
            os.close(target.release_fd)
            target.release_fd = -1
        if own:
            stop.restore()


__all__ = ["DEFAULTS", "AllocscopeError", "RecordOptions", "Recorder", "Snapshot", "StopRequest", "Summary",
           "record", "validate"]


def _place_custom(loc: Located) -> int:
    """The probe offset of a user's function (placed like the allocator's)."""
    from ..allocators.placement import ARG_REGS, place_probe  # noqa: PLC0415 (capstone)

    return place_probe(loc.path, loc.offset, loc.size, tuple(ARG_REGS[a] for a in loc.fn.reads())).offset
