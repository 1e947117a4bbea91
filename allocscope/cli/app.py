"""The `allocscope` command group: every command registered on it, each in a module of its own
(record, report, diff, top, doctor, demo). A thin adapter: the work is in tracer/ and reports/;
heavy imports happen inside the commands so `--help` is instant."""

from __future__ import annotations

import click

from common.errors import Interrupted
from common.version import tool_version

from .base import CONTEXT, Command, fail, one_line_errors
from .demo import demo
from .diff import diff
from .doctor import doctor
from .record import record
from .recording import early_stop
from .report import report
from .top import top
from .watch import watch

RECORDING_COMMANDS = ("record", "top", "watch")  # they handle SIGINT/SIGTERM/SIGHUP themselves


class Group(click.Group):
    """The commands' group: the signal handling of a recording is put back for the commands that
    do not record, and an error of the group's own is one line, like its commands' (base)."""

    command_class = Command

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        stop = early_stop()
        if stop is not None and name not in RECORDING_COMMANDS:
            stop.restore()  # reports and the rest: Ctrl-C interrupts them as usual
            if stop.reason is not None:
                fail(Interrupted(f"interrupted ({stop.reason})"))
        return name, cmd, rest

    def make_context(self, info_name, args, parent=None, **extra):
        return one_line_errors(super().make_context, info_name, args, parent, **extra)

    def invoke(self, ctx):
        return one_line_errors(super().invoke, ctx)


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(tool_version(), prog_name="allocscope")  # explicit: the bundle has no metadata
def main() -> None:
    """Find what keeps memory in a running native daemon.

    \b
    Typical session (as root):
      allocscope doctor                          # can this box trace?
      allocscope record --pgrep provingd -o pw10.allocscope --duration 60 --label pw=10
      allocscope report pw10.allocscope          # outstanding bytes by call stack and thread
      allocscope report pw10.allocscope --format json -o pw10.json
    """


for command in (record, report, diff, top, watch, doctor, demo):
    main.add_command(command)

if __name__ == "__main__":
    main()
