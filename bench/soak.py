"""Soak: record a busy redis-server for a long time and watch the tracer itself.

    sudo .venv/bin/python bench/soak.py                     # 30 minutes
    sudo .venv/bin/python bench/soak.py --duration 60 --sample 2 --json soak.json

redis-server (Debian package, installed with apt-get when missing) listens on a unix socket
only (no TCP port at all); redis-benchmark runs in a loop with bounded request counts over a
bounded key space (-r), so redis' own live set stops growing after warm-up. Every --sample
seconds the script records, from outside the tracer: its RSS and CPU time, the entry counts of
its BPF maps (live, stacks, sites, flows, sysargs; read by map id through
/proc/PID/fdinfo, see tracer/bpf/objects.py) and the size of the trace so far. At the end it prints
the samples, a summary (RSS after warm-up: first/last/max and slope; largest map counts; trace
MB per hour) and writes it as JSON with --json. Exit status 0 when the tracer ran and finished
the trace, 1 otherwise; bounds are asserted by tests/test_soak_bpf.py, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import cpu_seconds, dir_bytes, slope_per_hour

from tracer.bpf.objects import map_counts, rss_bytes

ROOT = Path(__file__).resolve().parent.parent

MAPS = ("live", "stacks", "sites", "flows", "sysargs")
BENCH_TESTS = "set,get,incr,lpush,lpop,sadd,spop,hset,mset"


def ensure_redis() -> None:
    """redis-server and redis-benchmark, from Debian, installed when missing (root)."""
    if shutil.which("redis-server") and shutil.which("redis-benchmark"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "redis-server", "redis-tools"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    if not (shutil.which("redis-server") and shutil.which("redis-benchmark")):
        raise RuntimeError("redis-server/redis-benchmark still missing after apt-get install")


def redis_keys(sock: str) -> int:
    """DBSIZE of the server at `sock`, -1 when it does not answer."""
    p = subprocess.run(["redis-cli", "-s", sock, "DBSIZE"], capture_output=True, text=True, timeout=60, check=False)
    try:
        return int(p.stdout.strip())
    except ValueError:
        return -1


class Load(threading.Thread):
    """redis-benchmark in a loop: bounded requests per round, bounded key space."""

    def __init__(self, sock: str, requests: int, keyspace: int) -> None:
        super().__init__(daemon=True)
        self.sock, self.requests, self.keyspace = sock, requests, keyspace
        self.stop = threading.Event()
        self.rounds = 0
        self.proc: subprocess.Popen | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            self.proc = subprocess.Popen(
                [
                    "redis-benchmark",
                    "-s",
                    self.sock,
                    "-q",
                    "-n",
                    str(self.requests),
                    "-r",
                    str(self.keyspace),
                    "-c",
                    "8",
                    "-d",
                    "128",
                    "-t",
                    BENCH_TESTS,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.proc.wait()
            self.rounds += 1

    def finish(self) -> None:
        self.stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
        self.join(30)


def soak(
    duration: float, sample: float, warmup: float, requests: int, keyspace: int, workdir: Path, progress=print
) -> dict:
    ensure_redis()
    sock = str(workdir / "redis.sock")
    trace = workdir / "soak.allocscope"
    redis = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            sock,
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tracer = None
    load = None
    try:
        end = time.monotonic() + 20
        while not os.path.exists(sock):
            if redis.poll() is not None or time.monotonic() > end:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        tracer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "allocscope",
                "record",
                "--pid",
                str(redis.pid),
                "-o",
                str(trace),
                "--interval",
                "1",
                "-q",
            ],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        end = time.monotonic() + 120
        while not (trace / "parts" / "intervals-000001.parquet").exists():
            if tracer.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"tracer did not start: {tracer.stderr.read() if tracer.poll() is not None else ''}")
            time.sleep(0.1)
        load = Load(sock, requests, keyspace)
        load.start()
        t0 = time.monotonic()
        samples = []
        progress(
            f"{'t_s':>6} {'tracer_rss_MiB':>14} {'cpu_s':>7} {'redis_rss_MiB':>13} "
            + " ".join(f"{m:>8}" for m in MAPS)
            + f" {'trace_MiB':>9}"
        )
        while True:
            now = time.monotonic() - t0
            counts = map_counts(tracer.pid, MAPS)
            s = {
                "t_s": round(now, 1),
                "tracer_rss": rss_bytes(tracer.pid),
                "tracer_cpu_s": cpu_seconds(tracer.pid),
                "redis_rss": rss_bytes(redis.pid),
                "maps": counts,
                "trace_bytes": dir_bytes(trace),
                "rounds": load.rounds,
            }
            samples.append(s)
            progress(
                f"{s['t_s']:>6.0f} {s['tracer_rss'] / 2**20:>14.1f} {s['tracer_cpu_s']:>7.1f} "
                f"{s['redis_rss'] / 2**20:>13.1f} "
                + " ".join(f"{counts.get(m, -1):>8}" for m in MAPS)
                + f" {s['trace_bytes'] / 2**20:>9.2f}"
            )
            if now >= duration or tracer.poll() is not None:
                break
            time.sleep(min(sample, max(0.0, duration - now)))
        load.finish()
        elapsed = time.monotonic() - t0
        # Every key freed: what the tracer still holds in its live map must drop to redis' own
        # structures (a tracer that missed frees would keep the key space's blocks)
        keys = redis_keys(sock)
        live_before = map_counts(tracer.pid, ("live",)).get("live", -1)
        subprocess.run(["redis-cli", "-s", sock, "FLUSHALL"], capture_output=True, timeout=60, check=False)
        time.sleep(2.5)  # two snapshots
        live_after = map_counts(tracer.pid, ("live",)).get("live", -1)
        tracer.send_signal(signal.SIGINT)
        out, err = tracer.communicate(timeout=600)
        rc = tracer.returncode
    finally:
        if load is not None:
            load.finish()
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
            tracer.wait()
        redis.terminate()
        try:
            redis.wait(30)
        except subprocess.TimeoutExpired:
            redis.kill()
            redis.wait()
    after = [s for s in samples if s["t_s"] >= warmup] or samples[-1:]
    rss_after = [s["tracer_rss"] for s in after]
    size = dir_bytes(trace)
    summary = {
        "duration_s": round(elapsed, 1),
        "sample_s": sample,
        "warmup_s": warmup,
        "tracer_exit": rc,
        # the summary line is on stderr (allocscope's own lines never go to stdout, issue 53)
        "tracer_summary": next((x for x in err.splitlines() if x.startswith("allocscope: wrote")), out.strip()),
        "tracer_stderr": err.strip()[-2000:],
        "benchmark_rounds": load.rounds,
        "requests_per_round": requests * len(BENCH_TESTS.split(",")),
        "tracer_rss_first_mib": round(samples[0]["tracer_rss"] / 2**20, 1),
        "tracer_rss_after_warmup_first_mib": round(rss_after[0] / 2**20, 1),
        "tracer_rss_after_warmup_max_mib": round(max(rss_after) / 2**20, 1),
        "tracer_rss_last_mib": round(samples[-1]["tracer_rss"] / 2**20, 1),
        "tracer_rss_growth_after_warmup_mib": round((max(rss_after) - rss_after[0]) / 2**20, 1),
        "tracer_rss_slope_mib_per_hour": round(slope_per_hour([(s["t_s"], s["tracer_rss"] / 2**20) for s in after]), 2),
        "tracer_cpu_s": round(samples[-1]["tracer_cpu_s"], 1),
        "maps_max": {m: max(s["maps"].get(m, 0) for s in samples) for m in MAPS},
        "maps_max_after_warmup": {m: max(s["maps"].get(m, 0) for s in after) for m in MAPS},
        "maps_last": samples[-1]["maps"],
        "redis_keys_before_flush": keys,
        "live_before_flush": live_before,
        "live_after_flush": live_after,
        "trace_mib": round(size / 2**20, 2),
        "trace_mib_per_hour": round(size / 2**20 / max(elapsed, 1) * 3600, 1),
        "trace_path": str(trace),
        "samples": samples,
    }
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800, help="seconds of load (default 1800)")
    ap.add_argument("--sample", type=float, default=5, help="seconds between samples (default 5)")
    ap.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds before RSS must be flat (default: 10%% of --duration, at least 15)",
    )
    ap.add_argument("--requests", type=int, default=20000, help="requests per benchmark test per round")
    ap.add_argument("--keyspace", type=int, default=100000, help="redis-benchmark -r (bounded key space)")
    ap.add_argument("--json", help="write the summary (with every sample) here")
    ap.add_argument("--keep", help="directory to keep the trace and redis socket in (default: a temp dir)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("soak: needs root (BPF)", file=sys.stderr)
        return 1
    warmup = a.warmup if a.warmup is not None else max(15.0, a.duration * 0.1)
    if a.keep:
        work = Path(a.keep)
        work.mkdir(parents=True, exist_ok=True)
        s = soak(a.duration, a.sample, warmup, a.requests, a.keyspace, work)
    else:
        with tempfile.TemporaryDirectory(prefix="allocscope-soak-") as d:
            s = soak(a.duration, a.sample, warmup, a.requests, a.keyspace, Path(d))
    short = {k: v for k, v in s.items() if k != "samples"}
    print(json.dumps(short, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    return 0 if s["tracer_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
