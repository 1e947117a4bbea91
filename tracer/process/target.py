"""The process being recorded: found by pid or pattern, or launched (-- CMD) and held.

A --pid target is never stopped, signalled or written to. A launched command is forked blocked
before exec (the probes attach to its pid first), then traced with ptrace for two reasons only:
to hold it for a moment at exit, while its memory map still exists, and (DWARF unwinding) at
each code mapping until that library's unwind rows are loaded. It gets allocscope's stdin,
stdout and stderr untouched and the signal dispositions a shell would give it (SIGPIPE and
SIGXFSZ back to their defaults: Python ignores them). Unless allocscope runs in the foreground
of a terminal, it gets a process group of its own, so that what ends it (tracer/process/launch.py)
reaches its children too; at a terminal it stays in allocscope's, like any command a shell starts
(it reads the terminal, and Ctrl-C reaches it).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common.errors import TargetError, UsageError

from . import ending, procfs, wrappers


@dataclass
class Target:
    pid: int
    start: int  # /proc start time: guards against pid reuse
    exe: str
    comm: str
    child: Child | None = None
    release_fd: int = -1  # launch mode: write a byte to let the child exec
    argv: list[str] = field(default_factory=list)
    # a pidfd of the process once alive() is first asked (-1: not yet; -2: none, /proc is read)
    _pidfd: int = field(default=-1, init=False, repr=False, compare=False)
    _exited: bool = field(default=False, init=False, repr=False, compare=False)
    # its wait status once it ended (exit code or signal: tracer/process/ending.py), None: not known
    exit_status: int | None = field(default=None, init=False, repr=False, compare=False)
    # `watch` (tracer/watch/gate.py) stopped it at its exec: release() calls this to let it run
    on_release: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # launch mode: the wrappers the command went through to its program, said to the user
    # (tracer/process/wrappers.py); "" when it runs as given
    via: str = field(default="", compare=False)

    def alive(self) -> bool:
        """The process is still running (not a zombie; a reused pid is not it). The recorder asks
        several times a snapshot: a pidfd polled without a wait answers it (~2 µs) where a read of
        /proc/PID/stat cost ~0.1 ms of the tracer's CPU for a many-threaded daemon (issue 33)."""
        if self.child is not None and (self.child.poll() is not None or self.child.exiting):
            return False
        if self._exited:
            return False
        if self._pidfd == -1:
            self._open_pidfd()
        if self._pidfd < 0:
            alive = procfs.is_alive(self.pid, self.start)
        else:  # readable once the process has exited (zombie or reaped)
            alive = not select.select([self._pidfd], [], [], 0)[0]
        if not alive:
            self._exited = True
            self._ended()
        return alive

    def _ended(self) -> None:
        """Take its wait status (from the pidfd, before closing it), then close the pidfd."""
        if self.exit_status is None and self.child is None:
            self.exit_status = ending.exit_status(self._pidfd, self.pid, self.start)
        self.close()

    def _open_pidfd(self) -> None:
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self._exited, self._pidfd = True, -2
            return
        except (OSError, AttributeError, ValueError):  # no pidfd here (kernel < 5.3): /proc each time
            self._pidfd = -2
            return
        self._pidfd = fd
        if not procfs.is_alive(self.pid, self.start):  # the pid is another process's by now (or a zombie)
            self._exited = True
            self._ended()

    def close(self) -> None:
        """Close the pidfd alive() opened (alive() still answers after: from /proc)."""
        if self._pidfd >= 0:
            os.close(self._pidfd)
        self._pidfd = -2

    def readable(self) -> bool:
        """/proc/PID/maps still describes the target (alive, or held at exit)."""
        if self.child is not None and self.child.exiting:
            return True
        return self.alive()


def target_from_pid(pid: int) -> Target:
    procfs.check_target(pid)
    try:
        t = Target(pid, procfs.starttime(pid), procfs.exe(pid), procfs.comm(pid))
    except OSError:
        raise TargetError(f"process {pid} exited before it could be traced") from None
    t.alive()  # its pidfd, now: how it ends is read from it (tracer/process/ending.py), reaped or not
    return t


def target_from_pgrep(pattern: str) -> Target:
    found = procfs.pgrep(pattern)
    if not found:
        raise TargetError(f"--pgrep {shlex.quote(pattern)} matches no process")
    if len(found) > 1:
        listing = "; ".join(f"{pid}: {line[:60]}" for pid, line in found[:8])
        more = f" (+{len(found) - 8} more)" if len(found) > 8 else ""
        raise TargetError(
            f"--pgrep {shlex.quote(pattern)} matches {len(found)} processes, give one with --pid: {listing}{more}"
        )
    return target_from_pid(found[0][0])


