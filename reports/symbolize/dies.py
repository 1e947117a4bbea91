"""A small dedicated reader of .debug_info (DWARF 2-5): unit headers, abbreviations, DIEs and
the attribute values inlines.py needs (addresses, references, strings, ranges), and .debug_aranges.

pyelftools parses every DIE into objects, which costs seconds per megabyte; this reader skips
uninteresting subtrees through DW_AT_sibling and decodes only the attributes it needs. References
into a dwz supplementary file (.gnu_debugaltlink) are followed when that file is given; split
DWARF (.dwo) is not.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from elftools.elf.elffile import ELFFile

from common.elf import section_bytes

from .dwarf import ByteOrder, Malformed, initial_length, sleb, string_at, uleb

C = TypeVar("C")  # what walk() hands a DIE's children: their context

AT_SIBLING, AT_NAME, AT_STMT_LIST, AT_LOW_PC, AT_HIGH_PC = 0x01, 0x03, 0x10, 0x11, 0x12
AT_COMP_DIR, AT_ABSTRACT_ORIGIN, AT_SPECIFICATION, AT_RANGES = 0x1B, 0x31, 0x47, 0x55
AT_CALL_FILE, AT_CALL_LINE, AT_LINKAGE_NAME, AT_MIPS_LINKAGE_NAME = 0x58, 0x59, 0x6E, 0x2007
AT_STR_OFFSETS_BASE, AT_ADDR_BASE, AT_RNGLISTS_BASE, AT_GNU_ADDR_BASE = 0x72, 0x73, 0x74, 0x2133
AT_LANGUAGE = 0x13
C_LANGUAGES = frozenset({0x01, 0x02, 0x0C, 0x1D, 0x2C, 0x8001})  # C89, C, C99, C11, C17, MIPS asm
_WANTED_ATTRS = frozenset(
    {
        AT_LANGUAGE,
        AT_SIBLING,
        AT_NAME,
        AT_STMT_LIST,
        AT_LOW_PC,
        AT_HIGH_PC,
        AT_COMP_DIR,
        AT_ABSTRACT_ORIGIN,
        AT_SPECIFICATION,
        AT_RANGES,
        AT_CALL_FILE,
        AT_CALL_LINE,
        AT_LINKAGE_NAME,
        AT_MIPS_LINKAGE_NAME,
        AT_STR_OFFSETS_BASE,
        AT_ADDR_BASE,
        AT_RNGLISTS_BASE,
        AT_GNU_ADDR_BASE,
    }
)

TAG_SUBPROGRAM, TAG_INLINED = 0x2E, 0x1D
TAG_BLOCKS = frozenset({0x0B, 0x32, 0x25})  # lexical_block, try_block, catch_block
TAG_CONTAINERS = frozenset({0x39, 0x1E, 0x02, 0x13, 0x17})  # namespace, module, class, struct, union

# DW_FORM_* codes
_FORM_ADDR, _FORM_STRING, _FORM_STRP, _FORM_UDATA, _FORM_SDATA = 0x01, 0x08, 0x0E, 0x0F, 0x0D
_FORM_REF_ADDR, _FORM_REF_UDATA, _FORM_INDIRECT, _FORM_STRX = 0x10, 0x15, 0x16, 0x1A
_FORM_ADDRX, _FORM_LINE_STRP, _FORM_IMPLICIT_CONST, _FORM_RNGLISTX = 0x1B, 0x1F, 0x21, 0x23
_FORM_GNU_ADDR_INDEX, _FORM_GNU_STR_INDEX = 0x1F01, 0x1F02
_ALT_REF_FORMS = frozenset({0x1F20, 0x1C, 0x24})  # GNU_ref_alt, ref_sup4, ref_sup8
_ALT_STR_FORMS = frozenset({0x1F21, 0x1D})  # GNU_strp_alt, strp_sup
_ADDRX_FORMS = frozenset({0x1B, 0x29, 0x2A, 0x2B, 0x2C, 0x1F01})
_STRX_FORMS = frozenset({0x1A, 0x25, 0x26, 0x27, 0x28, 0x1F02})
_REF_CU_FORMS = frozenset({0x11, 0x12, 0x13, 0x14, 0x15})  # ref1/2/4/8/udata: unit-relative
_ULEB_FORMS = frozenset({0x0F, 0x15, 0x1A, 0x1B, 0x22, 0x23, 0x1F01, 0x1F02})
_BLOCK_FORMS = {0x0A: 1, 0x03: 2, 0x04: 4}  # block1/2/4: size of the length field
_ADDRESS_SIZED, _OFFSET_SIZED = -10, -20
_FIXED_FORMS = {  # form -> size in bytes (or address/offset sized); absent: variable size
    0x01: _ADDRESS_SIZED,
    0x05: 2,
    0x06: 4,
    0x07: 8,
    0x0B: 1,
    0x0C: 1,
    0x0E: _OFFSET_SIZED,
    0x10: _OFFSET_SIZED,
    0x11: 1,
    0x12: 2,
    0x13: 4,
    0x14: 8,
    0x17: _OFFSET_SIZED,
    0x19: 0,
    0x1C: 4,
    0x1D: _OFFSET_SIZED,
    0x1E: 16,
    0x1F: _OFFSET_SIZED,
    0x20: 8,
    0x24: 8,
    0x25: 1,
    0x26: 2,
    0x27: 3,
    0x28: 4,
    0x29: 1,
    0x2A: 2,
    0x2B: 3,
    0x2C: 4,
    0x1F20: _OFFSET_SIZED,
    0x1F21: _OFFSET_SIZED,  # GNU_ref_alt, GNU_strp_alt (dwz)
}


def _form_size(form: int, unit: Unit) -> int:
    """Byte size of a fixed-size form in ``unit``; -1 for variable-size forms."""
    size = _FIXED_FORMS.get(form, -1)
    if size == _ADDRESS_SIZED or (form == _FORM_REF_ADDR and unit.version == 2):
        return unit.address_size
    if size == _OFFSET_SIZED:
        return unit.offset_size
    return size


class Abbrev(NamedTuple):
    tag: int
    has_children: bool
    # per attribute: (attribute or -1 when not wanted, form, fixed size or -1, implicit const)
    plan: tuple[tuple[int, int, int, int], ...]


@dataclass
class Unit:
    """A compilation unit header plus the attributes of its top DIE."""

    offset: int
    end: int
    version: int
    offset_size: int
    address_size: int
    abbrev_offset: int
    first_die: int
    top: dict[int, tuple[int, int]] = field(default_factory=dict)
    abbrevs: dict[int, Abbrev] | None = None


class DieReader:
    """Random and sequential access to the DIEs of one DWARF file."""

    def __init__(self, elf: ELFFile, alt: DieReader | None = None) -> None:
        self.alt = alt  # the dwz supplementary file (.gnu_debugaltlink), if found
        self.info = section_bytes(elf, ".debug_info") or b""
        self._abbrev = section_bytes(elf, ".debug_abbrev") or b""
        self._str = section_bytes(elf, ".debug_str") or b""
        self._line_str = section_bytes(elf, ".debug_line_str") or b""
        self._str_offsets = section_bytes(elf, ".debug_str_offsets") or b""
        self._addr = section_bytes(elf, ".debug_addr") or b""
        self._ranges = section_bytes(elf, ".debug_ranges") or b""
        self._rnglists = section_bytes(elf, ".debug_rnglists") or b""
        self._aranges = section_bytes(elf, ".debug_aranges") or b""
        self._order: ByteOrder = "little" if elf.little_endian else "big"
        self.units = self._read_unit_headers()
        self._unit_starts = [u.offset for u in self.units]
        self._abbrev_cache: dict[tuple[int, int, int], dict[int, Abbrev]] = {}

    # -- units
    def _read_unit_headers(self) -> list[Unit]:
        buf, order, units, pos = self.info, self._order, [], 0
        while pos + 11 <= len(buf):
            length, start, offset_size = initial_length(buf, pos, order)
            end = start + length
            version = int.from_bytes(buf[start : start + 2], order)
            p = start + 2
            if version >= 5:
                unit_type, address_size = buf[p], buf[p + 1]
                abbrev_offset = int.from_bytes(buf[p + 2 : p + 2 + offset_size], order)
                p += 2 + offset_size
                if unit_type in (4, 5):  # skeleton, split_compile: dwo_id
                    p += 8
                elif unit_type in (2, 6):  # type units: signature + type offset
                    p += 8 + offset_size
            else:
                abbrev_offset = int.from_bytes(buf[p : p + offset_size], order)
                address_size = buf[p + offset_size]
                p += offset_size + 1
            if not 2 <= version <= 5 or end > len(buf) or length == 0:
                break
            units.append(Unit(pos, end, version, offset_size, address_size, abbrev_offset, p))
            pos = end
        return units

    def unit_at(self, die_offset: int) -> Unit | None:
        """The unit that contains a .debug_info offset, with its top DIE read."""
        i = bisect_right(self._unit_starts, die_offset) - 1
        if i < 0 or die_offset >= self.units[i].end:
            return None
        unit = self.units[i]
        if unit.abbrevs is None:
            key = (unit.abbrev_offset, unit.address_size, unit.offset_size)
            if key not in self._abbrev_cache:
                self._abbrev_cache[key] = self._read_abbrevs(unit)
            unit.abbrevs = self._abbrev_cache[key]
            _code, unit.top, _pos = self.read_die(unit, unit.first_die)
        return unit

    def _read_abbrevs(self, unit: Unit) -> dict[int, Abbrev]:
        buf, pos, table = self._abbrev, unit.abbrev_offset, {}
        while pos < len(buf):
            code, pos = uleb(buf, pos)
            if not code:
                break
            tag, pos = uleb(buf, pos)
            has_children = bool(buf[pos])
            pos += 1
            plan = []
            while True:
                attr, pos = uleb(buf, pos)
                form, pos = uleb(buf, pos)
                if not attr and not form:
                    break
                implicit = 0
                if form == _FORM_IMPLICIT_CONST:
                    implicit, pos = sleb(buf, pos)
                size = _form_size(form, unit)
                plan.append((attr if attr in _WANTED_ATTRS else -1, form, size, implicit))
            table[code] = Abbrev(tag, has_children, tuple(plan))
        return table

    # -- DIEs
    def read_die(self, unit: Unit, pos: int) -> tuple[Abbrev | None, dict[int, tuple[int, int]], int]:
        """Decode the DIE at ``pos``: its abbreviation (None for a null entry), its wanted
        attributes as {attribute: (form, raw value)}, and the offset after it."""
        buf = self.info
        code = buf[pos]
        pos += 1
        if code >= 0x80:
            code, pos = uleb(buf, pos - 1)
        if not code:
            return None, {}, pos
        abbrev = unit.abbrevs[code]  # type: ignore[index]
        values: dict[int, tuple[int, int]] = {}
        order = self._order
        for attr, form, size, implicit in abbrev.plan:
            if size >= 0:
                if attr >= 0:
                    values[attr] = (form, int.from_bytes(buf[pos : pos + size], order))
                pos += size
                continue
            if form == _FORM_IMPLICIT_CONST:
                raw = implicit
            elif form == _FORM_INDIRECT:
                form, pos = uleb(buf, pos)
                raw, pos = self._read_indirect(unit, form, pos)
            elif form in _ULEB_FORMS:
                raw, pos = uleb(buf, pos)
            elif form == _FORM_SDATA:
                raw, pos = sleb(buf, pos)
            elif form == _FORM_STRING:
                raw = pos
                pos = buf.index(b"\0", pos) + 1
            elif form in (0x09, 0x18):  # block, exprloc
                length, pos = uleb(buf, pos)
                raw, pos = 0, pos + length
            elif form in _BLOCK_FORMS:
                width = _BLOCK_FORMS[form]
                raw, pos = 0, pos + width + int.from_bytes(buf[pos : pos + width], order)
            else:
                raise Malformed(f"DW_FORM 0x{form:x}")
            if attr >= 0:
                values[attr] = (form, raw)
        return abbrev, values, pos

    def _read_indirect(self, unit: Unit, form: int, pos: int) -> tuple[int, int]:
        """A DW_FORM_indirect value: decode with a one-attribute plan."""
        size = _form_size(form, unit)
        if size >= 0:
            return int.from_bytes(self.info[pos : pos + size], self._order), pos + size
        if form in _ULEB_FORMS:
            return uleb(self.info, pos)
        if form == _FORM_SDATA:
            return sleb(self.info, pos)
        if form == _FORM_STRING:
            return pos, self.info.index(b"\0", pos) + 1
        if form in (0x09, 0x18):
            length, pos = uleb(self.info, pos)
            return 0, pos + length
        raise Malformed(f"indirect DW_FORM 0x{form:x}")

    # -- attribute values
    def address(self, unit: Unit, value: tuple[int, int]) -> int | None:
        form, raw = value
        if form in _ADDRX_FORMS:
            header = 8 if unit.version >= 5 else 0  # a .debug_addr header precedes the first base
            base = self._top_int(unit, AT_ADDR_BASE, AT_GNU_ADDR_BASE, default=header)
            pos = base + raw * unit.address_size
            if pos + unit.address_size > len(self._addr):
                return None
            return int.from_bytes(self._addr[pos : pos + unit.address_size], self._order)
        return raw

    def reference(self, unit: Unit, value: tuple[int, int]) -> int | None:
        """Absolute .debug_info offset of a reference into this file (else None)."""
        form, raw = value
        if form in _REF_CU_FORMS:
            return unit.offset + raw
        if form == _FORM_REF_ADDR:
            return raw
        return None

    def target(self, unit: Unit, value: tuple[int, int]) -> tuple[DieReader, int] | None:
        """Reader and offset of the DIE a reference points to, following dwz's
        DW_FORM_GNU_ref_alt / DW_FORM_ref_sup into the supplementary file."""
        if value[0] in _ALT_REF_FORMS:
            return (self.alt, value[1]) if self.alt is not None else None
        offset = self.reference(unit, value)
        return (self, offset) if offset is not None else None

    def string(self, unit: Unit, value: tuple[int, int]) -> str | None:
        form, raw = value
        if form == _FORM_STRING:
            return string_at(self.info, raw)
        if form == _FORM_STRP:
            return string_at(self._str, raw)
        if form == _FORM_LINE_STRP:
            return string_at(self._line_str, raw)
        if form in _STRX_FORMS:
            base = self._top_int(unit, AT_STR_OFFSETS_BASE, default=8 if unit.offset_size == 4 else 16)
            pos = base + raw * unit.offset_size
            off = int.from_bytes(self._str_offsets[pos : pos + unit.offset_size], self._order)
            return string_at(self._str, off)
        if form in _ALT_STR_FORMS and self.alt is not None:
            return string_at(self.alt._str, raw)
        return None

    def _top_int(self, unit: Unit, *attrs: int, default: int = 0) -> int:
        for attr in attrs:
            if attr in unit.top:
                return unit.top[attr][1]
        return default

    def ranges(self, unit: Unit, values: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
        """Address ranges from low_pc/high_pc or DW_AT_ranges (.debug_ranges or .debug_rnglists)."""
        if AT_LOW_PC in values and AT_HIGH_PC in values:
            lo = self.address(unit, values[AT_LOW_PC])
            form, raw = values[AT_HIGH_PC]
            hi = (
                self.address(unit, values[AT_HIGH_PC])
                if form == _FORM_ADDR or form in _ADDRX_FORMS
                else (lo or 0) + raw
            )
            return [(lo, hi)] if lo is not None and hi is not None and hi > lo else []
        if AT_RANGES not in values:
            return []
        top_low = unit.top.get(AT_LOW_PC)
        base = (self.address(unit, top_low) if top_low else 0) or 0
        form, raw = values[AT_RANGES]
        if unit.version >= 5:
            if form == _FORM_RNGLISTX:
                table = self._top_int(unit, AT_RNGLISTS_BASE, default=12 if unit.offset_size == 4 else 20)
                pos = table + raw * unit.offset_size
                raw = table + int.from_bytes(self._rnglists[pos : pos + unit.offset_size], self._order)
            return _rnglist(
                self._rnglists,
                raw,
                base,
                unit.address_size,
                self._order,
                lambda index: self.address(unit, (_FORM_ADDRX, index)) or 0,
            )
        return _debug_ranges(self._ranges, raw, base, unit.address_size, self._order)

    # -- address -> unit
    def arange_units(self) -> list[tuple[int, int, int]]:
        """(low, high, unit offset) from .debug_aranges."""
        return _aranges(self._aranges, self._order)

    # -- walking a unit
    def walk(
        self, unit: Unit, visit: Callable[[int, Abbrev, dict[int, tuple[int, int]], C], tuple[C, bool]], root: C
    ) -> None:
        """Read the DIEs below the top DIE of `unit`, in order. `visit(die offset, abbrev,
        values, context)` gets the context its parent returned for its children (`root` for the
        top DIE's) and returns its own children's context and whether they are wanted: unwanted
        children are skipped through DW_AT_sibling where the DIE has one (else read, and
        visited, all the same)."""
        abbrev, _values, pos = self.read_die(unit, unit.first_die)
        stack: list[C] = [root] if abbrev and abbrev.has_children else []
        while stack and pos < unit.end:
            die_offset = pos
            abbrev, values, pos = self.read_die(unit, pos)
            if abbrev is None:
                stack.pop()
                continue
            child, wanted = visit(die_offset, abbrev, values, stack[-1])
            if not abbrev.has_children:
                continue
            if not wanted and AT_SIBLING in values:
                target = self.reference(unit, values[AT_SIBLING])
                if target is not None and pos <= target <= unit.end:
                    pos = target
                    continue
            stack.append(child)


def _debug_ranges(buf: bytes, pos: int, base: int, size: int, order: ByteOrder) -> list[tuple[int, int]]:
    """A .debug_ranges list (DWARF 2-4) at `pos`: (low, high) pairs; `size`: the address size."""
    out = []
    top = (1 << (8 * size)) - 1
    while pos + 2 * size <= len(buf):
        begin = int.from_bytes(buf[pos : pos + size], order)
        end = int.from_bytes(buf[pos + size : pos + 2 * size], order)
        pos += 2 * size
        if begin == 0 and end == 0:
            break
        if begin == top:
            base = end
        elif end > begin:
            out.append((base + begin, base + end))
    return out


def _rnglist(
    buf: bytes, pos: int, base: int, size: int, order: ByteOrder, addrx: Callable[[int], int]
) -> list[tuple[int, int]]:
    """A .debug_rnglists list (DWARF 5) at `pos`; `addrx`: the address at an index of .debug_addr."""
    out: list[tuple[int, int]] = []
    while pos < len(buf):
        kind = buf[pos]
        pos += 1
        if kind == 0:  # DW_RLE_end_of_list
            break
        if kind == 1:  # base_addressx
            index, pos = uleb(buf, pos)
            base = addrx(index)
        elif kind in (2, 3):  # startx_endx, startx_length
            a, pos = uleb(buf, pos)
            b, pos = uleb(buf, pos)
            lo = addrx(a)
            out.append((lo, addrx(b) if kind == 2 else lo + b))
        elif kind == 4:  # offset_pair
            a, pos = uleb(buf, pos)
            b, pos = uleb(buf, pos)
            out.append((base + a, base + b))
        elif kind == 5:  # base_address
            base = int.from_bytes(buf[pos : pos + size], order)
            pos += size
        elif kind == 6:  # start_end
            lo = int.from_bytes(buf[pos : pos + size], order)
            out.append((lo, int.from_bytes(buf[pos + size : pos + 2 * size], order)))
            pos += 2 * size
        elif kind == 7:  # start_length
            lo = int.from_bytes(buf[pos : pos + size], order)
            length, pos = uleb(buf, pos + size)
            out.append((lo, lo + length))
        else:
            break
    return [(lo, hi) for lo, hi in out if hi > lo]


def _aranges(buf: bytes, order: ByteOrder) -> list[tuple[int, int, int]]:
    """(low, high, unit offset) of every range of a .debug_aranges section."""
    out, pos = [], 0
    while pos + 12 <= len(buf):
        length, start, offset_size = initial_length(buf, pos, order)
        end = start + length
        p = start + 2  # version
        unit_offset = int.from_bytes(buf[p : p + offset_size], order)
        size = buf[p + offset_size]
        p += offset_size + 2
        tuple_size = 2 * size
        p = pos + ((p - pos + tuple_size - 1) // tuple_size) * tuple_size  # align the tuples
        while p + tuple_size <= end:
            lo = int.from_bytes(buf[p : p + size], order)
            length_ = int.from_bytes(buf[p + size : p + tuple_size], order)
            p += tuple_size
            if lo == 0 and length_ == 0:
                break
            if length_:
                out.append((lo, lo + length_, unit_offset))
        pos = end
    return out
