#!/usr/bin/env python3
"""What a recording costs processes it does not trace: every system call on the machine.

    sudo .venv/bin/python bench/syscall_tax.py [--calls 2000000] [--rounds 3]

allocscope's mmap-family accounting hangs BPF programs on the syscalls:sys_{enter,exit}_{mmap,
munmap,mremap,madvise,brk} tracepoints. The kernel cannot enable one system call's tracepoint
alone: enabling any of them routes every system call of every task through the tracing path,
where a per-call check finds the call not traced. This script measures that tax: a loop of
getppid() calls (bench/syscalls.c) timed untraced and while allocscope records a *different*
process (a sleeper), in its trap-floor and real configurations, interleaved per round. The
ns per call added is what every process on the machine, the traced daemon and its clients
included, pays per system call while a recording runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import TrialError, attach_allocscope, kill_pid, stop_process

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = {
    "untraced": None,
    "floor-residency": ["--probe-floor", "--mode", "residency"],
    "allocscope-residency": ["--mode", "residency"],
    "floor": ["--probe-floor"],
    "allocscope": [],
    # the in-process sampler: the mmap family hooked in the target, no syscall tracepoint
    "allocscope-inject": ["--inject", "--sample-bytes", "524288"],
}


def loop(exe: Path, calls: int, runs: int = 3, best: bool = False) -> float:
    """Median ns per call of `runs` loops (best: the fastest, the least disturbed on a busy box:
    a tax is paid by every call, the fastest run included)."""
    out = []
    for _ in range(runs):
        p = subprocess.run([str(exe), str(calls)], capture_output=True, text=True, check=True)
        out.append(float(p.stdout.split()[1]))
    return min(out) if best else statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--best",
        type=int,
        default=0,
        metavar="RUNS",
        help="each trial the fastest of RUNS loops, not the median of 3 (a busy box)",
    )
    ap.add_argument("--configs", help="comma-separated subset of " + ", ".join(CONFIGS) + " (untraced always)")
    ap.add_argument("--root", default=str(ROOT), help="the allocscope checkout to run (default: this one)")
    ap.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="an ad-hoc configuration: NAME recording with the `record` arguments ARGS; a NAME "
        "starting 'other-' runs the checkout of --other-root (before/after in one run)",
    )
    ap.add_argument("--other-root", help="a second allocscope checkout, for the 'other-' configurations")
    args = ap.parse_args()
    for d in args.define:
        name, _, extra = d.partition("=")
        CONFIGS[name.strip()] = extra.split()
    if args.configs:
        want = {"untraced", *(c.strip() for c in args.configs.split(","))}
        for c in list(CONFIGS):
            if c not in want:
                del CONFIGS[c]
    if os.geteuid() != 0:
        sys.exit("bench/syscall_tax.py: run as root (it attaches BPF probes)")
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="allocscope-syscalls-") as td:
        tmp = Path(td)
        exe = tmp / "syscalls"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "syscalls.c")], check=True)
        for r in range(args.rounds):
            for cfg, flags in CONFIGS.items():
                sleeper = subprocess.Popen(["sleep", "infinity"])
                tracer = mon = None
                try:
                    if flags is not None:
                        tracer, mon = attach_allocscope(
                            sleeper.pid,
                            tmp / f"{cfg}-{r}.allocscope",
                            flags,
                            sys.executable,
                            args.other_root if cfg.startswith("other-") else args.root,
                        )
                    ns = loop(exe, args.calls, args.best or 3, bool(args.best))
                except TrialError as e:
                    sys.exit(f"{cfg}: {e}")
                finally:
                    stop_process(tracer)
                    if mon:
                        mon.stop()
                    kill_pid(sleeper.pid)
                    sleeper.wait()
                results[cfg].append(ns)
                print(f"round {r + 1}/{args.rounds} {cfg:22s} {ns:7.1f} ns a call", file=sys.stderr)
    base = statistics.median(results["untraced"])
    how = f"the fastest of {args.best} loops" if args.best else "3 loops, their median"
    print(
        f"getppid() loop, {args.calls:,} calls, {how} a trial, {args.rounds} interleaved rounds, medians; "
        "the tracer records another process"
    )
    print(f"{'configuration':22s} {'ns a call':>10s} {'added ns':>9s} {'x untraced':>10s}")
    for cfg, vals in results.items():
        m = statistics.median(vals)
        print(f"{cfg:22s} {m:10.1f} {m - base:9.1f} {m / base:9.2f}x")


if __name__ == "__main__":
    main()
