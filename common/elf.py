"""The one ELF reader: what unwinding, allocator detection (whose function offsets and sizes probe
placement works from), symbol embedding and symbolizing need from an ELF file. pyelftools reads
the container (headers, sections, notes, compressed sections); this module adds the policy on top:

* `open_elf` opens a file as ELF or gives None (missing, unreadable, truncated, not ELF);
  `OpenedElf.open` raises instead, for callers that report why.
* `segments` / `offset_to_vaddr` / `vaddr_to_offset`: file offsets <-> virtual addresses through
  the PT_LOAD program headers (PIE, shared libraries and fixed-address executables alike).
* `elf_build_id` / `build_id`: the GNU build ID from the notes.
* `debuglink`, `find_debug_file`, `find_alt_file`: separate debug files, where gdb looks for
  them (`<debug dir>/.build-id/xx/yyyy.debug`, `.gnu_debuglink` beside the file, in `.debug/`
  and under the debug dir), and dwz's supplementary file (`.gnu_debugaltlink`).
* `read_symbols` / `SymbolTable` / `module_symbols`: the function symbols of `.symtab` and
  `.dynsym`, one name chosen per address.
* `section_bytes`, `has_section`, `exec_ranges`: section contents (decompressed) and the
  address ranges of code.

Nothing here raises for a bad file except `OpenedElf.open`; nothing keeps a file open after its
`OpenedElf` is closed.
"""
from __future__ import annotations

import os
import struct
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from elftools.elf.elffile import ELFFile

if TYPE_CHECKING:
    import numpy as np

Progress = Callable[[str], None]
DEBUG_DIRS = ("/usr/lib/debug",)


def _quiet(_message: str) -> None:
    pass


# --------------------------------------------------------------------------- opening


class OpenedElf:
    """An open ELF file: its path, the stream pyelftools reads and the ELFFile. Close it (or use
    it as a context manager) once what is needed was read."""

    def __init__(self, path: str, stream: BinaryIO, elf: ELFFile) -> None:
        self.path = path
        self.stream = stream
        self.elf = elf

    @classmethod
    def open(cls, path: str) -> OpenedElf:
        """Open `path` as ELF; raises OSError or ELFError (and struct errors on a truncated file)."""
        stream = open(path, "rb")  # noqa: SIM115 - the OpenedElf owns it until close()
        try:
            return cls(path, stream, ELFFile(stream))
        except BaseException:
            stream.close()
            raise

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> OpenedElf:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_elf(path: str) -> OpenedElf | None:
    """Open `path` as ELF, or return None (missing, unreadable, not ELF)."""
    try:
        return OpenedElf.open(path)
    except Exception:  # noqa: BLE001 - OSError, ELFError, struct errors on truncated files, ...
        return None


# --------------------------------------------------------------------------- segments


class Segment(NamedTuple):
    """A PT_LOAD segment: where its bytes are in the file and where it is mapped."""

    offset: int
    filesz: int
    vaddr: int
    memsz: int


