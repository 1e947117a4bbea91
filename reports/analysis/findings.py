"""The answer first: a few one-sentence findings on top of every report and diff, each with its
figures and the table below that shows them (docs/findings.md has the rules and thresholds).

Findings are read from the analysis' own outputs — the allocscope.report/1 document
(analysis.build_report) and the allocscope.diff/1 document (diff.diff_traces) — never
re-derived from the trace, so a finding can only say what a table of the same report shows.

    >>> from reports.analysis.findings import report_findings
    >>> report_findings(build_report(trace))     # [{kind, text, table, section, figures}, ...]

A diff's findings are diff_findings.py's (`diff_findings`), from the thresholds and sentence
pieces here.

Every finding is a dict: kind (ended, children, peak, waiting, growing, retained, release_cost, losses,
no_problem; in a diff: out_of_proportion, changed, waiting, thread_groups, retained, losses,
no_change), text (one sentence, plain text), table (the title of the table it comes from, as
the text report names it), section (the id of that table's section in the HTML page) and
figures (the numbers the sentence states, unrounded). At most MAX_FINDINGS.
"""

from __future__ import annotations

import os

from common import allocators as registry
from common.tracefile.names import NOT_LOST

from ..units import human_bytes, human_rate
from .advice import allocator_prefix
from .children import children_warnings

MAX_FINDINGS = 6
PEAK_MAX_HOLDERS = 3  # locations named as holding the peak...
PEAK_MIN_SHARE = 0.10  # ...each holding >= 10% of it (the first is always named)...
PEAK_ENOUGH_SHARE = 0.80  # ...until those named hold >= 80% of it
BURST_MIN_SHARE = 0.10  # a peak freed by the end is news when what was freed is >= 10% of the RSS peak...
BURST_MIN_BYTES = 1 << 20  # ...and >= 1 MiB (a few KiB of churn in a small heap is not)
WAIT_MIN_THREADS = 2  # held while waiting: >= 2 threads blocked in one place holding memory...
WAIT_MIN_SHARE = 0.25  # ...keeping (kept_bytes) >= 25% of the live peak
GROW_MIN_SHARE = 0.01  # growing: its rise over the recording >= 1% of the live total...
GROW_MIN_BYTES = 64 << 10  # ...and >= 64 KiB
GROW_MAX_NAMED = 2
RETAINED_MIN_SHARE = 0.20  # an allocator keeps >= 20% of RSS resident and not live...
RETAINED_MIN_BYTES = 4 << 20  # ...and >= 4 MiB
RELEASE_MIN_S = 0.05  # giving memory back took >= 50 ms in the calls...
RELEASE_MIN_SHOOTDOWNS = 1000  # ...or >= 1000 remote TLB shootdowns on its threads
NOISY_LOSSES = {"lost_unmatched_ret": 1000, "lost_stale_entry": 1000}  # normal in small numbers
GREW_FASTER = 1.2  # a diff's finding names the location that grew most beyond linear, from 1.2x (the flag: 1.5x)
DIFF_MIN_SHARE = 0.10  # a diff names a change >= 10% of the larger live peak
GROUP_MIN_CHANGE = 0.25  # a thread group's peak moved by >= 25% of its larger peak (and DIFF_MIN_SHARE)

# The knob that returns an allocator's retained memory: its family's `knob` (common/allocators/;
# reports.analysis.advice has the long form).


def finding(kind: str, text: str, table: str, section: str, **figures) -> dict:
    """One finding as the documents hold it (see the module's docstring)."""
    return {"kind": kind, "text": text, "table": table, "section": section, "figures": figures}


def where_text(d: dict) -> str:
    """'function file:line' of a location (report row, waits entry or diff row)."""
    if "function" not in d and d.get("frames"):
        d = d["frames"][0]
    f = d.get("file")
    return str(d.get("function") or "?") + (f" {os.path.basename(f)}:{d.get('line') or '?'}" if f else "")


