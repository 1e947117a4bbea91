"""The report (allocscope.report/1, reports.analysis.build_report) as text: what
`allocscope report` prints."""
from __future__ import annotations

import os

from ..units import human_bytes, human_rate
from .shared import (
    COLUMN_TITLES,
    NOUNS,
    SORT_TITLES,
    Style,
    collapsed_frames,
    findings_text,
    folded_text,
    frame_text,
    listed,
    location_text,
    sparkline,
    table,
)


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
    out.append(s.bold(f"allocscope report — pid {t['pid']} {t.get('comm') or ''}")
               + (f"  [{labels}]" if labels else ""))
    out.append(f"exe {t.get('exe')}; " + allocators_text(doc))
    probes = rec.get("probes") or {}
    if probes.get("skipped"):
        out.append(s.dim("not probed: " + ", ".join(f"{k} ({v})" for k, v in probes["skipped"].items())))
    gpu = doc.get("gpu") or {}
    if gpu.get("driver"):
        out.append(driver_text(gpu))
    out.append(f"{tot['intervals']} intervals, {tot['duration_s']:.1f}s; "
               f"ended: {rec.get('end_reason') or 'interrupted'}")
    if doc.get("folded"):
        out.append(s.dim("folded out of sites: " + folded_text(doc["folded"])))
    if doc.get("source_filter"):
        out.append(s.yellow("sites of sources " + ", ".join(doc["source_filter"])
                            + " only (totals: the whole process)"))
    for w in rec.get("warnings") or []:
        out.append(s.yellow(f"warning: {w}"))
    out.append("")
    out += findings_text(doc.get("findings"), s)
    out.append(s.bold("Totals"))
    out.append(f"  live now   {human_bytes(tot['live_bytes']):>10}  in {tot['live_count']} blocks"
               f"   (heap API {human_bytes(tot['heap_live_bytes'])}, mmap/brk {human_bytes(tot['mmap_live_bytes'])})")
    out.append(f"  live peak  {human_bytes(tot['peak_live_bytes']):>10}")
    out.append(f"  RSS now    {human_bytes(tot['rss_bytes']):>10}   peak sampled {human_bytes(tot['peak_rss_bytes'])}"
               f", kernel high-water {human_bytes(tot['hwm_bytes'])}")
    if gpu.get("seen"):
        out.append(f"  GPU now    {human_bytes(tot.get('device_bytes', 0)):>10}  in {tot.get('device_count', 0)} "
                   f"allocations, peak {human_bytes(tot.get('device_peak_bytes', 0))}"
                   "   (device memory: in no host figure)")
        out.append(f"  CUDA host  {human_bytes(tot.get('cuda_host_bytes', 0)):>10}"
                   "   (pinned and managed through the driver API: part of live now)")
    lost = tot["lost_events"]
    out.append(f"  lost       {lost:>10}" if not lost else s.red(f"  lost       {lost:>10}"))
    dec = doc.get("rss_decomposition")
    if dec:
        retained = (f" + retained by allocator {human_bytes(dec['retained_bytes'])}" if dec.get("retained_known", True)
                    else " (allocator retention not separable for this allocator: inside other anon)")
        before = f" + live before the attach {human_bytes(dec['live_before_attach_bytes'])}" \
            if dec.get("live_before_attach_known") else ""
        unsure = f" + before the attach or retained {human_bytes(dec['before_or_retained_bytes'])}" \
            if dec.get("before_or_retained_bytes") else ""
        out.append(f"  RSS {human_bytes(dec['rss_bytes'])} = live heap since the attach "
                   f"{human_bytes(dec['live_heap_bytes'])}{before}{retained}{unsure}"
                   f" + other anon {human_bytes(dec['other_anon_bytes'])} + file {human_bytes(dec['file_bytes'])}"
                   f" + shmem {human_bytes(dec['shmem_bytes'])}")
        for a in dec.get("allocators") or []:  # every allocator's own mappings, measured
            pre = f" + live before the attach {human_bytes(a['live_before_attach'])}" \
                if a.get("live_before_attach") is not None else ""
            how = f"; census {a['census']}" if a.get("live_before_attach") is not None else ""
            rest = f" + before the attach or retained {human_bytes(a['before_or_retained'])}" \
                if a.get("before_or_retained") else f" + retained (free) {human_bytes(a['retained'])}"
            err = f" ±{human_bytes(a['live_error'])}" if a.get("live_error") else ""
            out.append(f"    {a['name']:<16} resident {human_bytes(a['resident']):>10} = live "
                       f"{human_bytes(a['live'])}{err}"
                       f"{pre}{rest};  released {human_bytes(a['released'])}"
                       f"  ({a['source']}{how})")
        if dec.get("sampled_note"):
            out.append(f"    {dec['sampled_note']}")
        if dec.get("inject_agent_bytes") is not None:
            out.append(f"    other anon holds {human_bytes(dec['inject_agent_bytes'])} of {dec['inject_agent_note']}")
        if dec.get("unseparated"):
            where = "in its own mappings and in other anon" if dec.get("before_or_retained_bytes") else "in other anon"
            out.append(f"    {', '.join(dec['unseparated'])}: memory from before the attach is {where}, "
                       f"{dec['unseparated_note']}")
        if dec.get("shmem_attributed_bytes") or dec.get("file_device_bytes"):
            out.append(f"    shmem {human_bytes(dec['shmem_bytes'])} = {human_bytes(dec['shmem_attributed_bytes'])}"
                       f" at {sources_text(dec['shmem_sources'])} sites"
                       f" + {human_bytes(dec['shmem_unattributed_bytes'])} not traced;"
                       f" file {human_bytes(dec['file_bytes'])} = {human_bytes(dec['file_device_bytes'])} device-mapped"
                       + (f" ({sources_text(dec['file_device_sources'])} sites)" if dec["file_device_sources"] else "")
                       + f" + {human_bytes(dec['file_regular_bytes'])} regular files")
    for a in doc.get("advice") or []:
        out.append(s.yellow(f"    ! {a}"))
    out.append("")
    peak = doc.get("at_peak") or {}
    if peak.get("peak_first"):
        out += _at_peak_text(doc, s, top, frames_per_site)
    every, by = listed(doc)
    sites = every[:top]
    at_end = " at the end" if peak.get("peak_first") and doc.get("sort", "live") == "live" else ""
    out.append(s.bold(f"Top {len(sites)} of {len(every)} {NOUNS[by]} by "
                      f"{SORT_TITLES.get(doc.get('sort', 'live'))}{at_end}")
               + (s.dim(f"  ({len(doc['sites'])} distinct stacks; --by stack lists them)")
                  if by != "stack" and len(doc["sites"]) != len(every) else ""))
    rows = []
    device = bool(gpu.get("device_ranks"))  # a column of GPU bytes, apart from the host's
    for site in sites:
        fr = site["frames"]
        first = frame_text(fr[0]) if fr else "?"
        rows.append([str(site["rank"]), human_bytes(site["live_bytes"]), str(site["live_count"]),
                     human_bytes(site["peak_live_bytes"]), human_rate(site.get("growth_bytes_per_s")),
                     seconds(site.get("oldest_age_s")), site.get("verdict") or "-", human_bytes(site["alloc_bytes"]),
                     str(site["alloc_count"])]
                    + ([human_bytes(site["device_live_bytes"]) if site.get("device_alloc_count") else "-"]
                       if device else []) + ([str(site.get("n_stacks", 1))] if by != "stack" else [])
                    + [location_text(site) if by != "stack" else first])
    out += ["  " + line for line in table(["#", "live", "blocks", "peak", "growth", "oldest", "verdict",
                                           "allocated", "allocs"] + (["device"] if device else [])
                                          + (["stacks"] if by != "stack" else []) + [COLUMN_TITLES[by]], rows,
                                          "rrrrrrlrr" + ("r" if device else "") + ("r" if by != "stack" else "")
                                          + "l")]
    out.append(s.dim("  verdicts: freed = nothing live at the end; transient = end <= 25% of peak;"))
    out.append(s.dim("  growing = steady rise over the last half (R² >= 0.8, by >= 10% of its live bytes);"
                     " plateaued = held, not rising; new = under 4 intervals, too early to tell"))
    out.append("")
    if not peak.get("peak_first"):  # else the sites that held the peak got these details above
        for site in sites[: min(top, 10)]:
            if not site["live_bytes"] and not site["peak_live_bytes"]:
                continue
            thr = ", ".join(f"{x['name']}({x['tid']}) {human_bytes(x['live_bytes'])}" for x in site["threads"][:4])
            out.append(s.bold(f"#{site['rank']} {human_bytes(site['live_bytes'])} live") + f"  threads: {thr}")
            out += _site_details(site, s, frames_per_site, doc)
        out.append("")
    out += waits_text(doc.get("waits") or {}, s, top)
    if gpu.get("seen"):
        out += gpu_text(doc, s, top) + [""]
    thr = doc["threads"][:top]
    out.append(s.bold("Threads by live bytes" + (" (host memory)" if gpu.get("seen") else "")))
    out += ["  " + line for line in table(
        ["tid", "name", "live", "blocks", "peak", "allocated"],
        [[str(x["tid"]), x["name"], human_bytes(x["live_bytes"]), str(x["live_count"]),
          human_bytes(x["peak_live_bytes"]), human_bytes(x["alloc_bytes"])] for x in thr], "rlrrrr")]
    flows = [f for f in doc.get("flows") or [] if f["alloc_tid"] != f["free_tid"]][:top]
    if flows:
        out.append("")
        out.append(s.bold("Freed by another thread (allocating -> freeing)"))
        out += ["  " + line for line in table(
            ["allocated by", "freed by", "bytes", "blocks", "mean wait", "max wait"],
            [[f"{f['alloc_thread']}({f['alloc_tid']})", f"{f['free_thread']}({f['free_tid']})",
              human_bytes(f["bytes"]), str(f["count"]), f"{f['mean_wait_s']:.3f}s", f"{f['max_wait_s']:.3f}s"]
             for f in flows], "llrrrr")]
    if doc.get("allocator_releases"):
        out.append("")
        out.append(s.bold("Released to the kernel, by allocator, thread and call"))
        out += ["  " + line for line in table(
            ["allocator", "thread", "call", "calls", "released"],
            [[r["name"], f"{r['thread']}({r['tid']})", r["call"], str(r["calls"]), human_bytes(r["released_bytes"])]
             for r in doc["allocator_releases"][:top]], "lllrr")]
    if doc.get("arenas"):
        out.append("")
        out.append(s.bold("Allocator arenas by retained bytes"))
        out += ["  " + line for line in table(
            ["arena", "kind", "live", "before attach", "resident", "retained", "heaps", "threads"],
            [[a["id"], a["kind"], human_bytes(a["live_bytes"]),
              "-" if a.get("live_before_bytes") is None else
              human_bytes(a["live_before_bytes"]) + ("~" if a.get("census_sampled") else ""),
              human_bytes(a["resident_bytes"]), human_bytes(a["retained_bytes"]), str(a.get("heaps", "")),
              ",".join(str(t) for t in a["threads"][:6]) + ("…" if len(a["threads"]) > 6 else "")]
             for a in doc["arenas"][:top]], "llrrrrrl")]
    out += freeing_text((doc.get("waits") or {}).get("freeing") or {}, s, top)
    if doc.get("trims"):
        out.append("")
        out.append(s.bold("malloc_trim calls"))
        out += ["  " + line for line in table(
            ["time", "thread", "duration", "returned", "released"],
            [[f"{x['time']:.3f}s", f"{x['thread']}({x['tid']})", f"{x['duration_s'] * 1e3:.2f}ms",
              str(x.get("returned")),
              human_bytes(x["released_bytes"])] for x in doc["trims"]], "rlrrr")]
    return "\n".join(out) + "\n"


