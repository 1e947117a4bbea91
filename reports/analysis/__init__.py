"""Turn a Trace into ranked tables. Functions are verbs returning DataFrames or plain dicts;
renderers (reports.render) only format what these return, and the CLI only calls these.

A *site* is the symbolized call stack with allocator and allocator-wrapper frames folded away
(innermost first); the same code gives the same site in every run, whatever the addresses. A
*location* is the innermost frame of a site, the place in the code that asked for memory: the
stacks that reach it (a work-stealing pool reaches one call through many) are summed under it.

This module builds the report document and re-exports the pieces, which live by concern in this
package: stacks (symbolizing, folding, locations), sources, timeline (series, growth, verdicts),
sites (ranked tables), threads, totals, residency (arenas, the RSS split), allocator_memory (each
allocator's retained and released memory), advice, releases (trims and releases).

Python API (notebooks get exactly what `allocscope report` prints):

    >>> from reports.trace import load_trace
    >>> from reports import analysis as A
    >>> t = load_trace("pw12.allocscope")
    >>> stacks = A.symbolize_stacks(t)            # symbolize once, pass to the others
    >>> A.rank_sites(t, stacks, sort="growth")    # one row per site: live, peak, growth, age, verdict
    >>> A.site_timeline(t, stacks)                # live bytes per site per interval
    >>> A.thread_table(t); A.thread_group_table(t); A.flow_table(t)
    >>> A.totals(t)                               # RSS, live, peaks, losses
    >>> A.build_report(t, sort="peak")            # the allocscope.report/1 document

Every DataFrame-returning function documents its columns. Byte counts are int64; times are
seconds (float) measured from the start of the recording unless stated otherwise.

Verdicts (see `verdict` for the exact rules): each site is *freed*, *transient*, *growing* or
*plateaued*, judged from its live-bytes timeline.
"""

from __future__ import annotations

from common.errors import UsageError
from common.tracefile.reader import Trace

from .advice import allocator_advice, cuda_mapped, residency_advice
from .allocator_memory import allocator_releases
from .children import children_summary, children_warnings
from .ending import end_finding, recording_end
from .findings import report_findings
from .integrity import with_integrity
from .invariants import check_report
from .releases import RELEASE_KINDS, release_table, releases_by_thread, trims  # noqa: F401
from .residency import (  # noqa: F401
    ARENA_COLUMNS,
    arena_table,
    live_bytes_by_api,
    rss_decomposition,
    shared_split,
)
from .sites import (  # noqa: F401
    DEVICE_SITE_KEYS,
    DEVICE_SUMS,
    RANK_COLUMNS,
    SORT_KEYS,
    at_peak,
    gpu_summary,
    oldest_ages,
    rank_sites,
    sampling_error,
    site_dict,
    site_table,
    site_timeline,
    sort_sites,
)
from .sources import (  # noqa: F401
    CUDA_HOST_SOURCES,
    CUDA_SOURCES,
    DEVICE_FILE_SOURCES,
    DEVICE_SOURCES,
    REGISTER_API,
    SHMEM_SOURCES,
    by_source,
    is_device,
    live_by_source,
    only_sources,
    parse_sources,
    source_layer,
)
from .stacks import (  # noqa: F401
    APP_WRAPPERS,
    DEFAULT_FOLDING,
    GROUPINGS,
    UNKNOWN_STACK,
    USER_FOLD,
    WRAPPER_PATTERNS,
    Folding,
    FrameInfo,
    SiteKey,
    collapse_recursion,
    fold_frames,
    folded_wrappers,
    frame_key_text,
    group_of,
    is_allocator_entry,
    is_wrapper,
    key_quality,
    located_extras,
    location_key,
    parse_fold,
    symbolize_stack_rows,
    symbolize_stacks,
    with_python_rows,
)
from .threads import (  # noqa: F401
    THREAD_COLUMNS,
    THREAD_GROUP_COLUMNS,
    flow_table,
    split_device,
    thread_group,
    thread_group_table,
    thread_table,
)
from .timeline import (  # noqa: F401
    FIT_TAIL_FRACTION,
    GROWTH_MIN_R2,
    GROWTH_MIN_RISE,
    MIN_FIT_POINTS,
    PEAK_FIRST_MAX_FRACTION,
    TIMELINE_POINTS,
    TRANSIENT_MAX_FRACTION,
    elapsed_s,
    end_time_ns,
    fit_growth,
    fit_window,
    growth_table,
    json_num,
    key_timeline,
    peak_first,
    peak_seq,
    timeline_points,
    verdict,
)
from .totals import (  # noqa: F401
    LOSS_ADVICE,
    advice,
    losses,
    mode_notes,
    pending_notes,
    totals,
    unwind_pending,
)
from .touches import estimate_touches
from .waits import held_while_waiting

REPORT_SCHEMA = "allocscope.report/1"


def location_dict(r, names: dict[int, str], points: list[int], site_rank: dict[SiteKey, int]) -> dict:
    """One row of rank_sites(by=location or function) as an allocscope.report/1 location: the
    keys of a site (`frames`: its largest stack, folded) and location (the stable key,
    stacks.location_key), function, module, file, line (of the location's frame), key_quality
    (stacks.key_quality: line, function or address), n_stacks and stacks (the ranks in
    `sites` of its stacks, holding most first)."""
    f = r.site[0]
    return {
        **site_dict(r, names, points),
        "location": location_key(r.site),
        "function": f.function,
        "module": f.module,
        "file": f.file,
        "line": f.line,
        **located_extras(f),
        "key_quality": key_quality(f),
        "n_stacks": int(r.n_stacks),
        "stacks": [site_rank[x] for x in r.stacks if x in site_rank],
    }


