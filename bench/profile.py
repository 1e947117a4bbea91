#!/usr/bin/env python3
"""Where a recording's cost goes: the tracer's own Python (py-spy) and each BPF program's run
time (kernel.bpf_stats_enabled), while allocscope records the demo daemon — for any checkout, so
the same workload profiles the code before and after a change.

    sudo .venv/bin/python bench/profile.py [--root CHECKOUT] [--mode full|residency]
                                           [--workload demo|demo-large] [--rate 200]

CHECKOUT (default: this one) must have its .venv (make setup). The daemon is this checkout's
demo/provingd.c, unpaced, with --wait-signal: the tracer attaches, settles (its first snapshot
done, then idle), the daemon works; py-spy samples the tracer during the work only; the BPF
programs' run time and run count are read from outside (bpf(2) on the tracer's program ids, names
as the kernel keeps them: 15 characters) before and after the work. Prints the tracer's CPU
during the work against the daemon's, the hottest functions of the tracer (own and cumulative
samples) and the BPF time per program.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import TrialError, attach_allocscope, kill_pid, proc_cpu, read_line, stop_process

from tracer.bpf.objects import program_stats_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOADS = {
    "demo": ["--synth-ms", "0", "--gpu-ms", "0", "--pw", "3", "--partitions", "200"],
    "demo-large": [
        "--synth-ms",
        "0",
        "--gpu-ms",
        "0",
        "--pw",
        "4",
        "--workers",
        "16",
        "--partition-mb",
        "128",
        "--partitions",
        "24",
    ],
}


def pyspy_summary(raw: Path, top: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, hottest leaf functions, hottest functions on the stack) of a py-spy raw file."""
    own: collections.Counter = collections.Counter()
    cum: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        k = int(n)
        total += k
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0].rstrip(")") for f in stack.split(";")]
        own[frames[-1]] += k
        for f in set(frames):
            cum[f] += k
    return (
        total,
        own.most_common(top),
        [
            (f, c)
            for f, c in cum.most_common(top + 12)
            if not f.startswith(("<module>", "Command.", "Group.", "Context.", "main ", "_run_code", "_run_module"))
        ][:top],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose allocscope records (default: this one)")
    ap.add_argument("--mode", choices=["full", "residency"], default="full")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="demo-large")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/profile.py: run as root (it attaches BPF probes)")
    root = Path(args.root).resolve()
    py = root / ".venv" / "bin" / "python"
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not py.exists():
        sys.exit(f"{py} missing: run make setup in {root}")
    if not Path(pyspy).exists():
        sys.exit("py-spy missing: make bench installs it (pip install py-spy)")
    stats_was = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    rev = subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
    ).stdout.strip()[:70]
    try:
        with tempfile.TemporaryDirectory(prefix="allocscope-profile-") as td:
            tmp = Path(td)
            exe = tmp / "provingd"
            subprocess.run(
                [
                    "gcc",
                    "-std=c11",
                    "-O2",
                    "-g",
                    "-fno-omit-frame-pointer",
                    "-pthread",
                    "-o",
                    str(exe),
                    str(ROOT / "demo" / "provingd.c"),
                ],
                check=True,
            )
            prog = subprocess.Popen(
                [str(exe), "--wait-signal", *WORKLOADS[args.workload]],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            pid = int(read_line(prog, "ready", timeout=60).split()[1])
            out = tmp / "p.allocscope"
            try:
                tracer, mon = attach_allocscope(pid, out, ["--mode", args.mode], py, root)
            except TrialError as e:
                kill_pid(pid)
                sys.exit(str(e))
            try:
                before = program_stats_of(tracer.pid)
                cpu0, tcpu0 = mon.cpu_total(), proc_cpu(pid) or 0.0
                raw = tmp / "pyspy.txt"
                spy = subprocess.Popen(
                    [
                        pyspy,
                        "record",
                        "-p",
                        str(tracer.pid),
                        "-r",
                        str(args.rate),
                        "-f",
                        "raw",
                        "-o",
                        str(raw),
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)  # py-spy attached
                t0 = time.monotonic()
                os.kill(pid, signal.SIGUSR1)
                while True:  # the summary line ends the work
                    line = prog.stderr.readline()
                    if not line or ("elapsed" in line and line.startswith("provingd:")):
                        break
                secs = time.monotonic() - t0
                tcpu = proc_cpu(pid) or tcpu0
                cpu = mon.cpu_total() - cpu0
                after = program_stats_of(tracer.pid)
                stop_process(spy, signal.SIGINT, 60)
            finally:
                stop_process(tracer)
                mon.stop()
                if prog.poll() is None:
                    kill_pid(pid)
                    prog.wait()
            print(
                f"bench/profile.py {time.strftime('%Y-%m-%d %H:%M %Z')}: {root} ({rev}), --mode {args.mode}, "
                f"{args.workload} ({' '.join(WORKLOADS[args.workload])})"
            )
            print(
                f"work {secs:.2f} s; daemon CPU {tcpu - tcpu0:.2f} s; tracer CPU {cpu:.3f} s "
                f"({cpu / max(tcpu - tcpu0, 1e-9) * 100:.1f} % of the daemon's)"
            )
            if raw.exists():
                total, own, cum = pyspy_summary(raw, args.top)
                print(
                    f"\ntracer (py-spy, {args.rate}/s, {total} samples during the work; by py-spy's default a "
                    "thread it sees waiting is not sampled):"
                )
                print("  own samples  function")
                for f, c in own:
                    print(f"  {c:>11}  {f}")
                print("  cumulative   function")
                for f, c in cum:
                    print(f"  {c:>11}  {f}")
            print("\nBPF programs during the work (run time, runs, ns a run; names as the kernel keeps them):")
            rows = []
            for name, (ns, cnt) in after.items():
                ns0, cnt0 = before.get(name, (0, 0))
                if cnt - cnt0:
                    rows.append((ns - ns0, cnt - cnt0, name))
            for ns, cnt, name in sorted(rows, reverse=True):
                print(f"  {name:16s} {ns / 1e6:9.1f} ms  {cnt:>10,}  {ns / cnt:8.0f}")
            print(f"  {'total':16s} {sum(r[0] for r in rows) / 1e6:9.1f} ms  {sum(r[1] for r in rows):>10,}")
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(stats_was)


if __name__ == "__main__":
    main()
