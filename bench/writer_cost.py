#!/usr/bin/env python3
"""What writing an interval's trace parts costs the tracer (issue 33): CPU and wall per interval,
the writer as it was (zstd on every part, an fsync per part) side by side with the writer now
(small parts plain, fsyncs batched every SYNC_S seconds) and the two changes apart.

The parts are a real recording's: by default this records redis-server under redis-benchmark
with --inject for a few seconds (root, redis-server, redis-benchmark), or takes --trace PATH.
Two workloads, each written --intervals times per configuration, configurations interleaved
per round so machine noise hits them alike:

  full        the recording's interval with the most parts (its ~10 small parts), repeated
  recording   every interval of the recording but the first and the last, in order, cycled
              (peak snapshots' intervals hold 2-3 parts)

Per configuration and workload: median over rounds of CPU ms (user + system of this process,
the fsync thread's and the kernel's fsync work included) and wall ms spent in the writer's
calls per interval, including the final meta.json (which waits for the last fsyncs), and bytes
on disk per interval. A simulated clock advances --interval-s per interval, so fsync batches
come as often as they would in a recording; between intervals the bench sleeps --sleep-ms
(not counted), as the tracer's loop does, so the fsync thread has time to work. The trace directory is on the
disk of --dir (default: /var/tmp; a tmpfs makes fsync free and is refused).

    sudo .venv/bin/python bench/writer_cost.py [--rounds 5] [--intervals 40] [--sleep-ms 100] [--trace PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from common.tracefile import format as F  # noqa: E402
from common.tracefile.reader import load_trace  # noqa: E402
from common.tracefile.writer import SYNC_S, TraceWriter  # noqa: E402


class BeforeWriter:
    """The writer before issue 33 (commit 111080b), its write path as it was: every part zstd,
    written under a temporary name, fsynced, renamed."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.mkdir(path, 0o700)
        self._dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        os.mkdir(F.PARTS, 0o700, dir_fd=self._dirfd)
        self._partsfd = os.open(F.PARTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._dirfd)

    def _atomic_write(self, dirfd: int, name: str, data: bytes) -> None:
        tmp = f".{name}.tmp"
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fstat(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)

    def write_part(self, table: str, seq: int, data: pa.Table) -> None:
        if data.num_rows == 0 and table != "intervals":
            return
        buf = io.BytesIO()
        pq.write_table(data, buf, compression="zstd", **F.PARQUET_OPTIONS.get(table, {}))
        self._atomic_write(self._partsfd, F.part_name(table, seq), buf.getvalue())

    def write_meta(self, meta: dict) -> None:
        self._atomic_write(self._dirfd, F.META, json.dumps(meta, indent=1, sort_keys=True).encode())

    def close(self) -> None:
        os.close(self._partsfd)
        os.close(self._dirfd)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


CONFIGS = {
    "before (zstd, fsync each part)": lambda p, c: BeforeWriter(p),
    "small parts plain, fsync each part": lambda p, c: TraceWriter(p, sync_s=0, clock=c),
    f"zstd, fsync batched every {SYNC_S:g} s": lambda p, c: TraceWriter(p, small_part_bytes=0, clock=c),
    "now (plain small parts, batched fsync)": lambda p, c: TraceWriter(p, clock=c),
}


