"""The tables of the report page, rendered here (escaped, with their numbers right-aligned) so the
page reads without JavaScript; html_cells.py holds what they are built from, html_diff_tables.py
the diff's tables."""

from __future__ import annotations

from ..units import human_bytes
from .html_cells import TOP_SITES_TABLE, bytes_cell, esc, frames_cell, html_table
from .shared import COLUMN_TITLES, NOUNS, SORT_TITLES, frame_text, listed, location_text
from .text_sites import peak_when


def ordered_sites(report_doc: dict) -> list[tuple[int, dict]]:
    """(number shown, row) in the page's order — rows are the report's locations (its sites
    when it is `by` stack, render.listed) —: by bytes held at the peak (`at_peak_rank`, every
    row) when the report leads with the peak, else by `rank`."""
    sites = listed(report_doc)[0]
    if (report_doc.get("at_peak") or {}).get("peak_first"):
        return [(s["at_peak_rank"], s) for s in sorted(sites, key=lambda s: s["at_peak_rank"])]
    return [(s["rank"], s) for s in sites]


def _location_cell(loc: dict, doc: dict) -> str:
    """A location: its frame, and (unfolded) the stacks that reach it, holding most first, each
    with its live bytes and its frames."""
    head = f"<code>{esc(location_text(loc))}</code>"
    by_rank = {x["rank"]: x for x in doc.get("sites") or []}
    stacks = [by_rank[r] for r in loc.get("stacks") or [] if r in by_rank][:STACKS_LISTED]
    n = loc.get("n_stacks", len(stacks))
    skip = 0 if loc.get("inside") else 1  # a stripped module's frames under their caller: shown
    items = "".join(
        f"<li>{bytes_cell(x['live_bytes'])} live, {esc(x['live_count'])} blocks"
        f'<ol class="frames">{"".join(f"<li><code>{esc(frame_text(f))}</code></li>" for f in x["frames"][skip:])}'
        "</ol></li>"
        for x in stacks
    )
    more = f" ({len(stacks)} shown)" if n > len(stacks) else ""
    return (
        f'<details><summary>{head} <span class="note">{n} stack{"s" if n != 1 else ""}{more}</span></summary>'
        f'<ol class="stacks">{items}</ol></details>'
    )


STACKS_LISTED = 10  # stacks listed under a location in the page's table


def sites_table(doc: dict, limit: int = TOP_SITES_TABLE) -> str:
    """The location table (the site table with `by` stack) in the page's order
    (`ordered_sites`), with each row's bytes at the peak beside its live bytes at the end;
    host memory, and when the report has GPU memory, two columns of it apart (device: live at
    the end, device peak)."""
    every, by = listed(doc)
    sites = ordered_sites(doc)[:limit]
    device = bool((doc.get("gpu") or {}).get("device_ranks"))
    rows = [
        [
            esc(n),
            bytes_cell(s.get("at_peak_bytes")),
            bytes_cell(s["live_bytes"]),
            esc(s["live_count"]),
            bytes_cell(s["peak_live_bytes"]),
            bytes_cell(s["alloc_bytes"]),
            esc(s["alloc_count"]),
        ]
        + ([bytes_cell(s.get("device_live_bytes")), bytes_cell(s.get("device_peak_bytes"))] if device else [])
        + [
            esc(",".join(s.get("sources") or [])),
            esc(", ".join(f"{t['name']}({t['tid']})" for t in (s.get("threads") or [])[:3])),
            frames_cell(s.get("frames") or []) if by == "stack" else _location_cell(s, doc),
        ]
        for n, s in sites
    ]
    note = "" if len(sites) == len(every) else f'<p class="note">showing {len(sites)} of {len(every)} {NOUNS[by]}</p>'
    heads = (
        ["#", "at peak", "live", "blocks", "peak", "allocated", "allocs"]
        + (["device", "device peak"] if device else [])
        + [
            "source",
            "threads",
            "site (innermost frame first)" if by == "stack" else f"{COLUMN_TITLES[by]} (and the stacks reaching it)",
        ]
    )
    return html_table(heads, rows, set(range(9 if device else 7)), "sites") + note


