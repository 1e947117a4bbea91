"""--inject: allocscope's sampler inside the target, so that only sampled allocator calls trap.

What it does to the process (README "--inject"): every thread is stopped with ptrace for a few
milliseconds; one of them runs system calls on our behalf (mmap of the agent's file, its tables,
a stub page near each allocator module, pidfd_open of the tracer, clone of the watchdog thread);
each allocator entry point found (tracer/allocators/discovery.py) gets a 5-byte jump to a stub that enters
the agent's hook (tracer/inject/patching.py: only when the displaced instructions are provably movable
and no thread is inside them); the threads go on. Only sampled calls reach the markers, whose
uprobes feed the usual BPF path (stacks, sites, threads, the trace).

Taking it back (`Injection.detach`, here): the threads are stopped again, every entry's bytes are
written back as they were, the watchdog is told to exit. If the tracer dies instead, the
watchdog (polling the tracer's pidfd) puts the entry words back itself. The agent's pages stay
mapped, inert: a thread may still be returning through a hook or a trampoline.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import struct
import time
from dataclasses import dataclass, field

from ..process import procfs
from . import patching
from .agent import (
    STATE_DETACHING,
    STATE_UNHOOKED,
    SYS,
    SYS_FAMILY,
    AgentImage,
    AsConfig,
    InjectError,
    agent_path,
    read_agent,
)
from .agentrss import tables_resident
from .hooks import Hook, HookSpec, sys_specs
from .loading import AgentLoader
from .preflight import ptrace_blocker
from .ptrace import Memory, PtraceError, Stopped


@dataclass
class Injection:
    """The agent in one process: hooks placed (`load`), sampling switched on (`enable`), and
    everything taken back (`detach`)."""

    pid: int
    sample_bytes: int
    agent: AgentImage
    hooks: list[Hook] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    base: int = 0
    tables: int = 0
    pidfd: int = -1
    watchdog_tid: int = 0
    syscall_insn: int = 0
    stopped_ms: list[float] = field(default_factory=list)
    detached: str = ""  # how it ended: "restored", "watchdog", "exec", "exited"
    counters: dict[str, int] = field(default_factory=dict)
    specs: list[HookSpec] = field(default_factory=list)  # the allocators' entry points to hook
    sys_hook_specs: list[HookSpec] = field(default_factory=list)  # the mmap family's
    quiet: object = None  # quiet(tid): the probes ignore tid's system calls (0: none)
    marks_fd: int = field(default=-1, repr=False)  # /proc/PID/mem, read-only: sys_marks()
    marker_probe: str = ""  # where the markers' uprobes sit: "nop5" (optimized) or "push" (emulated)

    @property
    def cfg_addr(self) -> int:
        return self.base + self.agent.symbols["as_cfg"][0]

    def sym(self, name: str) -> int:
        return self.base + self.agent.symbols[name][0]

    def load(self, tracer_pid: int) -> None:
        """Stop the process, map the agent, place the hooks (sampling off), start the watchdog
        (tracer/inject/loading.py)."""
        AgentLoader(self).load(tracer_pid)

    # -- in a stopped process --

    def syscall(self, st: Stopped, tid: int, name: str, *args: int) -> int:
        r = st.regs[tid].copy()
        r.rax = SYS[name]
        for reg, v in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(r, reg, v & ((1 << 64) - 1))
        r.rip = self.syscall_insn
        out = st.run_until_trap(tid, r, step=True)
        v = out.rax
        return v - (1 << 64) if v >= 1 << 63 else v

    def set_field(self, mem: Memory, name: str, value: int) -> None:
        off = getattr(AsConfig, name).offset
        mem.write(self.cfg_addr + off, struct.pack("<I", value))

    # -- while it runs --

    def enable(self, on: bool = True) -> None:
        """Sampling on (after the markers' uprobes are attached) or off (before the last snapshot)."""
        if not self.hooks or self.detached:
            return
        try:
            mem = Memory(self.pid)
        except OSError:
            return
        try:
            self.set_field(mem, "enabled", int(on))
        except OSError:
            pass
        finally:
            mem.close()

    def sys_marks(self) -> int | None:
        """The agent's count of the mmap family's calls made through its hooks (as_cfg.sys_marks:
        every call counted once it returned; munmap, madvise and brk before the call too), one
        8-byte read of the target's memory. None when a call of the family is not hooked (it
        keeps its tracepoint, and is counted nowhere), once detached, or when it cannot be read."""
        if self.detached or not self.hooks or set(SYS_FAMILY) - set(self.sys_hooked):
            return None
        try:
            if self.marks_fd < 0:
                self.marks_fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            b = os.pread(self.marks_fd, 8, self.cfg_addr + AsConfig.sys_marks.offset)
        except OSError:
            return None
        return int.from_bytes(b, "little") if len(b) == 8 else None

    def close_marks(self) -> None:
        if self.marks_fd >= 0:
            os.close(self.marks_fd)
            self.marks_fd = -1

    def read_config(self) -> AsConfig | None:
        try:
            mem = Memory(self.pid)
        except OSError:
            return None
        try:
            return AsConfig.from_buffer_copy(mem.read(self.cfg_addr, ct.sizeof(AsConfig)))
        except (OSError, ValueError):
            return None
        finally:
            mem.close()

    def _agent_mapped(self) -> bool:
        for m in procfs.read_maps(self.pid):
            if m.start == self.base and m.is_file and os.path.basename(m.path) == os.path.basename(self.agent.path):
                return True
        return False

    def detach(self) -> str:
        """Every entry put back byte for byte (threads stopped), the watchdog told to exit.
        Returns how it ended; idempotent."""
        self.close_marks()
        if self.detached or not self.hooks:
            return self.detached
        if not os.path.exists(f"/proc/{self.pid}"):
            self.detached = "exited"
            return self.detached
        if not self._agent_mapped():
            self.detached = "exec"  # a new image: the hooks went with the old one
            return self.detached
        cfg = self.read_config()
        if cfg is not None:
            self.counters = {
                k: getattr(cfg, k) for k in ("sampled", "freed", "set_full", "thread_overflow", "foreign", "sys_marks")
            }
        mem = Memory(self.pid)
        try:
            with Stopped(self.pid) as st:
                t0 = time.perf_counter()
                self.set_field(mem, "enabled", 0)
                state = AsConfig.from_buffer_copy(mem.read(self.cfg_addr, ct.sizeof(AsConfig))).state
                for h in self.hooks:
                    cur = mem.read(h.addr, patching.JMP_LEN)
                    if cur == h.jump:
                        mem.write(h.addr, h.orig[: patching.JMP_LEN])
                self.set_field(mem, "state", STATE_DETACHING)
                if self.pidfd >= 0 and self._pidfd_is_ours():
                    tid = self.pid if self.pid in st.tids else st.tids[0]
                    self.syscall(st, tid, "close", self.pidfd)
                    self.pidfd = -1
                self.stopped_ms.append(1000 * (time.perf_counter() - t0 + st.t_stop))
            self.detached = "watchdog" if state == STATE_UNHOOKED else "restored"
        except PtraceError as e:
            if not os.path.exists(f"/proc/{self.pid}"):
                self.detached = "exited"
                return self.detached
            raise InjectError(f"cannot stop pid {self.pid} to take the hooks back: {e.strerror}") from None
        finally:
            mem.close()
        deadline = time.monotonic() + 2
        while (
            time.monotonic() < deadline
            and self.watchdog_tid
            and os.path.exists(f"/proc/{self.pid}/task/{self.watchdog_tid}")
        ):
            time.sleep(0.01)
        return self.detached

    def _pidfd_is_ours(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/fdinfo/{self.pidfd}") as f:
                return any(line.split() == ["Pid:", str(os.getpid())] for line in f)
        except OSError:
            return False

    @property
    def sys_hooked(self) -> dict[str, list[str]]:
        """The mmap family's calls hooked: kind -> [symbol@module]"""
        out: dict[str, list[str]] = {}
        for h in self.hooks:
            if h.spec.sys_kind:
                out.setdefault(h.spec.sys_kind, []).append(f"{h.spec.symbol}@{h.spec.path}")
        return out

    def report(self, tracepoints: list[str] | None = None) -> dict:
        """recording.probes.inject; `tracepoints`: the syscall tracepoints this recording kept (the
        mmap-family calls not hooked)"""
        return {
            "agent": self.agent.path,
            "base": self.base,
            "hooked": [
                {"symbol": h.spec.symbol, "module": h.spec.path, "source": h.spec.source, "displaced": h.length}
                for h in self.hooks
                if not h.spec.sys_kind
            ],
            "mmap_family": {
                "hooked": self.sys_hooked,
                "not_seen": "system calls made without these functions (ld.so mapping "
                "libraries, syscall(2), inline system calls)",
            },
            "tracepoints": list(tracepoints or []),
            "skipped": dict(self.refused),
            "stopped_ms": [round(x, 2) for x in self.stopped_ms],
            "marker_probe": self.marker_probe,
            "watchdog_tid": self.watchdog_tid,
            "detached": self.detached,
            "counters": dict(self.counters),
            "tables_resident_bytes": tables_resident(self.pid, self.tables),
        }


def inject(pid: int, specs: list[HookSpec], skipped: dict[str, str], sample_bytes: int, quiet=None) -> Injection:
    """The agent loaded into `pid` with its hooks in place, sampling off (enable() after the
    markers' probes are attached). InjectError (nothing left in the process) when it cannot."""
    why = ptrace_blocker(pid)
    if why:
        raise InjectError(f"--inject: {why}")
    img = read_agent(agent_path())
    inj = Injection(pid, sample_bytes, img)
    inj.specs = specs
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    inj.sys_hook_specs, sys_skipped = sys_specs(procfs.read_maps(pid), exe, sorted({sp.path for sp in specs}))
    skipped = {**skipped, **sys_skipped}
    inj.refused.update(skipped)
    inj.quiet = quiet or (lambda tid: None)
    inj.load(os.getpid())
    return inj


def errno_name(e: int) -> str:
    return errno.errorcode.get(e, str(e))
