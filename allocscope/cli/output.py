"""Where command output goes: stdout or -o FILE, progress on stderr. Shared by every command."""
from __future__ import annotations

import sys

import click

from common.errors import AllocscopeError


def progress(msg: str) -> None:
    click.echo(f"allocscope: {msg}", err=True)


def emit(data: str | bytes, output: str | None) -> None:
    """Write text or bytes to `output`, or to stdout when it is None."""
    binary = isinstance(data, bytes)
    if output:
        try:
            with open(output, "wb" if binary else "w") as f:
                f.write(data)
        except OSError as e:
            raise AllocscopeError(f"cannot write {output}: {e.strerror}") from None
    elif binary:
        sys.stdout.buffer.write(data)
    else:
        click.echo(data, nl=not data.endswith("\n"))
