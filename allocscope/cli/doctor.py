"""`allocscope doctor`: can this machine trace, and (with --pid/--pgrep) what would be probed in
a process. A thin adapter over tracer.doctor and tracer.dryrun."""

from __future__ import annotations

import sys

import click

from common.errors import PermissionProblem, UsageError

from .base import CONTEXT, Command
from .output import emit
from .recording import resolve_target


@click.command(cls=Command, context_settings=CONTEXT)
@click.option("--pid", "-p", type=int, help="Also say what would be probed in this process.")
@click.option("--pgrep", "pattern", metavar="PATTERN", help="Likewise, the one process matching PATTERN.")
@click.option(
    "--warm",
    is_flag=True,
    help="With --pid/--pgrep: build the unwind tables of all its code now, "
    "on every core, so a recording has complete stacks from its first second.",
)
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
        from tracer.unwind.unwinder import warm_process  # noqa: PLC0415

        target = resolve_target(pid, pattern, ())
        try:
            ok = warm_process(target.pid, lambda msg: click.echo(msg, err=True))
        except PermissionError:
            raise PermissionProblem(
                f"doctor --warm cannot read the memory map of pid {target.pid} ({target.comm}): permission "
                "denied; run it as root or as the process's user"
            ) from None
        sys.exit(0 if ok else 1)

    out: list[str] = []  # said at once (emit): a stdout that cannot be written is one line, exit 6
    if pid is not None or pattern is not None:
        from tracer.base.options import RecordOptions  # noqa: PLC0415
        from tracer.dryrun import describe  # noqa: PLC0415

        target = resolve_target(pid, pattern, ())
        out.append(describe(target, RecordOptions(), "allocscope doctor --pid"))
        from tracer.inject.preflight import can_inject  # noqa: PLC0415

        ok_inject, lines = can_inject(target.pid, target.exe)
        out.append(f"--inject: {'can work' if ok_inject else 'cannot work'} in pid {target.pid}")
        out += [f"  {line}" for line in lines]
        out.append("")
    ok = True
    for check in run_checks():
        mark = "ok  " if check.ok else "FAIL"
        out.append(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok:
            ok = False
            if check.fix:
                out.append(f"       fix: {check.fix}")
    out.append("tracing can work" if ok else "tracing cannot work until the failures above are fixed")
    emit("\n".join(out) + "\n", None)
    sys.exit(0 if ok else 1)
