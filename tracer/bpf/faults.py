"""Residency mode's page-fault perf events: one per thread of the target, sampling every
`fault_sample`th user page fault into the program's fault_sample, and their exact counts."""

from __future__ import annotations

import ctypes as ct
import os

from common.errors import PermissionProblem

from .program import Program


class FaultEvents:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.pid, self.options = program.pid, program.options
        self._fault_fds: dict[int, int] = {}  # tid -> perf event fd (residency mode)

    def attach(self) -> None:
        """Residency mode: a page-fault software perf event on every thread of the target, one
        sample per `fault_sample` faults, inherited by the threads (and children) it creates
        later, each sample running fault_sample. Unsampled faults cost the kernel a counter
        increment, no BPF. Threads created while attaching are caught by listing again."""
        from bcc.libbcc import lib  # noqa: PLC0415
        from bcc.perf import Perf  # noqa: PLC0415

        attr = Perf.perf_event_attr()
        attr.type = 1  # PERF_TYPE_SOFTWARE
        attr.config = 2  # PERF_COUNT_SW_PAGE_FAULTS
        attr.size = ct.sizeof(attr)
        attr.sample_period = self.options.fault_sample
        attr.inherit = 1
        fd_prog = self.program.fault_prog.fd
        for _ in range(100):
            try:
                tids = {int(t) for t in os.listdir(f"/proc/{self.pid}/task")}
            except OSError:
                tids = set()
            new = tids - set(self._fault_fds)
            if not new:
                break
            for tid in sorted(new):
                fd = lib.bpf_attach_perf_event_raw(fd_prog, ct.byref(attr), tid, -1, -1, 0)
                if fd < 0:
                    if not os.path.exists(f"/proc/{self.pid}/task/{tid}"):
                        self._fault_fds[tid] = -1  # exited meanwhile
                        continue
                    raise PermissionProblem(
                        f"cannot open a page-fault perf event on thread {tid}; run 'allocscope doctor'"
                    )
                self._fault_fds[tid] = fd

    def count(self) -> int:
        """User page faults of the target since the attach (its perf events' counts, threads
        created later included), exact: the probes only see one in `fault_sample`."""
        total = 0
        for fd in self._fault_fds.values():
            if fd < 0:
                continue
            try:
                total += int.from_bytes(os.read(fd, 8), "little")
            except OSError:
                continue
        return total

    def close(self) -> None:
        for fd in self._fault_fds.values():
            if fd >= 0:
                os.close(fd)
        self._fault_fds = {}
