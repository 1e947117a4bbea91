"""First contact: seconds from `allocscope record --pid` to live probes on a box where allocscope
never ran (issue 45), per option variant, cold and warm, side by side in one run. Run as root:

    sudo .venv/bin/python bench/first_contact.py                     # the small daemon (bench/idle.c)
    sudo .venv/bin/python bench/first_contact.py --chromium          # and a headless chromium
         [--pid PID] [--daemon BIN] [--allocscope 'CMD ...'] [--rounds 1] [--no-compile] [--json FILE]

For each target and each variant (default, --sample-bytes 524288, --mode residency, --inject):
  cold     an empty ALLOCSCOPE_CACHE_DIR: nothing cached (unwind tables, file scans, compiled
           programs) — a new box's first `record`;
  warm     the same cache dir again, right after;
  compile  (unless --no-compile) an empty cache dir with ALLOCSCOPE_PREBUILT=0: the programs
           compiled by BCC as before the prebuilt store (the figure issue 45 started from).
Live = the "recording pid" line; the phases come from --verbose. Each recording runs
--seconds after it is live, then SIGINT.
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
VARIANTS = {
    "default": [],
    "sample-bytes": ["--sample-bytes", "524288"],
    "residency": ["--mode", "residency"],
    "inject": ["--inject"],
}


def record(a, pid: int, args: list[str], cache: Path, env_extra: dict, out: Path) -> dict:
    env = dict(os.environ, ALLOCSCOPE_CACHE_DIR=str(cache), **env_extra)
    cmd = shlex.split(a.allocscope) if a.allocscope else [sys.executable, "-m", "allocscope"]
    t = time.perf_counter()
    p = subprocess.Popen(
        [*cmd, "record", "--pid", str(pid), *args, "-o", str(out), "--force", "--verbose"],
        cwd=a.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[tuple[float, str]] = []
    live = threading.Event()

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append((time.perf_counter() - t, line.rstrip()))
            if "recording pid" in line:
                live.set()

    th = threading.Thread(target=read, daemon=True)
    th.start()
    while not live.is_set() and p.poll() is None and time.perf_counter() - t < 300:
        live.wait(0.05)
    live_s = next((s for s, x in lines if "recording pid" in x), float("nan"))
    if live.is_set():
        time.sleep(a.seconds)
    p.send_signal(signal.SIGINT)
    try:
        p.wait(120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    th.join(5)
    phases = {}
    for _s, x in lines:
        if "start-up: " in x and x.endswith(" ms"):
            name, _, ms = x.split("start-up: ", 1)[1][: -len(" ms")].rpartition(" ")
            if ms.isdigit():
                phases[name] = int(ms)
    if live_s != live_s:  # nan: never live
        print("\n".join(x for _s, x in lines[-8:]), file=sys.stderr)
    return {"live_s": live_s, "rc": p.returncode, "phases": phases}


def probes_phase(r: dict) -> str:
    """The phase that made the probes (prebuilt load, cache hit, or a compile), and the one
    before the recorder (interpreter, CLI, target)."""
    ph = r["phases"]
    before = next((v for k, v in ph.items() if k.startswith("before the recorder")), None)
    pre = f"pre {before / 1000:.1f}s, " if before is not None else ""
    for k, v in ph.items():
        if k.startswith("compile"):
            return f"{pre}compile {v / 1000:.1f}s"
    for k, v in ph.items():
        if "prebuilt" in k:
            return f"{pre}prebuilt {v / 1000:.1f}s"
        if "cache hit" in k:
            return f"{pre}cache hit {v / 1000:.1f}s"
    return pre + "?"


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chromium", action="store_true", help="also a headless chromium")
    ap.add_argument("--pid", type=int, action="append", default=[], help="also this running process")
    ap.add_argument("--daemon", default="", help="the small daemon's binary (default: bench/idle.c built here)")
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--allocscope", default="", help="the allocscope command (default: python -m allocscope)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--no-compile", action="store_true", help="skip the compile-path figures")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="allocscope-first-contact-"))
    procs: list[subprocess.Popen] = []
    targets: list[tuple[str, int]] = []
    try:
        daemon = a.daemon
        if not daemon:
            daemon = str(tmp / "idle")
            subprocess.run(["cc", "-O2", "-pthread", "-o", daemon, str(ROOT / "bench" / "idle.c")], check=True)
        d = start([daemon])
        procs.append(d)
        assert d.stdout is not None
        d.stdout.readline()
        targets.append(("daemon", d.pid))
        if a.chromium:
            exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
            if not exe:
                sys.exit("--chromium: no chromium on PATH")
            c = start(
                [
                    exe,
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    f"--user-data-dir={tmp}/profile",
                    "about:blank",
                ]
            )
            procs.append(c)
            time.sleep(6)  # settled: its libraries mapped, idle
            targets.append(("chromium", c.pid))
        targets += [(f"pid {p}", p) for p in a.pid]
        results = []
        n = 0
        for _round in range(a.rounds):
            for tname, pid in targets:
                for vname in a.variants.split(","):
                    args = VARIANTS[vname]
                    row = {"target": tname, "variant": vname}
                    n += 1
                    cache = tmp / f"cache-{n}"
                    row["cold"] = record(a, pid, args, cache, {}, tmp / "out.allocscope")
                    row["warm"] = record(a, pid, args, cache, {}, tmp / "out.allocscope")
                    if not a.no_compile:
                        row["compile"] = record(
                            a,
                            pid,
                            args,
                            tmp / f"cache-{n}-compile",
                            {"ALLOCSCOPE_PREBUILT": "0"},
                            tmp / "out.allocscope",
                        )
                    results.append(row)
                    c, w = row["cold"], row["warm"]
                    line = (
                        f"{tname:10} {vname:13} cold {c['live_s']:5.2f} s ({probes_phase(c)})"
                        f"  warm {w['live_s']:5.2f} s ({probes_phase(w)})  cold/warm {c['live_s'] / w['live_s']:.2f}x"
                    )
                    if "compile" in row:
                        k = row["compile"]
                        ratio = k["live_s"] / c["live_s"]
                        line += f"  | compiled here: cold {k['live_s']:5.2f} s ({probes_phase(k)}), {ratio:.1f}x"
                    print(line, flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1))
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
