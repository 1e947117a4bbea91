"""Start-up of `allocscope record --pid`, cold and warm unwind cache side by side: seconds from
the command to live probes ("recording pid"), and to complete stacks through the modules that
allocate (the last module the recording's stacks were cut short at got its unwind table:
meta.json unwind.pending). Run as root:

    sudo .venv/bin/python bench/startup.py --chromium            # a headless chromium it starts
    sudo .venv/bin/python bench/startup.py --torch-shape          # a process mapping 3 generated libraries
                                                                  # of 300k exported C++-named functions each
    sudo .venv/bin/python bench/startup.py --pid PID              # any running process
         [--rounds 2] [--seconds 30] [--allocscope 'CMD ...'] [--root CHECKOUT] [--json FILE]

Each round records the target twice for --seconds, each time with its own ALLOCSCOPE_CACHE_DIR:
  cold  first contact with these binaries: the unwind tables and the symbol-scan facts not
        cached (the compiled BPF program is: that is per box and BCC version, not per binary;
        a first prime run fills it),
  warm  everything cached: the unwind tables by `allocscope doctor --pid PID --warm` (every
        table of the process, built on every core; its time is printed too), the rest by the
        prime run.
--allocscope runs another allocscope (e.g. the bundle: --allocscope /opt/allocscope/bin/allocscope);
default: this checkout's (`--root`) `python -m allocscope` with this interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def allocscope_cmd(a) -> list[str]:
    return shlex.split(a.allocscope) if a.allocscope else [sys.executable, "-m", "allocscope"]


def record(a, pid: int, cache: Path, seconds: float, out: Path) -> dict:
    """One recording: {live_s, lines (time, text)}, meta.json's unwind."""
    env = dict(os.environ, ALLOCSCOPE_CACHE_DIR=str(cache))
    t = time.perf_counter()
    p = subprocess.Popen(
        [*allocscope_cmd(a), "record", "--pid", str(pid), "-o", str(out), "--force", "--verbose"],
        cwd=a.root,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    lines: list[tuple[float, str]] = []
    live = threading.Event()

    def read() -> None:
        for line in p.stderr:
            lines.append((time.perf_counter() - t, line.rstrip()))
            if "recording pid" in line:
                live.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = t + 600
    while not live.is_set() and p.poll() is None and time.perf_counter() < deadline:
        live.wait(0.05)
    live_s = next((s for s, x in lines if "recording pid" in x), float("nan"))
    if live.is_set():
        time.sleep(max(0.0, live_s + seconds - (time.perf_counter() - t)))
    p.send_signal(signal.SIGINT)
    try:
        p.wait(180)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    reader.join(5)
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    if p.returncode != 0 or not meta:
        print(f"  record failed (rc {p.returncode}): " + " | ".join(x for _, x in lines[-5:]), flush=True)
    return {"live_s": live_s, "lines": lines, "unwind": meta.get("unwind") or {}}


def phase_s(r: dict, name: str) -> float | None:
    """Seconds of one start-up phase `--verbose` printed ("allocscope: start-up: NAME 123 ms")."""
    for _, line in r["lines"]:
        if f"start-up: {name} " in line and line.endswith(" ms"):
            return round(float(line.rsplit(" ", 2)[-2]) / 1000, 2)
    return None


def summary(r: dict) -> dict:
    """live_s; complete_s: when the last module stacks were cut short at was built (live_s when
    none was; None when one was still building at the end); worst_wait_s: the longest a crossed
    module's stacks waited (first cut short -> table in); cut: stacks cut short; crossed, built."""
    pend = r["unwind"].get("pending") or []
    live = r["live_s"]
    crossed = [p for p in pend if p.get("stacks")]
    unbuilt = [p for p in crossed if p.get("built_s") is None]
    built = [p["built_s"] for p in crossed if p.get("built_s") is not None]
    complete = None if unbuilt else live + max(built, default=0.0)
    waits = [p["built_s"] - (p.get("first_s") or 0) for p in crossed if p.get("built_s") is not None]
    return {
        "live_s": round(live, 2),
        "complete_s": None if complete is None else round(complete, 2),
        "worst_wait_s": round(max(waits, default=0.0), 2),
        "cut": sum(p["stacks"] for p in crossed),
        "crossed": len(crossed),
        "built_lazily": len(built),
        "unbuilt": [Path(p["module"]).name for p in unbuilt],
        "never_crossed": r["unwind"].get("never_crossed", 0),
        "modules": r["unwind"].get("modules", 0),
        "load": round(os.getloadavg()[0], 1),
        "scans_s": phase_s(r, "maps, allocators, symbol scans"),
        "unwind_s": phase_s(r, "unwind tables"),
        "probes_s": phase_s(r, "probes built (since the command knew the target)"),
        "slowest": sorted(
            ((Path(p["module"]).name, p.get("stacks"), p.get("build_s"), p.get("built_s")) for p in crossed),
            key=lambda x: -(x[2] or 0),
        )[:4],
    }


def warm(a, pid: int, cache: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        [*allocscope_cmd(a), "doctor", "--pid", str(pid), "--warm"],
        cwd=a.root,
        check=False,
        env=dict(os.environ, ALLOCSCOPE_CACHE_DIR=str(cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def start_chromium(tmp: Path) -> subprocess.Popen:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe:
        sys.exit("--chromium: no chromium on PATH")
    p = subprocess.Popen(
        [exe, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}/profile", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(6)  # settled: its libraries mapped, idle
    return p


HOLDER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) if (!dlopen(argv[i], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    for (;;) { void *p = malloc(4096); usleep(10000); free(p); }
}
"""


def start_torch_shape(tmp: Path, copies: int = 3, functions: int = 300_000) -> subprocess.Popen:
    """The shape of libtorch_cpu & co. for the symbol scans: `copies` libraries (distinct files)
    of `functions` exported functions with long mangled names each (.dynsym and .symtab: 600k
    symbols, 54 MB of names a library), dlopen'd by a small program that allocates. Assembled,
    not compiled (~10 s)."""
    src = tmp / "fake.S"
    with src.open("w") as f:
        f.write(".text\n")
        for i in range(functions):
            n = f"_ZN2at6native12_GLOBAL__N_118structured_kernel_{i}_implENS_6TensorERKS2_RKN3c106ScalarE"
            f.write(f".globl {n}\n.type {n},@function\n{n}:\nret\n.size {n}, .-{n}\n")
        f.write('.section .note.GNU-stack,"",@progbits\n')
    libs = [tmp / f"libfaketorch{i}.so" for i in range(copies)]
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(libs[0]), str(src)], check=True)
    for lib in libs[1:]:
        shutil.copy(libs[0], lib)
    (tmp / "holder.c").write_text(HOLDER)
    subprocess.run(["gcc", "-O1", "-o", str(tmp / "holder"), str(tmp / "holder.c"), "-ldl"], check=True)
    p = subprocess.Popen([str(tmp / "holder"), *map(str, libs)], stdout=subprocess.DEVNULL, start_new_session=True)
    time.sleep(2)
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--pid", type=int)
    who.add_argument("--chromium", action="store_true", help="start a headless chromium and attach to it")
    who.add_argument(
        "--torch-shape",
        action="store_true",
        help="start a process mapping 3 generated libraries of 300k functions each",
    )
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--allocscope", default="", help="the allocscope command (default: python -m allocscope)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0, help="each recording, from live probes")
    ap.add_argument("--json", default="", help="also write the rounds here")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="startup-"))
    chrome = start_chromium(tmp) if a.chromium else start_torch_shape(tmp) if a.torch_shape else None
    pid = chrome.pid if chrome else a.pid
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        nmods = len(
            {
                line.split()[-1]
                for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                if len(line.split()) >= 6 and "x" in line.split()[1] and line.split()[-1].startswith("/")
            }
        )
        print(
            f"target pid {pid} ({comm}): {nmods} executable files mapped; {os.cpu_count()} cores; "
            f"{a.seconds:.0f} s a recording",
            flush=True,
        )
        prime = tmp / "prime"
        record(a, pid, prime, 1.0, tmp / "prime.allocscope")  # fills prime/bpf: the compiled program
        rows = []
        for i in range(a.rounds):
            for mode in ("cold", "warm"):
                cache = tmp / f"{mode}{i}"
                for part in ("bpf", "files") if mode == "warm" else ("bpf",):
                    if (prime / part).exists():  # warm: the symbol scans' facts too (tracer/allocators/facts.py)
                        shutil.copytree(prime / part, cache / part)
                warm_s = warm(a, pid, cache) if mode == "warm" else None
                r = record(a, pid, cache, a.seconds, tmp / f"{mode}{i}.allocscope")
                s = summary(r) | {"round": i + 1, "cache": mode, "warm_s": None if warm_s is None else round(warm_s, 1)}
                rows.append(s)
                for _, line in r["lines"]:
                    if "unwind table for" in line:
                        print(f"    {line}", flush=True)
                comp = f"{s['complete_s']:.2f} s" if s["complete_s"] is not None else f"not by the end ({s['unbuilt']})"
                print(
                    f"  round {s['round']} {mode:4}: live {s['live_s']:.2f} s, complete {comp}"
                    + f"; {s['cut']} stacks cut short in {s['crossed']} modules"
                    + (f"; doctor --warm took {warm_s:.1f} s" if warm_s is not None else "")
                    + f"; load {s['load']}",
                    flush=True,
                )
        print()
        print(
            "scans: the maps, allocators and symbol scans (main thread); probes: BCC's build (a thread, beside\n"
            "the scans); unwind: the tables at attach (--verbose start-up phases)"
        )
        print(
            f"{'round':>5}  {'cache':5}  {'live s':>7}  {'scans s':>7}  {'probes s':>8}  {'unwind s':>8}  "
            f"{'complete s':>10}  {'worst wait s':>12}  {'cut short':>9}  {'crossed':>7}  {'never crossed':>13}  "
            f"{'load':>5}"
        )

        def sec(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        for s in rows:
            comp = f"{s['complete_s']:.2f}" if s["complete_s"] is not None else "-"
            print(
                f"{s['round']:>5}  {s['cache']:5}  {s['live_s']:>7.2f}  {sec(s['scans_s']):>7}  "
                f"{sec(s['probes_s']):>8}  {sec(s['unwind_s']):>8}  {comp:>10}  {s['worst_wait_s']:>12.2f}  "
                f"{s['cut']:>9}  {s['crossed']:>7}  {s['never_crossed']:>13}  {s['load']:>5}"
            )
        for i in range(a.rounds):
            c, w = rows[2 * i], rows[2 * i + 1]
            if w["live_s"] > 0:
                print(f"round {i + 1}: cold/warm to live probes {c['live_s'] / w['live_s']:.2f}x")
        if a.json:
            Path(a.json).write_text(
                json.dumps(
                    {"pid": pid, "comm": comm, "modules": nmods, "cores": os.cpu_count(), "rounds": rows}, indent=1
                )
            )
    finally:
        if chrome is not None:
            os.killpg(chrome.pid, signal.SIGTERM)
            chrome.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
