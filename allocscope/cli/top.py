"""`allocscope top`: a live view of a process's memory by site and thread while it is recorded
(full screen, or `--batch` blocks on stdout). The recording is `record`'s own (tracer.record.recorder),
writing nothing without -o and the same trace as `record` with it."""

from __future__ import annotations

import sys

import click

from common.errors import OutputError, UsageError
from tracer.base.options import TOP_INTERVAL

from .base import CONTEXT, Command
from .options import (
    by_option,
    fold_option,
    grace_option,
    metrics_options,
    probe_options,
    target_options,
    trace_options,
)
from .output import progress
from .recording import (
    check_inject,
    early_stop,
    end_launched,
    record_options,
    resolve_target,
    start_probes,
    summary_text,
)

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
SORT_CHOICES = ("live", "growth", "peak", "age")


@click.command(cls=Command, context_settings=CONTEXT)
@target_options
@click.option(
    "--sort",
    type=click.Choice(SORT_CHOICES),
    default="live",
    show_default=True,
    help="Rank sites by live bytes, growth (growing sites first, then bytes/s), peak live bytes, or "
    "age of the oldest outstanding block (a lower bound). The s key cycles through them.",
)
@click.option("--threads", "threads_view", is_flag=True, help="Open on the threads view (the t key toggles it).")
@click.option(
    "--batch",
    is_flag=True,
    help="No screen control: one block per interval on stdout (time, RSS, live, the top sites "
    "with their changes), flushed; for logs, ssh and pipes.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    metavar="N",
    help="With --batch: stop after N intervals (the trace, with -o, is finalized as on q).",
)
@click.option(
    "--top",
    "top_n",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    metavar="N",
    help="Sites in each --batch block.",
)
@trace_options
@grace_option
@by_option
@fold_option
@metrics_options
@probe_options(interval=TOP_INTERVAL)
def top(
    pid,
    pattern,
    command,
    sort,
    threads_view,
    batch,
    iterations,
    top_n,
    output,
    labels,
    force,
    keep_cmdline,
    embed_symbols,
    grace,
    by,
    fold,
    metrics,
    metrics_top,
    **probe,
):
    """Watch a process's memory live: RSS, live bytes, and the locations and threads holding them,
    refreshed every interval, while it runs (attach with --pid/--pgrep or start it with -- CMD).

    \b
    Keys: s  cycle the sort (live, growth, peak, age)   t  threads view
          enter  the selected site's full stack          up/down or j/k  select
          space  freeze the display (recording goes on)  q  quit (finalizes the trace with -o)

    Without -o nothing is written to disk; with -o the trace is the one `record` writes. When
    the target exits the last frame stays up, saying so, until q; on q, Ctrl-C or SIGTERM the
    view closes at once, and its last frame is left printed on the terminal. --batch needs no
    terminal; without it, stdin and stdout must be one. With -- CMD, allocscope exits with the
    program's status, and a program still running when the view closes gets SIGTERM, then
    SIGKILL after --grace seconds, said on stderr (docs/launch.md); under --batch its output and
    the blocks share stdout.

    \b
    Examples:
      allocscope top --pgrep provingd
      allocscope top --pid 4242 --sort growth -o run.allocscope
      allocscope top --pid 4242 --batch --interval 5 | tee memory.log
      allocscope top --pid 4242 --batch --metrics 127.0.0.1:9479 > /dev/null
    """
    from reports.wrappers import parse_fold  # noqa: PLC0415 (no pandas: see start_probes below)
    from tracer.doctor import require_root  # noqa: PLC0415
    from tracer.record.signals import StopRequest  # noqa: PLC0415
    from tracer.record.validate import validate  # noqa: PLC0415

    stop = early_stop() or StopRequest().install()
    if iterations is not None and not batch:
        raise UsageError("--iterations needs --batch")
    if not batch and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the full-screen view needs a terminal on stdin and stdout; use --batch for pipes and logs")
    folding = parse_fold(fold)
    opts = record_options(
        output, labels, force=force, keep_cmdline=keep_cmdline, quiet=not batch, embed_symbols=embed_symbols, **probe
    )
    stop.quiet = opts.quiet
    opts.first_snapshot_s = 0.2  # the first frame right after the attach, then every interval
    check_inject(opts, command)
    validate(opts, output=False)
    from .listeners import check_metrics, end_reason, start_listeners  # noqa: PLC0415 (light: no pandas)

    check_metrics(metrics, opts.labels)
    require_root("top")
    validate(opts)
    listeners = start_listeners(metrics, opts.labels, metrics_top, progress if batch else None)
    try:
        target = resolve_target(pid, pattern, command)
        if target.via and batch:
            progress(target.via)
        listeners.target_started(target.pid, target.comm, output, launched=target.child is not None)
        early = start_probes(target, opts)  # built in a thread while the tracer and the reports load
        try:
            from tracer.record import recorder as rec  # noqa: PLC0415
        except BaseException:
            early.discard()
            raise
        out_error = ""
        if batch:
            s, closed, out_error = _batch(target, opts, stop, folding, sort, top_n, iterations, by, early, listeners)
            if not closed or out_error:
                click.echo(summary_text(s, opts.mode), err=True)
        else:
            s = _screen(rec, target, opts, stop, folding, sort, threads_view, by, early, listeners)
        if s is not None:
            listeners.target_ended(end_reason(s, output))
    finally:
        listeners.close()
    # --iterations bounds the run: a program that exec'd another one is stopped with the view
    # (record's wait for it would outlast every iteration); else it is waited for, as record does
    bounded = s is not None and batch and iterations is not None
    code = end_launched(target, s, stop, grace, progress, progress, s.seconds if bounded else None, "--iterations")
    if out_error:  # the trace is written and the program ended: then the error, exit 6
        raise OutputError(out_error)
    if code:
        sys.exit(code)


