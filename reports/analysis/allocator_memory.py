"""Each allocator's own memory: what it handed back to the kernel (purges, releases inside its
calls), its resident, live and retained bytes over the intervals and at the end (the
`allocators` table, glibc's arenas and census); residency.py sums these into the RSS split."""

from __future__ import annotations

import pandas as pd

from common import allocators as registry
from common.tracefile.reader import Trace


def _last_allocators(trace: Trace) -> pd.DataFrame:
    a = trace.allocators
    if a is None or a.empty:
        return a if a is not None else pd.DataFrame()
    return a[a["seq"] == a["seq"].max()]


def _first_resident(trace: Trace) -> dict[str, int]:
    """{source: resident bytes of its own mappings in the first `allocators` row, less the live
    bytes allocated since the attach then}: what each allocator held from before the attach (the
    first row may come after a burst the probes saw: that burst is no memory from before)."""
    a = trace.allocators
    if a is None or a.empty:
        return {}
    first = a[a["seq"] == a["seq"].min()]
    return {str(r.source): max(0, int(r.resident_bytes) - int(r.live_bytes)) for r in first.itertuples()}


def allocator_modules(trace: Trace) -> dict[str, dict]:
    """{source: meta.json probes.allocators[] entry} (kind, module, prefix, serves_malloc): each
    allocator the probes found, for its releases, its split and its advice (advice.py)."""
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
    allocator — and those of an allocator's own background threads (its family's
    `background_threads`: jemalloc's `jemalloc_bg_thd`)."""
    names = trace.thread_names()
    mods = allocator_modules(trace)
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
        # the first source of each family that has background threads of its own
        bg: dict[str, str] = {}
        for msrc, m in mods.items():
            fam = registry.family(m.get("kind"))
            if fam is not None and fam.background_threads:
                bg.setdefault(fam.name, msrc)
        for r in last.itertuples():
            if r.in_api == "malloc_trim":
                continue  # in `purges`
            src, api = None, "" if r.in_api in ("", "none") else str(r.in_api)
            owner = registry.background_family(names.get(int(r.tid), "")) if bg else None
            if owner is not None and owner.name in bg:
                src, call = bg[owner.name], f"{r.kind} in its background thread"
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
    resident at the attach — the first measure, less the live bytes allocated since then — is
    `before_or_retained` — blocks from before the attach or free
    memory, not separable without a census — and only the rest is retained).
    None for a trace without the `allocators` table (version 2)."""
    last = _last_allocators(trace)
    if last is None or last.empty:
        return None
    attached = (trace.meta.get("target") or {}).get("launched") is False
    at_attach = _first_resident(trace) if attached else {}
    mods = allocator_modules(trace)
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
