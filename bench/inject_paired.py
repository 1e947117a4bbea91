#!/usr/bin/env python3
"""`--inject` on one running daemon, window by window (issue #33): untraced, attached, detached.

    sudo .venv/bin/python bench/inject_paired.py ALLOCSCOPE OUT.md [--bins BINS] [--rounds 8]
                                                 [--modes inject] [--workloads redis,rustd]

bench/inject_floor.py starts a fresh server per trial, so each ratio also holds the difference
between two processes (address-space layout, cache colouring, which CPU's caches were warm): on
this box that alone spreads the untraced trials by several per cent. Here, as a user meets it,
ONE server runs throughout and allocscope attaches to it and detaches again:

    U  M1  U  M2  U  M1  U ...    (U: untraced window; M: a window with `record MODE` attached)

Each traced window is compared with the mean of the untraced windows just before and after it
(so a drift of the machine or of the daemon's state over the run cancels), and the figure per
mode is the median of those ratios (min-max). A window starts once the tracer has written its
first interval and gone idle (the attach and the injection are not timed: they happen once), and
ends before it is stopped. Per window: the throughput (redis-benchmark -t set,get,lpush requests/s;
rustd's own request counter), the server's CPU per request (/proc/PID/task/*/schedstat) and the
tracer's CPU per second. The untraced windows after the first detach run with the agent's library
still mapped but every hook restored (allocscope's detach), which is what a user's daemon runs
after a recording. heaptrack -p cannot detach, so it is not in this design (bench/inject_floor.py
has it). The same CPU layout as bench/inject_floor.py. Needs root.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import TrialError, finish_results, sched_cpu, stop_process
from inject_floor import MODES, Bench, Redis, Rustd, Tracer, physical_cpus

REPLACE = {"heaptrack"}  # modes that cannot detach


def window(wl, srv, handle: int, tr: Tracer | None) -> dict:
    """One measured window of the running server: throughput, CPU per request, tracer CPU/s."""
    pid = srv.pid
    c0, t0, tc0 = sched_cpu(pid), time.monotonic(), tr.cpu() if tr else 0.0
    if isinstance(wl, Redis):
        rps = wl.load(handle, wl.requests)
        c1, t1, tc1 = sched_cpu(pid), time.monotonic(), tr.cpu() if tr else 0.0
        n = wl.requests * len(rps)
        metric = n / sum(wl.requests / v for v in rps.values())
    else:
        s0 = wl.stats(srv)
        c0, t0, tc0 = sched_cpu(pid), time.monotonic(), tr.cpu() if tr else 0.0
        time.sleep(wl.seconds)
        s1 = wl.stats(srv)
        c1, t1, tc1 = sched_cpu(pid), time.monotonic(), tr.cpu() if tr else 0.0
        n = s1["requests"] - s0["requests"]
        metric = n / (t1 - t0)
    if c0 is None or c1 is None:
        raise TrialError("the server is gone")
    return {"metric": metric, "cpu_us": 1e6 * (c1 - c0) / n, "tracer_ms_per_s": 1000 * (tc1 - tc0) / (t1 - t0)}


def paired(b: Bench, wl, modes: list[str], rounds: int) -> dict[str, list[dict]]:
    """U M U M ... on one server; returns per mode the traced windows with their ratios."""
    srv, handle = wl.start()
    out: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        if isinstance(wl, Redis):
            wl.load(handle, max(1000, wl.requests // 4))  # warm-up: the key space filled
        else:
            time.sleep(1.0)
        window(wl, srv, handle, None)  # one unmeasured window: caches, frequency
        seq = [m for r in range(rounds) for m in (modes[r % len(modes) :] + modes[: r % len(modes)])]
        before = window(wl, srv, handle, None)
        for i, mode in enumerate(seq):
            tr = Tracer(b, mode, srv.pid, f"{wl.name}-{mode}-{i}")
            try:
                traced = window(wl, srv, handle, tr)
                traced["meta"] = tr.finish()
            finally:
                tr.kill()
            time.sleep(0.5)  # the detach's restore done, the tracer gone
            after = window(wl, srv, handle, None)
            base = (before["metric"] + after["metric"]) / 2
            cpu_base = (before["cpu_us"] + after["cpu_us"]) / 2
            traced.update(
                kept=traced["metric"] / base,
                cpu_ratio=traced["cpu_us"] / cpu_base,
                base=base,
                drift=after["metric"] / before["metric"],
            )
            out[mode].append(traced)
            b.say(
                f"  {wl.name} {i + 1}/{len(seq)} {mode}: {traced['metric']:,.0f}/s vs untraced "
                f"{before['metric']:,.0f} & {after['metric']:,.0f}: kept {traced['kept'] * 100:.1f} %, "
                f"CPU/request {traced['cpu_ratio'] * 100:.1f} %, tracer {traced['tracer_ms_per_s']:.1f} ms/s"
            )
            before = after
    finally:
        stop_process(srv, signal.SIGKILL, 30)
    return out


def spread(vals: list[float]) -> str:
    if not vals:
        return "-"
    return f"{statistics.median(vals) * 100:.1f} % ({min(vals) * 100:.1f}–{max(vals) * 100:.1f})"


def table(b: Bench, name: str, res: dict[str, list[dict]]) -> list[str]:
    b.say(
        f"\n| {name}: mode | windows | throughput kept (median, min–max) | CPU/request vs untraced | "
        "tracer CPU (ms/s) | untraced drift across a window (median, min–max) |"
    )
    b.say("|---|---|---|---|---|---|")
    goals = []
    for mode, ws in res.items():
        if not ws:
            continue
        kept = [w["kept"] for w in ws]
        b.say(
            f"| {mode} | {len(ws)} | {spread(kept)} | {spread([w['cpu_ratio'] for w in ws])} | "
            f"{statistics.median(w['tracer_ms_per_s'] for w in ws):.1f} | {spread([w['drift'] for w in ws])} |"
        )
        goals.append(f"{name} {mode}: {statistics.median(kept) * 100:.1f} %")
    return goals


def say_header(b: Bench, title: str) -> None:
    """The results file's title, the command and the machine (CPUs, kernel, load, layout)."""
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    b.say(f"## {title} — {time.strftime('%Y-%m-%d %H:%M')}\n")
    b.say(f"Command: `{' '.join(sys.argv)}`\n")
    b.say(
        f"Machine: {os.cpu_count()} CPUs ({len(physical_cpus())} physical cores usable), kernel "
        f"{platform.release()}, load average at the start {' '.join(load0)}. CPUs: {b.cpus.describe()}.\n"
    )


