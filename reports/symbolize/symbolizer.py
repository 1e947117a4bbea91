"""The offline symbolizer: (ELF module, file offset) -> frames (function, source file, line),
inlined frames first. It combines, per module, the symbol table (common.elf: .symtab, .dynsym,
the separate debug file's .symtab), the line table (lines.py) and the inline scopes
(inlines.py), all built once per module version and kept as sorted arrays.

* File offsets become virtual addresses through the PT_LOAD headers; a module whose file is gone
  but whose separate debug file is found is assumed to have the usual layout (file offset ==
  vaddr - first segment vaddr).
* A file on disk whose build ID differs from the traced one is not used.
* Lookups never raise: a missing, unreadable or non-ELF module, or an address no symbol
  covers, gives a frame named "<basename>+0x<offset>". No file stays open between calls.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from common.elf import (
    DEBUG_DIRS,
    OpenedElf,
    Progress,
    RawSymbol,
    Segment,
    SymbolTable,
    debuglink,
    elf_build_id,
    exec_ranges,
    find_alt_file,
    find_debug_file,
    has_section,
    offset_to_vaddr,
    open_elf,
    read_symbols,
    segments,
)

from .demangle import demangle
from .inlines import DwarfIndex, Scope
from .lines import LineTable


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


class _Module:
    """Everything needed to symbolize one module, built once."""

    def __init__(
        self, path: str, segs: list[Segment], symbols: SymbolTable, lines: LineTable | None, dwarf: DwarfIndex | None
    ) -> None:
        self.path = path
        self._segments = segs
        self._symbols = symbols
        self._lines = lines
        self._dwarf = dwarf

    def frames(self, offset: int, return_address: bool) -> list[Frame]:
        """Frames for one file offset, innermost first."""
        look = offset - 1 if return_address and offset > 0 else offset
        vaddr = offset_to_vaddr(self._segments, look)
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
            frames.append(Frame(name or unknown_name(self.path, offset), self.path, file, line, offset, inlined=True))
            file = (
                self._lines.file_name(stmt, scope.call_file) if self._lines is not None and stmt is not None else None
            )
            line = scope.call_line or None
        if symbol is None and chain and self._dwarf is not None:
            symbol = self._dwarf.name(chain[0])
        frames.append(Frame(symbol or unknown_name(self.path, offset), self.path, file, line, offset))
        return frames

    def _inline_chain(self, vaddr: int) -> tuple[list[Scope], int | None]:
        """Inline scopes at ``vaddr``; DWARF this reader can't decode just gives none."""
        if self._dwarf is None:
            return [], None
        try:
            return self._dwarf.chain(vaddr)
        except Exception:  # noqa: BLE001 - e.g. an unknown DW_FORM: keep symbol and line
            return [], None


def _load_module(
    path: str, build_id: str | None, debug_dirs: tuple[str, ...], inlines: bool, progress: Progress
) -> _Module | None:
    """Open ``path`` and its debug file, build the tables. None when neither is usable."""
    started = time.monotonic()
    opened = open_elf(path)
    if opened is None:
        progress(f"{path}: not readable as ELF")
    file_build_id = elf_build_id(opened.elf) if opened else None
    if opened and build_id and file_build_id and file_build_id != build_id:
        progress(f"{path}: build id {file_build_id} on disk, {build_id} traced: not using the file")
        opened.close()
        opened = None
    debug = None
    wanted_id = build_id or file_build_id
    self_contained = opened is not None and all(has_section(opened.elf, name) for name in (".debug_line", ".symtab"))
    if not self_contained:
        debug = find_debug_file(path, wanted_id, debuglink(opened.elf) if opened else None, debug_dirs, progress)
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
                item.close()


def _assemble(
    path: str,
    opened: OpenedElf | None,
    debug: OpenedElf | None,
    inlines: bool,
    debug_dirs: tuple[str, ...],
    progress: Progress,
    started: float,
) -> _Module:
    """Build symbol table, line table and DIE index from the opened files."""
    if opened is not None:
        segs = segments(opened.elf)
    else:
        assert debug is not None
        progress(f"{path}: module missing, assuming its layout from {debug.path}")
        segs = segments(debug.elf, debug_only=True)
    raw: list[RawSymbol] = []
    for item, section in ((opened, ".symtab"), (debug, ".symtab"), (opened, ".dynsym")):
        if item is not None:
            raw.extend(read_symbols(item.elf, section))
    symbols = SymbolTable.build(raw)
    dwarf_file = next((o for o in (debug, opened) if o is not None and has_section(o.elf, ".debug_line")), None)
    lines = dwarf = None
    if dwarf_file is not None:
        index = _dwarf_index(dwarf_file, debug_dirs, progress)
        lines = LineTable.build(
            dwarf_file.elf,
            _address_filter(exec_ranges(dwarf_file.elf)),
            index.comp_dir if index is not None else (lambda _stmt: None),
        )
        dwarf = index if inlines else None
    progress(
        f"{path}: {len(symbols)} symbols, {len(lines) if lines else 0} line rows in {time.monotonic() - started:.2f}s"
    )
    return _Module(path, segs, symbols, lines, dwarf)


def _dwarf_index(dwarf_file: OpenedElf, debug_dirs: tuple[str, ...], progress: Progress) -> DwarfIndex | None:
    """The DIE index of a file, or None without (readable) .debug_info."""
    if not has_section(dwarf_file.elf, ".debug_info"):
        return None
    alt = find_alt_file(dwarf_file, debug_dirs, progress)
    try:
        return DwarfIndex(dwarf_file.elf, alt.elf if alt is not None else None)
    except Exception as error:  # noqa: BLE001 - lines and symbols still work without it
        progress(f"{dwarf_file.path}: unreadable .debug_info ({error}): no inlined frames")
        return None
    finally:
        if alt is not None:
            alt.close()


def _address_filter(ranges: list[tuple[int, int]]) -> Callable[[int], bool]:
    """Predicate: does an address fall in one of the sorted ``ranges`` (all pass if none)?
    Drops line sequences of code the linker discarded (relocated to 0 or a tombstone)."""
    starts = [lo for lo, _ in ranges]

    def inside(addr: int) -> bool:
        i = bisect_right(starts, addr) - 1
        return not ranges or (i >= 0 and addr < ranges[i][1])

    return inside


class Symbolizer:
    """Symbolizes file offsets in ELF modules; tables are cached per module version."""

    def __init__(
        self, debug_dirs: Iterable[str] = DEBUG_DIRS, progress: Progress | None = None, inlines: bool = True
    ) -> None:
        self._debug_dirs = tuple(debug_dirs)
        self._progress: Progress = progress or (lambda _message: None)
        self._inlines = inlines
        self._modules: dict[tuple[str, str | None, int | None], _Module | None] = {}

    def symbolize(
        self, module_path: str, offsets: Iterable[int], build_id: str | None = None, return_addresses: bool = True
    ) -> dict[int, list[Frame]]:
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
            result[offset] = frames or [Frame(unknown_name(module_path, offset), module_path, None, None, offset)]
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
                self._modules[key] = _load_module(path, build_id, self._debug_dirs, self._inlines, self._progress)
            except Exception as error:  # noqa: BLE001 - a hostile file gives unknown frames
                self._progress(f"{path}: {error}")
                self._modules[key] = None
        return self._modules[key]
