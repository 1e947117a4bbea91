"""ptrace for --inject (tracer/inject/): stop every thread of a process, run system calls and
small code in one of them, write its memory, and let them all go again — no gdb.

Everything a stopped process is given back: each thread's registers as they were, a signal that
arrived while it was stopped (delivered on the detach), the system call it was blocked in
(restarted by the kernel as after any signal: an injected call runs with orig_rax = -1, so the
kernel's restart logic leaves it alone, and the thread's own registers, put back, restart its
call). All of a session's ptrace calls are made from the thread that attached (ptrace's rule):
`Stopped` is used as a context manager within one function.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import signal
import time

PTRACE_GETREGS, PTRACE_SETREGS = 12, 13
PTRACE_CONT, PTRACE_SINGLESTEP, PTRACE_DETACH = 7, 9, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000

_libc = ct.CDLL(None, use_errno=True)
_libc.ptrace.restype = ct.c_long
_libc.ptrace.argtypes = [ct.c_long, ct.c_long, ct.c_void_p, ct.c_void_p]


class Regs(ct.Structure):
    """struct user_regs_struct (x86-64)"""

    _fields_ = [
        (n, ct.c_uint64)
        for n in (
            "r15",
            "r14",
            "r13",
            "r12",
            "rbp",
            "rbx",
            "r11",
            "r10",
            "r9",
            "r8",
            "rax",
            "rcx",
            "rdx",
            "rsi",
            "rdi",
            "orig_rax",
            "rip",
            "cs",
            "eflags",
            "rsp",
            "ss",
            "fs_base",
            "gs_base",
            "ds",
            "es",
            "fs",
            "gs",
        )
    ]

    def copy(self) -> Regs:
        r = Regs()
        ct.memmove(ct.byref(r), ct.byref(self), ct.sizeof(Regs))
        return r


class PtraceError(OSError):
    pass


def _call(req: int, tid: int, addr: int = 0, data: int | ct.c_void_p | None = 0) -> int:
    r = _libc.ptrace(req, tid, ct.c_void_p(addr), data if isinstance(data, ct.c_void_p) else ct.c_void_p(data))
    if r < 0:
        e = ct.get_errno()
        raise PtraceError(e, os.strerror(e))
    return r


def threads(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def _wait(tid: int, timeout: float = 5.0) -> int:
    """waitpid(tid, __WALL): the status; raises on the thread's exit or after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got, status = os.waitpid(tid, WALL | os.WNOHANG)
        if got == tid:
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                raise PtraceError(errno.ESRCH, f"thread {tid} exited")
            return status
        if time.monotonic() > deadline:
            raise PtraceError(errno.ETIMEDOUT, f"thread {tid} did not stop within {timeout:.0f} s")
        time.sleep(0.0005)


