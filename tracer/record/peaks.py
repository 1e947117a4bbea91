"""Peak snapshots: the per-stack counters read at the moment the live total reaches a new high.

The interval snapshots read the `sites` map once a second, so a burst shorter than that (8 threads
holding 384 MiB for 100 ms) is between two of them, and the per-location figures at the peak
describe another moment. The kernel side wakes the tracer instead (accounting.h `peak_watch`):
once the live total (heap API + regions + CUDA host memory, the intervals' `live_bytes`) passes
the threshold in totals[7], one AS_EV_PEAK event goes out and the wake is disarmed. The tracer
then reads the `sites` map at once (`PeakWatch.read`, a batch read: milliseconds), keeps that
reading when its live total is the highest of the interval, and re-arms the wake at its live
total (as read before the sites) + the margin; a total already past that when armed (a burst
that finished rising during the read) makes it read again. The reading kept is written as its
own `intervals` row (`peak_snapshot` 1) with its `sites` part, just before the next interval
snapshot (peak_snapshot.py `PeakSnapshots.write`).

Margin: max(1 % of the high-water mark, 1 MiB) — the composition written is that of a moment
whose live total is within the margin of the highest (the last wake came at most one margin
below it). Rate: one read per wake, the wake disarmed until the read is done, and reads spaced
at least max(MIN_GAP_NS, 4 x the last read's CPU time) apart (a wake inside the gap is served at its
end): the tracer spends at most about a fifth of its time on them, and a ramp from 0 to 100 GiB
makes about 800 wakes (log growth of 1 %), a sawtooth under its old high none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MARGIN_FRACTION = 0.01
MARGIN_MIN_BYTES = 1 << 20
MIN_GAP_NS = 2_000_000  # 2 ms between two reads at least


def live_total(totals: tuple[int, ...]) -> int:
    """The live total peak_watch compares (read_totals: heap API + regions + CUDA host memory)."""
    return totals[0] + totals[2] + totals[4]


def margin(hwm: int) -> int:
    """Bytes the live total must rise above `hwm` before the next peak snapshot."""
    return max(int(hwm * MARGIN_FRACTION), MARGIN_MIN_BYTES)


@dataclass
class PeakReading:
    """The kernel's counters at one wake: `sites` as read_sites() gives them, `totals` as
    read_totals(), the counters, the target's RSS, when (ts_ns: the read's start)."""

    ts_ns: int
    live: int
    sites: tuple[np.ndarray, np.ndarray]
    totals: tuple[int, ...]
    counters: dict[str, int]
    rss: dict[str, int]
    read_ns: int


class PeakWatch:
    """The tracer's half of the high-water wake (see the module docstring)."""

    def __init__(self, probes, rss=None) -> None:
        self.probes = probes
        self.read_sites = probes.read_sites  # tracer/record/sitechanges.py: what changed since the interval
        self.rss: Callable[[], dict[str, int]] = rss or (lambda: {})
        self.hwm = 0  # the highest live total read at a wake
        self.woken = False
        self.next_read_ns = 0
        self.pending: PeakReading | None = None  # the highest reading since the last flush
        self.reads = 0
        self.read_ns = 0  # their time, summed
        self.max_read_ns = 0
        self.wakes = 0
        self.written = 0

    def arm(self) -> None:
        """Wake at the high-water mark + the margin. The kernel side looks only at allocations, so
        a rise that passed that threshold before it was set (during the read that armed it)
        wakes nothing: the total is looked at once after arming, and a read is due when it
        is past already (a burst that finished rising during a read was kept 21 MiB short)."""
        threshold = self.hwm + margin(self.hwm)
        self.probes.set_peak_wake(threshold)
        if self._live() > threshold:
            self.woken = True

    def disarm(self) -> None:
        self.probes.set_peak_wake(0)

    def wake(self) -> None:
        """An AS_EV_PEAK event came (from the ring buffer poll)."""
        self.wakes += 1
        self.woken = True

    def wait_ms(self, now_ns: int) -> int | None:
        """How long the poll may sleep before a read is due; None: no wake pending."""
        if not self.woken:
            return None
        return max(0, (self.next_read_ns - now_ns) // 1_000_000)

    def due(self, now_ns: int) -> bool:
        return self.woken and now_ns >= self.next_read_ns

    def read(self) -> None:
        """Read the per-stack counters now; keep them when the highest since the last flush;
        re-arm the wake above what was read."""
        t0, c0 = time.monotonic_ns(), time.thread_time_ns()
        live0 = self._live()  # the sites read next are at least this new: the wake is armed from it
        sites = self.read_sites()
        totals = self.probes.read_totals()
        counters = self.probes.read_counters()
        t1, c1 = time.monotonic_ns(), time.thread_time_ns()
        try:
            rss = self.rss()
        except OSError:
            rss = {}
        live = live_total(totals)
        # at an equal total the later reading wins: its sites are the newer (a read again after a
        # rise that ended during the last one finds the same total, the sites complete)
        if self.pending is None or live >= self.pending.live:
            self.pending = PeakReading(t0, live, sites, totals, counters, rss, t1 - t0)
        self.hwm = max(self.hwm, min(live, live0))
        self.reads += 1
        self.read_ns += t1 - t0
        self.max_read_ns = max(self.max_read_ns, t1 - t0)
        self.woken = False
        # the gap bounds the reads' CPU (a fifth at most): it follows the read's CPU time, not its
        # wall time, which a busy box stretches while the tracer waits for a core (a 100 ms peak
        # was missed when a descheduled read pushed the next one past it)
        self.next_read_ns = t1 + max(MIN_GAP_NS, 4 * (c1 - c0))
        self.arm()

    def _live(self) -> int:
        return live_total(self.probes.read_totals())

    def take(self, regular_live: int | None = None) -> PeakReading | None:
        """The reading to write now (and forget), before the interval snapshot; `regular_live`:
        that snapshot's live total, which raises the high-water mark the next wake is armed from."""
        p, self.pending = self.pending, None
        if p is not None:
            self.written += 1
        if regular_live is not None and regular_live > self.hwm:
            self.hwm = regular_live
            if not self.woken:
                self.arm()
        return p

    def meta(self) -> dict:
        return {
            "margin_fraction": MARGIN_FRACTION,
            "margin_min_bytes": MARGIN_MIN_BYTES,
            "hwm_bytes": self.hwm,
            "wakes": self.wakes,
            "reads": self.reads,
            "written": self.written,
            "read_ms_total": round(self.read_ns / 1e6, 3),
            "read_ms_max": round(self.max_read_ns / 1e6, 3),
        }
