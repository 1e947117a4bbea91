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

Rows are cached per build ID (tracer/unwind/building.py) (`$ALLOCSCOPE_CACHE_DIR` or `~/.cache/allocscope/unwind`), so
attaching to the same binaries again costs a file read. `Unwinder` loads them into the `urows`
array (every module a contiguous slice, each searched with at most 2^UNWIND_STEPS rows, bigger
modules split in several slices) and keeps the `umaps` LPM trie (target address prefix ->
slice, load bias) in step with the target's executable mappings, dlopen'd libraries included.

Building is off the probes' start (`--pid`, docs/startup.md): a module without cached rows is
registered pending (AS_UMAP_PENDING: stacks end there, counted per module in `upending`), and
built — in a BuildPool, one worker per core, through load_rows — once stacks cross it.

The rest: the cache and the builds (tracer/unwind/building.py), the maps (tracer/unwind/unwinder.py).
Nothing here needs BCC: `Unwinder` gets the BCC table objects from tracer.bpf.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
from elftools.common.exceptions import DWARFError, ELFError
from elftools.dwarf.callframe import CIE, FDE, CallFrameInstruction, RegisterRule
from elftools.dwarf.constants import DW_CFA
from elftools.dwarf.dwarfinfo import DebugSectionDescriptor, DwarfConfig, DWARFInfo
from elftools.elf.elffile import ELFFile

from common.elf import segments, vaddr_to_offset

from ..base import layout as L

CACHE_VERSION = 2  # 2: DW_CFA_def_cfa_sf scaled by the data alignment factor
UNWIND_STEPS = 20  # binary search steps in BPF (-DAS_UNWIND_STEPS)
MAX_SLICE = 1 << UNWIND_STEPS  # rows one search can cover

ROW = np.dtype([("pc", "<u4"), ("cfa_off", "<i2"), ("cfa_type", "u1"), ("rbp_off", "i1")])

CFA_NONE, CFA_RSP, CFA_RBP, CFA_PLT, CFA_SIGNAL, CFA_STOP, CFA_UNSUPPORTED = (
    L.enum(n)
    for n in (
        "AS_CFA_NONE",
        "AS_CFA_RSP",
        "AS_CFA_RBP",
        "AS_CFA_PLT",
        "AS_CFA_SIGNAL",
        "AS_CFA_STOP",
        "AS_CFA_UNSUPPORTED",
    )
)
CFA_NAMES = {
    CFA_NONE: "none",
    CFA_RSP: "rsp",
    CFA_RBP: "rbp",
    CFA_PLT: "plt",
    CFA_SIGNAL: "signal",
    CFA_STOP: "stop",
    CFA_UNSUPPORTED: "unsupported",
}
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
    sources: list[str] = field(default_factory=list)  # sections used


def _encode(row: dict, ra_reg: int) -> tuple[int, int, int]:
    """(cfa_type, cfa_off, rbp_off) of one decoded CFI row."""
    cfa = row["cfa"]
    ra = row.get(ra_reg)
    if ra is not None and ra.type == RegisterRule.UNDEFINED:
        return CFA_STOP, 0, 0
    if cfa.expr is not None:
        expr = bytes(cfa.expr)
        if len(expr) == 11 and expr.startswith(_PLT_HEAD) and expr.endswith(_PLT_TAIL) and 0x30 <= expr[6] <= 0x3F:
            return CFA_PLT, expr[6] - 0x30, 0
        if (
            expr == _SIGNAL_CFA
            and ra is not None
            and ra.type == RegisterRule.EXPRESSION
            and bytes(ra.arg) == _SIGNAL_RA
        ):
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
            e.instructions = [
                CallFrameInstruction(DW_CFA.def_cfa, [i.args[0], i.args[1] * daf])
                if i.opcode == DW_CFA.def_cfa_sf
                else i
                for i in e.instructions
                if i.opcode != DW_CFA_GNU_args_size
            ]


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
    cfg = DwarfConfig(
        little_endian=elf.little_endian, default_address_size=elf.elfclass // 8, machine_arch=elf.get_machine_arch()
    )
    none = dict.fromkeys(
        [
            "debug_info_sec",
            "debug_aranges_sec",
            "debug_abbrev_sec",
            "debug_str_sec",
            "debug_loc_sec",
            "debug_ranges_sec",
            "debug_line_sec",
            "debug_pubtypes_sec",
            "debug_pubnames_sec",
            "debug_addr_sec",
            "debug_str_offsets_sec",
            "debug_line_str_sec",
            "debug_loclists_sec",
            "debug_rnglists_sec",
            "debug_sup_sec",
            "gnu_debugaltlink_sec",
            "debug_types_sec",
        ]
    )
    return DWARFInfo(config=cfg, debug_frame_sec=secs[".debug_frame"], eh_frame_sec=secs[".eh_frame"], **none), used


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
