#!/usr/bin/env python3
"""What `--metrics` costs the tracer (issue 44): CPU per scrape at --metrics-top 10 and 100, and
CPU per snapshot interval with and without the exporter, side by side in one run, on the demo
daemon.

    sudo .venv/bin/python bench/metrics_cost.py [--rounds 3] [--window 10] [--rate 5] [--out FILE]

One demo daemon (demo/provingd.c, paced as `allocscope demo` runs it, partitions for ever) runs
through the whole benchmark. Per round, each configuration in turn (the order rotated every
round) is a fresh `record --pid PID --interval 1` of it: no --metrics; --metrics --metrics-top 10;
--metrics --metrics-top 100. Once attached and idle, the tracer's CPU (utime + stime of
/proc/PID/stat: every thread, those that ended included — prometheus_client serves each request in
a thread of its own) is read over alternating windows of --window seconds: quiet (no scrape) and
scraped (GET /metrics --rate times a second, from this process).
ms per scrape = (scraped CPU - quiet CPU) / scrapes; ms per interval = quiet CPU / intervals; of
which the exporter's thread: its own counter (allocscope_exporter_cpu_seconds_total) over the
quiet windows.
Medians and min-max over rounds.

Then, in this process and without BPF, the exporter fed synthetic snapshots of a daemon with 1000
locations (the demo has only a few, so K = 100 exports all of them there): CPU per scrape
(prometheus_client's exposition of the computed families) and per snapshot (the live model and
the families) at K = 10 and 100.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchlib import TrialError, attach_allocscope, free_port, proc_cpu, stop_process, write_lines

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ("no --metrics", "--metrics-top 10", "--metrics-top 100")


def scrape(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return len(r.read())


def exporter_cpu(url: str | None) -> float:
    """allocscope_exporter_cpu_seconds_total of the exporter at `url` (0 without one)."""
    if url is None:
        return 0.0
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("allocscope_exporter_cpu_seconds_total"))
    return float(line.split()[-1])


def windows(pid: int, url: str | None, window: float, rate: float, pairs: int) -> dict:
    """Alternating quiet and scraped windows of the tracer `pid`; CPU seconds of each kind (and
    the exporter's own counter over the quiet ones), scrapes done, bytes of the last scrape,
    intervals (seconds / 1 s)."""
    quiet = scraped = own = 0.0
    n = size = 0
    for _ in range(pairs):
        e0 = exporter_cpu(url)
        c0 = proc_cpu(pid)
        time.sleep(window)
        c1 = proc_cpu(pid)
        own += exporter_cpu(url) - e0
        if c0 is None or c1 is None:
            raise TrialError("the tracer went away")
        quiet += c1 - c0
        if url is None:
            continue
        c0 = proc_cpu(pid)
        end = time.monotonic() + window
        nxt = time.monotonic()
        while time.monotonic() < end:
            size = scrape(url)
            n += 1
            nxt += 1 / rate
            time.sleep(max(0.0, nxt - time.monotonic()))
        c1 = proc_cpu(pid)
        if c1 is None or c0 is None:
            raise TrialError("the tracer went away")
        scraped += c1 - c0
    return {
        "quiet_s": quiet,
        "scraped_s": scraped,
        "own_s": own,
        "scrapes": n,
        "bytes": size,
        "intervals": pairs * window,
    }


def trial(config: str, pid: int, work: Path, args) -> dict:
    extra = ["--interval", "1"]
    url = None
    if config != CONFIGS[0]:
        port = free_port()
        extra += ["--metrics", f"127.0.0.1:{port}", "--metrics-top", config.split()[-1]]
        url = f"http://127.0.0.1:{port}/metrics"
    out = work / f"t-{config.split()[-1]}-{time.monotonic_ns()}"
    proc, mon = attach_allocscope(pid, out, extra, sys.executable, ROOT)
    try:
        time.sleep(3)  # the first symbolization of the demo's stacks is start-up work
        res = windows(proc.pid, url, args.window, args.rate, args.pairs)
        if url is not None:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            res["series"] = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            res["locations"] = text.count("allocscope_location_live_bytes{")
    finally:
        mon.stop()
        stop_process(proc)
    if proc.returncode != 0:
        raise TrialError(f"record exited {proc.returncode}")
    return res


def synthetic(n_locations: int, snaps: int, scrapes: int) -> list[str]:
    """The exporter in this process, fed `snaps` snapshots of `n_locations` locations each
    changing every snapshot; CPU per snapshot and per scrape (generate_latest) at K = 10, 100."""
    from prometheus_client import generate_latest

    from reports.live.prometheus import MetricsExporter
    from reports.symbolize import Frame

    class Sym:
        def symbolize(self, module, offsets, build_id=None, return_addresses=True):
            return {o: [Frame(f"fn_{o}", module, "daemon.c", o, o)] for o in offsets}

    class Snap:
        def __init__(self, seq, sites, changed, cols):
            self.seq, self.final, self.sites, self.changed, self.stack_columns = seq, False, sites, changed, cols
            self.names, self.allocator, self.allocators, self.blocked = {1: "worker"}, "glibc", (), ()
            self.row = {"seq": seq, "elapsed_s": float(seq), "rss_bytes": 1 << 30, "live_bytes": 0, "lost_live_full": 0}

    lines = []
    for k in (10, 100):
        exp = MetricsExporter("127.0.0.1:0", {"pw": "12"}, k)
        exp.metrics.sym = Sym()
        exp.target_started(1, "daemon", "/tmp/daemon.allocscope")
        cols = {
            "stack_id": [],
            "idx": [],
            "ip": [],
            "module": [],
            "build_id": [],
            "offset": [],
            "syscall": [],
            "function": [],
            "file": [],
            "line": [],
        }
        for sid in range(1, n_locations + 1):
            for key, v in zip(cols, (sid, 0, 0x1000 + sid, "/opt/daemon", "ab", sid, 0, None, None, None)):
                cols[key].append(v)
        exp.flush()
        t_snap = 0.0
        for seq in range(1, snaps + 1):
            sites = {
                (sid, 1, "heap"): (4096 * sid * seq, seq, 0, 0, 4096 * sid * seq) for sid in range(1, n_locations + 1)
            }
            snap = Snap(seq, sites, list(sites), cols if seq == 1 else None)
            t0 = time.process_time()
            exp.metrics.update(snap)  # what the exporter's thread does with each snapshot
            if seq > 1:
                t_snap += time.process_time() - t0
        t0 = time.process_time()
        for _ in range(scrapes):
            body = generate_latest(exp.registry)
        t_scrape = (time.process_time() - t0) / scrapes
        exp.close()
        lines.append(
            f"| {n_locations} locations, K = {k} | {1000 * t_snap / (snaps - 1):.2f} | {1000 * t_scrape:.3f} | "
            f"{len(body)} | {sum(1 for ln in body.decode().splitlines() if ln and not ln.startswith('#'))} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0, help="seconds of each quiet or scraped window")
    ap.add_argument("--pairs", type=int, default=2, help="quiet + scraped window pairs per trial")
    ap.add_argument("--rate", type=float, default=20.0, help="scrapes a second in a scraped window")
    ap.add_argument("--out")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("metrics_cost: needs root (it records)")
    from allocscope.cli.demo import build_daemon

    work = Path(tempfile.mkdtemp(prefix="metrics-cost-"))
    exe = build_daemon(work)
    daemon = subprocess.Popen(
        [str(exe), "--partitions", "1000000000", "--pw", "12", "--bug"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    try:
        time.sleep(2)
        for r in range(args.rounds):
            order = CONFIGS[r % 3 :] + CONFIGS[: r % 3]
            for c in order:
                try:
                    res = trial(c, daemon.pid, work, args)
                except TrialError as e:
                    print(f"round {r + 1} {c}: {e}", file=sys.stderr)
                    continue
                results[c].append(res)
                print(f"round {r + 1} {c}: {res}", file=sys.stderr)
    finally:
        stop_process(daemon, timeout=10)

    def med(xs: list[float], fmt: str) -> str:
        if not xs:
            return "-"
        return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

    lines = [
        f"Demo daemon (demo/provingd.c --pw 12 --bug, paced), record --interval 1; {args.rounds} rounds, "
        f"{args.pairs} x ({args.window:.0f} s quiet + {args.window:.0f} s scraped at {args.rate:g}/s) per trial; "
        "median (min-max)",
        "",
        "| configuration | tracer ms per interval (quiet) | of which the exporter's thread | ms per scrape "
        "| series | locations | bytes per scrape |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in CONFIGS:
        rs = results[c]
        per_interval = [1000 * x["quiet_s"] / x["intervals"] for x in rs]
        per_scrape = [1000 * (x["scraped_s"] - x["quiet_s"]) / x["scrapes"] for x in rs if x["scrapes"]]
        own = [1000 * x["own_s"] / x["intervals"] for x in rs if x["scrapes"]]
        lines.append(
            f"| {c} | {med(per_interval, '.2f')} | {med(own, '.2f') if own else '-'} | "
            f"{med(per_scrape, '.2f') if per_scrape else '-'} | "
            f"{rs[-1].get('series', '-') if rs else '-'} | {rs[-1].get('locations', '-') if rs else '-'} | "
            f"{rs[-1].get('bytes', '-') if rs and per_scrape else '-'} |"
        )
    lines += [
        "",
        "The exporter alone, in-process, synthetic snapshots (every location changes every snapshot):",
        "",
        "| daemon | ms per snapshot (model + families) | ms per scrape (exposition) | bytes | series |",
        "|---|---|---|---|---|",
        *synthetic(1000, 20, 200),
    ]
    print("\n".join(lines))
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
