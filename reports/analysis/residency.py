"""What is resident and why: allocator arenas, the RSS split, each allocator's retained memory and
the advice for it (malloc_trim calls and the releases by thread: reports/analysis/releases.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from common.pages import PAGE
from common.tracefile.reader import Trace

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
        return {
            "rss_bytes": int(last["rss_bytes"]),
            **parts,
            "sum_bytes": sum(parts.values()),
            "allocator_resident_bytes": None,
            "retained_known": False,
            **split,
        }
    known = arenas[arenas["resident_bytes"].notna()]
    resident = int(known["resident_bytes"].sum())
    held = int(
        np.minimum(known["live_bytes"].to_numpy(dtype=np.int64), known["resident_bytes"].to_numpy(dtype=np.int64)).sum()
    )
    retained = int(known["retained_bytes"].sum())
    other_anon = max(0, int(last["rss_anon_bytes"]) - resident)
    parts = {
        "live_heap_bytes": held,
        "retained_bytes": retained,
        "other_anon_bytes": other_anon,
        "file_bytes": int(last["rss_file_bytes"]),
        "shmem_bytes": int(last["rss_shmem_bytes"]),
    }
    total = sum(parts.values())
    return {
        "rss_bytes": int(last["rss_bytes"]),
        **parts,
        "sum_bytes": total,
        "allocator_resident_bytes": resident,
        "retained_known": True,
        **split,
    }


def _last_allocators(trace: Trace) -> pd.DataFrame:
    a = trace.allocators
    if a is None or a.empty:
        return a if a is not None else pd.DataFrame()
    return a[a["seq"] == a["seq"].max()]


def _first_resident(trace: Trace) -> dict[str, int]:
    """{source: resident bytes of its own mappings in the first `allocators` row}: what each
    allocator held when the probes attached."""
    a = trace.allocators
    if a is None or a.empty:
        return {}
    first = a[a["seq"] == a["seq"].min()]
    return {str(r.source): int(r.resident_bytes) for r in first.itertuples()}


def _allocator_modules(trace: Trace) -> dict[str, dict]:
    """{source: meta.json probes.allocators[] entry} (kind, module, prefix, serves_malloc)."""
    out = {}
    for a in (trace.meta.get("probes") or {}).get("allocators") or []:
        if isinstance(a, dict) and isinstance(a.get("source"), str):
            out[a["source"]] = a
    return out


def allocator_releases(trace: Trace) -> tuple[dict[str, int], list[dict]]:
    """Bytes each allocator handed back to the kernel, {source: bytes}, and the rows behind them
    ({source, name, tid, thread, call, calls, released_bytes}, largest first): its purge calls
    (`purges`: malloc_trim, mallctl("arena.<i>.purge"), MallocExtension_Release*, mi_collect;
    the anon RSS drop across each call) plus the munmap/madvise/brk releases made inside its
    allocation calls (jemalloc's and mimalloc's decay inside malloc/free, tcmalloc's release
    rate) when one allocator alone allocated — the kernel sums releases by allocator call, not by
    allocator — and those of jemalloc's background threads (`jemalloc_bg_thd`)."""
    names = trace.thread_names()
    mods = _allocator_modules(trace)
    label = {src: (m.get("kind", "?") + (":" + m["prefix"] if m.get("prefix") else "")) for src, m in mods.items()}
    rows: dict[tuple, list[int]] = {}
    pu = trace.purges
    if pu is not None and not pu.empty:
        for r in pu.itertuples():
            call = r.function + (f"({r.name})" if r.function == "mallctl" and r.name else "")
            v = rows.setdefault((r.source, int(r.tid), call), [0, 0])
            v[0] += 1
            v[1] += int(r.released_bytes)
    rel = trace.releases
    if rel is not None and not rel.empty:
        last = rel.sort_values("seq").drop_duplicates(["tid", "kind", "in_api"], keep="last")
        sites = trace.final_sites()
        active = (
            sorted(
                {
                    str(x)
                    for x in sites.loc[sites["alloc_count"] > 0, "source"]
                    if str(x) == "heap" or str(x).startswith("heap:")
                }
            )
            if not sites.empty
            else []
        )
        jem = [src for src, m in mods.items() if m.get("kind") == "jemalloc"]
        for r in last.itertuples():
            if r.in_api == "malloc_trim":
                continue  # in `purges`
            src, api = None, "" if r.in_api in ("", "none") else str(r.in_api)
            if jem and names.get(int(r.tid), "").startswith("jemalloc_bg"):
                src, call = jem[0], f"{r.kind} in its background thread"
            elif len(active) == 1 and (api or r.kind == "madvise"):
                # free() has no call state: its purges are outside any call, like the program's
                # own madvise (rare); munmap outside a call is the program's own regions
                src, call = active[0], f"{r.kind} in {api}" if api else f"{r.kind} in free (or outside any call)"
            if src is None:
                continue
            v = rows.setdefault((src, int(r.tid), call), [0, 0])
            v[0] += int(r.calls)
            v[1] += int(r.released_bytes)
    out = [
        {
            "source": k[0],
            "name": label.get(k[0], k[0]),
            "tid": k[1],
            "thread": names.get(k[1], "?"),
            "call": k[2],
            "calls": v[0],
            "released_bytes": max(0, v[1]),
        }
        for k, v in rows.items()
    ]
    out.sort(key=lambda x: -x["released_bytes"])
    by: dict[str, int] = {}
    for x in out:
        by[x["source"]] = by.get(x["source"], 0) + x["released_bytes"]
    return by, out


