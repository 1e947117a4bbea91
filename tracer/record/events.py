"""The events of a recording's ring buffer, as they come (Recorder.ring.on_event, from the poll):
thread names and exits, exec, code mapped, peak wakes, purge calls; the rare mmap-family shapes
queued and replayed in order after each poll (tracer/record/regions.py)."""

from __future__ import annotations

from ..allocators.retention import purge_function
from ..base import layout as L

EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK, EV_TRIM, EV_NAME, EV_EXIT, EV_EXEC, EV_CODE, EV_PEAK = (
    L.enum(n)
    for n in (
        "AS_EV_MMAP",
        "AS_EV_MUNMAP",
        "AS_EV_MREMAP",
        "AS_EV_BRK",
        "AS_EV_TRIM",
        "AS_EV_THREAD_NAME",
        "AS_EV_THREAD_EXIT",
        "AS_EV_EXEC",
        "AS_EV_CODE",
        "AS_EV_PEAK",
    )
)
SLOW_EVENTS = (EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK)
EV_PYSTACK = L.enum("AS_EV_PYSTACK")  # a stack with Python frames stored (probes/python.h py_wake)
EV_PYTHREAD = L.enum("AS_EV_PYTHREAD")  # a thread's PyThreadState the probe found (py_find_tstate)


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class RingEvents:
    """The ring's events for one recording (`rec`: the Recorder)."""

    def __init__(self, rec) -> None:
        self.rec = rec
        self.slow_events: list[L.Event] = []  # queued by on_event, replayed after each poll

    def on_event(self, ev: L.Event) -> None:
        rec = self.rec
        typ, tid, ts = ev.type, ev.tid, ev.ts_ns
        released = 0
        if typ == EV_PEAK:
            if rec.peaks is not None:
                rec.peaks.wake()  # read in the loop, once the poll returns
            return
        if typ == EV_PYSTACK:
            if rec.python is not None:
                rec.python.stored(ev.addr)  # its code objects read in the loop, once the poll returns
            return
        if typ == EV_PYTHREAD:
            if rec.python is not None:
                rec.python.thread_found(tid, ev.addr)
            return
        if typ in SLOW_EVENTS:
            self.slow_events.append(ev)  # replayed in order once the poll returns (replay_slow)
            if typ == EV_MMAP and ev.prot & 0x4 and not ev.in_api:
                rec.maps.now()  # code mapped MAP_FIXED (ld.so, dlopen): read maps now
                if rec.on_code_mapped is not None:
                    rec.on_code_mapped()  # watch: its unwind rows are loaded; the held loader goes on
        elif typ == EV_CODE:
            rec.maps.now()  # a library's code was mapped: read maps now
            if rec.on_code_mapped is not None:
                rec.on_code_mapped()
        elif typ in (EV_NAME, EV_EXIT):
            if typ == EV_EXIT and ev.ret:  # the last thread: the loop looks at the target at once
                rec.group_exit = True
            rec.snapshots.threads.event(
                rec.seq + 1, ts, tid, ev.comm.decode("utf-8", "replace"), "rename" if typ == EV_NAME else "exit"
            )
            return
        elif typ == EV_EXEC:
            # The program was replaced: the allocator we probe and every live block are gone.
            rec.exec_seen = True
            rec.snapshots.threads.exec_renamed(tid, ev.comm.decode("utf-8", "replace"))
            if rec.end_reason is None:
                rec.end_reason = "target exec'd another program"
        elif typ == EV_TRIM:
            released = _s64(ev.len) - _s64(ev.addr2)  # anon RSS before - after: measured
            if not self._purge(ev):
                return  # another allocator's purge call: the `purges` table only
        rec.snapshots.events.add(ev, released)

    def _purge(self, ev: L.Event) -> bool:
        """A purge call (malloc_trim, mallctl, MallocExtension_Release*, mi_collect) to the
        `purges` table; True when it is glibc's malloc_trim (kept in `events` as before)."""
        rec = self.rec
        source = rec.source_names.get(ev.source, "heap") if ev.source else "heap"
        plan = next((pl for pl in rec.plans if pl.allocator.source == source), None)
        kind = plan.allocator.kind if plan is not None else "glibc"
        function, name = purge_function(kind, rec.target.pid, ev.addr)  # mallctl: purges only (the probe)
        rec.snapshots.purges.add(ev.ts_ns, ev.tid, source, function, name, ev.len2, _s64(ev.len), _s64(ev.addr2))
        return function == "malloc_trim"

    def replay_slow(self) -> None:
        """The rare mmap-family shapes the probes handed over, in order (tracer/record/regions.py)."""
        rec = self.rec
        if not self.slow_events:
            return
        evs, self.slow_events = self.slow_events, []
        replay = {EV_MMAP: rec.slow.mmap, EV_MUNMAP: rec.slow.munmap, EV_MREMAP: rec.slow.mremap, EV_BRK: rec.slow.brk}
        for ev in evs:
            replay[ev.type](ev)
        rec.slow.site_ext()
