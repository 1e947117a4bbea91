"""DWARF call-frame information -> compact unwind rows for the in-kernel unwinder.

The BPF side (probes/unwind_dwarf.h) unwinds user stacks of code built without frame pointers
the way the OpenTelemetry eBPF profiler does: per module, `.eh_frame` (and `.debug_frame` where
it covers code `.eh_frame` does not) is turned into sorted rows, one per PC range:

    pc (u32 file offset) | cfa_off (s16, x8 bytes) | cfa_type (u8) | rbp_off (s8, x8 bytes)

CFA = rsp or rbp + offset; the return address is at CFA - 8 (x86-64); the caller's rbp is saved
at CFA + rbp_off, or left unchanged. PLT entries (their well-known CFA expression), the signal
trampoline `__restore_rt`, and rows whose return address is undefined (`_start`, `clone3`: the
end of the stack) get their own types; any other rule is `unsupported` and stops the unwinder
there. Every FDE ends with a `none` row, so a PC between functions is never unwound with the
previous function's rule (`none` = take a frame-pointer step).

Rows are cached per build ID (`$ALLOCSCOPE_CACHE_DIR` or `~/.cache/allocscope/unwind`), so
attaching to the same binaries again costs a file read. `Unwinder` loads them into the `urows`
array (every module a contiguous slice, each searched with at most 2^UNWIND_STEPS rows, bigger
modules split in several slices) and keeps the `umaps` LPM trie (target address prefix ->
slice, load bias) in step with the target's executable mappings, dlopen'd libraries included.

Building is off the probes' start (`--pid`, docs/startup.md): a module without cached rows is
registered pending (AS_UMAP_PENDING: stacks end there, counted per module in `upending`), and
built — in a BuildPool, one worker per core, through load_rows — once stacks cross it.

Nothing here needs BCC: `Unwinder` gets the BCC table objects from tracer.bpf.probes.
"""
from __future__ import annotations

import bisect
import ctypes as ct
import hashlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from elftools.common.exceptions import DWARFError, ELFError
from elftools.dwarf.callframe import CIE, FDE, CallFrameInstruction, RegisterRule
from elftools.dwarf.constants import DW_CFA
from elftools.dwarf.dwarfinfo import DebugSectionDescriptor, DwarfConfig, DWARFInfo
from elftools.elf.elffile import ELFFile

from common.elf import SHT_NOBITS, OpenedElf, RawElf, elf_build_id, segments, vaddr_to_offset

from ..base import layout as L
from ..base.cachedir import cache_dir
from ..process.procfs import Mapping
from .native import build_info

CACHE_VERSION = 2                 # 2: DW_CFA_def_cfa_sf scaled by the data alignment factor
UNWIND_STEPS = 20                 # binary search steps in BPF (-DAS_UNWIND_STEPS)
MAX_SLICE = 1 << UNWIND_STEPS     # rows one search can cover

ROW = np.dtype([("pc", "<u4"), ("cfa_off", "<i2"), ("cfa_type", "u1"), ("rbp_off", "i1")])

CFA_NONE, CFA_RSP, CFA_RBP, CFA_PLT, CFA_SIGNAL, CFA_STOP, CFA_UNSUPPORTED = (
    L.enum(n) for n in ("AS_CFA_NONE", "AS_CFA_RSP", "AS_CFA_RBP", "AS_CFA_PLT", "AS_CFA_SIGNAL",
                        "AS_CFA_STOP", "AS_CFA_UNSUPPORTED"))
CFA_NAMES = {CFA_NONE: "none", CFA_RSP: "rsp", CFA_RBP: "rbp", CFA_PLT: "plt", CFA_SIGNAL: "signal",
             CFA_STOP: "stop", CFA_UNSUPPORTED: "unsupported"}
RBP_UNKNOWN = -128
STACK_DWARF, STACK_TRUNCATED = 2, 4  # as_stack.flags (allocscope.h)