def allocator_timeline(trace: Trace) -> dict[str, list[dict]]:
    """{source: [{seq, elapsed_s, resident, live, retained}]} from the per-interval `allocators`
    table: retention rising after a burst of frees, falling when the allocator purges."""
    a = trace.allocators
    if a is None or a.empty:
        return {}
    el = dict(zip(trace.intervals["seq"].astype(int), trace.intervals["elapsed_s"].astype(float)))
    out: dict[str, list[dict]] = {}
    for r in a.sort_values("seq").itertuples():
        res, live = int(r.resident_bytes), int(r.live_bytes)
        out.setdefault(str(r.source), []).append(
            {
                "seq": int(r.seq),
                "elapsed_s": round(el.get(int(r.seq), 0.0), 3),
                "resident": res,
                "live": live,
                "retained": max(0, res - live),
            }
        )
    return out


def allocator_split(trace: Trace, arenas: pd.DataFrame) -> list[dict] | None:
    """Per allocator at the end: {name, source, kind, module, serves_malloc, resident, live,
    live_before_attach, census, retained, released, measured}. resident: its own mappings'
    resident bytes (the last `allocators` row; glibc serving malloc: the arena table's heaps and
    chunks, measured with the final live table); live: its sites' live bytes (allocated since
    the attach); live_before_attach: blocks from before the attach still allocated (glibc's
    census, tracer/allocators/census.py; None where no census was possible); census: 'measured',
    'sampled' (the census estimated part of the heaps past its time budget) or the reason there
    is none; retained: free and resident — resident − live − live_before_attach, at least 0
    (without a census: resident − live in a launched recording, where nothing predates the
    attach; in an attached one, the part of resident − live up to what its mappings held
    resident at the attach is `before_or_retained` — blocks from before the attach or free
    memory, not separable without a census — and only the rest is retained).
    None for a trace without the `allocators` table (version 2)."""
    last = _last_allocators(trace)
    if last is None or last.empty:
        return None
    attached = (trace.meta.get("target") or {}).get("launched") is False
    at_attach = _first_resident(trace) if attached else {}
    mods = _allocator_modules(trace)
    released, _rows = allocator_releases(trace)
    out = []
    for r in last.itertuples():
        src = str(r.source)
        m = mods.get(src, {})
        res, live = int(r.resident_bytes), int(r.live_bytes)
        before, census = None, "no census of this allocator"
        glibc = m.get("kind", str(r.kind).split(":")[0]) == "glibc"
        if glibc and src == "heap" and not arenas.empty and arenas["resident_bytes"].notna().any():
            known = arenas[arenas["resident_bytes"].notna()]
            res = int(known["resident_bytes"].sum())
            live = int(known["live_bytes"].sum()) + int(arenas.loc[arenas["resident_bytes"].isna(), "live_bytes"].sum())
            ret = int(known["retained_bytes"].sum())
            lb = arenas.get("live_before_bytes")
            if lb is not None and lb.notna().any():
                before = int(lb.fillna(0).sum())
                census = "sampled" if bool(arenas["census_sampled"].any()) else "measured"
            else:
                census = _no_census(trace)
        else:
            ret = max(0, res - live)
            if glibc:
                census = _no_census(trace) if src == "heap" else "no census: glibc not serving malloc here"
        unsure = 0
        if before is None and attached:
            # Attached without a census: what its mappings held resident at the attach may be
            # blocks from before it, still allocated, or free memory: "before the attach or
            # retained", never called retained. What it holds beyond that, not live since the
            # attach, is retained (a block from before the attach cannot grow).
            unsure = min(ret, at_attach.get(src, 0))
            ret -= unsure
        out.append(
            {
                "name": str(r.kind),
                "source": src,
                "resident": res,
                "live": live,
                "retained": ret,
                "before_or_retained": unsure,
                "live_before_attach": before,
                "census": census,
                "released": int(released.get(src, 0)),
                "kind": m.get("kind", str(r.kind).split(":")[0]),
                "module": m.get("module"),
                "serves_malloc": bool(m.get("serves_malloc", src == "heap")),
                "mapped": int(r.mapped_bytes),
                "measured": True,
            }
        )
    out.sort(key=lambda x: (-x["live"], -x["resident"]))
    return out


