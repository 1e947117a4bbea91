"""DWARF line-number programs (.debug_line, DWARF 2-5): address -> (source file, line).

Every program of a file is decoded in one pass by a small dedicated interpreter into three
sorted arrays (address, file id, line); a lookup is a bisect. pyelftools' line program objects
cost about ten times more on a libc-sized file. VLIW op_index is ignored.
"""

from __future__ import annotations

import posixpath
import struct
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from elftools.elf.elffile import ELFFile

from common.elf import section_bytes

from .dwarf import ByteOrder, Malformed, cstring, initial_length, sleb, string_at, uleb

_END = -1  # file id of an end_sequence row
_FILE_BITS = 24


@dataclass
class _Strings:
    """String sections a DWARF 5 line header may point into."""

    debug_str: bytes = b""
    debug_line_str: bytes = b""


@dataclass
class _LineUnit:
    """The file and directory tables of one line-number program."""

    offset: int  # offset of the program in .debug_line (== DW_AT_stmt_list)
    version: int
    dirs: list[str | None]
    files: list[tuple[str | None, int]]  # (name, directory index)

    def path(self, index: int, comp_dir: Callable[[], str | None]) -> str | None:
        """Full path of file ``index`` (1-based before DWARF 5, 0-based from 5 on)."""
        slot = index if self.version >= 5 else index - 1
        if not 0 <= slot < len(self.files):
            return None
        name, dir_index = self.files[slot]
        if not name or posixpath.isabs(name):
            return name
        if self.version >= 5:
            directory = self.dirs[dir_index] if dir_index < len(self.dirs) else None
            base = self.dirs[0] if self.dirs else None
        else:
            base = comp_dir()
            directory = (
                base if dir_index == 0 else (self.dirs[dir_index - 1] if dir_index - 1 < len(self.dirs) else None)
            )
        if directory and not posixpath.isabs(directory) and base and directory is not base:
            directory = posixpath.join(base, directory)
        return posixpath.join(directory, name) if directory else name


_DW_FORM_SIZES = {0x0B: 1, 0x05: 2, 0x06: 4, 0x07: 8, 0x1E: 16, 0x25: 1, 0x26: 2, 0x27: 3, 0x28: 4}


def _read_form(
    buf: bytes, pos: int, form: int, offset_size: int, order: ByteOrder, strings: _Strings
) -> tuple[Any, int]:
    """Decode one attribute value of a DWARF 5 directory/file entry."""
    if form == 0x08:  # DW_FORM_string
        return cstring(buf, pos)
    if form in (0x1F, 0x0E):  # DW_FORM_line_strp, DW_FORM_strp
        off = int.from_bytes(buf[pos : pos + offset_size], order)
        table = strings.debug_line_str if form == 0x1F else strings.debug_str
        return string_at(table, off), pos + offset_size
    if form == 0x0F:  # DW_FORM_udata
        return uleb(buf, pos)
    if form == 0x0D:  # DW_FORM_sdata
        return sleb(buf, pos)
    if form in _DW_FORM_SIZES:  # data1/2/4/8/16 and strx1-4 (string index: unsupported)
        size = _DW_FORM_SIZES[form]
        value = int.from_bytes(buf[pos : pos + size], order) if form < 0x20 else None
        return value, pos + size
    if form == 0x1A:  # DW_FORM_strx
        return None, uleb(buf, pos)[1]
    if form == 0x09:  # DW_FORM_block
        size, pos = uleb(buf, pos)
        return None, pos + size
    if form == 0x0A:  # DW_FORM_block1
        return None, pos + 1 + buf[pos]
    raise Malformed(f"form 0x{form:x} in a line table header")


def _read_entry_table(
    buf: bytes, pos: int, offset_size: int, order: ByteOrder, strings: _Strings
) -> tuple[list[dict[int, Any]], int]:
    """A DWARF 5 directory or file-name table: its format, then its entries."""
    format_count = buf[pos]
    pos += 1
    fmt = []
    for _ in range(format_count):
        content, pos = uleb(buf, pos)
        form, pos = uleb(buf, pos)
        fmt.append((content, form))
    count, pos = uleb(buf, pos)
    entries = []
    for _ in range(count):
        entry: dict[int, Any] = {}
        for content, form in fmt:
            entry[content], pos = _read_form(buf, pos, form, offset_size, order, strings)
        entries.append(entry)
    return entries, pos


@dataclass
class _LineHeader:
    unit: _LineUnit
    program_start: int
    unit_end: int
    min_inst_length: int
    default_is_stmt: bool
    line_base: int
    line_range: int
    opcode_base: int
    std_lengths: bytes
    address_size: int


