"""Offline symbolizer: (ELF module, file offset) -> function, source file and line.

Nothing here needs root or BCC. A module is read once and turned into sorted
address tables (symbols, DWARF line rows); every lookup after that is a bisect.

* File offsets become ELF virtual addresses through the PT_LOAD program headers,
  which works for PIE executables, shared libraries and non-PIE executables alike.
* Function names come from ``.symtab``/``.dynsym`` of the module and of its
  separate debug file (found by build id under ``<debug_dir>/.build-id/`` or by
  ``.gnu_debuglink``), demangled for C++ (Itanium, via ``cxxfilt``) and Rust
  (legacy and v0, via ``rust_demangler``).
* Source lines come from ``.debug_line`` (DWARF 2-5), decoded by a small
  dedicated line-program interpreter in one pass per module.
* Inlined frames come from ``DW_TAG_inlined_subroutine`` DIEs, read by a small
  dedicated ``.debug_info`` reader one compilation unit at a time, only for the
  units that looked-up addresses fall into (``.debug_aranges`` finds them).

pyelftools is used for the ELF container (headers, sections, notes, compressed
sections); the DWARF decoding is done here because pyelftools' object-per-DIE
parsing is about ten times slower on a libc-sized file.

Lookups never raise: a missing, unreadable or non-ELF module, or an address that
no symbol covers, gives a frame named ``"<basename>+0x<offset>"``. Files are
closed once a module's tables are built; nothing stays open between calls.

Known limits: DWARF from a dwz supplementary file (``.gnu_debugaltlink``) and split
DWARF (``.dwo``) are not followed; VLIW op_index in line programs is ignored; when
only a separate debug file is left (module gone), the module's layout is assumed
to be the usual file offset == vaddr - first segment vaddr.
"""

from __future__ import annotations

import os
import posixpath
import re
import struct
import time
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, BinaryIO, Literal, NamedTuple

from elftools.elf.elffile import ELFFile

try:  # both are declared dependencies; stay importable (and non-demangling) without them
    import cxxfilt
except Exception:  # pragma: no cover - depends on the host's libstdc++
    cxxfilt = None  # type: ignore[assignment]
try:
    import rust_demangler
except Exception:  # pragma: no cover
    rust_demangler = None  # type: ignore[assignment]

__all__ = ["Frame", "Symbolizer", "demangle", "unknown_name"]

Progress = Callable[[str], None]
ByteOrder = Literal["little", "big"]


@dataclass(frozen=True)
class Frame:
    """One (possibly inlined) source-level frame for a looked-up offset."""

    function: str  # demangled name, or f"{basename(module)}+0x{offset:x}"
    module: str  # module path as given
    file: str | None  # source file from the DWARF line table, or None
    line: int | None
    offset: int  # the file offset looked up (as given)
    inlined: bool = False  # synthesized from DW_TAG_inlined_subroutine


def unknown_name(module_path: str, offset: int) -> str:
    """The function name used when nothing better is known."""
    return f"{os.path.basename(module_path)}+0x{offset:x}"


# --------------------------------------------------------------------------- demangling

_RUST_LEGACY_RE = re.compile(r"^_?_ZN.*17h[0-9a-f]{16}E(?:\.[\w.$]*)?$")
_RUST_HASH_RE = re.compile(r"::h[0-9a-f]{16}$")
_RUST_V0_RE = re.compile(r"^_?_R[0-9A-Z]")


@lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str:
    """Demangle a C++ (Itanium), Rust legacy or Rust v0 symbol; other names pass unchanged.

    Rust legacy names lose their trailing ``::h<16 hex>`` hash. Never raises: a name
    that fails to demangle is returned as given.
    """
    try:
        if _RUST_LEGACY_RE.match(name):
            return _demangle_rust_legacy(name)
        if _RUST_V0_RE.match(name):
            return _demangle_rust_v0(name)
        if name.startswith(("_Z", "__Z")):
            return _demangle_itanium(name)
    except Exception:  # noqa: BLE001 - a bad mangled name must never escape
        pass
    return name


def _demangle_itanium(name: str) -> str:
    if cxxfilt is None:
        return name
    try:
        return cxxfilt.demangle(name.removeprefix("_") if name.startswith("__Z") else name)
    except Exception:  # noqa: BLE001 - cxxfilt.InvalidName and ctypes trouble alike
        return name


def _demangle_rust_legacy(name: str) -> str:
    text = None
    if rust_demangler is not None:
        try:
            text = rust_demangler.demangle(name)
        except Exception:  # noqa: BLE001
            text = None
    if not text:
        text = _demangle_itanium(name)
    return _RUST_HASH_RE.sub("", text)


def _demangle_rust_v0(name: str) -> str:
    if rust_demangler is None:
        return name
    try:
        text = rust_demangler.demangle(name)
    except Exception:  # noqa: BLE001
        return name
    return text or name


# --------------------------------------------------------------------------- ELF helpers


class _Segment(NamedTuple):
    offset: int
    filesz: int
    vaddr: int


def _open_elf(path: str) -> tuple[BinaryIO, ELFFile] | None:
    """Open ``path`` as ELF, or return None (missing, unreadable, not ELF)."""
    try:
        stream = open(path, "rb")
    except OSError:
        return None
    try:
        return stream, ELFFile(stream)
    except Exception:  # noqa: BLE001 - ELFError, struct errors on truncated files, ...
        stream.close()
        return None


