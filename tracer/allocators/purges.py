"""--inject: the allocators' purge calls keep their uprobes.

The agent hooks only the allocation calls and the frees (tracer/inject/injection.py HOOKS). A
purge call — malloc_trim, jemalloc's mallctl, MallocExtension_ReleaseFreeMemory/ReleaseToSystem,
mi_collect: the probe programs `malloc_trim_enter` and `mallctl_enter` (each family's `purges` in
common/allocators/; mallctl only when its name asks a purge, probes/heap.h mallctl_purges) — is rare and
measured one by one (the anonymous RSS dropped across it, its duration: the `purges` table,
`waits.freeing.purges`, the per-allocator releases), so it is probed the out-of-process way, entry
and return, as without --inject. Without these probes an injected recording had no purge at all,
and the releases made inside one (malloc_trim's madvises) counted as the program's own.
"""

from __future__ import annotations

from dataclasses import replace

from common.allocators import PURGE_PROGRAMS

__all__ = ["NOT_HOOKED", "PURGE_PROGRAMS", "purge_plans"]
NOT_HOOKED = "a purge call: keeps its uprobe (each call traps)"


def purge_plans(plans: list) -> list:
    """`plans` (tracer.allocators.Plan) cut down to their purge calls; the allocators without one left out."""
    out = []
    for pl in plans:
        probes = [pr for pr in pl.probes if pr.program in PURGE_PROGRAMS]
        if probes:
            out.append(replace(pl, probes=probes))
    return out
