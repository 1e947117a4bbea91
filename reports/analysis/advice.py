"""Advice from the residency figures: each allocator's own knob for the memory it retains
(its family's `advice` in common/allocators/: jemalloc's MALLOC_CONF, tcmalloc's release rate,
mimalloc's purge delay) and glibc's, by arena."""

from __future__ import annotations

import pandas as pd

from common import allocators as registry
from common.allocators.jemalloc import JEMALLOC
from common.tracefile.reader import Trace

from ..units import human_bytes
from .allocator_memory import allocator_modules


def conf_env(prefix: str) -> str:
    """jemalloc reads PREFIX_MALLOC_CONF, its symbol prefix upper-cased (_rjem_ -> _RJEM_MALLOC_CONF)."""
    return JEMALLOC.conf_env(prefix)


def allocator_prefix(a: dict, mods: dict[str, dict] | None = None) -> str:
    """The symbol prefix of a report's allocator entry ({name, source, ...}): its module's
    (meta.json probes.allocators[]), else the name's part after the kind (jemalloc:_rjem_)."""
    prefix = (mods or {}).get(a.get("source", ""), {}).get("prefix", "")
    name = str(a.get("name") or "")
    return prefix or (name.split(":", 1)[1] if ":" in name else "")


def allocator_advice(dec: dict | None, trace: Trace | None = None) -> list[str]:
    """Advice naming each allocator's own knob, with the measured figure (retained > 20% of RSS)."""
    if not dec or not dec.get("allocators") or not dec["rss_bytes"]:
        return []
    rss = dec["rss_bytes"]
    mods = allocator_modules(trace) if trace is not None else {}
    out = []
    for a in dec["allocators"]:
        ret = a["retained"]
        fam = registry.family(a["kind"])
        if ret <= 0.2 * rss or (fam is not None and fam.advice_by_arena):
            continue  # glibc: residency_advice, by arena
        what = f"{a['name']} retains {human_bytes(ret)} ({100 * ret // rss}% of RSS) of freed pages"
        rel = f"; it released {human_bytes(a['released'])} so far" if a["released"] else ""
        if fam is not None and fam.advice:
            out.append(f"{what}{rel}: {fam.advice_text(allocator_prefix(a, mods))}")
        else:
            out.append(f"{what}{rel}")
    return out


def residency_advice(arenas: pd.DataFrame, dec: dict | None, cuda: bool = False) -> list[str]:
    """Plain advice from the arena table and the RSS decomposition. `cuda`: the CUDA driver is
    mapped in the process (`cuda_mapped`); only then does the advice speak of pinned CUDA host
    memory."""
    if dec is None or not dec["rss_bytes"]:
        return []
    rss = dec["rss_bytes"]
    out = []
    if dec.get("live_or_retained_bytes"):  # residency mode, no census: no arena's free memory is known
        arenas = arenas.iloc[0:0]
    thread = arenas[arenas["kind"] == "thread"]
    t_ret = int(thread["retained_bytes"].sum())
    m_ret = int(arenas.loc[arenas["kind"] == "main", "retained_bytes"].sum())
    if t_ret > 0.2 * rss and thread["id"].nunique() > 1:
        out.append(
            f"{thread['id'].nunique()} glibc thread arenas retain {human_bytes(t_ret)} "
            f"({100 * t_ret // rss}% of RSS) that the program freed: cap them with MALLOC_ARENA_MAX=2..4, "
            "or call malloc_trim(0) after bursts"
        )
    if m_ret > 0.2 * rss:
        out.append(
            f"the main heap retains {human_bytes(m_ret)} ({100 * m_ret // rss}% of RSS) of freed memory: "
            "malloc_trim(0) returns whole free pages; if it sits at the top of the heap, lower "
            "M_TRIM_THRESHOLD (GLIBC_TUNABLES=glibc.malloc.trim_threshold=...)"
        )
    if dec["live_heap_bytes"] > 0.5 * rss:
        out.append("most resident memory is live data the program holds: see the top sites")
    if dec["other_anon_bytes"] > 0.5 * rss:
        out.append(
            "most resident memory is anonymous memory outside the allocator's heaps "
            "(mmap regions, thread stacks, another allocator): see the mmap sites"
        )
    if dec["shmem_bytes"] > 0.2 * rss:
        out.append(
            f"{human_bytes(dec['shmem_bytes'])} is shared memory ("
            + (
                "e.g. pinned CUDA host memory shows as RssShmem"
                if cuda
                else "shared anonymous mappings, memfd, tmpfs and SysV segments: a database's shared buffers"
            )
            + ")"
            + (
                f": {human_bytes(dec['shmem_attributed_bytes'])} of it at the "
                + ("shmem and cuda-pinned" if cuda else "shmem")
                + " sites, "
                f"{human_bytes(dec['shmem_unattributed_bytes'])} mapped before the attach or not traced"
                if "shmem_attributed_bytes" in dec
                else ""
            )
        )
    return out


def cuda_mapped(meta: dict, live_by_source: dict[str, int] | None = None) -> bool:
    """Whether the CUDA driver is in the process: the probes attached to a libcuda (meta.json
    probes.cuda.module) or a site of a cuda-* source allocated."""
    cuda = (meta.get("probes") or {}).get("cuda")
    if isinstance(cuda, dict) and cuda.get("module"):
        return True
    return any(str(k).startswith("cuda-") for k in (live_by_source or {}))