def _where(d: dict) -> str:
    """A location of the `waits` object as text: function (file:line)."""
    return frame_text(d)


def waits_text(w: dict, s: Style, top: int) -> list[str]:
    """The "Held while waiting" section and the off-CPU table (reports/analysis/waits.py)."""
    if not w.get("traced"):
        return []
    out = []
    pk = w.get("peak")
    thr = f"waits >= {w['wait_min_ms']:g} ms"
    if not pk:
        out.append(s.bold("Held while waiting") + s.dim(f"  (no thread was blocked at a snapshot; {thr})"))
    else:
        when = f"+{pk['elapsed_s']:.1f}s, " if pk.get("elapsed_s") is not None else ""
        out.append(s.bold("Held while waiting") + f"  ({when}interval {pk['seq']}: {pk['blocked']} threads blocked, "
                   f"{pk['holding']} of them holding {human_bytes(pk['held_bytes'])}; {thr})")
        rows = []
        for d in pk["by_location"][:top]:
            held = ", ".join(f"{h['function']} {human_bytes(h['bytes'])} in {h['blocks']}" for h in d["held"][:3])
            rows.append([_where(d) + (" [in free]" if d.get("in_free") else ""), str(d["threads"]),
                         human_bytes(d["held_bytes"]), f"{d['longest_s']:.2f}s", held or "-"])
        out += ["  " + line for line in table(["waiting in", "threads", "held", "longest",
                                               "what they hold (allocated at)"], rows, "lrrrl")]
        lead = pk["by_location"][0] if pk["by_location"] else None
        if lead and lead["held_bytes"]:
            names = ", ".join(f"{t['name']}({t['tid']}) {human_bytes(t['held_bytes'])}"
                              for t in lead["thread_list"][:6])
            more = f" +{len(lead['thread_list']) - 6} more" if len(lead["thread_list"]) > 6 else ""
            out.append(f"  {lead['function']}: {names}{more}")
            out.append(s.dim("    " + " < ".join(f["function"] for f in lead["frames"][:6])))
    if w.get("off_cpu"):
        out.append(s.bold(f"Off-CPU time by where threads blocked ({thr}, whole recording)")
                   + s.dim(f"  shorter: {w['short_waits']} waits, {w['short_wait_s']:.2f}s"))
        out += ["  " + line for line in table(
            ["waiting in", "waits", "total", "longest", "threads"],
            [[_where(d) + (" [in free]" if d.get("in_free") else ""), str(d["waits"]), f"{d['total_s']:.2f}s",
              f"{d['max_s']:.2f}s", f"{d['n_threads']}: " + ", ".join(d["threads"][:4])]
             for d in w["off_cpu"][:top]], "lrrrl")]
    return out + [""]


