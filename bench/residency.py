#!/usr/bin/env python3
"""Cost of allocscope's per-interval residency measurement (pagemap over the allocator's heaps)
on a target with many GiB in its heap, for few large vs many small live blocks: the cost follows
the heap's size (bounded by the page budget), not the number of allocations.

    sudo .venv/bin/python bench/residency.py [--gib 4]
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT))
from benchlib import record_cmd  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    from reports.trace import load_trace

    with tempfile.TemporaryDirectory() as td:
        exe = Path(td) / "bigheap"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "bigheap.c")], check=True)
        print(
            f"{'blocks':>10} {'block':>8} {'heap GiB':>9} {'RSS GiB':>8} {'ms/interval (median)':>21} {'max':>7} "
            f"{'estimated':>9} {'heap resident GiB':>17}"
        )
        for blk in (1 << 20, 64 << 10, 4 << 10):
            p = subprocess.Popen([str(exe), str(args.gib), str(blk)], stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline().split()
            out = Path(td) / f"r{blk}.allocscope"
            subprocess.run(
                record_cmd(sys.executable, line[1], out, "--duration", str(args.seconds), "--interval", "0.5"),
                cwd=str(ROOT),
                check=True,
                stdout=subprocess.DEVNULL,
            )
            t = load_trace(str(out))
            iv = t.intervals
            ms = iv["residency_ms"]
            heaps = t.heaps
            est = bool(heaps["estimated"].any()) if not heaps.empty else False
            rss = iv["rss_bytes"].iloc[-1] / 2**30
            print(
                f"{int(line[2]):>10} {blk:>8} {args.gib:>9} {rss:>8.2f} {statistics.median(ms):>21.1f} "
                f"{ms.max():>7.1f} {str(est):>9} {heaps['resident_bytes'].sum() / 2**30:>17.2f}"
            )
            p.send_signal(signal.SIGKILL)
            p.wait()
            time.sleep(0.5)


if __name__ == "__main__":
    main()
