"""Attaching what appears while recording: allocators in modules mapped since the attach
(dlopen), the CUDA driver once the target maps it, and the source ids they are counted under.
`rec` is the Recorder (tracer/record/recorder.py)."""

from __future__ import annotations

from ..allocators.cuda import find_driver
from ..allocators.discovery import allocators_in, code_files, file_id, plan_allocator
from ..allocators.retention import Owner
from ..base import layout as L
from ..process import procfs


def source_id(names: dict[int, str], name: str) -> int:
    """The source id of heap source `name` in `names` (source id -> name), given the next free
    dynamic id when it is new."""
    for sid, n in names.items():
        if n == name:
            return sid
    sid = max(L.enum("AS_SRC_DYNAMIC") - 1, *names) + 1
    names[sid] = name
    return sid


def attach_new_allocators(rec, maps: list[procfs.Mapping]) -> None:
    """Allocators in modules mapped since the attach (dlopen): probed too, each with its own
    source (heap:KIND[:PREFIX])."""
    probed = {(file_id(pl.allocator.path), pl.allocator.prefix) for pl in rec.plans}
    new = [
        a
        for path in code_files(maps, rec.target.pid)
        for a in allocators_in(path, False)
        if (file_id(a.path), a.prefix) not in probed
    ]
    if not new or rec.opts.mode == "residency" or rec.probes is None:
        return
    plans = []
    for a in new:
        a.source = f"heap:{a.label}"
        plans.append(plan_allocator(a))
    sources = {pl.allocator.source: source_id(rec.source_names, pl.allocator.source) for pl in plans}
    rec.probes.uprobes.attach_more(plans, sources, maps)
    rec.plans += plans
    if rec.retention is not None:
        rec.retention.owners += [
            Owner(pl.allocator.source, pl.allocator.kind, pl.allocator.label, False) for pl in plans
        ]
    rec.progress(
        "allocators loaded since: " + ", ".join(f"{pl.allocator.label} in {pl.allocator.path}" for pl in plans)
    )


def attach_cuda(rec, maps: list[procfs.Mapping]) -> None:
    """Probe the CUDA driver's allocation calls once the target maps libcuda.so.1."""
    if rec.cuda_module is not None or rec.attach_report is None or rec.probes is None:
        return
    path = find_driver(maps)
    if path is not None:
        rec.cuda_module = path
        cuda = rec.probes.attach_cuda(path)
        rec.progress(f"CUDA driver {path}: {len(cuda.get('attached', []))} calls probed")