def freeing_text(f: dict, s: Style, top: int) -> list[str]:
    """What giving memory back cost: syscall time by thread and call, munmap time by the location
    that mapped the memory, purge calls."""
    rows = [r for r in f.get("by_thread") or [] if r["calls"]]
    if not rows and not f.get("purges") and not f.get("tlb"):
        return []
    out = ["", s.bold("What giving memory back cost (time in the calls)")]
    out += ["  " + line for line in table(
        ["thread", "call", "calls", "asked", "released", "time"],
        [[f"{r['thread']}({r['tid']})", r["kind"], str(r["calls"]), human_bytes(r["requested_bytes"]),
          human_bytes(r["released_bytes"]), f"{r['duration_s'] * 1e3:.2f}ms"] for r in rows[:top]]
        + [[f"{p['thread']}({p['tid']})", p["function"], str(p["calls"]), "-", human_bytes(p["released_bytes"]),
            f"{p['duration_s'] * 1e3:.2f}ms"] for p in (f.get("purges") or [])[:top]], "llrrrr")]
    tlb = {k: v for k, v in (f.get("tlb") or {}).items() if k != "task_switch"}
    if tlb:
        out.append("  TLB flushes on its threads: " + ", ".join(
            f"{k.replace('_', ' ')} {v['flushes']} ({v['pages']} pages" + (f", {v['full']} full)" if v["full"] else ")")
            for k, v in tlb.items()))
    if f.get("by_location"):
        out.append("  munmap of memory mapped at: " + "; ".join(
            f"{_where(d)} {d['calls']} calls {human_bytes(d['requested_bytes'])} {d['duration_s'] * 1e3:.2f}ms"
            for d in f["by_location"][:4]))
    return out


