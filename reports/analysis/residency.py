"""What is resident and why: glibc's arenas (with its census), the shared memory and file split,
and the RSS split at the end. Each allocator's own memory: allocator_memory.py; the advice:
advice.py; malloc_trim calls and the releases by thread: releases.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from common.pages import PAGE
from common.tracefile.reader import Trace

from .allocator_memory import allocator_split, allocator_timeline
from .equations import allocator_terms, split_equations
from .sampled import sampled_split
from .sources import DEVICE_FILE_SOURCES, REGISTER_API, SHMEM_SOURCES, live_by_source

ARENA_COLUMNS = [
    "id",
    "kind",
    "live_bytes",
    "resident_bytes",
    "retained_bytes",
    "threads",
    "heaps",
    "size_bytes",
    "estimated",
    "live_before_bytes",
    "free_bytes",
    "census_sampled",
]

BEFORE_UNSEPARATED = "allocated before the attach or retained: not separable without an allocator census"


def census_end(trace: Trace, when: str = "end") -> dict[str, dict]:
    """{arena id: its `census` row (tracer/allocators/census.py) taken `when` ('attach' | 'end')}; {} for a
    trace without one (another allocator, the census off, a trace before version 5)."""
    c = trace.census
    if c is None or c.empty:
        return {}
    c = c[c["when"] == when]
    return {str(r["arena"]): r for r in c.to_dict("records")}


def chunk_bytes(size: np.ndarray, mmapped: np.ndarray) -> np.ndarray:
    """What glibc spends on blocks of `size` requested bytes: a heap chunk (size + 8, 16-byte
    rounded, 32 at least), a mmapped chunk (size + 16, page-rounded)."""
    size = size.astype(np.int64, copy=False)
    heap = np.maximum(32, (size + 8 + 15) & ~np.int64(15))
    return np.where(mmapped, (size + 16 + 4095) & ~np.int64(4095), heap)


def arena_table(trace: Trace) -> pd.DataFrame:
    """Allocator arenas at the end of the recording, ranked by retained bytes. Columns: id
    ('main', the arena address of a glibc thread arena, 'mmap' for the allocator's own mmapped
    chunks, 'other' for heap-API blocks outside those, e.g. jemalloc extents), kind
    (main|thread|mmap|other), live_bytes (blocks allocated after attach and still live),
    resident_bytes (pagemap at the end; None when unknown), retained_bytes (resident − live,
    at least 0: memory the allocator keeps that the program does not hold; with a census,
    resident − live − live_before: free and resident only), threads (tids that
    allocated the live blocks), heaps (glibc heaps in the arena), size_bytes (mapped read-write),
    estimated (residency sampled, not read page by page, or a chunk range shared with CUDA host
    memory whose pages were taken off), live_before_bytes (glibc's census at the end,
    tracer/allocators/census.py: chunks in use that are no block the probes saw allocated — blocks from
    before the attach still allocated, chunk bytes; None without a census), free_bytes (the
    census's free chunks: bins, fastbins, tcaches, top; None without), census_sampled (the
    census walked part of it and estimated the rest). The tracer measures every live block outside glibc's
    heaps as an allocator chunk, the pinned and managed memory the CUDA driver maps too: a range
    of such memory alone is left out, so RSS decomposition never calls it retained."""
    h = trace.heaps
    if h is None or h.empty:
        return pd.DataFrame(columns=ARENA_COLUMNS)
    h = h.sort_values("start").reset_index(drop=True)
    starts = h["start"].to_numpy(dtype=np.uint64)
    ends = h["reserved_end"].to_numpy(dtype=np.uint64)
    is_mmap = (h["kind"] == "mmap").to_numpy()
    n = len(h)
    other = n  # heap-API blocks in no known range
    live_sum: dict[int, int] = {}
    chunk_sum: dict[int, int] = {}  # the same blocks in chunk bytes (the census's units)
    tids: dict[int, set[int]] = {}
    # Bytes of other blocks (CUDA host memory the driver mapped: the tracer measures every live
    # block outside glibc's heaps as an allocator chunk) in `mmap` ranges, page-rounded, and
    # whether a range holds any heap-API block at all.
    foreign = np.zeros(n, dtype=np.int64)
    has_heap = np.zeros(n, dtype=bool)
    page_mask = np.uint64(~(PAGE - 1) & 0xFFFFFFFFFFFFFFFF)
    # One pass over the live blocks, batch by batch, no per-row Python: the range of each block
    # (or none), then exact hash aggregates per range.
    for b in trace.live_batches(["source", "addr", "size", "tid"]):
        addr, size, tid = b["addr"].astype(np.uint64, copy=False), b["size"], b["tid"]
        row = np.full(len(addr), -1, dtype=np.int32)
        if n <= 16:  # a few ranges (they never overlap): two compares a range
            for j in range(n):
                row[(addr >= starts[j]) & (addr < ends[j])] = j
        else:
            i = np.searchsorted(starts, addr, side="right") - 1
            ic = np.maximum(i, 0)
            ok = (i >= 0) & (addr < ends[ic])
            row[ok] = ic[ok]
        heap = b["heap"]
        if not heap.all():
            f = ~heap & (row >= 0)
            f[f] = is_mmap[row[f]]
            if f.any():
                lo, hi = addr[f] & page_mask, (addr[f] + size[f].astype(np.uint64) + np.uint64(4095)) & page_mask
                np.add.at(foreign, row[f], np.minimum(hi, ends[row[f]]).astype(np.int64) - lo.astype(np.int64))
            addr, size, tid, row = addr[heap], size[heap], tid[heap], row[heap]
        has_heap[row[row >= 0]] = True
        grp = np.where(row >= 0, row, other).astype(np.int32)
        chunk = chunk_bytes(size, np.where(row >= 0, is_mmap[np.maximum(row, 0)], False))
        tab = pa.table({"g": grp, "size": size.astype(np.int64, copy=False), "tid": tid, "chunk": chunk})
        sums = tab.group_by("g").aggregate([("size", "sum"), ("chunk", "sum")])
        for g, v, cb in zip(sums["g"].to_pylist(), sums["size_sum"].to_pylist(), sums["chunk_sum"].to_pylist()):
            live_sum[g] = live_sum.get(g, 0) + v
            chunk_sum[g] = chunk_sum.get(g, 0) + cb
        pairs = tab.group_by(["g", "tid"]).aggregate([])
        for g, t in zip(pairs["g"].to_pylist(), pairs["tid"].to_pylist()):
            tids.setdefault(g, set()).add(t)
    # an `mmap` range of CUDA host memory alone is no allocator chunk; one shared with chunks
    # (neighbouring mappings merged) loses those pages' bytes, an estimate from then on
    keep = ~(is_mmap & (foreign > 0) & ~has_heap)
    resident = h["resident_bytes"].to_numpy(dtype=np.int64) - foreign
    estimated = h["estimated"].to_numpy().astype(bool) | (foreign > 0)
    ids = np.where(h["kind"] == "main", "main", np.where(is_mmap, "mmap", h["arena"]))
    rows = []
    for aid in dict.fromkeys(ids[keep]):
        idx = np.flatnonzero((ids == aid) & keep)
        lb = int(sum(live_sum.get(int(j), 0) for j in idx))
        res = int(np.maximum(resident[idx], 0).sum())
        kind = str(h["kind"].iloc[idx[0]])
        rows.append(
            {
                "id": str(aid),
                "kind": kind,
                "live_bytes": lb,
                "resident_bytes": res,
                "retained_bytes": max(0, res - lb),
                "threads": sorted(set().union(*(tids.get(int(j), set()) for j in idx))),
                "heaps": int(len(idx)) if kind != "mmap" else 0,
                "size_bytes": int((h["end"].to_numpy()[idx] - h["start"].to_numpy()[idx]).sum()),
                "estimated": bool(estimated[idx].any()),
                "_chunk": int(sum(chunk_sum.get(int(j), 0) for j in idx)),
            }
        )
    if other in live_sum:
        rows.append(
            {
                "id": "other",
                "kind": "other",
                "live_bytes": int(live_sum[other]),
                "resident_bytes": None,
                "retained_bytes": 0,
                "threads": sorted(tids.get(other, [])),
                "heaps": 0,
                "size_bytes": 0,
                "estimated": False,
            }
        )
    _apply_census(rows, census_end(trace))
    df = pd.DataFrame(rows, columns=ARENA_COLUMNS)
    return df.sort_values(["retained_bytes", "live_bytes"], ascending=False).reset_index(drop=True)


def _apply_census(rows: list[dict], cen: dict[str, dict]) -> None:
    """Each arena row's live_before_bytes (its census's chunks in use less the chunks of the
    blocks the probes saw allocated), free_bytes, and its retained bytes then: resident − live −
    live_before (free and resident only). glibc's mmapped chunks from before the attach are in
    no `heaps` range: the census's `mmap` row adds them (its resident pages measured)."""
    for r in rows:
        chunk = r.pop("_chunk", 0)
        c = cen.get(r["id"])
        if c is None:
            r.update(live_before_bytes=None, free_bytes=None, census_sampled=False)
            continue
        before = max(0, int(c["in_use_bytes"]) - chunk)
        if r["id"] == "mmap" and int(c["resident_bytes"]) >= 0:
            r["resident_bytes"] = max(int(r["resident_bytes"] or 0), int(c["resident_bytes"]))
            r["size_bytes"] = max(int(r["size_bytes"]), int(c["system_bytes"]))
        res = r["resident_bytes"]
        if res is not None:  # no more than is resident beside the live blocks
            before = min(before, max(0, int(res) - int(r["live_bytes"])))
            r["retained_bytes"] = max(0, int(res) - int(r["live_bytes"]) - before)
        r.update(
            live_before_bytes=before,
            census_sampled=bool(c["sampled"]),
            free_bytes=int(c["free_bytes"] + c["fastbin_bytes"] + c["tcache_bytes"] + c["top_bytes"]),
        )
    if "mmap" in cen and not any(r["id"] == "mmap" for r in rows):
        c = cen["mmap"]
        res = max(0, int(c["resident_bytes"]))
        before = min(int(c["in_use_bytes"]), res)
        rows.append(
            {
                "id": "mmap",
                "kind": "mmap",
                "live_bytes": 0,
                "resident_bytes": res,
                "retained_bytes": 0,
                "threads": [],
                "heaps": 0,
                "size_bytes": int(c["system_bytes"]),
                "estimated": False,
                "live_before_bytes": before,
                "free_bytes": 0,
                "census_sampled": bool(c["sampled"]),
            }
        )


