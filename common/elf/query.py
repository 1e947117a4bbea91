"""The two questions asked of every module of a process, answered by the struct reader
(raw.py, the symbol tables vectorised with numpy) and by pyelftools where it gives up:
`build_id` and `query_functions`."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from .container import SHF_EXECINSTR, Segment, elf_build_id, is_static, open_elf, segments, vaddr_to_offset
from .raw import EM_ARM, SHT_NOBITS, RawElf
from .symbols import SHN_LORESERVE, STT_FUNC, STT_GNU_IFUNC, STT_NOTYPE, RawSymbol, read_symbols, symbol_rank

if TYPE_CHECKING:
    import numpy as np


@lru_cache(maxsize=512)
def build_id(path: str) -> str:
    """Hex GNU build ID of the ELF file at `path`, '' when it has none or is not readable."""
    raw = RawElf.open(path)
    if raw is not None:
        with raw:
            try:
                return raw.build_id() or ""
            except (ValueError, OSError):
                pass
    opened = open_elf(path)
    if opened is None:
        return ""
    with opened:
        return elf_build_id(opened.elf) or ""


def _candidates(strtab: np.ndarray, starts: np.ndarray, suffixes: Iterable[bytes]) -> np.ndarray:
    """Which names starting at `starts` in the string table could end with one of `suffixes`
    once cut as read_symbols cuts them (at their NUL — an unterminated last string loses its last
    byte, as `strtab[off:strtab.find(0, off)]` does — or at a '@' after their first byte): a
    superset (on the last 8 bytes), found per string end, not per symbol. Tail-merged names
    (one pointing inside another's string) share that string's end."""
    import numpy as np  # noqa: PLC0415 - common/ stays light to import

    nul = np.flatnonzero(strtab == 0)
    if not len(strtab) or strtab[-1] != 0:
        nul = np.concatenate([nul, [max(len(strtab) - 1, 0)]])
    at = np.flatnonzero(strtab == ord("@"))
    ends = np.concatenate([nul, at])
    sufs = [x[-8:] for x in suffixes if x]
    last = np.zeros(256, bool)
    last[list({x[-1] for x in sufs})] = True
    ends = ends[(ends > 0) & last[strtab[np.maximum(ends - 1, 0)]]]
    idx = ends[:, None] + np.arange(-8, 0)  # the 8 bytes before each end, zeros before the table
    key = np.where(idx >= 0, strtab[np.maximum(idx, 0)], 0).astype(np.uint8).view(">u8").ravel()
    hit = np.zeros(len(ends), bool)
    for n in sorted({len(x) for x in sufs}):
        values = np.array(sorted({int.from_bytes(x, "big") for x in sufs if len(x) == n}), dtype=np.uint64)
        hit |= np.isin(key & np.uint64((1 << (8 * n)) - 1), values)
    ends = np.unique(ends[hit])
    if not len(ends):
        return np.zeros(len(starts), bool)
    # each end's string begins after the NUL before it: names starting in [lo, end) may end there
    lo = np.concatenate([[0], nul + 1])[np.searchsorted(nul, ends)]
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(ends[order])
    i = np.searchsorted(lo, starts, side="right") - 1
    return (i >= 0) & (starts < hi[np.maximum(i, 0)])


def _query_symbols(
    raw: RawElf, section_name: str, wanted: frozenset[str], suffixes: tuple[str, ...]
) -> list[RawSymbol] | None:
    """read_symbols' entries of one table whose (stripped) name is in `wanted` or ends with one
    of `suffixes`, in table order; names decoded only for the few that could match. None: a
    table this reader does not take on."""
    import numpy as np  # noqa: PLC0415

    section = raw.section(section_name)
    if section is None or section.type == SHT_NOBITS:
        return []
    if section.link >= len(raw.sections):
        return None
    link = raw.sections[section.link]
    if link.type == SHT_NOBITS:
        return None
    e = "<" if raw.little else ">"
    if raw.is64:
        dt = np.dtype(
            [
                ("name", e + "u4"),
                ("info", "u1"),
                ("other", "u1"),
                ("shndx", e + "u2"),
                ("value", e + "u8"),
                ("size", e + "u8"),
            ]
        )
    else:
        dt = np.dtype(
            [
                ("name", e + "u4"),
                ("value", e + "u4"),
                ("size", e + "u4"),
                ("info", "u1"),
                ("other", "u1"),
                ("shndx", e + "u2"),
            ]
        )
    data = raw.data(section)
    syms = np.frombuffer(data, dtype=dt, count=len(data) // dt.itemsize)
    strbytes = raw.data(link)
    strtab = np.frombuffer(strbytes, dtype=np.uint8)
    kind = syms["info"] & 0xF
    shndx = syms["shndx"].astype(np.int64)
    nsec = len(raw.sections)
    execs = np.array([bool(s.flags & SHF_EXECINSTR) for s in raw.sections] + [False])
    ok = (
        ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC))
        & (shndx != 0)
        & (shndx < min(nsec, SHN_LORESERVE))
        & (syms["name"] != 0)
        & (syms["name"] < len(strtab))
    )
    ok &= execs[np.where(ok, shndx, nsec)] | (syms["size"] != 0)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return []
    starts = syms["name"][idx].astype(np.int64)
    keep = _candidates(strtab, starts, [w.encode() for w in (*wanted, *suffixes)])
    thumb = raw.machine == EM_ARM
    out: list[RawSymbol] = []
    for i in idx[keep]:
        s = syms[i]
        name_off = int(s["name"])
        name = strbytes[name_off : strbytes.find(b"\0", name_off)].decode("utf-8", "replace")
        if not name or name.startswith(("$", ".L")):
            continue
        if "@" in name[1:]:
            name = name[: name.index("@", 1)]
        if name not in wanted and not name.endswith(suffixes):
            continue
        value, size, info = int(s["value"]), int(s["size"]), int(s["info"])
        if thumb:
            value &= ~1
        sec = raw.sections[int(s["shndx"])]
        rank = symbol_rank(info >> 4, size, name)
        out.append(RawSymbol(value, size, name, rank, sec.addr + sec.size, info & 0xF))
    return out


class FunctionQuery(NamedTuple):
    functions: dict[str, tuple[int, int]]  # name -> (file offset, size), .dynsym before .symtab
    static: bool


def query_functions(path: str, wanted: Iterable[str], suffixes: Iterable[str] = ()) -> FunctionQuery | None:
    """The defined functions (FUNC, GNU_IFUNC) of the ELF file at `path` named in `wanted` or
    ending with one of `suffixes`: name -> (file offset, size), the first of .dynsym then .symtab
    whose address is in a segment's file bytes (what read_symbols + vaddr_to_offset give, for
    these names only), and whether the file is statically linked. Vectorised over the symbol
    tables: a C++ library's hundreds of thousands of symbols cost milliseconds, not seconds.
    None when the file is not ELF or is unreadable."""
    want, ends = frozenset(wanted), tuple(suffixes)
    raw = RawElf.open(path)
    if raw is not None:
        with raw:
            try:
                found = [_query_symbols(raw, name, want, ends) for name in (".dynsym", ".symtab")]
            except (ValueError, IndexError, OSError):
                found = [None]
            fast = [t for t in found if t is not None]
            if len(fast) == 2:
                return FunctionQuery(_first_defined(raw.loads, fast), raw.static)
    opened = open_elf(path)  # what the raw reader does not take on: pyelftools
    if opened is None:
        return None
    with opened:
        try:
            tables = [
                [s for s in read_symbols(opened.elf, name) if s.name in want or s.name.endswith(ends)]
                for name in (".dynsym", ".symtab")
            ]
            return FunctionQuery(_first_defined(segments(opened.elf), tables), is_static(opened.elf))
        except Exception:  # noqa: BLE001 - a malformed file defines nothing
            return None


def _first_defined(segs: list[Segment], tables: list[list[RawSymbol]]) -> dict[str, tuple[int, int]]:
    funcs: dict[str, tuple[int, int]] = {}
    for table in tables:
        for sym in table:
            if sym.kind == STT_NOTYPE or sym.name in funcs:
                continue
            off = vaddr_to_offset(segs, sym.addr)
            if off is not None:
                funcs[sym.name] = (off, sym.size)
    return funcs
