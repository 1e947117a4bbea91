"""PeakWatch (tracer/record/peaks.py) against a stand-in for the kernel's maps: a burst that
finishes rising while the tracer reads the per-stack counters must still get a reading at its
top. The kernel side wakes the tracer only on an allocation past the armed threshold, so a
threshold armed above the read but below where the total already is would never fire."""

from __future__ import annotations

from tracer.record.peaks import PeakWatch, margin

MIB = 1 << 20


class Maps:
    """totals[0] is the live heap total; read_sites() returns it (the sites as they are) and
    then lets the allocations queued in `during_read` happen, as a burst racing the read."""

    def __init__(self) -> None:
        self.live = 0
        self.threshold = 0
        self.during_read: list[int] = []
        self.wakes = 0

    def alloc(self, n: int) -> None:
        self.live += n
        if self.threshold and self.live > self.threshold:  # accounting.h peak_watch
            self.threshold = 0
            self.wakes += 1

    def read_sites(self):
        seen = self.live
        for n in self.during_read:
            self.alloc(n)
        self.during_read = []
        return seen

    def read_totals(self):
        return (self.live, 0, 0, 0, 0, 0, 0)

    def read_counters(self):
        return {}

    def set_peak_wake(self, threshold: int) -> None:
        self.threshold = threshold


def test_a_rise_finished_during_the_read_is_read_again():
    m = Maps()
    w = PeakWatch(m)
    w.arm()
    m.alloc(363 * MIB)  # the burst passes the first threshold: a wake
    assert m.wakes == 1
    w.wake()
    m.during_read = [MIB] * 21  # the rest of the burst lands while the sites are read
    w.read()
    assert w.pending is not None and w.pending.sites == 363 * MIB
    assert m.live == 384 * MIB and m.wakes == 1  # no allocation after the arm: no kernel wake
    assert w.woken, "the total passed the new threshold before it was armed: a read is due"
    w.read()
    assert w.pending.sites == 384 * MIB and w.pending.live == 384 * MIB
    assert not w.woken and m.threshold == 384 * MIB + margin(384 * MIB)


def test_no_read_again_while_the_total_stays_under_the_threshold():
    m = Maps()
    w = PeakWatch(m)
    w.arm()
    m.alloc(100 * MIB)
    w.wake()
    m.during_read = [MIB // 2]  # within the margin of what was read
    w.read()
    assert not w.woken and w.pending.sites == 100 * MIB
    m.alloc(2 * MIB)  # past the threshold now: the kernel side wakes
    assert m.wakes == 2
