"""Peak snapshots: when the kernel side woke the tracer at a new high of the live total
(tracer/record/peaks.py), the sites as read at the wake are written as an interval of their
own, its `intervals` row marked peak_snapshot 1; the observer (allocscope top) is handed what
they changed with the next regular snapshot (snapshot.py)."""

from __future__ import annotations

import pyarrow as pa

from .interval_row import interval_counters, memory_columns
from .peaks import PeakReading
from .trace_tables import SiteKey


class PeakSnapshots:
    """The peak snapshots of one recording (Snapshots.peak_snapshots); `snaps` is its Snapshots."""

    def __init__(self, snaps) -> None:
        self.snaps = snaps
        self.changed: list[SiteKey] = []  # sites a peak snapshot wrote, for the observer
        self.stack_columns: list[dict[str, list]] = []  # the stacks columns those peak snapshots wrote

    def take(self) -> None:
        """Before a regular snapshot: the peak reading not written yet, if any, as its own interval."""
        peaks = self.snaps.rec.peaks
        if peaks is None:
            return
        if peaks.woken:
            peaks.read()  # a wake not served yet: its reading is of now, still the high
        p = peaks.take()
        if p is not None:
            self.write(p)

    def write(self, p: PeakReading) -> None:
        """A peak snapshot as its own interval: the sites as read at the wake, the stacks they
        name first, an `intervals` row marked peak_snapshot 1."""
        snaps = self.snaps
        rec = snaps.rec
        rec.seq += 1
        seq, w = rec.seq, rec.writer
        changed = snaps.site_reader.apply_peak(snaps.sites, p.sites, rec.tracker, rec.source_names)
        self.changed += changed
        part = snaps.sites.part(seq, changed)
        if part is not None:
            w.write_part("sites", seq, part)
        new_ids = snaps.stacks.new_ids({k[0] for k in changed})
        if new_ids:
            if rec.target.readable() and not rec.exec_seen:
                rec.maps.refresh()
            cols = snaps.stacks.columns(rec.probes.maps.read_stacks(new_ids), rec.maps.index)
            self.stack_columns.append(cols)  # the observer (top) has not seen these stacks yet
            snaps.write_stacks(seq, new_ids, cols)
        heap_live, heap_peak, reg_bytes, reg_count, cuda_host, dev_live, dev_peak = p.totals[:7]
        counters = interval_counters(rec, dict(p.counters))
        mm_live = reg_bytes - rec.slow.taken_bytes + rec.tracker.live_bytes()
        row = {
            "seq": seq,
            "ts_ns": p.ts_ns,
            "elapsed_s": (p.ts_ns - rec.t0_ns) / 1e9,
            **memory_columns(p.rss, heap_live, heap_peak, mm_live, cuda_host, dev_live, dev_peak),
            "live_count": counters["n_allocs"]
            - counters["n_frees"]
            + reg_count
            - rec.slow.taken_count
            + rec.tracker.live_count(),
            "target_alive": 1,
            "arena_resident_bytes": -1,
            "residency_ms": p.read_ns / 1e6,
            "measured_ns": p.ts_ns,
            "peak_snapshot": 1,
        }
        row.update(counters)
        w.write_part("intervals", seq, pa.table({k: [v] for k, v in row.items()}))

    def for_observer(
        self, changed: list[SiteKey], stack_columns: dict[str, list] | None
    ) -> tuple[list[SiteKey], dict[str, list] | None]:
        """A regular snapshot's changed sites and new stacks, with those of the peak snapshots
        since the observer's last one (taken: the observer sees each once)."""
        if self.changed:
            changed = list(dict.fromkeys(self.changed + changed))
            self.changed = []
        if self.stack_columns:
            parts = [*self.stack_columns, *([stack_columns] if stack_columns else [])]
            stack_columns = {k: [v for c in parts for v in c[k]] for k in parts[0]}
            self.stack_columns = []
        return changed, stack_columns