def gpu_html(doc: dict) -> str:
    """The GPU section: GPU memory by site, pinned and managed host memory by site, threads
    with GPU memory (the text report's GPU section)."""
    gpu, tot = doc.get("gpu") or {}, doc.get("totals") or {}
    every, by = listed(doc)
    by_rank = {s["rank"]: s for s in every}
    loc = by != "stack" and "device_location_ranks" in gpu
    noun = NOUNS[by][:-1] if loc else "site"

    def cell(s: dict) -> str:
        return f"<code>{esc(location_text(s))}</code>" if loc else frames_cell(s.get("frames") or [])

    out = [
        f"<p>GPU memory <b>{bytes_cell(tot.get('device_bytes'))}</b> live at the end in "
        f"{esc(tot.get('device_count'))} allocations, peak <b>{bytes_cell(tot.get('device_peak_bytes'))}</b>; "
        f"pinned and managed host memory through the driver API {bytes_cell(tot.get('cuda_host_bytes'))}. "
        "GPU memory is in no host figure (live, peak, RSS, threads' live bytes).</p>"
    ]
    dev = [by_rank[r] for r in gpu.get("device_location_ranks" if loc else "device_ranks") or []]
    if dev:
        out.append(
            f"<h3>Device memory by {noun}</h3>"
            + html_table(
                ["#", "device live", "blocks", "device peak", "allocated", "allocs", "threads", noun],
                [
                    [
                        esc(s["rank"]),
                        bytes_cell(s["device_live_bytes"]),
                        esc(s["device_live_count"]),
                        bytes_cell(s["device_peak_bytes"]),
                        bytes_cell(s["device_alloc_bytes"]),
                        esc(s["device_alloc_count"]),
                        esc(", ".join(f"{t['name']}({t['tid']})" for t in s["threads"] if t.get("device_live_bytes"))),
                        cell(s),
                    ]
                    for s in dev
                ],
                {0, 1, 2, 3, 4, 5},
                "gpu-sites",
            )
        )
    host = [by_rank[r] for r in gpu.get("host_location_ranks" if loc else "host_ranks") or []]
    if host:
        out.append(
            f"<h3>Pinned and managed host memory by {noun}</h3>"
            + html_table(
                ["#", "pinned", "managed", f"{noun} live", "threads", noun],
                [
                    [
                        esc(s["rank"]),
                        bytes_cell(s["live_by_source"].get("cuda-pinned", 0)),
                        bytes_cell(s["live_by_source"].get("cuda-managed", 0)),
                        bytes_cell(s["live_bytes"]),
                        esc(", ".join(f"{t['name']}({t['tid']})" for t in s["threads"] if t.get("live_bytes"))),
                        cell(s),
                    ]
                    for s in host
                ],
                {0, 1, 2, 3},
                "gpu-host",
            )
        )
    return "".join(out)


def sites_heading(doc: dict) -> str:
    noun = NOUNS[listed(doc)[1]].capitalize()
    if (doc.get("at_peak") or {}).get("peak_first"):
        tot = doc.get("totals") or {}
        return (
            f"{noun} by bytes held at the peak ({peak_when(doc)}; live at the end "
            f"{human_bytes(tot.get('live_bytes'))}: most of the peak was freed)"
        )
    return f"{noun} by {SORT_TITLES.get(doc.get('sort') or 'live', 'live bytes')}"


def flame_section(doc: dict, flame: dict) -> str:
    """The view buttons (only with a peak to show) and the graph's element."""
    tot = doc.get("totals") or {}
    buttons = ""
    if flame["views"]["peak"] is not None:
        buttons = (
            f'<button type="button" data-view="peak">at the peak ({esc(peak_when(doc))})</button>'
            f'<button type="button" data-view="end">at the end (live {esc(human_bytes(tot.get("live_bytes")))})'
            "</button>"
        )
    return f'<div class="views" id="flame-views">{buttons}</div><div id="flame-graph"></div>'


def threads_table(doc: dict) -> str:
    """Threads by live host bytes; with GPU memory in the report, its live and peak bytes apart."""
    device = bool((doc.get("gpu") or {}).get("device_ranks"))
    rows = [
        [
            esc(t["tid"]),
            esc(t["name"]),
            bytes_cell(t["live_bytes"]),
            esc(t["live_count"]),
            bytes_cell(t["peak_live_bytes"]),
            bytes_cell(t["alloc_bytes"]),
            esc(t["alloc_count"]),
        ]
        + ([bytes_cell(t.get("device_live_bytes")), bytes_cell(t.get("device_peak_bytes"))] if device else [])
        for t in doc.get("threads") or []
    ]
    return html_table(
        ["tid", "name", "live", "blocks", "peak", "allocated", "allocs"]
        + (["device", "device peak"] if device else []),
        rows,
        {0, 2, 3, 4, 5, 6} | ({7, 8} if device else set()),
    )


