#!/usr/bin/env python3
"""The tracer's own cost per interval (issue 33): its CPU per snapshot, step by step, with N live
sites and K of them changing per interval, for two checkouts side by side (before, after).

    sudo .venv/bin/python bench/interval_cost.py [--before DIR] [--after DIR] [--sites 100,10000,100000]
                                                [--changing 10,1000] [--seconds 12] [--out FILE]
    sudo .venv/bin/python bench/interval_cost.py --redis REDIS_DIR [--seconds 20]   # redis under load

Each trial launches bench/sites.c (frame pointers, recorded with --unwind fp; N sites: one
block of 4 KiB at each of N distinct stacks, K of them freed and allocated again every
interval), attaches `record --pid PID --inject
--sample-bytes 4096` (every block sampled: the sites are exact) run in-process by a child
python whose sys.path starts with the checkout, times each step of Recorder.snapshot with the
thread's CPU clock (time.thread_time_ns, inclusive of the steps it calls) and the whole
process's CPU between snapshots (every thread: ring polling, the unwinder, prefetch reads), and
prints ms per interval (median over the steady intervals: after the one that saw the N sites
appear). With --redis: redis-server under redis-benchmark (set/get/lpush/lpop, 50 clients),
`--inject --sample-bytes 524288`, the same figures.

DIR: a checkout (default before: none; after: this one) whose tracer/agent and tracer/cfi .so
are built (make setup). A DIR of an older commit is made with
`git archive COMMIT | tar -x -C DIR` and the two .so copied in.
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

from benchlib import REDIS_LOAD, free_port, redis_ping, redis_server_cmd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (module, class or None, attribute): what is timed inside Recorder.snapshot; missing ones are skipped
STEPS = [
    ("tracer.record", "Recorder", "snapshot"),
    ("tracer.record", "Recorder", "_peak_snapshot"),
    ("tracer.record", "Recorder", "replay_slow"),
    ("tracer.record", "Recorder", "_interval_row"),
    ("tracer.record", "Recorder", "_measure_allocators"),
    ("tracer.record", "Recorder", "_counters"),
    ("tracer.record", None, "flow_part"),
    ("tracer.maps", "MapsWatcher", "part"),
    ("tracer.maps", "MapsWatcher", "refresh"),
    ("tracer.probe", "Probes", "read_sites"),
    ("tracer.probe", "Probes", "read_fault_sites"),
    ("tracer.probe", "Probes", "read_releases"),
    ("tracer.probe", "Probes", "read_waits"),
    ("tracer.probe", "Probes", "read_offcpu"),
    ("tracer.probe", "Probes", "read_flows"),
    ("tracer.probe", "Probes", "read_counters"),
    ("tracer.probe", "Probes", "read_totals"),
    ("tracer.probe", "Probes", "read_tlb"),
    ("tracer.probe", "Probes", "read_stacks"),
    ("tracer.probe", "Probes", "read_regions"),
    ("tracer.probe", "Probes", "read_untracked"),
    ("tracer.tables", "SiteTable", "update"),
    ("tracer.tables", "SiteTable", "part"),
    ("tracer.tables", "ReleaseTable", "part"),
    ("tracer.tables", "WaitTable", "parts"),
    ("tracer.tables", "StackTable", "columns"),
    ("tracer.tables", "ThreadTable", "look_up"),
    ("tracer.tables", "HeapMeter", "measure"),
    ("tracer.retention", "AllocatorMeter", "measure"),
    ("tracer.retention", None, "live_by_source"),
    ("tracer.record", None, "live_by_source"),
    ("tracer.procfs", None, "rss"),
    ("tracer.procfs", None, "read_maps"),
    ("common.tracefile.writer", "TraceWriter", "write_part"),
    ("tracer.sitechanges", "SiteReader", "update"),
    ("tracer.sitechanges", "SiteReader", "_drain"),
    ("tracer.sitechanges", "SiteReader", "_look_up"),
    ("tracer.sitechanges", "SiteReader", "flows"),
]


# ---------------------------------------------------------------------------------------------
# the child: one recording, in-process, timed


def _child(args) -> None:
    sys.path.insert(0, args.root)
    os.chdir(args.root)
    import importlib

    snaps: list[dict] = []
    cur: dict | None = None

    def wrap(name, fn):
        def timed(*a, **kw):
            nonlocal cur
            top = name == "Recorder.snapshot"
            if top:
                cur = {"_cpu0": _proc_cpu_ns()}
            if cur is None:
                return fn(*a, **kw)
            t0 = time.thread_time_ns()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.thread_time_ns() - t0
                if cur is not None:
                    cur[name] = cur.get(name, 0) + dt
                    if name == "TraceWriter.write_part":  # and per table
                        sub = f"write_part {a[1]}"
                        cur[sub] = cur.get(sub, 0) + dt
                if top and cur is not None:
                    cur["_final"] = bool(kw.get("final") or (len(a) > 1 and a[1]))
                    cur["_t"] = time.monotonic()
                    cur["_cpu1"] = _proc_cpu_ns()
                    snaps.append(cur)
                    cur = None

        timed.__wrapped__ = fn
        return timed

    for mod, cls, attr in STEPS:
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        owner = getattr(m, cls, None) if cls else m
        if owner is None or not hasattr(owner, attr):
            continue
        fn = getattr(owner, attr)
        name = f"{cls}.{attr}" if cls else attr
        setattr(owner, attr, wrap(name, fn))

    from tracer.options import RecordOptions
    from tracer.record import record
    from tracer.target import target_from_pid

    opts = RecordOptions(
        output=args.trace,
        duration=args.seconds,
        interval=args.interval,
        quiet=True,
        force=True,
        inject=True,
        sample_bytes=args.sample_bytes,
        max_stacks=args.max_stacks,
        max_sites=args.max_sites,
        **json.loads(args.extra),
    )
    s = record(target_from_pid(args.pid), opts)
    Path(args.json).write_text(json.dumps({"snaps": snaps, "intervals": s.intervals, "sites": s.sites}))


def _proc_cpu_ns() -> int:
    return time.process_time_ns()  # every thread of the process, to the ns


# ---------------------------------------------------------------------------------------------
# the parent: targets, trials, tables


def run_child(
    root: Path,
    pid: int,
    trace: Path,
    seconds: float,
    sample_bytes: int,
    on_first=None,
    extra: dict | None = None,
    interval: float = 1.0,
    max_stacks: int = 1 << 18,
) -> dict:
    js = trace.with_suffix(".json")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_child",
        "--root",
        str(root),
        "--pid",
        str(pid),
        "--trace",
        str(trace),
        "--json",
        str(js),
        "--seconds",
        str(seconds),
        "--sample-bytes",
        str(sample_bytes),
        "--interval",
        str(interval),
        "--max-stacks",
        str(max_stacks),
        "--max-sites",
        str(1 << 19),
        "--extra",
        json.dumps(extra or {}),
    ]
    p = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)}
    )
    first = trace / "parts" / "intervals-000001.parquet"
    end = time.monotonic() + 300
    while not first.exists():
        if p.poll() is not None or time.monotonic() > end:
            p.kill()
            raise RuntimeError(f"record did not start: {p.stderr.read()[-600:]}")
        time.sleep(0.05)
    if on_first is not None:
        on_first()
    err = p.communicate()[1]
    if p.returncode != 0:
        raise RuntimeError(f"record failed ({p.returncode}): {err[-600:]}")
    return json.loads(js.read_text())


def seq_now(trace: Path) -> int:
    return len(list((trace / "parts").glob("intervals-*.parquet")))


def build_sites(out: Path) -> Path:
    exe = out / "sites"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-o",
            str(exe),
            str(HERE / "sites.c"),
        ],
        check=True,
    )
    return exe


def summarize(res: dict, skip_until_t: float) -> dict:
    """Median ms per interval of each step, and of the process's CPU, over the steady intervals."""
    steady = [s for s in res["snaps"] if not s["_final"] and s["_t"] > skip_until_t]
    out: dict = {"n": len(steady)}
    if not steady:
        return out
    names = sorted({k for s in steady for k in s if not k.startswith("_")})
    for k in names:
        out[k] = statistics.median(s.get(k, 0) for s in steady) / 1e6
    cpu = [(b["_cpu1"] - a["_cpu1"]) / 1e6 for a, b in zip(steady, steady[1:])]
    out["process"] = statistics.median(cpu) if cpu else float("nan")
    fin = [s for s in res["snaps"] if s["_final"]]
    out["final"] = fin[0].get("Recorder.snapshot", 0) / 1e6 if fin else float("nan")
    return out