def common_args(ap: argparse.ArgumentParser) -> None:
    """The arguments every inject_*.py bench on one daemon takes: allocscope, the results file,
    where the daemons are."""
    ap.add_argument("allocscope")
    ap.add_argument("out", help="markdown results file")
    ap.add_argument("--bins", help="rustd built by bench/inject_floor.py --build-bins")
    ap.add_argument("--redis-dir", help="redis-server, redis-benchmark and the libraries they need")


def run_workloads(b: Bench, a: argparse.Namespace, measure, summary: str, work: Path, keep: bool) -> None:
    """Each of a.workloads: its header, then `measure(name, workload)` (its summary lines); the
    summary line, the load at the end; the results file written whatever happened."""
    goals: list[str] = []
    try:
        wls = {"redis": Redis(b, a.requests), "rustd": Rustd(b, a.seconds)}
        for name in a.workloads.split(","):
            b.say(f"### {name}: {wls[name].header()}\n")
            goals += measure(name, wls[name])
            b.say()
        b.say(summary + "; ".join(goals) + ".")
        b.say(f"\nLoad average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}.")
    finally:
        finish_results(a.out, b.lines, work, keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=100000, help="redis-benchmark -n per test and window")
    ap.add_argument("--seconds", type=float, default=5.0, help="rustd's window")
    ap.add_argument("--rustd-threads", type=int, help="default: 8 on >= 8 CPUs (or fewer), else 4")
    ap.add_argument("--modes", default="inject", help="comma-separated, of " + ", ".join(set(MODES) - REPLACE))
    ap.add_argument("--define", action="append", default=[], metavar="NAME=ARGS", help="as bench/inject_floor.py")
    ap.add_argument("--workloads", default="redis,rustd")
    ap.add_argument("--workdir", help="keep the traces here (default: a temporary directory, removed)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/inject_paired.py: run as root (it attaches BPF probes and injects)")
    for d in a.define:
        name, _, extra = d.partition("=")
        MODES[name.strip()] = extra.split()
    modes = [m for m in a.modes.split(",") if m in MODES and m not in REPLACE and m != "untraced"]
    if not modes:
        ap.error(f"--modes: none of {a.modes!r} can attach and detach")
    a.no_estimates = True
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="inject-paired-"))
    work.mkdir(parents=True, exist_ok=True)
    b = Bench(a, work)
    b.cpus.client = b.cpus.client[:1]  # redis-benchmark is one thread: one CPU, no migrations
    say_header(b, "`--inject` on one running daemon, attached and detached")
    run_workloads(
        b,
        a,
        lambda name, wl: table(b, name, paired(b, wl, modes, a.rounds)),
        "Throughput kept, median over the traced windows: ",
        work,
        bool(a.workdir),
    )


if __name__ == "__main__":
    main()
