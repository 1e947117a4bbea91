"""Probes on the CUDA driver's allocation calls (libcuda.so.1; tracer/allocators/cuda.py), placed as
the allocator's are, attached with the recording's other uprobes (tracer/bpf/attach.py)."""

from __future__ import annotations

import os

from common.errors import PermissionProblem

from .attach import BPF_PROBE_ENTRY, BPF_PROBE_RETURN, Uprobes
from .symbols import symbol_offsets


def attach_cuda(uprobes: Uprobes, path: str) -> dict:
    """Entry and return probes on the CUDA driver's allocation calls in `path`
    (libcuda.so.1; tracer/allocators/cuda.py), placed as the allocator's are. A call the library lacks,
    or one whose probe the kernel refuses, is skipped and said; the recording goes on."""
    from ..allocators.cuda import CUDA_FUNCS, CudaReport  # noqa: PLC0415
    from ..allocators.placement import place_probe  # noqa: PLC0415

    rep = CudaReport(module=path, attached=[], skipped={}, placement={})
    if uprobes.options.mode == "residency":
        rep.skipped = dict.fromkeys(CUDA_FUNCS, "residency mode: no API probes")
        uprobes.report.cuda = rep.as_dict()
        return uprobes.report.cuda
    so = symbol_offsets(path, list(CUDA_FUNCS))
    plan: list[tuple[str, str, int]] = []
    by_offset: dict[int, str] = {}
    for sym, (prog, reads) in CUDA_FUNCS.items():
        off = so.offsets.get(sym)
        if off is None:
            rep.skipped[sym] = f"not defined by {os.path.basename(path)}"
            continue
        if off in by_offset:
            rep.skipped[sym] = f"same address as {by_offset[off]}: probed once"
            continue
        by_offset[off] = sym
        pl = place_probe(path, off, so.sizes.get(sym, 0), reads)
        if pl.moved:
            rep.placement[sym] = pl.reason
        plan.append((sym, prog, pl.offset))
    returns = []
    for sym, _prog, off in plan:  # returns first, as for the allocator
        try:
            uprobes.add("cu_return", path, off, BPF_PROBE_RETURN)
            returns.append((sym, _prog, off))
        except PermissionProblem as e:
            rep.skipped[sym] = str(e)
    failed = uprobes.flush()
    kept = []
    for r in returns:
        why = failed.get(("cu_return", path, r[2], BPF_PROBE_RETURN))
        if why:
            rep.skipped[r[0]] = why
        else:
            kept.append(r)
    returns = kept
    for sym, prog, off in returns:
        try:
            uprobes.add(prog, path, off, BPF_PROBE_ENTRY)
        except PermissionProblem as e:
            rep.skipped[sym] = str(e)
    failed = uprobes.flush()
    for sym, prog, off in returns:
        if sym in rep.skipped:
            continue
        if (prog, path, off, BPF_PROBE_ENTRY) in failed:
            rep.skipped[sym] = failed[(prog, path, off, BPF_PROBE_ENTRY)]
        else:
            rep.attached.append(sym)
    uprobes.report.cuda = rep.as_dict()
    return uprobes.report.cuda
