"""`allocscope record`: record a running process (--pid/--pgrep) or a command it starts into a
trace. A thin adapter over tracer.record.recorder; heavy imports happen inside."""

from __future__ import annotations

import sys

import click

from common.errors import UsageError

from .base import CONTEXT, Command
from .options import grace_option, metrics_options, probe_options, target_options, trace_options
from .output import emit, progress
from .recording import (
    check_inject,
    early_stop,
    end_launched,
    record_options,
    resolve_target,
    start_probes,
    summary_text,
)


@click.command(cls=Command, context_settings={**CONTEXT, "ignore_unknown_options": False})
@target_options
@trace_options
@click.option(
    "--duration",
    type=float,
    metavar="SECONDS",
    help="Stop after this long (default: until Ctrl-C or the target exits). A launched program still "
    "running then gets SIGTERM (see --grace).",
)
@grace_option
@click.option(
    "--quiet", "-q", is_flag=True, help="No progress messages; the summary line only (on stderr, as all of ours)."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Resolve the target and print every allocator found and each probe it would get "
    "(where, and why there); attach nothing, write nothing.",
)
@metrics_options
@probe_options
def record(
    pid,
    pattern,
    command,
    output,
    labels,
    force,
    keep_cmdline,
    embed_symbols,
    duration,
    grace,
    quiet,
    dry_run,
    metrics,
    metrics_top,
    **probe,
):
    """Record allocations of a running process (--pid/--pgrep) or of a command it starts (-- CMD).

    Probes malloc, calloc, realloc, reallocarray, free, posix_memalign, aligned_alloc, memalign,
    valloc, pvalloc and malloc_trim in the allocator the process really uses, and mmap, munmap,
    mremap, brk and madvise through syscall tracepoints. Stops at --duration, Ctrl-C/SIGTERM, or
    when the target exits; the trace is readable even if allocscope is killed. A Ctrl-C while the
    probes are still being set up stops there: nothing is recorded (exit 130) and a trace already
    at TRACE stays where it is. On a terminal, a status line on stderr shows the elapsed time,
    RSS, live bytes, losses and the stack holding most (not on a pipe, not with --quiet).

    -- CMD is a clean wrapper: the program gets allocscope's stdin, stdout and stderr untouched,
    every line of allocscope's own (progress, warnings, the summary) goes to stderr, and
    allocscope exits with the program's status (128+N when signal N killed it; its own errors:
    2-6, 130). A program still running when the recording stops gets SIGTERM, then SIGKILL after
    --grace seconds if it is still running, both said on stderr (docs/launch.md).

    \b
    Examples:
      allocscope record --pid 4242 -o run.allocscope --duration 30
      allocscope record --pgrep 'provingd --pw 12' -o pw12.allocscope --label pw=12
      allocscope record -o demo.allocscope -- ./provingd --pw 4
      allocscope record --pid 4242 -o run.allocscope --label pw=12 --metrics 127.0.0.1:9479
    """
    from tracer.doctor import require_root  # noqa: PLC0415
    from tracer.record.signals import StopRequest  # noqa: PLC0415
    from tracer.record.validate import validate  # noqa: PLC0415 (no pyarrow, no BCC: see below)

    stop = early_stop() or StopRequest().install()  # a signal is honoured, never a traceback
    stop.quiet = quiet
    if not output and not dry_run:
        raise UsageError("missing -o TRACE (where to write the trace)")
    opts = record_options(
        output,
        labels,
        duration=duration,
        force=force,
        keep_cmdline=keep_cmdline,
        quiet=quiet,
        embed_symbols=embed_symbols,
        **probe,
    )
    check_inject(opts, command)
    validate(opts, output=False)
    from .listeners import check_metrics, end_reason, start_listeners  # noqa: PLC0415 (light: no pandas)

    check_metrics(metrics, opts.labels)
    if dry_run:
        from tracer.dryrun import describe  # noqa: PLC0415

        emit(describe(resolve_target(pid, pattern, command, launch=False), opts) + "\n", None)
        return
    require_root()
    validate(opts)
    listeners = start_listeners(metrics, opts.labels, metrics_top, None if quiet else progress)  # listening first
    try:
        target = resolve_target(pid, pattern, command)
        if target.via and not quiet:
            progress(target.via)
        listeners.target_started(target.pid, target.comm, output, launched=target.child is not None)
        early = start_probes(target, opts)  # built in a thread while the tracer's modules load
        try:
            from tracer.record import recorder as rec  # noqa: PLC0415
        except BaseException:
            early.discard()
            raise
        status = None
        if not quiet and sys.stderr.isatty():
            from .observers import StatusLine  # noqa: PLC0415

            status = StatusLine(sys.stderr)
            listeners.add(status.observe)
        try:
            s = rec.record(
                target,
                opts,
                None if quiet else status.progress if status else progress,
                stop=stop,
                observer=listeners.observer,
                early=early,
            )
        finally:
            if status is not None:
                status.close()
        listeners.target_ended(end_reason(s, output))
    finally:
        listeners.close()
    click.echo(summary_text(s, opts.mode), err=True)
    code = end_launched(target, s, stop, grace, None if quiet else progress, progress, opts.duration)
    if code:
        sys.exit(code)