REG_RBP, REG_RSP, REG_RA = 6, 7, 16  # DWARF register numbers, x86-64
DW_CFA_GNU_args_size = 0x2E

# DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<N>; DW_OP_ge; DW_OP_lit3;
# DW_OP_shl; DW_OP_plus  ->  CFA = rsp + 8 + ((rip & 15) >= N) << 3   (lazy-binding PLT entries)
_PLT_HEAD = bytes([0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A])
_PLT_TAIL = bytes([0x2A, 0x33, 0x24, 0x22])
# __restore_rt (glibc, x86-64): CFA = *(rsp + 160), rip at rsp + 168, rbp at rsp + 120
_SIGNAL_CFA = bytes([0x77, 0xA0, 0x01, 0x06])
_SIGNAL_RA = bytes([0x77, 0xA8, 0x01])


# --------------------------------------------------------------------------- table building

@dataclass
class TableInfo:
    rows: np.ndarray
    fdes: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # cfa type name -> rows
    sources: list[str] = field(default_factory=list)     # sections used


def _encode(row: dict, ra_reg: int) -> tuple[int, int, int]:
    """(cfa_type, cfa_off, rbp_off) of one decoded CFI row."""
    cfa = row["cfa"]
    ra = row.get(ra_reg)
    if ra is not None and ra.type == RegisterRule.UNDEFINED:
        return CFA_STOP, 0, 0
    if cfa.expr is not None:
        expr = bytes(cfa.expr)
        if (len(expr) == 11 and expr.startswith(_PLT_HEAD) and expr.endswith(_PLT_TAIL)
                and 0x30 <= expr[6] <= 0x3F):
            return CFA_PLT, expr[6] - 0x30, 0
        if (expr == _SIGNAL_CFA and ra is not None and ra.type == RegisterRule.EXPRESSION
                and bytes(ra.arg) == _SIGNAL_RA):
            return CFA_SIGNAL, 0, 0
        return CFA_UNSUPPORTED, 0, 0
    if ra is None or ra.type != RegisterRule.OFFSET or ra.arg != -8:
        return CFA_UNSUPPORTED, 0, 0
    if cfa.reg == REG_RSP:
        typ = CFA_RSP
    elif cfa.reg == REG_RBP:
        typ = CFA_RBP
    else:
        return CFA_UNSUPPORTED, 0, 0
    off = cfa.offset
    if off is None or off % 8 or not -32768 <= off // 8 <= 32767:  # None: a rule pyelftools left open
        return CFA_UNSUPPORTED, 0, 0
    rbp = row.get(REG_RBP)
    if rbp is None or rbp.type == RegisterRule.SAME_VALUE:
        rbp_off = 0
    elif rbp.type == RegisterRule.OFFSET and rbp.arg % 8 == 0 and rbp.arg and -127 <= rbp.arg // 8 <= 127:
        rbp_off = rbp.arg // 8
    else:
        rbp_off = RBP_UNKNOWN
    return typ, off // 8, rbp_off


def _strip_args_size(entry) -> None:
    """pyelftools (0.33) cannot decode DW_CFA_GNU_args_size, which only matters to exception
    landing pads: drop it before decoding (from the entry and its CIE). And it scales the offset
    of DW_CFA_def_cfa_sf by the code alignment factor: give it the data alignment factor's
    (DWARF 5, 6.4.2.2), as the native decoder (tracer/unwind/cfi/cfi.c) does."""
    for e in (entry, getattr(entry, "cie", None)):
        if e is not None and "_decode_CFI_table" not in e.__dict__:
            cie = e if isinstance(e, CIE) else e.cie
            daf = cie.header["data_alignment_factor"] if isinstance(cie, CIE) else 1
            e.instructions = [CallFrameInstruction(DW_CFA.def_cfa, [i.args[0], i.args[1] * daf])
                              if i.opcode == DW_CFA.def_cfa_sf else i
                              for i in e.instructions if i.opcode != DW_CFA_GNU_args_size]