class Stopped:
    """Every thread of `pid` in a ptrace stop (PTRACE_SEIZE + PTRACE_INTERRUPT), until `resume`.
    Threads created while stopping are caught by listing /proc/PID/task again until no new one
    appears; once all are stopped none can be created."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tids: list[int] = []
        self.regs: dict[int, Regs] = {}
        self.signals: dict[int, int] = {}  # tid -> a signal that arrived while stopped: delivered on detach
        self.t_stop = 0.0

    def __enter__(self) -> Stopped:
        t0 = time.perf_counter()
        try:
            self._stop_all()
        except BaseException:
            self.resume()
            raise
        self.t_stop = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        self.resume()

    def _stop_all(self) -> None:
        seen: set[int] = set()
        for _round in range(100):
            new = [t for t in threads(self.pid) if t not in seen]
            if not new:
                break
            for tid in new:
                seen.add(tid)
                try:
                    _call(PTRACE_SEIZE, tid, 0, 0)
                except PtraceError as e:
                    if e.errno == errno.ESRCH:
                        continue  # exited meanwhile
                    raise
                self.tids.append(tid)
                _call(PTRACE_INTERRUPT, tid)
            for tid in new:
                if tid in self.tids:
                    self._wait_stop(tid)
        else:
            raise PtraceError(errno.EAGAIN, "threads kept appearing while the process was being stopped")
        if not self.tids:
            raise PtraceError(errno.ESRCH, f"process {self.pid} has no threads left")
        for tid in self.tids:
            self.regs[tid] = self.getregs(tid)

    def _wait_stop(self, tid: int) -> None:
        """Until `tid` is in its interrupt stop; a signal-delivery stop on the way is remembered
        (the signal goes back on detach) and the thread let on to its interrupt stop."""
        for _ in range(64):
            try:
                status = _wait(tid)
            except PtraceError as e:
                if e.errno == errno.ESRCH:
                    self.tids.remove(tid)
                    return
                raise
            if not os.WIFSTOPPED(status):
                continue
            if status >> 16 == PTRACE_EVENT_STOP:
                sig = os.WSTOPSIG(status)
                if sig in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
                    # a group stop: the process was stopped by a signal before we came
                    raise PtraceError(errno.EBUSY, f"process {self.pid} is stopped (SIGSTOP); continue it first")
                return
            sig = os.WSTOPSIG(status)
            self.signals[tid] = sig
            _call(PTRACE_CONT, tid, 0, 0)  # suppressed now, delivered on detach
            _call(PTRACE_INTERRUPT, tid)
        raise PtraceError(errno.EAGAIN, f"thread {tid} kept receiving signals")

    def getregs(self, tid: int) -> Regs:
        r = Regs()
        _call(PTRACE_GETREGS, tid, 0, ct.c_void_p(ct.addressof(r)))
        return r

    def setregs(self, tid: int, r: Regs) -> None:
        _call(PTRACE_SETREGS, tid, 0, ct.c_void_p(ct.addressof(r)))

    def run_until_trap(self, tid: int, regs: Regs, step: bool, timeout: float = 5.0) -> Regs:
        """Run `tid` from `regs` (orig_rax = -1: no syscall restart) to its next SIGTRAP (one
        instruction with `step`, else an int3); other signals met on the way are kept for the
        detach. The registers at the trap."""
        r = regs.copy()
        r.orig_rax = (1 << 64) - 1
        self.setregs(tid, r)
        start = r.rip
        for _ in range(64):
            _call(PTRACE_SINGLESTEP if step else PTRACE_CONT, tid, 0, 0)
            status = _wait(tid, timeout)
            if os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP and status >> 16 == 0:
                out = self.getregs(tid)
                if not step or out.rip != start:
                    return out
                continue
            if os.WIFSTOPPED(status) and status >> 16 == 0:
                self.signals[tid] = os.WSTOPSIG(status)
                if os.WSTOPSIG(status) in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL):
                    out = self.getregs(tid)
                    self.setregs(tid, self.regs[tid])
                    self.signals.pop(tid, None)
                    raise PtraceError(
                        errno.EFAULT, f"injected code faulted at {out.rip:#x} (signal {os.WSTOPSIG(status)})"
                    )
                continue
        raise PtraceError(errno.EAGAIN, f"thread {tid} never reached its trap")

    def resume(self) -> None:
        """Every thread's registers back as they were, then PTRACE_DETACH (with its pending signal)."""
        for tid in list(self.tids):
            try:
                if tid in self.regs:
                    self.setregs(tid, self.regs[tid])
                _call(PTRACE_DETACH, tid, 0, self.signals.get(tid, 0))
            except PtraceError:
                pass  # exited
        self.tids = []


class Memory:
    """The target's memory through /proc/PID/mem (writes reach read-only code pages: the kernel
    copies the page for this process, as for a breakpoint)."""

    def __init__(self, pid: int, write: bool = True) -> None:
        self.fd = os.open(f"/proc/{pid}/mem", (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)

    def read(self, addr: int, n: int) -> bytes:
        return os.pread(self.fd, n, addr)

    def write(self, addr: int, data: bytes) -> None:
        if os.pwrite(self.fd, data, addr) != len(data):
            raise OSError(errno.EIO, f"short write at {addr:#x}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
