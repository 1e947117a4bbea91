"""`allocscope diff TRACE_A TRACE_B`: compare two traces. A thin adapter over reports.analysis.diff; heavy
imports happen inside."""

from __future__ import annotations

import os
import sys

import click

from .base import CONTEXT, Command
from .damage import allow_damaged_option, refuse, tell
from .options import by_option, fold_option, source_option
from .output import emit, progress

SORTS = ("delta", "live", "alloc", "ratio", "excess", "device")  # reports.analysis.diff.DIFF_SORTS, without pandas


@click.command(cls=Command, context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path(dir_okay=True, file_okay=True, readable=False))
@click.argument("trace_b", type=click.Path(dir_okay=True, file_okay=True, readable=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
    help="text for people; json (allocscope.diff/1) for tools; html: one offline page (both "
    "timelines, A/B bars, a differential flame graph). For pprof, write `report --format pprof "
    "--at peak` of each trace and run `go tool pprof -diff_base A.pb.gz B.pb.gz`.",
)
@click.option(
    "--sort",
    type=click.Choice(SORTS),
    default="delta",
    show_default=True,
    help="Order sites by |peak delta|, |live-at-end delta|, |allocated delta|, B/A ratio, "
    "|excess over linear scaling| (needs --per), or |GPU memory peak delta|.",
)
@click.option(
    "--per",
    metavar="LABEL",
    help="Normalize by a numeric label both traces carry (e.g. --per pw): flag sites that grew "
    "out of proportion to LABEL_B/LABEL_A.",
)
@click.option(
    "--top", type=click.IntRange(min=1), default=20, show_default=True, help="Sites and thread groups to show (text)."
)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
@by_option
@fold_option
@source_option
@allow_damaged_option
def diff(trace_a, trace_b, fmt, sort, per, top, output, by, fold, sources, allow_damaged):
    """Compare two traces: which places in the code and thread pools hold more memory in B than in A.

    Locations (the innermost frame after folding wrappers: function, file:line) are matched by
    symbolized frame (function, module, file, line), never by address or stack, so runs with
    different PIDs, address layouts and work-stealing paths compare; wrappers (built-in and
    --fold) are folded out of both traces first. --by stack matches whole stacks instead. With
    --per LABEL, a location whose B/A
    peak ratio is more than 1.5 x LABEL_B/LABEL_A (and whose growth is >= 1% of the total
    change) is flagged with ! and listed first: it grew out of proportion to LABEL.

    \b
    Examples:
      allocscope diff pw10.allocscope pw12.allocscope --per pw
      allocscope diff before.allocscope after.allocscope --format json -o diff.json
      allocscope diff pw10.allocscope pw12.allocscope --per pw --format html -o diff.html

    GPU memory (CUDA device memory) is compared in columns of its own (a GPU section in text;
    a_/b_device_peak_bytes, device_peak_delta_bytes... in JSON), never in the host figures.

    A damaged trace (a part not as written, truncated or missing) is said on stderr and at the
    top, the findings that read a damaged table are withheld, and the command exits 5 after
    the diff unless --allow-damaged.

    Every form opens with findings: at most 6 sentences, each with its figures and the table
    it comes from (docs/findings.md).

    The JSON form (schema allocscope.diff/1): findings, a, b (labels...), sites (per stack: frames,
    a_peak_live_bytes, b_peak_live_bytes, delta_bytes, ...), locations (the same per location,
    with its `location` key), totals, thread_groups.
    """
    from reports.analysis import only_sources, parse_fold, parse_sources  # noqa: PLC0415
    from reports.analysis.diff import diff_document, summarize  # noqa: PLC0415
    from reports.render.diff_text import diff_to_text  # noqa: PLC0415
    from reports.render.jsonout import to_json  # noqa: PLC0415
    from reports.trace import load_trace  # noqa: PLC0415

    folding = parse_fold(fold)
    wanted = parse_sources(sources)
    say = progress if sys.stderr.isatty() else None
    a = only_sources(load_trace(trace_a, progress=say), wanted)
    b = only_sources(load_trace(trace_b, progress=say), wanted)
    tell(a), tell(b)  # each damaged part on stderr, whole; exit 5 after the diff (refuse)
    side_a, side_b = summarize(a, say, folding, by), summarize(b, say, folding, by)
    doc = diff_document(side_a, side_b, per=per, sort=sort, fold=folding, by=by)
    if wanted:
        doc["source_filter"] = wanted
    if fmt == "json":
        text = to_json(doc)
    elif fmt == "html":
        from reports.render.html_diff import to_diff_html  # noqa: PLC0415

        text = to_diff_html(a, b, doc, stacks_a=side_a.stacks, stacks_b=side_b.stacks, fold=folding)
    else:
        color = output is None and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
        text = diff_to_text(doc, top=top, color=color)
    emit(text, output)
    refuse([a, b], allow_damaged)
