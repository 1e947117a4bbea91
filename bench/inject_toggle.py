#!/usr/bin/env python3
"""`--inject`'s in-process cost with one recording attached throughout (issue #33): the agent's
hooks switched on and off, window after window.

    sudo .venv/bin/python bench/inject_toggle.py ALLOCSCOPE OUT.md [--bins BINS] [--pairs 30]
                                                 [--workloads rustd,redis]

bench/inject_paired.py compares a traced window with untraced ones taken seconds before and after
it, each with its own attach and detach; on this VM the machine drifts by a few per cent between
windows, as much as the cost being measured. Here one `record --inject` stays attached, and the
agent's `enabled` word (as_cfg, written through /proc/PID/mem) alternates every window:

    on   every hook samples, a sampled call traps into the markers' BPF programs (what --inject does)
    off  every hook passes straight through to the allocator (what the agent does before its tables
         are ready and after the tracer died)

Everything else stays: the patched entries' jumps, the stubs and trampolines, the probes, the
tracer polling on its own CPU. So the ratio on/off is the cost of the hooks' work and of the
sampled calls (the part of --inject that runs in the daemon's threads), measured in short
alternating windows whose drift cancels; inject_paired.py's figure adds the jumps and the attach.
Per on-window: its throughput and CPU per request against the mean of the off-windows either side;
the figure is the median, and the mean with its 95 % interval (1.96 standard errors).

The recording itself is not the point: blocks freed while the hooks are off stay in its live
table. Same CPU layout as bench/inject_floor.py. Needs root.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from benchlib import TrialError, stop_process
from inject_floor import MODES, Bench, Redis, Tracer
from inject_paired import common_args, run_workloads, say_header, window

# struct as_config (tracer/inject/agent/agent.h): u64 magic, u32 version, u32 size, u32 enabled
MAGIC, ENABLED = 0x31746E6567617361, 16


def elf_symbol(path: str, name: str) -> tuple[int, int]:
    """(st_value, the lowest PT_LOAD p_vaddr) of `name` in the ELF64 file `path` (.symtab): no
    dependency, so that this runs with the GPU box's python too."""
    data = Path(path).read_bytes()
    shoff, phoff = struct.unpack_from("<Q", data, 0x28)[0], struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    first = min(
        struct.unpack_from("<Q", data, phoff + i * phentsize + 16)[0]
        for i in range(phnum)
        if struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 1
    )
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for sec in secs:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = secs[sec[6]]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, off)
            end = data.index(b"\0", strtab[4] + st_name)
            if data[strtab[4] + st_name : end] == name.encode():
                return value, first
    raise TrialError(f"{path}: no symbol {name}")


