#!/usr/bin/env python3
"""What walking CPython's frames in the probe costs per allocation (issue 51, docs/python.md).

An allocation-heavy Python loop (bytearray(1024): one malloc each, made at a Python depth of
4 or 24 frames) under pyenv's CPython, attached with `record --pid`, three ways, interleaved
per round, medians of the loop's own wall time:
  untraced | traced, the walk off (ALLOCSCOPE_PYTHON=0) | traced, Python frames on
The walk's cost per event = (on - off) / mallocs, and, less noisy on a shared box, the BPF run
time of the allocation programs (alloc_*, kernel.bpf_stats_enabled on for the run) per malloc.
Also the frames the site got (a new stack is stored once; a known one costs the walk and one
lookup).

    sudo .venv/bin/python bench/python_frames.py [--rounds 3] [--iters 300000] [--depths 4,24]
        [--python ~/.pyenv/versions/3.12.1/bin/python3.12] [-o bench/results/....md]
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
from benchlib import read_line  # noqa: E402

LOOP = r"""
import signal, sys, threading, time
iters, depth = int(sys.argv[1]), int(sys.argv[2])
go = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: go.set())

def work(n):
    for _ in range(n):
        bytearray(1024)

def nest(d, n):
    if d <= 1:
        return work(n)
    return nest(d - 1, n)

print("ready", flush=True)
go.wait()
t = time.perf_counter()
nest(depth, iters)
print(f"done {time.perf_counter() - t:.6f}", flush=True)
go.clear()
go.wait()
"""
CONFIGS = ("untraced", "walk-off", "python")


def run_once(py: str, config: str, iters: int, depth: int, tmp: Path) -> tuple[float, dict]:
    prog = subprocess.Popen([py, "-c", LOOP, str(iters), str(depth)], stdout=subprocess.PIPE, text=True)
    read_line(prog, "ready")
    tracer, out, info = None, None, {}
    try:
        if config != "untraced":
            out = tmp / f"p-{time.monotonic_ns()}"
            env = dict(os.environ, ALLOCSCOPE_PYTHON="0" if config == "walk-off" else "1")
            tracer = subprocess.Popen(
                [sys.executable, "-m", "allocscope", "record", "-q", "--pid", str(prog.pid), "-o", str(out)],
                cwd=str(ROOT),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            end = time.monotonic() + 120
            while not (out / "meta.json").exists():
                if tracer.poll() is not None or time.monotonic() > end:
                    raise SystemExit(f"record failed: {tracer.stderr.read() if tracer.stderr else ''}")
                time.sleep(0.05)
            time.sleep(1.0)  # the unwind tables of what the first stacks cross
        prog.send_signal(signal.SIGUSR1)
        secs = float(read_line(prog, "done", timeout=600).split()[1])
        if tracer is not None:
            time.sleep(0.6)
            tracer.send_signal(signal.SIGINT)
            tracer.wait(120)
            info = summarize(out)
        return secs, info
    finally:
        prog.kill()
        prog.wait()
        if tracer is not None and tracer.poll() is None:
            tracer.kill()


def summarize(out: Path | None) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "allocscope", "report", str(out), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
    )
    if p.returncode:
        return {}
    rep = json.loads(p.stdout)
    best = max(rep["sites"], key=lambda s: s["alloc_count"], default=None)
    if best is None:
        return {}
    stats = json.loads((out / "meta.json").read_text()).get("bpf_stats") or {}
    alloc_ns = sum(v["run_time_ns"] for k, v in stats.items() if k.startswith(("alloc_", "salloc_")))
    return {
        "bpf_ns": alloc_ns / max(best["alloc_count"], 1) if stats else None,
        "allocs": best["alloc_count"],
        "frames": len(best["full_frames"]),
        "py_frames": sum(f["module"] == "python" for f in best["full_frames"]),
        "location": best["location"]["location"] if isinstance(best.get("location"), dict) else best.get("location"),
    }


def run_rounds(args, depths, times, infos, tmp: Path) -> None:
    for r in range(args.rounds):
        for depth in depths:
            for config in CONFIGS:
                secs, info = run_once(args.python, config, args.iters, depth, tmp)
                times.setdefault((config, depth), []).append(secs)
                infos.setdefault((config, depth), []).append(info)
                print(f"round {r + 1} depth {depth} {config}: {secs:.3f} s {info}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=300_000)
    ap.add_argument("--depths", default="4,24")
    ap.add_argument("--python", default=str(Path.home() / ".pyenv/versions/3.12.1/bin/python3.12"))
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    times: dict[tuple[str, int], list[float]] = {}
    infos: dict[tuple[str, int], list[dict]] = {}
    stats_file = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_was = stats_file.read_text().strip()
    stats_file.write_text("1")
    with tempfile.TemporaryDirectory() as td:
        try:
            run_rounds(args, depths, times, infos, Path(td))
        finally:
            stats_file.write_text(stats_was)
    lines = [
        f"python {args.python}, {args.iters} bytearray(1024) a run, {args.rounds} rounds, medians",
        "",
        "| Python depth | config | loop s | ns/alloc | +ns/alloc vs walk off | BPF ns/alloc (alloc_*) "
        "| site frames (Python) |",
        "|---|---|---|---|---|---|---|",
    ]
    bpf_ns: dict[tuple[str, int], list[float]] = {}
    for key, runs in infos.items():
        vals = [i["bpf_ns"] for i in runs if i.get("bpf_ns")]
        if vals:
            bpf_ns[key] = vals
    for depth in depths:
        off = statistics.median(times[("walk-off", depth)])
        for config in CONFIGS:
            med = statistics.median(times[(config, depth)])
            info = (infos.get((config, depth)) or [{}])[-1]
            extra = f"{(med - off) / args.iters * 1e9:+.0f}" if config == "python" else ""
            frames = f"{info.get('frames', '')} ({info.get('py_frames', '')})" if info else ""
            bpf = bpf_ns.get((config, depth))
            bpf_txt = f"{statistics.median(bpf):.0f}" if bpf else ""
            lines.append(
                f"| {depth} | {config} | {med:.3f} | {med / args.iters * 1e9:.0f} | {extra} | {bpf_txt} | {frames} |"
            )
    print("\n".join(lines))
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
