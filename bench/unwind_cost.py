#!/usr/bin/env python3
"""What DWARF unwinding costs per allocation, against the frame-pointer path.

A malloc+free loop (bench/malloc_loop.c) runs at stack depth 8 and 32, built two ways:
  nofp  -O2 -fomit-frame-pointer (release build: `--unwind fp` sees one frame, dwarf sees all)
  fp    -O2 -fno-omit-frame-pointer (the frame-pointer walk sees all frames: its full cost)
Configurations, interleaved per round, medians:
  untraced | fp-walk (fp build, --unwind fp) | fp-nofp (nofp build, --unwind fp: short stacks)
  | dwarf (nofp build, --unwind dwarf)
and the frames each configuration recorded for the loop's allocation site.

    sudo .venv/bin/python bench/unwind_cost.py [--rounds 3] [--iters 200000] [--depths 8,32]
    (also: bench/overhead.py --unwind ...)
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
from benchlib import cpu_seconds, read_line  # noqa: E402 (bench/ on the path first)

CONFIGS = {  # name -> (build, record arguments or None for untraced)
    "untraced": ("nofp", None),
    "fp-walk": ("fp", ["--unwind", "fp"]),
    "fp-nofp": ("nofp", ["--unwind", "fp"]),
    "dwarf": ("nofp", ["--unwind", "dwarf"]),
}


def build(tmp: Path) -> dict[str, Path]:
    out = {}
    for kind, flag in (("nofp", "-fomit-frame-pointer"), ("fp", "-fno-omit-frame-pointer")):
        exe = tmp / f"malloc_loop_{kind}"
        subprocess.run(["gcc", "-O2", "-g", "-pthread", flag, "-o", str(exe), str(HERE / "malloc_loop.c")], check=True)
        out[kind] = exe
    return out


def site_depth(trace: Path) -> int:
    """Frames of the loop's allocation site (the biggest allocation count)."""
    p = subprocess.run(
        [sys.executable, "-m", "allocscope", "report", str(trace), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
    )
    if p.returncode:
        return -1
    rep = json.loads(p.stdout)
    best = max(rep["sites"], key=lambda s: s["alloc_count"], default=None)
    return len(best["full_frames"]) if best else 0


def run_once(exe: Path, rec_args, args, depth: int, tmp: Path, want_frames: bool) -> tuple[float, float, int]:
    loop = subprocess.Popen(
        [str(exe), "--wait-signal", "--iters", str(args.iters), "--threads", str(args.threads), "--depth", str(depth)],
        stdout=subprocess.PIPE,
        text=True,
    )
    read_line(loop, "ready")
    tracer, out = None, None
    try:
        if rec_args is not None:
            out = tmp / f"u-{time.monotonic_ns()}.allocscope"
            tracer = subprocess.Popen(
                [sys.executable, "-m", "allocscope", "record", "-q", "--pid", str(loop.pid), "-o", str(out), *rec_args],
                cwd=str(ROOT),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            while not (out / "meta.json").exists():
                if tracer.poll() is not None:
                    raise RuntimeError(tracer.stderr.read())
                time.sleep(0.05)
        cpu0 = cpu_seconds(tracer.pid) if tracer else 0.0
        loop.send_signal(signal.SIGUSR1)
        secs = float(read_line(loop, "elapsed", timeout=600).split()[1])
        cpu = (cpu_seconds(tracer.pid) - cpu0) if tracer else 0.0
    finally:
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(120)
        loop.wait(60)
    frames = site_depth(out) if (out is not None and want_frames) else 0
    return secs, cpu, frames


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200000, help="malloc+free pairs per thread")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", default="8,32")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench/unwind_cost.py: run as root (it attaches BPF probes)")
    depths = [int(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        exes = build(tmp)
        times = {(d, c): [] for d in depths for c in CONFIGS}
        frames: dict[tuple[int, str], int] = {}
        for r in range(args.rounds):
            for d in depths:
                for c, (kind, rec) in CONFIGS.items():
                    s, _cpu, n = run_once(exes[kind], rec, args, d, tmp, want_frames=(r == 0))
                    times[(d, c)].append(s)
                    if r == 0:
                        frames[(d, c)] = n
                    print(f"round {r + 1}/{args.rounds} depth {d:3d} {c:9s} {s:8.3f}s", file=sys.stderr)
    allocs = args.iters * args.threads
    print(
        f"\nDWARF unwinding cost: {args.threads} threads x {args.iters} malloc+free, {args.rounds} "
        f"interleaved rounds, medians"
    )
    print(f"{'depth':>5s} {'configuration':14s} {'seconds':>8s} {'µs/alloc added':>15s} {'site frames':>12s}")
    for d in depths:
        base = statistics.median(times[(d, "untraced")])
        for c in CONFIGS:
            m = statistics.median(times[(d, c)])
            added = (m - base) / allocs * 1e6
            fr = frames.get((d, c), 0)
            print(f"{d:5d} {c:14s} {m:8.3f} {added:15.2f} {fr if c != 'untraced' else '-':>12}")
        dw = statistics.median(times[(d, "dwarf")])
        fpn = statistics.median(times[(d, "fp-nofp")])
        fpw = statistics.median(times[(d, "fp-walk")])
        print(
            f"{d:5d} dwarf - fp-nofp: {(dw - fpn) / allocs * 1e6:+.2f} µs/alloc; "
            f"dwarf - fp-walk: {(dw - fpw) / allocs * 1e6:+.2f} µs/alloc"
        )


if __name__ == "__main__":
    main()