def sites_trial(root: Path, exe: Path, n: int, k: int, seconds: float, tmp: Path, tag: str) -> dict:
    tgt = subprocess.Popen([str(exe), str(n), str(k), "1000"], stdout=subprocess.PIPE, text=True)
    try:
        line = tgt.stdout.readline()
        assert line.startswith("ready"), line
        trace = tmp / f"{tag}-{n}-{k}.allocscope"
        live_at = [float("inf")]

        def go():
            time.sleep(3)  # the target's unwind rows built: its stacks are whole from the first block on
            tgt.send_signal(signal.SIGUSR1)
            line = tgt.stdout.readline()
            assert line.startswith("live"), line
            live_at[0] = time.monotonic() + 1.5  # the snapshot after this one sees the N sites appear

        # frame-pointer stacks: with DWARF unwinding a site's first block and its later ones were
        # seen at two stacks here (the first pass's unwound before the module's rows were whole)
        res = run_child(root, tgt.pid, trace, seconds, 4096, go, extra={"unwind": "fp"})
        # steady: after the snapshot that saw the N sites (and their stacks) appear
        seen = [s["_t"] for s in res["snaps"] if s.get("StackTable.columns", 0) > 0]
        return summarize(res, max([live_at[0], *seen])) | {"sites": res["sites"]}
    finally:
        tgt.terminate()
        tgt.wait()