def driver_text(gpu: dict) -> str:
    """'CUDA driver /usr/lib/.../libcuda.so.1: 14 calls probed[; not probed: ...]'."""
    skipped = gpu.get("skipped") or {}
    return (f"CUDA driver {gpu['driver']}: {len(gpu.get('probed') or [])} calls probed"
            + ("; not probed: " + ", ".join(f"{k} ({v})" for k, v in skipped.items()) if skipped else ""))


def sources_text(by_source: dict) -> str:
    """'shmem 56.0 KiB, cuda-pinned 20.0 MiB' ('no' when empty)."""
    return ", ".join(f"{k} {human_bytes(v)}" for k, v in by_source.items()) or "no"


def _threads_text(threads: list[dict], key: str, n: int = 3) -> str:
    """The first `n` threads of a report site with a non-zero `key`: 'name(tid) bytes, ...'."""
    held = [x for x in threads if x.get(key)]
    text = ", ".join(f"{x['name']}({x['tid']}) {human_bytes(x[key])}" for x in held[:n])
    return (text + (" …" if len(held) > n else "")) or "-"


def gpu_text(doc: dict, s: Style, top: int) -> list[str]:
    """The GPU section: GPU memory by site, CUDA host memory (pinned, managed) by site, and the
    threads that allocated GPU memory; shown when the report's `gpu.seen`."""
    gpu, tot = doc["gpu"], doc["totals"]
    every, by = listed(doc)
    by_rank = {x["rank"]: x for x in every}
    loc = by != "stack" and "device_location_ranks" in gpu
    dev_ranks = gpu.get("device_location_ranks" if loc else "device_ranks") or []
    host_ranks = gpu.get("host_location_ranks" if loc else "host_ranks") or []
    noun, title = (NOUNS[by][:-1], COLUMN_TITLES[by]) if loc else ("site", "site (innermost)")
    name = (lambda x: location_text(x)) if loc else (lambda x: frame_text(x["frames"][0]) if x["frames"] else "?")
    out = [s.bold("GPU memory") + f"  device {human_bytes(tot.get('device_bytes', 0))} live at the end, peak "
           f"{human_bytes(tot.get('device_peak_bytes', 0))}; CUDA host {human_bytes(tot.get('cuda_host_bytes', 0))}"
           + (f"  [{gpu['driver']}]" if gpu.get("driver") else "  [no CUDA driver probed: mappings only]")]
    dev = [by_rank[r] for r in dev_ranks][:top]
    if dev:
        out.append(f"  Device (GPU) memory by {noun}: {len(dev)} of {len(dev_ranks)}")
        out += ["  " + line for line in table(
            ["#", "device live", "blocks", "device peak", "allocated", "allocs", "threads", title],
            [[str(x["rank"]), human_bytes(x["device_live_bytes"]), str(x["device_live_count"]),
              human_bytes(x["device_peak_bytes"]), human_bytes(x["device_alloc_bytes"]), str(x["device_alloc_count"]),
              _threads_text(x["threads"], "device_live_bytes"), name(x)]
             for x in dev], "rrrrrrll")]
    host = [by_rank[r] for r in host_ranks][:top]
    if host:
        out.append(f"  Pinned and managed host memory by {noun}: {len(host)} of {len(host_ranks)}")
        out += ["  " + line for line in table(
            ["#", "pinned", "managed", f"{noun} live", "threads", title],
            [[str(x["rank"]), human_bytes(x["live_by_source"].get("cuda-pinned", 0)),
              human_bytes(x["live_by_source"].get("cuda-managed", 0)), human_bytes(x["live_bytes"]),
              _threads_text(x["threads"], "live_bytes"), name(x)]
             for x in host], "rrrrll")]
    thr = [x for x in doc["threads"] if x.get("device_alloc_count")][:top]
    if thr:
        out.append("  Threads by device memory")
        out += ["  " + line for line in table(
            ["tid", "name", "device live", "blocks", "device peak", "allocated"],
            [[str(x["tid"]), x["name"], human_bytes(x["device_live_bytes"]), str(x["device_live_count"]),
              human_bytes(x["device_peak_bytes"]), human_bytes(x["device_alloc_bytes"])]
             for x in sorted(thr, key=lambda x: (-x["device_live_bytes"], -x["device_peak_bytes"], x["tid"]))],
            "rlrrrr")]
    out.append(s.dim("  device memory is the GPU's own: in no live, peak, RSS or thread figure of the host;"
                     " pinned and managed memory are host memory, counted there too"))
    return out


