#!/usr/bin/env python3
"""Cost of reading how much of an allocator's mappings is resident, three ways, on a target
with tens of GiB mapped (issue #20): ioctl(PAGEMAP_SCAN) (Linux 6.7+, what the tracer uses: runs
of present pages), pread of /proc/PID/pagemap (8 bytes a page: the fallback, exact only within
its page budget) and /proc/PID/smaps (the kernel sums every VMA of the process). Two shapes of
the same mapping: dense (the first TOUCH GiB touched page by page: few long runs) and sparse
(one page in 6 over the whole mapping: page tables everywhere, one run per present page — the
worst case for PAGEMAP_SCAN's output).

    sudo .venv/bin/python bench/retention.py [--gib 24] [--touch 4] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def timed(fn, reps: int) -> tuple[float, int]:
    ms, val = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        val = fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), val


def smaps_rss(pid: int, start: int) -> int:
    """Rss of the VMA starting at `start`, from /proc/PID/smaps (the whole file is generated)."""
    rss, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:
                inside = int(line.split("-", 1)[0], 16) == start
            elif inside and line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
    return rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=24)
    ap.add_argument("--touch", type=int, default=4, help="GiB touched in the dense shape")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    from tracer.allocators.arenas import Pagemap, PageScan

    with tempfile.TemporaryDirectory() as td:
        exe = Path(td) / "sparsemap"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "sparsemap.c")], check=True)
        print(
            f"{'shape':>7} {'mapped GiB':>10} {'resident GiB':>12} {'PAGEMAP_SCAN ms':>15} {'ioctls':>6} "
            f"{'pagemap pread ms':>16} {'smaps ms':>9}"
        )
        for shape, stride in (("dense", 1), ("sparse", 6)):
            p = subprocess.Popen(
                [str(exe), str(args.gib), str(stride), str(args.touch)], stdout=subprocess.PIPE, text=True
            )
            try:
                _r, pid, lo, hi = p.stdout.readline().split()
                pid, lo, hi = int(pid), int(lo), int(hi)
                with PageScan(pid) as ps:
                    scan_ms, scan = timed(lambda lo=lo, hi=hi: ps.resident(lo, hi), args.reps)
                    calls = ps.calls // args.reps
                with Pagemap(pid, budget_pages=(hi - lo) // 4096 + 1) as pm:
                    pread_ms, pread = timed(lambda lo=lo, hi=hi: pm.resident(lo, hi), args.reps)
                smaps_ms, smaps = timed(lambda pid=pid, lo=lo: smaps_rss(pid, lo), args.reps)
                assert scan == pread == smaps, (scan, pread, smaps)
                print(
                    f"{shape:>7} {(hi - lo) / 2**30:>10.1f} {scan / 2**30:>12.2f} {scan_ms:>15.1f} {calls:>6} "
                    f"{pread_ms:>16.1f} {smaps_ms:>9.1f}"
                )
            finally:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
