"""What the bench/ scripts share: processes (their output lines, CPU time, peak RSS, children),
a tracer's CPU and memory watched from outside, stopping processes, a few measurements. Nothing
here imports tests/ (the scripts import each other not at all, only this)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


class TrialError(RuntimeError):
    """A configuration could not run this trial; the message goes into the table."""


# ---------------------------------------------------------------------------------------------
# process helpers


def read_line(p: subprocess.Popen, prefix: str, timeout: float = 60, keep: list | None = None) -> str:
    """The first line of p's stdout starting with prefix; other lines go to keep."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.2)
        if r:
            line = p.stdout.readline()
            if line.startswith(prefix):
                return line.strip()
            if line and keep is not None:
                keep.append(line.rstrip())
            if not line and p.poll() is not None:
                break
        elif p.poll() is not None:
            break
    raise TrialError(f"no {prefix!r} from {Path(str(p.args[0])).name}")


def proc_cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def sched_cpu(pid: int) -> float | None:
    """CPU seconds of all of pid's threads, to the nanosecond (/proc/PID/task/*/schedstat: on-CPU
    ns), so that the CPU a request costs the target can be told apart from the machine's noise."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def cpu_seconds(pid: int) -> float:
    """CPU seconds of one process (NaN once it is gone)."""
    c = proc_cpu(pid)
    return float("nan") if c is None else c


def proc_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return 0  # a kernel thread or a zombie


def children_of(pid: int) -> list[int] | None:
    """The children of `pid` from /proc/PID/task/*/children (a few reads, whatever the box runs);
    None where the kernel has no such file (CONFIG_PROC_CHILDREN) or the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    kids: list[int] = []
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{t}"):
                continue  # the thread just exited
            return None
        except (OSError, ValueError):
            continue
    return kids


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


class TracerMonitor:
    """Samples the CPU time and VmHWM of a tracer's process tree (minus the target) until it
    exits: the last values read before each process went away are its totals.

    Every `period` s for the first `fast_for` s (the start-up, when short-lived children come and
    go), then every `slow` s: the sampling runs on the bench's CPU, which on a 2-CPU box is the
    load generator's, and only while a tracer runs, so its cost lands on the traced windows alone
    (at 20 samples a second it took ~1 % of that CPU, ~3.7 % when it read every /proc/*/stat)."""

    def __init__(
        self,
        root: int,
        exclude: set[int] | None = None,
        period: float = 0.05,
        fast_for: float = 5.0,
        slow: float = 1.0,
    ) -> None:
        self.root, self.exclude, self.period = root, set(exclude or ()), period
        self.slow_at, self.slow = time.monotonic() + fast_for, slow
        self.cpu: dict[int, float] = {}
        self.hwm: dict[int, int] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def exclude_pid(self, pid: int) -> None:
        with self.lock:
            self.exclude.add(pid)
            self.cpu.pop(pid, None)
            self.hwm.pop(pid, None)

    def sample(self) -> None:
        # The tree from each process's own children files: reading every /proc/*/stat (the
        # fallback) 20 times a second costs ~37 ms of CPU a second on a box of ~90 processes,
        # charged to the bench's CPU, which on 2 CPUs is the load generator's.
        kids: dict[int, list[int]] | None = None
        todo, tree = [self.root], []
        while todo:
            p = todo.pop()
            tree.append(p)
            c = children_of(p) if kids is None else None
            if c is None:
                kids = kids or children_map()
                c = kids.get(p, [])
            todo.extend(c)
        with self.lock:
            for p in tree:
                if p in self.exclude:
                    continue
                c, h = proc_cpu(p), proc_hwm_kib(p)
                if c is not None:
                    self.cpu[p] = max(c, self.cpu.get(p, 0.0))
                if h:
                    self.hwm[p] = max(h, self.hwm.get(p, 0))

    def _run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.period if time.monotonic() < self.slow_at else self.slow)

    def cpu_total(self) -> float:
        self.sample()
        with self.lock:
            return sum(self.cpu.values())

    def stop(self) -> tuple[float, float]:
        """(CPU seconds, peak RSS MiB) of the whole tree over its life."""
        self.done.set()
        self.thread.join()
        with self.lock:
            return sum(self.cpu.values()), sum(self.hwm.values()) / 1024


def settle(mon: TracerMonitor, quiet: float = 0.05, window: float = 0.5, limit: float = 15) -> None:
    """Wait until the freshly attached tracer is idle (under `quiet` of a CPU over `window` s,
    at most `limit` s), so its start-up work does not leak into the measured window."""
    end = time.monotonic() + limit
    last = mon.cpu_total()
    while time.monotonic() < end:
        time.sleep(window)
        now = mon.cpu_total()
        if now - last < quiet * window:
            return
        last = now


def record_cmd(python: str | Path, pid: int | str, out: Path, *args: str) -> list[str]:
    """The command line `allocscope record -q --pid PID -o OUT ARGS`, run by `python`; with ARGS
    starting with "watch": `allocscope watch -q --pid PID -o OUT REST` (OUT: its traces' directory).
    `python` may be an allocscope executable instead (a bundle's bin/allocscope): it is run itself."""
    run = [str(python)] if Path(str(python)).name == "allocscope" else [str(python), "-m", "allocscope"]
    if args[:1] == ("watch",):
        return [*run, "watch", "-q", "--pid", str(pid), "-o", str(out), *args[1:]]
    return [*run, "record", "-q", "--pid", str(pid), "-o", str(out), *args]


def first_interval(out: Path) -> bool:
    """A recording's first snapshot is on disk (`watch`: in one of the traces under OUT)."""
    return (out / "parts" / "intervals-000001.parquet").exists() or any(
        out.glob("*.allocscope/parts/intervals-000001.parquet")
    )


def perf_by_symbol(data: Path) -> str:
    """`perf report` of the recording `data`, by symbol with sample counts, as text."""
    return subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "-n", "--sort", "sym"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def write_lines(path: str | Path | None, lines: list[str]) -> None:
    """The lines a script printed, one a line, into `path` (its --out); nothing without one."""
    if path:
        Path(path).write_text("\n".join(lines) + "\n")


def finish_results(out: str | Path, lines: list[str], work: Path, keep: bool) -> None:
    """A results script's end, whatever happened: its lines into `out`, its work directory
    removed unless the user keeps it (--workdir)."""
    write_lines(out, lines)
    print(f"\nwritten: {out}")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def attach_allocscope(
    pid: int, out: Path, args: list[str], python: str | Path, cwd: str | Path, timeout: float = 300
) -> tuple[subprocess.Popen, TracerMonitor]:
    """`allocscope record -q --pid PID -o OUT ARGS` run by `python` in checkout `cwd`; returns once
    it has attached, written its first snapshot (maps, build IDs: start-up work too) and gone
    idle. Raises TrialError with its last line of stderr when it fails or does not attach."""
    proc = subprocess.Popen(
        record_cmd(python, pid, out, *args),
        cwd=str(cwd),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    mon = TracerMonitor(proc.pid, {pid})
    end = time.monotonic() + timeout
    while not first_interval(out):
        if proc.poll() is not None or time.monotonic() > end:
            stop_process(proc)
            mon.stop()
            err = proc.stderr.read().strip().splitlines()
            raise TrialError(f"allocscope did not attach: {err[-1] if err else f'exit {proc.returncode}'}")
        time.sleep(0.05)
    settle(mon)
    return proc, mon


def exported(obj: str, sym: str) -> bool:
    p = subprocess.run(["nm", "-D", "--defined-only", obj], capture_output=True, text=True, check=False)
    return any(line.split()[-1:] == [sym] for line in p.stdout.splitlines())


def stop_process(p: subprocess.Popen | None, sig: int = signal.SIGINT, timeout: float = 120) -> None:
    if p is None or p.poll() is not None:
        return
    try:
        p.send_signal(sig)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return 0.0
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx * 3600


# ---------------------------------------------------------------------------------------------
# redis: redis-server under redis-benchmark

# redis-benchmark's load in the scripts that share it: 50 clients, 100000 keys, 64-byte values
REDIS_LOAD = ["-c", "50", "-r", "100000", "-d", "64"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_cmd(exe: str, port: int, *extra: str) -> list[str]:
    """redis-server (exe) on port without persistence (no RDB snapshots, no AOF); extra: more flags."""
    return [exe, "--port", str(port), "--save", "", "--appendonly", "no", *extra]


def redis_ping(port: int, timeout: float = 1) -> bool:
    """Whether a redis-server on 127.0.0.1:port answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def wait_redis(srv: subprocess.Popen, port: int, timeout: float = 30) -> None:
    """Until srv answers PING on port; TrialError when it exits first, or (srv killed) after timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if srv.poll() is not None:
            raise TrialError(f"redis-server exited ({srv.returncode}) on port {port}")
        if redis_ping(port):
            return
        time.sleep(0.05)
    stop_process(srv, signal.SIGKILL)
    raise TrialError("redis-server did not answer PING")
