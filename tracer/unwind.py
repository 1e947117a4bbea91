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

Nothing here needs BCC: `Unwinder` gets the BCC table objects from tracer.probe.
"""
from __future__ import annotations

import bisect
import ctypes as ct
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from elftools.common.exceptions import DWARFError, ELFError
from elftools.dwarf.callframe import CIE, FDE, CallFrameInstruction, RegisterRule
from elftools.dwarf.constants import DW_CFA
from elftools.dwarf.dwarfinfo import DebugSectionDescriptor, DwarfConfig, DWARFInfo
from elftools.elf.elffile import ELFFile

from common.elf import OpenedElf, elf_build_id, segments, vaddr_to_offset

from . import layout as L
from .cfirows import build_info
from .procfs import Mapping

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
    (DWARF 5, 6.4.2.2), as the native decoder (tracer/cfi/cfi.c) does."""
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

def cache_dir() -> Path:
    env = os.environ.get("ALLOCSCOPE_CACHE_DIR")
    if env:
        return Path(env) / "unwind"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "allocscope" / "unwind"


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
        cpath = cache_dir() / f"v{CACHE_VERSION}-{key}.npy"
        if use_cache:
            try:
                rows = np.load(cpath, allow_pickle=False)
                if rows.dtype == ROW:
                    return key, rows, True
            except (OSError, ValueError):
                pass
        rows = build_info(path, fd=opened.stream.fileno(), elf=opened.elf).rows  # native, else build_table
    if use_cache:
        _save(cpath, rows)
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


# --------------------------------------------------------------------------- BPF side

@dataclass
class Module:
    key: str
    path: str
    begin: int                          # first row in `urows`
    count: int
    slices: list[tuple[int, int, int, int]]  # (pc_lo, pc_hi, begin, count)
    cached: bool
    seconds: float


class UmapKey(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("addr", ct.c_uint8 * 8)]


class Umap(ct.Structure):
    _fields_ = [("bias", ct.c_uint64), ("begin", ct.c_uint32), ("count", ct.c_uint32)]


class Urow(ct.Structure):
    _fields_ = [("pc", ct.c_uint32), ("cfa_off", ct.c_int16), ("cfa_type", ct.c_uint8), ("rbp_off", ct.c_uint8)]


MAP_LAYOUTS = {"urows": (ct.c_uint32, Urow), "umaps": (UmapKey, Umap)}


def slices_of(n: int, rows: np.ndarray, begin: int) -> list[tuple[int, int, int, int]]:
    out = []
    for a in range(0, n, MAX_SLICE):
        b = min(n, a + MAX_SLICE)
        lo = int(rows["pc"][a]) if a else 0
        hi = int(rows["pc"][b]) if b < n else 1 << 32
        out.append((lo, hi, begin + a, b - a))
    return out


class Unwinder:
    """Keeps the BPF unwind maps in step with the target's executable mappings."""

    def __init__(self, bpf, pid: int, capacity: int, progress: Callable[[str], None] | None = None,
                 use_cache: bool = True, update_batch=None) -> None:
        self.pid = pid
        self.rows_map = bpf[b"urows"]
        self.lpm = bpf[b"umaps"]
        self.gen_map = bpf[b"ugen"]  # the probes' stack cache drops what it kept when this moves
        self.gen = 0
        self.capacity = capacity
        self.progress = progress or (lambda _m: None)
        self.use_cache = use_cache
        self._update_batch = update_batch
        self.next_row = 0
        self.modules: dict[str, Module] = {}
        self.by_file: dict[tuple[str, int], str | None] = {}  # (path, inode) -> module key
        self.failed: dict[str, str] = {}
        self.entries: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.seconds = 0.0

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
        try:
            key, rows, cached = load_rows(self._open_path(m), self.use_cache)
        except Exception as e:  # noqa: BLE001 - any malformed ELF/CFI: that module falls back
            self.failed[m.path] = f"unreadable: {type(e).__name__}: {str(e)[:120]}"
            self.by_file[ident] = None
            return None
        if key in self.modules:
            self.by_file[ident] = key
            return self.modules[key]
        n = len(rows)
        if self.next_row + n > self.capacity:
            self.failed[m.path] = f"unwind row table full ({self.capacity} rows)"
            self.by_file[ident] = None
            return None
        begin = self.next_row
        if n:
            self._write_rows(begin, rows)
        self.next_row += n
        mod = Module(key, m.path, begin, n, slices_of(n, rows, begin), cached, time.perf_counter() - t0)
        self.modules[key] = mod
        self.by_file[ident] = key
        if not cached and mod.seconds > 0.5:
            self.progress(f"unwind tables for {os.path.basename(m.path)}: {n} rows in {mod.seconds:.1f}s (cached now)")
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

    # -- mappings ---------------------------------------------------------------------------

    def preload(self, maps: list[Mapping]) -> None:
        """Build and load the tables of these files without mapping addresses (launch mode:
        the libraries are not mapped yet)."""
        t0 = time.perf_counter()
        for m in maps:
            if m.is_file and "x" in m.perms:
                self.module(m)
        self.seconds += time.perf_counter() - t0

    def update(self, maps: list[Mapping]) -> None:
        """Make `umaps` describe exactly the executable file mappings in `maps`."""
        t0 = time.perf_counter()
        want: dict[tuple[int, int], tuple[int, int, int]] = {}
        for m in maps:
            if not (m.is_file and "x" in m.perms) or m.end <= m.start:
                continue
            mod = self.module(m)
            if mod is None or mod.count == 0:
                continue
            bias = (m.start - m.offset) & 0xFFFFFFFFFFFFFFFF
            for lo, hi, begin, count in mod.slices:
                a, b = max(m.start, m.start - m.offset + lo), min(m.end, m.start - m.offset + hi)
                for addr, plen in prefixes(a, b) if a < b else ():
                    want[(addr, plen)] = (bias, begin, count)
        changed = False
        for k in [k for k in self.entries if k not in want]:
            try:
                del self.lpm[self._key(*k)]
            except KeyError:
                pass
            del self.entries[k]
            changed = True
        for k, v in want.items():
            if self.entries.get(k) != v:
                changed = True
                try:
                    self.lpm[self._key(*k)] = self.lpm.Leaf(*v)
                except Exception:  # noqa: BLE001 - BCC raises bare Exception: the trie is full
                    self.failed["[umaps]"] = f"address map full ({len(self.entries)} prefixes)"
                    continue
                self.entries[k] = v
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
        return {"modules": len(self.modules), "rows": self.next_row, "capacity": self.capacity,
                "prefixes": len(self.entries), "seconds": round(self.seconds, 3),
                "built": sorted(os.path.basename(m.path) for m in self.modules.values() if not m.cached),
                "failed": dict(self.failed)}


# --------------------------------------------------------------------------- recorder glue

def start_unwinder(probes, maps: list[Mapping], launched: bool, progress=None) -> Unwinder | None:
    """Load the tables of the target's executable mappings before the probes attach. Launch
    mode: `maps` are the files ldd resolves (not mapped yet): their rows are loaded now, their
    addresses when the loader maps them (Recorder._refresh_maps -> Unwinder.update)."""
    unw = probes.unwinder(progress)
    if unw is None:
        return None
    if launched:
        unw.preload(maps)
    else:
        unw.update(maps)
    return unw


