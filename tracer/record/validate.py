"""A recording's options checked before anything heavy is imported or attached (the CLI runs this
first; tracer.record.recorder.record runs it again)."""

from __future__ import annotations

from common.errors import UsageError
from common.tracefile.paths import check_output

from ..allocators.custom import parse_all
from ..base.options import RecordOptions


def validate(opts: RecordOptions, output: bool = True) -> None:
    """Options checked before anything is attached or written (one line each); with `output`,
    also that the output path may be written (as root: run require_root first)."""
    if opts.interval <= 0:
        raise UsageError("--interval must be > 0 seconds")
    if opts.duration is not None and opts.duration <= 0:
        raise UsageError("--duration must be > 0 seconds")
    if opts.max_live < 1024:
        raise UsageError("--max-live must be at least 1024")
    if opts.uprobe_sessions == "on":
        if opts.sample_bytes <= 0 or opts.mode != "full":
            raise UsageError(
                "--uprobe-sessions on needs --sample-bytes N (a session only spares the return "
                "trap of calls a sampled recording does not keep)"
            )
        if opts.uprobes == "perf":
            raise UsageError("--uprobe-sessions on needs uprobe_multi links: not with --uprobes perf")
    if opts.inject:
        if opts.mode != "full":
            raise UsageError("--inject samples heap calls: not with --mode residency")
        if opts.sample_bytes <= 0:
            raise UsageError("--inject needs --sample-bytes N > 0 (only sampled calls reach the probes)")
        if opts.uprobe_sessions == "on":
            raise UsageError(
                "--inject and --uprobe-sessions on exclude each other (the agent samples in the "
                "process; no heap function is probed)"
            )
        if opts.probe_floor:
            raise UsageError("--inject and --probe-floor exclude each other")
    parse_all(opts.alloc_fns, opts.free_fns)
    if output and opts.output:
        check_output(opts.output, opts.force)
