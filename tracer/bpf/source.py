"""What the BPF program of a recording is made of: probes/allocscope.c with its parts inlined
(`bpf_text`), its compile-time parameters (`probe_cflags`), and which ways of attaching uprobes
the running kernel offers (`links_choice`, `session_choice`). No BCC here."""

from __future__ import annotations

import os
import re

from common.errors import AllocscopeError

from ..base import layout as L
from ..base.options import RecordOptions
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


def probe_cflags(opts: RecordOptions, launched: bool, unwind: str, rss_tracepoint: bool) -> list[str]:
    """The compile-time parameters of probes/allocscope.c for a recording: every bound and mode
    comes from `opts` (tracer/base/options.py, the one place defaults live), the kernel-struct
    offsets from the running kernel's BTF (tracer/bpf/kernel_btf.py), loaded once for all."""
    with one_load():
        return _probe_cflags(opts, launched, unwind, rss_tracepoint)


def _probe_cflags(opts: RecordOptions, launched: bool, unwind: str, rss_tracepoint: bool) -> list[str]:
    flags = [
        f"-DAS_MAX_LIVE={opts.max_live}",
        f"-DAS_MAX_STACKS={opts.max_stacks}",
        f"-DAS_MAX_SITES={opts.max_sites}",
        f"-DAS_MAX_REGIONS={opts.max_regions}",
        f"-DAS_RING_PAGES={opts.ring_pages}",
        f"-DAS_PAGE_SIZE={os.sysconf('SC_PAGE_SIZE')}",
        f"-DAS_UVM_MAJOR={char_major('nvidia-uvm')}",
    ]
    if launched:
        flags.append("-DAS_WAIT_EXEC=1")
    if opts.probe_floor:
        flags.append("-DAS_FLOOR=1")
    flags += ["-DAS_RSS_TRACEPOINT=1"] if rss_tracepoint else rss_offsets().cflags()
    try:
        flags += file_offsets().cflags()
    except (OSError, LookupError):
        pass  # mappings of shared memory and device files stay untracked
    if opts.sample_bytes > 0:  # with the uprobe-session programs (used where the kernel has them)
        flags += [f"-DAS_SAMPLE_BYTES={opts.sample_bytes}ULL", "-DAS_SESSION=1"]
    if opts.mode == "residency":
        flags += ["-DAS_FAULTS=1", f"-DAS_FAULT_SAMPLE={opts.fault_sample}"]
    # --inject: the agent's thread table says which mmap/brk an allocator makes (compiled in every
    # variant, idle without an agent: an --inject recording shares the program of a sampled one)
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
