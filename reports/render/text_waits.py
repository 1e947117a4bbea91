"""The report's waits as text (reports/analysis/waits.py): what threads held while blocked, where
they spent time off the CPU, and what giving memory back cost."""

from __future__ import annotations

from ..units import human_bytes
from .shared import Style, frame_text, table


def _where(d: dict) -> str:
    """A location of the `waits` object as text: function (file:line)."""
    return frame_text(d)


def handoff_text(d: dict) -> str:
    """'take_job handoff.c:57: 16.0 MiB allocated by synth-*, passed on to finalizer
    (make_partition), not held by the 4 threads waiting there' for a wait location whose
    blocked threads handed what they allocated on (reports/analysis/waits.py)."""
    what = ", ".join(h["function"] for h in (d.get("handed_on") or [])[:3])
    idle = d["handing_threads"]
    return (
        f"{_where(d)}: {human_bytes(d['handed_on_bytes'])} allocated by {d.get('allocated_by') or '?'}, "
        f"passed on to {d.get('passed_to_names') or '?'}" + (f" ({what})" if what else "") + f", not held by "
        f"the {idle} thread{'s' if idle != 1 else ''} waiting there"
    )


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
        # its time, as the header gives the duration; a seq (peak snapshots take seqs too) only without one
        when = f"+{pk['elapsed_s']:.1f}s" if pk.get("elapsed_s") is not None else f"interval {pk['seq']}"
        handed = (
            f"; {human_bytes(pk['handed_on_bytes'])} they allocated was passed on" if pk.get("handed_on_bytes") else ""
        )
        out.append(
            s.bold("Held while waiting") + f"  ({when}: {pk['blocked']} threads blocked, "
            f"{pk['holding']} of them holding {human_bytes(pk['held_bytes'])}{handed}; {thr})"
        )
        rows = []
        for d in pk["by_location"][:top]:
            held = ", ".join(f"{h['function']} {human_bytes(h['bytes'])} in {h['blocks']}" for h in d["held"][:3])
            rows.append(
                [
                    _where(d) + (" [in free]" if d.get("in_free") else ""),
                    str(d["threads"]),
                    human_bytes(d["held_bytes"]),
                    human_bytes(d["handed_on_bytes"]) if d.get("handed_on_bytes") else "-",
                    f"{d['longest_s']:.2f}s",
                    held or "-",
                ]
            )
        out += [
            "  " + line
            for line in table(
                ["waiting in", "threads", "held", "passed on", "longest", "what they hold (allocated at)"],
                rows,
                "lrrrrl",
            )
        ]
        for d in pk["by_location"][:top]:
            if d.get("handed_on_bytes"):
                out.append("  " + handoff_text(d))
        lead = pk["by_location"][0] if pk["by_location"] else None
        if lead and lead["held_bytes"]:
            names = ", ".join(
                f"{t['name']}({t['tid']}) {human_bytes(t['held_bytes'])}" for t in lead["thread_list"][:6]
            )
            more = f" +{len(lead['thread_list']) - 6} more" if len(lead["thread_list"]) > 6 else ""
            out.append(f"  {lead['function']}: {names}{more}")
            out.append(s.dim("    " + " < ".join(f["function"] for f in lead["frames"][:6])))
    if w.get("off_cpu"):
        out.append(
            s.bold(f"Off-CPU time by where threads blocked ({thr}, whole recording)")
            + s.dim(f"  shorter: {w['short_waits']} waits, {w['short_wait_s']:.2f}s")
        )
        out += [
            "  " + line
            for line in table(
                ["waiting in", "waits", "total", "longest", "threads"],
                [
                    [
                        _where(d) + (" [in free]" if d.get("in_free") else ""),
                        str(d["waits"]),
                        f"{d['total_s']:.2f}s",
                        f"{d['max_s']:.2f}s",
                        f"{d['n_threads']}: " + ", ".join(d["threads"][:4]),
                    ]
                    for d in w["off_cpu"][:top]
                ],
                "lrrrl",
            )
        ]
    return out + [""]


def freeing_text(f: dict, s: Style, top: int) -> list[str]:
    """What giving memory back cost: syscall time by thread and call, munmap time by the location
    that mapped the memory, purge calls."""
    rows = [r for r in f.get("by_thread") or [] if r["calls"]]
    if not rows and not f.get("purges") and not f.get("tlb"):
        return []
    out = ["", s.bold("What giving memory back cost (time in the calls)")]
    out += [
        "  " + line
        for line in table(
            ["thread", "call", "calls", "asked", "released", "time"],
            [
                [
                    f"{r['thread']}({r['tid']})",
                    r["kind"],
                    str(r["calls"]),
                    human_bytes(r["requested_bytes"]),
                    human_bytes(r["released_bytes"]),
                    f"{r['duration_s'] * 1e3:.2f}ms",
                ]
                for r in rows[:top]
            ]
            + [
                [
                    f"{p['thread']}({p['tid']})",
                    p["function"],
                    str(p["calls"]),
                    "-",
                    human_bytes(p["released_bytes"]),
                    f"{p['duration_s'] * 1e3:.2f}ms",
                ]
                for p in (f.get("purges") or [])[:top]
            ],
            "llrrrr",
        )
    ]
    tlb = {k: v for k, v in (f.get("tlb") or {}).items() if k != "task_switch"}
    if tlb:
        out.append(
            "  TLB flushes on its threads: "
            + ", ".join(
                f"{k.replace('_', ' ')} {v['flushes']} ({v['pages']} pages"
                + (f", {v['full']} full)" if v["full"] else ")")
                for k, v in tlb.items()
            )
        )
    if f.get("by_location"):
        out.append(
            "  munmap of memory mapped at: "
            + "; ".join(
                f"{_where(d)} {d['calls']} calls {human_bytes(d['requested_bytes'])} {d['duration_s'] * 1e3:.2f}ms"
                for d in f["by_location"][:4]
            )
        )
    return out
