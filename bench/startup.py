"""Start-up of `allocscope record`: seconds from the command to the "recording pid" line, then
how long it takes to finish after SIGINT. Run as root:

    sudo .venv/bin/python bench/startup.py --pid PID [--root CHECKOUT] [--rounds 3] [--no-cache]

--root runs another checkout's code with this venv (e.g. a worktree of an older commit);
--no-cache sets ALLOCSCOPE_BPF_CACHE=0 (BCC compiles every time, as before issue #23).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def once(root: str, pid: int, cache: bool) -> tuple[float, float]:
    env = dict(os.environ, ALLOCSCOPE_BPF_CACHE="1" if cache else "0")
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "allocscope", "record", "--pid", str(pid), "-o",
                              str(Path(d) / "s.allocscope")], cwd=root, stderr=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, env=env, text=True)
        live = float("nan")
        for line in p.stderr:
            if "recording pid" in line:
                live = time.perf_counter() - t
                break
        t2 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=120)
        return live, time.perf_counter() - t2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-cache", action="store_true")
    a = ap.parse_args()
    for _ in range(a.rounds):
        live, end = once(a.root, a.pid, not a.no_cache)
        print(f"live after {live:.2f} s; finished {end:.2f} s after SIGINT; load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
