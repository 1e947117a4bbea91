#!/usr/bin/env python3
"""The tracer's steady-state CPU per snapshot interval of an `--inject` recording (issue #33),
two checkouts side by side in one run (before, after), on two serving daemons.

    sudo .venv/bin/python bench/tracer_cpu.py --before DIR [--after DIR] [--rounds 3] [--seconds 10]
        [--bins build/floor-bins] [--redis-dir build/redis-dir] [--workloads rustd,redis] [--out FILE]

Per trial a fresh daemon: `rustd --serve 4` (bench/inject_floor.py --build-bins) on CPU 1, or
redis-server on CPU 1 under a redis-benchmark loop (set,get,lpush,lpop, 50 clients) on CPU 0;
`record --pid PID --inject --duration D` run by this python in the checkout (its code first on
sys.path), on CPU 0 (the CPU it shares with the load generator on a 2-core box). Once it has
written its first interval and gone idle, the CPU of each of its threads
(/proc/PID/task/*/schedstat, ns) over --seconds; ms per interval = that CPU / intervals written
in the window. Then SIGINT, exit 0 required, and the trace is read back (intervals, parts
written). Configurations alternate in each round (the order flipped every round); medians and
min-max over rounds.

DIR: a checkout whose tracer/inject/agent and tracer/unwind/cfi .so are built; an older commit is
made with `git archive COMMIT | tar -x -C DIR` and the two .so copied in.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import (
    REDIS_LOAD,
    TrialError,
    attach_allocscope,
    free_port,
    read_line,
    redis_server_cmd,
    stop_process,
    wait_redis,
    write_lines,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def thread_cpu(pid: int) -> dict[str, int]:
    """ns on CPU per thread name (threads of one name summed) of process `pid`."""
    out: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            comm = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
        key = "main" if t == str(pid) else comm
        out[key] = out.get(key, 0) + ns
    return out


def intervals_written(trace: Path) -> int:
    try:
        return sum(1 for n in os.listdir(trace / "parts") if n.startswith("intervals-"))
    except OSError:
        return 0


class Rustd:
    def __init__(self, bins: Path, threads: int) -> None:
        self.bins, self.threads = bins, threads
        self.load: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        p = subprocess.Popen(
            ["taskset", "-c", "1", str(self.bins / "rustd"), "--serve", str(self.threads)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        read_line(p, "ready", timeout=30)
        return p

    def stop(self, srv: subprocess.Popen) -> None:
        stop_process(srv, signal.SIGTERM, 60)


class Redis:
    def __init__(self, redis_dir: str) -> None:
        self.dir = redis_dir
        self.env = {**os.environ, "LD_LIBRARY_PATH": redis_dir}
        self.load: subprocess.Popen | None = None
        self.stopping = threading.Event()

    def start(self) -> subprocess.Popen:
        port = free_port()
        d = Path(tempfile.mkdtemp(prefix="tracer-cpu-redis-"))
        srv = subprocess.Popen(
            [
                "taskset",
                "-c",
                "1",
                *redis_server_cmd(os.path.join(self.dir, "redis-server"), port, "--bind", "127.0.0.1", "--dir", str(d)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        wait_redis(srv, port)
        self.stopping.clear()
        self.port = port
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        time.sleep(1.0)  # the key space filling
        return srv

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.load = subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    "0",
                    os.path.join(self.dir, "redis-benchmark"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-t",
                    "set,get,lpush,lpop",
                    "-n",
                    "2000000",
                    "-q",
                    *REDIS_LOAD,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env,
            )
            self.load.wait()

    def stop(self, srv: subprocess.Popen) -> None:
        self.stopping.set()
        if self.load is not None:
            stop_process(self.load, signal.SIGKILL, 30)
        self.thread.join(30)
        stop_process(srv, signal.SIGTERM, 60)


def trial(wl, checkout: Path, seconds: float, work: Path, name: str) -> dict:
    srv = wl.start()
    trace = work / f"{name}.allocscope"
    proc = mon = None
    try:
        proc, mon = attach_allocscope(
            srv.pid,
            trace,
            ["--inject", "--duration", str(int(seconds + 60)), "--force"],
            sys.executable,
            checkout,
        )
        os.sched_setaffinity(proc.pid, {0})
        for t in os.listdir(f"/proc/{proc.pid}/task"):
            os.sched_setaffinity(int(t), {0})
        time.sleep(1.0)
        c0, n0, t0 = thread_cpu(proc.pid), intervals_written(trace), time.monotonic()
        time.sleep(seconds)
        c1, n1, t1 = thread_cpu(proc.pid), intervals_written(trace), time.monotonic()
        stop_process(proc)
        if proc.returncode != 0:
            raise TrialError(f"allocscope exited {proc.returncode}: {proc.stderr.read().strip()[-200:]}")
        n = n1 - n0  # intervals files: held parts (format 6) write one every 5 s
        per = {k: (v - c0.get(k, 0)) / 1e6 / (t1 - t0) for k, v in c1.items()}  # ms per s: per 1 s interval
        parts = len(os.listdir(trace / "parts"))
        from common.tracefile.reader import load_trace

        read_iv = len(load_trace(str(trace)).intervals)
        return {
            "ms": sum(per.values()),
            "threads": per,
            "intervals": n,
            "window_s": t1 - t0,
            "parts_per_interval": parts / max(1, read_iv),  # Parquet files of the whole trace
            "read_intervals": read_iv,
        }
    finally:
        if proc is not None:
            stop_process(proc, signal.SIGKILL, 30)
        if mon is not None:
            mon.stop()
        wl.stop(srv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the checkout to compare against")
    ap.add_argument("--after", default=str(ROOT))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--bins", default=str(ROOT / "build" / "floor-bins"))
    ap.add_argument("--redis-dir", default=str(ROOT / "build" / "redis-dir"))
    ap.add_argument("--workloads", default="rustd,redis")
    ap.add_argument("--out")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/tracer_cpu.py: run as root (it attaches BPF probes and injects)")
    sys.path.insert(0, str(ROOT))
    cfgs = {"before": Path(a.before).resolve(), "after": Path(a.after).resolve()}
    wls = {"rustd": Rustd(Path(a.bins), 4), "redis": Redis(a.redis_dir)}
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"load average at the start: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    work = Path(tempfile.mkdtemp(prefix="tracer-cpu-"))
    res: dict[tuple[str, str], list[dict]] = {}
    for w in a.workloads.split(","):
        for r in range(a.rounds):
            order = list(cfgs) if r % 2 == 0 else list(cfgs)[::-1]
            for c in order:
                try:
                    t = trial(wls[w], cfgs[c], a.seconds, work, f"{w}-{c}-{r}")
                except TrialError as e:
                    say(f"{w} round {r + 1} {c}: failed: {e}")
                    continue
                res.setdefault((w, c), []).append(t)
                th = ", ".join(f"{k} {v:.2f}" for k, v in sorted(t["threads"].items(), key=lambda kv: -kv[1]) if v)
                say(
                    f"{w} round {r + 1} {c}: {t['ms']:.2f} ms CPU per 1 s interval ({t['intervals']} "
                    f"intervals files written; {th}); {t['parts_per_interval']:.1f} "
                    f"parts per interval, {t['read_intervals']} intervals read back"
                )
    say("")
    say("| daemon | before ms/interval (median, min-max) | after ms/interval | after / before | parts/interval |")
    say("|---|---|---|---|---|")
    for w in a.workloads.split(","):
        b, f = res.get((w, "before"), []), res.get((w, "after"), [])
        if not b or not f:
            continue
        mb, mf = statistics.median(t["ms"] for t in b), statistics.median(t["ms"] for t in f)
        pb = statistics.median(t["parts_per_interval"] for t in b)
        pf = statistics.median(t["parts_per_interval"] for t in f)
        say(
            f"| {w} | {mb:.2f} ({min(t['ms'] for t in b):.2f}-{max(t['ms'] for t in b):.2f}) | "
            f"{mf:.2f} ({min(t['ms'] for t in f):.2f}-{max(t['ms'] for t in f):.2f}) | {mf / mb:.2f} | "
            f"{pb:.1f} -> {pf:.1f} |"
        )
    say(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    write_lines(a.out, lines)


if __name__ == "__main__":
    main()
