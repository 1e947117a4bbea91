"""`allocscope watch` over N processes of one command line at once (issue 50): attach time and the
tracer's CPU with 1 and with 8 targets.

    sudo .venv/bin/python bench/watch_fleet.py                        # N = 1 and 8, 3 rounds each
    sudo .venv/bin/python bench/watch_fleet.py --n 1 4 8 --rounds 2 --out OUT.md

Each round: N daemons (tests/targets/restartd.c `hold 600 100`: one 1 MiB + 4 KiB block
every 100 ms, touched, for a minute) are started, N-1 before the watch and the last one after it
(held at its exec: the restart path). Measured from outside the watcher:

* attach: from the watch's "watching" line to each running process's "recording pid" line (the
  N-1 found at the start, attached in parallel threads whose BPF builds take turns), and for the
  one started after: from its spawn to its "recording pid" line (held at its exec meanwhile);
* the watcher's CPU (utime + stime of its process, every thread) over the WINDOW seconds while
  the N daemons allocate, per second of wall time, and its RSS at the end of the window.

Each watched process is its own Recorder with its own probes, pid-filtered (tracer/watch/
incarnation.py): the figures say what that costs per process.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Lines:
    """The watch's stderr lines with the monotonic time each came."""

    def __init__(self, p: subprocess.Popen) -> None:
        self.seen: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._pump, args=(p.stderr,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            with self.lock:
                self.seen.append((time.monotonic(), line))

    def when(self, needle: str, timeout: float = 180) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                for t, line in self.seen:
                    if needle in line:
                        return t
            time.sleep(0.02)
        raise SystemExit(f"the watch did not say {needle!r}:\n" + "".join(ln for _, ln in self.seen))


def one_round(exe: Path, n: int, window: float, work: Path) -> dict:
    mib, step = 600, 100  # ten 1 MiB blocks a second for a minute: busy through the attach and the window
    daemons = [
        subprocess.Popen([str(exe), "hold", str(mib), str(step)], stdout=subprocess.DEVNULL) for _ in range(n - 1)
    ]
    out = work / f"traces-{n}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "allocscope", "watch", "--pgrep", f"^{exe} hold", "-o", str(out)]
    w = subprocess.Popen(cmd, cwd=str(ROOT), stderr=subprocess.PIPE, text=True)
    lines = Lines(w)
    try:
        t_watch = lines.when("watching")
        found = [lines.when(f"recording pid {d.pid} ") - t_watch for d in daemons]
        t_spawn = time.monotonic()
        late = subprocess.Popen([str(exe), "hold", str(mib), str(step)], stdout=subprocess.DEVNULL)
        daemons.append(late)
        held = lines.when(f"recording pid {late.pid} ") - t_spawn
        c0, t0 = cpu_s(w.pid), time.monotonic()
        time.sleep(window)
        cpu = (cpu_s(w.pid) - c0) / (time.monotonic() - t0)
        rss = rss_mib(w.pid)
    finally:
        for d in daemons:
            d.kill()
            d.wait()
        w.send_signal(signal.SIGINT)
        w.wait(120)
    return {"found": found, "held": held, "cpu": cpu, "rss": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0, help="seconds of allocation measured")
    ap.add_argument("--out", help="append a Markdown table here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="watch-fleet-"))
    exe = work / "restartd"
    subprocess.run(
        ["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(exe), str(ROOT / "tests/targets/restartd.c")],
        check=True,
    )
    rows = [
        "| targets | attach, found at the start (max of N-1, s) | attach, held at its exec (s) "
        "| watcher CPU (% of a core) | watcher RSS (MiB) |",
        "|---|---|---|---|---|",
    ]
    for n in args.n:
        res = [one_round(exe, n, args.window, work) for _ in range(args.rounds)]
        found = [max(r["found"]) for r in res if r["found"]]
        row = (
            f"| {n} | {statistics.median(found):.2f} ({min(found):.2f}-{max(found):.2f})" if found else f"| {n} | -"
        ) + (
            f" | {statistics.median(r['held'] for r in res):.2f}"
            f" | {100 * statistics.median(r['cpu'] for r in res):.1f}"
            f" | {statistics.median(r['rss'] for r in res):.0f} |"
        )
        rows.append(row)
        print(row, flush=True)
    print("\n".join(rows))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
