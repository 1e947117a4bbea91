"""Unwind rows built off the probes' start and kept: cached per build ID (load_rows), decoded in
C where it can (tracer/unwind/native.py), built in a BuildPool (one worker per core) when stacks
cross a module that has none yet (docs/startup.md), and the LPM prefixes of a module's range."""

from __future__ import annotations

import ctypes as ct
import hashlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from elftools.elf.elffile import ELFFile

from common.elf import SHT_NOBITS, OpenedElf, RawElf, elf_build_id

from ..base.cachedir import cache_dir
from .native import build_info
from .rows import CACHE_VERSION, ROW

# --------------------------------------------------------------------------- cache


def file_key(opened: OpenedElf) -> str:
    """Build ID, or a digest of the file's identity when it has none."""
    bid = elf_build_id(opened.elf)
    if bid:
        return bid
    st = os.fstat(opened.stream.fileno())
    return "noid-" + hashlib.sha1(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def load_rows(path: str, use_cache: bool = True) -> tuple[str, np.ndarray, bool]:
    """(key, rows, from_cache) for the ELF file at `path` (raises OSError / ELFError)."""
    with OpenedElf.open(path) as opened:
        key = file_key(opened)
        cached = cached_rows(key) if use_cache else None
        if cached is not None:
            return key, cached, True
        rows = build_info(path, fd=opened.stream.fileno(), elf=opened.elf).rows  # native, else build_table
    if use_cache:
        _save(cache_dir("unwind") / f"v{CACHE_VERSION}-{key}.npy", rows)
    return key, rows, False


def _save(cpath: Path, rows: np.ndarray) -> None:
    try:
        cpath.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = cpath.with_name(f".{cpath.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, rows, allow_pickle=False)
        os.replace(tmp, cpath)
    except OSError:
        pass  # a cache that cannot be written only costs time


# --------------------------------------------------------------------------- LPM prefixes


def prefixes(lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """Aligned power-of-two blocks covering [lo, hi) exactly, as (address, prefix length)."""
    while lo < hi:
        k = (lo & -lo).bit_length() - 1 if lo else 64
        while (1 << k) > hi - lo:
            k -= 1
        yield lo, 64 - k
        lo += 1 << k


# --------------------------------------------------------------------------- builds off the critical path

INLINE_CFI_BYTES = 4 << 10  # a module with this little CFI is built at once (milliseconds), never pending
INLINE_BUDGET_BYTES = 32 << 10  # ... up to this much CFI in all per recording
NATIVE_INLINE_CFI_BYTES = 64 << 10  # the same with a compiled decoder (~10 ms a MiB of CFI)
NATIVE_INLINE_BUDGET_BYTES = 1 << 20
POLL_S = 0.1  # `upending` slot 0 (every stack cut short) read this often; the rest when it moved


def cfi_bytes(elf: ELFFile) -> int:
    """Bytes of call-frame information (.eh_frame + .debug_frame): what a build decodes."""
    n = 0
    for name in (".eh_frame", ".debug_frame"):
        sec = elf.get_section_by_name(name)
        if sec is not None and sec["sh_type"] != "SHT_NOBITS":
            n += sec["sh_size"]
    return n


def _raw_peek(path: str) -> tuple[str, int] | None:
    """(key, CFI bytes) read with struct (common.elf.RawElf: no pyelftools, ~0.3 ms a file
    instead of ~5); None where that reader does not take the file on."""
    raw = RawElf.open(path)
    if raw is None:
        return None
    with raw:
        try:
            bid = raw.build_id()
        except (ValueError, OSError):
            return None
        if not bid:
            st = os.fstat(raw.fd)
            bid = "noid-" + hashlib.sha1(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
        n = 0
        for name in (".eh_frame", ".debug_frame"):
            sec = raw.section(name)
            if sec is not None and sec.type != SHT_NOBITS:
                n += sec.size
        return bid, n


def peek(path: str, use_cache: bool = True) -> tuple[str, np.ndarray | None, int]:
    """(key, cached rows or None, CFI bytes) of the ELF file at `path`, building nothing (raises
    OSError / ELFError). The cache file is the one load_rows reads and writes."""
    fast = _raw_peek(path)
    if fast is not None:
        key, cfi = fast
        rows = cached_rows(key) if use_cache else None
        return (key, rows, 0) if rows is not None else (key, None, cfi)
    with OpenedElf.open(path) as opened:
        key = file_key(opened)
        rows = cached_rows(key) if use_cache else None
        return (key, rows, 0) if rows is not None else (key, None, cfi_bytes(opened.elf))


def cached_rows(key: str) -> np.ndarray | None:
    """The cached rows of the file with this key, None when there are none (or unreadable)."""
    try:
        rows = np.load(cache_dir("unwind") / f"v{CACHE_VERSION}-{key}.npy", allow_pickle=False)
    except (OSError, ValueError):
        return None
    return rows if rows.dtype == ROW else None


def build_module(path: str, use_cache: bool) -> tuple[str, np.ndarray, float]:
    """One build, in a worker process of BuildPool: load_rows (which caches what it builds).
    (key, rows, seconds)."""
    t0 = time.perf_counter()
    key, rows, _cached = load_rows(path, use_cache)
    return key, rows, time.perf_counter() - t0


def _started() -> None:
    """BuildPool.start's task: nothing (the worker is up)."""


def _worker_init() -> None:
    """A pool worker: Ctrl-C and a hang-up are the tracer's to handle (it stops the pool), and
    the worker dies with the tracer, even a SIGKILLed one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        ct.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# A build's peak memory per byte of CFI it decodes: pyelftools holds ~200 (libc: 149 KiB of CFI,
# +39 MiB; chromium: 409 KiB, +86 MiB); the compiled decoder ~20 (+9 MiB for chromium).
BUILD_BYTES_PER_CFI_BYTE = 256
NATIVE_BUILD_BYTES_PER_CFI_BYTE = 32


@lru_cache(maxsize=1)
def native_decoder() -> bool:
    """Whether load_rows decodes in C (tracer/unwind/native.py, where that module exists and its
    library is built): builds then take milliseconds and little memory."""
    try:
        from .native import native_available  # noqa: PLC0415
    except ImportError:
        return False
    try:
        return bool(native_available())
    except Exception:  # noqa: BLE001 - no decoder: pyelftools' costs
        return False


def build_costs() -> tuple[int, int, int]:
    """(CFI bytes of a module built at once, CFI bytes built at once in all, memory a build
    holds per byte of CFI) for the decoder load_rows uses."""
    if native_decoder():
        return NATIVE_INLINE_CFI_BYTES, NATIVE_INLINE_BUDGET_BYTES, NATIVE_BUILD_BYTES_PER_CFI_BYTE
    return INLINE_CFI_BYTES, INLINE_BUDGET_BYTES, BUILD_BYTES_PER_CFI_BYTE


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


class BuildPool:
    """Unwind-table builds in worker processes, one per core, started on first use. Spawned, not
    forked: the tracer has threads (BCC's, the ring poll) that a fork would copy mid-state. The
    target may be short of memory: builds running together stay within half of MemAvailable
    (estimated from their CFI bytes); one alone always may run."""

    def __init__(self, workers: int | None = None, use_cache: bool = True) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.use_cache = use_cache
        self._ex: ProcessPoolExecutor | None = None
        self._running: dict[Future, int] = {}  # build -> its estimated memory

    def can_start(self, cfi: int) -> bool:
        """Whether a build of `cfi` bytes of CFI may start now."""
        self._running = {f: m for f, m in self._running.items() if not f.done()}
        if len(self._running) >= self.workers:
            return False
        return not self._running or sum(self._running.values()) + cfi * build_costs()[2] <= mem_available() // 2

    def _executor(self) -> ProcessPoolExecutor:
        if self._ex is None:
            self._ex = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init
            )
        return self._ex

    def start(self, n: int) -> None:
        """Start `n` workers now (a worker takes ~0.3 s to start: not on the first build's clock)."""
        for _ in range(min(n, self.workers)):
            self._executor().submit(_started)

    def submit(self, path: str, cfi: int = 0) -> Future:
        fut = self._executor().submit(build_module, path, self.use_cache)
        self._running[fut] = cfi * build_costs()[2]
        return fut

    def close(self) -> None:
        """Stop at once: builds still running are killed (their modules stay without rows)."""
        ex, self._ex = self._ex, None
        if ex is None:
            return
        procs = list((getattr(ex, "_processes", None) or {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(2)


def build_all(
    paths: list[str],
    pool: BuildPool,
    progress: Callable[[str], None] | None = None,
    use_cache: bool = True,
    names: dict[str, str] | None = None,
) -> dict[str, tuple[str, np.ndarray, float] | str]:
    """Build every uncached table of `paths` (several paths of one build ID once), all at once in
    `pool`, the biggest first; path -> (key, rows, seconds), or why it failed. A handful of small
    modules are built here, in this process: cheaper than starting workers. `names`: what
    progress calls a path (default its base name)."""
    names = names or {}
    out: dict[str, tuple[str, np.ndarray, float] | str] = {}
    todo: dict[str, tuple[str, int]] = {}
    keys: set[str] = set()
    for path in paths:
        try:
            key, rows, cfi = peek(path, use_cache)
        except Exception as e:  # noqa: BLE001 - any malformed ELF: said, the rest go on
            out[path] = f"unreadable: {type(e).__name__}: {str(e)[:120]}"
            continue
        if rows is None and key not in keys:
            keys.add(key)
            todo[path] = (key, cfi)
    local = len(todo) <= 1 or sum(c for _k, c in todo.values()) <= 2 * build_costs()[1]
    queue = sorted(todo, key=lambda p: -todo[p][1])
    running: dict[Future, str] = {}
    res: Any
    finished: list[tuple[str, Any]]
    done = 0
    while queue or running:
        if local:
            path = queue.pop(0)
            try:
                res = build_module(path, use_cache)
            except Exception as e:  # noqa: BLE001 - whatever the ELF did
                res = e
            finished = [(path, res)]
        else:
            while queue and pool.can_start(todo[queue[0]][1]):
                path = queue.pop(0)
                running[pool.submit(path, todo[path][1])] = path
            ready, _ = wait(running, return_when=FIRST_COMPLETED)
            finished = []
            for fut in ready:
                path = running.pop(fut)
                try:
                    finished.append((path, fut.result()))
                except Exception as e:  # noqa: BLE001 - the worker's exception, whatever the ELF did
                    finished.append((path, e))
        for path, res in finished:
            if isinstance(res, Exception):
                out[path] = f"{type(res).__name__}: {str(res)[:120]}"
                continue
            out[path] = res
            done += 1
            if progress is not None and (res[2] > 0.5 or not local):
                name = os.path.basename(names.get(path, path))
                progress(f"unwind table for {name}: {len(res[1])} rows in {res[2]:.1f} s ({done}/{len(todo)})")
    return out
