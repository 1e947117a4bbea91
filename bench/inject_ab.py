#!/usr/bin/env python3
"""`--inject` of two checkouts side by side on rustd --serve (issue 33): throughput and CPU per request.

One rustd --serve T a trial (tests/targets/rustd, jemalloc linked in as _rjem_*: its free is the
agent's as_h_free), untraced / recorded with `record --inject` by the checkout at --before /
by this one, interleaved per round (the order reversed every other round). Per trial: attach, 1 s
warm-up, requests counted by rustd itself over --seconds, its CPU (schedstat) per request. rustd
on the last CPU, the tracer on the first (as bench/inject_floor.py lays them out on 2 CPUs).

    sudo .venv/bin/python bench/inject_ab.py --before /path/to/other/checkout [--rounds 5] [--seconds 4]
(--before: a tree of the other revision, e.g. `git archive REV | tar -x -C DIR`; run with this venv)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
from benchlib import attach_allocscope, perf_by_symbol, read_line, sched_cpu, stop_process, write_lines  # noqa: E402


def stats(p: subprocess.Popen) -> dict:
    p.send_signal(signal.SIGUSR1)
    return json.loads(read_line(p, "stats", timeout=30).split(" ", 1)[1])


def hook_shares(data: Path) -> dict[str, float]:
    """Share of the process's perf samples in each of the agent's hooks (as_h_*)."""
    rep = perf_by_symbol(data)
    total, out = 0, {}
    for line in rep.splitlines():
        w = line.split()
        if len(w) >= 4 and w[2] in ("[.]", "[k]") and w[1].isdigit():
            total += int(w[1])
            if w[3].startswith("as_h_"):
                out[w[3]] = int(w[1])
    return {k: v / max(1, total) for k, v in out.items()}


def trial(
    rustd: str,
    threads: int,
    root: Path | None,
    seconds: float,
    cpus: tuple[int, int],
    tmp: Path,
    name: str,
    extra: list[str],
    perf: bool,
) -> dict:
    p = subprocess.Popen(
        ["taskset", "-c", str(cpus[1]), rustd, "--serve", str(threads)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tr = mon = None
    try:
        read_line(p, "ready", timeout=30)
        if root is not None:
            out = tmp / f"{name}.allocscope"
            tr, mon = attach_allocscope(p.pid, out, ["--force", "--inject", *extra], sys.executable, root)
        time.sleep(1.0)
        s0, c0, t0 = stats(p), sched_cpu(p.pid), time.monotonic()
        rec = None
        if perf and root is not None:
            rec = subprocess.Popen(
                [
                    "perf",
                    "record",
                    "-q",
                    "-F",
                    "1999",
                    "-p",
                    str(p.pid),
                    "-o",
                    str(tmp / f"{name}.perf"),
                    "--",
                    "sleep",
                    str(seconds),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(seconds)
        s1, c1, t1 = stats(p), sched_cpu(p.pid), time.monotonic()
        n = s1["requests"] - s0["requests"]
        res = {"rps": n / (t1 - t0), "cpu_us": 1e6 * (c1 - c0) / n}
        if rec is not None:
            rec.wait(60)
            res["hooks"] = hook_shares(tmp / f"{name}.perf")
        return res
    finally:
        if mon is not None:
            mon.stop()
        stop_process(tr)
        stop_process(p, signal.SIGTERM, 60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the other checkout's root")
    ap.add_argument("--rustd", help="rustd built already (default: build it, tests/rust_targets.py)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--sample-bytes", help="passed to both (default: theirs, 512 KiB)")
    ap.add_argument("--perf", action="store_true", help="perf record rustd while measured: the hooks' share")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.rustd is None:
        from rust_targets import build_rustd

        a.rustd = str(build_rustd())
    n = os.cpu_count() or 1
    cpus = (0, n - 1)
    extra = ["--sample-bytes", a.sample_bytes] if a.sample_bytes else []
    os.sched_setaffinity(0, {cpus[0]})  # the tracers (children) inherit it; rustd gets taskset
    configs = {"untraced": None, "inject-before": Path(a.before).resolve(), "inject-after": ROOT}
    res: dict[str, list[dict]] = {k: [] for k in configs}
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"Command: `bench/inject_ab.py {' '.join(sys.argv[1:])}`\n")
    say(
        f"Machine: {n} CPUs, load average at the start {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"rustd --serve {a.threads} on CPU {cpus[1]}, the tracer on CPU {cpus[0]}.\n"
    )
    with tempfile.TemporaryDirectory() as td:
        for r in range(a.rounds):
            order = list(configs) if r % 2 == 0 else list(configs)[::-1]
            for c in order:
                res[c].append(
                    trial(a.rustd, a.threads, configs[c], a.seconds, cpus, Path(td), f"{c}-{r}", extra, a.perf)
                )
                print(f"  round {r} {c}: {res[c][-1]}", flush=True)
    say(f"{a.rounds} rounds; per round the ratio to that round's untraced trial, then the median (min–max).\n")
    say("| config | req/s (median) | throughput kept | CPU µs / request | CPU / request vs untraced |")
    say("|---|---|---|---|---|")
    for c in configs:
        kept = [x["rps"] / u["rps"] for x, u in zip(res[c], res["untraced"], strict=True)]
        cpu = [x["cpu_us"] / u["cpu_us"] for x, u in zip(res[c], res["untraced"], strict=True)]
        say(
            f"| {c} | {statistics.median(x['rps'] for x in res[c]):,.0f} | {statistics.median(kept):.1%} "
            f"({min(kept):.1%}–{max(kept):.1%}) | {statistics.median(x['cpu_us'] for x in res[c]):.3f} | "
            f"{statistics.median(cpu):.1%} ({min(cpu):.1%}–{max(cpu):.1%}) |"
        )
    if a.perf:
        say(
            "\nThe agent's hooks, share of rustd's perf samples (perf record -F 1999 -p, the measured seconds; "
            "median over rounds, min–max; perf runs on CPU 0, its sampling interrupts cost both inject rows alike):\n"
        )
        say("| config | as_h_free | as_h_malloc | as_h_realloc |")
        say("|---|---|---|---|")
        for c in ("inject-before", "inject-after"):
            cells = []
            for h in ("as_h_free", "as_h_malloc", "as_h_realloc"):
                v = [x["hooks"].get(h, 0.0) for x in res[c]]
                cells.append(f"{statistics.median(v):.2%} ({min(v):.2%}–{max(v):.2%})")
            say(f"| {c} | {' | '.join(cells)} |")
    say(f"\nLoad average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    write_lines(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
