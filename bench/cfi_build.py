"""Unwind-table building, pyelftools (tracer/unwind/rows.py `build_table`) vs the C decoder
(tracer/unwind/cfi/cfi.c through tracer/unwind/native.py), side by side on one core, and whether their rows
are the same bytes. No root needed:

    .venv/bin/python bench/cfi_build.py [FILE ...] [--rounds 3] [--skip-python-over MB] [--out FILE.md]

Without FILEs: libc, libstdc++, chromium's executable, and the biggest .eh_frame of the box
(libLLVM) where present. Native: best of --rounds; pyelftools: one round (files bigger than
--skip-python-over MB are not given to it).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import write_lines
from elftools.elf.elffile import ELFFile

from tracer.unwind import native as cfirows
from tracer.unwind import rows as unwind

DEFAULTS = [
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/chromium/chromium",
    "/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1",
    *sorted(glob.glob("/root/.rustup/toolchains/stable-*/lib/libLLVM.so*"))[:1],
]


def frame_bytes(path: str) -> int:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        return sum(
            s["sh_size"]
            for s in elf.iter_sections()
            if s.name in (".eh_frame", ".debug_frame") and s["sh_type"] != "SHT_NOBITS"
        )


def python_table(path: str) -> tuple[float, float, unwind.TableInfo]:
    """(wall s, CPU s, table)"""
    t, c = time.perf_counter(), time.process_time()
    with open(path, "rb") as f:
        info = unwind.build_table(ELFFile(f))
    return time.perf_counter() - t, time.process_time() - c, info


def native_table(path: str, rounds: int) -> tuple[float, float, unwind.TableInfo]:
    """(best wall s, best CPU s, table)"""
    wall, cpu, info = float("inf"), float("inf"), None
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        info = cfirows.native_table(path)
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    assert info is not None, "the C decoder is not built (make setup)"
    return wall, cpu, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-python-over", type=float, default=None, metavar="MB")
    ap.add_argument("--out", help="also write the table (markdown) here")
    a = ap.parse_args()
    files = a.files or [f for f in DEFAULTS if os.path.exists(f)]
    if not cfirows.native_available():
        sys.exit("cfi_build: the C decoder is not available (make setup; ALLOCSCOPE_CFI unset)")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, both decoders
    head = (
        "| file | MB | CFI KiB | FDEs | rows | pyelftools s (CPU) | native s (CPU) | ratio (CPU) | same rows |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    print(head, flush=True)
    for path in files:
        real = os.path.realpath(path)
        mb = os.path.getsize(real) / 2**20
        tn, cn, nat = native_table(real, a.rounds)
        if a.skip_python_over is not None and mb > a.skip_python_over:
            tp, same, ratio = "skipped", "-", "-"
        else:
            secs, cpu, py = python_table(real)
            tp, ratio = f"{secs:.2f} ({cpu:.2f})", f"{cpu / max(cn, 1e-6):.0f}x"
            same = "yes" if (py.rows.tobytes() == nat.rows.tobytes() and py.fdes == nat.fdes) else "NO"
        line = (
            f"| {os.path.basename(path)} | {mb:.1f} | {frame_bytes(real) / 1024:.0f} | {nat.fdes} | "
            f"{len(nat.rows)} | {tp} | {tn:.4f} ({cn:.4f}) | {ratio} | {same} |"
        )
        lines.append(line)
        print(line, flush=True)
    write_lines(a.out, lines)


if __name__ == "__main__":
    main()
