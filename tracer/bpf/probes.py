"""Load probes/allocscope.c with BCC, attach it to one process, read its maps: `Probes`, the
parts of one recording's BPF side together — the program built and loaded (`program`,
tracer/bpf/program.py), its uprobes (`uprobes`, tracer/bpf/attach.py; the CUDA driver's,
tracer/bpf/attach_cuda.py), residency mode's page-fault events (`faults`, tracer/bpf/faults.py)
and its maps (`maps`, tracer/bpf/map_reads.py).
"""

from __future__ import annotations

from ..base.options import RecordOptions
from .attach import AttachReport, Uprobes
from .attach_cuda import attach_cuda
from .faults import FaultEvents
from .map_reads import MapReader
from .objects import prog_stats
from .program import Program


class Probes:
    """The BPF program for one target process."""

    def __init__(self, pid: int, options: RecordOptions | None = None, launched: bool = False) -> None:
        self.pid = pid
        self.options = options or RecordOptions()
        self.mode = self.options.mode
        self.program = Program(pid, self.options, launched)
        self.faults = FaultEvents(self.program)
        self.uprobes = Uprobes(self.program, self.faults)
        self.maps = MapReader(self.program)

    @property
    def bpf(self):
        return self.program.bpf

    @property
    def report(self) -> AttachReport:
        return self.uprobes.report

    @property
    def unwind(self) -> str:
        return self.program.unwind

    @property
    def unwind_error(self) -> str:
        return self.program.unwind_error

    @property
    def timings(self) -> dict[str, float]:
        return self.program.timings

    @property
    def bpf_cache(self) -> str:
        return self.program.bpf_cache

    @property
    def sys_tracepoints_kept(self) -> list[str]:
        return self.program.sys_tracepoints_kept

    def attach_cuda(self, path: str) -> dict:
        """Entry and return probes on the CUDA driver's allocation calls in `path`
        (libcuda.so.1; tracer/allocators/cuda.py), placed as the allocator's are. A call the library lacks,
        or one whose probe the kernel refuses, is skipped and said; the recording goes on."""
        return attach_cuda(self.uprobes, path)

    def unwinder(self, progress=None, lazy: bool = True):
        """The manager of the DWARF unwind maps (tracer.unwind.unwinder.Unwinder); None with frame pointers.
        `lazy`: modules without cached rows are built once stacks cross them (--pid)."""
        if self.unwind != "dwarf":
            return None
        from ..unwind.unwinder import Unwinder  # noqa: PLC0415

        return Unwinder(
            self.bpf,
            self.pid,
            self.options.unwind_rows,
            progress,
            update_batch=self.program.lib.update_batch,
            lazy=lazy,
        )

    def seed(self, mem: dict[str, int], brk: int | None) -> None:
        """What the probes cannot know from the attach on: the break (/proc/PID/maps' [heap]
        end), and with the rss_stat tracepoint the RSS counters (bytes) it keeps current."""
        if brk:
            t = self.bpf[b"brk_state"]
            t[t.Key(0)] = t.Leaf(brk)
        t = self.bpf[b"wait_cfg"]  # waits are traced from here on (0: not at all)
        wait_min = max(0, round(self.options.wait_min_ms * 1e6))
        t[t.Key(0)] = t.Leaf(wait_min)
        if not wait_min:  # not traced: no program on every context switch of the machine
            try:
                if b"sched_switch" in self.bpf.raw_tracepoint_fds:
                    self.bpf.detach_raw_tracepoint(tp=b"sched_switch")
                else:
                    self.bpf.detach_tracepoint(tp=b"sched:sched_switch")
                self.report.tracepoints = [x for x in self.report.tracepoints if x != "sched:sched_switch"]
                self.report.raw_tracepoints = [x for x in self.report.raw_tracepoints if x != "sched:sched_switch"]
            except Exception:  # noqa: BLE001 (BCC's bare Exception): it stays, returning at once
                pass
        if self.program.rss_tracepoint:
            t = self.bpf[b"rss"]
            for idx, key in ((0, "rss_file_bytes"), (1, "rss_anon_bytes"), (3, "rss_shmem_bytes")):
                if key in mem:
                    t[t.Key(idx)] = t.Leaf(mem[key])

    def program_stats(self) -> dict[str, dict[str, int]]:
        """BPF run time and runs per program of ours ({} unless the kernel keeps them:
        sysctl kernel.bpf_stats_enabled=1), from bpf(BPF_OBJ_GET_INFO_BY_FD)."""
        try:
            with open("/proc/sys/kernel/bpf_stats_enabled") as f:
                if f.read().strip() != "1":
                    return {}
        except OSError:
            return {}
        out = {}
        for name, fn in getattr(self.bpf, "funcs", {}).items():
            info = prog_stats(fn.fd)
            if info and info[1]:
                out[name.decode() if isinstance(name, bytes) else str(name)] = {
                    "run_time_ns": info[0],
                    "run_cnt": info[1],
                }
        return out

    def close(self) -> None:
        """Detach every probe and free the maps. Idempotent."""
        self.faults.close()
        self.uprobes.close()
        self.program.close()
