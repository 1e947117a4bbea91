"""What every command shares: its context settings, and the one place an error becomes the
single `allocscope: <message>` line on stderr and its exit code (common/errors.py) — click's
own usage errors too (exit 2, one line instead of its usage block)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from common.errors import AllocscopeError, UsageError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

T = TypeVar("T")
# click 8.2+: the group invoked without a command (its help, not an error to put on one line)
NO_ARGS: type[click.UsageError] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("NoArgs", (click.UsageError,), {})
)


def fail(err: AllocscopeError) -> NoReturn:
    """`allocscope: <message>` on stderr, then exit with the error's code."""
    click.echo(f"allocscope: {err}", err=True)
    sys.exit(err.exit_code)


def usage_line(e: click.ClickException) -> str:
    """A click error (a bad option value, an unknown option or command, a missing argument) as
    one line: its message, then where the command's options are listed."""
    text = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    if isinstance(e, click.UsageError) and ctx is not None:
        names = []
        while ctx.parent is not None:  # the root's name may be `python -m allocscope`
            names.append(ctx.info_name)
            ctx = ctx.parent
        text += f" (see {' '.join(['allocscope', *reversed(names)])} --help)"
    return text


def one_line_errors(call: Callable[..., T], *args) -> T:
    """`call(*args)` with an AllocscopeError turned into one line and its exit code (fail), a
    click usage error (a bad number, an unknown option) into one line and exit 2 (UsageError)
    instead of click's usage block, and a closed stdout (the reader of a pipe went away) into a
    quiet exit 1. Anything else is a bug and keeps its traceback."""
    try:
        return call(*args)
    except AllocscopeError as e:
        fail(e)
    except NO_ARGS as e:  # `allocscope` alone: the help, as click shows it
        e.show()
        sys.exit(e.exit_code)
    except click.UsageError as e:
        fail(UsageError(usage_line(e)))
    except click.ClickException as e:  # click's other errors (a file option it could not open)
        err = AllocscopeError(usage_line(e))
        err.exit_code = e.exit_code or 1
        fail(err)
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(1)


class Command(click.Command):
    """A command whose errors are one line (one_line_errors), its options' parsing included, also
    when it is invoked on its own (tests, embedding) rather than through the group."""

    def make_context(self, info_name, args, parent=None, **extra):
        return one_line_errors(super().make_context, info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context):
        return one_line_errors(super().invoke, ctx)