def percent(part: float, whole: float) -> str:
    """'12.5%' of `whole`, '-' when it is 0."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def listed_rows(doc: dict) -> tuple[list[dict], str]:
    """The rows a report or diff lists (render.listed): its locations unless `by` stack."""
    by = doc.get("by") or "stack"
    if by == "stack" or "locations" not in doc:
        return doc.get("sites") or [], "stack"
    return doc["locations"], by


def and_list(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def rows_noun(by: str) -> str:
    """What the rows listed by `by` are called: 'locations', 'functions' or 'sites'."""
    return {"location": "locations", "function": "functions"}.get(by, "sites")


# --------------------------------------------------------------------------------------------- report
def held_bytes(r: dict, key: str) -> int:
    """A row's `key` (live_bytes or at_peak_bytes), the figure its table shows: in residency mode
    a row's first touches (source `fault`) are already an estimate of what they keep resident,
    capped by the RSS (analysis/touches.py), the same in the tables, the totals and here."""
    return int(r.get(key) or 0)


def estimated(r: dict, key: str = "live_bytes") -> bool:
    """Whether a row's `key` (live_bytes or at_peak_bytes) holds residency mode's first-touch
    estimate (analysis/touches.py), not only exact bytes."""
    if key == "at_peak_bytes":
        return bool(r.get("at_peak_estimate_bytes"))
    return bool((r.get("live_by_source") or {}).get("fault"))


def peak_holders(doc: dict) -> tuple[list[dict], int, bool]:
    """(rows named as holding the memory, the total they are a share of, at the peak?): by
    bytes at the peak when the report leads with the peak (at_peak.peak_first), else by live
    bytes at the end (`held_bytes`: page-fault samples left out)."""
    rows, _ = listed_rows(doc)
    first = bool((doc.get("at_peak") or {}).get("peak_first"))
    key = "at_peak_bytes" if first else "live_bytes"
    whole = int((doc.get("at_peak") or {}).get("live_bytes") or 0) if first else int(doc["totals"]["live_bytes"])
    ranked = sorted((r for r in rows if held_bytes(r, key)), key=lambda r: -held_bytes(r, key))
    named: list[dict] = []
    for r in ranked[:PEAK_MAX_HOLDERS]:
        if named and (
            held_bytes(r, key) < PEAK_MIN_SHARE * whole
            or sum(held_bytes(x, key) for x in named) >= PEAK_ENOUGH_SHARE * whole
        ):
            break
        named.append(r)
    return named, whole, first


def kept_while_waiting(doc: dict) -> dict | None:
    """The wait location (waits.peak.by_location) whose blocked threads kept most, when at
    least WAIT_MIN_THREADS of them kept memory (allocated outside the functions on their wait
    stacks: waits.held_while_waiting's kept_bytes) and they kept >= WAIT_MIN_SHARE of the live
    peak; None otherwise."""
    pk = (doc.get("waits") or {}).get("peak") or {}
    peak = int(doc["totals"].get("peak_live_bytes") or 0)
    cands = [
        d
        for d in pk.get("by_location") or []
        if d.get("keeping_threads", 0) >= WAIT_MIN_THREADS and peak and d.get("kept_bytes", 0) >= WAIT_MIN_SHARE * peak
    ]
    return max(cands, key=lambda d: (d["kept_bytes"], d["threads"]), default=None)


def _wait_clause(doc: dict, d: dict) -> str:
    """'at +3.5s 7 threads blocked in channel_push provingd.c:420 held 56.0 MiB'."""
    pk = doc["waits"]["peak"]
    when = f"at +{pk['elapsed_s']:.1f}s" if pk.get("elapsed_s") is not None else f"at interval {pk['seq']}"
    return f"{when} {d['threads']} threads blocked in {where_text(d)} held {human_bytes(d['held_bytes'])}"


def _peak_finding(doc: dict, wait: dict | None) -> tuple[dict | None, bool]:
    """The "what held it" finding, merged with the waiting one when the blocked threads hold
    memory of a location it names (returns whether it merged)."""
    named, whole, first = peak_holders(doc)
    if not named:
        return None, False
    key = "at_peak_bytes" if first else "live_bytes"
    parts = [
        f"{where_text(r)} held {human_bytes(held_bytes(r, key))} ({percent(held_bytes(r, key), whole)}"
        + (", an estimate from sampled first touches" if estimated(r, key) else "")
        + ")"
        for r in named
    ]
    if first:
        ap = doc["at_peak"]
        when = f"{ap['elapsed_s']:.1f}s" if ap.get("elapsed_s") is not None else f"interval {ap['seq']}"
        est = int(ap.get("touch_estimate_bytes") or 0)
        part = f", {human_bytes(est)} of it estimated from sampled first touches" if est else ""
        if ap.get("untouched_bytes"):  # residency: mapped beyond the RSS then, not in the live figure
            part += f"; {human_bytes(int(ap['untouched_bytes']))} more mapped, not yet touched"
        head, table, section = f"At the peak ({when}, {human_bytes(whole)} live{part})", "Held at the peak", "sites"
    else:
        head, section = f"At the end ({human_bytes(whole)} live)", "sites"
        table = f"Top {rows_noun(listed_rows(doc)[1])}"
    text = f"{head}, {and_list(parts)}"
    figures = {
        "total_bytes": whole,
        "at_peak": first,
        "estimate": any(estimated(r, key) for r in named),
        "holders": [
            {
                "location": r.get("location"),
                "function": r["frames"][0]["function"] if r.get("frames") else r.get("function"),
                "bytes": held_bytes(r, key),
            }
            for r in named
        ],
    }
    merged = False
    if wait:
        keys = {r.get("location") for r in named}
        of = [h for h in wait.get("held") or [] if h.get("location") in keys]
        if of:
            clause = _wait_clause(doc, wait)
            if len(named) > 1:
                text += f"; {clause}, {human_bytes(of[0]['bytes'])} of it from {of[0]['function']}"
            elif of[0]["bytes"] >= 0.99 * wait["held_bytes"]:
                text += f"; {clause.rsplit(' held ', 1)[0]} held {human_bytes(of[0]['bytes'])} of it"
            else:
                text += f"; {clause}, {human_bytes(of[0]['bytes'])} of it"
            table += "; Held while waiting"
            figures["waiting"] = _wait_figures(wait) | {"of_bytes": of[0]["bytes"], "of_function": of[0]["function"]}
            merged = True
    return finding("peak", text + ".", table, section, **figures), merged


def _wait_figures(d: dict) -> dict:
    return {
        "location": d["location"],
        "function": d["function"],
        "threads": d["threads"],
        "keeping_threads": d["keeping_threads"],
        "held_bytes": d["held_bytes"],
        "kept_bytes": d["kept_bytes"],
    }


def _wait_finding(doc: dict, d: dict) -> dict:
    peak = doc["totals"]["peak_live_bytes"]
    top = d["held"][0] if d.get("held") else None
    most = f", most of it from {top['function']} ({human_bytes(top['bytes'])})" if top else ""
    clause = _wait_clause(doc, d)
    text = (
        f"{clause[0].upper()}{clause[1:]} "
        f"({percent(d['kept_bytes'], peak)} of the live peak kept after the allocating call returned){most}."
    )
    return finding("waiting", text, "Held while waiting", "waits", **_wait_figures(d))


def _growing_finding(doc: dict) -> dict | None:
    rows, by = listed_rows(doc)
    tot = doc["totals"]
    live, dur = int(tot.get("live_bytes") or 0), float(tot.get("duration_s") or 0)
    grow = [
        r
        for r in rows
        if r.get("verdict") == "growing"
        and (r.get("growth_bytes_per_s") or 0) > 0
        and r["growth_bytes_per_s"] * dur >= max(GROW_MIN_SHARE * live, GROW_MIN_BYTES)
    ]
    grow.sort(key=lambda r: -r["growth_bytes_per_s"])
    if not grow:
        return None
    named = grow[:GROW_MAX_NAMED]
    parts = [
        f"{where_text(r)} ({human_rate(r['growth_bytes_per_s'])}"
        + (f", R² {r['growth_r2']:.2f}" if r.get("growth_r2") is not None else "")
        + f", {human_bytes(r['live_bytes'])} live at the end)"
        for r in named
    ]
    more = f" ({len(grow) - len(named)} more growing)" if len(grow) > len(named) else ""
    verb = "is" if len(named) == 1 else "are"
    text = f"{and_list(parts)} {verb} still growing over the last half of the recording{more}."
    return finding(
        "growing",
        text,
        f"Top {rows_noun(by)} (verdict growing)",
        "sites",
        locations=[
            {
                "location": r.get("location"),
                "growth_bytes_per_s": r["growth_bytes_per_s"],
                "growth_r2": r.get("growth_r2"),
                "live_bytes": r["live_bytes"],
            }
            for r in named
        ],
        growing=len(grow),
    )


def _knob(a: dict) -> str:
    fam = registry.family(a.get("kind"))
    return fam.knob_text(allocator_prefix({"name": a.get("name")})) if fam is not None else ""


def _retained_finding(doc: dict) -> dict | None:
    dec = doc.get("rss_decomposition") or {}
    rss = int(dec.get("rss_bytes") or 0)
    allocs = dec.get("allocators")
    if allocs is None and dec.get("retained_known", True) and dec.get("retained_bytes"):
        allocs = [{"name": "glibc", "kind": "glibc", "retained": dec["retained_bytes"]}]  # older traces
    big = [a for a in allocs or [] if rss and a["retained"] >= max(RETAINED_MIN_SHARE * rss, RETAINED_MIN_BYTES)]
    if not big:
        return None
    a = max(big, key=lambda a: a["retained"])
    knob = _knob(a)
    text = (
        f"{a['name']} keeps {human_bytes(a['retained'])} resident that is not live ({percent(a['retained'], rss)} "
        f"of RSS {human_bytes(rss)})" + (f": {knob}" if knob else "") + "."
    )
    return finding(
        "retained",
        text,
        "Totals: RSS split (retained by allocator)",
        "allocators",
        allocator=a["name"],
        retained_bytes=a["retained"],
        rss_bytes=rss,
        knob=knob,
    )


def release_finding(doc: dict) -> dict | None:
    fr = (doc.get("waits") or {}).get("freeing") or {}
    calls = [(f"{r['kind']} on {r['thread']}", r["calls"], r["duration_s"]) for r in fr.get("by_thread") or []]
    calls += [(f"{p['function']} on {p['thread']}", p["calls"], p["duration_s"]) for p in fr.get("purges") or []]
    if not fr.get("purges"):
        calls += [(f"malloc_trim on {t['thread']}", 1, t["duration_s"]) for t in doc.get("trims") or []]
    total = sum(c[2] for c in calls)
    shoot = sum(v["flushes"] for k, v in (fr.get("tlb") or {}).items() if k.startswith("remote"))
    if total < RELEASE_MIN_S and shoot < RELEASE_MIN_SHOOTDOWNS:
        return None
    top = max(calls, key=lambda c: c[2]) if calls else None
    most = f"most: {top[0]}, {duration_text(top[2])} in {top[1]} calls" if top and top[2] else ""
    if total >= RELEASE_MIN_S:
        text = (
            f"Giving memory back took {duration_text(total)} in the calls"
            + (f" ({most})" if most else "")
            + (f", with {shoot} remote TLB shootdowns" if shoot else "")
            + "."
        )
    else:  # the shootdowns alone are news: the calls' time is said as it is, never "0.00s"
        # counted on the target's threads whatever changed the page tables (tlb:tlb_flush), so
        # never said to be caused by the release calls (xz -9: 16449 of them beside one munmap of
        # 36 KiB that released nothing)
        text = (
            f"{shoot} remote TLB shootdowns on its threads (from any page-table change: unmapping, "
            f"mprotect, copy-on-write); giving memory back took {duration_text(total)} in the calls"
            + (f" ({most})" if most else "")
            + "."
        )
    return finding(
        "release_cost", text, "What giving memory back cost", "waits", seconds=total, remote_shootdowns=shoot
    )


def duration_text(s: float) -> str:
    """'1.25s', '3.4 ms', '120 µs', 'no measurable time': a duration never written as 0.00s."""
    if s >= 0.1:
        return f"{s:.2f}s"
    if s >= 0.001:
        return f"{s * 1e3:.1f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.0f} µs"
    return "no measurable time"


def material_losses(totals: dict) -> dict[str, int]:
    """The loss counters that change the picture: all but the byte counts, those normal in
    small numbers (NOISY_LOSSES) and the stacks cut short while an unwind table was built (their
    bytes are all counted; the unwind notes under Totals say where and until when)."""
    return {
        k: v
        for k, v in (totals.get("losses") or {}).items()
        if v and not k.endswith("_bytes") and k not in NOT_LOST and v >= NOISY_LOSSES.get(k, 1)
    }


def loss_text(lost: dict[str, int]) -> str:
    """The three largest losses of material_losses: 'lost_events=12, lost_stacks=3'."""
    return ", ".join(f"{k}={v}" for k, v in sorted(lost.items(), key=lambda kv: -kv[1])[:3])


def _loss_finding(doc: dict) -> dict | None:
    lost = material_losses(doc["totals"])
    if not lost:
        return None
    text = f"Events were lost ({loss_text(lost)}): the figures above are lower bounds; see the advice under Totals."
    return finding("losses", text, "Totals: lost", "header", losses=lost)


def burst(doc: dict) -> bool:
    """Whether the report's peak was a burst worth a finding: mostly freed by the end
    (at_peak.peak_first) by an amount >= BURST_MIN_SHARE of the RSS peak and >= BURST_MIN_BYTES."""
    ap, tot = doc.get("at_peak") or {}, doc["totals"]
    freed = int(ap.get("live_bytes") or 0) - int(tot.get("live_bytes") or 0)
    rss = max(int(tot.get("peak_rss_bytes") or 0), int(tot.get("hwm_bytes") or 0))
    return bool(ap.get("peak_first")) and freed >= max(BURST_MIN_BYTES, BURST_MIN_SHARE * rss)


def _device_finding(doc: dict) -> dict | None:
    """GPU memory (in no host figure): how much is live at the end and which location holds
    most of it, named with the CUDA call (the Top locations table's device column)."""
    tot = doc["totals"]
    dev, peak = tot.get("device_bytes") or 0, tot.get("device_peak_bytes") or 0
    if not peak:
        return None
    rows = sorted(
        (x for x in doc.get("locations") or [] if x.get("device_live_bytes")), key=lambda x: -x["device_live_bytes"]
    )
    where = ""
    if rows and dev:
        top = rows[0]
        call = f" via {top['call']}" if top.get("call") else ""
        where = f", {percent(top['device_live_bytes'], dev)} of it at {where_text(top)}{call}"
    text = (
        f"GPU: {human_bytes(dev)} of device memory live at the end (peak {human_bytes(peak)}){where}; "
        "device memory is in no host figure."
    )
    return finding("device", text, "Top locations (device)", "locations", device_bytes=dev, device_peak_bytes=peak)


def _children_finding(doc: dict) -> dict | None:
    """The work was in forked children the trace does not follow (analysis/children.py): the
    first finding, never "no problem found" about a parent that only waited for them."""
    summary = (doc.get("recording") or {}).get("children")
    said = children_warnings(summary)
    if not said or summary is None:
        return None
    line = said[0]
    return finding(
        "children",
        line[0].upper() + line[1:] + ".",
        "Totals",
        "header",
        children=int(summary["seen"]) + int(summary.get("unseen") or 0),
        cpu_s=summary["cpu_s"],
        target_cpu_s=summary["target_cpu_s"],
    )


def report_findings(doc: dict, end: dict | None = None) -> list[dict]:
    """The findings of an allocscope.report/1 document, most important first (see the module
    docstring); one `no_problem` finding when nothing stands out: nothing growing, nothing
    kept by blocked threads, no allocator retention or release cost worth a line, no material
    loss, no burst (`burst`) and no GPU memory. `end`: how the target ended, when that is news
    (ending.end_finding(doc), which build_report passes: ending.py uses this module's sentence
    pieces, so this module does not import it)."""
    wait = kept_while_waiting(doc)
    others = [f for f in (_growing_finding(doc), _retained_finding(doc), release_finding(doc), _loss_finding(doc)) if f]
    device = _device_finding(doc)
    end = end or _children_finding(doc)  # either is what the trace covers: said first
    if not (end or wait or others or burst(doc) or device):
        tot = doc["totals"]
        return [
            finding(
                "no_problem",
                f"No problem found: {human_bytes(tot['live_bytes'])} live at the end, peak "
                f"{human_bytes(tot['peak_live_bytes'])}; no burst, nothing growing, no blocked "
                "thread kept memory, the allocators keep little that is not live and no events "
                "that matter were lost.",
                "Totals",
                "header",
                live_bytes=tot["live_bytes"],
                peak_live_bytes=tot["peak_live_bytes"],
            )
        ]
    peak, merged = _peak_finding(doc, wait)
    out = [f for f in (end, peak, device, None if merged or not wait else _wait_finding(doc, wait)) if f]
    out += others
    return out[:MAX_FINDINGS]
