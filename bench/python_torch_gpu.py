#!/usr/bin/env python3
"""The GPU box check of issue 51 (docs/python.md): a PyTorch program on CUDA, attached while it
runs, its CUDA caching allocator's blocks and pinned host memory named by the Python lines that
created the tensors, and a diff between two batch sizes by Python line. Not run here (no GPU):
the lead runs it on the GPU box.

    # with the bundle (make bundle; unpacked by bench/gpu_check.py or by hand):
    sudo python3 bench/python_torch_gpu.py --allocscope /tmp/allocscope-bundle/allocscope \
        --python python3 --out bench/results/2026-12-07-python-torch-gpu.md
    # or from a checkout with its .venv:
    sudo .venv/bin/python bench/python_torch_gpu.py --python /usr/bin/python3

`--python`: an interpreter (CPython 3.11-3.13) with torch and CUDA. For each batch size (default
8 and 32) the program (below) starts, prints `ready`, is attached with `record --pid`, gets
SIGUSR1, then builds a KV cache (`make_kv_cache`: one torch.empty on the GPU, layers x batch x
heads x seq x dim fp16) and loads batches into pinned host memory (`pin_batch`: torch.empty(...,
pin_memory=True)) copied to the GPU (`to_device`), prints its own byte counts (the tensors' bytes,
torch.cuda.memory_reserved) and holds them. Checks, each printed PASS/FAIL and written to --out:

* the KV cache's line holds GPU memory (device_live_bytes) of at least the tensor's bytes and at
  most torch.cuda.memory_reserved: `make_kv_cache <file>:<line>`, a Python location;
* pinned host memory (source cuda-pinned) at `pin_batch`'s line, at least the batch's bytes;
* the batch copied to the GPU at `to_device`'s line;
* `allocscope diff` of the two runs: the largest GPU growth is `make_kv_cache`'s line, by about
  the difference of the two caches (the caching allocator rounds: within 10 % + 20 MiB);
* the same trace with `report --no-python` names native places (no Python frame): the old view.
Also the walk's cost on torch: the recording's bpf_stats when kernel.bpf_stats_enabled=1.
"""

# ruff: noqa: B023, BLE001 -- check() calls its lambdas at once; one failed check must not end the box's run
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
import signal, sys, threading
import torch

LAYERS, HEADS, SEQ, DIM = 8, 16, 2048, 128
batch = int(sys.argv[1])
go = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: go.set())


def make_kv_cache(b):
    return torch.empty((2, LAYERS, b, HEADS, SEQ, DIM), dtype=torch.float16, device="cuda")  # line: kv


def pin_batch(b):
    return torch.empty((b, 3, 512, 512), dtype=torch.float32, pin_memory=True)  # line: pin


def to_device(t):
    return t.to("cuda", non_blocking=True)  # line: to_device


