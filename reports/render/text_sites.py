"""The report's sites in detail, as text (text.py puts them in the report): a site's timeline
sketch and frames, or a location's largest stacks; the sites that held the peak, shown first
when most of it was freed by the end; and GPU memory by site."""

from __future__ import annotations

from ..units import human_bytes, human_rate
from .shared import (
    COLUMN_TITLES,
    NOUNS,
    Style,
    collapsed_frames,
    frame_text,
    listed,
    location_text,
    sparkline,
    table,
)


def threads_text(threads: list[dict], key: str, n: int = 3) -> str:
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
    out = [
        s.bold("GPU memory") + f"  device {human_bytes(tot.get('device_bytes', 0))} live at the end, peak "
        f"{human_bytes(tot.get('device_peak_bytes', 0))}; CUDA host {human_bytes(tot.get('cuda_host_bytes', 0))}"
        + (f"  [{gpu['driver']}]" if gpu.get("driver") else "  [no CUDA driver probed: mappings only]")
    ]
    dev = [by_rank[r] for r in dev_ranks][:top]
    if dev:
        out.append(f"  Device (GPU) memory by {noun}: {len(dev)} of {len(dev_ranks)}")
        out += [
            "  " + line
            for line in table(
                ["#", "device live", "blocks", "device peak", "allocated", "allocs", "threads", title],
                [
                    [
                        str(x["rank"]),
                        human_bytes(x["device_live_bytes"]),
                        str(x["device_live_count"]),
                        human_bytes(x["device_peak_bytes"]),
                        human_bytes(x["device_alloc_bytes"]),
                        str(x["device_alloc_count"]),
                        threads_text(x["threads"], "device_live_bytes"),
                        name(x),
                    ]
                    for x in dev
                ],
                "rrrrrrll",
            )
        ]
    host = [by_rank[r] for r in host_ranks][:top]
    if host:
        out.append(f"  Pinned and managed host memory by {noun}: {len(host)} of {len(host_ranks)}")
        out += [
            "  " + line
            for line in table(
                ["#", "pinned", "managed", f"{noun} live", "threads", title],
                [
                    [
                        str(x["rank"]),
                        human_bytes(x["live_by_source"].get("cuda-pinned", 0)),
                        human_bytes(x["live_by_source"].get("cuda-managed", 0)),
                        human_bytes(x["live_bytes"]),
                        threads_text(x["threads"], "live_bytes"),
                        name(x),
                    ]
                    for x in host
                ],
                "rrrrll",
            )
        ]
    thr = [x for x in doc["threads"] if x.get("device_alloc_count")][:top]
    if thr:
        out.append("  Threads by device memory")
        out += [
            "  " + line
            for line in table(
                ["tid", "name", "device live", "blocks", "device peak", "allocated"],
                [
                    [
                        str(x["tid"]),
                        x["name"],
                        human_bytes(x["device_live_bytes"]),
                        str(x["device_live_count"]),
                        human_bytes(x["device_peak_bytes"]),
                        human_bytes(x["device_alloc_bytes"]),
                    ]
                    for x in sorted(thr, key=lambda x: (-x["device_live_bytes"], -x["device_peak_bytes"], x["tid"]))
                ],
                "rlrrrr",
            )
        ]
    out.append(
        s.dim(
            "  device memory is the GPU's own: in no live, peak, RSS or thread figure of the host;"
            " pinned and managed memory are host memory, counted there too"
        )
    )
    return out


STACKS_SHOWN = 3  # a location's largest stacks shown under it in the text report


