"""Renderers: format what reports.analysis computed. No analysis here."""
from __future__ import annotations

import json
import os

_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]


def human_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for u in _UNITS:
        if n < 1024 or u == _UNITS[-1]:
            return f"{sign}{n:.0f} {u}" if u == "B" else f"{sign}{n:.1f} {u}"
        n /= 1024
    return f"{sign}{n:.1f} PiB"


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, default=_json_default) + "\n"


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def _w(self, code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if self.color else s

    def bold(self, s: str) -> str:
        return self._w("1", s)

    def dim(self, s: str) -> str:
        return self._w("2", s)

    def red(self, s: str) -> str:
        return self._w("31", s)

    def yellow(self, s: str) -> str:
        return self._w("33", s)


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    """Aligned columns; `align` is a string of 'l'/'r' per column (default: numbers right)."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    align = align or "l" * len(headers)
    def fmt(r):
        return "  ".join(c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i])
                         for i, c in enumerate(r)).rstrip()
    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def frame_text(f: dict) -> str:
    loc = ""
    if f.get("file"):
        loc = f" {os.path.basename(f['file'])}:{f.get('line') or '?'}"
    mod = os.path.basename(f.get("module") or "")
    return f"{f['function']}{loc}" + (f"  [{mod}]" if mod else "")


def to_text(doc: dict, top: int = 20, color: bool = False, frames_per_site: int = 6) -> str:
    s = _Style(color)
    t = doc["target"]
    tot = doc["totals"]
    rec = doc["recording"]
    out = []
    labels = " ".join(f"{k}={v}" for k, v in (t.get("labels") or {}).items())
    out.append(s.bold(f"allocscope report — pid {t['pid']} {t.get('comm') or ''}") + (f"  [{labels}]" if labels else ""))
    out.append(f"exe {t.get('exe')}; allocator {rec.get('allocator_kind')} {rec.get('allocator')}")
    probes = rec.get("probes") or {}
    if probes.get("skipped"):
        out.append(s.dim("not probed: " + ", ".join(f"{k} ({v})" for k, v in probes["skipped"].items())))
    out.append(f"{tot['intervals']} intervals, {tot['duration_s']:.1f}s; ended: {rec.get('end_reason') or 'interrupted'}")
    for w in rec.get("warnings") or []:
        out.append(s.yellow(f"warning: {w}"))
    out.append("")
    out.append(s.bold("Totals"))
    out.append(f"  live now   {human_bytes(tot['live_bytes']):>10}  in {tot['live_count']} blocks"
               f"   (heap API {human_bytes(tot['heap_live_bytes'])}, mmap/brk {human_bytes(tot['mmap_live_bytes'])})")
    out.append(f"  live peak  {human_bytes(tot['peak_live_bytes']):>10}")
    out.append(f"  RSS now    {human_bytes(tot['rss_bytes']):>10}   peak sampled {human_bytes(tot['peak_rss_bytes'])}"
               f", kernel high-water {human_bytes(tot['hwm_bytes'])}")
    lost = tot["lost_events"]
    out.append(f"  lost       {lost:>10}" if not lost else s.red(f"  lost       {lost:>10}"))
    for a in doc.get("advice") or []:
        out.append(s.yellow(f"    ! {a}"))
    out.append("")
    sites = doc["sites"][:top]
    out.append(s.bold(f"Top {len(sites)} of {len(doc['sites'])} sites by live bytes"))
    rows = []
    for site in sites:
        fr = site["frames"]
        first = frame_text(fr[0]) if fr else "?"
        rows.append([str(site["rank"]), human_bytes(site["live_bytes"]), str(site["live_count"]),
                     human_bytes(site["peak_live_bytes"]), human_bytes(site["alloc_bytes"]),
                     str(site["alloc_count"]), first])
    out += ["  " + line for line in table(["#", "live", "blocks", "peak", "allocated", "allocs", "site (innermost)"],
                                          rows, "rrrrrrl")]
    out.append("")
    for site in sites[: min(top, 10)]:
        if not site["live_bytes"] and not site["peak_live_bytes"]:
            continue
        thr = ", ".join(f"{x['name']}({x['tid']}) {human_bytes(x['live_bytes'])}" for x in site["threads"][:4])
        out.append(s.bold(f"#{site['rank']} {human_bytes(site['live_bytes'])} live") + f"  threads: {thr}")
        for f in site["frames"][:frames_per_site]:
            out.append(f"    {frame_text(f)}")
        if len(site["frames"]) > frames_per_site:
            out.append(s.dim(f"    ... {len(site['frames']) - frames_per_site} more frames"))
    out.append("")
    thr = doc["threads"][:top]
    out.append(s.bold("Threads by live bytes"))
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
    if doc.get("trims"):
        out.append("")
        out.append(s.bold("malloc_trim calls"))
        out += ["  " + line for line in table(
            ["time", "thread", "duration", "returned", "released"],
            [[f"{x['time']:.3f}s", f"{x['thread']}({x['tid']})", f"{x['duration_s'] * 1e3:.2f}ms", str(x.get("returned")),
              human_bytes(x["released_bytes"])] for x in doc["trims"]], "rlrrr")]
    return "\n".join(out) + "\n"
