"""`allocscope watch`: follow a daemon for days, across restarts, one trace per incarnation
(tracer/watch/watcher.py; docs/watch.md). A thin adapter; heavy imports happen inside."""

from __future__ import annotations

import re

import click

from common.errors import OutputError, UsageError

from .base import CONTEXT, Command
from .options import metrics_options, probe_options
from .output import progress
from .recording import early_stop, parse_labels, record_options

WATCH_MODE = "residency"  # the default a production daemon carries for days (docs/watch.md: its cost)
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_duration(text: str, what: str) -> float:
    """'90', '90s', '30m', '2h', '1d' -> seconds."""
    m = DURATION.match(text or "")
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{what} {text!r}: give seconds, or a number with s, m, h or d (30m, 2h)")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2) or "s"]


def parse_size(text: str, what: str) -> int:
    """'2G', '2GiB', '512M', '1073741824' -> bytes (powers of 1024)."""
    m = SIZE.match(text or "")
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{what} {text!r}: give bytes, or a number with K, M, G or T (2G, 512MiB)")
    unit = (m.group(2) or "B").upper()[:1]
    return int(float(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit])


def prepare_out_dir(out_dir: str) -> None:
    """-o DIR made (0700) where it is missing; OutputError in one line where it cannot be: a file
    there, a parent that is a file, a read-only or virtual file system (/proc)."""
    import os  # noqa: PLC0415

    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(
            f"-o {out_dir}: it exists and is not a directory (watch writes one trace per incarnation in DIR)"
        )
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise OutputError(f"-o {out_dir}: cannot make the directory ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise OutputError(f"-o {out_dir}: the directory is not writable")


def few_arenas(n: int = 2) -> None:
    """glibc's malloc arenas bounded to `n` for the watch's life (mallopt M_ARENA_MAX), before
    any thread starts: each recording's threads otherwise spread its memory over arenas that
    fragment and keep it, ~4 MiB more RSS per incarnation (1 MiB over 9 with this; the soak in
    bench/watch_soak.py)."""
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL(None).mallopt(-8, n)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


@click.command(cls=Command, context_settings={**CONTEXT, "ignore_unknown_options": False})
@click.option("--pid", "-p", type=int, help="Follow this process, then every process that runs its command line.")
@click.option(
    "--pgrep",
    "pattern",
    metavar="PATTERN",
    help="Follow every process whose full command line matches PATTERN (regex, like pgrep -f), all at once: "
    "each its own trace, end and --on-end, its metrics under its own `worker` label.",
)
@click.option(
    "-o", "--output", "out_dir", required=True, metavar="DIR", help="Directory of the traces, one per incarnation."
)
@click.option(
    "--keep",
    metavar="DURATION",
    default="2h",
    show_default=True,
    help="Interval history kept per trace (90s, 30m, 2h, 1d, or 'all'); older intervals are dropped. "
    "The live state, the composition at the peak, at each trigger and at the end are always kept.",
)
@click.option(
    "--max-traces",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    metavar="N",
    help="Traces kept in DIR: starting a new one removes the oldest beyond N, those of incarnations "
    "that were killed or OOM-killed last (only allocscope traces are removed).",
)
@click.option(
    "--max-processes",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    metavar="N",
    help="Processes recorded at once (each matching process is its own recording); one more matching "
    "waits until one of them ends (said in a line).",
)
@click.option(
    "--when-rss",
    metavar="SIZE",
    help="When the target's RSS passes SIZE (2G, 512MiB), keep the composition at that moment as a named "
    "snapshot (report --at rss) and run --on-trigger.",
)
@click.option(
    "--on-trigger",
    metavar="CMD",
    help="A shell command run when --when-rss fires, with ALLOCSCOPE_TRACE, ALLOCSCOPE_PID, "
    "ALLOCSCOPE_RSS_BYTES and ALLOCSCOPE_TRIGGER in its environment.",
)
@click.option(
    "--on-end",
    metavar="CMD",
    envvar="ALLOCSCOPE_ON_END",
    show_envvar=True,
    help="A shell command run when an incarnation's trace is complete (the target ended, or the "
    "watch stops), with ALLOCSCOPE_TRACE, ALLOCSCOPE_PID, ALLOCSCOPE_END (exited, killed, "
    "oom_killed, exec, stopped), ALLOCSCOPE_EXIT_CODE, ALLOCSCOPE_SIGNAL, ALLOCSCOPE_OOM_CGROUP "
    "and ALLOCSCOPE_RSS_BYTES (the last RSS measured alive) in its environment. Not waited for. "
    "(A systemd unit's EnvironmentFile sets it without a shell's quoting.)",
)
@click.option(
    "--comm",
    "comms",
    multiple=True,
    metavar="NAME",
    help="A program name (as ps shows it) whose execs are held so the new incarnation is traced from its "
    "first allocation; the names of the incarnations seen and PATTERN's first word are held anyway. Repeatable.",
)
@click.option(
    "--no-hold",
    is_flag=True,
    help="Never stop a new incarnation at its exec: attach when it is found (within a second; what it "
    "allocated before is not seen). Implied by --inject (it patches an allocator already mapped).",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="Tag every trace (and every metric series) with KEY=VALUE (e.g. --label pw=12). Repeatable.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@metrics_options
@probe_options
@click.pass_context
def watch(
    ctx,
    pid,
    pattern,
    out_dir,
    keep,
    max_traces,
    max_processes,
    when_rss,
    on_trigger,
    on_end,
    comms,
    no_hold,
    labels,
    quiet,
    metrics,
    metrics_top,
    **probe,
):
    """Follow a daemon for days, across restarts: one trace per incarnation, each with how it ended.

    Runs until stopped (Ctrl-C, SIGTERM: the recordings under way are finished). Every matching
    process is followed at once (eight workers of one command line: eight traces). A process that
    matches when the watch starts is attached as `record --pid` would; after that, each new
    incarnation (a restart by systemd) is stopped at its exec while the probes attach and is let
    go once they are live (a second or two), so it is traced from its first allocation (one
    watch per program name holds it; a second watch of it finds each incarnation once it runs).
    Each trace is DIR/COMM-PID-DATE-TIME.allocscope and reads with `report` and `diff` like any other;
    its report says how the target ended (exited, killed, OOM-killed with the cgroup's limit and
    the kernel's count of its memory at the kill); --on-end CMD is told each end as it comes.

    The default mode is `--mode residency` (the mmap family, sampled page faults and waits: the
    cost a production daemon can carry for days; it cannot see heap blocks below glibc's mmap
    threshold or frees of heap blocks); `--mode full`, `--sample-bytes N` or `--inject` choose
    another (their cost: README, OVERHEAD).

    \b
    Examples:
      allocscope watch --pgrep '^/usr/bin/provingd' -o /var/lib/allocscope --label pw=12
      allocscope watch --pid 4242 -o traces --keep 30m --when-rss 600G --on-trigger 'logger "$ALLOCSCOPE_TRACE"'
      allocscope watch --pgrep provingd -o traces --metrics 127.0.0.1:9479
      allocscope watch --pgrep provingd -o t --on-end '[ "$ALLOCSCOPE_END" = oom_killed ] && logger "$ALLOCSCOPE_TRACE"'
    Exit status: 0 stopped by a signal; 2 usage; 4 permissions/BPF; 6 DIR cannot be written.
    """
    from tracer.doctor import require_root  # noqa: PLC0415
    from tracer.record.signals import StopRequest  # noqa: PLC0415
    from tracer.record.validate import validate  # noqa: PLC0415

    stop = early_stop() or StopRequest().install()
    stop.quiet = quiet
    few_arenas()
    if (pid is None) == (pattern is None):
        raise UsageError("give exactly one of --pid PID or --pgrep PATTERN")
    if ctx.get_parameter_source("mode") == click.core.ParameterSource.DEFAULT and (
        probe.get("inject") or probe.get("sample_bytes")
    ):
        probe["mode"] = "full"  # what they sample or patch are the allocator's calls
    keep_s = None if keep.strip().lower() == "all" else parse_duration(keep, "--keep")
    rss = parse_size(when_rss, "--when-rss") if when_rss else None
    if on_trigger and rss is None:
        raise UsageError("--on-trigger needs a trigger: --when-rss SIZE")
    opts = record_options(None, labels, quiet=quiet, **probe)
    opts.labels = parse_labels(labels)
    validate(opts, output=False)
    from tracer.watch.watcher import Watcher, WatchOptions  # noqa: PLC0415

    from .listeners import check_metrics, start_listeners  # noqa: PLC0415

    check_metrics(metrics, opts.labels)
    require_root("watch")
    validate(opts)
    prepare_out_dir(out_dir)
    wopts = WatchOptions(
        out_dir=out_dir,
        pattern=pattern,
        pid=pid,
        keep_s=keep_s,
        max_traces=max_traces,
        max_processes=max_processes,
        when_rss=rss,
        on_trigger=on_trigger,
        on_end=on_end,
        # --inject patches an allocator the process has mapped: a process held at its exec has none
        # yet, so under --inject new incarnations are attached when found (within a second)
        hold=not no_hold and not opts.inject,
        comms=list(comms),
    )
    say = (lambda msg: None) if quiet else progress
    listeners = start_listeners(metrics, opts.labels, metrics_top, say, workers=True)
    try:
        watcher = Watcher(wopts, opts, say, stop, listeners)
        from tracer.watch.keep import install as install_keep  # noqa: PLC0415
        from tracer.watch.triggers import install as install_triggers  # noqa: PLC0415

        install_keep(watcher)
        install_triggers(watcher)
        done = watcher.run()
    finally:
        listeners.close()
    progress(f"watch stopped ({stop.reason or 'done'}): {len(done)} incarnation(s) traced in {out_dir}")


def _watch_mode_default() -> None:
    """`--mode`'s default is the watch's own (residency), and its help says so."""
    for p in watch.params:
        if p.name == "mode" and isinstance(p, click.Option):
            p.default = WATCH_MODE
            p.help = (p.help or "") + " watch: residency, unless --inject or --sample-bytes is given (then full)."


_watch_mode_default()
