#!/usr/bin/env python3
"""What one hit of an `--inject` marker's uprobe costs, with its probe on the 5-byte nop vs on the
push %rbp (issue 33).

The agent's markers (tracer/inject/agent/agent.c "Markers") are `nopl 0(%rax,%rax,1); push %rbp;
pop %rbp; ret`. allocscope puts their probes on the nop where the kernel optimizes a uprobe on a
5-byte nop (x86-64 since 6.18: the nop becomes a call into a trampoline that makes the uprobe
system call) and on the push elsewhere (an instruction the kernel emulates after a breakpoint
trap). This program calls a copy of that code in a loop (`bench/marker_loop.c`, the agent's
bytes), unprobed, with an empty BPF program on its nop, and on its push, in turns of --calls
calls so that the machine's noise hits all three alike: ns per call, median over --rounds.

    sudo .venv/bin/python bench/marker_trap.py [--rounds 5] [--calls 2000000] [--out FILE]
    sudo python3 bench/marker_trap.py --bundle /path/to/allocscope-0.1.0   # another box
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def load_bcc(bundle: str | None):
    """BCC's python module: the project's (its venv), or a bundle's (its libraries preloaded the
    way its bootstrap does)."""
    if bundle:
        sys.path.insert(0, os.path.join(bundle, "python"))
        sys.path.insert(0, os.path.join(bundle, "libexec"))
        import bootstrap

        bootstrap.kernel_headers()
        bootstrap.preload()
    from bcc import BPF

    return BPF


def marker_offset(exe: Path) -> tuple[int, bytes]:
    """The file offset of `marker` in the loop program, and its first 8 bytes."""
    from elftools.elf.elffile import ELFFile

    with open(exe, "rb") as f:
        elf = ELFFile(f)
        va = next(s["st_value"] for s in elf.get_section_by_name(".symtab").iter_symbols() if s.name == "marker")
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= va < seg["p_vaddr"] + seg["p_filesz"]:
                off = va - seg["p_vaddr"] + seg["p_offset"]
                f.seek(off)
                return off, f.read(8)
    raise SystemExit("marker not in a loaded segment")


def run_loop(exe: Path, calls: int) -> float:
    out = subprocess.run([str(exe), str(calls)], capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2_000_000)
    ap.add_argument("--bundle", help="an allocscope bundle's folder: its BCC (a box without BCC)")
    ap.add_argument("--loop", help="marker_loop built already (a box without gcc); default: built here")
    ap.add_argument("--out", help="also write the lines here (markdown)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("marker_trap.py: needs root (uprobes)")
    if not any(os.path.exists(f"{d}/uprobe_events") for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")):
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=False)  # as the bundle does
    BPF = load_bcc(a.bundle)
    if a.loop:
        exe = Path(a.loop).resolve()
    else:
        exe = Path(tempfile.mkdtemp(prefix="marker-trap-")) / "marker_loop"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "marker_loop.c")], check=True)
    at, code = marker_offset(exe)
    b = BPF(text="int hit(void *ctx) { return 0; }")
    per: dict[str, list[float]] = {"unprobed": [], "probe on the nop5": [], "probe on push %rbp": []}
    for _ in range(a.rounds):
        per["unprobed"].append(run_loop(exe, a.calls))
        for name, off in (("probe on the nop5", 0), ("probe on push %rbp", 5)):
            b.attach_uprobe(name=str(exe), addr=at + off, fn_name="hit")
            per[name].append(run_loop(exe, a.calls))
            b.detach_uprobe(name=str(exe), addr=at + off)
            time.sleep(0.1)
    optimized = b"arch_uprobe_optimize" in Path("/proc/kallsyms").read_bytes()
    lines = [
        f"## marker uprobe round trip — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `bench/marker_trap.py {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {os.cpu_count()} CPUs, kernel {platform.release()}; the kernel optimizes uprobes on a "
        f"5-byte nop: {'yes' if optimized else 'no'} (arch_uprobe_optimize in /proc/kallsyms). "
        f"{a.rounds} rounds of {a.calls:,} calls each way.",
        "",
        "| marker | ns per call (median) | min–max | vs push |",
        "|---|---|---|---|",
    ]
    push = statistics.median(per["probe on push %rbp"])
    for name, v in per.items():
        m = statistics.median(v)
        lines.append(f"| {name} | {m:.1f} | {min(v):.1f}–{max(v):.1f} | {m / push * 100:.0f} % |")
    lines += ["", f"The marker's bytes: `{code.hex(' ')}` (nopl 0(%rax,%rax,1); push %rbp; pop %rbp; ret).", ""]
    print("\n".join(lines))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
