"""Each interval's snapshot of a recording: the trace tables' new parts (sites, stacks, threads,
events, flows, releases, waits, census, purges, the `intervals` row; the live blocks at the end),
and what an observer (allocscope top) is handed. The table writers are
tracer/record/trace_tables.py, the peak snapshots peak_snapshot.py, the row's memory columns and
counters interval_row.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from common.tracefile import format as F

from ..allocators.retention import PurgeLog, allocator_part
from ..base.options import RecordOptions
from ..process import procfs
from ..process.target import Target
from ..runtimes.python import write_parts as write_python_parts
from .embed_symbols import SymbolEmbedder
from .interval_row import interval_counters, memory_columns
from .peak_snapshot import PeakSnapshots
from .readgate import MeasureGate, TargetState, target_state
from .sitechanges import SiteReader
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
    table_part,
)


@dataclass
class Snapshot:
    """What an observer (allocscope top) is handed after each interval."""

    seq: int
    final: bool
    row: dict  # the `intervals` row
    sites: dict[SiteKey, tuple]  # cumulative (alloc_bytes, alloc_count, free_bytes, free_count, peak)
    changed: list[SiteKey]  # the sites that changed in this interval
    stack_columns: dict[str, list] | None  # the `stacks` columns of stacks first seen now
    names: dict[int, str]  # thread names
    allocator: str = ""  # what is probed: "glibc /lib/.../libc.so.6", "+ CUDA driver"
    # each allocator's own mappings at this interval: (source, label, mapped, resident, live, ranges)
    allocators: tuple = ()
    # the threads blocked at least --wait-min now: (tid, stack_id, since_ns, waited_ns, state)
    blocked: tuple = ()
    # CPython's frames of the stacks first seen now: (pyframes columns, pycode columns) pairs
    python: tuple = ()


class Snapshots:
    """The snapshot writer of one recording (Recorder.snapshots), with the state its tables keep
    between snapshots."""

    def __init__(self, rec, target: Target, opts: RecordOptions) -> None:
        self.rec = rec  # the Recorder: the probes, the maps, the writer, the target's state
        self.sites = SiteTable()
        self.site_reader = SiteReader(opts.site_changes, opts.mode != "residency")  # issue 33: reads what changed
        self.stacks = StackTable()
        self.threads = ThreadTable()
        self.events = EventLog()
        self.releases = ReleaseTable()
        self.waits = WaitTable(max(0, round(opts.wait_min_ms * 1e6)))
        self.heaps = HeapMeter(target.pid, opts.residency_budget_pages, glibc=False)
        self.purges = PurgeLog()
        self.peak_snapshots = PeakSnapshots(self)  # written when the kernel side wakes the tracer at a new high
        self.py_parts: list[tuple[dict, dict]] = []  # CPython frames written since the observer's last snapshot
        self.census_rows: list[tuple] = []  # glibc's arenas (tracer/allocators/census.py), not written yet
        self.census_info: dict[str, dict] = {}  # meta.json `census`: how each one went
        self.census_thread: threading.Thread | None = None
        # --embed-symbols: every module's symbols; else those of modules deleted or replaced on disk
        self.embedder = SymbolEmbedder(pid=target.pid, gone_only=not opts.embed_symbols)
        self.last_row: dict = {}
        self.last_rss: dict[str, int] = {}
        self.last_alive: tuple[int, int] | None = None  # (seq, ts_ns) of the last RSS read while alive
        self.gate = MeasureGate()  # whether the last resident-page figures still hold (readgate.py)
        self.arena_res = -1  # the heap meter's last figure

    def write_stacks(self, seq: int, new_ids, cols: dict[str, list]) -> None:
        """The `stacks` part of the stacks first seen now, their CPython frames
        (tracer/runtimes/python.py) and the symbol tables of the modules on them (--embed-symbols)."""
        rec = self.rec
        rec.writer.write_part("stacks", seq, pa.table(cols, schema=F.SCHEMAS["stacks"]))
        if rec.python is not None:
            self.py_parts.append(write_python_parts(rec.python, rec.writer, seq, new_ids))
        if self.embedder is not None:
            part = self.embedder.part(seq, cols)
            if part.num_rows or not self.embedder.gone_only:  # no empty part a snapshot by default
                rec.writer.write_part(F.SYMBOLS, seq, part)

    def snapshot(self, final: bool = False) -> None:
        rec = self.rec
        self.peak_snapshots.take()  # a peak reading not written yet: its own interval first
        rec.seq += 1
        seq = rec.seq
        now = time.monotonic_ns()
        w = rec.writer
        alive = rec.target.alive()
        readable = rec.target.readable() and not rec.exec_seen  # after exec: another program's maps
        state = self._look(readable, final)  # before any read of the maps: what can have changed

        part = rec.maps.part(seq, readable, state.maps_key)
        if part is not None:
            w.write_part("maps", seq, part)
        # sites: the kernel side plus what the rare-shape tracker allocated and freed
        rec.ring.replay_slow()
        changed = self.site_reader.update(self.sites, rec.tracker, rec.source_names, final)
        totals = self._read_totals()  # next to the sites: what follows (the final live table, the census) takes time
        part = self.sites.part(seq, changed)
        if part is not None:
            w.write_part("sites", seq, part)
        releases = self.releases.part(seq, self.site_reader.releases(final))
        waits, blocked = (
            self.waits.parts(seq, self.site_reader.waits(final), rec.probes.maps.read_offcpu(), now)
            if self.waits.wait_min_ns
            else (None, None)
        )
        wait_stacks, wait_tids = self.waits.take_new()
        # stacks first seen now (sites, events, waits and releases may name them)
        stack_columns = None
        new_ids = self.stacks.new_ids(
            {k[0] for k in changed} | self.events.stack_ids() | wait_stacks | self.releases.stack_ids()
        )
        if new_ids:
            if readable:
                rec.maps.refresh(seq, state.maps_key)
            stack_columns = self.stacks.columns(rec.probes.maps.read_stacks(new_ids), rec.maps.index)
            self.write_stacks(seq, new_ids, stack_columns)
        if readable:  # names of allocating threads not seen yet
            self.threads.look_up(
                rec.target.pid,
                self.site_reader.tids(self.sites.current, self.threads.names) | self.events.tids() | wait_tids,
                seq,
                now,
            )
        for name, part in (
            ("threads", self.threads.part(seq)),
            ("events", self.events.part(seq)),
            ("flows", self.site_reader.flows(seq, rec.tracker, final)),
        ):
            if part is not None:
                w.write_part(name, seq, part)
        if final:
            live_pid = rec.target.pid if readable and self.heaps.glibc else None
            live = LiveTable(rec.probes.maps, rec.tracker, rec.source_names)
            self.heaps.live_blocks = live.write(w, seq, live_pid, lambda: rec.maps.read(seq))
            if self.census_thread is not None:
                self.census_thread.join()
            if live_pid is not None:
                self.census("end", seq)
        if self.census_rows:
            rows, self.census_rows = self.census_rows, []
            w.write_part("census", seq, table_part("census", rows, seq))
        for name, part in (("releases", releases), ("waits", waits), ("blocked", blocked)):
            if part is not None:
                w.write_part(name, seq, part)
        part = self.purges.part(seq)
        if part is not None:
            w.write_part("purges", seq, part)
        row = self._interval_row(seq, now, alive, readable, final, state, totals)
        w.write_part("intervals", seq, pa.table({k: [v] for k, v in row.items()}))
        if rec.peaks is not None:
            rec.peaks.take(row["live_bytes"])  # a slow rise re-arms the wake from this snapshot's live
        # the observer sees every change since its last snapshot, the peak snapshots' too
        changed, stack_columns = self.peak_snapshots.for_observer(changed, stack_columns)
        if rec.observer is not None:
            rec.observer(
                Snapshot(
                    seq,
                    final,
                    row,
                    self.sites.current,
                    changed,
                    stack_columns,
                    dict(self.threads.names),
                    self._allocator_text(),
                    tuple(rec.retention.last) if rec.retention is not None else (),
                    tuple(self.waits.blocked),
                    tuple(self.py_parts),
                )
            )
        self.py_parts = []

    def census(self, when: str, seq: int = 0) -> None:
        """glibc's arenas read from outside (tracer/allocators/census.py): the rows go with the next
        snapshot; `seq`: the snapshot whose maps it shares (0: read its own)."""
        rec = self.rec
        if not rec.opts.census_budget_s or rec.opts.mode == "residency":
            return
        from ..allocators.census import run_census  # noqa: PLC0415

        try:
            maps = rec.maps.read(seq) if seq else None
            rows, info = run_census(rec.target.pid, maps, budget_s=rec.opts.census_budget_s)
        except Exception as e:  # noqa: BLE001 - the census is an extra: a bug in it never costs the recording
            self.census_info[when] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            return
        self.census_info[when] = info
        self.census_rows += [(when, *c.row()) for c in rows]

    def _allocator_text(self) -> str:
        rec = self.rec
        rep = rec.attach_report
        text = f"{rep.allocator_kind} {rep.allocator}" if rep is not None else ""
        return text + (" + CUDA driver" if rec.cuda_module else "")

    def _look(self, readable: bool, final: bool) -> TargetState:
        """The target's RSS figures for the row and its change keys (tracer/record/readgate.py):
        the agent's count of mmap-family calls first, then /proc/PID/status; no key at the end
        (the last snapshot reads and measures everything)."""
        rec = self.rec
        if not readable:
            return TargetState({})
        marks = rec.injection.sys_marks() if rec.injection is not None and not final else None
        return target_state(rec.target.pid, marks)

    def _read_totals(self) -> tuple:
        """The kernel's counters and totals for the interval row, read right after the sites: on
        a busy target, read after the final snapshot's live table and census instead, they were
        hundreds of ms younger than the sites, and the report's "live now" and its locations
        disagreed (a postgres backend: live now 0 B, a location 26.8 KiB live at the end)."""
        rec = self.rec
        counters = interval_counters(rec, rec.probes.maps.read_counters())
        return counters, rec.probes.maps.read_totals()

    def _interval_row(
        self, seq: int, now: int, alive: bool, readable: bool, final: bool, state: TargetState, totals: tuple
    ) -> dict:
        rec = self.rec
        counters, (heap_live, heap_peak, reg_bytes, reg_count, cuda_host, dev_live, dev_peak) = totals
        heap_count = counters["n_allocs"] - counters["n_frees"]
        mm_live = reg_bytes - rec.slow.taken_bytes + rec.tracker.live_bytes()
        mm_count = reg_count - rec.slow.taken_count + rec.tracker.live_count()
        mem = state.rss
        if mem:
            self.last_rss, self.last_alive = mem, (seq, now)
        elif final and not alive and self.last_rss:
            # a dead process has no RSS: the row at its end carries the last one measured while it
            # was alive (meta.json `end.last_alive` says when), never a dead process's zeros
            mem = self.last_rss
        arena_res, res_ms = -1, 0.0
        if readable:
            arena_res, res_ms = self._measure(seq, final, state)
        measured = time.monotonic_ns()  # the residency figures are of this instant, not of `now`
        row = {
            "seq": seq,
            "ts_ns": now,
            "elapsed_s": (now - rec.t0_ns) / 1e9,
            **memory_columns(mem, heap_live, heap_peak, mm_live, cuda_host, dev_live, dev_peak),
            "live_count": heap_count + mm_count,
            "target_alive": int(alive),
            "arena_resident_bytes": arena_res,
            "residency_ms": res_ms,
            "measured_ns": measured if readable else now,
            "peak_snapshot": 0,
        }
        row.update(counters)
        self.last_row = row
        return row

    def _measure(self, seq: int, final: bool, state: TargetState) -> tuple[int, float]:
        """The resident-page measures (glibc's heaps, each allocator's own mappings) of this
        snapshot: over the last measure's ranges while no mapping can have changed, and not at
        all while the page counters are the same too (tracer/record/readgate.py; live bytes are
        always new): (heap resident bytes, ms taken)."""
        rec = self.rec
        t = time.monotonic_ns()
        try:
            maps = rec.maps.read(seq, state.maps_key)  # the snapshot's one read, shared
        except OSError:
            maps = None
        if maps is None:
            self.gate.forget()
            return -1, 0.0
        same_ranges, same_pages = self.gate.check(state, rec.maps.generation, t)
        if same_pages and not final:
            if rec.retention is not None:
                rows = rec.retention.relive(self.site_reader.live_by_source(self.sites.current))
                rec.writer.write_part("allocators", seq, allocator_part(seq, rows))
            return self.arena_res, 0.0
        same_ranges = same_ranges and not final
        arena_res, res_ms, part = self.heaps.measure(seq, final, maps, same_ranges)
        if part is not None:
            rec.writer.write_part("heaps", seq, part)
        ms, ok = self._measure_allocators(seq, maps, same_ranges)
        self.arena_res = arena_res
        if ok and arena_res != -1:
            self.gate.taken(state, rec.maps.generation, t)
        else:
            self.gate.forget()
        return arena_res, res_ms + ms

    def _measure_allocators(self, seq: int, maps: list[procfs.Mapping], same_ranges: bool) -> tuple[float, bool]:
        """Each allocator's resident, mapped and live bytes (the `allocators` part); its ms, and
        whether it was measured. `same_ranges`: over the ranges of the last measure (no
        mmap-family call since: the regions and the untracked LRU are as they were)."""
        rec = self.rec
        if rec.retention is None:
            return 0.0, True
        live = self.site_reader.live_by_source(self.sites.current)
        try:
            if same_ranges:
                rows, ms = rec.retention.remeasure(live)
            else:
                keys, vals = rec.probes.maps.read_regions()
                regions = [(s, v[0]) for s, v in zip(keys.tolist(), vals.tolist())]
                regions += [(r[0], r[0] + r[1]) for r in rec.tracker.live()]
                rows, ms = rec.retention.measure(rec.probes.maps.read_untracked(), regions, live, maps)
        except OSError:
            return 0.0, False
        rec.writer.write_part("allocators", seq, allocator_part(seq, rows))
        return ms, True
