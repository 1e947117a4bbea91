"""At what file offsets functions are, for probing them (the ELF reading itself is common.elf;
which allocators a process has is tracer/allocators.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.elf import defined_functions, is_static, open_elf


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
