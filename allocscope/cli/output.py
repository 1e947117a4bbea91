"""Where command output goes: stdout or -o FILE, progress on stderr. Shared by every command."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from common.errors import AllocscopeError


def progress(msg: str) -> None:
    click.echo(f"allocscope: {msg}", err=True)


def emit(data: str | bytes, output: str | None) -> None:
    """Write text or bytes to `output`, or to stdout when it is None."""
    if output:
        try:
            if isinstance(data, bytes):
                Path(output).write_bytes(data)
            else:
                Path(output).write_text(data)
        except OSError as e:
            raise AllocscopeError(f"cannot write {output}: {e.strerror}") from None
    elif isinstance(data, bytes):
        sys.stdout.buffer.write(data)
    else:
        click.echo(data, nl=not data.endswith("\n"))
