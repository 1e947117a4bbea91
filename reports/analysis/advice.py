"""Advice from the residency figures: each allocator's own knob for the memory it retains
(jemalloc's MALLOC_CONF, tcmalloc's release rate, mimalloc's purge delay) and glibc's, by arena."""

from __future__ import annotations

import pandas as pd

from common.tracefile.reader import Trace

from ..units import human_bytes
from .allocator_memory import allocator_modules


def conf_env(prefix: str) -> str:
    """jemalloc reads PREFIX_MALLOC_CONF, its symbol prefix upper-cased (_rjem_ -> _RJEM_MALLOC_CONF)."""
    return (prefix.upper() if prefix else "") + "MALLOC_CONF"


def allocator_advice(dec: dict | None, trace: Trace | None = None) -> list[str]:
    """Advice naming each allocator's own knob, with the measured figure (retained > 20% of RSS)."""
    if not dec or not dec.get("allocators") or not dec["rss_bytes"]:
        return []
    rss = dec["rss_bytes"]
    mods = allocator_modules(trace) if trace is not None else {}
    out = []
    for a in dec["allocators"]:
        ret = a["retained"]
        if ret <= 0.2 * rss or a["kind"] == "glibc":
            continue  # glibc: residency_advice, by arena
        what = f"{a['name']} retains {human_bytes(ret)} ({100 * ret // rss}% of RSS) of freed pages"
        rel = f"; it released {human_bytes(a['released'])} so far" if a["released"] else ""
        if a["kind"] == "jemalloc":
            env = conf_env(
                mods.get(a["source"], {}).get("prefix", "") or (a["name"].split(":", 1)[1] if ":" in a["name"] else "")
            )
            out.append(
                f"{what}{rel}: return them sooner with {env}=dirty_decay_ms:1000,muzzy_decay_ms:0 "
                f"(default 10000/0), or background_thread:true so purging does not wait for "
                f'allocation calls; mallctl("arena.<i>.purge") after a burst returns them at once'
            )
        elif a["kind"] == "tcmalloc":
            out.append(
                f"{what}{rel}: TCMALLOC_RELEASE_RATE=10 (default 1; 0 never releases) returns free spans "
                f"sooner; MallocExtension::instance()->ReleaseFreeMemory() after a burst returns them at once"
            )
        elif a["kind"] == "mimalloc":
            out.append(
                f"{what}{rel}: MIMALLOC_PURGE_DELAY=0 (mimalloc 2.1+; 2.0: MIMALLOC_RESET_DELAY and "
                f"MIMALLOC_SEGMENT_DECOMMIT_DELAY) purges at once, mi_collect(true) after a burst; "
                f"mimalloc 2.0 resets with MADV_FREE, whose pages stay in RSS until memory is short "
                f"(MIMALLOC_RESET_DECOMMITS=1 decommits instead)"
            )
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
            f"{dec['shmem_bytes'] >> 20} MiB is shared memory ("
            + (
                "e.g. pinned CUDA host memory shows as RssShmem"
                if cuda
                else "shared anonymous mappings, memfd, tmpfs and SysV segments: a database's shared buffers"
            )
            + ")"
            + (
                f": {dec['shmem_attributed_bytes'] >> 20} MiB of it at the "
                + ("shmem and cuda-pinned" if cuda else "shmem")
                + " sites, "
                f"{dec['shmem_unattributed_bytes'] >> 20} MiB mapped before the attach or not traced"
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