def _parse_line_header(buf: bytes, pos: int, order: ByteOrder, strings: _Strings, address_size: int) -> _LineHeader:
    """Decode one line-number program header (DWARF 2 to 5)."""
    unit_offset = pos
    unit_length, pos, offset_size = initial_length(buf, pos, order)
    unit_end = pos + unit_length
    version = int.from_bytes(buf[pos : pos + 2], order)
    pos += 2
    if not 2 <= version <= 5:
        raise Malformed(f"line table version {version}")
    if version >= 5:
        address_size = buf[pos]
        pos += 2  # address_size, segment_selector_size
    header_length = int.from_bytes(buf[pos : pos + offset_size], order)
    pos += offset_size
    program_start = pos + header_length
    min_inst_length = buf[pos]
    pos += 1
    if version >= 4:
        pos += 1  # maximum_operations_per_instruction (VLIW only)
    default_is_stmt = bool(buf[pos])
    line_base = struct.unpack_from("b", buf, pos + 1)[0]
    line_range = buf[pos + 2]
    opcode_base = buf[pos + 3]
    pos += 4
    std_lengths = bytes(buf[pos : pos + opcode_base - 1])
    pos += opcode_base - 1
    if not line_range or min(unit_end, program_start) > len(buf):
        raise Malformed("truncated or degenerate line table header")
    dirs: list[str | None] = []
    files: list[tuple[str | None, int]] = []
    if version >= 5:
        dir_entries, pos = _read_entry_table(buf, pos, offset_size, order, strings)
        dirs = [e.get(1) for e in dir_entries]  # DW_LNCT_path
        file_entries, pos = _read_entry_table(buf, pos, offset_size, order, strings)
        files = [(e.get(1), e.get(2) or 0) for e in file_entries]  # path, directory_index
    else:
        while buf[pos]:
            name, pos = cstring(buf, pos)
            dirs.append(name)
        pos += 1
        while buf[pos]:
            name, pos = cstring(buf, pos)
            dir_index, pos = uleb(buf, pos)
            pos = uleb(buf, uleb(buf, pos)[1])[1]  # mtime, length
            files.append((name, dir_index))
    unit = _LineUnit(unit_offset, version, dirs, files)
    return _LineHeader(
        unit,
        program_start,
        unit_end,
        min_inst_length,
        default_is_stmt,
        line_base,
        line_range,
        opcode_base,
        std_lengths,
        address_size,
    )


_Sequence = tuple[array, array, array]  # addresses, file ids, lines


