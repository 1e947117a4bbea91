#!/usr/bin/env python3
"""What tracing waits costs (issue 21): the sched_switch program, per context switch.

bench/switch.c hands a token between two threads (every hand-off blocks one thread and wakes
the other: one blocking switch each). Configurations, interleaved per round so machine noise
hits them alike:

  untraced        no tracer
  waits-off       allocscope record --wait-min 0 (allocator probes only; sched_switch detached)
  waits           allocscope record (default --wait-min 1: every block's stack is taken, the
                  waits shorter than 1 ms are only counted)
  waits-all       allocscope record --wait-min 0.001 (every wait kept by stack)

Per configuration: median seconds for the hand-offs, hand-offs/s kept vs untraced, the cost per
blocking switch against waits-off (the same tracer without the sched_switch program) from the
trace's own count of blocking switches (n_waits) — noisy: a hand-off costs tens of us in a VM —
and, exact, the sched_switch program's own run time from the kernel (kernel.bpf_stats_enabled=1
for the run, restored after): ns per run (every switch of the machine runs it) and its total
over the target's blocking switches (what one costs, the other processes' switches included).

    sudo .venv/bin/python bench/waits.py [--rounds 5] [--handoffs 200000]
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from benchlib import attach_allocscope, read_line, stop_process  # noqa: E402

# the raw tracepoint where the kernel's BTF gives the offsets, else the classic one
SWITCH_PROGS = ("raw_tracepoint__sched_switch", "tracepoint__sched__sched_switch")
CONFIGS = {"untraced": None, "waits-off": ["--wait-min", "0"], "waits": [], "waits-all": ["--wait-min", "0.001"]}


def build() -> Path:
    exe = Path(tempfile.gettempdir()) / "allocscope-bench-switch"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-Wall", "-o", str(exe), str(HERE / "switch.c")], check=True)
    return exe


def trial(exe: Path, cfg: str, handoffs: int, tmp: Path) -> tuple[float, int, dict]:
    """(seconds for the hand-offs, blocking switches the trace counted (0 untraced), the
    sched_switch program's run_time_ns and run_cnt)."""
    p = subprocess.Popen([str(exe), str(handoffs // 2)], stdout=subprocess.PIPE, text=True)
    tr = None
    try:
        read_line(p, "ready")
        out = tmp / f"{cfg}.allocscope"
        if CONFIGS[cfg] is not None:
            tr, mon = attach_allocscope(p.pid, out, ["--interval", "0.5", *CONFIGS[cfg]], sys.executable, ROOT)
            mon.stop()
        p.send_signal(signal.SIGUSR1)
        line = read_line(p, "elapsed", timeout=600)
        p.wait(60)
        secs = float(line.split()[1])
    finally:
        if p.poll() is None:
            p.kill()
        stop_process(tr)
    waits, stats = 0, {}
    if tr is not None:
        rep = subprocess.run(
            [sys.executable, "-m", "allocscope", "report", str(out), "--format", "json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        waits = json.loads(rep.stdout)["waits"]["blocking_switches"]
        all_stats = json.loads((out / "meta.json").read_text()).get("bpf_stats", {})
        stats = next((all_stats[p] for p in SWITCH_PROGS if p in all_stats), {})
    return secs, waits, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--handoffs", type=int, default=200000)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/waits.py: run as root (it attaches BPF probes)")
    exe = build()
    res: dict[str, list[tuple[float, int, dict]]] = {c: [] for c in CONFIGS}
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = knob.read_text().strip()
    knob.write_text("1")
    try:
        with tempfile.TemporaryDirectory() as d:
            for r in range(args.rounds):
                for cfg in CONFIGS:
                    res[cfg].append(trial(exe, cfg, args.handoffs, Path(d)))
                    print(
                        f"round {r + 1} {cfg}: {res[cfg][-1][0]:.3f}s, blocking switches {res[cfg][-1][1]}",
                        file=sys.stderr,
                    )
    finally:
        knob.write_text(was)
    med = {c: statistics.median(s for s, _, _ in v) for c, v in res.items()}
    base = med["untraced"]
    print(f"\n{args.handoffs} hand-offs, {args.rounds} rounds, medians")
    print(
        f"{'config':<10} {'seconds':>8} {'kept':>6} {'switches':>9} {'per switch vs waits-off':>24} "
        f"{'program ns/run':>15} {'program runs':>13} {'program ns / target switch':>27}"
    )
    for c, v in res.items():
        sw = statistics.median(w for _, w, _ in v)
        per = (med[c] - med["waits-off"]) / sw * 1e9 if sw and c.startswith("waits") and c != "waits-off" else None
        runs = sum(st.get("run_cnt", 0) for _, _, st in v)
        ns = sum(st.get("run_time_ns", 0) for _, _, st in v)
        tsw = sum(w for _, w, _ in v)
        print(
            f"{c:<10} {med[c]:>8.3f} {base / med[c]:>6.1%} {sw:>9.0f} "
            f"{f'{per:,.0f} ns' if per is not None else '-':>24} "
            f"{f'{ns / runs:,.0f}' if runs else '-':>15} {runs // max(1, len(v)):>13} "
            f"{f'{ns / tsw:,.0f}' if runs and tsw else '-':>27}"
        )


if __name__ == "__main__":
    main()