def frame_dwarfinfo(elf: ELFFile) -> tuple[DWARFInfo | None, list[str]]:
    """A DWARFInfo with only the call-frame sections read (not .debug_info & co)."""
    secs: dict[str, DebugSectionDescriptor | None] = {}
    used = []
    for name in (".eh_frame", ".debug_frame"):
        sec = elf.get_section_by_name(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS" or sec["sh_size"] == 0:
            secs[name] = None
            continue
        secs[name] = elf._read_dwarf_section(sec, relocate_dwarf_sections=False)
        used.append(name)
    if not used:
        return None, []
    cfg = DwarfConfig(little_endian=elf.little_endian, default_address_size=elf.elfclass // 8,
                      machine_arch=elf.get_machine_arch())
    none = dict.fromkeys(["debug_info_sec", "debug_aranges_sec", "debug_abbrev_sec", "debug_str_sec",
                          "debug_loc_sec", "debug_ranges_sec", "debug_line_sec", "debug_pubtypes_sec",
                          "debug_pubnames_sec", "debug_addr_sec", "debug_str_offsets_sec",
                          "debug_line_str_sec", "debug_loclists_sec", "debug_rnglists_sec",
                          "debug_sup_sec", "gnu_debugaltlink_sec", "debug_types_sec"])
    return DWARFInfo(config=cfg, debug_frame_sec=secs[".debug_frame"], eh_frame_sec=secs[".eh_frame"],
                     **none), used


def build_table(elf: ELFFile) -> TableInfo:
    """Unwind rows of one ELF file, sorted by file offset, consecutive duplicates merged."""
    if elf.get_machine_arch() != "x64":
        return TableInfo(np.empty(0, ROW))
    di, used = frame_dwarfinfo(elf)
    info = TableInfo(np.empty(0, ROW), sources=used)
    if di is None:
        return info
    segs = segments(elf)
    # pc -> (priority, encoding): FDE-end sentinels 0, .debug_frame 1, .eh_frame 2
    best: dict[int, tuple[int, tuple[int, int, int]]] = {}
    covered: list[tuple[int, int]] = []

    def put(pc: int, prio: int, enc: tuple[int, int, int]) -> None:
        old = best.get(pc)
        if old is None or old[0] <= prio:
            best[pc] = (prio, enc)

    groups = []
    if ".eh_frame" in used:
        groups.append((2, di.EH_CFI_entries()))
    if ".debug_frame" in used:
        groups.append((1, di.CFI_entries()))
    for prio, entries in groups:
        eh_ranges = sorted(covered)
        for fde in entries:
            if not isinstance(fde, FDE):
                continue
            start = fde.header["initial_location"]
            end = start + fde.header["address_range"]
            if prio == 1 and _overlaps(eh_ranges, start, end):
                continue  # .eh_frame has it
            lo, hi = vaddr_to_offset(segs, start, whole=True), vaddr_to_offset(segs, end, whole=True, end=True)
            if lo is None or hi is None or hi > 0xFFFFFFFF:
                continue
            try:
                _strip_args_size(fde)
                table = fde.get_decoded().table
            except (DWARFError, ELFError, KeyError, ValueError, IndexError, AssertionError, AttributeError):
                continue  # one undecodable FDE: its range falls back to frame pointers
            cie = fde.cie if isinstance(fde.cie, CIE) else None
            ra_reg = cie.header.get("return_address_register", REG_RA) if cie is not None else REG_RA
            info.fdes += 1
            if prio == 2:
                covered.append((start, end))
            put(hi, 0, (CFA_NONE, 0, 0))
            for row in table:
                pc = row["pc"]
                if not start <= pc < end:
                    continue
                put(pc - start + lo, prio, _encode(row, ra_reg))
    merged = []
    last = None
    for pc in sorted(best):
        enc = best[pc][1]
        if enc != last:
            merged.append((pc, enc[1], enc[0], enc[2]))
            last = enc
    rows = np.array(merged, dtype=ROW) if merged else np.empty(0, ROW)
    info.rows = rows
    types, counts = np.unique(rows["cfa_type"], return_counts=True)
    info.kinds = {CFA_NAMES.get(int(t), str(t)): int(c) for t, c in zip(types, counts)}
    return info


def _overlaps(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    i = bisect.bisect_right(ranges, (start, float("inf"))) - 1
    return any(0 <= j < len(ranges) and ranges[j][0] < end and start < ranges[j][1] for j in (i, i + 1))


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

INLINE_CFI_BYTES = 4 << 10    # a module with this little CFI is built at once (milliseconds), never pending
INLINE_BUDGET_BYTES = 32 << 10  # ... up to this much CFI in all per recording
NATIVE_INLINE_CFI_BYTES = 64 << 10  # the same with a compiled decoder (~10 ms a MiB of CFI)
NATIVE_INLINE_BUDGET_BYTES = 1 << 20
POLL_S = 0.1                  # `upending` slot 0 (every stack cut short) read this often; the rest when it moved


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
            self._ex = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_worker_init)
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


def build_all(paths: list[str], pool: BuildPool, progress: Callable[[str], None] | None = None,
              use_cache: bool = True, names: dict[str, str] | None = None
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


# --------------------------------------------------------------------------- BPF side

MODULE_SLOTS = 1024  # `upending` entries (AS_UNWIND_MODULES, probes/unwind_dwarf.h); slot 0: their sum
UMAP_PENDING = 1     # as_umap.flags (AS_UMAP_PENDING)


@dataclass
class Module:
    key: str
    path: str
    begin: int                          # first row in `urows`
    count: int
    slices: list[tuple[int, int, int, int]]  # (pc_lo, pc_hi, begin, count)
    cached: bool
    seconds: float
    slot: int = 0                       # in `upending` (pending modules)
    pending: bool = False               # registered, rows not loaded yet


@dataclass
class Pending:
    """A module registered without its rows: the stacks cut short there, and its build."""
    module: Module
    open_path: str                      # the file to build from (/proc/PID/map_files/...)
    cfi_bytes: int
    stacks: int = 0                     # stacks cut short at it (upending[slot])
    first_ns: int = 0
    last_ns: int = 0
    future: Future | None = None        # its build, while it runs
    built_ns: int = 0                   # when its rows went in (CLOCK_MONOTONIC), 0: not yet
    build_s: float = 0.0
    rows: int = 0
    error: str = ""


class UmapKey(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("addr", ct.c_uint8 * 8)]


class Umap(ct.Structure):
    _fields_ = [("bias", ct.c_uint64), ("begin", ct.c_uint32), ("count", ct.c_uint32),
                ("module", ct.c_uint32), ("flags", ct.c_uint32)]


class Urow(ct.Structure):
    _fields_ = [("pc", ct.c_uint32), ("cfa_off", ct.c_int16), ("cfa_type", ct.c_uint8), ("rbp_off", ct.c_uint8)]


class Upending(ct.Structure):
    _fields_ = [("stacks", ct.c_uint64), ("first_ns", ct.c_uint64), ("last_ns", ct.c_uint64)]


MAP_LAYOUTS = {"urows": (ct.c_uint32, Urow), "umaps": (UmapKey, Umap), "upending": (ct.c_uint32, Upending)}


def slices_of(n: int, rows: np.ndarray, begin: int) -> list[tuple[int, int, int, int]]:
    out = []
    for a in range(0, n, MAX_SLICE):
        b = min(n, a + MAX_SLICE)
        lo = int(rows["pc"][a]) if a else 0
        hi = int(rows["pc"][b]) if b < n else 1 << 32
        out.append((lo, hi, begin + a, b - a))
    return out


class Unwinder:
    """Keeps the BPF unwind maps in step with the target's executable mappings.

    Lazy (`record --pid`, `top --pid`): a module whose rows are cached is loaded at once; any
    other is registered pending (its whole mapping in `umaps`, no rows) unless its CFI is tiny.
    tick() — called by the recorder's loop — reads `upending`, builds the modules stacks crossed
    in a BuildPool, most-hit first, and loads them. Eager (launch mode): every module's rows are
    loaded before the mapping is entered (preload: all at once in the pool)."""

    def __init__(self, bpf, pid: int, capacity: int, progress: Callable[[str], None] | None = None,
                 use_cache: bool = True, update_batch=None, lazy: bool = True, workers: int | None = None) -> None:
        self.pid = pid
        self.rows_map = bpf[b"urows"]
        self.lpm = bpf[b"umaps"]
        self.gen_map = bpf[b"ugen"]  # the probes' stack cache drops what it kept when this moves
        self.pend_map = bpf[b"upending"]
        self.gen = 0
        self.capacity = capacity
        self.progress = progress or (lambda _m: None)
        self.use_cache = use_cache
        self.lazy = lazy
        self.pool = BuildPool(workers, use_cache)
        self._update_batch = update_batch
        self.next_row = 0
        self.next_slot = 1
        self.inline_cfi, self.inline_left, _ = build_costs()
        self.modules: dict[str, Module] = {}
        self.by_file: dict[tuple[str, int], str | None] = {}  # (path, inode) -> module key
        self.pending: dict[str, Pending] = {}  # key -> every module that was registered pending
        self.prebuilt: dict[str, np.ndarray] = {}  # preload: rows built in the pool (a cache that cannot be written)
        self.failed: dict[str, str] = {}
        self.entries: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        self.seconds = 0.0
        self.t0_ns = time.monotonic_ns()  # the recording's start (the recorder sets it once the probes are live)
        self._maps: list[Mapping] = []
        self._next_poll = 0
        self._total = 0  # upending[0].stacks when last read

    # -- modules ---------------------------------------------------------------------------

    def _open_path(self, m: Mapping) -> str:
        """The mapped file: /proc/PID/map_files survives deletion and mount namespaces."""
        mf = f"/proc/{self.pid}/map_files/{m.start:x}-{m.end:x}"
        if m.start and os.path.exists(mf):
            return mf
        return m.path.removesuffix(" (deleted)")

    def module(self, m: Mapping) -> Module | None:
        ident = (m.path, m.inode)
        if ident in self.by_file:
            key = self.by_file[ident]
            return self.modules.get(key) if key else None
        t0 = time.perf_counter()
        path = self._open_path(m)
        try:
            key, rows, cfi = peek(path, self.use_cache)
            if key in self.modules:
                self.by_file[ident] = key
                return self.modules[key]
            cached = rows is not None
            if cached and self.lazy and self.next_row + len(rows) > self.capacity // 2:
                # Warm but big: the table is kept for the modules stacks cross. Past half of it
                # at attach, a cached module waits like an unbuilt one (loaded from the cache,
                # in milliseconds, once a stack crosses it): a process whose every table is
                # cached (doctor --warm) cannot fill the table with modules no stack reaches.
                return self._pend(ident, key, m.path, path, cfi)
            if rows is None and key in self.prebuilt:
                rows = self.prebuilt.pop(key)
            elif rows is None:
                if self.lazy and not cfi <= min(self.inline_cfi, self.inline_left):
                    return self._pend(ident, key, m.path, path, cfi)
                if self.lazy:
                    self.inline_left -= cfi
                key, rows, cached = load_rows(path, self.use_cache)
        except Exception as e:  # noqa: BLE001 - any malformed ELF/CFI: that module falls back
            self.failed[m.path] = f"unreadable: {type(e).__name__}: {str(e)[:120]}"
            self.by_file[ident] = None
            return None
        mod = self._add(key, m.path, rows, cached, time.perf_counter() - t0)
        self.by_file[ident] = key if mod is not None else None
        return mod

    def _add(self, key: str, path: str, rows: np.ndarray, cached: bool, seconds: float) -> Module | None:
        n = len(rows)
        if self.next_row + n > self.capacity:
            self.failed[path] = f"unwind row table full ({self.capacity} rows)"
            return None
        begin = self.next_row
        if n:
            self._write_rows(begin, rows)
        self.next_row += n
        mod = Module(key, path, begin, n, slices_of(n, rows, begin), cached, seconds)
        self.modules[key] = mod
        if not cached and seconds > 0.5:
            self.progress(f"unwind tables for {os.path.basename(path)}: {n} rows in {seconds:.1f}s (cached now)")
        return mod

    def _pend(self, ident: tuple[str, int], key: str, path: str, open_path: str, cfi: int) -> Module | None:
        """Register a module without rows: stacks reaching it end there until it is built."""
        if self.next_slot >= MODULE_SLOTS:
            self.failed[path] = f"more than {MODULE_SLOTS - 1} modules waiting for their unwind tables"
            self.by_file[ident] = None
            return None
        mod = Module(key, path, 0, 0, [], False, 0.0, slot=self.next_slot, pending=True)
        self.next_slot += 1
        self.modules[key] = mod
        self.by_file[ident] = key
        self.pending[key] = Pending(mod, open_path, cfi)
        return mod

    def _write_rows(self, begin: int, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows)
        step = 1 << 16
        for a in range(0, len(rows), step):
            chunk = rows[a:a + step]
            keys = np.arange(begin + a, begin + a + len(chunk), dtype=np.uint32)
            if self._update_batch is not None:
                cnt = ct.c_uint32(len(chunk))
                if self._update_batch(self.rows_map.map_fd, keys.ctypes.data, chunk.ctypes.data,
                                      ct.byref(cnt)) == 0 and cnt.value == len(chunk):
                    continue
            leaf = self.rows_map.Leaf
            for k, (pc, off, typ, rbp) in zip(keys.tolist(), chunk.tolist()):
                self.rows_map[self.rows_map.Key(k)] = leaf(pc, off, typ, rbp & 0xFF)

    # -- pending modules -------------------------------------------------------------------

    def tick(self, force: bool = False) -> bool:
        """Read which pending modules stacks crossed, build them (most-hit first, as many at once
        as the pool has workers and memory allows), load the ones built. At most every POLL_S:
        one read of slot 0 (the sum) unless it moved or builds run. True when `umaps` changed."""
        waiting = [p for p in self.pending.values() if p.module.pending]
        if not waiting:
            return False
        now = time.monotonic_ns()
        if not force and now < self._next_poll:
            return False
        self._next_poll = now + int(POLL_S * 1e9)
        total = self._read_slot(0)[0]
        if total == self._total and not force and not any(p.future is not None for p in waiting):
            return False
        self._total = total
        self._read_hits(waiting)
        changed = self._collect(waiting)
        for p in sorted((p for p in waiting if p.stacks and p.future is None and p.module.pending),
                        key=lambda p: -p.stacks):
            if not self.pool.can_start(p.cfi_bytes):
                break  # the most-hit waits for a worker (or memory), not overtaken
            p.future = self.pool.submit(p.open_path, p.cfi_bytes)
        return changed

    def _read_slot(self, slot: int) -> tuple[int, int, int]:
        try:
            v = self.pend_map[self.pend_map.Key(slot)]
        except KeyError:
            return 0, 0, 0
        return int(v.stacks), int(v.first_ns), int(v.last_ns)

    def _read_hits(self, which: list[Pending]) -> None:
        for p in which:
            p.stacks, p.first_ns, p.last_ns = self._read_slot(p.module.slot)

    def _collect(self, waiting: list[Pending]) -> bool:
        done = [p for p in waiting if p.future is not None and p.future.done()]
        for p in done:
            fut, p.future = p.future, None
            mod = p.module
            try:
                _key, rows, p.build_s = fut.result()
            except Exception as e:  # noqa: BLE001 - whatever the ELF did to the builder: that module falls back
                p.error = f"{type(e).__name__}: {str(e)[:120]}"
                self.failed[mod.path] = f"unwind table not built: {p.error}"
                mod.pending = False  # no rows: frame-pointer steps there, as for a module without CFI
                continue
            n = len(rows)
            if self.next_row + n > self.capacity:
                p.error = f"unwind row table full ({self.capacity} rows)"
                self.failed[mod.path] = p.error
                mod.pending = False
                continue
            if n:
                self._write_rows(self.next_row, rows)
            mod.begin, mod.count, mod.slices = self.next_row, n, slices_of(n, rows, self.next_row)
            self.next_row += n
            mod.seconds, mod.pending = p.build_s, False
            p.rows = n
        if not done:
            return False
        self.update(self._maps)  # the entries of the built modules now point at their rows
        now = time.monotonic_ns()
        for p in done:
            if not p.error:
                p.built_ns = now
                self.progress(f"unwind table for {os.path.basename(p.module.path)}: {p.rows} rows in "
                              f"{p.build_s:.1f} s; stacks through it complete from +{self._rel(now):.1f} s")
        return True

    def finish(self) -> None:
        """Before the final metadata: the last counts (of every module that was pending), and the
        builds still running stopped."""
        self._read_hits(list(self.pending.values()))
        self.close()

    def close(self) -> None:
        self.pool.close()

    def _rel(self, ns: int) -> float:
        return max(0.0, (ns - self.t0_ns) / 1e9)

    # -- mappings ---------------------------------------------------------------------------

    def preload(self, maps: list[Mapping]) -> None:
        """Build and load the tables of these files without mapping addresses (launch mode:
        the libraries are not mapped yet). The uncached ones are built all at once in the pool."""
        t0 = time.perf_counter()
        files = [m for m in maps if m.is_file and "x" in m.perms]
        built = build_all([self._open_path(m) for m in files], self.pool, self.progress, self.use_cache)
        for res in built.values():
            if not isinstance(res, str):
                self.prebuilt[res[0]] = res[1]
        for m in files:
            self.module(m)
        self.prebuilt.clear()
        self.seconds += time.perf_counter() - t0

    def update(self, maps: list[Mapping]) -> None:
        """Make `umaps` describe exactly the executable file mappings in `maps`."""
        t0 = time.perf_counter()
        self._maps = maps
        want: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        for m in maps:
            if not (m.is_file and "x" in m.perms) or m.end <= m.start:
                continue
            mod = self.module(m)
            if mod is None:
                continue
            bias = (m.start - m.offset) & 0xFFFFFFFFFFFFFFFF
            if mod.pending:  # the whole mapping: any pc in it ends the stack there, counted
                for addr, plen in prefixes(m.start, m.end):
                    want[(addr, plen)] = (bias, 0, 0, mod.slot, UMAP_PENDING)
                continue
            if mod.count == 0:
                continue
            for lo, hi, begin, count in mod.slices:
                a, b = max(m.start, m.start - m.offset + lo), min(m.end, m.start - m.offset + hi)
                for addr, plen in prefixes(a, b) if a < b else ():
                    want[(addr, plen)] = (bias, begin, count, mod.slot, 0)
        changed = False
        for k, v in want.items():  # new values first: a prefix changing hands is never missing
            if self.entries.get(k) != v:
                changed = True
                try:
                    self.lpm[self._key(*k)] = self.lpm.Leaf(*v)
                except Exception:  # noqa: BLE001 - BCC raises bare Exception: the trie is full
                    self.failed["[umaps]"] = f"address map full ({len(self.entries)} prefixes)"
                    continue
                self.entries[k] = v
        for k in [k for k in self.entries if k not in want]:
            try:
                del self.lpm[self._key(*k)]
            except KeyError:
                pass
            del self.entries[k]
            changed = True
        if changed:
            self.gen += 1
            self.gen_map[self.gen_map.Key(0)] = self.gen_map.Leaf(self.gen)
        self.seconds += time.perf_counter() - t0

    def _key(self, addr: int, plen: int):
        key = self.lpm.Key()
        key.prefixlen = plen
        for i, b in enumerate(addr.to_bytes(8, "big")):
            key.addr[i] = b
        return key

    def meta(self) -> dict:
        """meta.json `unwind` (with the probes' mode): `pending` lists every module stacks were cut
        short at (or that was built) while its table was not loaded, most-hit first — stacks,
        first_s / last_s (seconds since the recording's start), built_s (when its rows went in;
        None: not by the end), build_s (the build's own seconds), rows, error."""
        crossed = [p for p in self.pending.values() if p.stacks or p.built_ns or p.error]
        return {"modules": len(self.modules), "rows": self.next_row, "capacity": self.capacity,
                "prefixes": len(self.entries), "seconds": round(self.seconds, 3),
                "built": sorted(os.path.basename(m.path) for k, m in self.modules.items()
                                if not (m.cached or m.pending or (k in self.pending and self.pending[k].error))),
                "failed": dict(self.failed), "lazy": self.lazy,
                "pending": [{"module": p.module.path, "stacks": p.stacks,
                             "first_s": round(self._rel(p.first_ns), 3) if p.first_ns else None,
                             "last_s": round(self._rel(p.last_ns), 3) if p.last_ns else None,
                             "built_s": round(self._rel(p.built_ns), 3) if p.built_ns else None,
                             "build_s": round(p.build_s, 3), "rows": p.rows, "error": p.error}
                            for p in sorted(crossed, key=lambda p: -p.stacks)],
                "never_crossed": sum(1 for p in self.pending.values() if p not in crossed)}


# --------------------------------------------------------------------------- recorder glue

def start_unwinder(probes, maps: list[Mapping], launched: bool, progress=None) -> Unwinder | None:
    """Register the target's executable mappings before the probes attach: cached rows are
    loaded, any other module is left pending (built once stacks cross it: Unwinder.tick). Launch
    mode: `maps` are the files ldd resolves (not mapped yet): their rows are built (all at once)
    and loaded now, their addresses when the loader maps them (Recorder._refresh_maps ->
    Unwinder.update), dlopen'd code at its mapping while the probes hold the thread."""
    unw = probes.unwinder(progress, lazy=not launched)
    if unw is None:
        return None
    if launched:
        unw.preload(maps)
    else:
        unw.update(maps)
        if unw.pending:
            unw.pool.start(2)  # the first builds need not wait for workers to start
    return unw


def warm(paths: list[str], progress: Callable[[str], None] | None = None, workers: int | None = None,
         names: dict[str, str] | None = None) -> dict[str, tuple[str, np.ndarray, float] | str]:
    """Fill the cache with the tables of `paths` (doctor --warm), on every core."""
    pool = BuildPool(workers)
    try:
        return build_all(paths, pool, progress, names=names)
    finally:
        pool.close()


def warm_process(pid: int, say: Callable[[str], None], workers: int | None = None) -> bool:
    """doctor --warm: the tables of every executable file mapping of `pid`, built into the cache
    on every core, one line a module built and a summary. False when some could not be built."""
    from ..process.procfs import read_maps  # noqa: PLC0415

    seen: set[tuple[str, int]] = set()
    paths, names = [], {}
    for m in read_maps(pid):
        if m.is_file and "x" in m.perms and (m.path, m.inode) not in seen:
            seen.add((m.path, m.inode))
            mf = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
            paths.append(mf if os.path.exists(mf) else m.path.removesuffix(" (deleted)"))
            names[paths[-1]] = m.path
    t0 = time.perf_counter()
    n = max(1, workers or os.cpu_count() or 1)
    say(f"unwind tables of pid {pid}: {len(paths)} modules; building the uncached ones on {n} cores "
        f"into {cache_dir('unwind')}")
    res = warm(paths, say, workers, names)
    bad = {p: r for p, r in res.items() if isinstance(r, str)}
    for p, why in bad.items():
        say(f"  not built: {names.get(p, p)}: {why}")
    say(f"unwind tables of pid {pid}: {len(res) - len(bad)} built, {len(paths) - len(res)} cached already, "
        f"{len(bad)} failed, in {time.perf_counter() - t0:.1f} s")
    return not bad
