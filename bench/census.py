#!/usr/bin/env python3
"""Cost of the glibc census (tracer/allocators/census.py) on a heap of millions of chunks (issue #32): a
target (bench/manychunks.c) holding N small blocks in 4 arenas, a third of them freed; the census
run with the default time budget and with a small one (sampled beyond it), side by side.

    sudo .venv/bin/python bench/census.py [--chunks 4000000] [--threads 3] [--budget 2.0 0.25]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=4_000_000)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--budget", type=float, nargs="+", default=[2.0, 0.25])
    args = ap.parse_args()
    from tracer.allocators.census import run_census

    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "manychunks"
        subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(HERE / "manychunks.c")], check=True)
        p = subprocess.Popen([str(exe), str(args.chunks), str(args.threads)], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
            full = None
            for budget in args.budget:
                t0 = time.perf_counter()
                rows, info = run_census(p.pid, budget_s=budget)
                s = time.perf_counter() - t0
                heap = [r for r in rows if r.arena != "mmap"]
                in_use = sum(r.in_use_bytes for r in heap)
                free = sum(r.free_bytes + r.fastbin_bytes + r.tcache_bytes for r in heap)
                walked = sum(r.walked_bytes for r in heap)
                system = sum(r.system_bytes for r in heap)
                full = full or (in_use, free)
                same = full == (in_use, free)
                err = "" if same else f"; in use {100 * (in_use - full[0]) / full[0]:+.2f}% vs the first run"
                print(
                    f"budget {budget:.2f} s: {s:.3f} s, {info['chunks']:,} chunks walked "
                    f"({info['chunks'] / s / 1e6:.2f} M/s), {walked >> 20} of {system >> 20} MiB walked, "
                    f"sampled {info['sampled']}; in use {in_use >> 20} MiB, free {free >> 20} MiB "
                    f"({len(heap)} arenas){err}"
                )
        finally:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