def segments(elf: ELFFile, debug_only: bool = False) -> list[Segment]:
    """The PT_LOAD segments.

    A separate debug file has PT_LOAD headers whose offsets and file sizes no longer describe
    the original file; with `debug_only` the original layout is assumed to be the usual one
    (file offset = vaddr - vaddr of the first segment, the whole memory size in the file).
    """
    loads = [s.header for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
    if not debug_only:
        return [Segment(h["p_offset"], h["p_filesz"], h["p_vaddr"], h["p_memsz"]) for h in loads]
    if not loads:
        return []
    base = min(h["p_vaddr"] for h in loads) & ~0xFFF
    return [Segment(h["p_vaddr"] - base, h["p_memsz"], h["p_vaddr"], h["p_memsz"]) for h in loads]


def offset_to_vaddr(segs: list[Segment], offset: int) -> int | None:
    """Virtual address of a file offset, None outside every segment's file bytes."""
    for seg in segs:
        if seg.offset <= offset < seg.offset + seg.filesz:
            return offset - seg.offset + seg.vaddr
    return None


def vaddr_to_offset(segs: list[Segment], vaddr: int, whole: bool = False, end: bool = False) -> int | None:
    """File offset of a virtual address: inside a segment's file bytes (p_filesz), or with
    `whole` anywhere in its memory image (p_memsz, as unwinding counts code ranges); `end` also
    takes the first address past a segment (the end of a range). None outside them."""
    for seg in segs:
        size = seg.memsz if whole else seg.filesz
        if seg.vaddr <= vaddr < seg.vaddr + size or (end and vaddr == seg.vaddr + size):
            return vaddr - seg.vaddr + seg.offset
    return None


# --------------------------------------------------------------------------- build IDs


def elf_build_id(elf: ELFFile) -> str | None:
    """Hex GNU build ID from the notes (SHT_NOTE sections first, PT_NOTE segments when the
    file has no note section): the first note of type NT_GNU_BUILD_ID whose owner is "GNU"; None
    when there is none or the notes are malformed."""
    try:
        containers: Iterable[Any] = [s for s in elf.iter_sections() if s["sh_type"] == "SHT_NOTE"]
        if not containers:
            containers = [s for s in elf.iter_segments() if s["p_type"] == "PT_NOTE"]
        for container in containers:
            for note in container.iter_notes():
                # the owner too: a SystemTap probe note (.note.stapsdt, owner "stapsdt") has type 3
                # as well, and comes first in PyTorch's libc10_cuda.so
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    return str(note["n_desc"]).lower()
    except Exception:  # noqa: BLE001 - malformed notes: no build ID
        return None
    return None


@lru_cache(maxsize=512)
def build_id(path: str) -> str:
    """Hex GNU build ID of the ELF file at `path`, '' when it has none or is not readable."""
    raw = RawElf.open(path)
    if raw is not None:
        with raw:
            try:
                return raw.build_id() or ""
            except (ValueError, OSError):
                pass
    opened = open_elf(path)
    if opened is None:
        return ""
    with opened:
        return elf_build_id(opened.elf) or ""


# --------------------------------------------------------------------------- sections


def section_bytes(elf: ELFFile, name: str) -> bytes | None:
    """Contents of a section, decompressed (SHF_COMPRESSED or the old `.zdebug_` style)."""
    section = elf.get_section_by_name(name)
    if section is not None:
        return None if section["sh_type"] == "SHT_NOBITS" else section.data()
    if name.startswith(".debug_"):
        section = elf.get_section_by_name(".z" + name[1:])
        if section is not None:
            data = section.data()
            return zlib.decompress(data[12:]) if data[:4] == b"ZLIB" else data
    return None


def has_section(elf: ELFFile, name: str) -> bool:
    """The section (or its `.zdebug_` form) exists and has contents in the file."""
    section = elf.get_section_by_name(name)
    if section is None and name.startswith(".debug_"):
        section = elf.get_section_by_name(".z" + name[1:])
    return section is not None and section["sh_type"] != "SHT_NOBITS"


SHF_EXECINSTR = 0x4


def exec_ranges(elf: ELFFile) -> list[tuple[int, int]]:
    """Sorted address ranges of executable sections (SHF_EXECINSTR)."""
    return sorted((s["sh_addr"], s["sh_addr"] + s["sh_size"]) for s in elf.iter_sections()
                  if s["sh_flags"] & SHF_EXECINSTR and s["sh_size"])


def is_static(elf: ELFFile) -> bool:
    """Statically linked: no PT_INTERP and no .dynsym."""
    return not any(s["p_type"] == "PT_INTERP" for s in elf.iter_segments()) and \
        elf.get_section_by_name(".dynsym") is None


# --------------------------------------------------------------------------- debug files


def debuglink(elf: ELFFile) -> str | None:
    """File name stored in `.gnu_debuglink` (the CRC that follows is not checked)."""
    section = elf.get_section_by_name(".gnu_debuglink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    name = section.data().split(b"\0", 1)[0]
    return os.fsdecode(name) or None


def build_id_path(debug_dir: str, bid: str) -> str:
    """`<debug_dir>/.build-id/xx/yyyy.debug` for build ID xxyyyy."""
    return os.path.join(debug_dir, ".build-id", bid[:2], bid[2:] + ".debug")


def debug_file_candidates(module_path: str, bid: str | None, link: str | None,
                          debug_dirs: Iterable[str]) -> Iterator[str]:
    """Where gdb would look for separate debug info, in gdb's order."""
    dirs = list(debug_dirs)
    if bid and len(bid) > 2:
        for d in dirs:
            yield build_id_path(d, bid)
    if link:
        here = os.path.dirname(os.path.abspath(module_path))
        yield os.path.join(here, link)
        yield os.path.join(here, ".debug", link)
        for d in dirs:
            yield os.path.join(d, here.lstrip("/"), link)


def find_debug_file(path: str, bid: str | None, link: str | None,
                    debug_dirs: Iterable[str] = DEBUG_DIRS, progress: Progress = _quiet) -> OpenedElf | None:
    """First separate debug file of the module at `path` that exists, is ELF and (when both
    IDs are known) has build ID `bid`."""
    own = os.path.realpath(path)
    for candidate in debug_file_candidates(path, bid, link, debug_dirs):
        if not os.path.isfile(candidate) or os.path.realpath(candidate) == own:
            continue
        found = open_elf(candidate)
        if found is None:
            continue
        candidate_id = elf_build_id(found.elf)
        if bid and candidate_id and candidate_id != bid:
            found.close()
            continue
        progress(f"{path}: debug info from {candidate}")
        return found
    return None


def find_alt_file(dwarf_file: OpenedElf, debug_dirs: Iterable[str] = DEBUG_DIRS,
                  progress: Progress = _quiet) -> OpenedElf | None:
    """The dwz supplementary file named by `.gnu_debugaltlink` (its path, then its build ID)."""
    section = dwarf_file.elf.get_section_by_name(".gnu_debugaltlink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    raw_name, _, raw_id = section.data().partition(b"\0")
    name, alt_id = os.fsdecode(raw_name), raw_id.hex() or None
    candidates = [os.path.join(os.path.dirname(dwarf_file.path), name)]
    if alt_id:
        candidates += [build_id_path(d, alt_id) for d in debug_dirs]
    for candidate in candidates:
        found = open_elf(candidate) if os.path.isfile(candidate) else None
        if found is None:
            continue
        if alt_id and elf_build_id(found.elf) not in (None, alt_id):
            found.close()
            continue
        progress(f"{dwarf_file.path}: supplementary DWARF from {candidate}")
        return found
    progress(f"{dwarf_file.path}: supplementary DWARF {name} not found")
    return None


# --------------------------------------------------------------------------- symbols

STT_NOTYPE, STT_FUNC, STT_GNU_IFUNC = 0, 2, 10
_BIND_RANK = {1: 0, 10: 0, 2: 0, 0: 1}  # GLOBAL, GNU_UNIQUE and WEAK alike, then LOCAL
_SHN_LORESERVE = 0xFF00


class RawSymbol(NamedTuple):
    """One function-like entry of a symbol table."""

    addr: int
    size: int
    name: str
    rank: tuple[int, int, int, int, str]  # smaller is the better name for an address
    section_end: int
    kind: int  # STT_FUNC, STT_GNU_IFUNC or STT_NOTYPE


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
        if shndx == 0 or shndx >= _SHN_LORESERVE or shndx >= len(headers) or not name_off:
            continue
        flags, sec_addr, sec_size = headers[shndx]
        if not flags & SHF_EXECINSTR and (kind == STT_NOTYPE or not size):
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


def module_symbols(path: str, bid: str | None = None,
                   debug_dirs: Iterable[str] = DEBUG_DIRS) -> list[tuple[int, int, str]]:
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



# --------------------------------------------------------------------------- raw headers, vectorised symbols

SHT_NOBITS, _SHT_NOTE = 8, 7
_PT_LOAD, _PT_INTERP, _PT_NOTE = 1, 3, 4
_ET_CORE = 4
_NT_GNU_BUILD_ID = 3
_SHF_COMPRESSED = 0x800
_EM_ARM = 40


class RawSection(NamedTuple):
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int


class RawElf:
    """An ELF file's headers read with struct (no pyelftools: its object per section header costs
    ~20 µs, and a scan of 100 modules asks for thousands), its sections read on demand. `open`
    gives None for anything this reader does not take on (not ELF, extended section numbering,
    truncated headers): callers then use pyelftools."""

    def __init__(self, fd: int, is64: bool, little: bool, machine: int, sections: list[RawSection],
                 loads: list[Segment], interp: bool, notes: list[tuple[int, int]]) -> None:
        self.fd, self.is64, self.little, self.machine = fd, is64, little, machine
        self.sections, self.loads, self.interp, self.notes = sections, loads, interp, notes
        self.by_name = {s.name: i for i, s in enumerate(sections)}  # the last of a name, as pyelftools

    @classmethod
    def open(cls, path: str) -> RawElf | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = cls._parse(fd)
        except (struct.error, ValueError, IndexError, OSError, UnicodeDecodeError):
            raw = None
        if raw is None:
            os.close(fd)
        return raw

    @classmethod
    def _parse(cls, fd: int) -> RawElf | None:
        ident = os.pread(fd, 64, 0)
        if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            return None
        is64, little = ident[4] == 2, ident[5] == 1
        e = "<" if little else ">"
        if is64:
            (etype, machine, phoff, shoff, phentsize, phnum, shentsize, shnum,
             shstrndx) = struct.unpack_from(e + "HH4x8xQQ4x2xHHHHH", ident, 16)
        else:
            (etype, machine, phoff, shoff, phentsize, phnum, shentsize, shnum,
             shstrndx) = struct.unpack_from(e + "HH4x4xII4x2xHHHHH", ident, 16)
        shfmt = e + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
        phfmt = e + ("IIQQQQQQ" if is64 else "IIIIIIII")
        if shnum == 0 or shstrndx >= shnum or shentsize != struct.calcsize(shfmt) or etype == _ET_CORE:
            return None  # no sections, extended numbering (SHN_XINDEX), a core file: pyelftools' business
        table = os.pread(fd, shnum * shentsize, shoff)
        if len(table) != shnum * shentsize:
            return None
        heads = list(struct.iter_unpack(shfmt, table))
        loads: list[Segment] = []
        notes: list[tuple[int, int]] = []
        interp = False
        if phnum:
            if phentsize != struct.calcsize(phfmt):
                return None
            ph = os.pread(fd, phnum * phentsize, phoff)
            if len(ph) != phnum * phentsize:
                return None
            for p in struct.iter_unpack(phfmt, ph):
                if is64:
                    ptype, _flags, off, vaddr, _paddr, filesz, memsz, _align = p
                else:
                    ptype, off, vaddr, _paddr, filesz, memsz, _flags, _align = p
                if ptype == _PT_LOAD:
                    loads.append(Segment(off, filesz, vaddr, memsz))
                elif ptype == _PT_NOTE:
                    notes.append((off, filesz))
                interp = interp or ptype == _PT_INTERP
        names_sec = heads[shstrndx]
        names = os.pread(fd, names_sec[5], names_sec[4]) if names_sec[1] != SHT_NOBITS else b""
        sections = []
        for h in heads:
            name_off, stype, flags, addr, off, size, link = h[:7]
            end = names.find(b"\0", name_off)
            name = names[name_off: end if end >= 0 else len(names)].decode("utf-8", "replace")
            sections.append(RawSection(name, stype, flags, addr, off, size, link))
        return cls(fd, is64, little, machine, sections, loads, interp, notes)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> RawElf:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def section(self, name: str) -> RawSection | None:
        i = self.by_name.get(name)
        return None if i is None else self.sections[i]

    def data(self, sec: RawSection) -> bytes:
        if sec.flags & _SHF_COMPRESSED:
            raise ValueError("compressed section")
        data = os.pread(self.fd, sec.size, sec.offset)
        if len(data) != sec.size:
            raise ValueError("truncated section")
        return data

    def build_id(self) -> str | None:
        """elf_build_id without pyelftools: the first GNU build-ID note of the SHT_NOTE sections,
        else of the PT_NOTE segments (notes walked as pyelftools walks them). Raises ValueError
        or OSError on truncated notes."""
        ranges = [(s.offset, s.size) for s in self.sections if s.type == _SHT_NOTE] or self.notes
        e = "<" if self.little else ">"
        for start, size in ranges:
            data = os.pread(self.fd, size, start)
            if len(data) != size:
                raise ValueError("truncated notes")
            off = 0
            while off + 12 < size:
                namesz, descsz, ntype = struct.unpack_from(e + "III", data, off)  # 12 bytes are there
                off += 12
                name = data[off: off + namesz].split(b"\0", 1)[0] if namesz else None
                off += (namesz + 3) & ~3
                if ntype == _NT_GNU_BUILD_ID and name == b"GNU":
                    return data[off: off + descsz].hex()
                off += (descsz + 3) & ~3
        return None

    @property
    def static(self) -> bool:
        """is_static: no PT_INTERP and no .dynsym."""
        return not self.interp and self.section(".dynsym") is None


def _candidates(strtab: np.ndarray, starts: np.ndarray, suffixes: Iterable[bytes]) -> np.ndarray:
    """Which names starting at `starts` in the string table could end with one of `suffixes`
    once cut as read_symbols cuts them (at their NUL — an unterminated last string loses its last
    byte, as `strtab[off:strtab.find(0, off)]` does — or at a '@' after their first byte): a
    superset (on the last 8 bytes), found per string end, not per symbol. Tail-merged names
    (one pointing inside another's string) share that string's end."""
    import numpy as np  # noqa: PLC0415 - common/ stays light to import

    nul = np.flatnonzero(strtab == 0)
    if not len(strtab) or strtab[-1] != 0:
        nul = np.concatenate([nul, [max(len(strtab) - 1, 0)]])
    at = np.flatnonzero(strtab == ord("@"))
    ends = np.concatenate([nul, at])
    sufs = [x[-8:] for x in suffixes if x]
    last = np.zeros(256, bool)
    last[list({x[-1] for x in sufs})] = True
    ends = ends[(ends > 0) & last[strtab[np.maximum(ends - 1, 0)]]]
    idx = ends[:, None] + np.arange(-8, 0)  # the 8 bytes before each end, zeros before the table
    key = np.where(idx >= 0, strtab[np.maximum(idx, 0)], 0).astype(np.uint8).view(">u8").ravel()
    hit = np.zeros(len(ends), bool)
    for n in sorted({len(x) for x in sufs}):
        values = np.array(sorted({int.from_bytes(x, "big") for x in sufs if len(x) == n}), dtype=np.uint64)
        hit |= np.isin(key & np.uint64((1 << (8 * n)) - 1), values)
    ends = np.unique(ends[hit])
    if not len(ends):
        return np.zeros(len(starts), bool)
    # each end's string begins after the NUL before it: names starting in [lo, end) may end there
    lo = np.concatenate([[0], nul + 1])[np.searchsorted(nul, ends)]
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(ends[order])
    i = np.searchsorted(lo, starts, side="right") - 1
    return (i >= 0) & (starts < hi[np.maximum(i, 0)])


def _query_symbols(raw: RawElf, section_name: str, wanted: frozenset[str],
                   suffixes: tuple[str, ...]) -> list[RawSymbol] | None:
    """read_symbols' entries of one table whose (stripped) name is in `wanted` or ends with one
    of `suffixes`, in table order; names decoded only for the few that could match. None: a
    table this reader does not take on."""
    import numpy as np  # noqa: PLC0415

    section = raw.section(section_name)
    if section is None or section.type == SHT_NOBITS:
        return []
    if section.link >= len(raw.sections):
        return None
    link = raw.sections[section.link]
    if link.type == SHT_NOBITS:
        return None
    e = "<" if raw.little else ">"
    if raw.is64:
        dt = np.dtype([("name", e + "u4"), ("info", "u1"), ("other", "u1"), ("shndx", e + "u2"),
                       ("value", e + "u8"), ("size", e + "u8")])
    else:
        dt = np.dtype([("name", e + "u4"), ("value", e + "u4"), ("size", e + "u4"), ("info", "u1"),
                       ("other", "u1"), ("shndx", e + "u2")])
    data = raw.data(section)
    syms = np.frombuffer(data, dtype=dt, count=len(data) // dt.itemsize)
    strbytes = raw.data(link)
    strtab = np.frombuffer(strbytes, dtype=np.uint8)
    kind = syms["info"] & 0xF
    shndx = syms["shndx"].astype(np.int64)
    nsec = len(raw.sections)
    execs = np.array([bool(s.flags & SHF_EXECINSTR) for s in raw.sections] + [False])
    ok = (((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (shndx != 0) & (shndx < min(nsec, _SHN_LORESERVE))
          & (syms["name"] != 0) & (syms["name"] < len(strtab)))
    ok &= execs[np.where(ok, shndx, nsec)] | (syms["size"] != 0)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return []
    starts = syms["name"][idx].astype(np.int64)
    keep = _candidates(strtab, starts, [w.encode() for w in (*wanted, *suffixes)])
    thumb = raw.machine == _EM_ARM
    out: list[RawSymbol] = []
    for i in idx[keep]:
        s = syms[i]
        name_off = int(s["name"])
        name = strbytes[name_off: strbytes.find(b"\0", name_off)].decode("utf-8", "replace")
        if not name or name.startswith(("$", ".L")):
            continue
        if "@" in name[1:]:
            name = name[: name.index("@", 1)]
        if name not in wanted and not name.endswith(suffixes):
            continue
        value, size, info = int(s["value"]), int(s["size"]), int(s["info"])
        if thumb:
            value &= ~1
        sec = raw.sections[int(s["shndx"])]
        rank = (_BIND_RANK.get(info >> 4, 3), 0 if size else 1,
                len(name) - len(name.lstrip("_")), len(name), name)
        out.append(RawSymbol(value, size, name, rank, sec.addr + sec.size, info & 0xF))
    return out


class FunctionQuery(NamedTuple):
    functions: dict[str, tuple[int, int]]  # name -> (file offset, size), .dynsym before .symtab
    static: bool


def query_functions(path: str, wanted: Iterable[str], suffixes: Iterable[str] = ()) -> FunctionQuery | None:
    """The defined functions (FUNC, GNU_IFUNC) of the ELF file at `path` named in `wanted` or
    ending with one of `suffixes`: name -> (file offset, size), the first of .dynsym then .symtab
    whose address is in a segment's file bytes (what read_symbols + vaddr_to_offset give, for
    these names only), and whether the file is statically linked. Vectorised over the symbol
    tables: a C++ library's hundreds of thousands of symbols cost milliseconds, not seconds.
    None when the file is not ELF or is unreadable."""
    want, ends = frozenset(wanted), tuple(suffixes)
    raw = RawElf.open(path)
    if raw is not None:
        with raw:
            try:
                found = [_query_symbols(raw, name, want, ends) for name in (".dynsym", ".symtab")]
            except (ValueError, IndexError, OSError):
                found = [None]
            fast = [t for t in found if t is not None]
            if len(fast) == 2:
                return FunctionQuery(_first_defined(raw.loads, fast), raw.static)
    opened = open_elf(path)  # what the raw reader does not take on: pyelftools
    if opened is None:
        return None
    with opened:
        try:
            tables = [[s for s in read_symbols(opened.elf, name) if s.name in want or s.name.endswith(ends)]
                      for name in (".dynsym", ".symtab")]
            return FunctionQuery(_first_defined(segments(opened.elf), tables), is_static(opened.elf))
        except Exception:  # noqa: BLE001 - a malformed file defines nothing
            return None


def _first_defined(segs: list[Segment], tables: list[list[RawSymbol]]) -> dict[str, tuple[int, int]]:
    funcs: dict[str, tuple[int, int]] = {}
    for table in tables:
        for sym in table:
            if sym.kind == STT_NOTYPE or sym.name in funcs:
                continue
            off = vaddr_to_offset(segs, sym.addr)
            if off is not None:
                funcs[sym.name] = (off, sym.size)
    return funcs
