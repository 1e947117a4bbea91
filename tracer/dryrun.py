"""`allocscope record --dry-run` and `allocscope doctor --pid`: what would be probed in a process,
and where — every allocator found, each entry point, its probe's place and why there; the user's
functions; the CUDA driver — resolved and proved on the code, nothing attached."""

from __future__ import annotations

import os

from common.errors import PermissionProblem, TargetError

from .allocators.cuda import CUDA_FUNCS, find_driver
from .allocators.custom import locate, parse_all
from .allocators.discovery import find_allocators, plan_allocator
from .base.options import RecordOptions
from .process import procfs
from .process.target import Target, launch_maps


def describe(target: Target, opts: RecordOptions, title: str = "allocscope record --dry-run") -> str:
    """The plan as text, one allocator a paragraph, under `title` (the command that asked:
    `record --dry-run`, `doctor --pid`)."""
    try:
        maps = launch_maps(target) if target.pid == 0 else procfs.read_maps(target.pid)
    except PermissionError:
        raise PermissionProblem(
            f"cannot read the memory map of pid {target.pid} ({target.comm}): permission denied; "
            "run it as root or as the process's user"
        ) from None
    except OSError as e:
        raise TargetError(f"cannot read the memory map of pid {target.pid}: {e.strerror}") from None
    who = f"command {target.exe}" if target.pid == 0 else f"pid {target.pid} ({target.comm}) {target.exe}"
    out = [f"{title}: {who}; mode {opts.mode}; what a recording would probe, nothing attached"]
    if target.via:
        out.append(target.via)
    allocators = find_allocators(target.exe, maps, target.pid)
    if not allocators:
        out.append("no allocator found (no malloc/free in the executable or its libraries): nothing to probe")
    for a in allocators:
        plan = plan_allocator(a)
        role = "serves malloc" if a.serves_malloc else "beside it"
        out.append("")
        out.append(f"allocator {a.label} in {a.path} ({role}; sites' source: {a.source})")
        if opts.mode == "residency":
            out.append("  residency mode: no allocator probes")
            continue
        for pr in plan.probes:
            kind = "entry+return" if pr.returns else "entry"
            out.append(f"  {pr.symbol:28s} {kind:12s} {os.path.basename(pr.path)}+{pr.offset:#x}  {pr.reason}")
        for sym, other in plan.aliases.items():
            out.append(f"  {sym:28s} same address as {other}: probed once")
        if plan.skipped:
            out.append("  skipped: " + ", ".join(f"{s} ({why})" for s, why in plan.skipped.items()))
    for fn in parse_all(opts.alloc_fns, opts.free_fns):
        loc = locate(fn, target.exe, maps)
        out.append("")
        out.append(
            f"your function {fn.symbol} in {loc.path}+{loc.offset:#x} ({'free' if fn.free else 'allocation'}; "
            f"source {fn.source}): {fn.spec}"
        )
    driver = find_driver(maps)
    out.append("")
    if driver:
        out.append(f"CUDA driver {driver}: {len(CUDA_FUNCS)} driver API calls would be probed")
    else:
        out.append("no CUDA driver (libcuda.so.1) mapped: no GPU probes (they attach if it is dlopen'd later)")
    return "\n".join(out)
