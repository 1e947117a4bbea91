"""What the BPF program of a recording is made of: probes/allocscope.c with its parts inlined
(`bpf_text`), its parameters (`probe_config`: compile-time flags and load-time constants), and
which ways of attaching uprobes the running kernel offers (`links_choice`, `session_choice`). No BCC here."""

from __future__ import annotations

import os
import re

from common.errors import AllocscopeError

from ..base import layout as L
from ..base.options import RecordOptions, fault_weight
from ..unwind.rows import UNWIND_STEPS
from ..unwind.unwinder import MODULE_SLOTS
from .kernel_btf import (
    char_major,
    file_offsets,
    fsbase_offset,
    one_load,
    return_probe_offsets,
    rss_offsets,
    switch_offsets,
)

# The values a recording gives the program at load time (probes/common.h AS_K: one move of an
# immediate the loader rewrites, tracer/bpf/prebuilt.py), in a fixed order: their markers in a
# prebuilt program are CONST_MARKER + 0x100 * index. Kernel-struct offsets (AS_OFF_*) are
# load-time too, each named in the program by its flag.
LOAD_TIME = ("AS_TGID", "AS_LAUNCHED", "AS_FLOOR", "AS_UVM_MAJOR", "AS_SAMPLE_BYTES", "AS_FAULT_SAMPLE")


def is_load_time(name: str) -> bool:
    return name in LOAD_TIME or name.startswith("AS_OFF_")


def probe_config(
    opts: RecordOptions, launched: bool, unwind: str, rss_tracepoint: bool, pid: int = 0
) -> tuple[list[str], dict[str, int]]:
    """The parameters of probes/allocscope.c for a recording: (compile-time -D flags, load-time
    constants). Every bound and mode comes from `opts` (tracer/base/options.py, the one place
    defaults live), the kernel-struct offsets from the running kernel's BTF
    (tracer/bpf/kernel_btf.py), loaded once for all. The compile-time flags are what a program
    built once must match (the variant: DWARF or frame pointers, the RSS tracepoint, which kernel
    offsets exist, the page size; the map sizes, which only size maps); the constants are set
    at load, so that sampling, residency mode, launch mode and the kernel's offsets need no
    compile of their own (sampled, residency and session programs are always compiled in)."""
    with one_load():
        flags = _probe_flags(opts, unwind, rss_tracepoint)
    consts: dict[str, int] = {
        "AS_TGID": pid,
        "AS_LAUNCHED": int(launched),
        "AS_FLOOR": int(opts.probe_floor),
        "AS_UVM_MAJOR": char_major("nvidia-uvm"),
        "AS_SAMPLE_BYTES": max(0, opts.sample_bytes),
        "AS_FAULT_SAMPLE": fault_weight(opts.fault_sample, opts.fault_duty) if opts.mode == "residency" else 1,
    }
    compile_time = []
    for f in flags:
        name, _, value = f[2:].partition("=")
        if is_load_time(name):
            consts[name] = int(value)
        else:
            compile_time.append(f)
    return compile_time, consts


def const_flags(consts: dict[str, int]) -> list[str]:
    """-D flags giving each load-time constant its value through AS_K (probes/common.h)."""
    return [f"-D{name}=AS_K({value})" for name, value in consts.items()]


def probe_cflags(opts: RecordOptions, launched: bool, unwind: str, rss_tracepoint: bool, pid: int = 0) -> list[str]:
    """Every -D flag of a compile of probes/allocscope.c for this recording (probe_config's two
    parts, the constants with their values)."""
    flags, consts = probe_config(opts, launched, unwind, rss_tracepoint, pid)
    return flags + const_flags(consts)