_libc = None


def _load_libc():
    global _libc
    if _libc is None:
        _libc = ct.CDLL(None, use_errno=True)
        _libc.ptrace.argtypes = [ct.c_long, ct.c_long, ct.c_void_p, ct.c_void_p]
        _libc.ptrace.restype = ct.c_long
    return _libc


def _ptrace(req: int, pid: int, addr: int = 0, data: int = 0) -> int:
    return _load_libc().ptrace(req, pid, addr, data)


PTRACE_TRACEME, PTRACE_CONT, PTRACE_DETACH, PTRACE_SETOPTIONS = 0, 7, 17, 0x4200
PTRACE_O_TRACEEXIT, PTRACE_O_EXITKILL, PTRACE_EVENT_EXIT = 0x40, 0x100000, 6
PTRACE_GETSIGINFO, SI_KERNEL = 0x4202, 0x80


def held_by_probe(pid: int) -> bool:
    """The ptrace-stopped `pid` stopped for a SIGSTOP sent by BPF (bpf_send_signal_thread: si_code
    SI_KERNEL), not by a user's kill (SI_USER): launch mode holds the loader at each code mapping
    until its unwind rows are loaded (tracer/unwind/)."""
    info = (ct.c_int32 * 32)()  # siginfo_t: 128 bytes; si_signo, si_errno, si_code
    if _ptrace(PTRACE_GETSIGINFO, pid, 0, ct.addressof(info)) != 0:
        return False
    return info[2] == SI_KERNEL


