#!/usr/bin/env python3
"""Where `--inject`'s cost goes on redis: perf profiles of the server and of the tracer, per mode.

    sudo .venv/bin/python bench/inject_profile.py ALLOCSCOPE [--modes untraced,inject] [--requests 100000]
                                                  [--rounds 2] [--freq 1999] [--redis-dir DIR] [--keep DIR]

The same pinned redis trial as bench/inject_floor.py (server, redis-benchmark -t set,get,lpush and
the tracer on disjoint CPUs where the box has them), with `perf record -g` of the server and of the
tracer's processes during the measured pass, kernel.bpf_stats_enabled on (each BPF program's run
count and time, from the recording's meta.json). Prints per mode: the server's CPU per request,
its samples by category (redis, jemalloc, libc, the agent's hooks, uprobe traps, BPF, system-call
entry/exit, the rest of the kernel), the top symbols of the server and of the tracer, the BPF
programs. Needs root and perf.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import sched_cpu, stop_process
from inject_floor import Bench, Redis, Tracer, physical_cpus, pinned, used_memory

CATEGORIES = [  # (category, test on (dso, symbol)), first match wins
    ("agent hooks", lambda d, s: "allocscope-agent" in d or s.startswith("as_") or "[anon" in d or d == "[unknown]"),
    (
        "uprobe trap",
        lambda d, s: (
            d == "[kernel.kallsyms]"
            and any(k in s for k in ("uprobe", "swbp", "int3", "exc_int3", "xol", "handle_swbp", "arch_uprobe"))
        ),
    ),
    (
        "BPF programs",
        lambda d, s: (
            s.startswith(
                (
                    "bpf_prog_",
                    "__bpf_prog",
                    "bpf_get_stack",
                    "bpf_probe_read",
                    "bpf_ringbuf",
                    "htab_map",
                    "__htab",
                    "bpf_trace",
                )
            )
            or d.startswith("bpf_prog")
            or d == "[bpf]"
        ),
    ),
    (
        "syscall entry/exit",
        lambda d, s: (
            d == "[kernel.kallsyms]"
            and any(
                k in s
                for k in (
                    "syscall_trace",
                    "syscall_exit_work",
                    "trace_sys",
                    "syscall_enter_from_user_mode_work",
                    "perf_syscall",
                    "__traceiter_sys",
                )
            )
        ),
    ),
    ("jemalloc", lambda d, s: "jemalloc" in d or s.startswith("je_") or s.startswith("_rjem")),
    ("libc", lambda d, s: "libc.so" in d),
    ("redis", lambda d, s: "redis" in d),
    ("kernel (other)", lambda d, s: d == "[kernel.kallsyms]"),
]


def categorize(d: str, s: str) -> str:
    for name, test in CATEGORIES:
        if test(d, s):
            return name
    return "other"


SAMPLE = re.compile(r"^\s*(.+?)\s+(\d+)\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)$")


def perf_samples(data: Path) -> list[tuple[int, str, str, str]]:
    """(pid, comm, dso, symbol) of each sample's own frame."""
    p = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,ip,sym,dso", "-G"],
        capture_output=True,
        text=True,
        check=False,
    )
    out = []
    for line in p.stdout.splitlines():
        m = SAMPLE.match(line)
        if m:
            out.append((int(m.group(2)), m.group(1), m.group(5), m.group(4).split("+")[0]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("allocscope")
    ap.add_argument("--modes", default="untraced,inject")
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--freq", type=int, default=1999)
    ap.add_argument("--redis-dir")
    ap.add_argument("--keep", help="keep perf data and traces here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/inject_profile.py: run as root")
    work = Path(a.keep or tempfile.mkdtemp(prefix="inject-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(
        allocscope=a.allocscope, no_estimates=True, rustd_threads=None, bins=str(work), redis_dir=a.redis_dir
    )
    b = Bench(ns, work)
    wl = Redis(b, a.requests)
    stats_path = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats_path.read_text().strip()
    stats_path.write_text("1")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{len(physical_cpus())} cores; {b.cpus.describe()}; load {load}")
    try:
        for r in range(a.rounds):
            for mode in a.modes.split(","):
                srv, port = wl.start()
                tr = None
                try:
                    if mode != "untraced":
                        tr = Tracer(b, mode, srv.pid, f"prof-{mode}-{r}")
                    wl.load(port, a.requests // 4)
                    data = work / f"perf-{mode}-{r}.data"
                    pids = [srv.pid] + (list(tr.mon.cpu) if tr else [])
                    perf = subprocess.Popen(
                        pinned(
                            b.cpus.tracer,
                            [
                                "perf",
                                "record",
                                "-q",
                                "-F",
                                str(a.freq),
                                "-g",
                                "-o",
                                str(data),
                                "-p",
                                ",".join(map(str, pids)),
                            ],
                        ),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(0.5)
                    c0, tc0, t0 = sched_cpu(srv.pid), tr.cpu() if tr else 0.0, time.monotonic()
                    rps = wl.load(port, a.requests)
                    c1, tc1, t1 = sched_cpu(srv.pid), tr.cpu() if tr else 0.0, time.monotonic()
                    perf.send_signal(signal.SIGINT)
                    perf.wait(60)
                    used_memory(port)
                    if tr is not None:
                        tr.finish()
                    n = a.requests * len(rps)
                    print(
                        f"\n== {mode} (round {r + 1}): {n / sum(a.requests / v for v in rps.values()):,.0f} "
                        f"requests/s, server {1e6 * (c1 - c0) / n:.2f} µs CPU a request, tracer "
                        f"{1000 * (tc1 - tc0) / (t1 - t0):.1f} ms CPU a second"
                    )
                    samples = perf_samples(data)
                    srv_s = [s for s in samples if s[0] == srv.pid]
                    cats = collections.Counter(categorize(d, s) for _, _, d, s in srv_s)
                    tot = max(1, len(srv_s))
                    print(
                        f"  server samples {len(srv_s)}: "
                        + ", ".join(f"{k} {100 * v / tot:.1f} %" for k, v in cats.most_common())
                    )
                    top = collections.Counter((d.rsplit("/", 1)[-1], s) for _, _, d, s in srv_s)
                    print(
                        "  server top: "
                        + "; ".join(f"{s} [{d}] {100 * v / tot:.1f} %" for (d, s), v in top.most_common(18))
                    )
                    tr_s = [s for s in samples if s[0] != srv.pid]
                    if tr_s:
                        tt = collections.Counter((d.rsplit("/", 1)[-1], s) for _, _, d, s in tr_s)
                        print(
                            f"  tracer samples {len(tr_s)} (= {len(tr_s) / a.freq / (t1 - t0) * 1000:.0f} ms a "
                            "second): "
                            + "; ".join(f"{s} [{d}] {100 * v / len(tr_s):.1f} %" for (d, s), v in tt.most_common(15))
                        )
                    if tr is not None:
                        meta = json.loads((tr.trace / "meta.json").read_text())
                        st = meta.get("bpf_stats") or {}
                        print(
                            "  BPF (whole recording): "
                            + "; ".join(
                                f"{k} {v['run_cnt']:,} x {v['run_time_ns'] / max(1, v['run_cnt']):,.0f} ns"
                                for k, v in sorted(st.items(), key=lambda kv: -kv[1]["run_time_ns"])
                            )
                        )
                        inj = (meta.get("probes") or {}).get("inject") or {}
                        if inj:
                            print(f"  inject counters: {inj.get('counters')}")
                    stop_process(srv, signal.SIGTERM, 60)
                    if tr is not None:
                        tr.after_target_exit()
                finally:
                    if tr is not None:
                        tr.kill()
                    stop_process(srv, signal.SIGKILL, 30)
    finally:
        stats_path.write_text(was)


if __name__ == "__main__":
    main()
