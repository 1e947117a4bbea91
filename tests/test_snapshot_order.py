"""The interval row's totals and the sites are of one moment (tracer/record/snapshot.py): the
kernel's counters are read right after the sites, not after the final snapshot's slow parts (the
live-block table, the glibc census), during which a busy target goes on allocating. A postgres
backend's report said "live now 0 B" above a location 26.8 KiB live at the end; redis under
redis-benchmark, 16.7 MiB live above locations summing to 16.5 MiB. No BPF: the probes' maps are
a fake whose counters move while the live table is written."""

from __future__ import annotations

from types import SimpleNamespace

from tracer.base.options import RecordOptions
from tracer.record import snapshot as snapshot_module
from tracer.record.snapshot import Snapshots


class Kernel:
    """The probes' maps: one heap block of 4096 bytes live when the sites are read; the target
    allocates nine more while the final snapshot writes its live-block table."""

    def __init__(self) -> None:
        self.allocs, self.live = 1, 4096

    def read_counters(self) -> dict[str, int]:
        return {"n_allocs": self.allocs, "n_frees": 0, "lost_unmatched_ret": 0}

    def read_totals(self) -> tuple[int, ...]:
        return self.live, self.live, 0, 0, 0, 0, 0  # heap live, heap peak, regions, count, cuda, device

    def read_tlb(self) -> dict[str, int]:
        return {}

    def read_offcpu(self):
        return {}


def test_the_final_rows_totals_are_read_beside_the_sites(monkeypatch):
    kernel = Kernel()

    class SlowLiveTable:  # the final snapshot's table of live blocks: the target runs meanwhile
        def __init__(self, *_a) -> None:
            pass

        def write(self, *_a) -> int:
            kernel.allocs, kernel.live = 10, 10 * 4096
            return 0

    monkeypatch.setattr(snapshot_module, "LiveTable", SlowLiveTable)
    written: dict[str, object] = {}
    rec = SimpleNamespace(
        seq=0,
        t0_ns=0,
        exec_seen=False,
        target=SimpleNamespace(pid=1, alive=lambda: True, readable=lambda: False),
        maps=SimpleNamespace(part=lambda *a: None),
        ring=SimpleNamespace(replay_slow=lambda: None),
        writer=SimpleNamespace(write_part=lambda name, seq, part: written.__setitem__(name, part)),
        probes=SimpleNamespace(maps=kernel),
        tracker=SimpleNamespace(live_bytes=lambda: 0, live_count=lambda: 0, live=lambda: []),
        slow=SimpleNamespace(taken_bytes=0, taken_count=0),
        source_names={},
        opts=RecordOptions(),
        injection=None,
        retention=None,
        peaks=None,
        observer=None,
        attach_window_returns=0,
    )
    s = Snapshots(rec, rec.target, RecordOptions(wait_min_ms=0))
    # the sites, read now (one block): the reader's other maps are empty
    s.site_reader = SimpleNamespace(update=lambda *a: {}, releases=lambda final: {}, flows=lambda *a: None)
    s.snapshot(final=True)
    row = s.last_row
    assert (row["live_bytes"], row["live_count"], row["n_allocs"]) == (4096, 1, 1), row
