"""No part larger than the whole: cheap checks of a finished report document, run by
build_report on every report, in every mode. A violation is a figure the process itself
contradicts (an allocator resident beyond the RSS it is part of, a split whose part outgrows its
whole, a printed equation of the split that does not add up within 1 %, a row holding more at the
peak than the live total then, a residency-mode composition above the RSS high-water, a finding
stating a share over 100 %): the report says so in `recording.invariants` and among
`recording.warnings`; under ALLOCSCOPE_INVARIANTS=fail (the test suite sets it) build_report
raises instead, so every report a test builds is checked.

    >>> report_violations(doc)   # ['glibc resident 146.5 MiB > RSS 16.9 MiB', ...]
"""

from __future__ import annotations

import os
import re

from ..units import human_bytes
from .equations import equation_holds, equation_sum, split_equations

# RSS and the allocators' pages are read a few ms apart, the target still running: a part may
# outgrow its whole by max(SLACK_BYTES, SLACK_SHARE of it) before it is a contradiction
SLACK_BYTES, SLACK_SHARE = 256 << 10, 0.02
STRICT_ENV = "ALLOCSCOPE_INVARIANTS"  # "fail": build_report raises on a violation
SPLIT_PARTS = (
    "live_heap_bytes",
    "live_before_attach_bytes",
    "retained_bytes",
    "before_or_retained_bytes",
    "live_or_retained_bytes",
    "other_anon_bytes",
    "file_bytes",
    "shmem_bytes",
)
PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")


class InvariantError(AssertionError):
    """A report contradicts itself (raised only under ALLOCSCOPE_INVARIANTS=fail)."""


def _n(v) -> int:
    """An int of a document's figure; 0 for None or NaN (pandas' missing values)."""
    try:
        return int(v) if v is not None and v == v else 0
    except (TypeError, ValueError):
        return 0


def _known(v) -> bool:
    return v is not None and v == v


def _over(part: int, whole: int) -> bool:
    return part > whole + max(SLACK_BYTES, SLACK_SHARE * whole)


def _split(dec: dict) -> list[str]:
    out: list[str] = []
    rss = _n(dec.get("rss_bytes"))
    if rss <= 0:
        return out
    for k in SPLIT_PARTS:
        v = _n(dec.get(k))
        if v < 0 or _over(v, rss):
            out.append(f"RSS split: {k} {human_bytes(v)} outside 0..RSS {human_bytes(rss)}")
    total = _n(dec.get("sum_bytes"))
    if _over(total, rss):
        out.append(f"RSS split: the parts sum to {human_bytes(total)} > RSS {human_bytes(rss)}")
    res = dec.get("allocator_resident_bytes")
    if _known(res) and _over(_n(res), rss):
        out.append(f"RSS split: the allocators' resident {human_bytes(_n(res))} > RSS {human_bytes(rss)}")
    for a in dec.get("allocators") or []:
        name, ar = a.get("name", "?"), _n(a.get("resident"))
        if _over(ar, rss):
            out.append(f"{name} resident {human_bytes(ar)} > RSS {human_bytes(rss)}")
        inner = _n(a.get("retained")) + _n(a.get("live_before_attach"))
        if _over(inner, ar):
            out.append(f"{name}: retained + live before the attach {human_bytes(inner)} > resident {human_bytes(ar)}")
    return out


def _arenas(doc: dict, rss: int) -> list[str]:
    out: list[str] = []
    known = [a for a in doc.get("arenas") or [] if _known(a.get("resident_bytes"))]
    total = sum(_n(a["resident_bytes"]) for a in known)
    if rss > 0 and _over(total, rss):
        out.append(f"arenas: resident {human_bytes(total)} > RSS {human_bytes(rss)}")
    for a in known:
        inner = _n(a.get("retained_bytes")) + _n(a.get("live_before_bytes"))
        if _over(inner, _n(a["resident_bytes"])):
            out.append(
                f"arena {a.get('id')}: retained + live before the attach {human_bytes(inner)} "
                f"> its resident {human_bytes(_n(a['resident_bytes']))}"
            )
    return out


def _findings(doc: dict) -> list[str]:
    out: list[str] = []
    for i, f in enumerate(doc.get("findings") or [], 1):
        over = [p for p in PERCENT.findall(str(f.get("text") or "")) if float(p) > 100.05]
        if over:
            out.append(f"finding {i} states a share over 100 %: {', '.join(p + '%' for p in over)}")
    return out