def _last_words(text: str) -> None:
    """Print what the closed view leaves on the terminal; when that fails (the terminal is
    gone), stdout is silenced: the trace is finalized all the same."""
    from .observers import silence  # noqa: PLC0415

    try:
        click.echo(text, nl=False)
        sys.stdout.flush()
    except OSError:
        silence(sys.stdout)


def _batch(target, opts, stop, folding, sort, top_n, iterations, by, early=None, listeners=None):
    from .observers import record_batch  # noqa: PLC0415

    s, printer = record_batch(
        target, opts, stop, sys.stdout, folding, sort, top_n, iterations, progress, by, early=early, listeners=listeners
    )
    return s, printer.closed, printer.error


def _screen(rec, target, opts, stop, folding, sort, threads_view, by, early=None, listeners=None):
    from common.listeners import Listeners  # noqa: PLC0415
    from reports.live.model import LiveModel  # noqa: PLC0415
    from reports.live.text import ScreenState, mode_text, screen_text  # noqa: PLC0415

    from .screen import Screen  # noqa: PLC0415

    state = ScreenState(
        target=f"pid {target.pid} ({target.comm})",
        sort=sort,
        threads=threads_view,
        mode=mode_text(opts.mode, opts.sample_bytes, opts.fault_sample),
    )
    screen = Screen(LiveModel(folding, by=by), stop, state, redraw_each=target.child is not None)
    screen.start()
    try:
        watching = Listeners(screen.observe, *(listeners.all if listeners is not None else ()))
        s = rec.record(target, opts, screen.progress, stop=stop, observer=watching.observer, early=early)
    except BaseException:
        screen.close()
        raise
    from reports.analysis.ending import closing_text  # noqa: PLC0415 (pandas: loaded by now)

    reason = s.end_reason
    wait = reason not in ("quit", "display error", *SIGNALS)
    written = f"trace written to {opts.output}" if opts.output else "nothing written (no -o)"
    screen.finish(f"ended: {closing_text(s.end, reason)}; {written}", wait)
    if reason != "SIGHUP":  # after a hang-up the terminal is gone: the trace is finalized, nothing to say
        _last_words(screen_text(screen.last_frame) + summary_text(s, opts.mode) + "\n")
    return s
