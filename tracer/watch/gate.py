"""The exec gate of `allocscope watch`: a restarted daemon stopped at its exec, so that its new
incarnation is traced from its first allocation (probes/watch.bpf.c says how).

A held process must never be left stopped: the watcher releases (SIGCONT) every held pid it does
not follow, at once; closing the gate releases every pid still held; and a guardian process, which
holds nothing but the `held` map's file descriptor (not the program: the probe is gone with the
watcher), waits for the watcher's end on a pipe and, if the watcher was killed, continues every
pid still in the map before it exits itself.
"""

from __future__ import annotations

import ctypes as ct
import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from common.errors import PermissionProblem

from ..base.layout import PROBES_DIR

DEBUG = bool(os.environ.get("ALLOCSCOPE_WATCH_DEBUG"))  # each release, and why (stderr)

GUARD = r"""
import ctypes, os, signal, sys
fd = int(sys.argv[1])
sys.path.insert(0, sys.argv[2])  # the tree holding tracer/: bpf(2) through its one wrapper
from tracer.bpf import syscall as bpf
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
told = []  # the pids the watcher was letting go last: continued too, in case it died in between
for line in sys.stdin:
    if line.strip().isdigit():
        told = (told + [int(line)])[-64:]
for pid in told:
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass
key, nxt = ctypes.c_uint32(0), ctypes.c_uint32(0)
first = True
for _ in range(4096):
    attr = bpf.KeyAttr(map_fd=fd, key=0 if first else ctypes.addressof(key), next_key=ctypes.addressof(nxt))
    if bpf.bpf(bpf.MAP_GET_NEXT_KEY, attr) != 0:
        break
    first = False
    try:
        os.kill(nxt.value, signal.SIGCONT)
    except OSError:
        pass
    key.value = nxt.value
"""


@dataclass
class Held:
    pid: int
    ts_ns: int  # CLOCK_MONOTONIC when it was stopped


class _Event(ct.Structure):
    _fields_ = [("pid", ct.c_uint32), ("kind", ct.c_uint32), ("ts_ns", ct.c_uint64)]


def comm_key(comm: str) -> bytes:
    """A watched name as the kernel's comm: at most 15 bytes, NUL-padded to 16."""
    return comm.encode()[:15].ljust(16, b"\0")


