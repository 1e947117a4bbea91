"""The report (allocscope.report/1, reports.analysis.build_report) as text: what
`allocscope report` prints. The header, totals, the ranked sites and the tables of threads,
flows, releases, arenas and trims are here; a site's details, the sites held at the peak and the
GPU section are text_sites.py's, the waits and what freeing cost text_waits.py's."""

from __future__ import annotations

import os

from ..analysis.ending import end_text
from ..units import human_bytes, human_rate
from .shared import (
    COLUMN_TITLES,
    NOUNS,
    SORT_TITLES,
    Style,
    equation_text,
    findings_text,
    folded_text,
    frame_text,
    listed,
    location_text,
    table,
)
from .text_sites import at_peak_text, gpu_text, site_details
from .text_waits import freeing_text, waits_text


def seconds(n: float | None) -> str:
    return "-" if n is None else f"{n:.1f}s"


def allocators_text(doc: dict) -> str:
    """The header's allocators, by what they serve: 'allocators: jemalloc:_rjem_ (rjem) holds
    50.0 MiB live; glibc (libc.so.6, serves malloc) 1.2 MiB' — or the one probed (old traces)."""
    rec = doc["recording"]
    allocs = (doc.get("rss_decomposition") or {}).get("allocators")
    if not allocs:
        return f"allocator {rec.get('allocator_kind')} {rec.get('allocator')}"
    parts = []
    for a in allocs:
        where = os.path.basename(a.get("module") or "") + (", serves malloc" if a.get("serves_malloc") else "")
        parts.append(f"{a['name']} ({where}) {human_bytes(a['live'])} live")
    return "allocators: " + "; ".join(parts)