def build_report(
    trace: Trace, progress=None, sort: str = "live", stacks=None, fold: Folding | None = None, by: str = "location"
) -> dict:
    """The allocscope.report/1 document: what `report --format json` prints. Sites (one per
    folded stack) and locations (one per place in the code, stacks.group_of; `by` function:
    one per function) are ordered (and `rank`ed) by `sort` (see rank_sites) whatever
    `at_peak.peak_first` says (that is for the text and HTML renderers, which lead with
    `at_peak_rank` then); each site's and location's `timeline` holds its live bytes at the
    intervals listed once in `timeline_seq`; every site names its `location`. `by` (location,
    function, stack) is what people-facing renderers list; the document has both lists
    whatever it is (`by` stack: locations by location). `stacks` (from symbolize_stacks) saves
    symbolizing again when the caller has them; `fold` (parse_fold) adds wrappers to fold,
    listed in `folded`. `findings` (findings.report_findings) comes first: the answer
    in at most 6 sentences, each naming the table it comes from. Every document is checked
    for parts larger than their whole (invariants.check_report: `recording.invariants`)."""
    if by not in GROUPINGS:
        raise UsageError(f"unknown grouping {by!r}; choose one of {', '.join(GROUPINGS)}")
    trace = estimate_touches(trace)
    if stacks is None:
        stacks = symbolize_stacks(trace, progress)
    sites = rank_sites(trace, stacks, sort=sort, fold=fold)
    loc_by = "location" if by == "stack" else by
    locs = rank_sites(trace, stacks, sort=sort, fold=fold, by=loc_by)
    site_rank = {s: int(r) for s, r in zip(sites["site"], sites["rank"])}
    threads = thread_table(trace)
    names = trace.thread_names()
    tot = totals(trace)
    peak, peak_rank = at_peak(trace, tot, sites)
    _, loc_peak_rank = at_peak(trace, tot, locs)
    # one live peak: the composition at the peak never above the totals' figure
    tot["peak_live_bytes"] = max(int(tot["peak_live_bytes"]), int(peak["live_bytes"]))
    sample_bytes = int((trace.meta.get("sampling") or {}).get("sample_bytes", 0) or 0)
    arenas = arena_table(trace)
    dec = rss_decomposition(trace, arenas, tot["live_by_source"])
    meta = trace.meta
    tgt = meta.get("target") or {}
    points = timeline_points(trace.last_seq)
    doc = {
        "schema": REPORT_SCHEMA,
        "target": {
            "pid": tgt.get("pid"),
            "comm": tgt.get("comm"),
            "exe": tgt.get("exe"),
            "labels": dict(meta.get("labels") or {}),
        },
        "recording": {
            "complete": trace.complete,
            "end_reason": meta.get("end_reason"),
            "end": recording_end(meta),
            "interval_s": meta.get("interval_s"),
            "allocator": (meta.get("probes") or {}).get("allocator"),
            "allocator_kind": (meta.get("probes") or {}).get("allocator_kind"),
            "allocators": list((meta.get("probes") or {}).get("allocators") or []),
            "probes": meta.get("probes"),
            "warnings": list(trace.warnings) + children_warnings(children_summary(meta)),
            "children": children_summary(meta),  # forked children, not traced (analysis/children.py)
            "unwind_pending": unwind_pending(trace),
        },
        "totals": tot,
        "advice": mode_notes(trace)
        + advice(trace, tot)
        + residency_advice(arenas, dec, cuda_mapped(meta, tot["live_by_source"]))
        + allocator_advice(dec, trace)
        + pending_notes(unwind_pending(trace)),
        "sort": sort,
        "timeline_seq": [i + 1 for i in points],
        "at_peak": peak,
        "folded": folded_wrappers(stacks.values(), fold),
        "by": by,
        "sites": [
            dict(
                site_dict(r, names, points),
                at_peak_rank=peak_rank[int(r.rank)],
                location=location_key(group_of(r.site, loc_by)),
                **({"live_bytes_error": sampling_error(int(r.live_bytes), sample_bytes)} if sample_bytes else {}),
            )
            for r in sites.itertuples()
        ],
        "locations": [
            dict(
                location_dict(r, names, points, site_rank),
                at_peak_rank=loc_peak_rank[int(r.rank)],
                **({"live_bytes_error": sampling_error(int(r.live_bytes), sample_bytes)} if sample_bytes else {}),
            )
            for r in locs.itertuples()
        ],
        "gpu": gpu_summary(trace, tot, sites, locs),
        "threads": [
            {k: (r[k] if k == "name" else int(r[k])) for k in THREAD_COLUMNS} for r in threads.to_dict("records")
        ],
        "thread_groups": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in thread_group_table(trace).to_dict("records")
        ],
        "flows": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in flow_table(trace).to_dict("records")
        ],
        "arenas": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in arenas.to_dict("records")
        ],
        "rss_decomposition": dec,
        "trims": trims(trace),
        "releases": releases_by_thread(trace),
        "allocator_releases": allocator_releases(trace)[1],
        "waits": held_while_waiting(trace, stacks),
    }
    out = {"schema": REPORT_SCHEMA, "findings": report_findings(doc, end_finding(doc)), **doc}
    check_report(out)
    return with_integrity(out, trace.integrity)  # a damaged table's findings withheld (integrity.py)
