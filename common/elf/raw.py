"""An ELF file's headers read with struct, no pyelftools (`RawElf`): fast enough to scan every
module of a process, and giving up (None) on whatever it does not take on, where callers fall
back to pyelftools."""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from .container import Segment

SHT_NOBITS, _SHT_NOTE = 8, 7
_PT_LOAD, _PT_INTERP, _PT_NOTE = 1, 3, 4
_ET_CORE = 4
_NT_GNU_BUILD_ID = 3
_SHF_COMPRESSED = 0x800
EM_ARM = 40  # e_machine of 32-bit ARM: Thumb functions' addresses have bit 0 set


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

    def __init__(
        self,
        fd: int,
        is64: bool,
        little: bool,
        machine: int,
        sections: list[RawSection],
        loads: list[Segment],
        interp: bool,
        notes: list[tuple[int, int]],
    ) -> None:
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
            (etype, machine, phoff, shoff, phentsize, phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
                e + "HH4x8xQQ4x2xHHHHH", ident, 16
            )
        else:
            (etype, machine, phoff, shoff, phentsize, phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
                e + "HH4x4xII4x2xHHHHH", ident, 16
            )
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
            name = names[name_off : end if end >= 0 else len(names)].decode("utf-8", "replace")
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
                name = data[off : off + namesz].split(b"\0", 1)[0] if namesz else None
                off += (namesz + 3) & ~3
                if ntype == _NT_GNU_BUILD_ID and name == b"GNU":
                    return data[off : off + descsz].hex()
                off += (descsz + 3) & ~3
        return None

    @property
    def static(self) -> bool:
        """is_static: no PT_INTERP and no .dynsym."""
        return not self.interp and self.section(".dynsym") is None
