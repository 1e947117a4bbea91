"""First contact with a real GPU process, from the relocatable bundle (issue 30), as a new user
meets it: python3 bench/gpu_first_contact.py BUNDLE.tar.xz [--bins DIR] [--out DIR].

1. `allocscope --version` / `--help` from the unpacked bundle.
2. Unwind-table building of the box's biggest libraries (torch's, cuDNN, cuBLAS, NCCL...) with the
   bundle's native decoder: seconds and rows per library (bench/cfi_build.py's numbers, here).
3. A running PyTorch process (CUDA initialised, a loop of CPU tensors and device allocations that
   reach cudaMalloc) attached by `record --pid`, cold (empty ALLOCSCOPE_CACHE_DIR) and warm, side by
   side (bench/startup.py): seconds to live probes and to complete stacks.
4. The same process, warm: SIGUSR1 makes it allocate 600 MiB of device memory and a 128 MiB pinned
   host tensor and hold them; the report's locations holding them, by function.
5. The driver-API program (bench/gpu_driver.c, built elsewhere: --bins): its top locations and how
   many rows the driver's own memory takes.
Prints a results table and writes it to OUT/first_contact.txt."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
ROWS: list[tuple[str, str]] = []


def row(check: str, value) -> None:
    ROWS.append((check, str(value)))
    print(f"{check}: {value}", flush=True)


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


TORCH_PROG = r"""
import json, os, signal, sys, time, torch
MIB = 1 << 20
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
go = []
signal.signal(signal.SIGUSR1, lambda s, f: go.append(1))
signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
print("ready", os.getpid(), flush=True)
hold = []
i = 0
while True:
    a = torch.empty(MIB + (i % 7) * 4096, dtype=torch.uint8)          # c10's CPU allocator
    d = torch.empty(2 * MIB, dtype=torch.uint8, device="cuda")         # a new segment: cudaMalloc
    del a, d
    torch.cuda.empty_cache()                                           # cudaFree: the next one mallocs again
    if go:
        go.clear()
        r0 = torch.cuda.memory_reserved()
        hold.append(torch.empty(600 * MIB, dtype=torch.uint8, device="cuda"))
        hold.append(torch.empty(128 * MIB, dtype=torch.uint8, pin_memory=True))
        torch.cuda.synchronize()
        print(json.dumps({"reserved_delta": torch.cuda.memory_reserved() - r0, "torch": torch.__version__,
                          "cuda": torch.version.cuda}), flush=True)
    i += 1
    time.sleep(0.05)