def live_bytes_by_api(trace: Trace) -> dict[str, int]:
    """{api: bytes} of the final live table (the blocks outstanding at the end), summed in
    Arrow; {} for a trace without one (cut short)."""
    tab = trace.live_table
    if tab is None:
        df = trace.live
        return {str(k): int(v) for k, v in df.groupby("api", observed=True)["size"].sum().items()} if len(df) else {}
    out: dict[str, int] = {}
    # batch by batch: each row group of a part has its own dictionary of api names
    for b in tab.select(["api", "size"]).to_batches():
        api = b.column(0)
        key, names = (api.indices, api.dictionary.to_pylist()) if pa.types.is_dictionary(api.type) else (api, None)
        agg = pa.table({"k": key, "s": b.column(1)}).group_by("k").aggregate([("s", "sum")])
        for k, v in zip(agg["k"].to_pylist(), agg["s_sum"].to_pylist()):
            name = str(names[k] if names is not None else k)
            out[name] = out.get(name, 0) + int(v)
    return out


def shared_split(trace: Trace, shmem_bytes: int, file_bytes: int, by_source: dict[str, int] | None = None) -> dict:
    """Who holds RssShmem and the device share of RssFile at the end, host memory only:
    shmem_attributed_bytes (live bytes of shmem and cuda-pinned sites — shared anonymous, memfd
    and tmpfs mappings, pinned host memory — less the ranges cuMemHostRegister_v2 pinned in
    place, which are anonymous memory counted at their own site; at most RssShmem),
    shmem_unattributed_bytes (the rest of RssShmem: shared memory mapped before the attach or by
    means not traced, e.g. SysV shmat), shmem_sources ({source: live bytes} of those sites),
    file_device_bytes (live bytes of cuda-managed and device sites — mappings of device files:
    managed memory is /dev/nvidia-uvm — at most RssFile), file_regular_bytes (the rest of
    RssFile: executables, libraries, data files), file_device_sources. Live bytes are mapped
    sizes: pinned memory is resident at once, but a shared mapping never touched is not, so
    the attributed share is an upper bound where such mappings are sparse. `by_source`:
    live_by_source(trace), when at hand."""
    by_src = live_by_source(trace) if by_source is None else by_source
    shm = {k: by_src[k] for k in SHMEM_SOURCES if by_src.get(k)}
    registered = live_bytes_by_api(trace).get(REGISTER_API, 0) if shm.get("cuda-pinned") else 0
    if registered:
        shm["cuda-pinned"] = max(0, shm["cuda-pinned"] - registered)
    dev = {k: by_src[k] for k in DEVICE_FILE_SOURCES if by_src.get(k)}
    shm_att = min(max(shmem_bytes, 0), sum(shm.values()))
    file_dev = min(max(file_bytes, 0), sum(dev.values()))
    return {
        "shmem_attributed_bytes": shm_att,
        "shmem_unattributed_bytes": max(0, shmem_bytes - shm_att),
        "shmem_sources": shm,
        "file_device_bytes": file_dev,
        "file_regular_bytes": max(0, file_bytes - file_dev),
        "file_device_sources": dev,
    }


