#!/usr/bin/env python3
"""Overhead of allocscope against untraced runs, memleak-bpfcc and heaptrack, in one run.

Workloads (--workload, default all):
  loop   bench/malloc_loop.c: 2 threads of malloc+free over 10 size classes (16 B .. 16 KiB).
         It times its own work only: it prints "ready", waits for SIGUSR1 (sent once the
         tracer has attached), then prints "elapsed <s>". Metric: seconds (lower is better).
  redis  redis-server (Debian, jemalloc) on 127.0.0.1, no persistence, a fresh server per trial;
         the tracer attaches to it, then redis-benchmark runs bounded request counts over
         loopback (--csv). Metric: requests/s over all tests (higher is better).
  demo   the bundled demo daemon (demo/provingd.c) with --wait-signal; by default unpaced
         (--synth-ms 0 --gpu-ms 0) so it is CPU-bound. Metric: partitions/s, timed from
         SIGUSR1 to its summary line (higher is better).

Configurations, interleaved per round (A B C A B C ...) so machine noise hits them alike:
untraced, allocscope (full, DWARF), allocscope-fp, allocscope-sampled (--sample-bytes 65536),
allocscope-residency, memleak (memleak-bpfcc default), memleak-combined (--combined-only),
memleak-s10 (-s 10), heaptrack (when installed: LD_PRELOAD launch for loop and demo,
`heaptrack -p` (gdb injection) for redis). Per configuration: median metric, ratio to untraced,
the tracer's CPU seconds during the measured work and in total (start-up, compile and
shutdown included), and its peak RSS (VmHWM, summed over the tracer's processes, read from
/proc until they exit). A configuration that cannot run (memleak cannot attach, heaptrack
missing or its injection fails) is reported in the table with the reason; the rest go on.
At the end, whether each goal of issue #6 is met.

    sudo .venv/bin/python bench/overhead.py [--workload loop|redis|demo|all] [--rounds 5]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import (
    TracerMonitor,
    TrialError,
    attach_allocscope,
    exported,
    free_port,
    kill_pid,
    proc_cpu,
    read_line,
    redis_server_cmd,
    sched_cpu,
    settle,
    stop_process,
    wait_redis,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# allocscope configurations: name -> extra `record` arguments
ALLOCSCOPE_CONFIGS = {
    "allocscope": [],
    "allocscope-fp": ["--unwind", "fp"],
    "allocscope-sampled": ["--sample-bytes", "65536"],
    "allocscope-residency": ["--mode", "residency"],
    # the in-process sampler (issue #24): only sampled calls trap
    "allocscope-inject": ["--inject", "--sample-bytes", "524288"],
    # the trap floor: the same probes attached, every BPF program returning at once
    "floor": ["--probe-floor"],
    "floor-residency": ["--probe-floor", "--mode", "residency"],
}
# not run unless named in --configs: the anonymous RSS kept by a kmem:rss_stat program (the way
# before 2026-12) instead of read at each release's entry and exit
EXTRA_CONFIGS = {
    "allocscope-rsstp": ["--rss-tracepoint"],
    "allocscope-residency-rsstp": ["--mode", "residency", "--rss-tracepoint"],
    "allocscope-watch": ["watch"],  # `allocscope watch --pid PID` in its default mode (residency)
    "allocscope-watch-nowaits": ["watch", "--wait-min", "0"],
}
# which floor each mode is measured against
FLOOR_OF = {
    "allocscope": "floor",
    "allocscope-fp": "floor",
    "allocscope-sampled": "floor",
    "allocscope-inject": "floor",
    "allocscope-rsstp": "floor",
    "allocscope-residency": "floor-residency",
    "allocscope-residency-rsstp": "floor-residency",
    "allocscope-watch": "floor-residency",
    "allocscope-watch-nowaits": "floor-residency",
}
MEMLEAK_CONFIGS = {"memleak": [], "memleak-combined": ["--combined-only"], "memleak-s10": ["-s", "10"]}
MEMLEAK_INTERVAL = "5"  # memleak-bpfcc's own default report interval
MEMLEAK_NO_ATTACH = "see its output (bench/memleak_fixed.py runs it with ref_ctr_offset 0)"


# ---------------------------------------------------------------------------------------------
# tracers


@dataclass
class Tracer:
    proc: subprocess.Popen
    monitor: TracerMonitor
    log: list = field(default_factory=list)
    trace: Path | None = None  # allocscope: where it records (its meta.json has bpf_stats)


def start_attach_tracer(cfg: str, pid: int, tmp: Path, alloc_obj: str | None = None) -> Tracer:
    """allocscope or memleak attached to a running pid; returns once the probes are live."""
    if cfg.startswith("allocscope") or cfg.startswith("floor"):
        out = tmp / f"bench-{time.monotonic_ns()}.allocscope"
        extra = ALLOCSCOPE_CONFIGS.get(cfg, EXTRA_CONFIGS.get(cfg))
        exe = EXTRA_EXES.get(cfg) or ALLOCSCOPE or sys.executable
        proc, mon = attach_allocscope(pid, out, extra, exe, ROOT)
        return Tracer(proc, mon, trace=out)
    if cfg.startswith("memleak"):
        if alloc_obj and not (exported(alloc_obj, "mmap") and exported(alloc_obj, "munmap")):
            # memleak -O OBJ probes malloc..free *and* mmap/munmap in OBJ, none of them optional;
            # without -O it probes libc, whose malloc this process does not call.
            raise TrialError(
                f"memleak-bpfcc cannot probe {Path(alloc_obj).name}: its -O needs mmap and munmap "
                "in the allocator object (jemalloc exports neither), and its default (libc) "
                "would see none of this process' allocations"
            )
        obj = ["-O", alloc_obj] if alloc_obj else []
        # bench/memleak_fixed.py: memleak-bpfcc itself, with python3-bpfcc's garbage ref_ctr_offset
        # replaced by 0, so that it attaches beside any other uprobe on malloc
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "memleak_fixed.py"),
                "-p",
                str(pid),
                *obj,
                *MEMLEAK_CONFIGS[cfg],
                MEMLEAK_INTERVAL,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        t = Tracer(proc, TracerMonitor(proc.pid, {pid}))
        # memleak prints "Attaching" before it compiles and attaches; its first periodic report
        # ("[time] Top N stacks ...") proves the probes are live.
        try:
            read_line(proc, "[", timeout=240, keep=t.log)
        except TrialError:
            stop_process(proc)
            t.monitor.stop()
            last = next((ln for ln in reversed(t.log) if ln.strip()), "")
            raise TrialError(f"did not attach: {last[:60]}; {MEMLEAK_NO_ATTACH}") from None
        # drain its reports so it never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        settle(t.monitor)
        return t
    raise ValueError(cfg)


ALLOCSCOPE = ""  # --allocscope: an allocscope executable (a bundle's) instead of this checkout's
EXTRA_EXES: dict[str, str] = {}  # --define NAME=@EXE ARGS: that configuration's own allocscope (another build)
BINS: Path | None = None  # --bins: brief_shape and provingd built elsewhere (a box without gcc)
LAST_BPF_STATS: dict = {}  # bpf_stats of the allocscope trace finish_tracer last read


def finish_tracer(t: Tracer | None) -> tuple[float, float]:
    """Stop the tracer (SIGINT) and return (total CPU s, peak RSS MiB). The BPF run time per
    program it recorded (--bpf-stats) is left in LAST_BPF_STATS."""
    if t is None:
        return 0.0, 0.0
    stop_process(t.proc)
    LAST_BPF_STATS.clear()
    if t.trace is not None:
        try:
            LAST_BPF_STATS.update(json.loads((t.trace / "meta.json").read_text()).get("bpf_stats") or {})
        except (OSError, ValueError):
            pass
    return t.monitor.stop()


@dataclass
class Trial:
    metric: float
    cpu_work: float
    cpu_total: float
    rss_mib: float
    detail: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# workloads


class Workload:
    name = ""
    unit = ""
    higher_is_better = False

    def prepare(self, tmp: Path) -> None: ...

    def run(self, cfg: str, tmp: Path) -> Trial: ...

    def header(self) -> str: ...


class SignalledProgram(Workload):
    """A program started with --wait-signal: it prints "ready <pid>", then works after SIGUSR1.
    heaptrack launches it under LD_PRELOAD; the other tracers attach to its pid."""

    def argv(self) -> list[str]: ...

    def measure(self, prog: subprocess.Popen, pid: int) -> tuple[float, dict]: ...

    def run(self, cfg: str, tmp: Path) -> Trial:
        heaptrack = cfg == "heaptrack"
        argv = self.argv()
        if heaptrack:
            argv = ["heaptrack", "-o", str(tmp / f"heaptrack-{time.monotonic_ns()}"), *argv]
        prog = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        mon = TracerMonitor(prog.pid) if heaptrack else None
        tracer = None
        pid = None
        try:
            pid = int(read_line(prog, "ready", timeout=120).split()[1])
            if heaptrack:
                mon.exclude_pid(pid)
            elif cfg != "untraced":
                tracer = start_attach_tracer(cfg, pid, tmp)
                mon = tracer.monitor
            cpu0 = mon.cpu_total() if mon else 0.0
            tcpu0 = proc_cpu(pid) or 0.0
            os.kill(pid, signal.SIGUSR1)
            metric, detail = self.measure(prog, pid)
            cpu_work = (mon.cpu_total() - cpu0) if mon else 0.0
            tcpu = proc_cpu(pid)
            detail["target_cpu"] = (tcpu - tcpu0) if tcpu is not None else float("nan")
            cpu, rss = 0.0, 0.0
            if tracer is not None:
                cpu, rss = finish_tracer(tracer)
                detail["bpf"] = dict(LAST_BPF_STATS)
                tracer = None
            try:
                prog.wait(600)  # heaptrack: until its interpreter has finished
            except subprocess.TimeoutExpired:
                kill_pid(pid)
                prog.wait()
            if heaptrack:
                cpu, rss = mon.stop()
                mon = None
            return Trial(metric, cpu_work, cpu, rss, detail)
        finally:
            if tracer is not None:
                finish_tracer(tracer)
            if prog.poll() is None:
                if pid is not None:
                    kill_pid(pid)
                stop_process(prog, signal.SIGKILL, 30)
            if mon is not None and heaptrack:
                mon.stop()


class LoopWorkload(SignalledProgram):
    name, unit, higher_is_better = "loop", "seconds", False

    def __init__(self, iters: int, threads: int) -> None:
        self.iters, self.threads = iters, threads

    def prepare(self, tmp: Path) -> None:
        self.exe = tmp / "malloc_loop"
        subprocess.run(
            ["gcc", "-O2", "-pthread", "-fno-omit-frame-pointer", "-o", str(self.exe), str(HERE / "malloc_loop.c")],
            check=True,
        )

    def argv(self) -> list[str]:
        return [str(self.exe), "--wait-signal", "--iters", str(self.iters), "--threads", str(self.threads)]

    def measure(self, prog, pid):
        return float(read_line(prog, "elapsed", timeout=900).split()[1]), {}

    def header(self) -> str:
        calls = 2 * self.iters * self.threads
        return (
            f"malloc-heavy loop: {self.threads} threads x {self.iters} iterations ({calls} malloc+free "
            f"calls, 10 size classes 16 B..16 KiB), seconds of work after SIGUSR1"
        )


class BriefWorkload(SignalledProgram):
    """issue 50: the brief's memory shape in small (bench/brief_shape.c): threads mallocing
    40 MiB buffers glibc maps, every page touched, the last 2 kept. Metric: seconds of work."""

    name, unit, higher_is_better = "brief", "seconds", False

    def __init__(self, iters: int, threads: int, mib: int) -> None:
        self.iters, self.threads, self.mib = iters, threads, mib

    def prepare(self, tmp: Path) -> None:
        if BINS is not None:
            self.exe = BINS / "brief_shape"
            return
        self.exe = tmp / "brief_shape"
        subprocess.run(
            [
                "gcc",
                "-O2",
                "-g",
                "-pthread",
                "-fno-omit-frame-pointer",
                "-o",
                str(self.exe),
                str(HERE / "brief_shape.c"),
            ],
            check=True,
        )

    def argv(self) -> list[str]:
        return [
            str(self.exe),
            "--wait-signal",
            "--iters",
            str(self.iters),
            "--threads",
            str(self.threads),
            "--mib",
            str(self.mib),
        ]

    def measure(self, prog, pid):
        secs = float(read_line(prog, "elapsed", timeout=900).split()[1])
        faults = int(read_line(prog, "faults", timeout=60).split()[1])
        return secs, {"faults": faults, "own_cpu": float(read_line(prog, "cpu", timeout=60).split()[1])}

    def header(self) -> str:
        return (
            f"brief shape: {self.threads} threads x {self.iters} iterations of a {self.mib} MiB malloc "
            f"(mmapped), every page touched, 2 kept ({self.threads * self.iters * self.mib * 256} first-touch "
            "faults), seconds of work after SIGUSR1"
        )


class DemoWorkload(SignalledProgram):
    name, unit, higher_is_better = "demo", "partitions/s", True

    def __init__(self, partitions: int, extra: list[str], name: str = "demo") -> None:
        self.partitions, self.extra, self.name = partitions, extra, name

    def prepare(self, tmp: Path) -> None:
        if BINS is not None:
            self.exe = BINS / "provingd"
            return
        sys.path.insert(0, str(ROOT))
        from allocscope.cli.demo import build_daemon

        self.exe = build_daemon(tmp)

    def argv(self) -> list[str]:
        return [str(self.exe), "--wait-signal", "--partitions", str(self.partitions), *self.extra]

    def measure(self, prog, pid):
        t0 = time.monotonic()
        end = t0 + 900
        summary = ""
        while time.monotonic() < end:  # the summary line goes to stderr at the very end
            r, _, _ = select.select([prog.stderr], [], [], 0.2)
            if r:
                line = prog.stderr.readline()
                if line.startswith("provingd:") and "elapsed" in line:
                    summary = line
                    break
                if not line and prog.poll() is not None:
                    break
        secs = time.monotonic() - t0
        if not summary:
            raise TrialError("provingd printed no summary")
        return self.partitions / secs, {"seconds": secs}

    def header(self) -> str:
        mb = self.extra[self.extra.index("--partition-mb") + 1] if "--partition-mb" in self.extra else "8"
        return (
            f"demo daemon (demo/provingd.c {' '.join(self.extra)} --partitions {self.partitions}, "
            f"{mb} MiB mmapped partitions), partitions/s from SIGUSR1 to its summary"
        )


def allocator_object(pid: int) -> str | None:
    """The shared object that provides malloc in pid when it is not libc (redis: jemalloc)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and ("libjemalloc" in parts[5] or "libtcmalloc" in parts[5]):
                    return parts[5]
    except OSError:
        pass
    return None


