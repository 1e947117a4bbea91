"""The findings of a diff (allocscope.diff/1, diff.diff_traces): what grew out of proportion or
moved, what blocked threads held, thread groups, allocator retention and losses, read from the
diff document as findings.py reads a report (its thresholds and sentence pieces are findings.py's).

    >>> from reports.analysis.diff_findings import diff_findings
    >>> diff_findings(diff_traces(a, b, per="pw"))   # [{kind, text, table, section, figures}, ...]
"""

from __future__ import annotations

from ..units import human_bytes, human_delta
from .findings import (
    DIFF_MIN_SHARE,
    GREW_FASTER,
    GROUP_MIN_CHANGE,
    MAX_FINDINGS,
    RETAINED_MIN_BYTES,
    RETAINED_MIN_SHARE,
    WAIT_MIN_SHARE,
    WAIT_MIN_THREADS,
    and_list,
    finding,
    listed_rows,
    loss_text,
    material_losses,
    percent,
    rows_noun,
    where_text,
)


def _side(doc: dict, x: str) -> str:
    labels = doc.get(x) or {}
    return " ".join(f"{k}={v}" for k, v in labels.items()) or x.upper()


def _scaling_findings(doc: dict) -> list[dict]:
    rows, by = listed_rows(doc)
    per = doc["per"]
    flagged = sorted((r for r in rows if r.get("flagged")), key=lambda r: -(r.get("excess_bytes") or 0))
    below = ""
    if not flagged:
        # Nothing past the flag: the location that grew most beyond linear scaling, if it did by
        # GREW_FASTER and by a share of the change that matters (a pile-up that a busy run of A
        # also showed in part still stands out here), said to be below the flag.
        total = sum(abs(r.get("delta_bytes") or 0) for r in rows) or 1
        flagged = sorted(
            (
                r
                for r in rows
                if (r.get("scaling") or 0) > GREW_FASTER
                and (r.get("excess_bytes") or 0) > 0
                and (r.get("delta_bytes") or 0) >= 0.25 * total
            ),
            key=lambda r: -(r.get("excess_bytes") or 0),
        )
        below = ", below the flag's 1.5x"
    out = []
    for r in flagged[:3]:
        ratio = "new in B" if r.get("ratio") is None else f"{r['ratio']:.2f}x"
        lin = f"{r['scaling']:.2f}x linear scaling{below}, " if r.get("scaling") is not None else ""
        text = (
            f"{where_text(r)} grew out of proportion to {per['label']}: "
            f"peak {human_bytes(r['a_peak_live_bytes'])} → {human_bytes(r['b_peak_live_bytes'])}, "
            f"{ratio} where {per['label']} {per['a']:g}→{per['b']:g} "
            f"predicts {per['expected_ratio']:.2f}x ({lin}{human_delta(r.get('excess_bytes'))} beyond it)."
        )
        out.append(
            finding(
                "out_of_proportion",
                text,
                f"{rows_noun(by).capitalize()} (! = flagged)",
                "locations",
                location=r.get("location"),
                function=r.get("function"),
                ratio=r.get("ratio"),
                expected_ratio=per["expected_ratio"],
                scaling=r.get("scaling"),
                a_peak_live_bytes=r["a_peak_live_bytes"],
                b_peak_live_bytes=r["b_peak_live_bytes"],
                excess_bytes=r.get("excess_bytes"),
            )
        )
    return out


def _change_findings(doc: dict) -> list[dict]:
    rows, by = listed_rows(doc)
    tot = doc["totals"]
    big = max(tot["a"]["peak_live_bytes"], tot["b"]["peak_live_bytes"])
    moved = [r for r in rows if big and abs(r["delta_bytes"]) >= DIFF_MIN_SHARE * big and not r.get("flagged")]
    moved.sort(key=lambda r: -abs(r["delta_bytes"]))
    out = []
    for r in moved[:2]:
        ratio = (
            "new in B"
            if r.get("ratio") is None and r.get("in") == "b"
            else "gone in B"
            if r.get("in") == "a"
            else f"{r['ratio']:.2f}x"
        )
        verb = "grew" if r["delta_bytes"] > 0 else "shrank"
        text = (
            f"{where_text(r)}'s peak {verb} {human_bytes(r['a_peak_live_bytes'])} → "
            f"{human_bytes(r['b_peak_live_bytes'])} ({human_delta(r['delta_bytes'])}, {ratio}; "
            f"{percent(abs(r['delta_bytes']), big)} of the larger live peak)."
        )
        out.append(
            finding(
                "changed",
                text,
                rows_noun(by).capitalize(),
                "locations",
                location=r.get("location"),
                delta_bytes=r["delta_bytes"],
                ratio=r.get("ratio"),
            )
        )
    return out