STACKS_SHOWN = 3  # a location's largest stacks shown under it in the text report


def _site_details(site: dict, s: Style, frames_per_site: int, doc: dict | None = None) -> list[str]:
    """The timeline sketch and innermost frames of one report site, indented; for a location,
    its largest stacks (at most STACKS_SHOWN, each with its bytes, blocks and threads, its
    frames from the location outward with recursion collapsed) and how many it has."""
    out = []
    if site.get("timeline"):
        r2 = site.get("growth_r2")
        out.append(s.dim(f"    {site.get('verdict')}: {sparkline(site['timeline'])}  "
                         f"{human_rate(site.get('growth_bytes_per_s'))}"
                         + (f" (R² {r2:.2f})" if r2 is not None else "")))
    if "location" not in site or doc is None:
        out += [f"    {line}" for line in collapsed_frames(site["frames"], frames_per_site)]
        return out
    out.append(f"    {location_text(site)}")
    by_rank = {x["rank"]: x for x in doc.get("sites") or []}
    stacks = [by_rank[r] for r in site.get("stacks") or [] if r in by_rank]
    n = site.get("n_stacks", len(stacks))
    if n > 1:
        out.append(s.dim(f"    reached by {n} stacks" + (f"; the {min(n, STACKS_SHOWN)} holding most:"
                                                          if n > STACKS_SHOWN else ":")))
    for x in stacks[:STACKS_SHOWN]:
        thr = _threads_text(x["threads"], "live_bytes", 2)
        out.append(f"      stack #{x['rank']}: {human_bytes(x['live_bytes'])} live in {x['live_count']} blocks, "
                   f"{human_bytes(x['alloc_bytes'])} allocated" + (f"; {thr}" if thr != "-" else ""))
        # from the location outward; a stripped module's frames under their caller: from the start
        out += [f"        {line}" for line in collapsed_frames(x["frames"][0 if site.get("inside") else 1:],
                                                           frames_per_site)]
    return out