def flows_table(doc: dict) -> str:
    rows = [
        [
            esc(f"{f['alloc_thread']}({f['alloc_tid']})"),
            esc(f"{f['free_thread']}({f['free_tid']})"),
            bytes_cell(f["bytes"]),
            esc(f["count"]),
            esc(f"{f['mean_wait_s']:.3f}s"),
            esc(f"{f['max_wait_s']:.3f}s"),
        ]
        for f in doc.get("flows") or []
    ]
    return html_table(["allocated by", "freed by", "bytes", "blocks", "mean wait", "max wait"], rows, {2, 3, 4, 5})


def waits_html(doc: dict) -> str:
    """ "Held while waiting" (reports/analysis/waits.py): at the peak of memory held by blocked threads,
    where they wait, how many, what they hold (by where it was allocated), then the off-CPU
    time by wait location and what giving memory back cost; '' when waits were not traced."""
    w = doc.get("waits") or {}
    if not w.get("traced"):
        return ""
    pk = w.get("peak")
    parts = []
    if pk:
        when = f"+{pk['elapsed_s']:.1f}s" if pk.get("elapsed_s") is not None else f"interval {pk['seq']}"
        parts.append(
            f"<p>{esc(when)}: {esc(pk['blocked'])} threads blocked, "
            f"{esc(pk['holding'])} of them holding {bytes_cell(pk['held_bytes'])} "
            f"(waits of at least {esc(w['wait_min_ms'])} ms)</p>"
        )
        rows = [
            [
                frames_cell([d]) + (" <em>in free</em>" if d.get("in_free") else ""),
                esc(d["threads"]),
                bytes_cell(d["held_bytes"]),
                (
                    bytes_cell(d["handed_on_bytes"])
                    + esc(
                        f" allocated by {d.get('allocated_by') or '?'}, passed on to {d.get('passed_to_names') or '?'}"
                    )
                    if d.get("handed_on_bytes")
                    else "-"
                ),
                esc(f"{d['longest_s']:.2f}s"),
                "<br>".join(
                    f"{esc(h['function'])} {bytes_cell(h['bytes'])} in {esc(h['blocks'])}" for h in d["held"][:4]
                ),
                esc(", ".join(f"{t['name']}({t['tid']})" for t in d["thread_list"][:8])),
            ]
            for d in pk["by_location"][:TOP_SITES_TABLE]
        ]
        parts.append(
            html_table(
                ["waiting in", "threads", "held", "passed on", "longest", "what they hold (allocated at)", "threads"],
                rows,
                {1, 2, 4},
            )
        )
    else:
        parts.append("<p>No thread was blocked at a snapshot.</p>")
    if w.get("off_cpu"):
        parts.append("<h3>Off-CPU time by where threads blocked (whole recording)</h3>")
        parts.append(
            html_table(
                ["waiting in", "waits", "total", "longest", "threads"],
                [
                    [
                        frames_cell([d]),
                        esc(d["waits"]),
                        esc(f"{d['total_s']:.2f}s"),
                        esc(f"{d['max_s']:.2f}s"),
                        esc(", ".join(d["threads"][:6])),
                    ]
                    for d in w["off_cpu"][:TOP_SITES_TABLE]
                ],
                {1, 2, 3},
            )
        )
    fr = w.get("freeing") or {}
    rows = [
        [
            esc(f"{r['thread']}({r['tid']})"),
            esc(r["kind"]),
            esc(r["calls"]),
            bytes_cell(r["requested_bytes"]),
            bytes_cell(r["released_bytes"]),
            esc(f"{r['duration_s'] * 1e3:.2f}ms"),
        ]
        for r in fr.get("by_thread") or []
    ]
    rows += [
        [
            esc(f"{p['thread']}({p['tid']})"),
            esc(p["function"]),
            esc(p["calls"]),
            "-",
            bytes_cell(p["released_bytes"]),
            esc(f"{p['duration_s'] * 1e3:.2f}ms"),
        ]
        for p in fr.get("purges") or []
    ]
    if rows:
        parts.append("<h3>What giving memory back cost</h3>")
        parts.append(html_table(["thread", "call", "calls", "asked", "released", "time"], rows, {2, 3, 4, 5}))
    return "".join(parts)