def _probe_flags(opts: RecordOptions, unwind: str, rss_tracepoint: bool) -> list[str]:
    flags = [
        f"-DAS_MAX_LIVE={opts.max_live}",
        f"-DAS_MAX_STACKS={opts.max_stacks}",
        f"-DAS_MAX_SITES={opts.max_sites}",
        f"-DAS_MAX_REGIONS={opts.max_regions}",
        f"-DAS_RING_PAGES={opts.ring_pages}",
        f"-DAS_PAGE_SIZE={os.sysconf('SC_PAGE_SIZE')}",
        "-DAS_SESSION=1",  # the uprobe-session programs (loaded only where the kernel has them)
        "-DAS_FAULTS=1",  # residency mode's perf-event programs (loaded only in that mode)
    ]
    flags += ["-DAS_RSS_TRACEPOINT=1"] if rss_tracepoint else rss_offsets().cflags()
    try:
        flags += file_offsets().cflags()
    except (OSError, LookupError):
        pass  # mappings of shared memory and device files stay untracked
    # --inject: the agent's thread table says which mmap/brk an allocator makes (compiled in every
    # variant, idle without an agent)
    flags += fsbase_offset()
    flags += switch_offsets()  # the raw sched_switch program (else the classic tracepoint)
    if unwind == "dwarf":
        flags += return_probe_offsets()
        flags += [
            "-DAS_UNWIND_DWARF=1",
            f"-DAS_UNWIND_ROWS={opts.unwind_rows}",
            f"-DAS_UNWIND_STEPS={UNWIND_STEPS}",
            f"-DAS_UNWIND_MODULES={MODULE_SLOTS}",
        ]
    return flags


def _kernel_below(release: str, version: tuple[int, int]) -> bool:
    m = re.match(r"(\d+)\.(\d+)", release)
    return m is not None and (int(m.group(1)), int(m.group(2))) < version


def links_choice(opts: RecordOptions, release: str | None = None) -> tuple[bool, str]:
    """(attach the uprobes through uprobe_multi links, why not): kernel 6.6+."""
    if opts.uprobes == "perf":
        return False, "--uprobes perf"
    release = release or os.uname().release
    if _kernel_below(release, (6, 6)):
        why = f"kernel {release} has no uprobe_multi links (6.6+)"
        if opts.uprobes == "multi":
            raise AllocscopeError(f"--uprobes multi: {why}")
        return False, why
    return True, ""


def session_choice(opts: RecordOptions, release: str | None = None) -> tuple[bool, str]:
    """(use uprobe sessions, why not): only sampled recordings of the heap gain from them (an
    unsampled call skips its return trap); they need kernel 6.13+ and uprobe_multi links.
    Whether the kernel really takes them is known at the first link (Uprobes.attach_sessions)."""
    if opts.sample_bytes <= 0 or opts.mode != "full" or opts.probe_floor:
        return False, ""
    if opts.inject:
        return False, "--inject: the agent samples in the process (markers, classic probes)"
    if opts.uprobe_sessions == "off":
        return False, "--uprobe-sessions off"
    release = release or os.uname().release
    multi, why = links_choice(opts, release)
    if multi and _kernel_below(release, (6, 13)):
        why = f"kernel {release} has no uprobe sessions (6.13+)"
    if not multi or why:
        if opts.uprobe_sessions == "on":
            raise AllocscopeError(f"--uprobe-sessions on: {why}")
        return False, why
    return True, ""


def bpf_text() -> bytes:
    """probes/allocscope.c with its local includes other than allocscope.h inlined, recursively,
    each file at its first include (a later one is dropped): BCC rewrites map calls
    (`map.lookup(...)`) only in the main file, and the units (probes/heap.bpf.c, ...) and
    headers (heap.h, regions.h, ...) have some."""
    seen: set[str] = set()

    def expand(path) -> str:
        def inline(m: re.Match) -> str:
            name = m.group(1)
            part = L.PROBES_DIR / name
            if name == L.HEADER.name or not part.is_file():
                return m.group(0)
            if name in seen:
                return f"/* {name}: above */"
            seen.add(name)
            return f"/* ---- {name} ---- */\n{expand(part)}\n/* ---- end of {name} ---- */"

        return re.sub(r'^#include "([\w.]+)"[ \t]*$', inline, path.read_text(), flags=re.M)

    return expand(L.SOURCE).encode()