def _run_line_program(
    buf: bytes, hdr: _LineHeader, file_base: int, order: ByteOrder, keep: Callable[[int], bool]
) -> Iterator[_Sequence]:
    """Interpret one line-number program; yield its sequences that ``keep`` accepts.

    Rows are (address, file id, line); each sequence ends with an ``_END`` row at the
    first address past it. VLIW op_index is ignored (max_ops_per_instruction == 1).
    """
    min_len, opcode_base, line_range = hdr.min_inst_length, hdr.opcode_base, hdr.line_range
    special_addr = [0] * 256
    special_line = [0] * 256
    for op in range(opcode_base, 256):
        adj = op - opcode_base
        special_addr[op] = (adj // line_range) * min_len
        special_line[op] = hdr.line_base + adj % line_range
    const_add_pc = special_addr[255]
    std_lengths = hdr.std_lengths
    pos, end = hdr.program_start, min(hdr.unit_end, len(buf))
    first_file = 1
    address, fid, line = 0, file_base | first_file, 1
    addrs, fids, lines = array("Q"), array("q"), array("q")
    while pos < end:
        op = buf[pos]
        pos += 1
        if op >= opcode_base:
            address += special_addr[op]
            line += special_line[op]
            addrs.append(address)
            fids.append(fid)
            lines.append(line)
        elif op == 0:  # extended opcode
            length, pos = uleb(buf, pos)
            if not length:
                continue
            sub, after = buf[pos], pos + length
            if sub == 1:  # DW_LNE_end_sequence
                addrs.append(address)
                fids.append(_END)
                lines.append(0)
                if len(addrs) > 1 and keep(addrs[0]):
                    yield addrs, fids, lines
                address, fid, line = 0, file_base | first_file, 1
                addrs, fids, lines = array("Q"), array("q"), array("q")
            elif sub == 2:  # DW_LNE_set_address
                address = int.from_bytes(buf[pos + 1 : after], order)
            elif sub == 3:  # DW_LNE_define_file (DWARF < 5)
                name, p = cstring(buf, pos + 1)
                hdr.unit.files.append((name, uleb(buf, p)[0]))
            pos = after
        elif op == 1:  # DW_LNS_copy
            addrs.append(address)
            fids.append(fid)
            lines.append(line)
        elif op == 2:  # DW_LNS_advance_pc
            value, pos = uleb(buf, pos)
            address += value * min_len
        elif op == 3:  # DW_LNS_advance_line
            value, pos = sleb(buf, pos)
            line += value
        elif op == 4:  # DW_LNS_set_file
            value, pos = uleb(buf, pos)
            fid = file_base | (value & ((1 << _FILE_BITS) - 1))
        elif op == 8:  # DW_LNS_const_add_pc
            address += const_add_pc
        elif op == 9:  # DW_LNS_fixed_advance_pc
            address += int.from_bytes(buf[pos : pos + 2], order)
            pos += 2
        elif op in (5, 12):  # set_column, set_isa
            pos = uleb(buf, pos)[1]
        elif op in (6, 7, 10, 11):  # negate_stmt, basic_block, prologue_end, epilogue_begin
            pass
        else:  # an opcode this reader doesn't know: skip its ULEB operands
            for _ in range(std_lengths[op - 1]):
                pos = uleb(buf, pos)[1]


class LineTable:
    """All rows of ``.debug_line``, sorted by address, decoded in one pass."""

    def __init__(
        self, units: list[_LineUnit], addrs: array, fids: array, lines: array, comp_dir_for: Callable[[int], str | None]
    ) -> None:
        self._units = units
        self._unit_by_offset = {u.offset: i for i, u in enumerate(units)}
        self._addrs, self._fids, self._lines = addrs, fids, lines
        self._comp_dir_for = comp_dir_for
        self._paths: dict[int, str | None] = {}

    def __len__(self) -> int:
        return len(self._addrs)

    @classmethod
    def build(
        cls, elf: ELFFile, keep: Callable[[int], bool], comp_dir_for: Callable[[int], str | None]
    ) -> LineTable | None:
        """Decode every line-number program of ``elf``; None without ``.debug_line``."""
        buf = section_bytes(elf, ".debug_line")
        if not buf:
            return None
        strings = _Strings(section_bytes(elf, ".debug_str") or b"", section_bytes(elf, ".debug_line_str") or b"")
        order: ByteOrder = "little" if elf.little_endian else "big"
        address_size = elf.elfclass // 8
        units: list[_LineUnit] = []
        sequences: list[_Sequence] = []
        pos = 0
        while pos + 4 <= len(buf):
            try:
                hdr = _parse_line_header(buf, pos, order, strings, address_size)
            except (Malformed, IndexError, ValueError, struct.error):
                break  # without a trustworthy unit_length the rest can't be walked
            file_base = len(units) << _FILE_BITS
            units.append(hdr.unit)
            try:
                sequences.extend(_run_line_program(buf, hdr, file_base, order, keep))
            except (IndexError, ValueError):
                pass  # a truncated program: keep the sequences that completed
            pos = hdr.unit_end
        sequences.sort(key=lambda seq: seq[0][0])
        addrs, fids, lines = array("Q"), array("q"), array("q")
        for seq_addrs, seq_fids, seq_lines in sequences:
            addrs.extend(seq_addrs)
            fids.extend(seq_fids)
            lines.extend(seq_lines)
        return cls(units, addrs, fids, lines, comp_dir_for)

    def lookup(self, addr: int) -> tuple[str | None, int | None] | None:
        """(file, line) of the row covering ``addr``; None when no sequence covers it.
        Line 0 (no source line) is given as None."""
        i = bisect_right(self._addrs, addr) - 1
        if i < 0 or self._fids[i] == _END:
            return None
        line = self._lines[i]
        return self._path(self._fids[i]), (line if line > 0 else None)

    def file_name(self, stmt_offset: int, index: int) -> str | None:
        """Path of file ``index`` of the program at ``stmt_offset`` (for DW_AT_call_file)."""
        unit = self._unit_by_offset.get(stmt_offset)
        if unit is None:
            return None
        return self._path((unit << _FILE_BITS) | index)

    def _path(self, fid: int) -> str | None:
        if fid not in self._paths:
            unit = self._units[fid >> _FILE_BITS]
            self._paths[fid] = unit.path(fid & ((1 << _FILE_BITS) - 1), lambda: self._comp_dir_for(unit.offset))
        return self._paths[fid]