class ExecGate:
    """The gate's BPF program, its guardian, and the pids it holds (`events`: a queue of Held,
    filled by poll())."""

    def __init__(self, comms: list[str]) -> None:
        try:
            import bcc  # noqa: PLC0415
        except ImportError as e:
            raise PermissionProblem(f"the watch's exec gate needs BCC ({e})") from None
        from ..bpf import prebuilt  # noqa: PLC0415

        self.compiled_why: str | None = None  # why BCC compiled the gate here (None: the prebuilt one)
        try:
            try:
                self.bpf = prebuilt.load_watch(bcc)  # built once at make setup: no compile, no headers
            except prebuilt.NotPrebuilt as e:
                self.compiled_why = str(e)
                from ..bpf.bcc_lean import BUILDING  # noqa: PLC0415

                with BUILDING:
                    self.bpf = bcc.BPF(text=(PROBES_DIR / "watch.bpf.c").read_text())
        except Exception as e:  # noqa: BLE001 - BCC raises plain Exception on a failed load
            raise PermissionProblem(f"the watch's exec gate did not load: {str(e).splitlines()[0][:160]}") from None
        self.held = self.bpf["held"]
        self.watched = self.bpf["watched"]
        self.events: queue.Queue[Held] = queue.Queue()
        self.comms: set[str] = set()
        self.code_holds: dict[int, float] = {}  # pid -> when it stopped at a code mapping (kind 2)
        fd = self.held.map_fd
        os.set_inheritable(fd, True)
        try:
            self.guard = subprocess.Popen(
                [sys.executable, "-S", "-c", GUARD, str(fd), str(PROBES_DIR.parent)],
                stdin=subprocess.PIPE,
                pass_fds=(fd,),
                close_fds=True,
                start_new_session=True,  # a Ctrl-C to the watcher's terminal is not the guardian's
            )
        finally:
            os.set_inheritable(fd, False)
        self.bpf["watch_events"].open_ring_buffer(self._on_event)
        for c in comms:
            self.watch(c)

    def _on_event(self, ctx, data, size) -> None:
        ev = ct.cast(data, ct.POINTER(_Event)).contents
        if ev.kind == 1:
            self.events.put(Held(int(ev.pid), int(ev.ts_ns)))
        elif ev.kind == 2:
            self.code_holds[int(ev.pid)] = time.monotonic()

    def follow(self, pid: int, seconds: float) -> None:
        """Stop `pid` at each file it maps executable for the next `seconds` (kind 2 holds): the
        loader mapping its libraries, until their unwind rows are loaded (release_code)."""
        until = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(seconds * 1e9)
        self.bpf["follow"][ct.c_uint32(pid)] = ct.c_uint64(until)

    def unfollow(self, pid: int) -> None:
        try:
            del self.bpf["follow"][ct.c_uint32(pid)]
        except KeyError:
            pass
        self.release_code(pid)

    def release_code(self, pid: int) -> None:
        """Let `pid` go from a stop at a code mapping (the tracer has loaded what it maps). The
        `held` map says whether it is held (its event may not have reached our thread yet)."""
        self.code_holds.pop(pid, None)
        if self.held.get(ct.c_uint32(pid)) is not None:
            self.release(pid, "its code mapping's rows are in")

    def release_stale(self, after_s: float = 1.0) -> None:
        """Code holds the tracer did not release within after_s: let them go anyway (a stack
        cut short is better than a daemon that waits)."""
        now = time.monotonic()
        for pid, t in list(self.code_holds.items()):
            if now - t >= after_s:
                if DEBUG:
                    print(f"allocscope: debug: pid {pid} held at a code mapping for {now - t:.1f}s", file=sys.stderr)
                self.release_code(pid)

    def watch(self, comm: str) -> None:
        """Hold every exec of a program named `comm` (its first 15 bytes, as the kernel keeps it)."""
        c = comm[:15]
        if c and c not in self.comms:
            self.watched[self.watched.Key.from_buffer_copy(comm_key(c))] = ct.c_uint8(1)
            self.comms.add(c)

    def poll(self, timeout_ms: int) -> None:
        """Wait up to `timeout_ms` for held execs (they go to `events`)."""
        self.bpf.ring_buffer_poll(timeout_ms)

    def holding(self) -> list[int]:
        return [int(k.value) for k in self.held]

    def release(self, pid: int, why: str = "") -> None:
        """Let a held process run (SIGCONT), and forget it. Forgotten first: once running, the
        loader maps its libraries at once, and a follow stop (kind 2) is taken only for a pid not
        in `held`; the guardian is told first, so a watcher that dies in between still lets it go."""
        if DEBUG:
            print(f"allocscope: debug: the gate lets pid {pid} go ({why or 'watcher'})", file=sys.stderr)
        if self.guard.stdin is not None:
            try:
                self.guard.stdin.write(f"{pid}\n".encode())
                self.guard.stdin.flush()
            except (OSError, ValueError):
                pass
        try:
            del self.held[ct.c_uint32(pid)]
        except KeyError:
            pass
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def counts(self) -> dict[str, int]:
        t = self.bpf["watch_counts"]
        return {"held": int(t[0].value), "refused": int(t[1].value)}

    def close(self) -> None:
        """Release every pid still held, unload the program, let the guardian go."""
        for pid in self.holding():
            self.release(pid, "the gate closes")
        self.bpf.cleanup()
        if self.guard.stdin is not None:
            self.guard.stdin.close()
        try:
            self.guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.guard.kill()


def wait_stopped(pid: int, timeout_s: float = 1.0) -> bool:
    """Whether `pid` reached its stop (state T) within `timeout_s`: the SIGSTOP sent at the exec is
    taken on the way back to user space, a moment after the event."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return True
        except (OSError, IndexError):
            return False
        time.sleep(0.002)
    return False