class RedisWorkload(Workload):
    name, unit, higher_is_better = "redis", "requests/s", True

    def __init__(self, requests: int, tests: str, clients: int, keyspace: int, datasize: int) -> None:
        self.requests, self.tests, self.clients = requests, tests, clients
        self.keyspace, self.datasize = keyspace, datasize

    def prepare(self, tmp: Path) -> None:
        for exe in ("redis-server", "redis-benchmark", "redis-cli"):
            if not shutil.which(exe):
                raise SystemExit(f"{exe} not found: apt-get install redis-server redis-tools (make setup)")

    def header(self) -> str:
        return (
            f"redis-server {redis_version()} on 127.0.0.1, redis-benchmark -t {self.tests} -n {self.requests} "
            f"-c {self.clients} -P 1 -r {self.keyspace} -d {self.datasize}; requests/s over all tests "
            f"(total requests / total time)"
        )

    def start_server(self, tmp: Path) -> tuple[subprocess.Popen, int]:
        port = free_port()
        d = tmp / f"redis-{port}"
        d.mkdir(exist_ok=True)
        srv = subprocess.Popen(
            redis_server_cmd("redis-server", port, "--bind", "127.0.0.1", "--dir", str(d), "--protected-mode", "yes"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_redis(srv, port)
        return srv, port

    def benchmark(self, port: int) -> tuple[float, dict]:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(
            [
                "redis-benchmark",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-t",
                self.tests,
                "-n",
                str(self.requests),
                "-c",
                str(self.clients),
                "-P",
                "1",
                "-r",
                str(self.keyspace),
                "-d",
                str(self.datasize),
                "--csv",
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        rps = {}
        for row in csv.DictReader(io.StringIO(p.stdout)):
            try:
                rps[row["test"]] = float(row["rps"])
            except (KeyError, ValueError):
                pass
        if p.returncode != 0 or not rps or any(v <= 0 for v in rps.values()):
            raise TrialError(f"redis-benchmark failed: {(p.stderr.strip() or p.stdout.strip())[-120:]}")
        total = self.requests * len(rps) / sum(self.requests / v for v in rps.values())
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the client's CPU per request: it pays the system-call tax of syscall tracepoints too
        used = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        rps["client_us"] = 1e6 * used / (self.requests * len(rps))
        return total, rps

    def run(self, cfg: str, tmp: Path) -> Trial:
        srv, port = self.start_server(tmp)
        tracer = None
        mon = None
        ht = None
        try:
            if cfg == "heaptrack":
                ht = subprocess.Popen(
                    ["heaptrack", "-o", str(tmp / f"heaptrack-redis-{port}"), "-p", str(srv.pid)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
                mon = TracerMonitor(ht.pid, {srv.pid})
                log: list[str] = []
                try:
                    read_line(ht, "injection finished", timeout=120, keep=log)
                except TrialError:
                    raise TrialError(
                        "heaptrack -p (gdb injection) failed: " + (log[-1][:100] if log else "no output")
                    ) from None
                if srv.poll() is not None:
                    raise TrialError("redis-server died during heaptrack's gdb injection")
                threading.Thread(target=lambda: [None for _ in ht.stdout], daemon=True).start()
                settle(mon)
            elif cfg != "untraced":
                tracer = start_attach_tracer(cfg, srv.pid, tmp, allocator_object(srv.pid))
                mon = tracer.monitor
            cpu0 = mon.cpu_total() if mon else 0.0
            tcpu0 = proc_cpu(srv.pid) or 0.0
            ns0 = sched_cpu(srv.pid) or 0.0
            metric, rps = self.benchmark(port)
            cpu_work = (mon.cpu_total() - cpu0) if mon else 0.0
            tcpu, ns1 = proc_cpu(srv.pid), sched_cpu(srv.pid)
            n = self.requests * len([k for k in rps if k.isupper()])
            rps = {
                **rps,
                "target_cpu": (tcpu - tcpu0) if tcpu is not None else float("nan"),
                # the server's CPU per request (schedstat, ns): what the tracer costs it in-process
                "target_us": 1e6 * (ns1 - ns0) / n if ns1 is not None else float("nan"),
                "tracer_us": 1e6 * cpu_work / n,
            }
            if tracer is not None:
                cpu, rss = finish_tracer(tracer)
                rps["bpf"] = dict(LAST_BPF_STATS)
                tracer = None
            stop_process(srv, signal.SIGTERM, 60)
            if ht is not None:
                try:
                    ht.wait(300)  # the interpreter finishes once redis has exited
                except subprocess.TimeoutExpired:
                    stop_process(ht, signal.SIGKILL)
                cpu, rss = mon.stop()
                mon = None
            elif cfg == "untraced":
                cpu, rss = 0.0, 0.0
            return Trial(metric, cpu_work, cpu, rss, rps)
        finally:
            if tracer is not None:
                finish_tracer(tracer)
            stop_process(srv, signal.SIGKILL, 30)
            if ht is not None:
                stop_process(ht, signal.SIGKILL, 30)
                if mon is not None:
                    mon.stop()


def redis_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
        v = next((w[2:] for w in out.split() if w.startswith("v=")), "?")
        m = next((w[7:] for w in out.split() if w.startswith("malloc=")), "?")
        return f"{v} ({m})"
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------
# table and goals


def fmt_metric(v: float, unit: str) -> str:
    return f"{v:.3f}" if unit == "seconds" else f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def cost(w: Workload, m: float, base: float) -> float:
    """Time a configuration adds per unit of work, relative to the untraced run (0 = free)."""
    return base / m - 1 if w.higher_is_better else m / base - 1


def report(
    w: Workload, configs: list[str], results: dict[str, list[Trial]], errors: dict[str, list[str]], rounds: int
) -> dict[str, dict]:
    """Prints the table; returns per configuration that ran: median metric, cost, tracer CPU
    during the work, and that CPU as a share of the target's."""
    med: dict[str, dict] = {}
    for c in configs:
        ts = results[c]
        if not ts:
            continue
        tcpu = [t.detail.get("target_cpu", float("nan")) for t in ts]
        share = [t.cpu_work / x for t, x in zip(ts, tcpu) if x == x and x > 0]
        med[c] = {
            "metric": statistics.median(t.metric for t in ts),
            "cpu_work": statistics.median(t.cpu_work for t in ts),
            "cpu_share": statistics.median(share) if share else float("nan"),
        }
    base = med.get("untraced", {}).get("metric")
    for m in med.values():
        m["cost"] = cost(w, m["metric"], base) if base else float("nan")
    ratio_head = "kept" if w.higher_is_better else "slowdown"
    print(
        f"\n{w.header()}\n{rounds} interleaved rounds, medians; cost = time added per unit of work "
        f"(untraced = 0); x floor = cost / the cost of its trap floor (the same probes, programs "
        f"returning at once); tracer CPU = its processes' CPU seconds during the work (and as a share "
        f"of the target's CPU then), total = start-up and shutdown too; peak RSS = VmHWM"
    )
    tests = [x.upper() for x in w.tests.split(",")] if isinstance(w, RedisWorkload) else []
    head = (
        f"{'configuration':26s} {w.unit:>13s} {ratio_head:>9s} {'x floor':>8s} {'CPU work s':>10s} "
        f"{'% target':>8s} {'CPU total s':>11s} {'peak MiB':>8s}"
        + "".join(f" {k + ' kept':>10s}" for k in tests)
        + "  runs"
    )
    print(head)
    base_detail = (
        {k: statistics.median(t.detail[k] for t in results["untraced"] if k in t.detail) for k in tests}
        if results.get("untraced")
        else {}
    )
    for c in configs:
        ts = results[c]
        if not ts:
            why = errors[c][-1] if errors[c] else "not run"
            print(f"{c:26s} {'n/a':>13s}   {why}")
            continue
        m = med[c]
        r = (
            (f"{m['metric'] / base * 100:8.1f}%" if w.higher_is_better else f"{m['metric'] / base:8.2f}x")
            if base
            else f"{'-':>9s}"
        )
        fl = med.get(FLOOR_OF.get(c, ""))
        xf = f"{m['cost'] / fl['cost']:7.2f}x" if fl and fl["cost"] > 0 else f"{'-':>8s}"
        share = (
            f"{m['cpu_share'] * 100:7.1f}%" if m["cpu_share"] == m["cpu_share"] and c != "untraced" else f"{'-':>8s}"
        )
        cols = ""
        for k in tests:
            vals = [t.detail[k] for t in ts if k in t.detail]
            cols += (
                f" {statistics.median(vals) / base_detail[k] * 100:9.1f}%"
                if vals and base_detail.get(k)
                else f" {'-':>10s}"
            )
        print(
            f"{c:26s} {fmt_metric(m['metric'], w.unit):>13s} {r} {xf} {m['cpu_work']:10.2f} {share} "
            f"{statistics.median(t.cpu_total for t in ts):11.2f} {statistics.median(t.rss_mib for t in ts):8.0f}"
            f"{cols}  {len(ts)}/{rounds}"
        )
        if errors[c]:
            print(f"{'':26s}   {len(errors[c])} failed: {errors[c][-1]}")
    if isinstance(w, RedisWorkload):
        print(
            "CPU per request (µs; medians): server (schedstat, all threads), client (redis-benchmark, rusage), "
            "tracer (its processes); + = over untraced"
        )
        base_us = (
            {
                k: statistics.median(t.detail[k] for t in results["untraced"] if k in t.detail)
                for k in ("target_us", "client_us")
            }
            if results.get("untraced")
            else {}
        )
        for c in configs:
            ts = results[c]
            if not ts:
                continue
            cols = []
            for k in ("target_us", "client_us", "tracer_us"):
                vals = [t.detail[k] for t in ts if k in t.detail and t.detail[k] == t.detail[k]]
                if not vals:
                    continue
                m = statistics.median(vals)
                d = f" (+{m - base_us[k]:.2f})" if k in base_us and c != "untraced" else ""
                cols.append(f"{k[:-3]} {m:.2f}{d}")
            print(f"  {c:26s} " + ", ".join(cols))
    paired_lines(w, configs, results)
    stats = {c: [t.detail["bpf"] for t in results[c] if t.detail.get("bpf")] for c in configs}
    if any(stats.values()):
        print("BPF run time per program (kernel.bpf_stats_enabled; whole recording, median of rounds):")
        for c, runs in stats.items():
            if not runs:
                continue
            progs = sorted({p for r in runs for p in r})
            parts = []
            for p in progs:
                ns = statistics.median(r[p]["run_time_ns"] for r in runs if p in r)
                cnt = statistics.median(r[p]["run_cnt"] for r in runs if p in r)
                parts.append(f"{p} {cnt:,.0f} runs {ns / max(cnt, 1):,.0f} ns")
            print(f"  {c}: " + "; ".join(parts))
    return med


def paired_lines(w: Workload, configs: list[str], results: dict[str, list[Trial]]) -> None:
    """Each trial against the untraced trial of its own round (the drift of a busy box cancels):
    median and min-max of those ratios; and the target's own CPU seconds over the work."""
    base = {t.detail.get("round"): t for t in results.get("untraced", [])}
    print(
        "paired: each trial / its round's untraced trial (median, min-max); target CPU s over the work (median, "
        "and / untraced's, paired)"
    )
    for c in configs:
        if c == "untraced" or not results[c]:
            continue
        pairs = [(t, base[t.detail.get("round")]) for t in results[c] if t.detail.get("round") in base]
        if not pairs:
            continue
        rs = [t.metric / u.metric for t, u in pairs]
        cs = [
            t.detail["target_cpu"] / u.detail["target_cpu"]
            for t, u in pairs
            if t.detail.get("target_cpu", 0) > 0 and u.detail.get("target_cpu", 0) > 0
        ]
        cpu = statistics.median(t.detail.get("target_cpu", float("nan")) for t, _ in pairs)
        label = "kept" if w.higher_is_better else "slowdown"
        shown = (lambda x: f"{x * 100:.1f} %") if w.higher_is_better else (lambda x: f"{x:.3f}x")
        print(
            f"  {c:26s} {label} {shown(statistics.median(rs))} ({shown(min(rs))}-{shown(max(rs))}), "
            f"{len(rs)} pairs; target CPU {cpu:.2f} s" + (f" ({statistics.median(cs):.3f}x)" if cs else "")
        )


def check_goals(w: Workload, med: dict[str, dict]) -> None:
    """The goals of issue #11, from this run's medians."""
    lines = []

    def kept(cfg: str) -> float | None:
        return med[cfg]["metric"] / med["untraced"]["metric"] * 100 if cfg in med and "untraced" in med else None

    def slowdown(cfg: str) -> float | None:
        return med[cfg]["metric"] / med["untraced"]["metric"] if cfg in med and "untraced" in med else None

    def goal(text: str, value: float | None, ok: bool, shown: str) -> None:
        lines.append(f"  {text}: " + ("not measured" if value is None else f"{shown} -> {'MET' if ok else 'NOT MET'}"))

    def xfloor(cfg: str) -> float | None:
        fl = med.get(FLOOR_OF.get(cfg, ""))
        return med[cfg]["cost"] / fl["cost"] if cfg in med and fl and fl["cost"] > 0 else None

    if w.name == "loop":
        a, m = slowdown("allocscope"), slowdown("memleak")
        goal(
            "full <= 1/5 of memleak's slowdown",
            a if m else None,
            bool(a and m and a <= m / 5),
            f"allocscope {a or 0:.1f}x vs memleak {m or 0:.1f}x / 5 = {(m or 0) / 5:.1f}x",
        )
        r = slowdown("allocscope-residency")
        goal("residency <= 1.05x", r, bool(r and r <= 1.05), f"{r or 0:.3f}x")
    elif w.name == "redis":
        k = kept("allocscope-residency")
        goal("residency keeps >= 95 %", k, bool(k and k >= 95), f"{k or 0:.1f} %")
        for cfg, label in (("allocscope", "full"), ("allocscope-sampled", "sampled")):
            x = xfloor(cfg)
            goal(f"{label} within 1.25x of the trap floor's cost", x, bool(x and x <= 1.25), f"{x or 0:.2f}x")
    elif w.name != "brief":
        k = kept("allocscope-residency")
        goal("residency keeps >= 97 %", k, bool(k and k >= 97), f"{k or 0:.1f} %")
        k, m = kept("allocscope"), kept("memleak")
        goal(
            "full keeps >= 95 % and >= memleak",
            k,
            bool(k and k >= 95 and (m is None or k >= m)),
            f"{k or 0:.1f} % (memleak {'-' if m is None else f'{m:.1f} %'})",
        )
        sh = med.get("allocscope-residency", {}).get("cpu_share")
        goal(
            "residency: tracer CPU during the work <= 3 % of the daemon's",
            sh if sh == sh else None,
            bool(sh is not None and sh == sh and sh <= 0.03),
            f"{(sh or 0) * 100:.1f} %",
        )
    print("goals (issue #11):")
    print("\n".join(lines))
    lines.clear()
    k, h = kept("allocscope-inject"), kept("heaptrack")
    if w.name == "redis":
        goal(
            "--inject --sample-bytes 524288 keeps >= 95 % and >= heaptrack -p",
            k,
            bool(k and k >= 95 and (h is None or k >= h)),
            f"{k or 0:.1f} % (heaptrack -p {'-' if h is None else f'{h:.1f} %'})",
        )
    elif w.name == "loop":
        s = slowdown("allocscope-inject")
        x = xfloor("allocscope-inject")
        goal("--inject <= 1.2x", s, bool(s and s <= 1.2), f"{s or 0:.2f}x untraced ({x or 0:.3f}x the trap floor)")
    elif w.name == "demo":
        goal("--inject keeps >= 97 %", k, bool(k and k >= 97), f"{k or 0:.1f} %")
    if lines:
        print("goals (issue #24):")
        print("\n".join(lines))
    lines.clear()
    for cfg in ("allocscope-watch", "allocscope-residency"):  # the watch's default mode
        if w.name == "brief":
            s = slowdown(cfg)
            goal(f"{cfg} <= 1.02x", s, bool(s and s <= 1.02), f"{s or 0:.3f}x")
        elif w.name in ("redis", "demo"):
            k = kept(cfg)
            goal(f"{cfg} keeps >= 98 %", k, bool(k and k >= 98), f"{k or 0:.1f} %")
    if lines:
        print("goals (issue #50, medians; the paired ratios above are the steadier figure):")
        print("\n".join(lines))


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["loop", "redis", "demo", "demo-large", "brief", "all"], default="all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", help="comma-separated subset of configurations (untraced is always run)")
    ap.add_argument("--iters", type=int, default=300000, help="loop: iterations per thread (1 malloc + 1 free each)")
    ap.add_argument("--threads", type=int, default=2, help="loop: threads")
    ap.add_argument("--requests", type=int, default=50000, help="redis: requests per test (-n)")
    ap.add_argument("--tests", default="set,get,lpush,lpop", help="redis: redis-benchmark -t")
    ap.add_argument("--clients", type=int, default=50, help="redis: parallel connections (-c)")
    ap.add_argument("--keyspace", type=int, default=100000, help="redis: random key space (-r)")
    ap.add_argument("--datasize", type=int, default=64, help="redis: value size in bytes (-d)")
    ap.add_argument("--brief-iters", type=int, default=60, help="brief: iterations per thread (one buffer each)")
    ap.add_argument("--brief-mib", type=int, default=40, help="brief: MiB per buffer")
    ap.add_argument("--partitions", type=int, default=200, help="demo: partitions to prove")
    ap.add_argument(
        "--demo-args",
        default="--synth-ms 0 --gpu-ms 0 --pw 3",
        help="demo: further provingd flags (the paced daemon of `allocscope demo`: '')",
    )
    ap.add_argument(
        "--large-args",
        default="--synth-ms 0 --gpu-ms 0 --pw 4 --workers 16 --partition-mb 128",
        help="demo-large: provingd flags of the mission-scale daemon",
    )
    ap.add_argument("--large-partitions", type=int, default=24, help="demo-large: partitions to prove")
    ap.add_argument(
        "--bpf-stats",
        action="store_true",
        help="turn on kernel.bpf_stats_enabled for the run and print BPF run time per program",
    )
    ap.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="an ad-hoc allocscope configuration: NAME (allocscope-... or floor-...) recording with "
        "the `record` arguments ARGS, e.g. allocscope-res-i10='--mode residency --interval 10'; "
        "repeatable; run when named in --configs (or always without --configs); priced against "
        "floor-residency when ARGS has --mode residency, else floor; ARGS starting @EXE: recorded "
        "by EXE (an executable named allocscope: another build, side by side)",
    )
    ap.add_argument(
        "--allocscope",
        default="",
        help="an allocscope executable (a bundle's bin/allocscope); default: this checkout's",
    )
    ap.add_argument("--bins", type=Path, help="brief and demo: brief_shape and provingd built elsewhere (no gcc here)")
    ap.add_argument("--no-memleak", action="store_true")
    ap.add_argument("--no-heaptrack", action="store_true")
    ap.add_argument(
        "--unwind",
        action="store_true",
        help="instead: DWARF vs frame-pointer unwinding cost per allocation on a no-frame-pointer "
        "build at stack depth 8 and 32 (bench/unwind_cost.py)",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/overhead.py: run as root (it attaches BPF probes)")
    global ALLOCSCOPE, BINS
    ALLOCSCOPE, BINS = args.allocscope, args.bins
    if args.unwind:
        sys.path.insert(0, str(HERE))
        from unwind_cost import main as unwind_cost

        unwind_cost(["--rounds", str(args.rounds), "--threads", str(args.threads)])
        return

    configs = ["untraced", *ALLOCSCOPE_CONFIGS]
    optional = dict(EXTRA_CONFIGS)
    for d in args.define:
        name, sep, extra = d.partition("=")
        name = name.strip()
        if not sep or not name.startswith(("allocscope-", "floor-")) or name in ALLOCSCOPE_CONFIGS:
            sys.exit(f"--define {d!r}: expected NAME=ARGS with a new NAME starting allocscope- or floor-")
        words = shlex.split(extra)
        if words and words[0].startswith("@"):  # another build side by side: @EXE, an allocscope executable
            EXTRA_EXES[name] = words.pop(0)[1:]
            if Path(EXTRA_EXES[name]).name != "allocscope" or not os.access(EXTRA_EXES[name], os.X_OK):
                sys.exit(f"--define {d!r}: @EXE must be an executable named allocscope")
        EXTRA_CONFIGS[name] = words
        optional[name] = EXTRA_CONFIGS[name]
        if name.startswith("allocscope-"):
            FLOOR_OF[name] = "floor-residency" if "residency" in EXTRA_CONFIGS[name] else "floor"
        if not args.configs:
            configs.append(name)
    skipped: dict[str, str] = {}
    if not args.no_memleak:
        if shutil.which("memleak-bpfcc"):
            configs += list(MEMLEAK_CONFIGS)
        else:
            skipped.update(dict.fromkeys(MEMLEAK_CONFIGS, "memleak-bpfcc not installed (apt-get install bpfcc-tools)"))
    if not args.no_heaptrack:
        if shutil.which("heaptrack"):
            configs.append("heaptrack")
        else:
            skipped["heaptrack"] = "not installed (make bench installs it: scripts/setup-bench.sh)"
    if args.configs:
        want = {c.strip() for c in args.configs.split(",")} | {"untraced"}
        unknown = want - set(configs) - set(skipped) - set(optional)
        if unknown:
            sys.exit(f"unknown configuration(s): {', '.join(sorted(unknown))}")
        configs = [c for c in configs + list(optional) if c in want]
        skipped = {c: why for c, why in skipped.items() if c in want}

    names = ["loop", "redis", "demo", "demo-large"] if args.workload == "all" else [args.workload]
    workloads: list[Workload] = []
    for n in names:
        if n == "loop":
            workloads.append(LoopWorkload(args.iters, args.threads))
        elif n == "redis":
            workloads.append(RedisWorkload(args.requests, args.tests, args.clients, args.keyspace, args.datasize))
        elif n == "brief":
            workloads.append(BriefWorkload(args.brief_iters, args.threads, args.brief_mib))
        elif n == "demo":
            workloads.append(DemoWorkload(args.partitions, args.demo_args.split()))
        else:
            workloads.append(DemoWorkload(args.large_partitions, args.large_args.split(), "demo-large"))
    stats_was = None
    if args.bpf_stats:
        stats_was = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    try:
        run_all(args, workloads, configs, skipped)
    finally:
        if stats_was is not None:
            Path("/proc/sys/kernel/bpf_stats_enabled").write_text(stats_was)


def run_all(args, workloads: list[Workload], configs: list[str], skipped: dict[str, str]) -> None:

    print(
        f"bench/overhead.py {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.uname().nodename}, kernel "
        f"{os.uname().release}, {os.cpu_count()} CPUs",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="allocscope-overhead-") as td:
        tmp = Path(td)
        for w in workloads:
            w.prepare(tmp)
            results: dict[str, list[Trial]] = {c: [] for c in configs}
            errors: dict[str, list[str]] = {c: [] for c in configs}
            for r in range(args.rounds):
                for c in configs:
                    try:
                        t = w.run(c, tmp)
                    except TrialError as e:
                        errors[c].append(str(e))
                        print(f"{w.name} round {r + 1}/{args.rounds} {c:21s} FAILED: {e}", file=sys.stderr)
                        continue
                    t.detail["round"] = r
                    results[c].append(t)
                    print(
                        f"{w.name} round {r + 1}/{args.rounds} {c:21s} {fmt_metric(t.metric, w.unit):>12s} "
                        f"{w.unit}  tracer CPU {t.cpu_work:.2f}/{t.cpu_total:.2f} s, peak {t.rss_mib:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
                    for f in tmp.glob("bench-*.allocscope"):  # traces are not kept
                        shutil.rmtree(f, ignore_errors=True)
                    for f in tmp.glob("heaptrack-*"):
                        f.unlink(missing_ok=True)
            if not results["untraced"]:
                print(f"\n{w.name}: the untraced runs failed ({errors['untraced'][-1]}); no table", flush=True)
                continue
            med = report(w, configs, results, errors, args.rounds)
            for c, why in skipped.items():
                print(f"{c:21s} {'n/a':>13s}   {why}")
            check_goals(w, med)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
