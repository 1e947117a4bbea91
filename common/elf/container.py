"""The ELF container as pyelftools reads it (headers, sections, notes, compressed sections), and
the policy common.elf adds on top: opening a file as ELF or not at all, file offsets <-> virtual
addresses through the PT_LOAD program headers, the GNU build ID from the notes, section contents
and the address ranges of code."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any, BinaryIO, NamedTuple

from elftools.elf.elffile import ELFFile

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
    return sorted(
        (s["sh_addr"], s["sh_addr"] + s["sh_size"])
        for s in elf.iter_sections()
        if s["sh_flags"] & SHF_EXECINSTR and s["sh_size"]
    )


def is_static(elf: ELFFile) -> bool:
    """Statically linked: no PT_INTERP and no .dynsym."""
    return (
        not any(s["p_type"] == "PT_INTERP" for s in elf.iter_segments()) and elf.get_section_by_name(".dynsym") is None
    )
