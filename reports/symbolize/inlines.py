"""Inlined frames from .debug_info (DWARF 2-5): for an address, the chain of
DW_TAG_inlined_subroutine scopes inside its DW_TAG_subprogram, with call sites and names.

Units are read (dies.py) one at a time, only those that looked-up addresses fall into
(.debug_aranges finds them), and in them only subprograms, inlined subroutines, their address
ranges, call sites and names.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import NamedTuple

from elftools.elf.elffile import ELFFile

from .demangle import demangle
from .dies import (
    AT_ABSTRACT_ORIGIN,
    AT_CALL_FILE,
    AT_CALL_LINE,
    AT_COMP_DIR,
    AT_LANGUAGE,
    AT_LINKAGE_NAME,
    AT_MIPS_LINKAGE_NAME,
    AT_NAME,
    AT_SPECIFICATION,
    AT_STMT_LIST,
    C_LANGUAGES,
    TAG_BLOCKS,
    TAG_CONTAINERS,
    TAG_INLINED,
    TAG_SUBPROGRAM,
    Abbrev,
    DieReader,
    Unit,
)


@dataclass(eq=False)
class Scope:
    """A concrete subprogram or inlined subroutine with its address ranges."""

    ranges: list[tuple[int, int]]
    die: int  # .debug_info offset of the DIE
    call_file: int = 0
    call_line: int = 0
    children: list[Scope] = field(default_factory=list)

    def inner(self, addr: int) -> Scope | None:
        """The child scope covering ``addr``, if any."""
        for child in self.children:
            for lo, hi in child.ranges:
                if lo <= addr < hi:
                    return child
        return None


class _UnitScopes(NamedTuple):
    starts: list[int]
    entries: list[tuple[int, int, Scope]]
    stmt_list: int | None


class DwarfIndex:
    """Inline chains and comp dirs from .debug_info, one compilation unit at a time.

    Units are located through ``.debug_aranges`` plus the top-DIE ranges of units it
    does not mention, and are walked only when an address falls into them.
    """

    def __init__(self, elf: ELFFile, alt: ELFFile | None = None) -> None:
        self._reader = DieReader(elf, DieReader(alt) if alt is not None else None)
        self._unit_ranges: tuple[list[int], list[tuple[int, int, int]]] | None = None
        self._scopes: dict[int, _UnitScopes] = {}
        self._comp_dirs: dict[int, str | None] | None = None
        self._names: dict[int, str | None] = {}
        self._qualifiers: dict[tuple[int, int], dict[int, str]] = {}

    def comp_dir(self, stmt_offset: int) -> str | None:
        """DW_AT_comp_dir of the unit whose DW_AT_stmt_list is ``stmt_offset``."""
        if self._comp_dirs is None:
            self._comp_dirs = {}
            for header in self._reader.units:
                try:
                    unit = self._reader.unit_at(header.offset)
                except Exception:  # noqa: BLE001 - skip an undecodable unit
                    continue
                if unit is not None and AT_STMT_LIST in unit.top:
                    comp_dir = unit.top.get(AT_COMP_DIR)
                    self._comp_dirs[unit.top[AT_STMT_LIST][1]] = (
                        self._reader.string(unit, comp_dir) if comp_dir else None
                    )
        return self._comp_dirs.get(stmt_offset)

    def _unit_for(self, addr: int) -> int | None:
        if self._unit_ranges is None:
            self._unit_ranges = self._read_unit_ranges()
        starts, ranges = self._unit_ranges
        i = bisect_right(starts, addr) - 1
        for j in range(i, max(i - 16, -1), -1):
            lo, hi, unit_offset = ranges[j]
            if lo <= addr < hi:
                return unit_offset
        return None

    def _read_unit_ranges(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        ranges = self._reader.arange_units()
        described = {r[2] for r in ranges}
        for header in self._reader.units:
            if header.offset in described:
                continue
            unit = self._reader.unit_at(header.offset)
            if unit is not None:
                ranges.extend((lo, hi, unit.offset) for lo, hi in self._reader.ranges(unit, unit.top))
        ranges.sort()
        return [r[0] for r in ranges], ranges

    def chain(self, addr: int) -> tuple[list[Scope], int | None]:
        """Scopes covering ``addr``, outermost (the subprogram) first, and the unit's
        DW_AT_stmt_list; ([], None) when no subprogram DIE covers it."""
        unit_offset = self._unit_for(addr)
        if unit_offset is None:
            return [], None
        if unit_offset not in self._scopes:
            self._scopes[unit_offset] = self._read_scopes(unit_offset)
        starts, entries, stmt_list = self._scopes[unit_offset]
        i = bisect_right(starts, addr) - 1
        outer = None
        for j in range(i, max(i - 16, -1), -1):
            lo, hi, scope = entries[j]
            if lo <= addr < hi:
                outer = scope
                break
        if outer is None:
            return [], stmt_list
        chain = [outer]
        while True:
            inner = chain[-1].inner(addr)
            if inner is None:
                return chain, stmt_list
            chain.append(inner)

    def _read_scopes(self, unit_offset: int) -> _UnitScopes:
        """Walk one unit: concrete subprograms (in namespaces/classes too) and the
        inlined subroutines nested in them; everything else is skipped."""
        reader = self._reader
        unit = reader.unit_at(unit_offset)
        if unit is None:
            return _UnitScopes([], [], None)
        stmt = unit.top.get(AT_STMT_LIST)
        entries: list[tuple[int, int, Scope]] = []

        def visit(
            die_offset: int, abbrev: Abbrev, values: dict, context: tuple[Scope | None, bool]
        ) -> tuple[tuple[Scope | None, bool], bool]:
            scope, walking = context  # walking: inside a subprogram, a block or a namespace/class
            child = self._visit(unit, abbrev.tag, values, die_offset, scope, entries) if walking else (None, False)
            return child, child[1]

        root: tuple[Scope | None, bool] = (None, True)
        reader.walk(unit, visit, root)
        entries.sort(key=lambda e: (e[0], e[1]))
        return _UnitScopes([e[0] for e in entries], entries, stmt[1] if stmt else None)

    def _visit(
        self,
        unit: Unit,
        tag: int,
        values: dict[int, tuple[int, int]],
        die_offset: int,
        scope: Scope | None,
        entries: list[tuple[int, int, Scope]],
    ) -> tuple[Scope | None, bool]:
        """Record one DIE; return the context its children are read in."""
        if tag == TAG_SUBPROGRAM and scope is None:
            ranges = self._reader.ranges(unit, values)
            if not ranges:
                return None, False  # a declaration or an abstract instance
            new = Scope(ranges, die_offset)
            entries.extend((lo, hi, new) for lo, hi in ranges)
            return new, True
        if tag == TAG_INLINED and scope is not None:
            ranges = self._reader.ranges(unit, values)
            if not ranges:
                return scope, True
            call_file = values.get(AT_CALL_FILE, (0, 0))[1]
            call_line = values.get(AT_CALL_LINE, (0, 0))[1]
            new = Scope(ranges, die_offset, call_file, call_line)
            scope.children.append(new)
            return new, True
        if tag in TAG_BLOCKS and scope is not None:
            return scope, True
        if tag in TAG_CONTAINERS and scope is None:
            return None, True
        return None, False

    # -- names
    def name(self, scope: Scope) -> str | None:
        """Demangled (or namespace-qualified) name of a scope's function."""
        if scope.die not in self._names:
            try:
                self._names[scope.die] = self._function_name(self._reader, scope.die, 0)
            except Exception:  # noqa: BLE001 - odd references: no name
                self._names[scope.die] = None
        return self._names[scope.die]

    def _function_name(self, reader: DieReader, die_offset: int, depth: int) -> str | None:
        """Linkage name (demangled) of a function DIE, following abstract_origin and
        specification; else DW_AT_name qualified by enclosing namespaces and classes."""
        unit = reader.unit_at(die_offset)
        if unit is None:
            return None
        _abbrev, values, _pos = reader.read_die(unit, die_offset)
        for attr in (AT_LINKAGE_NAME, AT_MIPS_LINKAGE_NAME):
            if attr in values:
                linkage = reader.string(unit, values[attr])
                if linkage:
                    return demangle(linkage)
        if depth < 8:
            for attr in (AT_ABSTRACT_ORIGIN, AT_SPECIFICATION):
                target = reader.target(unit, values[attr]) if attr in values else None
                if target is not None:
                    name = self._function_name(target[0], target[1], depth + 1)
                    if name:
                        return name
        name = reader.string(unit, values[AT_NAME]) if AT_NAME in values else None
        if not name:
            return None
        if unit.top.get(AT_LANGUAGE, (0, 0))[1] in C_LANGUAGES:
            return name  # nothing to qualify with
        prefix = self._qualifier_map(reader, unit).get(die_offset)
        return f"{prefix}::{name}" if prefix else name

    def _qualifier_map(self, reader: DieReader, unit: Unit) -> dict[int, str]:
        """For every DIE of a unit directly inside namespaces/classes: 'ns::Class'."""
        key = (id(reader), unit.offset)
        if key in self._qualifiers:
            return self._qualifiers[key]
        out: dict[int, str] = {}

        def visit(die_offset: int, abbrev: Abbrev, values: dict, prefix: str | None) -> tuple[str | None, bool]:
            if prefix:
                out[die_offset] = prefix
            if not (abbrev.has_children and prefix is not None and abbrev.tag in TAG_CONTAINERS):
                return None, True
            part = (reader.string(unit, values[AT_NAME]) if AT_NAME in values else None) or "(anonymous namespace)"
            return (f"{prefix}::{part}" if prefix else part), True

        top: str | None = ""
        reader.walk(unit, visit, top)
        self._qualifiers[key] = out
        return out