def site_details(site: dict, s: Style, frames_per_site: int, doc: dict | None = None) -> list[str]:
    """The timeline sketch and innermost frames of one report site, indented; for a location,
    its largest stacks (at most STACKS_SHOWN, each with its bytes, blocks and threads, its
    frames from the location outward with recursion collapsed) and how many it has."""
    out = []
    if site.get("timeline"):
        r2 = site.get("growth_r2")
        out.append(
            s.dim(
                f"    {site.get('verdict')}: {sparkline(site['timeline'])}  "
                f"{human_rate(site.get('growth_bytes_per_s'))}" + (f" (R² {r2:.2f})" if r2 is not None else "")
            )
        )
    if "location" not in site or doc is None:
        out += [f"    {line}" for line in collapsed_frames(site["frames"], frames_per_site)]
        return out
    out.append(f"    {location_text(site)}")
    by_rank = {x["rank"]: x for x in doc.get("sites") or []}
    stacks = [by_rank[r] for r in site.get("stacks") or [] if r in by_rank]
    n = site.get("n_stacks", len(stacks))
    if n > 1:
        out.append(
            s.dim(
                f"    reached by {n} stacks"
                + (f"; the {min(n, STACKS_SHOWN)} holding most:" if n > STACKS_SHOWN else ":")
            )
        )
    for x in stacks[:STACKS_SHOWN]:
        thr = threads_text(x["threads"], "live_bytes", 2)
        out.append(
            f"      stack #{x['rank']}: {human_bytes(x['live_bytes'])} live in {x['live_count']} blocks, "
            f"{human_bytes(x['alloc_bytes'])} allocated" + (f"; {thr}" if thr != "-" else "")
        )
        # from the location outward; a stripped module's frames under their caller: from the start
        out += [
            f"        {line}"
            for line in collapsed_frames(x["frames"][0 if site.get("inside") else 1 :], frames_per_site)
        ]
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
    how = (
        f", a peak snapshot within {human_bytes(p['margin_bytes'])} of the high-water mark"
        if p.get("peak_snapshot") and p.get("margin_bytes")
        else ""
    )
    return f"{when}, live {human_bytes(p.get('live_bytes'))}{how}"


def at_peak_text(doc: dict, s: Style, top: int, frames_per_site: int) -> list[str]:
    """The "held at the peak" table and its sites' details, shown first when most of the peak
    was freed by the end (doc["at_peak"]["peak_first"])."""
    tot, peak = doc["totals"], doc["at_peak"]
    share = f"{100 * tot['live_bytes'] / tot['peak_live_bytes']:.1f}%" if tot["peak_live_bytes"] else "-"
    out = [
        s.yellow(
            f"Most of the peak was freed by the end: live {human_bytes(tot['live_bytes'])} is {share} of the "
            f"{human_bytes(tot['peak_live_bytes'])} peak (<= {peak['max_fraction']:.0%}), so the sites that "
            "held the peak come first."
        ),
        "",
    ]
    every, by = listed(doc)
    held = peak_sites(doc, every)
    sites = held[:top]
    out.append(
        s.bold(
            f"Held at the peak ({peak_when(doc)}): top {len(sites)} of {len(held)} {NOUNS[by]} by bytes "
            "live at that moment"
        )
    )
    rows = [
        [
            str(x["at_peak_rank"]),
            human_bytes(x["at_peak_bytes"]),
            f"{100 * x['at_peak_bytes'] / peak['live_bytes']:.1f}%" if peak["live_bytes"] else "-",
            human_bytes(x["peak_live_bytes"]),
            human_bytes(x["live_bytes"]),
            x.get("verdict") or "-",
            location_text(x) if by != "stack" else frame_text(x["frames"][0]) if x["frames"] else "?",
        ]
        for x in sites
    ]
    out += [
        "  " + line
        for line in table(
            ["#", "at peak", "share", "own peak", "live at end", "verdict", COLUMN_TITLES[by]], rows, "rrrrrll"
        )
    ]
    out.append("")
    for x in sites[: min(top, 10)]:
        out.append(
            s.bold(f"#{x['at_peak_rank']} {human_bytes(x['at_peak_bytes'])} at the peak")
            + f"  (its own peak {human_bytes(x['peak_live_bytes'])}, "
            f"live at the end {human_bytes(x['live_bytes'])})"
        )
        out += site_details(x, s, frames_per_site, doc)
    out.append("")
    return out
