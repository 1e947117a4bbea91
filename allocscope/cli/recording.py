"""What `record` and `top` share (and `doctor`, the target): the target from --pid/--pgrep/-- CMD,
RecordOptions from the command's options, the early stop request, and the line a recording ends
with. The command modules import this one; it imports none of them."""

from __future__ import annotations

import sys

from common.errors import UsageError


def early_stop():
    """The StopRequest the `allocscope` command installed at its first line (allocscope/cli/entry.py),
    None when the CLI runs inside another program (tests)."""
    entry = sys.modules.get("allocscope.cli.entry")
    return getattr(entry, "STOP", None)


def parse_labels(values: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for v in values:
        key, sep, val = v.partition("=")
        key = key.strip()
        if not sep or not key or any(c.isspace() for c in key):
            raise UsageError(f"--label wants KEY=VALUE (e.g. --label pw=12), not {v!r}")
        if labels.get(key, val) != val:  # one would be dropped without a word (diff --per reads one)
            raise UsageError(f"--label {key} given twice: {key}={labels[key]} and {key}={val}")
        labels[key] = val
    return labels


def resolve_target(pid: int | None, pattern: str | None, command: tuple[str, ...], launch: bool = True):
    """The one process given by --pid, --pgrep or -- CMD (launched blocked before exec; with
    `launch` False a command is only looked up: the dry run starts nothing)."""
    from tracer.process import target as tg  # noqa: PLC0415

    given = sum(x is not None and x != () for x in (pid, pattern, command or None))
    if given == 0:
        raise UsageError("no target: give --pid PID, --pgrep PATTERN, or -- CMD [ARGS...]")
    if given > 1:
        raise UsageError("give only one of --pid, --pgrep, -- CMD")
    if pid is not None:
        return tg.target_from_pid(pid)
    if pattern is not None:
        return tg.target_from_pgrep(pattern)
    return tg.target_from_command(list(command)) if launch else tg.command_target(list(command))


def record_options(output: str | None, labels, **kw):
    """RecordOptions from the command's options (defaults: tracer.base.options.DEFAULTS); a
    repeatable option's values (a tuple from click) become the list RecordOptions keeps."""
    from tracer.base.options import INJECT_SAMPLE_BYTES, RecordOptions  # noqa: PLC0415

    kw = {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()}
    if kw.get("inject") and not kw.get("sample_bytes"):
        kw["sample_bytes"] = INJECT_SAMPLE_BYTES
    return RecordOptions(output=output or "", labels=parse_labels(labels), **kw)


def check_inject(opts, command) -> None:
    """--inject attaches to a running process only: a launched command has no allocator mapped
    yet to hook."""
    if opts.inject and command:
        raise UsageError("--inject hooks a running process: use --pid PID or --pgrep PATTERN, not -- CMD")


def start_probes(target, opts):
    """The target's probes, built from now on in a thread (tracer.bpf.early.EarlyProbes) while the
    caller imports the rest of the tracer; hand it to tracer.record.recorder.record(early=...)."""
    from tracer.bpf.early import EarlyProbes  # noqa: PLC0415

    return EarlyProbes(target.pid, opts, target.child is not None)


def end_launched(
    target, s, stop, grace: float, say=None, warn=None, duration: float | None = None, bound: str = "--duration"
) -> int:
    """A launched program once its recording `s` is over (tracer/process/launch.py): ended by
    itself, or stopped (SIGTERM, the grace period, SIGKILL); its exit status as a shell says it,
    for allocscope to exit with. One that exec'd another program is waited for, at most until
    `duration` (seconds since the recording began; `bound`: the option that set it) is up. 0 for
    a --pid/--pgrep target."""
    if target.child is None:
        return 0
    import time  # noqa: PLC0415

    from tracer.process.launch import end_program  # noqa: PLC0415

    stop.finalizing = False  # a signal now cuts the grace period short: no "finalizing" word
    until = None if duration is None else time.monotonic() + max(0.0, duration - s.seconds)
    return end_program(
        target, s.end_reason or "", grace, say, warn, lambda: stop.signals, until, lambda: stop.reason, bound
    )


def residency_live(s) -> int | None:
    """A residency-mode trace's live bytes at the end as its report says them (mapped, not yet
    touched taken off, first touches estimated: reports/analysis/touches.py), not the raw mapped
    bytes of the last row (`record --mode residency -- xz -9`: 673.2 MiB where the report says
    135.2 MiB); None when the trace cannot be read back."""
    if not s.path:
        return None
    try:
        from reports.analysis.touches import estimate_touches  # noqa: PLC0415
        from reports.trace import load_trace  # noqa: PLC0415

        iv = estimate_touches(load_trace(s.path)).intervals.sort_values("seq")
        return int(iv["live_bytes"].iloc[-1])
    except Exception:  # noqa: BLE001 - the line falls back to the row's figure
        return None


def summary_text(s, mode: str = "full") -> str:
    """The one line a recording ends with (tracer.record.recorder.Summary): where it went, how
    long, how it ended ('target exited with code 0', 'target killed by SIGKILL', 'target
    OOM-killed by the memory cgroup /x (limit 2.0 GiB)', else why it stopped: SIGINT, --duration),
    what was live at the end (`mode` residency: as the report says it, residency_live)."""
    from reports.analysis.ending import closing_text  # noqa: PLC0415
    from reports.units import human_bytes  # noqa: PLC0415

    est = residency_live(s) if mode == "residency" else None
    live = s.live_bytes if est is None else est  # a real 0 B stays 0 B
    where = f"wrote {s.path}" if s.path else "wrote nothing (no -o)"
    ended = closing_text(s.end, s.end_reason)  # how the target ended, as the report says it
    if ended != s.end_reason and not ended.startswith("the target"):
        ended = f"target {ended}"
    intervals = f"{s.intervals} interval{'' if s.intervals == 1 else 's'}"
    cut = [f"{s.cut_short} stacks cut short while unwind tables were built"] if s.cut_short else []
    deep = "(too deep, or a frame the unwinder cannot follow)"
    cut += [f"{s.truncated} stacks kept to their innermost frames {deep}"] if s.truncated else []
    lost = f"lost {s.lost}" + (f" ({'; '.join(cut)})" if cut else "")
    return (
        f"allocscope: {where}: {intervals} in {s.seconds:.1f}s ({ended}); "
        f"live {human_bytes(live)} in {s.live_count} blocks at {s.sites} sites; "
        f"{lost}; {human_bytes(s.bytes_written)} on disk"
    )
