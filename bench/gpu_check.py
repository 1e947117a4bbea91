"""Device checks of the relocatable bundle (make bundle) on a GPU box: python3 bench/gpu_check.py
BUNDLE.tar.xz [--bins DIR] [--out DIR]. Unpacks the bundle, runs `allocscope doctor`, records a
small C target, a CUDA driver-API program with known sizes (bench/gpu_driver.c), PyTorch device
tensors and pin_memory() (compared with torch.cuda.memory_reserved() and cuMemGetInfo), and the
demo daemon with 16 workers; prints a results table (expected vs measured). DIR holds gpu_small,
gpu_driver and provingd built elsewhere when the box has no compiler (bench/README.md)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

MIB = 1 << 20
ROWS: list[tuple[str, str, str, str]] = []


def row(check, expected, measured, ok=None):
    if ok is None:
        ok = str(expected) == str(measured)
    ROWS.append((check, str(expected), str(measured), "ok" if ok else "DIFF"))


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def by_function(rep):
    agg = {}
    for s in rep["sites"]:
        fn = s["frames"][0]["function"] if s.get("frames") else "?"
        a = agg.setdefault(fn, {"live_bytes": 0, "device_live_bytes": 0, "alloc_count": 0})
        for k in a:
            a[k] += int(s.get(k, 0) or 0)
    return agg


# gpu_driver.c's allocation calls: (function, call) -> the key its CUDA bytes are in (issue 46)
DRIVER_CALLS = {
    ("dev_alloc", "cuMemAlloc_v2"): "device_live_bytes",
    ("dev_async", "cuMemAllocAsync"): "device_alloc_bytes",
    ("dev_async_ptsz", "cuMemAllocAsync_ptsz"): "device_live_bytes",
    ("dev_create", "cuMemCreate"): "device_live_bytes",
    ("host_pinned", "cuMemAllocHost_v2"): "live_bytes",
    ("host_pinned", "cuMemHostAlloc"): "live_bytes",
    ("host_managed", "cuMemAllocManaged"): "live_bytes",
    ("host_register", "cuMemHostRegister_v2"): "live_bytes",
}


def calls_one_row(rep):
    """One CUDA call, one row: each allocation call of gpu_driver.c is one location holding its
    CUDA memory and the driver's mallocs inside it (`fn via call`), no row of the same function
    without the call holds CUDA memory, and no location is a bare libcuda return address."""
    locs = rep.get("locations") or []
    for (fn, call), key in DRIVER_CALLS.items():
        rows = [x for x in locs if x["function"] == fn and x.get("call") == call]
        cuda = [x for x in rows if int(x.get(key) or 0) > 0]
        row(f"driver: {fn} via {call}: rows with its memory", 1, len(cuda))
    bare = [
        x["function"]
        for x in locs
        if x["function"].startswith("libcuda") and "+0x" in x["function"] and not x.get("inside")
    ]
    row("driver: bare libcuda+0x... locations", 0, len(bare))
    uncalled = [
        x["function"]
        for x in locs
        if x["function"] in {fn for fn, _ in DRIVER_CALLS}
        and not x.get("call")
        and (x.get("device_live_bytes") or set(x.get("sources") or ()) & {"cuda-pinned", "cuda-managed"})
    ]
    row("driver: CUDA memory at a row without its call", 0, len(uncalled))


def report(exe, trace, outdir, name):
    p = sh([exe, "report", trace, "--format", "json", "-o", os.path.join(outdir, name + ".json")])
    if p.returncode:
        print(p.stderr, file=sys.stderr)
        return None
    txt = sh([exe, "report", trace])
    with open(os.path.join(outdir, name + ".txt"), "w") as f:
        f.write(txt.stdout + txt.stderr)
    with open(os.path.join(outdir, name + ".json")) as f:
        return json.load(f)


def record_launch(exe, outdir, name, argv, extra=()):
    trace = os.path.join(outdir, name + ".allocscope")
    t0 = time.monotonic()
    p = sh([exe, "record", "-o", trace, *extra, "--", *argv], timeout=300)
    dt = time.monotonic() - t0
    with open(os.path.join(outdir, name + ".record.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    return trace, p, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--bins", default="build/gpu-bins")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-check"))
    ap.add_argument("--dest", default="/tmp/allocscope-bundle")
    ap.add_argument("--skip", default="", help="comma list of: small,driver,torch,bigscale,scale")
    ap.add_argument(
        "--big-args",
        default="--pw 16 --workers 16 --partitions 48 --partition-mb 2560 --chunk-kb 20 "
        "--synth-ms 0 --gpu-ms 100 --bug",
        help="bigscale: provingd's arguments (16 workers, 2.5 GiB partitions of 20 KiB chunks: "
        "~120 GiB touched, 65+ GiB and ~3.5 M live blocks at the peak)",
    )
    ap.add_argument(
        "--big-record-args",
        default="--max-live 8388608",
        help="bigscale: allocscope record's extra arguments (the live map must hold the peak)",
    )
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.dest, exist_ok=True)
    t0 = time.monotonic()
    with tarfile.open(a.bundle) as tf:
        top = tf.getnames()[0].split("/")[0]
        tf.extractall(a.dest, filter="tar") if sys.version_info >= (3, 12) else tf.extractall(a.dest)
    exe = os.path.join(a.dest, top, "bin", "allocscope")
    row("unpack", "-", f"{time.monotonic() - t0:.1f}s", True)
    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]).stdout.strip()
    print(f"box: {os.uname().release}; python {sys.version.split()[0]}; gpu {smi}")
    bins = os.path.abspath(a.bins)

    d = sh([exe, "doctor"])
    with open(os.path.join(a.out, "doctor.txt"), "w") as f:
        f.write(d.stdout + d.stderr)
    print(d.stdout + d.stderr)
    row("doctor", "rc 0", f"rc {d.returncode}")

    if "small" not in skip:
        trace, p, dt = record_launch(exe, a.out, "small", [os.path.join(bins, "gpu_small")])
        rep = report(exe, trace, a.out, "small") if p.returncode == 0 else None
        keep = by_function(rep).get("keep", {}).get("live_bytes") if rep else p.stderr[-300:]
        row("small C: keep() live bytes", 8 * MIB + 4 * 256 * 1024, keep)

    if "driver" not in skip:
        trace, p, dt = record_launch(exe, a.out, "driver", [os.path.join(bins, "gpu_driver")], ["--interval", "0.5"])
        print(p.stdout[-400:], p.stderr[-1500:])
        rep = report(exe, trace, a.out, "driver") if p.returncode == 0 else None
        if rep:
            tot = rep["totals"]
            cu = rep["recording"]["probes"].get("cuda", {})
            n = len(cu.get("attached", []))
            row("driver: libcuda probed", "17 calls", f"{n} calls in {os.path.basename(cu.get('module', ''))}", n == 17)
            dev = 192 * MIB + 2 * MIB + MIB
            row("driver: device live (cuMemAlloc_v2 3x64M + cuMemCreate 2M)", dev, tot.get("device_bytes"))
            row("driver: device peak", 5 * 64 * MIB, tot.get("device_peak_bytes"))
            row("driver: device count", 5, tot.get("device_count"))
            host = 2 * 3 * MIB + 2 * (7 * MIB + 4099) + 16 * MIB
            row("driver: CUDA host live (AllocHost, HostAlloc, Managed)", host, tot.get("cuda_host_bytes"))
            agg = by_function(rep)
            for fn, key, want in (
                ("dev_alloc", "device_live_bytes", 192 * MIB),
                ("dev_create", "device_live_bytes", 2 * MIB),
                ("dev_async", "device_live_bytes", 0),
                ("dev_async_ptsz", "device_live_bytes", MIB),
                ("host_pinned", "live_bytes", 6 * MIB + 2 * (7 * MIB + 4099)),
                ("host_managed", "live_bytes", 16 * MIB),
            ):
                row(f"driver: {fn} {key}", want, agg.get(fn, {}).get(key, 0))
            calls_one_row(rep)
            mg = [ln for ln in p.stdout.splitlines() if ln.startswith("memgetinfo_delta")]
            row("driver: cuMemGetInfo free delta (info)", "-", mg[0].split()[1] if mg else "?", True)
        else:
            row("driver: record", "rc 0", f"rc {p.returncode}: {p.stderr.strip()[-200:]}")

    if "torch" not in skip:
        torch_check(exe, a.out)

    if "bigscale" not in skip:
        big_scale(exe, a.out, os.path.join(bins, "provingd"), a.big_args, a.big_record_args)

    if "scale" not in skip:
        pd = os.path.join(bins, "provingd")
        args = [pd, "--pw", "16", "--workers", "16", "--partitions", "96"]
        t = time.monotonic()
        base = sh(args)
        base_s = time.monotonic() - t
        trace, p, dt = record_launch(exe, a.out, "scale", args)
        rep = report(exe, trace, a.out, "scale") if p.returncode == 0 else None
        row("scale: provingd 16 workers pw 16, untraced", "-", f"{base_s:.1f}s rc {base.returncode}", True)
        if rep:
            tot = rep["totals"]
            syn = by_function(rep)
            row("scale: traced run", "-", f"{dt:.1f}s ({dt / base_s:.2f}x, incl. start)", True)
            row("scale: peak live", "-", f"{tot.get('peak_live_bytes', 0) / MIB:.0f} MiB", True)
            top = max(syn.items(), key=lambda kv: kv[1]["alloc_count"])
            lost = [ln for ln in (p.stdout + p.stderr).splitlines() if "; lost " in ln]
            row("scale: lost events", 0, lost[-1].split("; lost ")[1].split(";")[0] if lost else "?")
            row("scale: busiest site", "-", f"{top[0]} ({top[1]['alloc_count']} allocs)", True)
            print(p.stderr[-600:])
        else:
            row("scale: record", "rc 0", f"rc {p.returncode}: {p.stderr.strip()[-200:]}")

    w = max(len(r[0]) for r in ROWS)
    lines = [f"{'check':<{w}}  {'expected':>22}  {'measured':>40}  ", "-" * (w + 72)]
    lines += [f"{c:<{w}}  {e:>22}  {m:>40}  {s}" for c, e, m, s in ROWS]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "results.txt"), "w") as f:
        f.write(text + "\n")


def _proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _elapsed(summary):
    import re

    m = re.search(r"elapsed ([\d.]+)s", summary or "")
    return float(m[1]) if m else None


def big_scale(exe, out, provingd, big_args, record_args=""):
    """The demo daemon scaled to the box, untraced then traced (attached before its work starts):
    its own elapsed time for the work (kept %), the tracer's CPU (% of one core over the work),
    losses, peak live blocks, trace size, report time."""
    args = [provingd, *big_args.split(), "--wait-signal"]

    def run(traced):
        summ = os.path.join(out, f"big-{'traced' if traced else 'untraced'}.summary")
        tgt = subprocess.Popen([*args, "--summary", summ], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = tgt.stdout.readline()
        if not line.startswith("ready"):
            return None
        tr, trace, cpu0 = None, os.path.join(out, "bigscale.allocscope"), None
        if traced:
            tr = subprocess.Popen(
                [exe, "record", "--pid", str(tgt.pid), "-o", trace, "--interval", "1", *record_args.split()],
                stderr=subprocess.PIPE,
                text=True,
            )
            for ln in tr.stderr:
                if "recording pid" in ln:
                    break
            time.sleep(1)
            cpu0 = _proc_cpu(tr.pid)
        t = time.monotonic()
        tgt.send_signal(signal.SIGUSR1)
        tgt.wait(1800)
        wall = time.monotonic() - t
        cpu1 = _proc_cpu(tr.pid) if tr else None
        try:
            with open(summ) as f:
                text = f.read().strip()
        except OSError:
            text = ""
        res = {"wall": wall, "elapsed": _elapsed(text), "summary": text}
        if tr:
            t = time.monotonic()
            err = tr.communicate(timeout=600)[1]
            res.update(
                stop_s=time.monotonic() - t,
                rc=tr.returncode,
                err=err[-600:],
                tracer_cpu=(cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
                trace=trace,
            )
        return res

    base = run(False)
    traced = run(True)
    if not base or not traced:
        row("bigscale: runs", "both", f"untraced {bool(base)}, traced {bool(traced)}")
        return
    print(base["summary"], "\n", traced["summary"], "\n", traced.get("err"), file=sys.stderr)
    row("bigscale: provingd " + big_args, "-", f"untraced {base['elapsed']:.1f}s ({base['summary'][-60:]})", True)
    row(
        "bigscale: traced work (kept)",
        "-",
        f"{traced['elapsed']:.1f}s ({base['elapsed'] / traced['elapsed']:.1%})",
        True,
    )
    if traced.get("tracer_cpu") is not None:
        row(
            "bigscale: tracer CPU over the work",
            "-",
            f"{traced['tracer_cpu']:.1f}s = {100 * traced['tracer_cpu'] / traced['wall']:.0f}% of one core",
            True,
        )
    row("bigscale: tracer stop (final snapshot, detach)", "-", f"{traced['stop_s']:.1f}s rc {traced['rc']}", True)
    t = time.monotonic()
    rep = report(exe, traced["trace"], out, "bigscale") if traced["rc"] == 0 else None
    rep_s = time.monotonic() - t
    if not rep:
        row("bigscale: report", "rc 0", traced.get("err", "")[-200:])
        return
    tot = rep["totals"]
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(traced["trace"]) for f in fs)
    row("bigscale: lost events", 0, tot.get("lost_events"))
    row("bigscale: peak live", "-", f"{tot.get('peak_live_bytes', 0) / (1 << 30):.1f} GiB", True)
    import pandas as pd

    iv = pd.concat(
        [
            pd.read_parquet(os.path.join(traced["trace"], "parts", f))
            for f in os.listdir(os.path.join(traced["trace"], "parts"))
            if f.startswith("intervals-")
        ]
    )
    row("bigscale: peak live blocks", ">= 1000000", int(iv["live_count"].max()), int(iv["live_count"].max()) >= 10**6)
    row("bigscale: peak RSS sampled", "-", f"{tot.get('peak_rss_bytes', 0) / (1 << 30):.1f} GiB", True)
    row("bigscale: trace size, report time", "-", f"{size / (1 << 20):.1f} MiB, report {rep_s:.1f}s", True)
    w = rep.get("waits") or {}
    pk = (w.get("peak") or {}).get("by_location") or [{}]
    held = (pk[0].get("held_bytes") or 0) / (1 << 30)
    lead = f"{pk[0].get('function')} {pk[0].get('threads')} thr {held:.1f} GiB"
    row("bigscale: held while waiting (lead)", "-", lead, True)


TORCH_PROG = r"""
import json, os, signal, sys, time, torch
MIB = 1 << 20
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
r0, (f0, _) = torch.cuda.memory_reserved(), torch.cuda.mem_get_info()
def rss():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "RssShmem"):
            out[k] = int(v.split()[0]) * 1024
    return out
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("ready", os.getpid(), flush=True)
signal.sigwait({signal.SIGUSR1})
a = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
b = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
c = torch.empty(3 * MIB + 5, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
m0 = rss()
p = torch.ones(64 * MIB, dtype=torch.uint8).pin_memory()
q = torch.ones(5 * MIB, dtype=torch.uint8).pin_memory()
torch.cuda.synchronize()
m1 = rss()
r1, (f1, _) = torch.cuda.memory_reserved(), torch.cuda.mem_get_info()
print(json.dumps({"reserved_delta": r1 - r0, "memgetinfo_delta": f0 - f1, "torch": torch.__version__,
                  "cuda": torch.version.cuda, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                  "rss_delta": {k: m1[k] - m0[k] for k in m0}}), flush=True)
time.sleep(2)
print("done", flush=True)
"""


def torch_check(exe, out):
    for label, conf in (("torch", ""), ("torch expandable", "expandable_segments:True")):
        env = dict(os.environ)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        name = label.replace(" ", "_")
        tgt = subprocess.Popen([sys.executable, "-c", TORCH_PROG], stdout=subprocess.PIPE, text=True, env=env)
        line = tgt.stdout.readline()
        if not line.startswith("ready"):
            row(f"{label}: start", "ready", line.strip() or f"rc {tgt.wait()}")
            continue
        trace = os.path.join(out, name + ".allocscope")
        tr = subprocess.Popen(
            [exe, "record", "--pid", str(tgt.pid), "-o", trace, "--unwind", "fp", "--interval", "0.5"],
            stderr=subprocess.PIPE,
            text=True,
        )
        err = []
        t = time.monotonic()
        while time.monotonic() - t < 180:
            ln = tr.stderr.readline()
            if not ln:
                break
            err.append(ln)
            if "recording pid" in ln:
                break
        time.sleep(0.5)
        tgt.send_signal(signal.SIGUSR1)
        info = {}
        for ln in tgt.stdout:
            if ln.startswith("{"):
                info = json.loads(ln)
        tgt.wait(60)
        rest = tr.communicate(timeout=120)[1]
        with open(os.path.join(out, name + ".record.log"), "w") as f:
            f.write("".join(err) + rest)
        rep = report(exe, trace, out, name) if tr.returncode == 0 else None
        if not rep:
            row(f"{label}: record", "rc 0", f"rc {tr.returncode}: {(''.join(err) + rest).strip()[-300:]}")
            continue
        tot = rep["totals"]
        cu = rep["recording"]["probes"].get("cuda", {})
        print(label, info, "probes:", cu, file=sys.stderr)
        row(f"{label}: device bytes vs memory_reserved() delta", info.get("reserved_delta"), tot.get("device_bytes"))
        row(f"{label}: cuMemGetInfo free delta (info)", "-", info.get("memgetinfo_delta"), True)
        row(f"{label}: CUDA host (pin_memory 64M+5M, info)", "-", tot.get("cuda_host_bytes"), True)
        rd = info.get("rss_delta") or {}
        # pin_memory() copies a 69 MiB CPU tensor (anon) into pinned pages: which RSS counter takes them
        row(
            f"{label}: RSS deltas across pin_memory (anon/file/shmem, info)",
            "-",
            f"{rd.get('RssAnon')}/{rd.get('RssFile')}/{rd.get('RssShmem')}",
            True,
        )
        dec = rep.get("rss_decomposition") or {}
        row(
            f"{label}: report shmem attributed to cuda-pinned (info)",
            "-",
            f"{(dec.get('shmem_sources') or {}).get('cuda-pinned', 0)} of shmem {dec.get('shmem_bytes')}",
            True,
        )
        row(f"{label}: device count", "-", tot.get("device_count"), True)
        row(f"{label}: torch/cuda", "-", f"{info.get('torch')} cu{info.get('cuda')}", True)


if __name__ == "__main__":
    main()