def _equations(dec: dict) -> list[str]:
    """Every printed equation of the split (the RSS line, each allocator's, shmem and file) adds
    up within 1 %, and the document's equations are those of its split (none dropped)."""
    out: list[str] = []
    eqs = dec.get("equations")
    if eqs is None and dec:
        eqs = split_equations(dec)
    for e in eqs or []:
        if not equation_holds(e):
            terms = " ".join(("+ " if t["sign"] > 0 else "− ") + human_bytes(t["bytes"]) for t in e["terms"])
            name = "" if e["name"] == e["whole_label"] else e["name"] + " "
            out.append(
                f"{name}{e['whole_label']} {human_bytes(e['whole'])} = {terms.lstrip('+ ')} "
                f"does not add up (the terms sum to {human_bytes(equation_sum(e))})"
            )
    rss = next((e for e in eqs or [] if e["name"] == "RSS"), None)
    if rss is not None and rss["whole"] != _n(dec.get("rss_bytes")):
        out.append(
            f"RSS split: its equation says RSS {human_bytes(rss['whole'])}, "
            f"the split {human_bytes(_n(dec.get('rss_bytes')))}"
        )
    return out


def peak_violations(doc: dict) -> list[str]:
    """The peak told one way: no row (site or location) holding more at the peak than the live
    total then; the live total at the peak no more than the totals' live peak; in residency mode
    (sampled first touches, an estimate; mapped pages not yet touched taken off the exact rows,
    analysis/touches.py) no composition above the RSS high-water, whatever part is exact (issue
    50: mapped partitions counted whole before their pages were touched), unless the peak is
    where the RSS was not measured (mapped after the last read of a target gone)."""
    out: list[str] = []
    peak, tot = doc.get("at_peak") or {}, doc.get("totals") or {}
    whole = _n(peak.get("live_bytes"))
    if _over(whole, _n(tot.get("peak_live_bytes"))):
        out.append(
            f"at the peak: live {human_bytes(whole)} > the live peak {human_bytes(_n(tot.get('peak_live_bytes')))}"
        )
    rows = [*(doc.get("sites") or []), *(doc.get("locations") or [])]
    big = max(rows, key=lambda r: _n(r.get("at_peak_bytes")), default=None)
    if big is not None and _over(_n(big.get("at_peak_bytes")), whole):
        out.append(
            f"at the peak: a row holds {human_bytes(_n(big['at_peak_bytes']))} > the live total {human_bytes(whole)}"
        )
    if peak.get("estimate"):
        # the exact bytes mapped after the last RSS read (a target gone without an OOM mark)
        # were not measured: nothing contradicts them
        hwm = (
            _n(tot.get("hwm_bytes"))
            if peak.get("rss_known", True)
            else max(_n(tot.get("hwm_bytes")), _n(peak.get("exact_bytes")))
        )
        if hwm and _over(whole, hwm):
            out.append(
                f"at the peak: the composition {human_bytes(whole)} > the RSS high-water {human_bytes(hwm)} "
                "(residency mode: first touches and mapped pages are counted up to the RSS)"
            )
    return out


def report_violations(doc: dict) -> list[str]:
    """Each way the allocscope.report/1 document `doc` (findings included) contradicts itself:
    an allocator's resident, or all of them, beyond the RSS at the end; a part of the RSS split
    outside 0..RSS, or the parts summing beyond it; an allocator's or arena's retained plus live
    before the attach beyond its resident; a finding stating a share over 100 %. [] when none."""
    dec = doc.get("rss_decomposition") or {}
    rss = _n(dec.get("rss_bytes")) or _n((doc.get("totals") or {}).get("rss_bytes"))
    return _split(dec) + _equations(dec) + _arenas(doc, rss) + _findings(doc) + peak_violations(doc)


def check_report(doc: dict) -> list[str]:
    """report_violations(doc), recorded in the document (`recording.invariants`, and each among
    `recording.warnings` as 'report check: ...'); raised (InvariantError) under
    ALLOCSCOPE_INVARIANTS=fail."""
    bad = report_violations(doc)
    rec = doc.setdefault("recording", {})
    rec["invariants"] = bad
    if bad:
        rec["warnings"] = [*(rec.get("warnings") or []), *(f"report check: {b}" for b in bad)]
        if os.environ.get(STRICT_ENV) == "fail":
            raise InvariantError("; ".join(bad))
    return bad