def to_text(doc: dict, top: int = 20, color: bool = False, frames_per_site: int = 6) -> str:
    s = Style(color)
    t = doc["target"]
    tot = doc["totals"]
    rec = doc["recording"]
    out = []
    labels = " ".join(f"{k}={v}" for k, v in (t.get("labels") or {}).items())
    out.append(
        s.bold(f"allocscope report — pid {t['pid']} {t.get('comm') or ''}") + (f"  [{labels}]" if labels else "")
    )
    out.append(f"exe {t.get('exe')}; " + allocators_text(doc))
    probes = rec.get("probes") or {}
    if probes.get("skipped"):
        out.append(s.dim("not probed: " + skipped_text(probes["skipped"])))
    gpu = doc.get("gpu") or {}
    if gpu.get("driver"):
        out.append(driver_text(gpu))
    ended = end_text(rec.get("end"), rec.get("end_reason"))
    n = tot["intervals"]
    out.append(f"{n} interval{'' if n == 1 else 's'}, {tot['duration_s']:.1f}s; ended: {ended}")
    if doc.get("folded"):
        out.append(s.dim("folded out of sites: " + folded_text(doc["folded"])))
    if doc.get("source_filter"):
        out.append(
            s.yellow("sites of sources " + ", ".join(doc["source_filter"]) + " only (totals: the whole process)")
        )
    for w in rec.get("warnings") or []:
        out.append(s.yellow(f"warning: {w}"))
    out.append("")
    out += findings_text(doc.get("findings"), s)
    out.append(s.bold("Totals"))
    out.append(
        f"  live now   {human_bytes(tot['live_bytes']):>10}  in {tot['live_count']} blocks"
        f"   (heap API {human_bytes(tot['heap_live_bytes'])}, mmap/brk {human_bytes(tot['mmap_live_bytes'])}"
        + (
            f", first touches {human_bytes(tot['touch_estimate_bytes'])} estimated"
            f" of {human_bytes(tot.get('touches_bytes') or 0)} touched in all"
            if "touch_estimate_bytes" in tot
            else ""
        )
        + (
            f", mapped not yet touched {human_bytes(tot['untouched_bytes'])} (not counted live)"
            if tot.get("untouched_bytes")
            else ""
        )
        + ")"
    )
    out.append(f"  live peak  {human_bytes(tot['peak_live_bytes']):>10}")
    out.append(
        f"  RSS now    {human_bytes(tot['rss_bytes']):>10}   peak sampled {human_bytes(tot['peak_rss_bytes'])}"
        f", kernel high-water {human_bytes(tot['hwm_bytes'])}"
    )
    if gpu.get("seen"):
        out.append(
            f"  GPU now    {human_bytes(tot.get('device_bytes', 0)):>10}  in {tot.get('device_count', 0)} "
            f"allocations, peak {human_bytes(tot.get('device_peak_bytes', 0))}"
            "   (device memory: in no host figure)"
        )
        out.append(
            f"  CUDA host  {human_bytes(tot.get('cuda_host_bytes', 0)):>10}"
            "   (pinned and managed through the driver API: part of live now)"
        )
    lost = tot["lost_events"]
    out.append(f"  lost       {lost:>10}" if not lost else s.red(f"  lost       {lost:>10}"))
    dec = doc.get("rss_decomposition")
    if dec:
        eqs = {e["name"]: e for e in dec.get("equations") or []}
        if "RSS" in eqs:
            out.append(
                "  " + equation_text(eqs["RSS"]) + (f" ({eqs['RSS']['note']})" if eqs["RSS"].get("note") else "")
            )
        for a in dec.get("allocators") or []:  # every allocator's own mappings, measured
            how = f"; census {a['census']}" if a.get("live_before_attach") is not None else ""
            err = {"live": f" ±{human_bytes(a['live_error'])}"} if a.get("live_error") else {}
            eq = eqs.get(a["name"])
            if eq is None:
                continue
            out.append(
                f"    {a['name']:<16} "
                + equation_text(eq, width=10, after=err)
                + f";  released {human_bytes(a['released'])}  ({a['source']}{how})"
            )
        if dec.get("sampled_note"):
            out.append(f"    {dec['sampled_note']}")
        if dec.get("inject_agent_bytes") is not None:
            out.append(f"    other anon holds {human_bytes(dec['inject_agent_bytes'])} of {dec['inject_agent_note']}")
        if dec.get("unseparated"):
            where = "in its own mappings and in other anon" if dec.get("before_or_retained_bytes") else "in other anon"
            out.append(
                f"    {', '.join(dec['unseparated'])}: memory from before the attach is {where}, "
                f"{dec['unseparated_note']}"
            )
        if dec.get("shmem_attributed_bytes") or dec.get("file_device_bytes"):
            out.append(
                f"    shmem {human_bytes(dec['shmem_bytes'])} = {human_bytes(dec['shmem_attributed_bytes'])}"
                f" at {sources_text(dec['shmem_sources'])} sites"
                f" + {human_bytes(dec['shmem_unattributed_bytes'])} not traced;"
                f" file {human_bytes(dec['file_bytes'])} = {human_bytes(dec['file_device_bytes'])} device-mapped"
                + (f" ({sources_text(dec['file_device_sources'])} sites)" if dec["file_device_sources"] else "")
                + f" + {human_bytes(dec['file_regular_bytes'])} regular files"
            )
    for a in doc.get("advice") or []:
        out.append(s.yellow(f"    ! {a}"))
    out.append("")
    peak = doc.get("at_peak") or {}
    if peak.get("peak_first"):
        out += at_peak_text(doc, s, top, frames_per_site)
    every, by = listed(doc)
    sites = every[:top]
    at_end = " at the end" if peak.get("peak_first") and doc.get("sort", "live") == "live" else ""
    out.append(
        s.bold(f"Top {len(sites)} of {len(every)} {NOUNS[by]} by {SORT_TITLES.get(doc.get('sort', 'live'))}{at_end}")
        + (
            s.dim(f"  ({len(doc['sites'])} distinct stacks; --by stack lists them)")
            if by != "stack" and len(doc["sites"]) != len(every)
            else ""
        )
    )
    rows = []
    device = bool(gpu.get("device_ranks"))  # a column of GPU bytes, apart from the host's
    for site in sites:
        fr = site["frames"]
        first = frame_text(fr[0]) if fr else "?"
        rows.append(
            [
                str(site["rank"]),
                human_bytes(site["live_bytes"]),
                str(site["live_count"]),
                human_bytes(site["peak_live_bytes"]),
                human_rate(site.get("growth_bytes_per_s")),
                seconds(site.get("oldest_age_s")),
                site.get("verdict") or "-",
                human_bytes(site["alloc_bytes"]),
                str(site["alloc_count"]),
            ]
            + ([human_bytes(site["device_live_bytes"]) if site.get("device_alloc_count") else "-"] if device else [])
            + ([str(site.get("n_stacks", 1))] if by != "stack" else [])
            + [location_text(site) if by != "stack" else first]
        )
    out += [
        "  " + line
        for line in table(
            ["#", "live", "blocks", "peak", "growth", "oldest", "verdict", "allocated", "allocs"]
            + (["device"] if device else [])
            + (["stacks"] if by != "stack" else [])
            + [COLUMN_TITLES[by]],
            rows,
            "rrrrrrlrr" + ("r" if device else "") + ("r" if by != "stack" else "") + "l",
        )
    ]
    out.append(s.dim("  verdicts: freed = nothing live at the end; transient = end <= 25% of peak;"))
    out.append(
        s.dim(
            "  growing = steady rise over the last half (R² >= 0.8, by >= 10% of its live bytes);"
            " plateaued = held, not rising; new = under 4 intervals, too early to tell"
        )
    )
    out.append("")
    if not peak.get("peak_first"):  # else the sites that held the peak got these details above
        for site in sites[: min(top, 10)]:
            if not site["live_bytes"] and not site["peak_live_bytes"]:
                continue
            thr = ", ".join(f"{x['name']}({x['tid']}) {human_bytes(x['live_bytes'])}" for x in site["threads"][:4])
            out.append(s.bold(f"#{site['rank']} {human_bytes(site['live_bytes'])} live") + f"  threads: {thr}")
            out += site_details(site, s, frames_per_site, doc)
        out.append("")
    out += waits_text(doc.get("waits") or {}, s, top)
    if gpu.get("seen"):
        out += gpu_text(doc, s, top) + [""]
    thr = doc["threads"][:top]
    out.append(s.bold("Threads by live bytes" + (" (host memory)" if gpu.get("seen") else "")))
    out += [
        "  " + line
        for line in table(
            ["tid", "name", "live", "blocks", "peak", "allocated"],
            [
                [
                    str(x["tid"]),
                    x["name"],
                    human_bytes(x["live_bytes"]),
                    str(x["live_count"]),
                    human_bytes(x["peak_live_bytes"]),
                    human_bytes(x["alloc_bytes"]),
                ]
                for x in thr
            ],
            "rlrrrr",
        )
    ]
    flows = [f for f in doc.get("flows") or [] if f["alloc_tid"] != f["free_tid"]][:top]
    if flows:
        out.append("")
        out.append(s.bold("Freed by another thread (allocating -> freeing)"))
        out += [
            "  " + line
            for line in table(
                ["allocated by", "freed by", "bytes", "blocks", "mean wait", "max wait"],
                [
                    [
                        f"{f['alloc_thread']}({f['alloc_tid']})",
                        f"{f['free_thread']}({f['free_tid']})",
                        human_bytes(f["bytes"]),
                        str(f["count"]),
                        f"{f['mean_wait_s']:.3f}s",
                        f"{f['max_wait_s']:.3f}s",
                    ]
                    for f in flows
                ],
                "llrrrr",
            )
        ]
    if doc.get("allocator_releases"):
        out.append("")
        out.append(s.bold("Released to the kernel, by allocator, thread and call"))
        out += [
            "  " + line
            for line in table(
                ["allocator", "thread", "call", "calls", "released"],
                [
                    [
                        r["name"],
                        f"{r['thread']}({r['tid']})",
                        r["call"],
                        str(r["calls"]),
                        human_bytes(r["released_bytes"]),
                    ]
                    for r in doc["allocator_releases"][:top]
                ],
                "lllrr",
            )
        ]
    if doc.get("arenas"):
        out.append("")
        out.append(s.bold("Allocator arenas by retained bytes"))
        out += [
            "  " + line
            for line in table(
                ["arena", "kind", "live", "before attach", "resident", "retained", "heaps", "threads"],
                [
                    [
                        a["id"],
                        a["kind"],
                        human_bytes(a["live_bytes"]),
                        "-"
                        if a.get("live_before_bytes") is None
                        else human_bytes(a["live_before_bytes"]) + ("~" if a.get("census_sampled") else ""),
                        human_bytes(a["resident_bytes"]),
                        human_bytes(a["retained_bytes"]),
                        str(a.get("heaps", "")),
                        ",".join(str(t) for t in a["threads"][:6]) + ("…" if len(a["threads"]) > 6 else ""),
                    ]
                    for a in doc["arenas"][:top]
                ],
                "llrrrrrl",
            )
        ]
    out += freeing_text((doc.get("waits") or {}).get("freeing") or {}, s, top)
    if doc.get("trims"):
        out.append("")
        out.append(s.bold("malloc_trim calls"))
        out += [
            "  " + line
            for line in table(
                ["time", "thread", "duration", "returned", "released"],
                [
                    [
                        f"{x['time']:.3f}s",
                        f"{x['thread']}({x['tid']})",
                        f"{x['duration_s'] * 1e3:.2f}ms",
                        str(x.get("returned")),
                        human_bytes(x["released_bytes"]),
                    ]
                    for x in doc["trims"]
                ],
                "rlrrr",
            )
        ]
    return "\n".join(out) + "\n"


def skipped_text(skipped: dict[str, str]) -> str:
    """Functions not probed, those with one reason together: 'malloc_trim, pvalloc (not defined by
    libjemalloc.so.2)', never eleven times '(residency mode: no allocator probes)'."""
    by_reason: dict[str, list[str]] = {}
    for name, why in skipped.items():
        by_reason.setdefault(why, []).append(name)
    return ", ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items())


def driver_text(gpu: dict) -> str:
    """'CUDA driver /usr/lib/.../libcuda.so.1: 14 calls probed[; not probed: ...]'."""
    skipped = gpu.get("skipped") or {}
    return f"CUDA driver {gpu['driver']}: {len(gpu.get('probed') or [])} calls probed" + (
        "; not probed: " + skipped_text(skipped) if skipped else ""
    )


def sources_text(by_source: dict) -> str:
    """'shmem 56.0 KiB, cuda-pinned 20.0 MiB' ('no' when empty)."""
    return ", ".join(f"{k} {human_bytes(v)}" for k, v in by_source.items()) or "no"
