"""At what file offsets functions are, for probing them (the ELF reading itself is common.elf;
which allocators a process has is tracer/allocators/discovery.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.elf import query_functions


@dataclass
class SymbolOffsets:
    path: str
    offsets: dict[str, int] = field(default_factory=dict)  # defined function -> file offset
    sizes: dict[str, int] = field(default_factory=dict)  # defined function -> st_size
    static: bool = False  # no PT_INTERP / no .dynsym: statically linked


def symbol_offsets(path: str, names: list[str]) -> SymbolOffsets:
    """File offsets of the defined functions `names` in ELF `path` (.dynsym first, then
    .symtab). A name the file does not define is absent from the result. Read vectorised
    (common.elf.query_functions): the CUDA driver's tables, or a C++ library's, in milliseconds."""
    res = SymbolOffsets(path)
    q = query_functions(path, names)
    if q is None:
        return res
    res.static, found = q.static, q.functions
    res.offsets = {name: off for name, (off, _size) in found.items()}
    res.sizes = {name: size for name, (_off, size) in found.items()}
    return res
