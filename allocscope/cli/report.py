"""`allocscope report TRACE`: a trace as text, JSON, CSV, HTML, pprof or folded stacks. A thin
adapter over reports.analysis and the renderers; heavy imports happen inside."""

from __future__ import annotations

import os
import sys

import click

from common.errors import UsageError

from .base import CONTEXT, Command
from .damage import allow_damaged_option, refuse, tell
from .options import by_option, fold_option, source_option
from .output import emit, progress


@click.command(cls=Command, context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=True, file_okay=True, readable=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "csv", "html", "pprof", "folded"]),
    default="text",
    show_default=True,
    help="text for people; json (allocscope.report/1) for tools; csv of ranked sites; html "
    "(self-contained, offline); pprof (gzipped protobuf for go tool pprof / Pyroscope); "
    "folded stacks for flamegraph.pl / speedscope.",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
@click.option(
    "--top", type=click.IntRange(min=1), default=20, show_default=True, help="Sites and threads to show (text)."
)
@click.option(
    "--sort",
    type=click.Choice(["live", "peak", "growth", "age"]),
    default="live",
    show_default=True,
    help="Rank sites by live bytes at the end, peak live bytes, growth (growing sites first, "
    "then bytes/s), or age of the oldest outstanding allocation.",
)
@click.option(
    "--metric",
    type=click.Choice(["live_bytes", "alloc_bytes", "live_count", "alloc_count", "device_live_bytes"]),
    default="live_bytes",
    show_default=True,
    help="Value of each stack in --format folded (host memory; device_live_bytes: GPU memory).",
)
@click.option(
    "--at",
    "at",
    default="end",
    show_default=True,
    metavar="end|peak|TRIGGER",
    help="pprof and folded: the stacks live at the end, at the moment of the live peak (for "
    "`go tool pprof -diff_base A.pb.gz B.pb.gz` of two runs' peaks), or at a snapshot a trigger kept "
    "(`watch --when-rss`: rss).",
)
@by_option
@fold_option
@source_option
@allow_damaged_option
@click.option(
    "--no-python",
    "no_python",
    is_flag=True,
    help="Leave CPython's frames out: rank by the native place (docs/python.md).",
)
def report(trace, fmt, output, top, sort, metric, at, by, fold, sources, allow_damaged, no_python):
    """Outstanding bytes by location (the place in the code that asked for memory) and by
    thread, totals and losses, from TRACE.

    \b
    Examples:
      allocscope report run.allocscope --sort growth
      allocscope report run.allocscope --format html -o run.html
      allocscope report run.allocscope --format pprof -o heap.pb.gz && go tool pprof -top heap.pb.gz
      allocscope report run.allocscope --format folded | flamegraph.pl > live.svg
      allocscope report a.allocscope --format pprof --at peak -o A.pb.gz   # and B, then:
        go tool pprof -top -diff_base A.pb.gz B.pb.gz

    A location is the innermost frame left after folding allocator wrappers: one line of code.
    Every stack that reaches it (a work-stealing pool reaches one call through many) is summed
    under it, and its largest stacks are shown below it; --by stack lists each stack instead.

    A trace whose parts do not read as written (damaged, truncated, missing: every part is
    checked against the checksums the tracer wrote) is said on stderr part by part and at the
    top of the report, the findings that read a damaged table are withheld, and the command
    exits 5 after the report unless --allow-damaged (docs/trace-format.md#checksums).

    Every form but pprof, folded and csv opens with findings: at most 6 sentences, each with
    its figures and the table it comes from (docs/findings.md).

    The JSON form (schema allocscope.report/1) is a contract other tools read: sites (one per
    folded stack) sorted by --sort (default: live bytes), each with frames innermost first and
    its `location`; locations (one per place, with `stacks`: the ranks of its sites); threads,
    arenas, trims.
    When most of the peak was freed by the end (live at the end <= 25% of the peak), the text
    and HTML forms show the sites that held the peak first.
    """
    from reports.analysis import build_report, only_sources, parse_fold, parse_sources, symbolize_stacks  # noqa: PLC0415
    from reports.render.jsonout import to_json  # noqa: PLC0415
    from reports.render.text import to_text  # noqa: PLC0415
    from reports.trace import load_trace  # noqa: PLC0415

    folding = parse_fold(fold)
    wanted = parse_sources(sources)
    say = progress if sys.stderr.isatty() else None
    if at != "end" and fmt not in ("pprof", "folded"):
        raise UsageError(f"--at {at} is for --format pprof and folded (the other formats show the peak and the end)")
    loaded = load_trace(trace, progress=say)
    tell(loaded)  # each damaged part on stderr, whole; exit 5 after the report (refuse)
    t = only_sources(loaded, wanted)
    at_seq = None
    if at == "peak":
        from reports.analysis import peak_seq  # noqa: PLC0415

        at_seq = peak_seq(t)
    elif at != "end":
        named = {str(x.get("name")): x.get("seq") for x in t.meta.get("triggers") or [] if isinstance(x, dict)}
        if at not in named:
            have = ", ".join(sorted(named)) or "none"
            raise UsageError(f"--at {at}: not end, peak or a snapshot this trace kept (its triggers: {have})")
        at_seq = int(named[at])
    if fmt == "pprof":
        from reports.render.pprof import to_pprof  # noqa: PLC0415

        if output is None and sys.stdout.isatty():
            raise UsageError("--format pprof is binary: give -o FILE (e.g. -o heap.pb.gz)")
        emit(to_pprof(t, fold=folding, at_seq=at_seq), output)
        refuse([t], allow_damaged)
        return
    if fmt == "folded":
        from reports.render.flamegraph import to_folded  # noqa: PLC0415

        emit(to_folded(t, metric=metric, fold=folding, at_seq=at_seq), output)
        refuse([t], allow_damaged)
        return
    stacks = symbolize_stacks(t, say, python=not no_python)
    rep = build_report(t, sort=sort, stacks=stacks, fold=folding, by=by)
    if wanted:
        rep["source_filter"] = wanted
    if fmt == "json":
        text = to_json(rep)
    elif fmt == "csv":
        from reports.render.csvout import to_csv  # noqa: PLC0415

        text = to_csv(rep)
    elif fmt == "html":
        from reports.render.html import to_html  # noqa: PLC0415

        text = to_html(t, rep, stacks=stacks, fold=folding)
    else:
        color = output is None and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
        text = to_text(rep, top=top, color=color)
    emit(text, output)
    refuse([t], allow_damaged)
