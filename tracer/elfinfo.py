"""What the tracer needs from ELF files: build IDs, symbol file offsets, which object provides
malloc. Symbolization proper is offline, in reports.symbolize."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from .procfs import Mapping

# Probed functions: symbol -> BPF entry program. All share the return program `alloc_return`
# except free (entry only).
ALLOC_FUNCS = ["malloc", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
               "memalign", "valloc", "pvalloc", "malloc_trim", "free"]
REQUIRED_FUNCS = {"malloc", "free"}

KNOWN_ALLOCATORS = [("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"),
                    ("libmimalloc", "mimalloc"), ("libc.so", "glibc"), ("libc-", "glibc")]


@lru_cache(maxsize=512)
def build_id(path: str) -> str:
    """Hex GNU build ID of an ELF file, '' when it has none or is not readable."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if isinstance(sec, NoteSection):
                    for note in sec.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            return str(note["n_desc"])
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_NOTE":
                    for note in seg.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            return str(note["n_desc"])
    except (OSError, ELFError, ValueError):
        pass
    return ""


def _vaddr_to_offset(elf: ELFFile, vaddr: int) -> int | None:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
            return vaddr - seg["p_vaddr"] + seg["p_offset"]
    return None


@dataclass
class SymbolOffsets:
    path: str
    offsets: dict[str, int] = field(default_factory=dict)  # defined function -> file offset
    sizes: dict[str, int] = field(default_factory=dict)    # defined function -> st_size
    static: bool = False  # no PT_INTERP / no .dynsym: statically linked


def symbol_offsets(path: str, names: list[str]) -> SymbolOffsets:
    """File offsets of the defined functions `names` in ELF `path` (.dynsym first, then
    .symtab). A name the file does not define is absent from the result."""
    res = SymbolOffsets(path)
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            res.static = not any(s["p_type"] == "PT_INTERP" for s in elf.iter_segments()) and \
                elf.get_section_by_name(".dynsym") is None
            wanted = set(names)
            for secname in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(secname)
                if not isinstance(sec, SymbolTableSection):
                    continue
                for sym in sec.iter_symbols():
                    name = sym.name.split("@")[0]
                    if name not in wanted or name in res.offsets:
                        continue
                    if sym["st_shndx"] == "SHN_UNDEF" or sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC"):
                        continue
                    off = _vaddr_to_offset(elf, sym["st_value"])
                    if off is not None:
                        res.offsets[name] = off
                        res.sizes[name] = int(sym["st_size"])
    except (OSError, ELFError, ValueError):
        pass
    return res


@dataclass
class Allocator:
    path: str        # the ELF file that provides malloc to the process
    kind: str        # glibc | jemalloc | tcmalloc | mimalloc | static | custom
    offsets: dict[str, int]
    sizes: dict[str, int] = field(default_factory=dict)


def find_allocator(exe_path: str, maps: list[Mapping]) -> Allocator | None:
    """The object whose `malloc` the process calls: the executable when it defines malloc
    (static or built-in allocator), else a known allocator library, else libc."""
    files = []
    for m in maps:
        if m.is_file and "x" in m.perms and m.path not in files and os.path.exists(m.path):
            files.append(m.path)
    exe_real = os.path.realpath(exe_path) if exe_path else ""
    ordered = [p for p in files if os.path.realpath(p) == exe_real]
    libs = [p for p in files if os.path.realpath(p) != exe_real]
    for prefix, _kind in KNOWN_ALLOCATORS:
        ordered += [p for p in libs if os.path.basename(p).startswith(prefix) and p not in ordered]
    ordered += [p for p in libs if p not in ordered]
    for path in ordered:
        so = symbol_offsets(path, ALLOC_FUNCS)
        if "malloc" in so.offsets and "free" in so.offsets:
            base = os.path.basename(path)
            if path in [p for p in files if os.path.realpath(p) == exe_real]:
                kind = "static" if so.static else "custom"
            else:
                kind = next((k for pre, k in KNOWN_ALLOCATORS if base.startswith(pre)), "custom")
            return Allocator(path, kind, so.offsets, so.sizes)
    return None