def _end_rss(trace: Trace, by_source: dict[str, int] | None) -> tuple[pd.Series, dict] | None:
    """The last interval row with the target's RSS read (None when none has one) and the split
    of its shared memory and file pages (`shared_split`)."""
    iv = trace.intervals
    if "rss_anon_bytes" not in iv:
        return None
    alive = iv[iv["rss_bytes"] >= 0]
    if alive.empty:
        return None
    last = alive.iloc[-1]
    return last, shared_split(trace, int(last["rss_shmem_bytes"]), int(last["rss_file_bytes"]), by_source)


def _rss_decomposition_v2(trace: Trace, arenas: pd.DataFrame, by_source: dict[str, int] | None = None) -> dict | None:
    """RSS at the end split as: live heap (held by the program, resident) + retained by the
    allocator (resident, not held) + other anonymous (stacks, the program's own mmaps, memory of
    allocators we cannot see into) + file-backed + shared memory. The first two are measured
    (pagemap of the allocator's ranges); other anonymous is RssAnon minus the allocator's
    resident bytes. Shared memory and file are split further by `shared_split` (the shmem and
    pinned sites' share of RssShmem, the device-file share of RssFile). GPU memory is never in
    RSS and never here. None when the trace has no end-of-run residency. `by_source`:
    live_by_source(trace), when at hand."""
    end = _end_rss(trace, by_source)
    if end is None:
        return None
    last, split = end
    if arenas.empty or arenas["resident_bytes"].isna().all():
        # Not glibc (jemalloc, tcmalloc...): its retention cannot be told apart from other
        # anonymous memory; the live heap is what the program holds.
        held = min(int(last["heap_live_bytes"]), int(last["rss_anon_bytes"]))
        parts = {
            "live_heap_bytes": held,
            "retained_bytes": 0,
            "other_anon_bytes": max(0, int(last["rss_anon_bytes"]) - held),
            "file_bytes": int(last["rss_file_bytes"]),
            "shmem_bytes": int(last["rss_shmem_bytes"]),
        }
        out = {
            "rss_bytes": int(last["rss_bytes"]),
            **parts,
            "sum_bytes": sum(parts.values()),
            "allocator_resident_bytes": None,
            "retained_known": False,
            **split,
        }
        out["equations"] = split_equations(out)
        return out
    known = arenas[arenas["resident_bytes"].notna()]
    resident = int(known["resident_bytes"].sum())
    held = int(
        np.minimum(known["live_bytes"].to_numpy(dtype=np.int64), known["resident_bytes"].to_numpy(dtype=np.int64)).sum()
    )
    retained = int(known["retained_bytes"].sum())
    other_anon = max(0, int(last["rss_anon_bytes"]) - resident)
    # residency mode (no allocator probes) without a census: free and live heap memory are one
    either = {"live_or_retained_bytes": retained} if trace.meta.get("mode") == "residency" else {}
    parts = {
        "live_heap_bytes": held,
        "retained_bytes": 0 if either else retained,
        **either,
        "other_anon_bytes": other_anon,
        "file_bytes": int(last["rss_file_bytes"]),
        "shmem_bytes": int(last["rss_shmem_bytes"]),
    }
    total = sum(parts.values())
    out = {
        "rss_bytes": int(last["rss_bytes"]),
        **parts,
        "sum_bytes": total,
        "allocator_resident_bytes": resident,
        "retained_known": True,
        **split,
        "mode": trace.meta.get("mode") or "full",
    }
    out["equations"] = split_equations(out)
    return out


