#!/usr/bin/env python3
"""Scale: N live allocations tracked with zero silent loss; the cost of the final snapshot
(reading the live map in batches and writing it); the report's time on that trace; the tracer's
peak RSS.

    sudo .venv/bin/python bench/scale.py [--n 10000000]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--keep", metavar="DIR", help="keep the trace in DIR/scale.allocscope")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    with tempfile.TemporaryDirectory() as td:
        exe = Path(td) / "gen"
        subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(exe), str(HERE / "gen.c")], check=True)
        gen = subprocess.Popen([str(exe), str(args.n)], stdout=subprocess.PIPE, text=True)
        pid = gen.stdout.readline().split()[1]
        out = Path(args.keep or td) / "scale.allocscope"
        tr = subprocess.Popen([sys.executable, "-m", "allocscope", "record", "-q",
                               "--pid", pid, "-o", str(out), "--max-live", str(int(args.n * 1.25) + 65536),
                               "--interval", "2", "--unwind", "fp"],
                              cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not (out / "meta.json").exists():
            time.sleep(0.1)
        t0 = time.monotonic()
        gen.send_signal(signal.SIGUSR1)
        gen.stdout.readline()
        t_alloc = time.monotonic() - t0
        time.sleep(2.5)
        tr.send_signal(signal.SIGINT)
        tracer_kb = 0
        while tr.poll() is None:  # the tracer's peak RSS (VmHWM) just before it exits
            try:
                with open(f"/proc/{tr.pid}/status") as f:
                    tracer_kb = max(tracer_kb, next(int(x.split()[1]) for x in f if x.startswith("VmHWM")))
            except (OSError, StopIteration):
                pass
            time.sleep(0.05)
        meta = json.load(open(out / "meta.json"))
        t1 = time.monotonic()
        rep = subprocess.run([sys.executable, "-m", "allocscope", "report", str(out), "--format", "json"],
                             cwd=str(ROOT), capture_output=True, text=True, check=True)
        t_report = time.monotonic() - t1
        doc = json.loads(rep.stdout)
        gen.kill()
        size = sum(f.stat().st_size for f in (out / "parts").iterdir())
        print(f"live allocations made after attach: {args.n} in {t_alloc:.1f}s (traced)")
        print(f"report: live_count {doc['totals']['live_count']}, lost_events {doc['totals']['lost_events']}, "
              f"losses {doc['totals']['losses']}")
        print(f"final snapshot (live map read in batches + Parquet write): {meta['final_snapshot_s']:.2f}s")
        print(f"report --format json on this trace: {t_report:.1f}s; trace on disk {size / 2**20:.0f} MiB")
        print(f"tracer peak RSS: {tracer_kb / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
