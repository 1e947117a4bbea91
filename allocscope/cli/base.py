"""What every command shares: its context settings, and the one place an error becomes the
single `allocscope: <message>` line on stderr and its exit code (common/errors.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from common.errors import AllocscopeError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

T = TypeVar("T")


def fail(err: AllocscopeError) -> NoReturn:
    """`allocscope: <message>` on stderr, then exit with the error's code."""
    click.echo(f"allocscope: {err}", err=True)
    sys.exit(err.exit_code)


def one_line_errors(call: Callable[..., T], *args) -> T:
    """`call(*args)` with an AllocscopeError turned into one line and its exit code (fail), and
    a closed stdout (the reader of a pipe went away) into a quiet exit 1. Anything else is a bug
    and keeps its traceback."""
    try:
        return call(*args)
    except AllocscopeError as e:
        fail(e)
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(1)


class Command(click.Command):
    """A command whose errors are one line (one_line_errors), also when it is invoked on its own
    (tests, embedding) rather than through the group."""

    def invoke(self, ctx: click.Context):
        return one_line_errors(super().invoke, ctx)