def rss_decomposition(
    trace: Trace, arenas: pd.DataFrame | None = None, by_source: dict[str, int] | None = None
) -> dict | None:
    """RSS at the end split as: live heap (allocated since the attach, held by the program,
    resident) + live before the attach (blocks allocated before the attach and still allocated:
    glibc's census, tracer/allocators/census.py) + retained by the allocators (free and resident in their
    own mappings) + other anonymous (stacks, the program's own mmaps, what allocators without a
    census mapped before the attach: BEFORE_UNSEPARATED) + file-backed + shared memory.
    live_before_attach_bytes = Σ the allocators' live_before_attach (0 where none was measured;
    `unseparated`: the allocators without a census, whose memory from before the attach —
    allocated or retained — stays in other_anon_bytes). Every allocator of the process is
    measured (`allocators`: {name, source, resident, live, live_before_attach, census,
    retained, released, ...}; the sums are the top-level keys): live_heap_bytes = Σ min(live,
    resident) + live_outside_bytes (live blocks beyond an allocator's measured mappings: in
    mappings it made before the attach, counted as live heap out of the anonymous rest),
    retained_bytes = Σ retained, allocator_resident_bytes = Σ resident, other_anon_bytes =
    RssAnon − the parts above. Shared memory and file are split further by `shared_split`. GPU
    memory is never in RSS and never here. Traces without per-allocator residency (version 2)
    keep the glibc-only split. None when the trace has no end-of-run
    residency. `by_source`: live_by_source(trace), when at hand."""
    arenas = arena_table(trace) if arenas is None else arenas
    allocs = allocator_split(trace, arenas)
    if allocs is None:
        return _rss_decomposition_v2(trace, arenas, by_source)
    end = _end_rss(trace, by_source)
    if end is None:
        return None
    last, split = end
    residency = trace.meta.get("mode") == "residency"
    if residency:
        unprobed(allocs)
    resident = sum(a["resident"] for a in allocs)
    held = sum(min(a["live"], a["resident"]) for a in allocs)
    before = sum(a["live_before_attach"] or 0 for a in allocs)
    retained = sum(a["retained"] for a in allocs)
    unsure = sum(a.get("before_or_retained", 0) for a in allocs)
    either = sum(a.get("live_or_retained", 0) for a in allocs)
    anon = int(last["rss_anon_bytes"])
    # Live bytes beyond an allocator's measured mappings lie in mappings it made before the
    # attach (not in the kernel's LRU): live heap too, taken out of the anonymous rest.
    outside = min(sum(max(0, a["live"] - a["resident"]) for a in allocs), max(0, anon - resident))
    held += outside
    # Pages an allocator holds that the kernel counts elsewhere (a shared mapping in RssShmem:
    # pinned host memory, say) must not make the parts outgrow RSS: live, then retained, are
    # capped by the anonymous RSS, so the parts always sum to RSS.
    held = min(held, max(0, anon))
    before = min(before, max(0, anon - held))
    retained = min(retained, max(0, anon - held - before))
    unsure = min(unsure, max(0, anon - held - before - retained))
    either = min(either, max(0, anon - held - before - retained - unsure))
    parts = {
        "live_heap_bytes": held,
        "live_before_attach_bytes": before,
        "retained_bytes": retained,
        "before_or_retained_bytes": unsure,
        **({"live_or_retained_bytes": either} if residency else {}),
        "other_anon_bytes": max(0, anon - held - before - retained - unsure - either),
        "file_bytes": int(last["rss_file_bytes"]),
        "shmem_bytes": int(last["rss_shmem_bytes"]),
    }
    timeline = allocator_timeline(trace)
    for a in allocs:
        a["timeline"] = timeline.get(a["source"], [])
    launched = (trace.meta.get("target") or {}).get("launched") is not False
    allocator_terms(allocs, outside, not launched)
    if launched and not residency:
        for a in allocs:  # no block from before an attach: what a census finds in use unseen is its own
            a["before_label"] = LAUNCHED_UNSEEN
    sampled = sampled_split(trace, allocs, parts)
    out = {
        "rss_bytes": int(last["rss_bytes"]),
        **parts,
        "sum_bytes": sum(parts.values()),
        "allocator_resident_bytes": resident,
        "retained_known": True,
        "live_outside_bytes": outside,
        **split,
        **sampled,
        "live_before_attach_known": any(a["live_before_attach"] is not None for a in allocs),
        # launched: traced from its first call, nothing is from before an attach to separate
        "unseparated": [] if launched else [a["name"] for a in allocs if a["live_before_attach"] is None],
        "unseparated_note": BEFORE_UNSEPARATED,
        "allocators": allocs,
        "launched": launched,
        "mode": trace.meta.get("mode") or "full",
    }
    out["equations"] = split_equations(out)
    return out


UNPROBED = "live or retained: no allocator probes (residency mode)"
# A launched program's chunks in use that no traced call returned: the allocator's own (glibc's
# tcache, 656 bytes a thread), never "from before the attach" — there was none.
LAUNCHED_UNSEEN = "allocator internals (in use, never returned by a call)"


def unprobed(allocs: list[dict]) -> None:
    """Residency mode has no allocator probes: an allocator's blocks are never seen, so what its
    mappings hold resident is live or free, not separable — `live_or_retained`, never called
    retained — unless glibc's census measured its chunks in use (then `live_before_attach`: in
    use, every chunk of it, since no block was seen allocated)."""
    for a in allocs:
        if a.get("live_before_attach") is None:
            a["live_or_retained"] = int(a["retained"]) + int(a.get("before_or_retained") or 0)
            a["retained"] = 0
            a["before_or_retained"] = 0
        a["before_label"] = "in use (census)"
