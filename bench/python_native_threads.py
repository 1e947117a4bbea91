#!/usr/bin/env python3
"""What a native thread (no PyThreadState: a BLAS pool's, a C library's own) costs the probe in a
traced Python process (issue 51, probes/python.h py_find_tstate): such a thread is never in
`pythreads`, so the probe looks for it among the interpreter's thread states, and, found in none,
not again for AS_PY_REWALK_NS (the `pynotstate` LRU map: one lookup an allocation).

A Python program (pyenv's 3.12.1) calls, through ctypes, a C function that starts a pthread doing
N malloc(1024)+free pairs; attached with `record --pid`, per round: the walk off
(--no-python-frames), Python frames without the probe's own thread lookup
(ALLOCSCOPE_PYTHON_FIND=0: the state before it), and with it. BPF ns/alloc: the allocation
programs' run time (kernel.bpf_stats_enabled) over the native thread's mallocs.

    sudo .venv/bin/python bench/python_native_threads.py [--rounds 3] [--iters 200000] [-o FILE.md]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import read_line  # noqa: E402
from python_frames import start_record, summarize  # noqa: E402

C = r"""
#include <pthread.h>
#include <stdlib.h>
static void *run(void *a) {
    long n = (long)a;
    for (long i = 0; i < n; i++) { void *volatile p = malloc(1024); free(p); }
    return 0;
}
int spawn(long n) { pthread_t t; pthread_create(&t, 0, run, (void *)n); return pthread_join(t, 0); }
"""
PROG = r"""
import ctypes, signal, sys, threading, time
lib = ctypes.CDLL(sys.argv[1]); n = int(sys.argv[2])
go = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: go.set())
print("ready", flush=True)
go.wait()
t = time.perf_counter()
lib.spawn(ctypes.c_long(n))
print(f"done {time.perf_counter() - t:.6f}", flush=True)
go.clear(); go.wait()
"""
CONFIGS = {"walk-off": {}, "no-find": {"ALLOCSCOPE_PYTHON_FIND": "0"}, "python": {}}


def once(py: str, lib: Path, iters: int, config: str, tmp: Path) -> tuple[float, dict]:
    prog = subprocess.Popen([py, "-c", PROG, str(lib), str(iters)], stdout=subprocess.PIPE, text=True)
    read_line(prog, "ready")
    out = tmp / f"{config}-{os.urandom(4).hex()}"
    env_was = dict(os.environ)
    os.environ.update(CONFIGS[config])
    try:
        tracer = start_record(prog.pid, config, out)
    finally:
        os.environ.clear()
        os.environ.update(env_was)
    try:
        import time

        time.sleep(1.0)
        prog.send_signal(signal.SIGUSR1)
        secs = float(read_line(prog, "done", timeout=600).split()[1])
        time.sleep(0.6)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(120)
        return secs, summarize(out)
    finally:
        prog.kill()
        prog.wait()
        if tracer.poll() is None:
            tracer.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200000)
    ap.add_argument("--python", default=str(Path.home() / ".pyenv/versions/3.12.1/bin/python3.12"))
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    stats_file = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_was = stats_file.read_text().strip()
    stats_file.write_text("1")
    rows: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    try:
        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td)
            (tmp / "spawn.c").write_text(C)
            lib = tmp / "libspawn.so"
            subprocess.run(
                ["gcc", "-O2", "-shared", "-fPIC", "-pthread", "-o", str(lib), str(tmp / "spawn.c")], check=True
            )
            for r in range(a.rounds):
                for config in CONFIGS:
                    secs, info = once(a.python, lib, a.iters, config, tmp)
                    print(f"round {r + 1} {config}: {secs:.3f} s {info}", flush=True)
                    rows[config].append((secs, info.get("bpf_ns") or float("nan")))
    finally:
        stats_file.write_text(stats_was)
    lines = [
        f"python {a.python}, a native thread's {a.iters} malloc(1024)+free, {a.rounds} rounds, medians",
        "",
        "| config | loop s | BPF ns/alloc (alloc_*) | per round BPF ns/alloc |",
        "|---|---|---|---|",
    ]
    for config, vals in rows.items():
        secs = statistics.median(v[0] for v in vals)
        ns = statistics.median(v[1] for v in vals)
        lines.append(f"| {config} | {secs:.3f} | {ns:.0f} | {', '.join(f'{v[1]:.0f}' for v in vals)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.output:
        Path(a.output).write_text(text)


if __name__ == "__main__":
    main()