"""


def start_torch(out: str):
    with open(os.path.join(out, "torch_target.log"), "w") as log:
        p = subprocess.Popen([sys.executable, "-u", "-c", TORCH_PROG], stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    return p if line.startswith("ready") else None


def load_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def libs_of(pid: int) -> list[str]:
    seen, out = set(), []
    with open(f"/proc/{pid}/maps") as f:
        for ln in f:
            parts = ln.split(None, 5)
            if len(parts) == 6 and "x" in parts[1] and parts[5].strip().startswith("/"):
                path = parts[5].strip()
                if path not in seen:
                    seen.add(path)
                    out.append(path)
    return out


def first_contact_naming(exe: str, tgt, out: str) -> None:
    trace = os.path.join(out, "torch_named.allocscope")
    tr = subprocess.Popen(
        [exe, "record", "--pid", str(tgt.pid), "-o", trace, "--force", "--interval", "0.5"],
        stderr=subprocess.PIPE,
        text=True,
    )
    err = []
    for ln in tr.stderr:
        err.append(ln)
        if "recording pid" in ln:
            break
    time.sleep(2)
    tgt.send_signal(signal.SIGUSR1)
    info = json.loads(tgt.stdout.readline())
    time.sleep(2)
    tr.send_signal(signal.SIGINT)
    err.append(tr.communicate(timeout=300)[1])
    with open(os.path.join(out, "torch_named.record.log"), "w") as f:
        f.write("".join(err))
    js = os.path.join(out, "torch_named.json")
    p = sh([exe, "report", trace, "--format", "json", "-o", js])
    txt = sh([exe, "report", trace])
    with open(os.path.join(out, "torch_named.txt"), "w") as f:
        f.write(txt.stdout + txt.stderr)
    if p.returncode:
        row("torch: report", f"rc {p.returncode} {p.stderr.strip()[-200:]}")
        return
    rep = load_json(js)
    row("torch: version", f"{info.get('torch')} cu{info.get('cuda')}")
    row("torch: reserved delta vs device live", f"{info['reserved_delta']} vs {rep['totals'].get('device_bytes')}")
    locs = rep["locations"]
    dev = max(locs, key=lambda x: x.get("device_live_bytes") or 0)
    row("torch: device bytes at", f"{dev['location']} ({dev.get('device_live_bytes')} B)")
    pinned = max(locs, key=lambda x: (x.get("live_by_source") or {}).get("cuda-pinned", 0))
    row("torch: pinned bytes at", f"{pinned['location']} ({(pinned.get('live_by_source') or {}).get('cuda-pinned')} B)")
    fs = rep.get("findings") or []
    if fs:
        row("torch: first finding", fs[0].get("text", "")[:160])
    notes = [w for w in (rep["recording"].get("warnings") or []) if "cut short" in w]
    row("torch: stacks cut short (warm)", notes[:2] or "none")


def driver(exe: str, bins: str, out: str) -> None:
    prog = os.path.join(bins, "gpu_driver")
    if not os.path.exists(prog):
        row("driver", f"no {prog}")
        return
    trace = os.path.join(out, "driver.allocscope")
    p = sh([exe, "record", "-o", trace, "--force", "--interval", "0.5", "--", prog], timeout=300)
    js = os.path.join(out, "driver.json")
    q = sh([exe, "report", trace, "--format", "json", "-o", js])
    txt = sh([exe, "report", trace])
    with open(os.path.join(out, "driver.txt"), "w") as f:
        f.write(p.stderr + txt.stdout + txt.stderr)
    if p.returncode or q.returncode:
        row("driver: record/report", f"rc {p.returncode}/{q.returncode} {(p.stderr + q.stderr).strip()[-300:]}")
        return
    rep = load_json(js)
    locs = rep["locations"]

    def size(x):
        return (x.get("device_live_bytes") or 0) + (x.get("live_bytes") or 0)

    top = sorted(locs, key=size, reverse=True)
    row("driver: locations", len(locs))
    row("driver: top 6", "; ".join(f"{x['location']} {size(x)}" for x in top[:6]))
    stripped = [x for x in locs if "+0x" in (x.get("location") or "") and not x.get("function")]
    inside = [x for x in locs if x.get("inside")]
    row("driver: rows at bare addresses / 'inside' rows", f"{len(stripped)} / {len(inside)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--bins", default="build/gpu-bins")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/first-contact"))
    ap.add_argument("--dest", default="/tmp/allocscope-bundle")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list of: cfi,startup,naming,driver")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.dest, exist_ok=True)
    with tarfile.open(a.bundle) as tf:
        top = tf.getnames()[0].split("/")[0]
        tf.extractall(a.dest, filter="tar") if sys.version_info >= (3, 12) else tf.extractall(a.dest)
    root = os.path.join(a.dest, top)
    exe = os.path.join(root, "bin", "allocscope")
    v = sh([exe, "--version"])
    row("--version", f"rc {v.returncode}: {(v.stdout + v.stderr).strip()[-120:]}")
    h = sh([exe, "record", "--help"])
    row("record --help", f"rc {h.returncode}, {len(h.stdout.splitlines())} lines")
    tgt = start_torch(a.out)
    if tgt is None:
        row("torch target", "did not start (see torch_target.log)")
        return
    try:
        libs = libs_of(tgt.pid)
        size = sum(os.path.getsize(x) for x in libs if os.path.exists(x))
        row("torch process", f"pid {tgt.pid}: {len(libs)} executable files, {size / 1e9:.2f} GB")
        if "cfi" not in skip:
            big = sorted((x for x in libs if os.path.exists(x)), key=os.path.getsize, reverse=True)[:8]
            env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
            c = sh([sys.executable, "-c", CFI_PROG, *big], env=env, timeout=600)
            with open(os.path.join(a.out, "cfi_build.txt"), "w") as f:
                f.write(c.stdout + c.stderr)
            res = c.stdout.strip() or c.stderr.strip()[-400:]
            row("native tables of the 8 biggest", "\n  " + res.replace("\n", "\n  "))
        if "startup" not in skip:
            js = os.path.join(a.out, "startup.json")
            s = sh(
                [
                    sys.executable,
                    os.path.join(HERE, "startup.py"),
                    "--pid",
                    str(tgt.pid),
                    "--allocscope",
                    exe,
                    "--rounds",
                    str(a.rounds),
                    "--seconds",
                    str(a.seconds),
                    "--json",
                    js,
                ],
                timeout=900,
            )
            with open(os.path.join(a.out, "startup.txt"), "w") as f:
                f.write(s.stdout + s.stderr)
            row("startup (bench/startup.py)", f"rc {s.returncode}\n" + s.stdout[-2500:])
        if "naming" not in skip:
            first_contact_naming(exe, tgt, a.out)
    finally:
        tgt.terminate()
        try:
            tgt.wait(30)
        except subprocess.TimeoutExpired:
            tgt.kill()
    if "driver" not in skip:
        driver(exe, os.path.abspath(a.bins), a.out)
    text = "\n".join(f"{c}: {v}" for c, v in ROWS)
    with open(os.path.join(a.out, "first_contact.txt"), "w") as f:
        f.write(text + "\n")


CFI_PROG = r"""
import os, sys, time
from tracer.unwind import native as cfirows
for p in sys.argv[1:]:
    t = time.perf_counter()
    try:
        rows = cfirows.build_rows(p)
        n = len(rows)
    except Exception as e:
        n = f"error {type(e).__name__}: {e}"
    print(f"{os.path.basename(p)} ({os.path.getsize(p) / 1e6:.0f} MB): {n} rows in {time.perf_counter() - t:.2f} s",
          flush=True)
"""


if __name__ == "__main__":
    main()
