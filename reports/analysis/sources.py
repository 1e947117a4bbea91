"""The trace's memory sources (heap, mmap, brk, fault, shmem, CUDA...) and what each counts as:
host or GPU memory, which layer, which filters a user may apply."""

from __future__ import annotations

import fnmatch
from dataclasses import replace

import numpy as np
import pandas as pd

from common.errors import UsageError
from common.tracefile.reader import Trace

# What the trace's `source` names (tracer/base/layout.py SOURCE_NAMES; tests/test_layout.py checks these
# against it) are, as far as the figures go. GPU memory is never host memory: it is kept out of
# every host figure (live, peak, threads, RSS) and reported in device_* figures of its own.
DEVICE_SOURCES = frozenset({"cuda-device"})

CUDA_HOST_SOURCES = ("cuda-pinned", "cuda-managed")  # host memory made by the CUDA driver

CUDA_SOURCES = frozenset({"cuda-device", *CUDA_HOST_SOURCES})

# Host memory the kernel counts in RssShmem (shared anonymous, memfd, tmpfs; pinned host memory
# is a shared mapping the driver makes) and in RssFile through a device file (managed memory is
# a mapping of /dev/nvidia-uvm; other character devices).
SHMEM_SOURCES = ("shmem", "cuda-pinned")

DEVICE_FILE_SOURCES = ("cuda-managed", "device")

# The live table's api of a cuMemHostRegister_v2: it pins memory the program already has (a
# malloc'd block, counted at its own site), so it adds nothing to RssShmem.
REGISTER_API = "cu_host_register"


def is_device(sources) -> np.ndarray:
    """Per source name: True for GPU memory (DEVICE_SOURCES)."""
    return np.isin(np.asarray(sources, dtype=object), list(DEVICE_SOURCES))


def source_layer(source: str) -> str:
    """What a source is: heap (the malloc family of any allocator: heap, heap:jemalloc:_rjem_...),
    kernel (mmap, brk, shmem, device files: memory straight from the kernel), cuda-host (pinned,
    managed), device (GPU memory), custom (a user's --alloc-fn: a layer above the others, its
    objects live in slabs they counted), fault (residency mode's sampled first touches)."""
    if source.startswith("custom:"):
        return "custom"
    if source in DEVICE_SOURCES:
        return "device"
    if source == "heap" or source.startswith("heap:"):
        return "heap"
    if source in CUDA_HOST_SOURCES:
        return "cuda-host"
    if source == "fault":
        return "fault"
    return "kernel"


def by_source(st: pd.DataFrame) -> dict[str, dict]:
    """{source: {layer, live_bytes, live_count, alloc_bytes, alloc_count}} at the end, sources
    in name order: the layers kept apart (a pool's objects beside the heap its slabs came from)."""
    if st.empty:
        return {}
    g = st.groupby("source")[["live_bytes", "live_count", "alloc_bytes", "alloc_count"]].sum().sort_index()
    return {
        str(src): {"layer": source_layer(str(src)), **{k: int(v) for k, v in row.items()}} for src, row in g.iterrows()
    }


def only_sources(trace: Trace, patterns: list[str]) -> Trace:
    """The trace with its sites (and live blocks) reduced to the sources matching `patterns`
    (exact names or globs: heap, 'heap*', 'custom:*'); UsageError when one matches nothing."""
    if not patterns:
        return trace
    have = sorted(set(trace.sites["source"].astype(str))) if len(trace.sites) else []
    keep: set[str] = set()
    for pat in patterns:
        hit = [s for s in have if fnmatch.fnmatchcase(s, pat)]
        if not hit:
            raise UsageError(
                f"--source {pat!r} matches no source of {trace.path} (it has: {', '.join(have) or 'none'})"
            )
        keep |= set(hit)
    sites = trace.sites[trace.sites["source"].astype(str).isin(keep)]
    live = trace.live
    live = live[live["source"].astype(str).isin(keep)] if len(live) else live
    return replace(trace, sites=sites, live=live, live_table=None)


def parse_sources(values) -> list[str]:
    """--source values (repeatable, comma-separated) as a list of patterns."""
    out = [v.strip() for value in values or () for v in value.split(",")]
    if any(not v for v in out):
        raise UsageError("--source wants a source name or glob (heap, mmap, 'custom:*', 'heap:*')")
    return out


def live_by_source(trace: Trace, st: pd.DataFrame | None = None) -> dict[str, int]:
    """{source: live bytes at the end} summed over every site (GPU memory included), sources in
    name order, those that allocated anything only. `st`: trace.final_sites(), when at hand."""
    st = trace.final_sites() if st is None else st
    if st.empty:
        return {}
    return {str(k): int(v) for k, v in st.groupby("source")["live_bytes"].sum().sort_index().items()}
