"""Offline symbolizing: (ELF module, file offset) -> function, source file and line, inlined
frames included. Nothing here needs root or BCC. One module per specification:

    demangle.py    C++ (Itanium) and Rust (legacy, v0) names
    dwarf.py       encodings all DWARF sections share (LEB128, strings, unit lengths)
    lines.py       .debug_line line-number programs -> (file, line)
    dies.py        .debug_info: units, abbreviations, DIEs, attribute values, ranges, aranges
    inlines.py     DIEs -> inlined subroutine chains and function names
    embedded.py    symbols stored in a trace (--embed-symbols), for modules not on this machine
    symbolizer.py  `Symbolizer`: per module, symbols (common.elf) + lines + inlines

The ELF container, symbol tables and separate debug files are common.elf's (the tracer reads
them too, for --embed-symbols).
"""

from __future__ import annotations

from .demangle import demangle
from .symbolizer import Frame, Symbolizer, unknown_name

__all__ = ["Frame", "Symbolizer", "demangle", "unknown_name"]