def redis_trial(root: Path, rdir: Path, seconds: float, tmp: Path, tag: str) -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": str(rdir)}
    port = free_port()
    srv = subprocess.Popen(
        redis_server_cmd(str(rdir / "redis-server"), port),
        stdout=subprocess.DEVNULL,
        env=env,
    )
    load = None
    try:
        for _ in range(400):
            if redis_ping(port):
                break
            time.sleep(0.05)
        trace = tmp / f"{tag}-redis.allocscope"
        started = [float("inf")]

        def go():
            nonlocal load
            load = subprocess.Popen(
                [
                    str(rdir / "redis-benchmark"),
                    "-p",
                    str(port),
                    "-t",
                    "set,get,lpush,lpop",
                    "-n",
                    "100000000",
                    *REDIS_LOAD,
                    "-q",
                    "-l",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            started[0] = time.monotonic() + 2.5

        res = run_child(root, srv.pid, trace, seconds, 524288, go)
        return summarize(res, started[0]) | {"sites": res["sites"]}
    finally:
        if load is not None:
            load.kill()
            load.wait()
        srv.kill()
        srv.wait()


MAIN_STEPS = [
    "Recorder.snapshot",
    "MapsWatcher.part",
    "SiteReader.update",
    "SiteReader._drain",
    "SiteReader._look_up",
    "Probes.read_sites",
    "SiteTable.update",
    "SiteReader.flows",
    "SiteTable.part",
    "Probes.read_releases",
    "ReleaseTable.part",
    "Probes.read_waits",
    "Probes.read_offcpu",
    "WaitTable.parts",
    "Probes.read_flows",
    "flow_part",
    "Probes.read_stacks",
    "StackTable.columns",
    "ThreadTable.look_up",
    "Recorder._interval_row",
    "Probes.read_counters",
    "Probes.read_tlb",
    "Probes.read_totals",
    "rss",
    "HeapMeter.measure",
    "Recorder._measure_allocators",
    "AllocatorMeter.measure",
    "live_by_source",
    "read_maps",
    "TraceWriter.write_part",
]


def table(rows: list[tuple[str, dict]]) -> str:
    """Steps as rows, trials as columns (ms per interval)."""
    steps = [s for s in MAIN_STEPS if any(s in r for _, r in rows)]
    head = "| step (ms per interval, thread CPU, inclusive) | " + " | ".join(t for t, _ in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    steps += sorted({k for _, r in rows for k in r if k.startswith("write_part ")})
    for s in ["process"] + steps + ["final"]:
        label = {
            "process": "**tracer process CPU per interval (all threads)**",
            "final": "final snapshot (once)",
            "Recorder.snapshot": "**Recorder.snapshot**",
        }.get(s, s)
        lines.append(f"| {label} | " + " | ".join(f"{r.get(s, 0):.2f}" for _, r in rows) + " |")
    lines.append("| steady intervals measured | " + " | ".join(str(r.get("n", 0)) for _, r in rows) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("_child")
    for a in ("--root", "--trace", "--json", "--extra"):
        c.add_argument(a, required=True)
    c.add_argument("--pid", type=int, required=True)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--interval", type=float, default=1.0)
    c.add_argument("--sample-bytes", type=int, required=True)
    c.add_argument("--max-stacks", type=int, default=1 << 18)
    c.add_argument("--max-sites", type=int, default=1 << 19)
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--sites", default="100,10000,100000")
    ap.add_argument("--changing", default="10,1000")
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--redis", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.cmd == "_child":
        _child(args)
        return
    roots = [(n, p.resolve()) for n, p in (("before", args.before), ("after", args.after)) if p is not None]
    lines = [
        f"# Tracer CPU per interval ({time.strftime('%Y-%m-%d')}, {os.uname().release}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="interval-cost-") as d:
        tmp = Path(d)
        if args.redis:
            rows = []
            for name, root in roots:
                rows.append((f"{name}: redis", redis_trial(root, args.redis, args.seconds, tmp, name)))
                print(f"{rows[-1][0]}: {rows[-1][1].get('process', 0):.2f} ms/interval", flush=True)
            lines += ["## redis-server under redis-benchmark, --inject --sample-bytes 524288", "", table(rows), ""]
        else:
            exe = build_sites(tmp)
            for n in [int(x) for x in args.sites.split(",")]:
                for k in [int(x) for x in args.changing.split(",")]:
                    if k > n:
                        continue
                    rows = []
                    for name, root in roots:
                        r = sites_trial(root, exe, n, k, args.seconds, tmp, name)
                        rows.append((f"{name}: N={n} K={k}", r))
                        print(
                            f"{rows[-1][0]}: process {r.get('process', 0):.2f} ms/interval, snapshot "
                            f"{r.get('Recorder.snapshot', 0):.2f} ms, sites {r['sites']}",
                            flush=True,
                        )
                    lines += [f"## N={n} live sites, K={k} changing per interval", "", table(rows), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
