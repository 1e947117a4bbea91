#!/usr/bin/env python3
"""What walking CPython's frames in the probe costs per allocation (issue 51, docs/python.md).

An allocation-heavy Python loop (bytearray(1024): one malloc each, made at a Python depth of
4 or 24 frames) under pyenv's CPython, attached with `record --pid`, three ways, interleaved
per round, medians of the loop's own wall time:
  untraced | traced, the walk off (record --no-python-frames) | traced, Python frames on
The walk's cost per event = (on - off) / mallocs, and, less noisy on a shared box, the BPF run
time of the allocation programs (alloc_*, kernel.bpf_stats_enabled on for the run) per malloc.
Also the frames the site got (a new stack is stored once; a known one costs the walk and one
lookup).

    sudo .venv/bin/python bench/python_frames.py [--rounds 3] [--iters 300000] [--depths 4,24]
        [--python ~/.pyenv/versions/3.12.1/bin/python3.12] [-o bench/results/....md]

--workload torch: a torch CPU program (TORCH below: a small nn.Module's forward pass over batches
of mixed sizes made in a few Python functions, one tensor in 20 kept), same three ways, rotated
per round; over the timed window only (after a traced warm-up that builds libtorch's unwind
tables): its iterations/s, the allocation programs' BPF run time per event (run_cnt of
alloc_return = events), and the probe's own counters `pycounts` (walks, frames read, stacks
stored) read from the tracer's map; then the top 10 locations of the last traced run's report.

    sudo .venv/bin/python bench/python_frames.py --workload torch --python /tmp/torchenv/bin/python \
        [--rounds 5] [--iters 2000] [-o bench/results/....md]
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
from typing import Any

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

TORCH = r"""
import signal, sys, threading, time
import torch
iters = int(sys.argv[1])
torch.set_num_threads(1)
torch.manual_seed(0)
go = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: go.set())

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(x + self.b(torch.relu(self.a(x))))

model = Block()
kept = []

def make_batch(i):
    rows = 4 + (i % 13) * 6
    return torch.randn(rows, 64)

def features(x, i):
    extra = torch.zeros(x.shape[0], (i % 5) * 16 + 1)
    return torch.cat([x, extra], dim=1)[:, :64].contiguous()

def step(i):
    with torch.no_grad():
        y = model(features(make_batch(i), i))
    if i % 20 == 0:
        kept.append(y.clone())
        if len(kept) > 200:
            kept.pop(0)
    return y

def run(n):
    for i in range(n):
        step(i)