def _no_census(trace: Trace) -> str:
    """Why a glibc trace has no census (meta.json `census`)."""
    info = (trace.meta.get("census") or {}).get("end") or {}
    if info.get("error") or (info and not info.get("main_arena")):
        return f"no census: {info.get('error') or info.get('found_by')}"
    return "no census (the target was gone at the end, or the census was off)"


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
    resident = sum(a["resident"] for a in allocs)
    held = sum(min(a["live"], a["resident"]) for a in allocs)
    before = sum(a["live_before_attach"] or 0 for a in allocs)
    retained = sum(a["retained"] for a in allocs)
    unsure = sum(a.get("before_or_retained", 0) for a in allocs)
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
    parts = {
        "live_heap_bytes": held,
        "live_before_attach_bytes": before,
        "retained_bytes": retained,
        "before_or_retained_bytes": unsure,
        "other_anon_bytes": max(0, anon - held - before - retained - unsure),
        "file_bytes": int(last["rss_file_bytes"]),
        "shmem_bytes": int(last["rss_shmem_bytes"]),
    }
    timeline = allocator_timeline(trace)
    for a in allocs:
        a["timeline"] = timeline.get(a["source"], [])
    sampled = sampled_split(trace, allocs, parts)
    return {
        "rss_bytes": int(last["rss_bytes"]),
        **parts,
        "sum_bytes": sum(parts.values()),
        "allocator_resident_bytes": resident,
        "retained_known": True,
        "live_outside_bytes": outside,
        **split,
        **sampled,
        "live_before_attach_known": any(a["live_before_attach"] is not None for a in allocs),
        "unseparated": [a["name"] for a in allocs if a["live_before_attach"] is None],
        "unseparated_note": BEFORE_UNSEPARATED,
        "allocators": allocs,
    }


def conf_env(prefix: str) -> str:
    """jemalloc reads PREFIX_MALLOC_CONF, its symbol prefix upper-cased (_rjem_ -> _RJEM_MALLOC_CONF)."""
    return (prefix.upper() if prefix else "") + "MALLOC_CONF"


def allocator_advice(dec: dict | None, trace: Trace | None = None) -> list[str]:
    """Advice naming each allocator's own knob, with the measured figure (retained > 20% of RSS)."""
    if not dec or not dec.get("allocators") or not dec["rss_bytes"]:
        return []
    rss = dec["rss_bytes"]
    mods = _allocator_modules(trace) if trace is not None else {}
    out = []
    for a in dec["allocators"]:
        ret = a["retained"]
        if ret <= 0.2 * rss or a["kind"] == "glibc":
            continue  # glibc: residency_advice, by arena
        what = f"{a['name']} retains {ret >> 20} MiB ({100 * ret // rss}% of RSS) of freed pages"
        rel = f"; it released {a['released'] >> 20} MiB so far" if a["released"] else ""
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


def residency_advice(arenas: pd.DataFrame, dec: dict | None) -> list[str]:
    """Plain advice from the arena table and the RSS decomposition."""
    if dec is None or not dec["rss_bytes"]:
        return []
    rss = dec["rss_bytes"]
    out = []
    thread = arenas[arenas["kind"] == "thread"]
    t_ret = int(thread["retained_bytes"].sum())
    m_ret = int(arenas.loc[arenas["kind"] == "main", "retained_bytes"].sum())
    if t_ret > 0.2 * rss and thread["id"].nunique() > 1:
        out.append(
            f"{thread['id'].nunique()} glibc thread arenas retain {t_ret >> 20} MiB "
            f"({100 * t_ret // rss}% of RSS) that the program freed: cap them with MALLOC_ARENA_MAX=2..4, "
            "or call malloc_trim(0) after bursts"
        )
    if m_ret > 0.2 * rss:
        out.append(
            f"the main heap retains {m_ret >> 20} MiB ({100 * m_ret // rss}% of RSS) of freed memory: "
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
            f"{dec['shmem_bytes'] >> 20} MiB is shared memory (e.g. pinned CUDA host memory shows as RssShmem)"
            + (
                f": {dec['shmem_attributed_bytes'] >> 20} MiB of it at the shmem and cuda-pinned sites, "
                f"{dec['shmem_unattributed_bytes'] >> 20} MiB mapped before the attach or not traced"
                if "shmem_attributed_bytes" in dec
                else ""
            )
        )
    return out
