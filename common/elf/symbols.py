"""The function symbols of `.symtab` and `.dynsym` read in full (`read_symbols`), one name chosen
per address (`SymbolTable`), and the two questions asked of them: where named functions are
(`defined_functions`) and every function of a module as a symbolizer names them
(`module_symbols`, the separate debug file's `.symtab` included)."""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from elftools.elf.elffile import ELFFile

from .container import SHF_EXECINSTR, elf_build_id, open_elf, segments, vaddr_to_offset
from .debugfiles import DEBUG_DIRS, debuglink, find_debug_file

STT_NOTYPE, STT_FUNC, STT_GNU_IFUNC = 0, 2, 10
_BIND_RANK = {1: 0, 10: 0, 2: 0, 0: 1}  # GLOBAL, GNU_UNIQUE and WEAK alike, then LOCAL
SHN_LORESERVE = 0xFF00  # section indexes from here up are special (ABS, COMMON, XINDEX): no code there


class RawSymbol(NamedTuple):
    """One function-like entry of a symbol table."""

    addr: int
    size: int
    name: str
    rank: tuple[int, int, int, int, str]  # smaller is the better name for an address
    section_end: int
    kind: int  # STT_FUNC, STT_GNU_IFUNC or STT_NOTYPE


def symbol_rank(bind: int, size: int, name: str) -> tuple[int, int, int, int, str]:
    """RawSymbol.rank of a symbol of binding `bind` (STB_*): global, GNU-unique and weak alike
    over local, sized over unsized, fewer leading underscores, shorter, then by name."""
    return (_BIND_RANK.get(bind, 3), 0 if size else 1, len(name) - len(name.lstrip("_")), len(name), name)


def read_symbols(elf: ELFFile, section_name: str) -> list[RawSymbol]:
    """Function-like symbols (FUNC, GNU_IFUNC, NOTYPE in code) of one symbol table, with
    versions stripped from their names (memcpy@@GLIBC_2.14 -> memcpy). Unpacked straight from
    the section's bytes: pyelftools' object per symbol costs seconds on a debug file's .symtab."""
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
    out: list[RawSymbol] = []
    for entry in struct.iter_unpack(fmt, data):
        if is64:
            name_off, info, _other, shndx, value, size = entry
        else:
            name_off, value, size, info, _other, shndx = entry
        kind = info & 0xF
        if kind not in (STT_FUNC, STT_GNU_IFUNC, STT_NOTYPE):
            continue
        if shndx == 0 or shndx >= SHN_LORESERVE or shndx >= len(headers) or not name_off:
            continue
        flags, sec_addr, sec_size = headers[shndx]
        if not flags & SHF_EXECINSTR and (kind == STT_NOTYPE or not size):
            continue
        name = strtab[name_off : strtab.find(b"\0", name_off)].decode("utf-8", "replace")
        if not name or name.startswith(("$", ".L")):  # ARM/AArch64 mapping symbols, local labels
            continue
        if "@" in name[1:]:  # versioned names in .symtab: memcpy@@GLIBC_2.14
            name = name[: name.index("@", 1)]
        if thumb:
            value &= ~1
        rank = symbol_rank(info >> 4, size, name)
        out.append(RawSymbol(value, size, name, rank, sec_addr + sec_size, kind))
    return out


class SymbolTable:
    """Sorted, non-overlapping-ish function intervals with one chosen name each."""

    def __init__(self, starts: list[int], ends: list[int], names: list[str]) -> None:
        self.starts = starts
        self.ends = ends
        self.names = names

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Iterator[tuple[int, int, str]]:
        """(start, end, raw name) by address."""
        return zip(self.starts, self.ends, self.names)

    @classmethod
    def build(cls, symbols: Iterable[RawSymbol]) -> SymbolTable:
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
        """Raw (mangled) name of the symbol covering `addr`, or None."""
        i = bisect_right(self.starts, addr) - 1
        for j in range(i, max(i - 8, -1), -1):  # a few steps back for nested symbols
            if addr < self.ends[j]:
                return self.names[j]
        return None


def defined_functions(elf: ELFFile, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """name -> (file offset, size) of the functions (FUNC, GNU_IFUNC) `names` that the file
    defines, .dynsym before .symtab; a name it does not define is absent."""
    wanted = set(names)
    segs = segments(elf)
    out: dict[str, tuple[int, int]] = {}
    for section in (".dynsym", ".symtab"):
        for sym in read_symbols(elf, section):
            if sym.name not in wanted or sym.name in out or sym.kind == STT_NOTYPE:
                continue
            off = vaddr_to_offset(segs, sym.addr)
            if off is not None:
                out[sym.name] = (off, sym.size)
    return out


def module_symbols(
    path: str, bid: str | None = None, debug_dirs: Iterable[str] = DEBUG_DIRS
) -> list[tuple[int, int, str]]:
    """(file offset, size, raw name) of the functions of the module at `path` as a symbolizer
    names them (.symtab, .dynsym and the separate debug file's .symtab), sorted; [] when the
    file is unreadable or is another build than `bid`."""
    main = open_elf(path)
    if main is None:
        return []
    debug = None
    try:
        file_id = elf_build_id(main.elf)
        if bid and file_id and file_id != bid.lower():
            return []  # another build than the one traced
        segs = segments(main.elf)
        raw = read_symbols(main.elf, ".symtab") + read_symbols(main.elf, ".dynsym")
        debug = find_debug_file(path, bid or file_id, debuglink(main.elf), debug_dirs)
        if debug is not None:
            raw += read_symbols(debug.elf, ".symtab")
        table = SymbolTable.build(raw)
    except Exception:  # noqa: BLE001 - a corrupt file gives nothing
        return []
    finally:
        main.close()
        if debug is not None:
            debug.close()
    out = []
    for start, end, name in table:
        off = vaddr_to_offset(segs, start)
        if off is not None:
            out.append((off, end - start, name))
    return out