print("ready", flush=True)
go.wait(); go.clear()
run(max(iters // 10, 50))
print("warm", flush=True)
go.wait(); go.clear()
t = time.perf_counter()
run(iters)
print(f"done {time.perf_counter() - t:.6f}", flush=True)
go.wait()
"""
PYCOUNTS = ("walks", "frames", "stored", "lost", "cut")


def start_record(pid: int, config: str, out: Path) -> subprocess.Popen:
    """`allocscope record --pid PID -o OUT` (the walk off for config walk-off), once attached (its
    meta.json on disk)."""
    off = ["--no-python-frames"] if config == "walk-off" else []
    tracer = subprocess.Popen(
        [sys.executable, "-m", "allocscope", "record", "-q", *off, "--pid", str(pid), "-o", str(out)],
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    end = time.monotonic() + 120
    while not (out / "meta.json").exists():
        if tracer.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"record failed: {tracer.stderr.read() if tracer.stderr else ''}")
        time.sleep(0.05)
    return tracer


def run_once(py: str, config: str, iters: int, depth: int, tmp: Path) -> tuple[float, dict]:
    prog = subprocess.Popen([py, "-c", LOOP, str(iters), str(depth)], stdout=subprocess.PIPE, text=True)
    read_line(prog, "ready")
    tracer, out, info = None, None, {}
    try:
        if config != "untraced":
            out = tmp / f"p-{time.monotonic_ns()}"
            tracer = start_record(prog.pid, config, out)
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


def pycounts_of(pid: int) -> dict[str, int]:
    """The probe's `pycounts` (probes/python.h: walks, frames, stored, lost, cut), summed over
    CPUs, read from the tracer `pid`'s map (BPF_MAP_LOOKUP_ELEM); {} when it has none."""
    import ctypes as ct

    from tracer.bpf.objects import map_info, tracer_objects
    from tracer.bpf.syscall import MAP_GET_FD_BY_ID, IdAttr, KeyAttr, bpf

    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    ncpu = max(int(r.split("-")[-1]) for r in text.split(",")) + 1
    for mid in sorted(tracer_objects(pid)["maps"]):
        fd = bpf(MAP_GET_FD_BY_ID, IdAttr(id=mid))
        if fd < 0:
            continue
        try:
            if map_info(fd)[0] != "pycounts":
                continue
            out = {}
            for i, name in enumerate(PYCOUNTS):
                key, val = ct.c_uint32(i), (ct.c_uint64 * ncpu)()
                if bpf(1, KeyAttr(map_fd=fd, key=ct.addressof(key), next_key=ct.addressof(val))) == 0:  # LOOKUP_ELEM
                    out[name] = sum(val)
            return out
        finally:
            os.close(fd)
    return {}


def torch_once(py: str, config: str, iters: int, tmp: Path) -> dict:
    """One run of TORCH: its timed window's seconds and, traced, the window's BPF run time and
    runs per program and its pycounts (deltas); `trace` is the recording."""
    from tracer.bpf.objects import program_stats_of

    script = tmp / "torch_work.py"  # a file, so the report names torch_work.py:LINE
    if not script.exists():
        script.write_text(TORCH)
    prog = subprocess.Popen([py, str(script), str(iters)], stdout=subprocess.PIPE, text=True)
    tracer = None
    res: dict[str, Any] = {"config": config}
    try:
        read_line(prog, "ready", timeout=120)
        if config != "untraced":
            out = tmp / f"t-{time.monotonic_ns()}"
            res["trace"] = out
            tracer = start_record(prog.pid, config, out)
        prog.send_signal(signal.SIGUSR1)  # the warm-up: libtorch's unwind tables are built meanwhile
        read_line(prog, "warm", timeout=600)
        time.sleep(3.0 if tracer else 0.5)
        before = (program_stats_of(tracer.pid), pycounts_of(tracer.pid)) if tracer else None
        prog.send_signal(signal.SIGUSR1)
        res["secs"] = float(read_line(prog, "done", timeout=600).split()[1])
        if tracer is not None and before is not None:
            after = (program_stats_of(tracer.pid), pycounts_of(tracer.pid))
            res["bpf"] = {
                k: (v[0] - before[0].get(k, (0, 0))[0], v[1] - before[0].get(k, (0, 0))[1]) for k, v in after[0].items()
            }
            res["py"] = {k: v - before[1].get(k, 0) for k, v in after[1].items()}
            tracer.send_signal(signal.SIGINT)
            tracer.wait(120)
        return res
    finally:
        prog.kill()
        prog.wait()
        if tracer is not None and tracer.poll() is None:
            tracer.kill()


def torch_main(args) -> list[str]:
    runs: list[dict] = []
    last_trace = None
    with tempfile.TemporaryDirectory() as td:
        for r in range(args.rounds):
            for config in CONFIGS[r % 3 :] + CONFIGS[: r % 3]:  # rotated: no config always first
                res = torch_once(args.python, config, args.iters, Path(td))
                runs.append(res)
                if config == "python":
                    last_trace = res.get("trace")
                shown = {k: v for k, v in res.items() if k not in ("trace", "bpf")}
                ev = res.get("bpf", {}).get("alloc_return", (0, 0))
                print(f"round {r + 1} {shown} alloc_return {ev}", file=sys.stderr)
        top = ""
        if last_trace is not None:
            p = subprocess.run(
                [sys.executable, "-m", "allocscope", "report", str(last_trace), "--top", "10"],
                capture_output=True,
                text=True,
                cwd=str(ROOT),
            )
            top = top_table(p.stdout) if p.returncode == 0 else f"report failed: {p.stderr.strip()}"
            p = subprocess.run(  # the native view of the same trace, for contrast
                [sys.executable, "-m", "allocscope", "report", str(last_trace), "--top", "5", "--no-python"],
                capture_output=True,
                text=True,
                cwd=str(ROOT),
            )
            native = top_table(p.stdout) if p.returncode == 0 else f"report failed: {p.stderr.strip()}"
            top += "\n```\n\nThe same trace, `report --top 5 --no-python`:\n\n```\n" + native
    return torch_table(args, runs, top)


def top_table(report: str) -> str:
    """The report's header lines and its "Top N locations" table, up to the verdicts' legend."""
    lines = report.splitlines()
    start = next((i for i, t in enumerate(lines) if t.startswith("Top ") and "locations" in t), None)
    if start is None:
        return report
    end = next((i for i in range(start, len(lines)) if lines[i].strip().startswith("verdicts:")), len(lines))
    lost = [t for t in lines[:start] if t.strip().startswith(("lost ", "! lost_", "! ")) and "lost" in t]
    return "\n".join(lines[:3] + lost + [""] + lines[start:end])


def torch_table(args, runs: list[dict], top: str) -> list[str]:
    med = statistics.median
    rows: dict[str, dict[str, list[float]]] = {}
    for res in runs:
        row = rows.setdefault(res["config"], {})
        row.setdefault("secs", []).append(res["secs"])
        bpf = res.get("bpf")
        if not bpf:
            continue
        events = bpf.get("alloc_return", (0, 0))[1]
        ns = sum(v[0] for k, v in bpf.items() if k.startswith(("alloc_", "salloc_")))
        if events:
            row.setdefault("events", []).append(events / args.iters)
            row.setdefault("bpf_ns", []).append(ns / events)
        py = res.get("py") or {}
        if py.get("walks") and events:
            row.setdefault("walks", []).append(py["walks"] / events)
            row.setdefault("frames", []).append(py["frames"] / py["walks"])
            row.setdefault("stored", []).append(py["stored"] / py["walks"])
            row.setdefault("lost", []).append(py.get("lost", 0) + py.get("cut", 0))
    base = med(rows["untraced"]["secs"])
    off = med(rows["walk-off"].get("bpf_ns", [0.0])) if "walk-off" in rows else 0.0
    off_s = med(rows["walk-off"]["secs"]) if "walk-off" in rows else 0.0
    lines = [
        f"python {args.python}, torch CPU, {args.iters} iterations a timed window, {args.rounds} rounds, medians",
        "",
        "| config | window s | iter/s | kept | alloc events/iter | BPF ns/event (alloc_*) | +ns/event vs walk off "
        "| wall +ns/event vs walk off | walks/event | frames/walk | stored/walk | lost+cut |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config in CONFIGS:
        if config not in rows:
            continue
        row = rows[config]
        s = med(row["secs"])
        ev = med(row["events"]) if "events" in row else 0.0

        def cell(k: str, fmt: str, row=row) -> str:
            return format(med(row[k]), fmt) if k in row else ""

        extra = f"{med(row['bpf_ns']) - off:+.0f}" if config == "python" and "bpf_ns" in row else ""
        wall = f"{(s - off_s) / (ev * args.iters) * 1e9:+.0f}" if config == "python" and ev else ""
        lines.append(
            f"| {config} | {s:.3f} | {args.iters / s:.0f} | {base / s * 100:.1f}% | {cell('events', '.1f')} "
            f"| {cell('bpf_ns', '.0f')} | {extra} | {wall} | {cell('walks', '.3f')} | {cell('frames', '.1f')} "
            f"| {cell('stored', '.5f')} | {cell('lost', '.0f')} |"
        )
    lines += [
        "",
        "Per round (window s): "
        + "; ".join(f"{c} " + ", ".join(f"{x:.3f}" for x in rows[c]["secs"]) for c in CONFIGS if c in rows),
    ]
    if top:
        lines += ["", "Top 10 locations of the last traced run (Python frames on):", "", "```", top.rstrip(), "```"]
    return lines


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
    ap.add_argument("--iters", type=int, default=None, help="loop: 300000 allocations; torch: 2000 iterations")
    ap.add_argument("--depths", default="4,24")
    ap.add_argument("--workload", choices=("loop", "torch"), default="loop")
    ap.add_argument("--python", default=None, help="loop: pyenv's 3.12.1; torch: /tmp/torchenv/bin/python")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    if args.python is None:
        loop_py = str(Path.home() / ".pyenv/versions/3.12.1/bin/python3.12")
        args.python = "/tmp/torchenv/bin/python" if args.workload == "torch" else loop_py
    if args.iters is None:
        args.iters = 2000 if args.workload == "torch" else 300_000
    if args.workload == "torch":
        stats_file = Path("/proc/sys/kernel/bpf_stats_enabled")
        stats_was = stats_file.read_text().strip()
        stats_file.write_text("1")
        try:
            lines = torch_main(args)
        finally:
            stats_file.write_text(stats_was)
        print("\n".join(lines))
        if args.output:
            Path(args.output).write_text("\n".join(lines) + "\n")
        return
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
