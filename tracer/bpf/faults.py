"""Residency mode's page-fault perf events: one per thread of the target, sampling every
`fault_sample`th user page fault into the program's fault_sample, open a share `fault_duty` of
each second (issue 50), and the target's fault count."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import random
import threading

from common.errors import PermissionProblem

from .program import Program
from .syscall import perf_event_bpf

# The page-fault events are open `fault_duty` of each cycle of this many seconds, at a random phase
# (no aliasing with a daemon's own period). While any page-fault perf event exists, every page fault
# of the box walks the kernel's software-event list, and every fault of a thread that has one counts
# in it: ~3.6 % of a fault-bound target's CPU with no BPF at all (bench/results/2026-12-07-default-cost.md).
# Closed, they cost nothing.
FAULT_CYCLE_S = 1.0


def proc_faults(pid: int) -> int | None:
    """The process' page faults so far, all its threads, exited ones included (minflt + majflt of
    /proc/PID/stat); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[7]) + int(fields[9])
    except (OSError, IndexError, ValueError):
        return None


class FaultEvents:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.pid, self.options = program.pid, program.options
        self._fault_fds: dict[int, int] = {}  # tid -> perf event fd (residency mode)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._cycler: threading.Thread | None = None
        self._base: int | None = None  # proc_faults at the attach (duty < 1)
        self._last = 0
        self.windows = 0  # windows opened so far

    @property
    def duty(self) -> float:
        return min(1.0, max(float(getattr(self.options, "fault_duty", 1.0)), 1e-3))

    def attach(self) -> None:
        """Residency mode: a page-fault software perf event on every thread of the target, one
        sample per `fault_sample` faults, inherited by the threads (and children) it creates
        later, each sample running fault_sample. Unsampled faults cost the kernel a counter
        increment, no BPF. With `fault_duty` < 1 the events are closed again after that share of
        each FAULT_CYCLE_S and reopened (on the threads there then) at a random phase of the
        next, by a thread of their own; each sample then stands for fault_sample / fault_duty
        pages (fault_weight: AS_FAULT_SAMPLE)."""
        if self.duty < 1.0:
            self._base = proc_faults(self.pid)
        with self._lock:
            self._open()
        if self.duty < 1.0:
            self._cycler = threading.Thread(target=self._cycle, name="fault-duty", daemon=True)
            self._cycler.start()

    def _open(self) -> None:
        """Open the events on every thread not holding one (called with the lock held). Threads
        created while attaching are caught by listing again."""
        from bcc.perf import Perf  # noqa: PLC0415

        attr = Perf.perf_event_attr()
        attr.type = 1  # PERF_TYPE_SOFTWARE
        attr.config = 2  # PERF_COUNT_SW_PAGE_FAULTS
        attr.size = ct.sizeof(attr)
        attr.sample_period = self.options.fault_sample
        attr.inherit = 1
        fd_prog = self.program.fault_prog.fd
        self.windows += 1
        for _ in range(100):
            try:
                tids = {int(t) for t in os.listdir(f"/proc/{self.pid}/task")}
            except OSError:
                tids = set()
            new = tids - set(self._fault_fds)
            if not new:
                break
            for tid in sorted(new):
                fd = perf_event_bpf(attr, tid, fd_prog)
                if fd < 0:
                    if fd == -errno.ESRCH or not os.path.exists(f"/proc/{self.pid}/task/{tid}"):
                        self._fault_fds[tid] = -1  # exited meanwhile
                        continue
                    raise PermissionProblem(
                        f"cannot open a page-fault perf event on thread {tid} ({os.strerror(-fd)}); "
                        "run 'allocscope doctor'"
                    )
                self._fault_fds[tid] = fd

    def _close_fds(self) -> None:
        """Close the open events (called with the lock held)."""
        for fd in self._fault_fds.values():
            if fd >= 0:
                os.close(fd)
        self._fault_fds = {}

    def _cycle(self) -> None:
        """The duty cycle: open `duty` of each FAULT_CYCLE_S, closed the rest, at a random phase."""
        on = self.duty * FAULT_CYCLE_S
        rng = random.Random()
        while not self._stop.wait(on):
            with self._lock:
                self._close_fds()
            if self._stop.wait((FAULT_CYCLE_S - on) * rng.uniform(0.5, 1.5)):
                return
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._open()
                except PermissionProblem:
                    self._close_fds()  # a thread went away mid-open: the next window tries again

    def count(self) -> int:
        """Page faults of the target since the attach, exact. Events always open (duty 1): their
        counts, threads created later included (the probes only see one in `fault_sample`); else
        the process' own count (/proc/PID/stat minflt + majflt, the last one read once it is gone)."""
        if self._base is not None:
            now = proc_faults(self.pid)
            if now is not None:
                self._last = max(self._last, now - self._base)
            return self._last
        total = 0
        with self._lock:
            for fd in self._fault_fds.values():
                if fd < 0:
                    continue
                try:
                    total += int.from_bytes(os.read(fd, 8), "little")
                except OSError:
                    continue
        return total

    def close(self) -> None:
        self._stop.set()
        if self._cycler is not None:
            self._cycler.join(5)
            self._cycler = None
        with self._lock:
            self._close_fds()