class Child:
    """A command we launched. It is forked blocked before exec until released, and traced with
    ptrace for one reason only: to hold it for a moment at exit (PTRACE_EVENT_EXIT), while its
    memory map still exists, so the tracer can read /proc/PID/maps of a short-lived program.
    Signals it receives are passed through unchanged."""

    def __init__(self, pid: int, own_group: bool = False, name: str = "") -> None:
        self.pid = pid
        self.own_group = own_group  # its own process group (pgid = pid): not at a terminal
        self.name = name or str(pid)
        self.returncode: int | None = None  # os.waitstatus_to_exitcode: -N for a signal
        self.exiting = False
        self.traced = True
        self.released = False  # exec'd: it runs the program, no longer our fork
        self.tree: dict[int, int] = {}  # at a terminal: its descendants in our group, pid -> start time
        self.on_exec: Callable[[], None] | None = None  # called at the exec stop, before the program runs
        # called when the probes stop it at a code mapping (DWARF unwinding)
        self.on_hold: Callable[[], None] | None = None

    def after_release(self) -> None:
        """Wait for the exec stop, ask for the exit stop, let it run."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            self.returncode = -1
            return
        if os.WIFSTOPPED(status):
            self.released = True
            if self.on_exec is not None:
                self.on_exec()
            _ptrace(PTRACE_SETOPTIONS, self.pid, 0, PTRACE_O_TRACEEXIT | PTRACE_O_EXITKILL)
            _ptrace(PTRACE_CONT, self.pid, 0, 0)
        else:
            self.returncode = os.waitstatus_to_exitcode(status)  # exec failed

    def poll(self) -> int | None:
        while self.returncode is None and not self.exiting:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                break
            if not pid:
                break
            if os.WIFSTOPPED(status):
                if status >> 16 == PTRACE_EVENT_EXIT:
                    self.exiting = True  # held: maps still readable until resume()
                else:
                    sig = os.WSTOPSIG(status)
                    if sig == signal.SIGSTOP and self.on_hold is not None and held_by_probe(self.pid):
                        self.on_hold()  # held at a code mapping: map its unwind rows first
                        sig = 0
                    _ptrace(PTRACE_CONT, self.pid, 0, 0 if sig == signal.SIGTRAP else sig)
                continue
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def resume(self) -> None:
        """Let it go from its exit stop (a detach: only a stopped tracee can be detached; one still
        running stays traced, and poll() keeps passing its signals on)."""
        if self.traced and self.returncode is None and _ptrace(PTRACE_DETACH, self.pid, 0, 0) == 0:
            self.traced = False
            self.exiting = False

    def detach(self, timeout: float = 2.0) -> bool:
        """Stop tracing it while it runs on (it exec'd another program after the recording ended):
        a SIGSTOP to its main thread alone (tgkill: no other thread can take it and stop the
        group), its stop taken, a detach that suppresses it; signals that stop it before are
        passed on. Untraced, it is no longer held at each signal, a debugger can attach, and
        allocscope's end does not kill it (PTRACE_O_EXITKILL). False when it did not stop in
        `timeout` (it stays traced) or ended."""
        if not self.traced or self.returncode is not None or self.exiting:
            return False
        if _load_libc().tgkill(self.pid, self.pid, signal.SIGSTOP) != 0:
            return False
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return False
            if not pid:
                time.sleep(0.002)
                continue
            if not os.WIFSTOPPED(status):
                self.returncode = os.waitstatus_to_exitcode(status)
                return False
            sig = os.WSTOPSIG(status)
            if status >> 16 == 0 and sig == signal.SIGSTOP:
                if _ptrace(PTRACE_DETACH, self.pid, 0, 0) == 0:
                    self.traced = False
                return not self.traced
            if status >> 16 == PTRACE_EVENT_EXIT:
                self.exiting = True
                self.resume()
                return False
            _ptrace(PTRACE_CONT, self.pid, 0, 0 if sig == signal.SIGTRAP else sig)
        return False

    def wait(self, timeout: float) -> int | None:
        self.resume()
        end = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < end:
            time.sleep(0.01)
        return self.returncode

    def signal(self, sig: int) -> None:
        """`sig` to its process group when it has its own; else (at a terminal: it shares ours) to
        it and to the descendants it has in our group (those remember_tree found, and those it
        has now), as Ctrl-C at the terminal would reach them — never to allocscope itself."""
        try:
            if self.own_group:
                os.killpg(self.pid, sig)
                return
            if self.returncode is None:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        self.remember_tree()
        for pid in self.tree_alive():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def remember_tree(self) -> None:
        """Note the descendants it has now in allocscope's process group (at a terminal): once it
        has ended they are init's children, still theirs to end (signal, group_alive)."""
        if self.own_group or self.returncode is not None:
            return
        ours = os.getpgrp()
        for pid in descendants(self.pid):
            try:
                if os.getpgid(pid) == ours and pid not in self.tree:
                    self.tree[pid] = procfs.starttime(pid)
            except OSError:
                continue

    def tree_alive(self) -> list[int]:
        """The remembered descendants still running (the same processes: start times checked)."""
        return [pid for pid, start in self.tree.items() if procfs.is_alive(pid, start)]

    def group_alive(self) -> bool:
        """Some process of its own process group is still there; at a terminal, some descendant
        remember_tree noted."""
        if not self.own_group:
            return bool(self.tree_alive())
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return group_running(self.pid)

    def reap(self, until: float) -> int | None:
        """Poll until it is reaped or the monotonic clock reaches `until`, letting it go from its
        exit stop; its returncode (None: still running)."""
        while self.poll() is None:
            if self.exiting:
                self.resume()  # held at its exit stop: let it finish
                continue
            if time.monotonic() >= until:
                break
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL (its process group too when it has its own), then reap it (5 s at most); said
        on stderr once it runs the program (a recording that failed: the error line follows). A
        released child is traced: killed, it stops once more at its exit event
        (PTRACE_O_TRACEEXIT), and is let go from there; wait()'s resume first would try to detach
        it while it runs, fail, and leave it held."""
        if self.returncode is None:
            if self.released:
                group = " and its process group" if self.own_group else ""
                print(
                    f"allocscope: {self.name} (pid {self.pid}){group} killed (SIGKILL): the recording failed",
                    file=sys.stderr,
                )
            self.signal(signal.SIGKILL)
            self.reap(time.monotonic() + 5)


def group_running(pgid: int) -> bool:
    """Some process of process group `pgid` is running: a zombie does not count (one whose parent
    died waits for init to reap it, and some container inits never do)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = procfs.stat_fields(int(d))
            if int(f[2]) == pgid and f[0] not in ("Z", "X", "x"):
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, theirs, and so on (/proc/PID/task/TID/children), now."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def _command_exe(argv: list[str]) -> str:
    if not argv:
        raise UsageError("no command given after --")
    exe = shutil.which(argv[0])
    if exe is None:
        raise TargetError(f"command not found or not executable: {argv[0]}")
    return exe


def program_image(path: str) -> str:
    """The executable the kernel runs for `path`: the file itself, or for a script (`#!`) its
    interpreter, followed as the kernel does (at most 4 levels); a real path. Its allocator and
    libraries are the ones to probe (a script file has none)."""
    script, path = path, os.path.realpath(path)
    for depth in range(4):
        try:
            with open(path, "rb") as f:
                head = f.read(256)
        except OSError as e:
            if depth == 0:
                return path  # the command itself: its exec says why (126)
            raise TargetError(f"cannot run {script}: its interpreter {path}: {e.strerror}") from None
        words = wrappers.shebang(head)
        if not words:
            return path
        path = os.path.realpath(os.fsdecode(words[0]))
    return path


def command_target(argv: list[str]) -> Target:
    """A command looked up but not started (record --dry-run): pid 0."""
    run = wrappers.resolve(_command_exe(argv), argv)
    name = os.path.basename(run.argv[0])[:15]
    return Target(0, 0, program_image(run.exe), name, argv=list(run.argv), via=run.said())


def at_terminal() -> bool:
    """allocscope is the foreground job of its controlling terminal (a command typed at a shell):
    a program it launches then stays in its process group, as the shell would have started it."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)  # ENXIO: no controlling terminal
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _exec(exe: str, argv: list[str], env: dict[str, str] | None) -> None:
    """In the forked child: exec the program, or say why not and exit as a shell does (126: found
    but cannot run, 127: else)."""
    try:
        if env is None:
            os.execv(exe, argv)
        else:
            os.execve(exe, argv, env)
    except OSError as e:
        os.write(2, f"allocscope: cannot run {argv[0]}: {e.strerror}\n".encode(errors="replace"))
        os._exit(126 if e.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR) else 127)


def target_from_command(argv: list[str]) -> Target:
    """Fork argv stopped before exec; the probes attach to its pid, then release() lets it
    exec, so it is traced from its first allocation. Its process group: the module's docstring.
    A wrapper that only execs another program (tracer/process/wrappers.py) is resolved first: the
    program it would run is launched, as it would run it."""
    run = wrappers.resolve(_command_exe(argv), argv)
    exe, argv, env = run.exe, run.argv, run.environ()
    own_group = not at_terminal()
    _load_libc()  # not in the forked child (another thread may hold the loader's lock at the fork)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: wait for the go byte, then exec; never returns into Python
        try:
            os.close(w)
            if own_group:
                os.setpgid(0, 0)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python: a program expects the default
                signal.signal(sig, signal.SIG_DFL)
            if os.read(r, 1) == b"g":
                os.close(r)
                _ptrace(PTRACE_TRACEME, 0)
                _exec(exe, argv, env)
        except BaseException:  # noqa: BLE001 (the forked child must end in _exit, whatever happened)
            pass
        os._exit(127)
    os.close(r)
    if own_group:
        try:
            os.setpgid(pid, pid)  # the child does it too: whichever comes first (no race with a kill)
        except OSError:
            pass
    comm = os.path.basename(argv[0])[:15]
    return Target(
        pid,
        procfs.starttime(pid),
        program_image(exe),
        comm,
        child=Child(pid, own_group, os.path.basename(argv[0])),
        release_fd=w,
        argv=list(argv),
        via=run.said(),
    )


def release(target: Target, start: bool = True) -> None:
    """Let the target run: one stopped at its exec by the watch, a launched command blocked
    before its exec. `start` False (a recording that failed before it started): a launched
    command never runs its program (its fork exits 127 without exec)."""
    if target.on_release is not None:  # stopped at its exec by the watch: let it run
        go, target.on_release = target.on_release, None
        go()
    if target.release_fd >= 0:
        if start:
            os.write(target.release_fd, b"g")
        os.close(target.release_fd)
        target.release_fd = -1
        if target.child is not None and start:
            target.child.after_release()


def launch_maps(target: Target) -> list[procfs.Mapping]:
    """Mappings the launched program will have: its executable and the libraries the dynamic
    loader resolves for it (the child has not exec'd yet, so its own maps are ours)."""
    maps = [procfs.Mapping(0, 0, "r-xp", 0, 1, target.exe)]
    try:
        out = subprocess.run(["ldd", target.exe], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        parts = line.split("=>")
        path = (parts[1] if len(parts) > 1 else parts[0]).strip().split(" (")[0].strip()
        if path.startswith("/"):
            maps.append(procfs.Mapping(0, 0, "r-xp", 0, 1, path))
    return maps