def _diff_wait_finding(doc: dict) -> dict | None:
    tot = doc["totals"]
    big = max(tot["a"]["peak_live_bytes"], tot["b"]["peak_live_bytes"])
    rows = [
        w
        for w in doc.get("waits") or []
        if big
        and max(w["a_threads"], w["b_threads"]) >= WAIT_MIN_THREADS
        and abs(w.get("b_kept_bytes", 0) - w.get("a_kept_bytes", 0)) >= WAIT_MIN_SHARE * big
    ]
    if not rows:
        return None
    w = max(rows, key=lambda w: abs(w.get("b_kept_bytes", 0) - w.get("a_kept_bytes", 0)))

    def thr(n: int) -> str:
        return f"{n} thread{'' if n == 1 else 's'}"

    text = (
        f"Threads blocked in {where_text(w)} held {human_bytes(w['a_held_bytes'])} ({thr(w['a_threads'])}) in A "
        f"and {human_bytes(w['b_held_bytes'])} ({thr(w['b_threads'])}) in B, at each run's peak of memory "
        f"held while waiting ({human_delta(w['held_delta'])})."
    )
    return finding(
        "waiting",
        text,
        "Held while waiting, A vs B",
        "waits",
        location=w["location"],
        a_threads=w["a_threads"],
        b_threads=w["b_threads"],
        a_held_bytes=w["a_held_bytes"],
        b_held_bytes=w["b_held_bytes"],
        held_delta=w["held_delta"],
    )


def _group_finding(doc: dict) -> dict | None:
    tot = doc["totals"]
    big = max(tot["a"]["peak_live_bytes"], tot["b"]["peak_live_bytes"])
    moved = [
        g
        for g in doc.get("thread_groups") or []
        if big
        and abs(g["peak_delta_bytes"]) >= DIFF_MIN_SHARE * big
        and abs(g["peak_delta_bytes"]) >= GROUP_MIN_CHANGE * max(g["a_peak_live_bytes"], g["b_peak_live_bytes"])
    ]
    if not moved:
        return None
    parts = [
        f"{g['group']} {human_bytes(g['a_peak_live_bytes'])} → {human_bytes(g['b_peak_live_bytes'])} "
        f"({human_delta(g['peak_delta_bytes'])}, {g['a_threads']} → {g['b_threads']} threads)"
        for g in moved[:2]
    ]
    text = f"Thread groups whose peak moved: {and_list(parts)}."
    return finding(
        "thread_groups",
        text,
        "Thread groups",
        "groups",
        groups=[{"group": g["group"], "peak_delta_bytes": g["peak_delta_bytes"]} for g in moved[:2]],
    )


def _diff_retained_finding(doc: dict) -> dict | None:
    tot = doc["totals"]
    rss = max(tot["a"]["rss_bytes"], tot["b"]["rss_bytes"])
    rows = [
        x
        for x in doc.get("allocators") or []
        if rss and abs(x["retained_delta"]) >= max(RETAINED_MIN_SHARE * rss, RETAINED_MIN_BYTES)
    ]
    if not rows:
        return None
    x = rows[0]
    text = (
        f"{x['name']} keeps {human_bytes(x['a_retained'])} resident and not live in A, "
        f"{human_bytes(x['b_retained'])} in B ({human_delta(x['retained_delta'])})."
    )
    return finding(
        "retained",
        text,
        "What each allocator keeps",
        "allocators",
        allocator=x["name"],
        retained_delta=x["retained_delta"],
    )


def _diff_loss_finding(doc: dict) -> dict | None:
    tot = doc["totals"]
    sides = {x: material_losses(tot[x]) for x in ("a", "b")}
    if not any(sides.values()):
        return None
    text = (
        "; ".join(f"{x.upper()} lost events ({loss_text(v)})" for x, v in sides.items() if v)
        + ": its figures are lower bounds."
    )
    return finding("losses", text, "Totals: lost", "totals", **{f"{x}_losses": v for x, v in sides.items()})


def diff_findings(doc: dict) -> list[dict]:
    """The findings of an allocscope.diff/1 document: with `per`, the locations flagged as
    grown out of proportion (most excess first; growth in proportion is what `per` expects),
    without it the locations whose peak moved by >= DIFF_MIN_SHARE of the larger live peak;
    then what blocked threads held, the thread groups
    whose peak moved, allocator retention and losses; one `no_change` finding when none."""
    out = _scaling_findings(doc) if doc.get("per") else _change_findings(doc)
    out += [
        f
        for f in (_diff_wait_finding(doc), _group_finding(doc), _diff_retained_finding(doc), _diff_loss_finding(doc))
        if f
    ]
    if not out:
        tot = doc["totals"]
        a, b = tot["a"]["peak_live_bytes"], tot["b"]["peak_live_bytes"]
        noun = rows_noun(listed_rows(doc)[1])[:-1]
        what = (
            f"no {noun} grew out of proportion to {doc['per']['label']}"
            if doc.get("per")
            else f"no {noun} moved by {DIFF_MIN_SHARE:.0%} of the live peak"
        )
        return [
            finding(
                "no_change",
                f"No material change: live peak {human_bytes(a)} → {human_bytes(b)}; {what}, "
                "no thread group's peak moved and no blocked threads kept more.",
                "Totals",
                "totals",
                a_peak_live_bytes=a,
                b_peak_live_bytes=b,
            )
        ]
    return out[:MAX_FINDINGS]
