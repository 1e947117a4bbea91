"""Unwind rows from a compiled decoder: tracer/unwind/cfi/cfi.c through ctypes, pyelftools as fallback.

`build_rows(path)` gives the rows of tracer/unwind/rows.py `build_table` for an ELF file (the same
bytes: tests/test_cfi_native.py compares them), decoded in C in milliseconds where pyelftools
takes seconds to minutes. The library is built by `make setup` into tracer/unwind/cfi/ (or, when that
is stale and not writable, into the cache directory on first use); without a C compiler, or
with ALLOCSCOPE_CFI=python, or for a file the decoder does not read (ELFCLASS32, big-endian, a
compressed .eh_frame), the rows come from pyelftools instead.

`build_rows` is a module-level function of a path, with no state but the loaded library, so it
can run per module in a process pool; the C call releases the GIL, so threads run in parallel
too. The decoder holds nothing between calls.
"""

from __future__ import annotations

import ctypes as ct
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from elftools.common.exceptions import ELFError

from ..base.cachedir import cache_dir
from ..base.cc import CompileError, compile_c

CFI_DIR = Path(__file__).resolve().parent / "cfi"
CFI_SOURCES = (CFI_DIR / "cfi.c",)
CFI_NAME = "allocscope-cfi.so"
CFI_CFLAGS = ["-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]

OK, ERROR, FALLBACK, NEED_DEBUG_FRAME = 0, -1, 1, 2
SOURCES = ((1, ".eh_frame"), (2, ".debug_frame"))


class CfiError(ELFError):
    """The decoder refused the file (not ELF, truncated, a call-frame section past its end)."""


class CfiBuildError(Exception):
    """The decoder could not be compiled."""


class Result(ct.Structure):
    _fields_ = [
        ("rows", ct.c_void_p),
        ("nrows", ct.c_uint64),
        ("fdes", ct.c_uint64),
        ("sources", ct.c_uint32),
        ("reserved", ct.c_uint32),
        ("error", ct.c_char * 240),
    ]


ABI = ct.sizeof(Result) << 8 | 1


# --------------------------------------------------------------------------- the library


def build_library(out: Path, cc: str | None = None) -> Path:
    """Compile tracer/unwind/cfi/cfi.c into `out` (plain C and libc)."""
    try:
        return compile_c(CFI_SOURCES[0], out, CFI_CFLAGS, cc)
    except CompileError as e:
        raise CfiBuildError(f"building the CFI decoder failed: {e}") from None


def library_path() -> Path:
    """tracer/unwind/cfi/allocscope-cfi.so (built by `make setup`), rebuilt when its source is newer and
    the directory is writable, else one in the cache directory. Raises CfiBuildError."""
    newest = max(p.stat().st_mtime for p in CFI_SOURCES)
    here = CFI_DIR / CFI_NAME
    if here.exists() and here.stat().st_mtime >= newest:
        return here
    if os.access(CFI_DIR, os.W_OK):
        try:
            return build_library(here)
        except CfiBuildError:
            if here.exists():  # copied without its times (cp -r), on a box without a compiler
                return here
            raise

    cached = cache_dir("bpf").parent / CFI_NAME
    if cached.exists() and cached.stat().st_mtime >= newest:
        return cached
    return build_library(cached)


@lru_cache(maxsize=1)
def library() -> ct.CDLL | None:
    """The loaded decoder, None when it cannot be built or loaded (then pyelftools decodes)."""
    try:
        lib = ct.CDLL(str(library_path()))
    except (OSError, CfiBuildError):
        return None
    lib.cfi_abi.restype = ct.c_uint32
    if lib.cfi_abi() != ABI:
        return None
    args: list[Any] = [ct.c_void_p, ct.c_uint64, ct.c_void_p, ct.POINTER(Result)]
    lib.cfi_build_fd.argtypes = [ct.c_int, *args]
    lib.cfi_build_path.argtypes = [ct.c_char_p, *args]
    lib.cfi_build_fd.restype = lib.cfi_build_path.restype = ct.c_int
    lib.cfi_free.argtypes = [ct.POINTER(Result)]
    lib.cfi_free.restype = None
    return lib


def native_available() -> bool:
    return os.environ.get("ALLOCSCOPE_CFI") != "python" and library() is not None


# --------------------------------------------------------------------------- building rows


def _types() -> bytes:
    from . import rows as U  # noqa: PLC0415 - rows import this module's callers

    return bytes([U.CFA_NONE, U.CFA_RSP, U.CFA_RBP, U.CFA_PLT, U.CFA_SIGNAL, U.CFA_STOP, U.CFA_UNSUPPORTED])


def _debug_frame(path: str, fd: int | None) -> bytes:
    """The decompressed .debug_frame (pyelftools reads the compressed section)."""
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415

    with open(f"/proc/self/fd/{fd}" if fd is not None else path, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".debug_frame")
        return b"" if sec is None else sec.data()


def native_table(path: str, fd: int | None = None):
    """`TableInfo` from the C decoder; None when the decoder is not there or does not read this
    kind of file. Raises CfiError for a malformed file. `fd`: the file already open (read with
    pread, its offset untouched)."""
    from . import rows as U  # noqa: PLC0415 - rows import this module's callers

    if not native_available():
        return None
    lib = library()
    if lib is None:
        return None
    types = _types()
    res = Result()
    dbg: bytes | None = None
    for _ in range(2):
        dbg_ptr = ct.cast(ct.c_char_p(dbg), ct.c_void_p) if dbg is not None else None
        dbg_len = len(dbg) if dbg is not None else 0
        if fd is not None:
            rc = lib.cfi_build_fd(fd, dbg_ptr, dbg_len, types, ct.byref(res))
        else:
            rc = lib.cfi_build_path(os.fsencode(path), dbg_ptr, dbg_len, types, ct.byref(res))
        if rc != NEED_DEBUG_FRAME or dbg is not None:
            break
        dbg = _debug_frame(path, fd)
    try:
        if rc in (FALLBACK, NEED_DEBUG_FRAME):
            return None
        if rc != OK:
            raise CfiError(f"{path}: {res.error.decode(errors='replace')}")
        n = int(res.nrows)
        rows = np.empty(n, U.ROW)
        if n:
            ct.memmove(rows.ctypes.data, res.rows, n * U.ROW.itemsize)
    finally:
        lib.cfi_free(ct.byref(res))
    info = U.TableInfo(rows, fdes=int(res.fdes), sources=[name for bit, name in SOURCES if res.sources & bit])
    counts = np.bincount(rows["cfa_type"], minlength=1)  # as build_table's np.unique, in O(n)
    info.kinds = {U.CFA_NAMES.get(t, str(t)): int(c) for t, c in enumerate(counts.tolist()) if c}
    return info


def build_info(path: str, fd: int | None = None, elf=None):
    """`TableInfo` of the ELF file at `path`: the C decoder's, else pyelftools' `build_table`
    (on `elf` when the caller has it open). Raises OSError / ELFError."""
    from . import rows as U  # noqa: PLC0415 - rows import this module's callers

    info = native_table(path, fd)
    if info is not None:
        return info
    if elf is not None:
        return U.build_table(elf)
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415

    with open(path, "rb") as f:
        return U.build_table(ELFFile(f))


def build_rows(path: str) -> np.ndarray:
    """The unwind rows (dtype tracer.unwind.rows.ROW) of the ELF file at `path`, not cached. A
    module-level function of a path: fit for a process pool. Raises OSError / ELFError."""
    return build_info(path).rows
