"""The `allocscope` command's first lines: the signal handling of a recording is installed before
anything heavy is imported, so a Ctrl-C at any moment of start-up is a clean stop (one line,
exit 130) and never Python's KeyboardInterrupt. Commands that do not record put the default
handlers back (allocscope/cli.py)."""

from __future__ import annotations

from tracer.record.signals import StopRequest

STOP = StopRequest().install()


def main() -> None:
    from .app import main as cli_main  # noqa: PLC0415 (after the handlers)

    try:
        cli_main()
    finally:
        # The work is done (the trace finished, the summary written): a Ctrl-C now must not kill
        # the interpreter's own teardown, which puts the default handlers back (exit by SIGINT,
        # -2, instead of 0). Ignored signals stay ignored through it.
        STOP.ignore()
