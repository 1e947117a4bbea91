#!/usr/bin/env python3
"""Slowdown of a malloc-heavy C loop: untraced vs allocscope vs memleak-bpfcc, in one run.

Configurations are interleaved (A B C A B C ...) so machine noise hits them alike; the table
shows medians and the ratio to the untraced median. The loop times its own work (the tracers'
start-up is not counted): it waits for SIGUSR1, sent once the tracer has attached.

    sudo .venv/bin/python bench/overhead.py [--rounds 5] [--iters 300000] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# allocscope configurations: name -> extra `record` arguments
ALLOCSCOPE_CONFIGS = {
    "allocscope": [],
    "allocscope-fp": ["--unwind", "fp"],
    "allocscope-sampled": ["--sample-bytes", "65536"],
    "allocscope-residency": ["--mode", "residency"],
}


def build(tmp: Path) -> Path:
    exe = tmp / "malloc_loop"
    subprocess.run(["gcc", "-O2", "-pthread", "-fno-omit-frame-pointer", "-o", str(exe),
                    str(HERE / "malloc_loop.c")], check=True)
    return exe


def read_line(p: subprocess.Popen, prefix: str, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.2)
        if r:
            line = p.stdout.readline()
            if line.startswith(prefix):
                return line.strip()
            if not line and p.poll() is not None:
                break
    raise RuntimeError(f"no {prefix!r} from {p.args}")


def cpu_seconds(pid: int) -> float:
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def run_once(exe: Path, cfg: str, args, tmp: Path) -> tuple[float, float]:
    """Returns (loop seconds, tracer CPU seconds during the loop)."""
    loop = subprocess.Popen([str(exe), "--wait-signal", "--iters", str(args.iters), "--threads", str(args.threads)],
                            stdout=subprocess.PIPE, text=True)
    read_line(loop, "ready")
    tracer = None
    try:
        if cfg.startswith("allocscope"):
            out = tmp / f"bench-{time.monotonic_ns()}.allocscope"
            extra = ALLOCSCOPE_CONFIGS[cfg]
            tracer = subprocess.Popen([sys.executable, "-m", "allocscope", "record", "-q", "--pid", str(loop.pid),
                                       "-o", str(out), *extra], cwd=str(ROOT), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
            while not (out / "meta.json").exists():
                if tracer.poll() is not None:
                    raise RuntimeError(tracer.stderr.read())
                time.sleep(0.05)
        elif cfg.startswith("memleak"):
            extra = {"memleak": [], "memleak-combined": ["--combined-only"], "memleak-s10": ["-s", "10"]}[cfg]
            # memleak prints "Attaching" before it compiles and attaches; its first periodic
            # report ("Top N stacks...") proves the probes are live.
            tracer = subprocess.Popen(["memleak-bpfcc", "-p", str(loop.pid), *extra, "2"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                read_line(tracer, "[", timeout=180)
            except RuntimeError:
                raise RuntimeError("memleak-bpfcc did not attach; python3-bpfcc 0.26 passes a garbage "
                                   "ref_ctr_offset, so it cannot probe malloc while any other uprobe "
                                   "(another allocscope, perf, bpftrace) sits on it: run on a quiet box") from None
        cpu0 = cpu_seconds(tracer.pid) if tracer else 0.0
        loop.send_signal(signal.SIGUSR1)
        secs = float(read_line(loop, "elapsed", timeout=600).split()[1])
        cpu = (cpu_seconds(tracer.pid) - cpu0) if tracer else 0.0
        return secs, cpu
    finally:
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            try:
                tracer.wait(60)
            except subprocess.TimeoutExpired:
                tracer.kill()
        if loop.poll() is None and tracer is not None and tracer.returncode not in (None, 0):
            loop.kill()  # the tracer failed before the loop was released
        try:
            loop.wait(60)
        except subprocess.TimeoutExpired:
            loop.kill()
            loop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300000, help="iterations per thread (1 malloc + 1 free each)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-memleak", action="store_true")
    ap.add_argument("--unwind", action="store_true",
                    help="instead: DWARF vs frame-pointer unwinding cost per allocation on a no-frame-pointer "
                         "build at stack depth 8 and 32 (bench/unwind_cost.py)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/overhead.py: run as root (it attaches BPF probes)")
    if args.unwind:
        from unwind_cost import main as unwind_cost  # noqa: PLC0415 (bench/ is on sys.path)
        unwind_cost(["--rounds", str(args.rounds), "--threads", str(args.threads)])
        return
    configs = ["untraced", *ALLOCSCOPE_CONFIGS]
    if not args.no_memleak:
        if shutil.which("memleak-bpfcc"):
            configs += ["memleak", "memleak-combined", "memleak-s10"]
        else:
            print("memleak-bpfcc not found (apt-get install bpfcc-tools); comparing without it", file=sys.stderr)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        exe = build(tmp)
        times: dict[str, list[float]] = {c: [] for c in configs}
        cpus: dict[str, list[float]] = {c: [] for c in configs}
        for r in range(args.rounds):
            for c in configs:
                s, cpu = run_once(exe, c, args, tmp)
                times[c].append(s)
                cpus[c].append(cpu)
                print(f"round {r + 1}/{args.rounds} {c:17s} {s:8.3f}s", file=sys.stderr)
    base = statistics.median(times["untraced"])
    calls = 2 * args.iters * args.threads
    print(f"\nmalloc-heavy loop: {args.threads} threads x {args.iters} iterations "
          f"({calls} malloc+free calls), {args.rounds} interleaved rounds, medians")
    print(f"{'configuration':18s} {'seconds':>9s} {'slowdown':>9s} {'ns/call added':>14s} {'tracer CPU s':>13s}")
    for c in configs:
        m = statistics.median(times[c])
        added = (m - base) / calls * 1e9
        print(f"{c:18s} {m:9.3f} {m / base:8.1f}x {added:14.0f} {statistics.median(cpus[c]):13.2f}")
    if "memleak" in times:
        ratio = statistics.median(times["memleak"]) / statistics.median(times["allocscope"])
        print(f"\nallocscope is {ratio:.1f}x faster than memleak-bpfcc (default mode) on this loop")


if __name__ == "__main__":
    main()
