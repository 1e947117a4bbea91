#!/usr/bin/env python3
# ruff: noqa: E501  (the parts' descriptions, one line each)
"""Split probes/allocscope.c into its parts by concern, at its section comments ('/* --- NAME').
Idempotent on an already split file (it finds no sections). Run after merging a branch that
still edits the one-file program: `python3 scripts/split-probes.py && make test`."""
from __future__ import annotations

import sys
from pathlib import Path

PROBES = Path(__file__).resolve().parent.parent / "probes"
# (section comment prefix, file, what it holds), in the file's order
PARTS = [
    ("/* --- stacks", "stacks.h", "capture_stack(), the one place a user stack is walked (frame pointers, or the\n"
                                  " * DWARF unwinder of unwind_dwarf.h)."),
    ("/* --- resident memory", "rss.h", "resident memory: the kernel's RSS counters of the target's mm."),
    ("/* --- accounting", "accounting.h", "the live-block table, per-(stack, thread, source) site counters, flows, totals."),
    ("/* --- entry/return pairing", "heap.h", "the heap API: entry/return pairing (per-thread call state), the return\n"
                                              " * program that records an allocation, the entry probes named after the symbols."),
    ("/* --- the CUDA driver API", "cuda.h", "the CUDA driver API (libcuda.so.1): its own call state and entry probes."),
    ("/* --- the users' own allocation functions", "customfns.h", "the users' own allocation functions (--alloc-fn, --free-fn)."),
    ("/* --- memory from the kernel", "regions.h", "memory from the kernel, accounted here: regions (the mmap family's\n"
                                                   " * allocations), their sites, releases, the break, what a mapping is tracked as."),
    ("static __always_inline void mmap_exit(", "syscalls.h", "the syscall tracepoints of the mmap family, brk and madvise:\n"
                                                             " * each exit dispatched to its accounting (regions.h) or, for the rare shapes, an event."),
    ("/* --- threads and process lifetime", "lifetime.h", "threads and process lifetime: renames, exits, exec."),
    ("/* --- residency mode", "faults.h", "residency mode: sampled first touches (page-fault perf events)."),
]


def main() -> int:
    src = (PROBES / "allocscope.c").read_text().split("\n")
    starts = []
    for prefix, name, what in PARTS:
        at = [i for i, ln in enumerate(src) if ln.startswith(prefix)]
        if not at:
            print(f"no section {prefix!r}: already split?", file=sys.stderr)
            return 1
        starts.append((at[0], name, what))
    if [s for s, _, _ in starts] != sorted(s for s, _, _ in starts):
        print("sections out of order", file=sys.stderr)
        return 1
    main_part = src[:starts[0][0]]
    while main_part and main_part[-1] == "":
        main_part.pop()
    bounds = [s for s, _, _ in starts] + [len(src)]
    for (start, name, what), end in zip(starts, bounds[1:], strict=True):
        body = src[start:end]
        while body and body[-1] == "":
            body.pop()
        head = [f"/* allocscope BPF program, {name}: {what}", " *",
                " * Part of probes/allocscope.c: included there, in order, and inlined into it by",
                " * tracer/bpf/source.py bpf_text (BCC rewrites map calls only in the main file). Layouts: allocscope.h. */",
                ""]
        (PROBES / name).write_text("\n".join(head + body) + "\n")
    main_part += [""] + [f'#include "{name}"' for _, name, _ in starts]
    (PROBES / "allocscope.c").write_text("\n".join(main_part) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
