"""The report's printed equations ("RSS X = live heap a + ... + shmem f", "glibc resident X =
live a − live not resident b + ..."), built once from the RSS split so that the text, the HTML
page and the JSON say the same terms, and invariants.py checks that each adds up.

An equation is {name, whole_label, whole, terms: [{label, bytes, sign}], note}: whole = Σ sign ×
bytes. A term is its own figure, never a part forced to fit: live bytes that are not resident
(allocated, never touched: xz -9's dictionary), live bytes in an allocator's mappings from before
the attach (not measured as its own), and resident bytes no other term explains are terms with a
name, so a split line is an equation in every mode, launched or attached.

    >>> split_equations(doc["rss_decomposition"])   # [{'name': 'RSS', 'whole': ..., 'terms': [...]}, ...]
"""

from __future__ import annotations

TOLERANCE_SHARE = 0.01  # an equation adds up when |whole − Σ terms| <= 1 % of the whole...
TOLERANCE_MIN_BYTES = 4096  # ...or a page, whichever is more


def term(label: str, n: int, sign: int = 1) -> dict:
    return {"label": label, "bytes": int(n), "sign": sign}


def rss_equation(dec: dict) -> dict:
    """RSS = live heap since the attach + live before the attach (a census measured it) +
    retained + before the attach or retained + other anonymous + file + shmem."""
    terms = [term("live heap since the attach", dec["live_heap_bytes"])]
    if dec.get("live_before_attach_known") or dec.get("live_before_attach_bytes"):
        label = (
            "heap in use (census)"
            if dec.get("mode") == "residency"
            else "allocator internals (in use, never returned by a call)"
            if dec.get("launched")
            else "live before the attach"
        )
        terms.append(term(label, dec.get("live_before_attach_bytes") or 0))
    if dec.get("retained_known", True) and not ("live_or_retained_bytes" in dec and not dec["retained_bytes"]):
        terms.append(term("retained by allocator", dec["retained_bytes"]))
    if dec.get("before_or_retained_bytes"):
        terms.append(term("before the attach or retained", dec["before_or_retained_bytes"]))
    if "live_or_retained_bytes" in dec:
        terms.append(term("heap live or retained (no allocator probes)", dec["live_or_retained_bytes"]))
    other = "other anon"
    if dec.get("unseparated") and not dec.get("launched", True):
        other += f" (with what {', '.join(dec['unseparated'])} held before the attach)"
    terms += [
        term(other, dec["other_anon_bytes"]),
        term("file", dec["file_bytes"]),
        term("shmem", dec["shmem_bytes"]),
    ]
    note = "" if dec.get("retained_known", True) else "allocator retention not separable: inside other anon"
    return {"name": "RSS", "whole_label": "RSS", "whole": int(dec["rss_bytes"]), "terms": terms, "note": note}


def allocator_terms(allocs: list[dict], outside: int, attached: bool) -> None:
    """Each allocator's `live_outside` (live bytes beyond its measured mappings counted in the
    anonymous rest: `outside`, the RSS split's live_outside_bytes, shared out in order),
    `live_not_resident` (the rest of its live bytes beyond its resident: allocated, never
    touched) and `resident_unexplained` (resident bytes no term explains), so that resident =
    live − live_outside − live_not_resident + live_before_attach + retained + before_or_retained
    + resident_unexplained holds exactly. `attached`: the target was attached to (the outside
    bytes lie in mappings made before the attach)."""
    left = max(0, int(outside))
    for a in allocs:
        rest = (
            int(a.get("live_before_attach") or 0)
            + int(a["retained"])
            + int(a.get("before_or_retained") or 0)
            + int(a.get("live_or_retained") or 0)
        )
        gap = int(a["resident"]) - int(a["live"]) - rest
        beyond = max(0, -gap)
        out = min(beyond, left)
        left -= out
        a["live_outside"] = out
        a["live_not_resident"] = beyond - out
        a["resident_unexplained"] = max(0, gap)
        a["outside_label"] = (
            "live in its mappings from before the attach" if attached else "live outside its measured mappings"
        )


def allocator_equation(a: dict) -> dict:
    terms = [term("live", a["live"])]
    if a.get("live_outside"):
        terms.append(term(a.get("outside_label") or "live outside its measured mappings", a["live_outside"], -1))
    if a.get("live_not_resident"):
        terms.append(term("live not resident (allocated, never touched)", a["live_not_resident"], -1))
    if a.get("live_before_attach") is not None:
        terms.append(term(a.get("before_label") or "live before the attach", a["live_before_attach"]))
    if "live_or_retained" in a:
        terms.append(term("live or retained (no allocator probes)", a["live_or_retained"]))
    terms.append(term("retained (free)", a["retained"]))
    if a.get("before_or_retained"):
        terms.append(term("before the attach or retained", a["before_or_retained"]))
    if a.get("resident_unexplained"):
        terms.append(term("resident, not explained by a block seen", a["resident_unexplained"]))
    return {"name": a["name"], "whole_label": "resident", "whole": int(a["resident"]), "terms": terms, "note": ""}


def shared_equations(dec: dict) -> list[dict]:
    """shmem = at the shmem and pinned sites + not traced; file = device-mapped + regular files
    (only when a site holds shared memory or a device file)."""
    if not (dec.get("shmem_attributed_bytes") or dec.get("file_device_bytes")):
        return []
    return [
        {
            "name": "shmem",
            "whole_label": "shmem",
            "whole": int(dec["shmem_bytes"]),
            "terms": [
                term("at sites", dec["shmem_attributed_bytes"]),
                term("not traced", dec["shmem_unattributed_bytes"]),
            ],
            "note": "",
        },
        {
            "name": "file",
            "whole_label": "file",
            "whole": int(dec["file_bytes"]),
            "terms": [
                term("device-mapped", dec["file_device_bytes"]),
                term("regular files", dec["file_regular_bytes"]),
            ],
            "note": "",
        },
    ]


def split_equations(dec: dict | None) -> list[dict]:
    """Every equation of the RSS split `dec` (residency.rss_decomposition): the RSS line, one per
    allocator, then shmem and file; [] without a split."""
    if not dec:
        return []
    return [rss_equation(dec), *(allocator_equation(a) for a in dec.get("allocators") or []), *shared_equations(dec)]


def equation_sum(eq: dict) -> int:
    return sum(t["sign"] * t["bytes"] for t in eq["terms"])


def equation_holds(eq: dict) -> bool:
    """Whether Σ terms is within 1 % (or a page) of the whole."""
    return abs(eq["whole"] - equation_sum(eq)) <= max(TOLERANCE_MIN_BYTES, TOLERANCE_SHARE * abs(eq["whole"]))
