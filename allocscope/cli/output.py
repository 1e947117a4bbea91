"""Where command output goes: stdout or -o FILE, progress on stderr. Shared by every command."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from common.errors import OutputError


def progress(msg: str) -> None:
    click.echo(f"allocscope: {msg}", err=True)


def emit(data: str | bytes, output: str | None) -> None:
    """Write text or bytes to `output`, or to stdout when it is None; a write that fails (a full
    disk, a read-only place, `> /dev/full`) is an OutputError (exit 6), one line. A reader of the
    pipe that went away is not: BrokenPipeError goes on to the quiet exit (base.one_line_errors)."""
    if output:
        try:
            if isinstance(data, bytes):
                Path(output).write_bytes(data)
            else:
                Path(output).write_text(data)
        except OSError as e:
            raise OutputError(f"cannot write {output}: {e.strerror or e}") from None
        return
    try:
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            click.echo(data, nl=not data.endswith("\n"))
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(f"cannot write to stdout: {e.strerror or e}") from None
