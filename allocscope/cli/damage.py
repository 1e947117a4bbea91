"""A damaged trace (a part not as written, truncated or missing: common/tracefile/integrity.py)
told on stderr part by part, whole, and an exit with the trace-file code (5) after the report
unless --allow-damaged. Shared by `report` and `diff`. No heavy imports."""

from __future__ import annotations

import click

from common.errors import TraceFileError

ALLOW_HELP = (
    "Exit 0 even when a part of the trace is damaged, truncated or missing (exit 5 otherwise). "
    "The damage is still said: each part on stderr, at the top of the report, in the JSON's "
    "`integrity`; the findings that read a damaged table are withheld either way."
)


def allow_damaged_option(f):
    """--allow-damaged: a damaged trace's report exits 0."""
    return click.option("--allow-damaged", "allow_damaged", is_flag=True, help=ALLOW_HELP)(f)


def tell(trace) -> int:
    """Say each damaged part of a loaded trace on stderr, one whole line each; returns how many."""
    damaged = trace.integrity.damaged
    for d in damaged:
        click.echo(f"allocscope: {trace.path}: damaged part {d.text()}", err=True)
    return len(damaged)


def refuse(traces: list, allow: bool) -> None:
    """After the report is out: exit 5 (TraceFileError) when a trace was damaged, unless allowed."""
    bad = [(t.path, len(t.integrity.damaged)) for t in traces if t.integrity.damaged]
    if not bad or allow:
        return
    what = "; ".join(f"{p}: {n} part{'' if n == 1 else 's'}" for p, n in bad)
    raise TraceFileError(
        f"damaged trace ({what}): the findings that read a damaged table are withheld; "
        "--allow-damaged exits 0 with such a report"
    )
