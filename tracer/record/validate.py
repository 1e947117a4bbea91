"""A recording's options checked before anything heavy is imported or attached (the CLI runs this
first; tracer.record.recorder.record runs it again)."""

from __future__ import annotations

from common.errors import OutputError, UsageError
from common.tracefile.paths import check_output

from ..allocators.custom import parse_all
from ..base.options import RecordOptions

MAX_LIVE = 1 << 28  # --max-live: 256 Mi blocks, ~24 GiB of the kernel's memory
MAX_SECONDS = 1e9  # --interval, --duration: 31 years (their nanoseconds are integers)
MAX_SAMPLE_BYTES = 1 << 40  # --sample-bytes: compiled into the probes as a 64-bit constant


def validate(opts: RecordOptions, output: bool = True) -> None:
    """Options checked before anything is attached or written (one line each); with `output`,
    also that the output path may be written (as root: run require_root first)."""
    if not 0 < opts.interval <= MAX_SECONDS:  # nan fails too
        raise UsageError(f"--interval must be > 0 seconds (at most {MAX_SECONDS:g}), not {opts.interval:g}")
    if opts.duration is not None and not 0 < opts.duration <= MAX_SECONDS:
        raise UsageError(f"--duration must be > 0 seconds (at most {MAX_SECONDS:g}), not {opts.duration:g}")
    if not 0 <= opts.wait_min_ms <= MAX_SECONDS:
        raise UsageError(f"--wait-min must be a number of ms >= 0, not {opts.wait_min_ms:g}")
    if opts.sample_bytes > MAX_SAMPLE_BYTES:
        raise UsageError(f"--sample-bytes must be at most {MAX_SAMPLE_BYTES} (1 TiB)")
    if opts.max_live < 1024:
        raise UsageError("--max-live must be at least 1024")
    if opts.max_live > MAX_LIVE:
        raise UsageError(f"--max-live must be at most {MAX_LIVE} (~90 bytes of kernel memory each)")
    if opts.uprobe_sessions == "on":
        if opts.sample_bytes <= 0 or opts.mode != "full":
            raise UsageError(
                "--uprobe-sessions on needs --sample-bytes N (a session only spares the return "
                "trap of calls a sampled recording does not keep)"
            )
        if opts.uprobes == "perf":
            raise UsageError("--uprobe-sessions on needs uprobe_multi links: not with --uprobes perf")
    if opts.mode == "residency" and opts.sample_bytes > 0 and not opts.inject:  # --inject: its own line below
        raise UsageError(
            "--sample-bytes samples heap calls, which --mode residency does not probe: "
            "give one of them (watch: --sample-bytes alone records in full mode)"
        )
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
        try:
            check_output(opts.output, opts.force)
        except OSError as e:  # a path through a file (-o FILE/sub), a loop of links...
            raise OutputError(f"cannot write {opts.output}: {e.strerror or e}") from None