def record_redis(out: Path, seconds: int) -> None:
    port = "6399"
    srv = subprocess.Popen(
        ["redis-server", "--port", port, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        load = subprocess.Popen(
            [
                "redis-benchmark",
                "-p",
                port,
                "-n",
                "10000000",
                "-r",
                "100000",
                "-d",
                "64",
                "-t",
                "set,get,lpush,lpop",
                "-q",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            subprocess.run(
                [
                    str(ROOT / ".venv/bin/allocscope"),
                    "record",
                    "--pid",
                    str(srv.pid),
                    "--inject",
                    "--duration",
                    str(seconds),
                    "-o",
                    str(out),
                ],
                check=True,
                cwd=ROOT,
            )
        finally:
            load.kill()
            load.wait()
    finally:
        srv.kill()
        srv.wait()


def interval_parts(trace: Path) -> dict[int, list[tuple[str, pa.Table]]]:
    """seq -> [(table, Arrow table as the tracer hands it to the writer)], `intervals` last."""
    pdir = trace / F.PARTS
    by: dict[int, list] = defaultdict(list)
    for n in sorted(os.listdir(pdir)):
        parsed = F.parse_part_name(n)
        if parsed and parsed[0] != "live":
            tab = pq.read_table(pdir / n)
            if parsed[0] in F.SCHEMAS:
                tab = tab.cast(F.SCHEMAS[parsed[0]])
            by[parsed[1]].append((parsed[0], tab))
    for seq in by:
        by[seq].sort(key=lambda p: p[0] == "intervals")
    return dict(by)


def renumbered(intervals: list[list[tuple[str, pa.Table]]], n: int) -> list[list[tuple[str, pa.Table]]]:
    """n intervals cycled from `intervals`, each part's seq column set to its new interval."""
    out = []
    for i in range(n):
        parts = []
        for table, tab in intervals[i % len(intervals)]:
            if "seq" in tab.column_names:
                k = tab.column_names.index("seq")
                tab = tab.set_column(k, tab.schema.field(k), pa.array([i + 1] * tab.num_rows, tab.schema.field(k).type))
            parts.append((table, tab))
        out.append(parts)
    return out


def run_one(make, base: Path, workload: list[list[tuple[str, pa.Table]]], step_s: float, sleep_s: float) -> tuple:
    """CPU (the whole process: the fsync thread's too) and wall in the writer's calls (the
    sleeps between intervals left out) per interval; bytes per interval."""
    n = len(workload)
    path = base / "t.allocscope"
    if path.exists():
        shutil.rmtree(path)
    clock = Clock()
    wall = 0.0
    c0, t = time.process_time(), time.perf_counter()
    w = make(str(path), clock)
    w.write_meta({"format": F.FORMAT, "version": F.VERSION, "complete": False})
    for i, interval in enumerate(workload):
        for table, tab in interval:
            w.write_part(table, i + 1, tab)
        clock.t += step_s
        wall += time.perf_counter() - t
        time.sleep(sleep_s)  # the tracer's loop sleeps between snapshots: the fsync thread works then
        t = time.perf_counter()
    w.write_meta({"format": F.FORMAT, "version": F.VERSION, "complete": True})
    w.close()
    cpu, wall = time.process_time() - c0, wall + time.perf_counter() - t
    size = sum(f.stat().st_size for f in (path / F.PARTS).iterdir())
    t = load_trace(str(path))
    assert len(t.intervals) == n and not t.warnings, (len(t.intervals), t.warnings)
    return cpu / n * 1e3, wall / n * 1e3, size / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="take the parts from this recording (default: record redis)")
    ap.add_argument("--record-s", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--intervals", type=int, default=40, help="intervals written per configuration and round")
    ap.add_argument("--interval-s", type=float, default=1.0, help="simulated seconds per interval (fsync batches)")
    ap.add_argument("--sleep-ms", type=float, default=100, help="real sleep between intervals")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    a = ap.parse_args()
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(a.dir)], capture_output=True, text=True).stdout.strip()
    if fs == "tmpfs":
        sys.exit(f"writer_cost: {a.dir} is a tmpfs (fsync is free there); give --dir on a disk")
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="writer-cost-") as tmp:
        base = Path(tmp)
        trace = a.trace
        if trace is None:
            trace = base / "redis.allocscope"
            record_redis(trace, a.record_s)
        parts = interval_parts(trace)
        seqs = sorted(parts)
        middle = [parts[s] for s in seqs[1:-1]] or [parts[s] for s in seqs]
        full = max(middle, key=len)
        workloads = {"full": renumbered([full], a.intervals), "recording": renumbered(middle, a.intervals)}
        print(
            f"parts from {trace}: {len(seqs)} intervals; 'full' interval: "
            + " ".join(f"{t}:{tab.num_rows}r" for t, tab in full)
        )
        print(f"'recording': {len(middle)} intervals, {sum(map(len, middle)) / len(middle):.1f} parts each on average")
        print(
            f"dir {a.dir} ({fs}); {a.intervals} intervals x {a.rounds} rounds per configuration; "
            f"load {os.getloadavg()[0]:.2f}; pyarrow {pa.__version__}"
        )
        res: dict = defaultdict(list)
        for _ in range(a.rounds):
            for wname, wl in workloads.items():
                for cname, make in CONFIGS.items():
                    res[wname, cname].append(run_one(make, base, wl, a.interval_s, a.sleep_ms / 1e3))
        print(f"load after {os.getloadavg()[0]:.2f}")
        for wname in workloads:
            print(f"\n{wname}: per interval, median of {a.rounds} rounds")
            print(f"  {'configuration':44s} {'CPU ms':>8s} {'wall ms':>8s} {'bytes':>8s}  CPU, wall vs before")
            b_cpu = statistics.median(r[0] for r in res[wname, next(iter(CONFIGS))])
            b_wall = statistics.median(r[1] for r in res[wname, next(iter(CONFIGS))])
            for cname in CONFIGS:
                rs = res[wname, cname]
                cpu, wall, size = (statistics.median(r[i] for r in rs) for i in range(3))
                print(f"  {cname:44s} {cpu:8.2f} {wall:8.2f} {size:8.0f}  x{cpu / b_cpu:.2f}, x{wall / b_wall:.2f}")


if __name__ == "__main__":
    main()
