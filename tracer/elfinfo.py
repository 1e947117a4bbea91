"""Which object provides malloc to a process, and at what file offsets its allocator functions
are (the ELF reading itself is common.elf)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from common.elf import defined_functions, is_static, open_elf

from .procfs import Mapping

# Probed functions: symbol -> BPF entry program. All share the return program `alloc_return`
# except free (entry only).
ALLOC_FUNCS = ["malloc", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
               "memalign", "valloc", "pvalloc", "malloc_trim", "free"]
REQUIRED_FUNCS = {"malloc", "free"}

KNOWN_ALLOCATORS = [("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"),
                    ("libmimalloc", "mimalloc"), ("libc.so", "glibc"), ("libc-", "glibc")]


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
    opened = open_elf(path)
    if opened is None:
        return res
    with opened:
        try:
            res.static = is_static(opened.elf)
            found = defined_functions(opened.elf, names)
        except Exception:  # noqa: BLE001 - a malformed file defines nothing
            return res
    res.offsets = {name: off for name, (off, _size) in found.items()}
    res.sizes = {name: size for name, (_off, size) in found.items()}
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
