"""Compiling the project's two small C files at set-up (or on first use): the --inject agent
(tracer/inject/agent/agent.c) and the CFI decoder (tracer/unwind/cfi/cfi.c). One compiler call, written
atomically (a temporary name, then rename), its first error line kept."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path


class CompileError(Exception):
    """No compiler, or the compiler failed: the message is one line."""


def compile_c(source: Path, out: Path, cflags: list[str], cc: str | None = None) -> Path:
    """`cc CFLAGS -o OUT SOURCE` ($CC, else cc, else gcc); raises CompileError."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise CompileError("no C compiler")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
    r = subprocess.run([cc, *cflags, "-o", str(tmp), str(source)], capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise CompileError((r.stderr.strip().splitlines() or ["?"])[0])
    os.replace(tmp, out)
    return out
