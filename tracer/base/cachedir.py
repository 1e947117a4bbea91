"""Where allocscope keeps what it builds between runs, and how those files are read and written.

The root is ALLOCSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/allocscope (~/.cache/allocscope), one
folder per kind under it: bpf/ (the compiled programs, tracer/bpf/cache.py; the --inject agent
when its own folder is not writable), unwind/ (unwind rows, tracer/unwind/), files/ (facts about
ELF files, tracer/allocators/facts.py), kernel/ (the running kernel's BTF facts, per kernel and
boot, tracer/bpf/kernel_btf.py); the CFI decoder at the root. ALLOCSCOPE_BPF_CACHE=0 turns
the compiled programs and the facts off (`enabled`)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """The folder of one kind of cached thing ("bpf", "unwind", "files")."""
    env = os.environ.get("ALLOCSCOPE_CACHE_DIR")
    if env:
        return Path(env) / kind
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "allocscope" / kind


def enabled() -> bool:
    return os.environ.get("ALLOCSCOPE_BPF_CACHE", "1") not in ("0", "", "off", "no")


def trusted(path: Path) -> bool:
    """Only what this user wrote, and nobody else may write: root loads these instructions into
    the kernel, and `sudo` may leave HOME at another user's home."""
    st = path.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def read_private(path: Path):
    """The JSON at `path`, when this user wrote it and nobody else may write it or its directory;
    else (or unreadable) None."""
    try:
        if not (trusted(path.parent) and trusted(path)):
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_private(d: Path, name: str, text: str) -> None:
    """`text` as d/name, made atomically (a temporary file renamed), readable by this user only;
    nothing when it cannot be written (a read-only home: no cache, same recording)."""
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = d / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, d / name)
    except OSError:
        pass
