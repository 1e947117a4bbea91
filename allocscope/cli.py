"""allocscope command line. A thin adapter: the work is in tracer/ and reports/; heavy imports
happen inside the commands so `--help` is instant."""
from __future__ import annotations

import os
import sys

import click

from allocscope.options import by_option, fold_option, probe_options, source_option, target_options, trace_options
from allocscope.output import emit, progress
from allocscope.recording import check_inject, early_stop, record_options, resolve_target, start_probes, summary_text
from common.errors import AllocscopeError, Interrupted, UsageError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _fail(err: AllocscopeError) -> None:
    click.echo(f"allocscope: {err}", err=True)
    sys.exit(err.exit_code)


RECORDING_COMMANDS = ("record", "top")  # they handle SIGINT/SIGTERM/SIGHUP themselves




class Group(click.Group):
    """Turns AllocscopeError into one line on stderr and its exit code."""

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        stop = early_stop()
        if stop is not None and name not in RECORDING_COMMANDS:
            stop.restore()  # reports and the rest: Ctrl-C interrupts them as usual
            if stop.reason is not None:
                _fail(Interrupted(f"interrupted ({stop.reason})"))
        return name, cmd, rest

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AllocscopeError as e:
            _fail(e)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(1)




@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(package_name="allocscope", prog_name="allocscope")
def main() -> None:
    """Find what keeps memory in a running native daemon.

    \b
    Typical session (as root):
      allocscope doctor                          # can this box trace?
      allocscope record --pgrep provingd -o pw10.allocscope --duration 60 --label pw=10
      allocscope report pw10.allocscope          # outstanding bytes by call stack and thread
      allocscope report pw10.allocscope --format json -o pw10.json
    """






@main.command(context_settings={**CONTEXT, "ignore_unknown_options": False})
@target_options
@trace_options
@click.option("--duration", type=float, metavar="SECONDS",
              help="Stop after this long (default: until Ctrl-C or the target exits).")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages; the summary line only.")
@click.option("--dry-run", is_flag=True,
              help="Resolve the target and print every allocator found and each probe it would get "
                   "(where, and why there); attach nothing, write nothing.")
@probe_options
def record(pid, pattern, command, output, labels, force, keep_cmdline, embed_symbols, duration, quiet, dry_run,
           **probe):
    """Record allocations of a running process (--pid/--pgrep) or of a command it starts (-- CMD).

    Probes malloc, calloc, realloc, reallocarray, free, posix_memalign, aligned_alloc, memalign,
    valloc, pvalloc and malloc_trim in the allocator the process really uses, and mmap, munmap,
    mremap, brk and madvise through syscall tracepoints. Stops at --duration, Ctrl-C/SIGTERM, or
    when the target exits; the trace is readable even if allocscope is killed. A Ctrl-C while the
    probes are still being set up stops there: nothing is recorded (exit 130) and a trace already
    at TRACE stays where it is. On a terminal, a status line on stderr shows the elapsed time,
    RSS, live bytes, losses and the stack holding most (not on a pipe, not with --quiet).

    \b
    Examples:
      allocscope record --pid 4242 -o run.allocscope --duration 30
      allocscope record --pgrep 'provingd --pw 12' -o pw12.allocscope --label pw=12
      allocscope record -o demo.allocscope -- ./provingd --pw 4
    """
    from tracer.checks import validate  # noqa: PLC0415 (no pyarrow, no BCC: see below)
    from tracer.doctor import require_root  # noqa: PLC0415
    from tracer.stop import StopRequest  # noqa: PLC0415

    stop = early_stop() or StopRequest().install()  # a signal is honoured, never a traceback
    stop.quiet = quiet
    if not output and not dry_run:
        raise UsageError("missing -o TRACE (where to write the trace)")
    opts = record_options(output, labels, duration=duration, force=force, keep_cmdline=keep_cmdline, quiet=quiet,
                          embed_symbols=embed_symbols, **probe)
    check_inject(opts, command)
    validate(opts, output=False)
    if dry_run:
        from tracer.dryrun import describe  # noqa: PLC0415

        click.echo(describe(resolve_target(pid, pattern, command, launch=False), opts))
        return
    require_root()
    validate(opts)
    target = resolve_target(pid, pattern, command)
    early = start_probes(target, opts)  # built in a thread while the tracer's modules load
    try:
        from tracer import record as rec  # noqa: PLC0415
    except BaseException:
        early.discard()
        raise
    status = None
    if not quiet and sys.stderr.isatty():
        from allocscope.watch import StatusLine  # noqa: PLC0415
        status = StatusLine(sys.stderr)
    try:
        s = rec.record(target, opts, None if quiet else status.progress if status else progress, stop=stop,
                       observer=status.observe if status else None, early=early)
    finally:
        if status is not None:
            status.close()
    click.echo(summary_text(s))