def trims_table(doc: dict) -> str:
    rows = [
        [
            esc(f"{x['time']:.3f}s"),
            esc(f"{x['thread']}({x['tid']})"),
            esc(f"{x['duration_s'] * 1e3:.2f}ms"),
            esc(x.get("returned")),
            bytes_cell(x.get("released_bytes")),
        ]
        for x in doc.get("trims") or []
    ]
    return html_table(["time", "thread", "duration", "returned", "released"], rows, {0, 2, 3, 4})


def arenas_table(doc: dict) -> str:
    rows = [
        [
            esc(a["id"]),
            esc(a["kind"]),
            bytes_cell(a["live_bytes"]),
            bytes_cell(a.get("live_before_bytes")),
            bytes_cell(a["resident_bytes"]),
            bytes_cell(a["retained_bytes"]),
            esc(a.get("heaps", "")),
            esc(", ".join(str(t) for t in a["threads"][:8])),
        ]
        for a in doc.get("arenas") or []
    ]
    return html_table(
        ["arena", "kind", "live", "before attach", "resident", "retained", "heaps", "threads"], rows, {2, 3, 4, 5, 6}
    )


def allocators_table(doc: dict) -> str:
    """What each allocator keeps (rss_decomposition.allocators): resident in its own mappings,
    live, retained, released to the kernel; '' when the trace does not measure it."""
    allocs = (doc.get("rss_decomposition") or {}).get("allocators") or []
    rows = [
        [
            esc(a["name"]),
            esc(a.get("module") or ""),
            esc("yes" if a.get("serves_malloc") else ""),
            bytes_cell(a["resident"]),
            bytes_cell(a["live"]),
            bytes_cell(a.get("live_before_attach")),
            bytes_cell(a["retained"]),
            bytes_cell(a["released"]),
        ]
        for a in allocs
    ]
    if not rows:
        return ""
    return html_table(
        ["allocator", "module", "serves malloc", "resident", "live", "before attach", "retained", "released"],
        rows,
        {3, 4, 5, 6, 7},
        "allocators",
    )


def decomposition_html(doc: dict) -> str:
    d = doc.get("rss_decomposition")
    if not d:
        return ""
    # the equations the text prints (analysis/equations.py): the same terms, each adding up
    out = ""
    for eq in d.get("equations") or []:
        if eq["name"] in ("shmem", "file"):
            continue  # below, with the sites behind them
        cells = ""
        for i, t in enumerate(eq["terms"]):
            op = "" if i == 0 and t["sign"] > 0 else (" − " if t["sign"] < 0 else " + ")
            cells += f"{op}{esc(t['label'])} <b>{bytes_cell(t['bytes'])}</b>"
        name = "" if eq["name"] == eq["whole_label"] else f"{esc(eq['name'])} "
        out += f'<p class="decomp">{name}{esc(eq["whole_label"])} <b>{bytes_cell(eq["whole"])}</b> = {cells}</p>'
    if d.get("unseparated"):
        where = (
            "in its own mappings and in other anonymous" if d.get("before_or_retained_bytes") else "in other anonymous"
        )
        out += (
            f'<p class="decomp">{esc(", ".join(d["unseparated"]))}: memory from before the attach is {where}, '
            f"{esc(d['unseparated_note'])}</p>"
        )
    if d.get("shmem_attributed_bytes") or d.get("file_device_bytes"):

        def srcs(by: dict) -> str:
            return esc(", ".join(f"{k} {human_bytes(v)}" for k, v in by.items()) or "none")

        out += (
            f'<p class="decomp">shmem {bytes_cell(d["shmem_bytes"])} = '
            f"<b>{bytes_cell(d['shmem_attributed_bytes'])}</b>"
            f" at sites ({srcs(d['shmem_sources'])}) + {bytes_cell(d['shmem_unattributed_bytes'])} not traced; "
            f"file {bytes_cell(d['file_bytes'])} = <b>{bytes_cell(d['file_device_bytes'])}</b> device-mapped "
            f"({srcs(d['file_device_sources'])}) + {bytes_cell(d['file_regular_bytes'])} regular files</p>"
        )
    return out
