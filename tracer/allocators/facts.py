"""Small JSON facts about an ELF file, kept between runs: which allocators a module holds
(tracer/allocators/discovery.py allocators_in) and where each probe sits in it (placement, proved with
capstone). Reading a big library's symbols with pyelftools costs ~30 ms a module and a daemon
maps dozens (redis: 18 modules, 0.5 s); the answer only changes when the file does.

A fact is keyed by what it is (`kind`, with its own version), the file's identity (device,
inode, size, modification time: a rebuilt or replaced file is a new key) and the real path.
Files live under the compiled-program cache's root (ALLOCSCOPE_CACHE_DIR, else
~/.cache/allocscope), are written atomically, and are read only when this user owns them and
nobody else may write them (root reads them). ALLOCSCOPE_BPF_CACHE=0 turns this off too.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..base.cachedir import cache_dir, enabled, read_private, write_private


def _dir() -> Path:
    return cache_dir("files")


def _key(kind: str, path: str, extra: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = f"{kind}|{os.path.realpath(path)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{extra}"
    return kind + "-" + hashlib.sha256(ident.encode()).hexdigest()[:32]


def get(kind: str, path: str, extra: str = ""):
    """The fact stored for this file as it is now, or None."""
    if not enabled():
        return None
    key = _key(kind, path, extra)
    if key is None:
        return None
    return read_private(_dir() / f"{key}.json")


def put(kind: str, path: str, value, extra: str = "") -> None:
    if not enabled():
        return
    key = _key(kind, path, extra)
    if key is None:
        return
    write_private(_dir(), f"{key}.json", json.dumps(value))