@main.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=True, file_okay=True))
@click.option("--format", "fmt", type=click.Choice(["text", "json", "csv", "html", "pprof", "folded"]),
              default="text", show_default=True,
              help="text for people; json (allocscope.report/1) for tools; csv of ranked sites; html "
                   "(self-contained, offline); pprof (gzipped protobuf for go tool pprof / Pyroscope); "
                   "folded stacks for flamegraph.pl / speedscope.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="Sites and threads to show (text).")
@click.option("--sort", type=click.Choice(["live", "peak", "growth", "age"]), default="live", show_default=True,
              help="Rank sites by live bytes at the end, peak live bytes, growth (growing sites first, "
                   "then bytes/s), or age of the oldest outstanding allocation.")
@click.option("--metric", type=click.Choice(["live_bytes", "alloc_bytes", "live_count", "alloc_count",
                                             "device_live_bytes"]),
              default="live_bytes", show_default=True,
              help="Value of each stack in --format folded (host memory; device_live_bytes: GPU memory).")
@by_option
@fold_option
@source_option
def report(trace, fmt, output, top, sort, metric, by, fold, sources):
    """Outstanding bytes by location (the place in the code that asked for memory) and by
    thread, totals and losses, from TRACE.

    \b
    Examples:
      allocscope report run.allocscope --sort growth
      allocscope report run.allocscope --format html -o run.html
      allocscope report run.allocscope --format pprof -o heap.pb.gz && go tool pprof -top heap.pb.gz
      allocscope report run.allocscope --format folded | flamegraph.pl > live.svg

    A location is the innermost frame left after folding allocator wrappers: one line of code.
    Every stack that reaches it (a work-stealing pool reaches one call through many) is summed
    under it, and its largest stacks are shown below it; --by stack lists each stack instead.

    The JSON form (schema allocscope.report/1) is a contract other tools read: sites (one per
    folded stack) sorted by --sort (default: live bytes), each with frames innermost first and
    its `location`; locations (one per place, with `stacks`: the ranks of its sites); threads,
    arenas, trims.
    When most of the peak was freed by the end (live at the end <= 25% of the peak), the text
    and HTML forms show the sites that held the peak first.
    """
    from reports import render  # noqa: PLC0415
    from reports.analysis import build_report, only_sources, parse_fold, parse_sources, symbolize_stacks  # noqa: PLC0415
    from reports.trace import load_trace  # noqa: PLC0415

    folding = parse_fold(fold)
    wanted = parse_sources(sources)
    say = progress if sys.stderr.isatty() else None
    t = only_sources(load_trace(trace, progress=say), wanted)
    if fmt == "pprof":
        from reports.pprof import to_pprof  # noqa: PLC0415
        if output is None and sys.stdout.isatty():
            raise UsageError("--format pprof is binary: give -o FILE (e.g. -o heap.pb.gz)")
        emit(to_pprof(t, fold=folding), output)
        return
    if fmt == "folded":
        from reports.folded import to_folded  # noqa: PLC0415
        emit(to_folded(t, metric=metric, fold=folding), output)
        return
    stacks = symbolize_stacks(t, say)
    rep = build_report(t, sort=sort, stacks=stacks, fold=folding, by=by)
    if wanted:
        rep["source_filter"] = wanted
    if fmt == "json":
        text = render.to_json(rep)
    elif fmt == "csv":
        from reports.csvout import to_csv  # noqa: PLC0415
        text = to_csv(rep)
    elif fmt == "html":
        from reports.html import to_html  # noqa: PLC0415
        text = to_html(t, rep, stacks=stacks, fold=folding)
    else:
        color = output is None and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
        text = render.to_text(rep, top=top, color=color)
    emit(text, output)


@main.command(context_settings=CONTEXT)
@click.option("--pid", "-p", type=int, help="Also say what would be probed in this process.")
@click.option("--pgrep", "pattern", metavar="PATTERN", help="Likewise, the one process matching PATTERN.")
@click.option("--warm", is_flag=True, help="With --pid/--pgrep: build the unwind tables of all its code now, "
              "on every core, so a recording has complete stacks from its first second.")
def doctor(pid, pattern, warm):
    """Check that this machine can trace: root, BPF, BCC, kernel headers, tracefs, uprobes.

    Says exactly what is missing and how to fix it; exits 0 when tracing can work. With --pid or
    --pgrep it also lists the process's allocators, each probe and its place, and whether the
    CUDA driver (libcuda.so.1) is mapped: what `record --dry-run` prints.

    `record --pid` builds the unwind table of a module only once allocation stacks cross it
    (stacks are cut short there meanwhile, counted and said in the report); --warm builds every
    table of the process ahead, into the cache `record` reads (docs/startup.md).
    """
    from tracer.doctor import run_checks  # noqa: PLC0415

    if warm and pid is None and pattern is None:
        raise UsageError("--warm needs --pid PID or --pgrep PATTERN (whose code to build tables for)")
    if warm:
        from tracer.unwind import warm_process  # noqa: PLC0415

        target = resolve_target(pid, pattern, ())
        ok = warm_process(target.pid, lambda msg: click.echo(msg, err=True))
        sys.exit(0 if ok else 1)
    if pid is not None or pattern is not None:
        from tracer.dryrun import describe  # noqa: PLC0415
        from tracer.options import RecordOptions  # noqa: PLC0415

        target = resolve_target(pid, pattern, ())
        click.echo(describe(target, RecordOptions()))
        from tracer.inject import can_inject  # noqa: PLC0415

        ok_inject, lines = can_inject(target.pid, target.exe)
        click.echo(f"--inject: {'can work' if ok_inject else 'cannot work'} in pid {target.pid}")
        for line in lines:
            click.echo(f"  {line}")
        click.echo("")
    ok = True
    for check in run_checks():
        mark = "ok  " if check.ok else "FAIL"
        click.echo(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok:
            ok = False
            if check.fix:
                click.echo(f"       fix: {check.fix}")
    click.echo("tracing can work" if ok else "tracing cannot work until the failures above are fixed")
    sys.exit(0 if ok else 1)


from allocscope.cmd_diff import diff  # noqa: E402
from allocscope.cmd_top import top  # noqa: E402
from allocscope.demo import demo  # noqa: E402

main.add_command(diff)
main.add_command(top)
main.add_command(demo)

if __name__ == "__main__":
    main()