def peak_sites(doc: dict, rows: list[dict] | None = None) -> list[dict]:
    """The report's sites (or the given `rows`: its locations) that held bytes at the moment of
    the peak, in `at_peak_rank` order."""
    rows = doc.get("sites") or [] if rows is None else rows
    return sorted((x for x in rows if x.get("at_peak_bytes")), key=lambda x: x["at_peak_rank"])


def peak_when(doc: dict) -> str:
    """'4.0s, live 98.1 MiB': when the peak interval ended and the live total then."""
    p = doc.get("at_peak") or {}
    when = f"{p['elapsed_s']:.1f}s" if p.get("elapsed_s") is not None else f"interval {p.get('seq')}"
    how = f", a peak snapshot within {human_bytes(p['margin_bytes'])} of the high-water mark" \
        if p.get("peak_snapshot") and p.get("margin_bytes") else ""
    return f"{when}, live {human_bytes(p.get('live_bytes'))}{how}"


def _at_peak_text(doc: dict, s: Style, top: int, frames_per_site: int) -> list[str]:
    """The "held at the peak" table and its sites' details, shown first when most of the peak
    was freed by the end (doc["at_peak"]["peak_first"])."""
    tot, peak = doc["totals"], doc["at_peak"]
    share = f"{100 * tot['live_bytes'] / tot['peak_live_bytes']:.1f}%" if tot["peak_live_bytes"] else "-"
    out = [s.yellow(f"Most of the peak was freed by the end: live {human_bytes(tot['live_bytes'])} is {share} of the "
                    f"{human_bytes(tot['peak_live_bytes'])} peak (<= {peak['max_fraction']:.0%}), so the sites that "
                    "held the peak come first."), ""]
    every, by = listed(doc)
    held = peak_sites(doc, every)
    sites = held[:top]
    out.append(s.bold(f"Held at the peak ({peak_when(doc)}): top {len(sites)} of {len(held)} {NOUNS[by]} by bytes "
                      "live at that moment"))
    rows = [[str(x["at_peak_rank"]), human_bytes(x["at_peak_bytes"]),
             f"{100 * x['at_peak_bytes'] / peak['live_bytes']:.1f}%" if peak["live_bytes"] else "-",
             human_bytes(x["peak_live_bytes"]), human_bytes(x["live_bytes"]), x.get("verdict") or "-",
             location_text(x) if by != "stack" else frame_text(x["frames"][0]) if x["frames"] else "?"]
            for x in sites]
    out += ["  " + line for line in table(["#", "at peak", "share", "own peak", "live at end", "verdict",
                                           COLUMN_TITLES[by]], rows, "rrrrrll")]
    out.append("")
    for x in sites[: min(top, 10)]:
        out.append(s.bold(f"#{x['at_peak_rank']} {human_bytes(x['at_peak_bytes'])} at the peak")
                   + f"  (its own peak {human_bytes(x['peak_live_bytes'])}, "
                     f"live at the end {human_bytes(x['live_bytes'])})")
        out += _site_details(x, s, frames_per_site, doc)
    out.append("")
    return out