def _load_segments(elf: ELFFile, debug_only: bool = False) -> list[_Segment]:
    """PT_LOAD segments as (file offset, file size, vaddr).

    A separate debug file has PT_LOAD headers whose offsets and file sizes no longer
    describe the original file; with ``debug_only`` the original layout is assumed to
    be the usual one (file offset = vaddr - vaddr of the first segment).
    """
    loads = [s.header for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
    if not debug_only:
        return [_Segment(h["p_offset"], h["p_filesz"], h["p_vaddr"]) for h in loads]
    if not loads:
        return []
    base = min(h["p_vaddr"] for h in loads) & ~0xFFF
    return [_Segment(h["p_vaddr"] - base, h["p_memsz"], h["p_vaddr"]) for h in loads]


def _offset_to_vaddr(segments: list[_Segment], offset: int) -> int | None:
    for seg in segments:
        if seg.offset <= offset < seg.offset + seg.filesz:
            return offset - seg.offset + seg.vaddr
    return None


def _build_id(elf: ELFFile) -> str | None:
    """Hex GNU build id from the notes (sections first, then PT_NOTE segments)."""
    try:
        containers: Iterable[Any] = [s for s in elf.iter_sections() if s["sh_type"] == "SHT_NOTE"]
        if not containers:
            containers = [s for s in elf.iter_segments() if s["p_type"] == "PT_NOTE"]
        for container in containers:
            for note in container.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    return str(note["n_desc"]).lower()
    except Exception:  # noqa: BLE001 - malformed notes: no build id
        return None
    return None


def _debuglink(elf: ELFFile) -> str | None:
    """File name stored in ``.gnu_debuglink`` (the CRC that follows is not checked)."""
    section = elf.get_section_by_name(".gnu_debuglink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    name = section.data().split(b"\0", 1)[0]
    return os.fsdecode(name) or None


def _section_bytes(elf: ELFFile, name: str) -> bytes | None:
    """Contents of a section, decompressed (SHF_COMPRESSED or the old ``.zdebug_`` style)."""
    section = elf.get_section_by_name(name)
    if section is not None:
        return None if section["sh_type"] == "SHT_NOBITS" else section.data()
    if name.startswith(".debug_"):
        section = elf.get_section_by_name(".z" + name[1:])
        if section is not None:
            data = section.data()
            return zlib.decompress(data[12:]) if data[:4] == b"ZLIB" else data
    return None


def _has_section(elf: ELFFile, name: str) -> bool:
    section = elf.get_section_by_name(name)
    if section is None and name.startswith(".debug_"):
        section = elf.get_section_by_name(".z" + name[1:])
    return section is not None and section["sh_type"] != "SHT_NOBITS"


def _exec_ranges(elf: ELFFile) -> list[tuple[int, int]]:
    """Sorted address ranges of executable sections (SHF_EXECINSTR)."""
    ranges = [
        (s["sh_addr"], s["sh_addr"] + s["sh_size"])
        for s in elf.iter_sections()
        if s["sh_flags"] & 0x4 and s["sh_size"]
    ]
    return sorted(ranges)


def _debug_file_candidates(module_path: str, build_id: str | None, link: str | None,
                           debug_dirs: Iterable[str]) -> Iterator[str]:
    """Where gdb would look for separate debug info, in gdb's order."""
    dirs = list(debug_dirs)
    if build_id and len(build_id) > 2:
        for d in dirs:
            yield os.path.join(d, ".build-id", build_id[:2], build_id[2:] + ".debug")
    if link:
        here = os.path.dirname(os.path.abspath(module_path))
        yield os.path.join(here, link)
        yield os.path.join(here, ".debug", link)
        for d in dirs:
            yield os.path.join(d, here.lstrip("/"), link)


# --------------------------------------------------------------------------- symbols

_STT_NOTYPE, _STT_FUNC, _STT_GNU_IFUNC = 0, 2, 10
_BIND_RANK = {1: 0, 10: 0, 2: 0, 0: 1}  # GLOBAL, GNU_UNIQUE and WEAK alike, then LOCAL
_SHF_EXECINSTR = 0x4
_SHN_LORESERVE = 0xFF00


class _RawSymbol(NamedTuple):
    addr: int
    size: int
    name: str
    rank: tuple[int, int, int, int, str]  # smaller is the better name for an address
    section_end: int


def _read_symbols(elf: ELFFile, section_name: str) -> list[_RawSymbol]:
    """Function-like symbols of one symbol table, parsed straight from its bytes."""
    section = elf.get_section_by_name(section_name)
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return []
    strtab = elf.get_section(section["sh_link"]).data()
    headers = [(s["sh_flags"], s["sh_addr"], s["sh_size"]) for s in elf.iter_sections()]
    is64 = elf.elfclass == 64
    fmt = ("<" if elf.little_endian else ">") + ("IBBHQQ" if is64 else "IIIBBH")
    entsize = struct.calcsize(fmt)
    data = section.data()
    data = data[: len(data) - len(data) % entsize]
    thumb = elf["e_machine"] == "EM_ARM"
    out: list[_RawSymbol] = []
    for entry in struct.iter_unpack(fmt, data):
        if is64:
            name_off, info, _other, shndx, value, size = entry
        else:
            name_off, value, size, info, _other, shndx = entry
        kind = info & 0xF
        if kind not in (_STT_FUNC, _STT_GNU_IFUNC, _STT_NOTYPE):
            continue
        if shndx == 0 or shndx >= _SHN_LORESERVE or shndx >= len(headers) or not name_off:
            continue
        flags, sec_addr, sec_size = headers[shndx]
        if not flags & _SHF_EXECINSTR and (kind == _STT_NOTYPE or not size):
            continue
        name = strtab[name_off: strtab.find(b"\0", name_off)].decode("utf-8", "replace")
        if not name or name.startswith(("$", ".L")):  # ARM/AArch64 mapping symbols, local labels
            continue
        if "@" in name[1:]:  # versioned names in .symtab: memcpy@@GLIBC_2.14
            name = name[: name.index("@", 1)]
        if thumb:
            value &= ~1
        rank = (_BIND_RANK.get(info >> 4, 3), 0 if size else 1,
                len(name) - len(name.lstrip("_")), len(name), name)
        out.append(_RawSymbol(value, size, name, rank, sec_addr + sec_size))
    return out


class SymbolTable:
    """Sorted, non-overlapping-ish function intervals with one chosen name each."""

    def __init__(self, starts: list[int], ends: list[int], names: list[str]) -> None:
        self._starts = starts
        self._ends = ends
        self._names = names

    def __len__(self) -> int:
        return len(self._starts)

    @classmethod
    def build(cls, symbols: Iterable[_RawSymbol]) -> SymbolTable:
        """One name per start address (global over weak over local, sized over unsized,
        fewer leading underscores, shorter); zero-size symbols extend to the next symbol
        or the end of their section, unless they sit inside a sized function."""
        by_addr: dict[int, list[Any]] = {}
        for sym in symbols:
            cur = by_addr.get(sym.addr)
            if cur is None:
                by_addr[sym.addr] = [sym.rank, sym.name, sym.size, sym.section_end]
                continue
            if sym.rank < cur[0]:
                cur[0], cur[1] = sym.rank, sym.name
            cur[2] = max(cur[2], sym.size)
            cur[3] = max(cur[3], sym.section_end)
        addrs = sorted(by_addr)
        starts: list[int] = []
        ends: list[int] = []
        names: list[str] = []
        covered_until = -1
        for i, addr in enumerate(addrs):
            _rank, name, size, section_end = by_addr[addr]
            if size:
                end = addr + size
                covered_until = max(covered_until, end)
            else:
                if addr < covered_until:
                    continue  # a label inside a sized function: the function wins
                following = addrs[i + 1] if i + 1 < len(addrs) else section_end
                end = min(following, section_end) if section_end > addr else following
                if end <= addr:
                    continue
            starts.append(addr)
            ends.append(end)
            names.append(name)
        return cls(starts, ends, names)

    def lookup(self, addr: int) -> str | None:
        """Raw (mangled) name of the symbol covering ``addr``, or None."""
        i = bisect_right(self._starts, addr) - 1
        for j in range(i, max(i - 8, -1), -1):  # a few steps back for nested symbols
            if addr < self._ends[j]:
                return self._names[j]
        return None


# --------------------------------------------------------------------------- DWARF line table

_END = -1  # file id of an end_sequence row
_FILE_BITS = 24


class _Malformed(Exception):
    """A line-number program header that can't be decoded."""


def _uleb(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _sleb(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if byte & 0x40:
                result -= 1 << shift
            return result, pos


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\0", pos)
    return buf[pos:end].decode("utf-8", "surrogateescape"), end + 1


@dataclass
class _Strings:
    """String sections a DWARF 5 line header may point into."""

    debug_str: bytes = b""
    debug_line_str: bytes = b""

    @staticmethod
    def at(data: bytes, offset: int) -> str | None:
        if offset >= len(data):
            return None
        end = data.find(b"\0", offset)
        return data[offset: end if end >= 0 else len(data)].decode("utf-8", "surrogateescape")


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
            directory = base if dir_index == 0 else (
                self.dirs[dir_index - 1] if dir_index - 1 < len(self.dirs) else None)
        if directory and not posixpath.isabs(directory) and base and directory is not base:
            directory = posixpath.join(base, directory)
        return posixpath.join(directory, name) if directory else name


_DW_FORM_SIZES = {0x0B: 1, 0x05: 2, 0x06: 4, 0x07: 8, 0x1E: 16, 0x25: 1, 0x26: 2, 0x27: 3, 0x28: 4}


def _read_form(buf: bytes, pos: int, form: int, offset_size: int, order: ByteOrder,
               strings: _Strings) -> tuple[Any, int]:
    """Decode one attribute value of a DWARF 5 directory/file entry."""
    if form == 0x08:  # DW_FORM_string
        return _cstring(buf, pos)
    if form in (0x1F, 0x0E):  # DW_FORM_line_strp, DW_FORM_strp
        off = int.from_bytes(buf[pos:pos + offset_size], order)
        table = strings.debug_line_str if form == 0x1F else strings.debug_str
        return _Strings.at(table, off), pos + offset_size
    if form == 0x0F:  # DW_FORM_udata
        return _uleb(buf, pos)
    if form == 0x0D:  # DW_FORM_sdata
        return _sleb(buf, pos)
    if form in _DW_FORM_SIZES:  # data1/2/4/8/16 and strx1-4 (string index: unsupported)
        size = _DW_FORM_SIZES[form]
        value = int.from_bytes(buf[pos:pos + size], order) if form < 0x20 else None
        return value, pos + size
    if form == 0x1A:  # DW_FORM_strx
        return None, _uleb(buf, pos)[1]
    if form == 0x09:  # DW_FORM_block
        size, pos = _uleb(buf, pos)
        return None, pos + size
    if form == 0x0A:  # DW_FORM_block1
        return None, pos + 1 + buf[pos]
    raise _Malformed(f"form 0x{form:x} in a line table header")


def _read_entry_table(buf: bytes, pos: int, offset_size: int, order: ByteOrder,
                      strings: _Strings) -> tuple[list[dict[int, Any]], int]:
    """A DWARF 5 directory or file-name table: its format, then its entries."""
    format_count = buf[pos]
    pos += 1
    fmt = []
    for _ in range(format_count):
        content, pos = _uleb(buf, pos)
        form, pos = _uleb(buf, pos)
        fmt.append((content, form))
    count, pos = _uleb(buf, pos)
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


def _initial_length(buf: bytes, pos: int, order: ByteOrder) -> tuple[int, int, int]:
    """A DWARF unit's initial length at `pos`: (length, offset of what follows, offset size),
    the 64-bit form (0xffffffff escape) included."""
    length = int.from_bytes(buf[pos:pos + 4], order)
    if length == 0xFFFFFFFF:
        return int.from_bytes(buf[pos + 4:pos + 12], order), pos + 12, 8
    return length, pos + 4, 4


def _parse_line_header(buf: bytes, pos: int, order: ByteOrder, strings: _Strings,
                       address_size: int) -> _LineHeader:
    """Decode one line-number program header (DWARF 2 to 5)."""
    unit_offset = pos
    unit_length, pos, offset_size = _initial_length(buf, pos, order)
    unit_end = pos + unit_length
    version = int.from_bytes(buf[pos:pos + 2], order)
    pos += 2
    if not 2 <= version <= 5:
        raise _Malformed(f"line table version {version}")
    if version >= 5:
        address_size = buf[pos]
        pos += 2  # address_size, segment_selector_size
    header_length = int.from_bytes(buf[pos:pos + offset_size], order)
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
    std_lengths = bytes(buf[pos:pos + opcode_base - 1])
    pos += opcode_base - 1
    if not line_range or min(unit_end, program_start) > len(buf):
        raise _Malformed("truncated or degenerate line table header")
    dirs: list[str | None] = []
    files: list[tuple[str | None, int]] = []
    if version >= 5:
        dir_entries, pos = _read_entry_table(buf, pos, offset_size, order, strings)
        dirs = [e.get(1) for e in dir_entries]  # DW_LNCT_path
        file_entries, pos = _read_entry_table(buf, pos, offset_size, order, strings)
        files = [(e.get(1), e.get(2) or 0) for e in file_entries]  # path, directory_index
    else:
        while buf[pos]:
            name, pos = _cstring(buf, pos)
            dirs.append(name)
        pos += 1
        while buf[pos]:
            name, pos = _cstring(buf, pos)
            dir_index, pos = _uleb(buf, pos)
            pos = _uleb(buf, _uleb(buf, pos)[1])[1]  # mtime, length
            files.append((name, dir_index))
    unit = _LineUnit(unit_offset, version, dirs, files)
    return _LineHeader(unit, program_start, unit_end, min_inst_length, default_is_stmt,
                       line_base, line_range, opcode_base, std_lengths, address_size)


_Sequence = tuple[array, array, array]  # addresses, file ids, lines


def _run_line_program(buf: bytes, hdr: _LineHeader, file_base: int, order: ByteOrder,
                      keep: Callable[[int], bool]) -> Iterator[_Sequence]:
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
            length, pos = _uleb(buf, pos)
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
                address = int.from_bytes(buf[pos + 1:after], order)
            elif sub == 3:  # DW_LNE_define_file (DWARF < 5)
                name, p = _cstring(buf, pos + 1)
                hdr.unit.files.append((name, _uleb(buf, p)[0]))
            pos = after
        elif op == 1:  # DW_LNS_copy
            addrs.append(address)
            fids.append(fid)
            lines.append(line)
        elif op == 2:  # DW_LNS_advance_pc
            value, pos = _uleb(buf, pos)
            address += value * min_len
        elif op == 3:  # DW_LNS_advance_line
            value, pos = _sleb(buf, pos)
            line += value
        elif op == 4:  # DW_LNS_set_file
            value, pos = _uleb(buf, pos)
            fid = file_base | (value & ((1 << _FILE_BITS) - 1))
        elif op == 8:  # DW_LNS_const_add_pc
            address += const_add_pc
        elif op == 9:  # DW_LNS_fixed_advance_pc
            address += int.from_bytes(buf[pos:pos + 2], order)
            pos += 2
        elif op in (5, 12):  # set_column, set_isa
            pos = _uleb(buf, pos)[1]
        elif op in (6, 7, 10, 11):  # negate_stmt, basic_block, prologue_end, epilogue_begin
            pass
        else:  # an opcode this reader doesn't know: skip its ULEB operands
            for _ in range(std_lengths[op - 1]):
                pos = _uleb(buf, pos)[1]


class LineTable:
    """All rows of ``.debug_line``, sorted by address, decoded in one pass."""

    def __init__(self, units: list[_LineUnit], addrs: array, fids: array, lines: array,
                 comp_dir_for: Callable[[int], str | None]) -> None:
        self._units = units
        self._unit_by_offset = {u.offset: i for i, u in enumerate(units)}
        self._addrs, self._fids, self._lines = addrs, fids, lines
        self._comp_dir_for = comp_dir_for
        self._paths: dict[int, str | None] = {}

    def __len__(self) -> int:
        return len(self._addrs)

    @classmethod
    def build(cls, elf: ELFFile, keep: Callable[[int], bool],
              comp_dir_for: Callable[[int], str | None]) -> LineTable | None:
        """Decode every line-number program of ``elf``; None without ``.debug_line``."""
        buf = _section_bytes(elf, ".debug_line")
        if not buf:
            return None
        strings = _Strings(_section_bytes(elf, ".debug_str") or b"",
                           _section_bytes(elf, ".debug_line_str") or b"")
        order: ByteOrder = "little" if elf.little_endian else "big"
        address_size = elf.elfclass // 8
        units: list[_LineUnit] = []
        sequences: list[_Sequence] = []
        pos = 0
        while pos + 4 <= len(buf):
            try:
                hdr = _parse_line_header(buf, pos, order, strings, address_size)
            except (_Malformed, IndexError, ValueError, struct.error):
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
            self._paths[fid] = unit.path(fid & ((1 << _FILE_BITS) - 1),
                                         lambda: self._comp_dir_for(unit.offset))
        return self._paths[fid]


# --------------------------------------------------------------------------- DWARF DIEs
#
# A small .debug_info reader: just enough to find subprograms, inlined subroutines,
# their address ranges, call sites and names. pyelftools parses every DIE into
# objects, which costs seconds per megabyte; this reader skips uninteresting
# subtrees through DW_AT_sibling and decodes only the attributes it needs.

_AT_SIBLING, _AT_NAME, _AT_STMT_LIST, _AT_LOW_PC, _AT_HIGH_PC = 0x01, 0x03, 0x10, 0x11, 0x12
_AT_COMP_DIR, _AT_ABSTRACT_ORIGIN, _AT_SPECIFICATION, _AT_RANGES = 0x1B, 0x31, 0x47, 0x55
_AT_CALL_FILE, _AT_CALL_LINE, _AT_LINKAGE_NAME, _AT_MIPS_LINKAGE_NAME = 0x58, 0x59, 0x6E, 0x2007
_AT_STR_OFFSETS_BASE, _AT_ADDR_BASE, _AT_RNGLISTS_BASE, _AT_GNU_ADDR_BASE = 0x72, 0x73, 0x74, 0x2133
_AT_LANGUAGE = 0x13
_C_LANGUAGES = frozenset({0x01, 0x02, 0x0C, 0x1D, 0x2C, 0x8001})  # C89, C, C99, C11, C17, MIPS asm
_WANTED_ATTRS = frozenset({
    _AT_LANGUAGE,
    _AT_SIBLING, _AT_NAME, _AT_STMT_LIST, _AT_LOW_PC, _AT_HIGH_PC, _AT_COMP_DIR,
    _AT_ABSTRACT_ORIGIN, _AT_SPECIFICATION, _AT_RANGES, _AT_CALL_FILE, _AT_CALL_LINE,
    _AT_LINKAGE_NAME, _AT_MIPS_LINKAGE_NAME, _AT_STR_OFFSETS_BASE, _AT_ADDR_BASE,
    _AT_RNGLISTS_BASE, _AT_GNU_ADDR_BASE,
})

_TAG_SUBPROGRAM, _TAG_INLINED = 0x2E, 0x1D
_TAG_BLOCKS = frozenset({0x0B, 0x32, 0x25})  # lexical_block, try_block, catch_block
_TAG_CONTAINERS = frozenset({0x39, 0x1E, 0x02, 0x13, 0x17})  # namespace, module, class, struct, union

# DW_FORM_* codes
_FORM_ADDR, _FORM_STRING, _FORM_STRP, _FORM_UDATA, _FORM_SDATA = 0x01, 0x08, 0x0E, 0x0F, 0x0D
_FORM_REF_ADDR, _FORM_REF_UDATA, _FORM_INDIRECT, _FORM_STRX = 0x10, 0x15, 0x16, 0x1A
_FORM_ADDRX, _FORM_LINE_STRP, _FORM_IMPLICIT_CONST, _FORM_RNGLISTX = 0x1B, 0x1F, 0x21, 0x23
_FORM_GNU_ADDR_INDEX, _FORM_GNU_STR_INDEX = 0x1F01, 0x1F02
_ALT_REF_FORMS = frozenset({0x1F20, 0x1C, 0x24})  # GNU_ref_alt, ref_sup4, ref_sup8
_ALT_STR_FORMS = frozenset({0x1F21, 0x1D})  # GNU_strp_alt, strp_sup
_ADDRX_FORMS = frozenset({0x1B, 0x29, 0x2A, 0x2B, 0x2C, 0x1F01})
_STRX_FORMS = frozenset({0x1A, 0x25, 0x26, 0x27, 0x28, 0x1F02})
_REF_CU_FORMS = frozenset({0x11, 0x12, 0x13, 0x14, 0x15})  # ref1/2/4/8/udata: unit-relative
_ULEB_FORMS = frozenset({0x0F, 0x15, 0x1A, 0x1B, 0x22, 0x23, 0x1F01, 0x1F02})
_BLOCK_FORMS = {0x0A: 1, 0x03: 2, 0x04: 4}  # block1/2/4: size of the length field
_ADDRESS_SIZED, _OFFSET_SIZED = -10, -20
_FIXED_FORMS = {  # form -> size in bytes (or address/offset sized); absent: variable size
    0x01: _ADDRESS_SIZED, 0x05: 2, 0x06: 4, 0x07: 8, 0x0B: 1, 0x0C: 1, 0x0E: _OFFSET_SIZED,
    0x10: _OFFSET_SIZED, 0x11: 1, 0x12: 2, 0x13: 4, 0x14: 8, 0x17: _OFFSET_SIZED, 0x19: 0,
    0x1C: 4, 0x1D: _OFFSET_SIZED, 0x1E: 16, 0x1F: _OFFSET_SIZED, 0x20: 8, 0x24: 8, 0x25: 1,
    0x26: 2, 0x27: 3, 0x28: 4, 0x29: 1, 0x2A: 2, 0x2B: 3, 0x2C: 4,
    0x1F20: _OFFSET_SIZED, 0x1F21: _OFFSET_SIZED,  # GNU_ref_alt, GNU_strp_alt (dwz)
}


def _form_size(form: int, unit: _Unit) -> int:
    """Byte size of a fixed-size form in ``unit``; -1 for variable-size forms."""
    size = _FIXED_FORMS.get(form, -1)
    if size == _ADDRESS_SIZED or (form == _FORM_REF_ADDR and unit.version == 2):
        return unit.address_size
    if size == _OFFSET_SIZED:
        return unit.offset_size
    return size


class _Abbrev(NamedTuple):
    tag: int
    has_children: bool
    # per attribute: (attribute or -1 when not wanted, form, fixed size or -1, implicit const)
    plan: tuple[tuple[int, int, int, int], ...]


@dataclass
class _Unit:
    """A compilation unit header plus the attributes of its top DIE."""

    offset: int
    end: int
    version: int
    offset_size: int
    address_size: int
    abbrev_offset: int
    first_die: int
    top: dict[int, tuple[int, int]] = field(default_factory=dict)
    abbrevs: dict[int, _Abbrev] | None = None


class _DieReader:
    """Random and sequential access to the DIEs of one DWARF file."""

    def __init__(self, elf: ELFFile, alt: _DieReader | None = None) -> None:
        self.alt = alt  # the dwz supplementary file (.gnu_debugaltlink), if found
        self.info = _section_bytes(elf, ".debug_info") or b""
        self._abbrev = _section_bytes(elf, ".debug_abbrev") or b""
        self._str = _section_bytes(elf, ".debug_str") or b""
        self._line_str = _section_bytes(elf, ".debug_line_str") or b""
        self._str_offsets = _section_bytes(elf, ".debug_str_offsets") or b""
        self._addr = _section_bytes(elf, ".debug_addr") or b""
        self._ranges = _section_bytes(elf, ".debug_ranges") or b""
        self._rnglists = _section_bytes(elf, ".debug_rnglists") or b""
        self._aranges = _section_bytes(elf, ".debug_aranges") or b""
        self._order: ByteOrder = "little" if elf.little_endian else "big"
        self.units = self._read_unit_headers()
        self._unit_starts = [u.offset for u in self.units]
        self._abbrev_cache: dict[tuple[int, int, int], dict[int, _Abbrev]] = {}

    # -- units
    def _read_unit_headers(self) -> list[_Unit]:
        buf, order, units, pos = self.info, self._order, [], 0
        while pos + 11 <= len(buf):
            length, start, offset_size = _initial_length(buf, pos, order)
            end = start + length
            version = int.from_bytes(buf[start:start + 2], order)
            p = start + 2
            if version >= 5:
                unit_type, address_size = buf[p], buf[p + 1]
                abbrev_offset = int.from_bytes(buf[p + 2:p + 2 + offset_size], order)
                p += 2 + offset_size
                if unit_type in (4, 5):  # skeleton, split_compile: dwo_id
                    p += 8
                elif unit_type in (2, 6):  # type units: signature + type offset
                    p += 8 + offset_size
            else:
                abbrev_offset = int.from_bytes(buf[p:p + offset_size], order)
                address_size = buf[p + offset_size]
                p += offset_size + 1
            if not 2 <= version <= 5 or end > len(buf) or length == 0:
                break
            units.append(_Unit(pos, end, version, offset_size, address_size, abbrev_offset, p))
            pos = end
        return units

    def unit_at(self, die_offset: int) -> _Unit | None:
        """The unit that contains a .debug_info offset, with its top DIE read."""
        i = bisect_right(self._unit_starts, die_offset) - 1
        if i < 0 or die_offset >= self.units[i].end:
            return None
        unit = self.units[i]
        if unit.abbrevs is None:
            key = (unit.abbrev_offset, unit.address_size, unit.offset_size)
            if key not in self._abbrev_cache:
                self._abbrev_cache[key] = self._read_abbrevs(unit)
            unit.abbrevs = self._abbrev_cache[key]
            _code, unit.top, _pos = self.read_die(unit, unit.first_die)
        return unit

    def _read_abbrevs(self, unit: _Unit) -> dict[int, _Abbrev]:
        buf, pos, table = self._abbrev, unit.abbrev_offset, {}
        while pos < len(buf):
            code, pos = _uleb(buf, pos)
            if not code:
                break
            tag, pos = _uleb(buf, pos)
            has_children = bool(buf[pos])
            pos += 1
            plan = []
            while True:
                attr, pos = _uleb(buf, pos)
                form, pos = _uleb(buf, pos)
                if not attr and not form:
                    break
                implicit = 0
                if form == _FORM_IMPLICIT_CONST:
                    implicit, pos = _sleb(buf, pos)
                size = _form_size(form, unit)
                plan.append((attr if attr in _WANTED_ATTRS else -1, form, size, implicit))
            table[code] = _Abbrev(tag, has_children, tuple(plan))
        return table

    # -- DIEs
    def read_die(self, unit: _Unit, pos: int) -> tuple[_Abbrev | None, dict[int, tuple[int, int]], int]:
        """Decode the DIE at ``pos``: its abbreviation (None for a null entry), its wanted
        attributes as {attribute: (form, raw value)}, and the offset after it."""
        buf = self.info
        code = buf[pos]
        pos += 1
        if code >= 0x80:
            code, pos = _uleb(buf, pos - 1)
        if not code:
            return None, {}, pos
        abbrev = unit.abbrevs[code]  # type: ignore[index]
        values: dict[int, tuple[int, int]] = {}
        order = self._order
        for attr, form, size, implicit in abbrev.plan:
            if size >= 0:
                if attr >= 0:
                    values[attr] = (form, int.from_bytes(buf[pos:pos + size], order))
                pos += size
                continue
            if form == _FORM_IMPLICIT_CONST:
                raw = implicit
            elif form == _FORM_INDIRECT:
                form, pos = _uleb(buf, pos)
                raw, pos = self._read_indirect(unit, form, pos)
            elif form in _ULEB_FORMS:
                raw, pos = _uleb(buf, pos)
            elif form == _FORM_SDATA:
                raw, pos = _sleb(buf, pos)
            elif form == _FORM_STRING:
                raw = pos
                pos = buf.index(b"\0", pos) + 1
            elif form in (0x09, 0x18):  # block, exprloc
                length, pos = _uleb(buf, pos)
                raw, pos = 0, pos + length
            elif form in _BLOCK_FORMS:
                width = _BLOCK_FORMS[form]
                raw, pos = 0, pos + width + int.from_bytes(buf[pos:pos + width], order)
            else:
                raise _Malformed(f"DW_FORM 0x{form:x}")
            if attr >= 0:
                values[attr] = (form, raw)
        return abbrev, values, pos

    def _read_indirect(self, unit: _Unit, form: int, pos: int) -> tuple[int, int]:
        """A DW_FORM_indirect value: decode with a one-attribute plan."""
        size = _form_size(form, unit)
        if size >= 0:
            return int.from_bytes(self.info[pos:pos + size], self._order), pos + size
        if form in _ULEB_FORMS:
            return _uleb(self.info, pos)
        if form == _FORM_SDATA:
            return _sleb(self.info, pos)
        if form == _FORM_STRING:
            return pos, self.info.index(b"\0", pos) + 1
        if form in (0x09, 0x18):
            length, pos = _uleb(self.info, pos)
            return 0, pos + length
        raise _Malformed(f"indirect DW_FORM 0x{form:x}")

    # -- attribute values
    def address(self, unit: _Unit, value: tuple[int, int]) -> int | None:
        form, raw = value
        if form in _ADDRX_FORMS:
            header = 8 if unit.version >= 5 else 0  # a .debug_addr header precedes the first base
            base = self._top_int(unit, _AT_ADDR_BASE, _AT_GNU_ADDR_BASE, default=header)
            pos = base + raw * unit.address_size
            if pos + unit.address_size > len(self._addr):
                return None
            return int.from_bytes(self._addr[pos:pos + unit.address_size], self._order)
        return raw

    def reference(self, unit: _Unit, value: tuple[int, int]) -> int | None:
        """Absolute .debug_info offset of a reference into this file (else None)."""
        form, raw = value
        if form in _REF_CU_FORMS:
            return unit.offset + raw
        if form == _FORM_REF_ADDR:
            return raw
        return None

    def target(self, unit: _Unit, value: tuple[int, int]) -> tuple[_DieReader, int] | None:
        """Reader and offset of the DIE a reference points to, following dwz's
        DW_FORM_GNU_ref_alt / DW_FORM_ref_sup into the supplementary file."""
        if value[0] in _ALT_REF_FORMS:
            return (self.alt, value[1]) if self.alt is not None else None
        offset = self.reference(unit, value)
        return (self, offset) if offset is not None else None

    def string(self, unit: _Unit, value: tuple[int, int]) -> str | None:
        form, raw = value
        if form == _FORM_STRING:
            return _Strings.at(self.info, raw)
        if form == _FORM_STRP:
            return _Strings.at(self._str, raw)
        if form == _FORM_LINE_STRP:
            return _Strings.at(self._line_str, raw)
        if form in _STRX_FORMS:
            base = self._top_int(unit, _AT_STR_OFFSETS_BASE, default=8 if unit.offset_size == 4 else 16)
            pos = base + raw * unit.offset_size
            off = int.from_bytes(self._str_offsets[pos:pos + unit.offset_size], self._order)
            return _Strings.at(self._str, off)
        if form in _ALT_STR_FORMS and self.alt is not None:
            return _Strings.at(self.alt._str, raw)
        return None

    def _top_int(self, unit: _Unit, *attrs: int, default: int = 0) -> int:
        for attr in attrs:
            if attr in unit.top:
                return unit.top[attr][1]
        return default

    def ranges(self, unit: _Unit, values: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
        """Address ranges from low_pc/high_pc or DW_AT_ranges (.debug_ranges or .debug_rnglists)."""
        if _AT_LOW_PC in values and _AT_HIGH_PC in values:
            lo = self.address(unit, values[_AT_LOW_PC])
            form, raw = values[_AT_HIGH_PC]
            hi = self.address(unit, values[_AT_HIGH_PC]) if form == _FORM_ADDR or form in _ADDRX_FORMS \
                else (lo or 0) + raw
            return [(lo, hi)] if lo is not None and hi is not None and hi > lo else []
        if _AT_RANGES not in values:
            return []
        top_low = unit.top.get(_AT_LOW_PC)
        base = (self.address(unit, top_low) if top_low else 0) or 0
        form, raw = values[_AT_RANGES]
        if unit.version >= 5:
            if form == _FORM_RNGLISTX:
                table = self._top_int(unit, _AT_RNGLISTS_BASE, default=12 if unit.offset_size == 4 else 20)
                pos = table + raw * unit.offset_size
                raw = table + int.from_bytes(self._rnglists[pos:pos + unit.offset_size], self._order)
            return self._rnglist(unit, raw, base)
        return self._debug_ranges(unit, raw, base)

    def _debug_ranges(self, unit: _Unit, pos: int, base: int) -> list[tuple[int, int]]:
        buf, size, order, out = self._ranges, unit.address_size, self._order, []
        top = (1 << (8 * size)) - 1
        while pos + 2 * size <= len(buf):
            begin = int.from_bytes(buf[pos:pos + size], order)
            end = int.from_bytes(buf[pos + size:pos + 2 * size], order)
            pos += 2 * size
            if begin == 0 and end == 0:
                break
            if begin == top:
                base = end
            elif end > begin:
                out.append((base + begin, base + end))
        return out

    def _rnglist(self, unit: _Unit, pos: int, base: int) -> list[tuple[int, int]]:
        buf, size, order, out = self._rnglists, unit.address_size, self._order, []

        def addrx(index: int) -> int:
            return self.address(unit, (_FORM_ADDRX, index)) or 0

        while pos < len(buf):
            kind = buf[pos]
            pos += 1
            if kind == 0:  # DW_RLE_end_of_list
                break
            if kind == 1:  # base_addressx
                index, pos = _uleb(buf, pos)
                base = addrx(index)
            elif kind in (2, 3):  # startx_endx, startx_length
                a, pos = _uleb(buf, pos)
                b, pos = _uleb(buf, pos)
                lo = addrx(a)
                out.append((lo, addrx(b) if kind == 2 else lo + b))
            elif kind == 4:  # offset_pair
                a, pos = _uleb(buf, pos)
                b, pos = _uleb(buf, pos)
                out.append((base + a, base + b))
            elif kind == 5:  # base_address
                base = int.from_bytes(buf[pos:pos + size], order)
                pos += size
            elif kind == 6:  # start_end
                lo = int.from_bytes(buf[pos:pos + size], order)
                out.append((lo, int.from_bytes(buf[pos + size:pos + 2 * size], order)))
                pos += 2 * size
            elif kind == 7:  # start_length
                lo = int.from_bytes(buf[pos:pos + size], order)
                length, pos = _uleb(buf, pos + size)
                out.append((lo, lo + length))
            else:
                break
        return [(lo, hi) for lo, hi in out if hi > lo]

    # -- address -> unit
    def arange_units(self) -> list[tuple[int, int, int]]:
        """(low, high, unit offset) from .debug_aranges."""
        buf, order, out, pos = self._aranges, self._order, [], 0
        while pos + 12 <= len(buf):
            length, start, offset_size = _initial_length(buf, pos, order)
            end = start + length
            p = start + 2  # version
            unit_offset = int.from_bytes(buf[p:p + offset_size], order)
            size = buf[p + offset_size]
            p += offset_size + 2
            tuple_size = 2 * size
            p = pos + ((p - pos + tuple_size - 1) // tuple_size) * tuple_size  # align the tuples
            while p + tuple_size <= end:
                lo = int.from_bytes(buf[p:p + size], order)
                length_ = int.from_bytes(buf[p + size:p + tuple_size], order)
                p += tuple_size
                if lo == 0 and length_ == 0:
                    break
                if length_:
                    out.append((lo, lo + length_, unit_offset))
            pos = end
        return out


@dataclass(eq=False)
class _Scope:
    """A concrete subprogram or inlined subroutine with its address ranges."""

    ranges: list[tuple[int, int]]
    die: int  # .debug_info offset of the DIE
    call_file: int = 0
    call_line: int = 0
    children: list[_Scope] = field(default_factory=list)

    def inner(self, addr: int) -> _Scope | None:
        """The child scope covering ``addr``, if any."""
        for child in self.children:
            for lo, hi in child.ranges:
                if lo <= addr < hi:
                    return child
        return None


class _UnitScopes(NamedTuple):
    starts: list[int]
    entries: list[tuple[int, int, _Scope]]
    stmt_list: int | None


class _DwarfIndex:
    """Inline chains and comp dirs from .debug_info, one compilation unit at a time.

    Units are located through ``.debug_aranges`` plus the top-DIE ranges of units it
    does not mention, and are walked only when an address falls into them.
    """

    def __init__(self, elf: ELFFile, alt: ELFFile | None = None) -> None:
        self._reader = _DieReader(elf, _DieReader(alt) if alt is not None else None)
        self._unit_ranges: tuple[list[int], list[tuple[int, int, int]]] | None = None
        self._scopes: dict[int, _UnitScopes] = {}
        self._comp_dirs: dict[int, str | None] | None = None
        self._names: dict[int, str | None] = {}
        self._qualifiers: dict[tuple[int, int], dict[int, str]] = {}

    def comp_dir(self, stmt_offset: int) -> str | None:
        """DW_AT_comp_dir of the unit whose DW_AT_stmt_list is ``stmt_offset``."""
        if self._comp_dirs is None:
            self._comp_dirs = {}
            for header in self._reader.units:
                try:
                    unit = self._reader.unit_at(header.offset)
                except Exception:  # noqa: BLE001 - skip an undecodable unit
                    continue
                if unit is not None and _AT_STMT_LIST in unit.top:
                    comp_dir = unit.top.get(_AT_COMP_DIR)
                    self._comp_dirs[unit.top[_AT_STMT_LIST][1]] = (
                        self._reader.string(unit, comp_dir) if comp_dir else None)
        return self._comp_dirs.get(stmt_offset)

    def _unit_for(self, addr: int) -> int | None:
        if self._unit_ranges is None:
            self._unit_ranges = self._read_unit_ranges()
        starts, ranges = self._unit_ranges
        i = bisect_right(starts, addr) - 1
        for j in range(i, max(i - 16, -1), -1):
            lo, hi, unit_offset = ranges[j]
            if lo <= addr < hi:
                return unit_offset
        return None

    def _read_unit_ranges(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        ranges = self._reader.arange_units()
        described = {r[2] for r in ranges}
        for header in self._reader.units:
            if header.offset in described:
                continue
            unit = self._reader.unit_at(header.offset)
            if unit is not None:
                ranges.extend((lo, hi, unit.offset) for lo, hi in self._reader.ranges(unit, unit.top))
        ranges.sort()
        return [r[0] for r in ranges], ranges

    def chain(self, addr: int) -> tuple[list[_Scope], int | None]:
        """Scopes covering ``addr``, outermost (the subprogram) first, and the unit's
        DW_AT_stmt_list; ([], None) when no subprogram DIE covers it."""
        unit_offset = self._unit_for(addr)
        if unit_offset is None:
            return [], None
        if unit_offset not in self._scopes:
            self._scopes[unit_offset] = self._read_scopes(unit_offset)
        starts, entries, stmt_list = self._scopes[unit_offset]
        i = bisect_right(starts, addr) - 1
        outer = None
        for j in range(i, max(i - 16, -1), -1):
            lo, hi, scope = entries[j]
            if lo <= addr < hi:
                outer = scope
                break
        if outer is None:
            return [], stmt_list
        chain = [outer]
        while True:
            inner = chain[-1].inner(addr)
            if inner is None:
                return chain, stmt_list
            chain.append(inner)

    def _read_scopes(self, unit_offset: int) -> _UnitScopes:
        """Walk one unit: concrete subprograms (in namespaces/classes too) and the
        inlined subroutines nested in them; everything else is skipped."""
        reader = self._reader
        unit = reader.unit_at(unit_offset)
        if unit is None:
            return _UnitScopes([], [], None)
        stmt = unit.top.get(_AT_STMT_LIST)
        entries: list[tuple[int, int, _Scope]] = []
        abbrev, _values, pos = reader.read_die(unit, unit.first_die)
        # stack of (enclosing scope, walking?) for the children being read
        stack: list[tuple[_Scope | None, bool]] = [(None, True)] if abbrev and abbrev.has_children else []
        while stack and pos < unit.end:
            die_offset = pos
            abbrev, values, pos = reader.read_die(unit, pos)
            if abbrev is None:
                stack.pop()
                continue
            scope, walking = stack[-1]
            child: tuple[_Scope | None, bool] = (None, False)
            if walking:
                child = self._visit(unit, abbrev.tag, values, die_offset, scope, entries)
            if not abbrev.has_children:
                continue
            if not child[1] and _AT_SIBLING in values:
                target = reader.reference(unit, values[_AT_SIBLING])
                if target is not None and pos <= target <= unit.end:
                    pos = target
                    continue
            stack.append(child)
        entries.sort(key=lambda e: (e[0], e[1]))
        return _UnitScopes([e[0] for e in entries], entries, stmt[1] if stmt else None)

    def _visit(self, unit: _Unit, tag: int, values: dict[int, tuple[int, int]], die_offset: int,
               scope: _Scope | None, entries: list[tuple[int, int, _Scope]]) -> tuple[_Scope | None, bool]:
        """Record one DIE; return the context its children are read in."""
        if tag == _TAG_SUBPROGRAM and scope is None:
            ranges = self._reader.ranges(unit, values)
            if not ranges:
                return None, False  # a declaration or an abstract instance
            new = _Scope(ranges, die_offset)
            entries.extend((lo, hi, new) for lo, hi in ranges)
            return new, True
        if tag == _TAG_INLINED and scope is not None:
            ranges = self._reader.ranges(unit, values)
            if not ranges:
                return scope, True
            call_file = values.get(_AT_CALL_FILE, (0, 0))[1]
            call_line = values.get(_AT_CALL_LINE, (0, 0))[1]
            new = _Scope(ranges, die_offset, call_file, call_line)
            scope.children.append(new)
            return new, True
        if tag in _TAG_BLOCKS and scope is not None:
            return scope, True
        if tag in _TAG_CONTAINERS and scope is None:
            return None, True
        return None, False

    # -- names
    def name(self, scope: _Scope) -> str | None:
        """Demangled (or namespace-qualified) name of a scope's function."""
        if scope.die not in self._names:
            try:
                self._names[scope.die] = self._function_name(self._reader, scope.die, 0)
            except Exception:  # noqa: BLE001 - odd references: no name
                self._names[scope.die] = None
        return self._names[scope.die]

    def _function_name(self, reader: _DieReader, die_offset: int, depth: int) -> str | None:
        """Linkage name (demangled) of a function DIE, following abstract_origin and
        specification; else DW_AT_name qualified by enclosing namespaces and classes."""
        unit = reader.unit_at(die_offset)
        if unit is None:
            return None
        _abbrev, values, _pos = reader.read_die(unit, die_offset)
        for attr in (_AT_LINKAGE_NAME, _AT_MIPS_LINKAGE_NAME):
            if attr in values:
                linkage = reader.string(unit, values[attr])
                if linkage:
                    return demangle(linkage)
        if depth < 8:
            for attr in (_AT_ABSTRACT_ORIGIN, _AT_SPECIFICATION):
                target = reader.target(unit, values[attr]) if attr in values else None
                if target is not None:
                    name = self._function_name(target[0], target[1], depth + 1)
                    if name:
                        return name
        name = reader.string(unit, values[_AT_NAME]) if _AT_NAME in values else None
        if not name:
            return None
        if unit.top.get(_AT_LANGUAGE, (0, 0))[1] in _C_LANGUAGES:
            return name  # nothing to qualify with
        prefix = self._qualifier_map(reader, unit).get(die_offset)
        return f"{prefix}::{name}" if prefix else name

    def _qualifier_map(self, reader: _DieReader, unit: _Unit) -> dict[int, str]:
        """For every DIE of a unit directly inside namespaces/classes: 'ns::Class'."""
        key = (id(reader), unit.offset)
        if key in self._qualifiers:
            return self._qualifiers[key]
        out: dict[int, str] = {}
        abbrev, _values, pos = reader.read_die(unit, unit.first_die)
        stack: list[str | None] = [""] if abbrev and abbrev.has_children else []
        while stack and pos < unit.end:
            die_offset = pos
            abbrev, values, pos = reader.read_die(unit, pos)
            if abbrev is None:
                stack.pop()
                continue
            prefix = stack[-1]
            if prefix:
                out[die_offset] = prefix
            if abbrev.has_children:
                if prefix is not None and abbrev.tag in _TAG_CONTAINERS:
                    part = (reader.string(unit, values[_AT_NAME]) if _AT_NAME in values else None) \
                        or "(anonymous namespace)"
                    stack.append(f"{prefix}::{part}" if prefix else part)
                else:
                    stack.append(None)
        self._qualifiers[key] = out
        return out


# --------------------------------------------------------------------------- modules


class _Module:
    """Everything needed to symbolize one module, built once."""

    def __init__(self, path: str, segments: list[_Segment], symbols: SymbolTable,
                 lines: LineTable | None, dwarf: _DwarfIndex | None) -> None:
        self.path = path
        self._segments = segments
        self._symbols = symbols
        self._lines = lines
        self._dwarf = dwarf

    def frames(self, offset: int, return_address: bool) -> list[Frame]:
        """Frames for one file offset, innermost first."""
        look = offset - 1 if return_address and offset > 0 else offset
        vaddr = _offset_to_vaddr(self._segments, look)
        if vaddr is None:
            return [Frame(unknown_name(self.path, offset), self.path, None, None, offset)]
        raw = self._symbols.lookup(vaddr)
        symbol = demangle(raw) if raw else None
        where = self._lines.lookup(vaddr) if self._lines is not None else None
        file, line = where if where is not None else (None, None)
        chain, stmt = self._inline_chain(vaddr)
        frames = []
        for scope in reversed(chain[1:]):  # inlined subroutines, innermost first
            name = self._dwarf.name(scope) if self._dwarf is not None else None
            frames.append(Frame(name or unknown_name(self.path, offset), self.path,
                                file, line, offset, inlined=True))
            file = (self._lines.file_name(stmt, scope.call_file)
                    if self._lines is not None and stmt is not None else None)
            line = scope.call_line or None
        if symbol is None and chain and self._dwarf is not None:
            symbol = self._dwarf.name(chain[0])
        frames.append(Frame(symbol or unknown_name(self.path, offset), self.path, file, line, offset))
        return frames

    def _inline_chain(self, vaddr: int) -> tuple[list[_Scope], int | None]:
        """Inline scopes at ``vaddr``; DWARF this reader can't decode just gives none."""
        if self._dwarf is None:
            return [], None
        try:
            return self._dwarf.chain(vaddr)
        except Exception:  # noqa: BLE001 - e.g. an unknown DW_FORM: keep symbol and line
            return [], None


@dataclass
class _Opened:
    path: str
    stream: BinaryIO
    elf: ELFFile


def _load_module(path: str, build_id: str | None, debug_dirs: tuple[str, ...],
                 inlines: bool, progress: Progress) -> _Module | None:
    """Open ``path`` and its debug file, build the tables. None when neither is usable."""
    started = time.monotonic()
    main = _open_elf(path)
    opened: _Opened | None = _Opened(path, *main) if main else None
    if opened is None:
        progress(f"{path}: not readable as ELF")
    file_build_id = _build_id(opened.elf) if opened else None
    if opened and build_id and file_build_id and file_build_id != build_id:
        progress(f"{path}: build id {file_build_id} on disk, {build_id} traced: not using the file")
        opened.stream.close()
        opened = None
    debug = None
    wanted_id = build_id or file_build_id
    self_contained = opened is not None and all(
        _has_section(opened.elf, name) for name in (".debug_line", ".symtab"))
    if not self_contained:
        debug = _find_debug_file(path, wanted_id, _debuglink(opened.elf) if opened else None,
                                 debug_dirs, progress)
    if opened is None and debug is None:
        return None
    try:
        return _assemble(path, opened, debug, inlines, debug_dirs, progress, started)
    except Exception:  # noqa: BLE001 - a corrupt file: fall back to unknown frames
        progress(f"{path}: unreadable symbol or debug tables")
        return None
    finally:  # everything needed was read into memory
        for item in (opened, debug):
            if item is not None:
                item.stream.close()


def _find_debug_file(path: str, build_id: str | None, link: str | None,
                     debug_dirs: tuple[str, ...], progress: Progress) -> _Opened | None:
    """First separate debug file that exists, is ELF and (when ids are known) matches."""
    own = os.path.realpath(path)
    for candidate in _debug_file_candidates(path, build_id, link, debug_dirs):
        if not os.path.isfile(candidate) or os.path.realpath(candidate) == own:
            continue
        found = _open_elf(candidate)
        if found is None:
            continue
        candidate_id = _build_id(found[1])
        if build_id and candidate_id and candidate_id != build_id:
            found[0].close()
            continue
        progress(f"{path}: debug info from {candidate}")
        return _Opened(candidate, *found)
    return None


def _assemble(path: str, opened: _Opened | None, debug: _Opened | None, inlines: bool,
              debug_dirs: tuple[str, ...], progress: Progress, started: float) -> _Module:
    """Build symbol table, line table and DIE index from the opened files."""
    if opened is not None:
        segments = _load_segments(opened.elf)
    else:
        assert debug is not None
        progress(f"{path}: module missing, assuming its layout from {debug.path}")
        segments = _load_segments(debug.elf, debug_only=True)
    raw: list[_RawSymbol] = []
    for item, section in ((opened, ".symtab"), (debug, ".symtab"), (opened, ".dynsym")):
        if item is not None:
            raw.extend(_read_symbols(item.elf, section))
    symbols = SymbolTable.build(raw)
    dwarf_file = next((o for o in (debug, opened)
                       if o is not None and _has_section(o.elf, ".debug_line")), None)
    lines = dwarf = None
    if dwarf_file is not None:
        index = _dwarf_index(dwarf_file, debug_dirs, progress)
        lines = LineTable.build(dwarf_file.elf, _address_filter(_exec_ranges(dwarf_file.elf)),
                                index.comp_dir if index is not None else (lambda _stmt: None))
        dwarf = index if inlines else None
    progress(f"{path}: {len(symbols)} symbols, {len(lines) if lines else 0} line rows"
             f" in {time.monotonic() - started:.2f}s")
    return _Module(path, segments, symbols, lines, dwarf)


def _dwarf_index(dwarf_file: _Opened, debug_dirs: tuple[str, ...],
                 progress: Progress) -> _DwarfIndex | None:
    """The DIE index of a file, or None without (readable) .debug_info."""
    if not _has_section(dwarf_file.elf, ".debug_info"):
        return None
    alt = _find_alt_file(dwarf_file, debug_dirs, progress)
    try:
        return _DwarfIndex(dwarf_file.elf, alt.elf if alt is not None else None)
    except Exception as error:  # noqa: BLE001 - lines and symbols still work without it
        progress(f"{dwarf_file.path}: unreadable .debug_info ({error}): no inlined frames")
        return None
    finally:
        if alt is not None:
            alt.stream.close()


def _find_alt_file(dwarf_file: _Opened, debug_dirs: tuple[str, ...],
                   progress: Progress) -> _Opened | None:
    """The dwz supplementary file named by ``.gnu_debugaltlink`` (path, then build id)."""
    section = dwarf_file.elf.get_section_by_name(".gnu_debugaltlink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    raw_name, _, raw_id = section.data().partition(b"\0")
    name, alt_id = os.fsdecode(raw_name), raw_id.hex() or None
    candidates = [os.path.join(os.path.dirname(dwarf_file.path), name)]
    if alt_id:
        candidates += [os.path.join(d, ".build-id", alt_id[:2], alt_id[2:] + ".debug")
                       for d in debug_dirs]
    for candidate in candidates:
        found = _open_elf(candidate) if os.path.isfile(candidate) else None
        if found is None:
            continue
        if alt_id and _build_id(found[1]) not in (None, alt_id):
            found[0].close()
            continue
        progress(f"{dwarf_file.path}: supplementary DWARF from {candidate}")
        return _Opened(candidate, *found)
    progress(f"{dwarf_file.path}: supplementary DWARF {name} not found")
    return None


def _address_filter(ranges: list[tuple[int, int]]) -> Callable[[int], bool]:
    """Predicate: does an address fall in one of the sorted ``ranges`` (all pass if none)?
    Drops line sequences of code the linker discarded (relocated to 0 or a tombstone)."""
    starts = [lo for lo, _ in ranges]

    def inside(addr: int) -> bool:
        i = bisect_right(starts, addr) - 1
        return not ranges or (i >= 0 and addr < ranges[i][1])

    return inside


# --------------------------------------------------------------------------- public API


class Symbolizer:
    """Symbolizes file offsets in ELF modules; tables are cached per module version."""

    def __init__(self, debug_dirs: Iterable[str] = ("/usr/lib/debug",),
                 progress: Progress | None = None, inlines: bool = True) -> None:
        self._debug_dirs = tuple(debug_dirs)
        self._progress: Progress = progress or (lambda _message: None)
        self._inlines = inlines
        self._modules: dict[tuple[str, str | None, int | None], _Module | None] = {}

    def symbolize(self, module_path: str, offsets: Iterable[int], build_id: str | None = None,
                  return_addresses: bool = True) -> dict[int, list[Frame]]:
        """Map FILE OFFSETS within the ELF file module_path to frames (innermost first; a list
        because of inlining — normally one element). When return_addresses is True, look up
        offset-1 for the function/line (the addresses are return addresses pointing after a
        call), but key the result by the offset given. Never raises for a missing/unreadable/
        non-ELF module: returns '[unknown]'-style frames (function = f"{basename}+0x{off:x}")
        instead."""
        module = self._module(module_path, build_id)
        result: dict[int, list[Frame]] = {}
        for offset in offsets:
            if offset in result:
                continue
            frames = None
            if module is not None:
                try:
                    frames = module.frames(offset, return_addresses)
                except Exception:  # noqa: BLE001 - one odd DIE must not lose the whole report
                    frames = None
            result[offset] = frames or [Frame(unknown_name(module_path, offset), module_path,
                                              None, None, offset)]
        return result

    def close(self) -> None:
        """Drop the cached module tables (no files are held open between calls)."""
        self._modules.clear()

    def __enter__(self) -> Symbolizer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _module(self, path: str, build_id: str | None) -> _Module | None:
        build_id = build_id.strip().lower() if build_id else None
        try:
            mtime: int | None = os.stat(path).st_mtime_ns
        except OSError:
            mtime = None
        key = (path, build_id, mtime)
        if key not in self._modules:
            self._progress(f"loading {path}")
            try:
                self._modules[key] = _load_module(path, build_id, self._debug_dirs,
                                                  self._inlines, self._progress)
            except Exception as error:  # noqa: BLE001 - a hostile file gives unknown frames
                self._progress(f"{path}: {error}")
                self._modules[key] = None
        return self._modules[key]
