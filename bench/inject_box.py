#!/usr/bin/env python3
"""--inject on another box, from the bundle (bench/README.md, "GPU box"): redis throughput kept,
interleaved per round (untraced, --inject, sampled, residency, the residency trap floor), and the C
target's ground truth under --inject (exact blocks >= N, the estimate within its error bar, the
entries put back, the agent's watchdog after a SIGKILL of allocscope).

    python3 bench/inject_box.py ALLOCSCOPE REDIS_DIR BINS OUT [--rounds 3]

ALLOCSCOPE: the bundle's bin/allocscope. REDIS_DIR: redis-server, redis-benchmark and the
libraries the box may lack (put on LD_LIBRARY_PATH). BINS: `inject` (tests/targets/inject.c)
built elsewhere (the box needs no compiler). Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from benchlib import REDIS_LOAD, free_port, redis_ping, redis_server_cmd

CONFIGS = {
    "untraced": None,
    "inject": ["--inject", "--sample-bytes", "524288"],
    "sampled": ["--sample-bytes", "65536"],
    "residency": ["--mode", "residency"],
    "floor-residency": ["--probe-floor", "--mode", "residency"],
}


def attach(exe: str, pid: int, out: str, extra: list[str]) -> subprocess.Popen:
    tr = subprocess.Popen(
        [exe, "record", "-q", "--pid", str(pid), "-o", out, "--force", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    end = time.monotonic() + 300
    while not os.path.exists(os.path.join(out, "parts", "intervals-000001.parquet")):
        if tr.poll() is not None or time.monotonic() > end:
            tr.kill()
            raise RuntimeError(f"allocscope did not attach: {tr.stderr.read().strip()[-300:]}")
        time.sleep(0.05)
    time.sleep(0.5)
    return tr


def finish(tr: subprocess.Popen) -> None:
    tr.send_signal(signal.SIGINT)
    rc = tr.wait(120)
    if rc != 0:
        raise RuntimeError(f"allocscope exited {rc}: {tr.stderr.read().strip()[-300:]}")


def redis_trial(exe: str, rdir: str, cfg: str, out: str, requests: int, r: int = 0) -> tuple[float, dict]:
    env = {**os.environ, "LD_LIBRARY_PATH": rdir}
    port = free_port()
    srv = subprocess.Popen(
        redis_server_cmd(os.path.join(rdir, "redis-server"), port),
        stdout=subprocess.DEVNULL,
        env=env,
    )
    cli = [os.path.join(rdir, "redis-benchmark"), "-p", str(port)]
    for _ in range(400):  # a PING over TCP (redis-benchmark can hang on a server not yet listening)
        if redis_ping(port):
            break
        time.sleep(0.05)
    tr = None
    detail: dict = {}
    try:
        if CONFIGS[cfg] is not None:
            tr = attach(exe, srv.pid, os.path.join(out, f"redis-{cfg}-{r}.allocscope"), CONFIGS[cfg])
        c0, t0 = cpu_s(tr.pid) if tr else 0.0, time.monotonic()
        bench = subprocess.run(
            [
                *cli,
                "-t",
                "set,get,lpush,lpop",
                "-n",
                str(requests),
                *REDIS_LOAD,
                "-q",
                "--csv",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        rps = [float(line.split(",")[1].strip('"')) for line in bench.stdout.splitlines()[1:] if line.count(",") >= 1]
        total = len(rps) / sum(1 / x for x in rps)
        if tr is not None:
            # the tracer's CPU per second of the benchmark (= per interval: --interval 1)
            detail["tracer_ms_per_s"] = round(1000 * (cpu_s(tr.pid) - c0) / (time.monotonic() - t0), 1)
            finish(tr)
            with open(os.path.join(out, f"redis-{cfg}-{r}.allocscope", "meta.json")) as f:
                meta = json.load(f)
            inj = meta["probes"].get("inject")
            if inj:
                detail |= {
                    "detached": inj["detached"],
                    "hooked": len(inj["hooked"]),
                    "stopped_ms": inj["stopped_ms"],
                    "sampled": inj["counters"].get("sampled"),
                    "sys_marks": inj["counters"].get("sys_marks"),
                    "tracepoints": inj.get("tracepoints"),
                }
        return total, detail
    finally:
        if tr is not None and tr.poll() is None:
            tr.kill()
        srv.terminate()
        srv.wait(30)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_names(pid: int) -> set[str]:
    out = set()
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                out.add(f.read().strip())
        except OSError:
            pass
    return out


def c_target(exe: str, bins: str, out: str) -> list[str]:
    lines = []
    tgt = subprocess.Popen([os.path.join(bins, "inject"), "--threads", "4"], stdout=subprocess.PIPE, text=True)
    assert tgt.stdout.readline().startswith("ready")
    trace = os.path.join(out, "c-inject.allocscope")
    tr = attach(exe, tgt.pid, trace, ["--inject", "--sample-bytes", "65536", "--interval", "0.5"])
    wd = "allocscope-wd" in thread_names(tgt.pid)
    tgt.send_signal(signal.SIGUSR1)
    assert tgt.stdout.readline().strip() == "held"
    time.sleep(1)
    finish(tr)
    rep = json.loads(
        subprocess.run([exe, "report", trace, "--format", "json"], capture_output=True, text=True, check=True).stdout
    )
    locs = {x["function"]: x for x in rep["locations"]}
    large, small = locs["hold_large"], locs["hold_small"]
    inj = rep["recording"]["probes"]["inject"]
    truth = 4000 * 4096
    lines.append(
        f"C target: watchdog thread while recording {wd}; hooked {len(inj['hooked'])}; stopped "
        f"{inj['stopped_ms']} ms; detached {inj['detached']}"
    )
    lines.append(
        f"  hold_large {large['live_bytes']} B in {large['live_count']} (truth {24 << 20} in 24): "
        f"{'exact' if (large['live_bytes'], large['live_count']) == (24 << 20, 24) else 'WRONG'}"
    )
    err = small["live_bytes_error"]
    lines.append(
        f"  hold_small {small['live_bytes']} B ± {err} (truth {truth}): "
        f"{'within' if abs(small['live_bytes'] - truth) <= 1.7 * err else 'OUTSIDE'} 1.7x the 95% bound"
    )
    # SIGKILL of allocscope: the agent's watchdog puts the entries back
    tr = attach(exe, tgt.pid, os.path.join(out, "c-kill.allocscope"), ["--inject"])
    t0 = time.monotonic()
    tr.kill()
    while "allocscope-wd" in thread_names(tgt.pid) and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    gone = time.monotonic() - t0
    tgt.send_signal(signal.SIGUSR1)
    serving = tgt.stdout.readline().strip() == "held"
    tgt.send_signal(signal.SIGTERM)
    bye = tgt.stdout.readline().strip()
    rc = tgt.wait(20)
    lines.append(
        f"  allocscope SIGKILLed: watchdog done after {gone:.2f} s; target serving {serving}; exit {rc} ({bye})"
    )
    return lines


def syscall_tax(exe: str, bins: str, out: str, rounds: int) -> list[str]:
    """ns a getppid() call (bench/syscalls.c, built elsewhere as BINS/syscalls) in a process the
    tracer does not trace, untraced and while `--inject` / residency record a sleeper, interleaved:
    what a recording costs every other process on the box per system call."""
    prog = os.path.join(bins, "syscalls")
    if not os.path.exists(prog):
        return [f"syscall tax: skipped ({prog} not built: gcc -O2 -o BINS/syscalls bench/syscalls.c)"]
    cfgs = {
        "untraced": None,
        "inject": CONFIGS.get("inject") or ["--inject", "--sample-bytes", "524288"],
        "residency": ["--mode", "residency"],
    }
    res: dict[str, list[float]] = {c: [] for c in cfgs}
    for r in range(rounds):
        for cfg, flags in cfgs.items():
            sleeper = subprocess.Popen(["sleep", "infinity"])
            tr = attach(exe, sleeper.pid, os.path.join(out, f"tax-{cfg}-{r}.allocscope"), flags) if flags else None
            try:
                ns = statistics.median(
                    float(
                        subprocess.run([prog, "2000000"], capture_output=True, text=True, check=True).stdout.split()[1]
                    )
                    for _ in range(3)
                )
            finally:
                if tr is not None:
                    finish(tr)
                sleeper.kill()
                sleeper.wait()
            res[cfg].append(ns)
    base = statistics.median(res["untraced"])
    return [
        f"syscall tax (getppid ns, another process; medians of {rounds} interleaved rounds): "
        + ", ".join(f"{c} {statistics.median(v):.1f} ({statistics.median(v) - base:+.1f})" for c, v in res.items())
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("allocscope")
    ap.add_argument("redis_dir")
    ap.add_argument("bins")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    ap.add_argument("--skip-c", action="store_true", help="no C-target checks")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for c in set(CONFIGS) - set(a.configs.split(",")) - {"untraced"}:
        del CONFIGS[c]
    if not a.skip_c:
        for line in c_target(a.allocscope, a.bins, a.out):
            print(line, flush=True)
        for line in syscall_tax(a.allocscope, a.bins, a.out, a.rounds):
            print(line, flush=True)
    res: dict[str, list[float]] = {c: [] for c in CONFIGS}
    details: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for r in range(a.rounds):
        for cfg in CONFIGS:
            try:
                v, d = redis_trial(a.allocscope, a.redis_dir, cfg, a.out, a.requests, r)
            except Exception as e:  # noqa: BLE001 - one failed trial is reported, the rest go on
                print(f"round {r + 1} {cfg}: failed: {e}", flush=True)
                continue
            res[cfg].append(v)
            details[cfg].append(d)
            print(f"round {r + 1} {cfg:16s} {v:10,.0f} requests/s {d or ''}", flush=True)
    base = statistics.median(res["untraced"]) if res["untraced"] else 0
    print(
        f"\nredis on {os.cpu_count()} CPUs, medians of {a.rounds} interleaved rounds "
        f"(set,get,lpush,lpop -n {a.requests} -c 50 -d 64):"
    )
    for cfg, vals in res.items():
        if vals:
            m = statistics.median(vals)
            print(f"  {cfg:16s} {m:10,.0f} requests/s  kept {100 * m / base:5.1f} %")
    sys.exit(0)


if __name__ == "__main__":
    main()