torch.cuda.init()
torch.empty(1, device="cuda")  # the context, before the tracer attaches
print("ready", flush=True)
go.wait()
kv = make_kv_cache(batch)
host = [pin_batch(batch) for _ in range(3)]
dev = [to_device(h) for h in host]
torch.cuda.synchronize()
kv_bytes = kv.numel() * kv.element_size()
pin_bytes = sum(h.numel() * h.element_size() for h in host)
print(f"done kv={kv_bytes} pinned={pin_bytes} dev={pin_bytes} reserved={torch.cuda.memory_reserved()}", flush=True)
go.clear()
go.wait()
"""


def marker_lines(text: str) -> dict[str, int]:
    return {m.group(1): i for i, line in enumerate(text.splitlines(), 1) if (m := re.search(r"# line: (\w+)", line))}


def read_line(p: subprocess.Popen, prefix: str, timeout: float = 300) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"target ended before {prefix!r} (rc={p.poll()})")
        if line.startswith(prefix):
            return line
    raise SystemExit(f"no {prefix!r} line in {timeout} s")


def run(allocscope: list[str], py: str, prog: Path, batch: int, out: Path) -> dict[str, int]:
    p = subprocess.Popen([py, "-u", str(prog), str(batch)], stdout=subprocess.PIPE, text=True)
    tr = None
    try:
        read_line(p, "ready")
        tr = subprocess.Popen([*allocscope, "record", "--pid", str(p.pid), "-o", str(out), "--interval", "0.5"])
        end = time.monotonic() + 180
        while not (out / "meta.json").exists():
            if tr.poll() is not None or time.monotonic() > end:
                raise SystemExit("record did not attach")
            time.sleep(0.1)
        time.sleep(1.5)  # the unwind tables of libtorch and friends, built as stacks first cross them
        p.send_signal(signal.SIGUSR1)
        done = read_line(p, "done")
        time.sleep(1.2)
        tr.send_signal(signal.SIGINT)
        tr.wait(300)
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", done)}
    finally:
        p.kill()
        p.wait()
        if tr is not None and tr.poll() is None:
            tr.kill()


def report(allocscope: list[str], trace: Path, *extra: str) -> dict:
    r = subprocess.run([*allocscope, "report", str(trace), "--format", "json", *extra], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"report failed: {r.stderr}")
    return json.loads(r.stdout)


def py_location(rep: dict, function: str) -> dict | None:
    for loc in rep["locations"]:
        if loc["function"] == function and loc["module"] == "python":
            return loc
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default="python3", help="an interpreter with torch and CUDA")
    ap.add_argument("--allocscope", default=f"{sys.executable} -m allocscope", help="the allocscope command")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--out", help="results (markdown)")
    ap.add_argument("--keep", help="a folder: the traces and their JSON reports copied there")
    a = ap.parse_args()
    allocscope = shlex.split(a.allocscope)
    os.chdir(ROOT)
    small, big = (int(x) for x in a.batches.split(","))
    lines_out: list[str] = []
    ok = True

    def check(name: str, cond, detail) -> None:
        """`cond` and `detail` may be callables: an exception in one is a FAIL that says it, and
        the run goes on (the traces and JSON kept with --keep are read again at home)."""
        nonlocal ok
        try:
            cond = cond() if callable(cond) else cond
        except Exception as e:
            cond, detail = False, f"{type(e).__name__}: {e}"
        try:
            detail = detail() if callable(detail) else detail
        except Exception as e:
            detail = f"{type(e).__name__}: {e}"
        ok = ok and cond
        lines_out.append(f"- {'PASS' if cond else 'FAIL'} {name}: {detail}")
        print(lines_out[-1], flush=True)

    with tempfile.TemporaryDirectory() as td:
        prog = Path(td) / "kv_server.py"
        prog.write_text(PROGRAM)
        marks = marker_lines(PROGRAM)
        traces, own = {}, {}
        for b in (small, big):
            traces[b] = Path(td) / f"batch{b}"
            own[b] = run(allocscope, a.python, prog, b, traces[b])
            rep = report(allocscope, traces[b])
            kv = py_location(rep, "make_kv_cache")
            check(
                f"batch {b}: KV cache named by its line",
                lambda: (
                    kv is not None
                    and kv["frames"][[f["module"] for f in kv["frames"]].index("python")]["line"] == marks["kv"]
                    and own[b]["kv"] <= kv["device_live_bytes"] <= own[b]["reserved"]
                ),
                lambda: (
                    f"{kv and kv['location']}: {kv and kv['device_live_bytes']} B on the GPU; the program: {own[b]}"
                ),
            )
            pin = py_location(rep, "pin_batch")
            check(
                f"batch {b}: pinned host memory named by its line",
                lambda: pin is not None and "cuda-pinned" in pin["sources"] and pin["live_bytes"] >= own[b]["pinned"],
                lambda: (
                    f"{pin and pin['location']}: {pin and pin['live_bytes']} B, sources {pin and pin.get('sources')}"
                ),
            )
            dev = py_location(rep, "to_device")
            check(
                f"batch {b}: the copy to the GPU named by its line",
                lambda: dev is not None and dev["device_live_bytes"] > 0,
                lambda: f"{dev and dev['location']}: {dev and dev['device_live_bytes']} B on the GPU",
            )
            native = report(allocscope, traces[b], "--no-python")
            if a.keep:
                keep = Path(a.keep)
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copytree(traces[b], keep / traces[b].name, dirs_exist_ok=True)
                (keep / f"batch{b}.json").write_text(json.dumps(rep))
                (keep / f"batch{b}-native.json").write_text(json.dumps(native))
            check(
                f"batch {b}: --no-python keeps the native view",
                lambda: all(loc["module"] != "python" for loc in native["locations"]),
                lambda: f"top: {native['locations'][0]['location'] if native['locations'] else None}",
            )
            meta = json.loads((traces[b] / "meta.json").read_text())
            if meta.get("bpf_stats"):
                lines_out.append(f"- batch {b} bpf_stats: {json.dumps(meta['bpf_stats'])[:600]}")
        r = subprocess.run(
            [*allocscope, "diff", str(traces[small]), str(traces[big]), "--format", "json"],
            capture_output=True,
            text=True,
        )
        d = json.loads(r.stdout) if r.returncode == 0 else {"locations": []}
        if a.keep:
            (Path(a.keep) / "diff.json").write_text(json.dumps(d))
        top = max(d["locations"], key=lambda x: x.get("device_live_delta_bytes") or 0, default=None)
        want = own[big]["kv"] - own[small]["kv"]
        got = top and top.get("device_live_delta_bytes")
        check(
            "diff: the largest GPU growth is the KV cache's line",
            lambda: bool(top) and top["function"] == "make_kv_cache" and abs(got - want) <= 0.1 * want + (20 << 20),
            lambda: f"{top and top['location']}: {got} B (the tensors: {want} B)",
        )
        text = subprocess.run([*allocscope, "report", str(traces[big])], capture_output=True, text=True).stdout
    body = [
        f"# Python lines on the GPU box (issue 51): {time.strftime('%Y-%m-%d')}",
        "",
        f"`{a.python}` with torch, batches {small} and {big}; `bench/python_torch_gpu.py`.",
        "",
        *lines_out,
        "",
        "## The report of the larger batch",
        "",
        "```",
        *text.splitlines()[:60],
        "```",
    ]
    if a.out:
        Path(a.out).write_text("\n".join(body) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