def agent_cfg(pid: int) -> int:
    """The address of the agent's as_cfg in `pid` (its file mapped at offset 0 marks its base)."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith("allocscope-agent.so") and int(parts[2], 16) == 0:
                value, first = elf_symbol(parts[5], "as_cfg")
                cfg = int(parts[0].split("-")[0], 16) - (first & ~0xFFF) + value
                with open(f"/proc/{pid}/mem", "rb") as m:
                    m.seek(cfg)
                    if struct.unpack("<Q", m.read(8))[0] != MAGIC:
                        raise TrialError(f"no agent configuration at {cfg:#x} in {pid}")
                return cfg
    raise TrialError(f"no agent mapped in {pid}")


def set_enabled(pid: int, cfg: int, on: bool) -> None:
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as m:
        m.seek(cfg + ENABLED)
        m.write(struct.pack("<I", 1 if on else 0))


def ci95(vals: list[float]) -> str:
    if len(vals) < 2:
        return f"{vals[0] * 100:.1f} %" if vals else "-"
    mean, se = statistics.fmean(vals), statistics.stdev(vals) / len(vals) ** 0.5
    return f"{mean * 100:.2f} % ± {1.96 * se * 100:.2f}"


def toggled(b: Bench, wl, pairs: int) -> list[dict]:
    """off on off on ... off with one recording attached; each on-window against its neighbours."""
    srv, handle = wl.start()
    tr = None
    try:
        if isinstance(wl, Redis):
            wl.load(handle, max(1000, wl.requests // 4))
        else:
            time.sleep(1.0)
        tr = Tracer(b, "_toggle", srv.pid, f"{wl.name}-toggle")
        cfg = agent_cfg(srv.pid)
        set_enabled(srv.pid, cfg, False)
        window(wl, srv, handle, None)  # unmeasured: caches, frequency
        off = [window(wl, srv, handle, tr)]
        out = []
        for i in range(pairs):
            set_enabled(srv.pid, cfg, True)
            on = window(wl, srv, handle, tr)
            set_enabled(srv.pid, cfg, False)
            off.append(window(wl, srv, handle, tr))
            base = (off[-2]["metric"] + off[-1]["metric"]) / 2
            cpu = (off[-2]["cpu_us"] + off[-1]["cpu_us"]) / 2
            on.update(kept=on["metric"] / base, cpu_ratio=on["cpu_us"] / cpu)
            out.append(on)
            b.say(
                f"  {wl.name} {i + 1}/{pairs}: on {on['metric']:,.0f}/s vs off {off[-2]['metric']:,.0f} & "
                f"{off[-1]['metric']:,.0f}: kept {on['kept'] * 100:.1f} %, CPU/request {on['cpu_ratio'] * 100:.1f} %"
            )
        set_enabled(srv.pid, cfg, True)
        b.say(f"  the recording: {tr.finish()}")
        return out
    finally:
        if tr is not None:
            tr.kill()
        stop_process(srv, signal.SIGKILL, 30)


def table(b: Bench, name: str, res: list[dict]) -> str:
    kept = [r["kept"] for r in res]
    cpu = [r["cpu_ratio"] for r in res]
    b.say()
    b.say(f"| {name} | on-windows | kept: median (min–max) | kept: mean, 95 % | CPU/request: median | mean, 95 % |")
    b.say("|---|---|---|---|---|---|")
    b.say(
        f"| hooks on vs off | {len(res)} | {statistics.median(kept) * 100:.1f} % ({min(kept) * 100:.1f}–"
        f"{max(kept) * 100:.1f}) | {ci95(kept)} | {statistics.median(cpu) * 100:.1f} % | {ci95(cpu)} |"
    )
    return f"{name}: {statistics.median(kept) * 100:.1f} % (mean {ci95(kept)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(ap)
    ap.add_argument("--pairs", type=int, default=30, help="on-windows per workload")
    ap.add_argument("--requests", type=int, default=25000, help="redis-benchmark -n per test and window")
    ap.add_argument("--seconds", type=float, default=1.0, help="rustd's window")
    ap.add_argument("--rustd-threads", type=int, help="default: 8 on >= 8 CPUs (or fewer), else 4")
    ap.add_argument("--workloads", default="rustd,redis")
    ap.add_argument(
        "--record-args",
        default="",
        help="more for `record --inject` (e.g. '--sample-bytes 1099511627776': the hooks' work without the marks)",
    )
    a = ap.parse_args()
    MODES["_toggle"] = ["--inject", *a.record_args.split()]
    if os.geteuid() != 0:
        sys.exit("bench/inject_toggle.py: run as root (it attaches BPF probes and injects)")
    a.no_estimates = True
    work = Path(tempfile.mkdtemp(prefix="inject-toggle-"))
    b = Bench(a, work)
    b.cpus.client = b.cpus.client[:1]
    say_header(b, "`--inject`'s hooks on and off under one recording")
    run_workloads(
        b,
        a,
        lambda name, wl: [table(b, name, toggled(b, wl, a.pairs))],
        "Hooks on against off, with the recording attached throughout: ",
        work,
        False,
    )


if __name__ == "__main__":
    main()
