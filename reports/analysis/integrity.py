"""A damaged trace said first, and never answered from partial data: the report's and the diff's
`integrity` (what load_trace verified: common/tracefile/integrity.py), and the findings that
depend on a damaged table withheld, a finding of kind `damaged` in their place.

    >>> doc = build_report(trace)            # with_integrity is applied there
    >>> doc["integrity"]["status"]           # 'verified', 'not_verifiable' or 'damaged'

Which tables each finding reads (NEEDS) is a superset of what its sentence states: a finding
whose kind is not listed (no_problem, no_change, a new kind) depends on every table.
"""

from __future__ import annotations

from common.tracefile.integrity import EVERY_TABLE, Integrity

from .findings import MAX_FINDINGS, and_list, finding

_SITES = {"intervals", "sites", "stacks", "symbols", "pyframes", "pycode"}  # the frames' names too
NEEDS: dict[str, set[str]] = {  # finding kind -> the trace tables it is read from
    "peak": _SITES | {"live"},
    "growing": _SITES,
    "device": _SITES,
    "ended": _SITES | {"live", "waits", "blocked", "threads"},
    "waiting": _SITES | {"live", "waits", "blocked", "threads", "flows"},
    "retained": _SITES | {"allocators", "heaps", "census", "maps"},
    "release_cost": {"intervals", "releases", "purges", "events", "stacks", "symbols"},
    "losses": {"intervals"},
    # a diff's
    "out_of_proportion": _SITES | {"live"},
    "changed": _SITES | {"live"},
    "thread_groups": _SITES | {"threads"},
}

WORDS = {  # a finding kind as the damaged finding names it
    "peak": "what held the peak",
    "growing": "what grows",
    "device": "GPU memory",
    "ended": "how it ended",
    "waiting": "held while waiting",
    "retained": "what the allocators keep",
    "release_cost": "the cost of giving memory back",
    "losses": "the losses",
    "no_problem": '"no problem found"',
    "out_of_proportion": "what grew out of proportion",
    "changed": "what changed",
    "thread_groups": "the thread groups",
    "no_change": '"no change"',
}


def integrity_doc(it: Integrity) -> dict:
    """The document's `integrity`: status (verified, not_verifiable, damaged), checksums (the
    kind, null: a trace written before them), parts_verified, parts_unverified (read without a
    checksum), damaged ([{part, table, problem}]: the parts left out), damaged_tables, withheld
    (the kinds of the findings withheld; with_integrity fills it), note (one sentence, null
    when every part read was verified)."""
    return {
        "status": it.status,
        "checksums": it.checksums,
        "parts_verified": it.verified,
        "parts_unverified": list(it.unverified),
        "damaged": [{"part": d.part, "table": d.table, "problem": d.problem} for d in it.damaged],
        "damaged_tables": it.tables,
        "withheld": [],
        "note": it.note(),
    }


def depends(kind: str, tables: list[str]) -> bool:
    """Whether a finding of `kind` reads any of the damaged `tables`."""
    if not tables:
        return False
    needs = NEEDS.get(kind)
    return needs is None or EVERY_TABLE in tables or bool(needs & set(tables))


def withhold(findings: list[dict], tables: list[str], note: str | None) -> tuple[list[dict], list[str]]:
    """(the findings kept, the kinds withheld): a finding that reads a damaged table is
    withheld, and a `damaged` finding comes first when anything is."""
    if not tables:
        return findings, []
    kept = [f for f in findings if not depends(f["kind"], tables)]
    gone = [f["kind"] for f in findings if depends(f["kind"], tables)]
    text = (note or "damaged trace") + "; "
    said = [WORDS.get(k, k) for k in gone]
    text += f"withheld as they read from it: the findings on {and_list(said)}" if gone else "no finding reads it"
    text += "; each damaged part is named on stderr and in `integrity`."
    first = finding("damaged", text[0].upper() + text[1:], "Trace integrity", "header", tables=list(tables))
    return [first, *kept][:MAX_FINDINGS], gone


def with_integrity(doc: dict, it: Integrity) -> dict:
    """A report document with its `integrity` (after `schema`) and its findings withheld where
    they read a damaged table."""
    integ = integrity_doc(it)
    findings, integ["withheld"] = withhold(list(doc.get("findings") or []), integ["damaged_tables"], integ["note"])
    out = {"schema": doc["schema"], "integrity": integ}
    out.update(doc)
    out["findings"] = findings
    return out


def diff_integrity(doc: dict, a: Integrity, b: Integrity) -> dict:
    """A diff document with each trace's `integrity` (traces.a, traces.b), its findings withheld
    where they read a table damaged in either trace, and a warning per damaged trace."""
    ia, ib = integrity_doc(a), integrity_doc(b)
    tables = sorted(set(ia["damaged_tables"]) | set(ib["damaged_tables"]))
    notes = [f"{side}: {i['note']}" for side, i in (("A", ia), ("B", ib)) if i["status"] == "damaged"]
    findings, withheld = withhold(list(doc.get("findings") or []), tables, "; ".join(notes) or None)
    ia["withheld"] = ib["withheld"] = withheld
    traces = doc.get("traces") or {}
    for side, integ in (("a", ia), ("b", ib)):
        if isinstance(traces.get(side), dict):
            traces[side]["integrity"] = integ
    doc["findings"] = findings
    doc["warnings"] = [*notes, *(doc.get("warnings") or [])]
    return doc
