"""Every allocator in a process: which modules hold one, which of their entry points the probes
take, and which one serves `malloc`.

A native daemon often runs several: a Rust service built with tikv-jemallocator allocates its own
data through a prefixed jemalloc linked into the executable (`_rjem_malloc`, `_rjem_sdallocx`,
...) while its C and C++ libraries still call glibc's `malloc`; a C++ service preloads tcmalloc or
mimalloc, whose `malloc` overrides glibc's; a library dlopen'd later may bring its own. Detection
reads the symbol tables of every mapped module (.dynsym and .symtab). Each allocator found gets
its own probes, all sharing one per-thread call state, so a call one allocator forwards to
another (mimalloc's `malloc` override calling `mi_malloc`) is counted once, by the outermost call.

Entry points map onto the probes of probes/allocscope.c by their C signature: `mallocx(size,
flags)` is a malloc, `rallocx(ptr, size, flags)` a realloc, `sdallocx(ptr, size, flags)` and
`dallocx(ptr, flags)` a free, and so on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

from common import allocators as registry
from common.allocators import FREES, STANDARD, Family
from common.elf import STT_NOTYPE, is_static, open_elf, query_functions, read_symbols, segments, vaddr_to_offset

from ..process.mappings import DELETED, live_file
from ..process.procfs import Mapping

# Every family's facts (library and symbol patterns, entry points -> probes, purge calls) are in
# common/allocators/, one module per family (its registry: the list discovery loops over).
__all__ = ["FREES", "STANDARD"]
# What each probe program reads, to place it (tracer/allocators/placement.py).
ENTRY_PROGRAMS = sorted(set(STANDARD.values()))


@dataclass
class Allocator:
    """One allocator in one module: the entry points the probes take there."""

    path: str  # the ELF file
    kind: str  # a family's name (common/allocators: glibc, jemalloc, ...) | static | custom
    prefix: str = ""  # jemalloc's symbol prefix (je_, _rjem_), '' for the standard names
    entries: dict[str, str] = field(default_factory=dict)  # symbol -> BPF entry program
    offsets: dict[str, int] = field(default_factory=dict)  # symbol -> file offset
    sizes: dict[str, int] = field(default_factory=dict)  # symbol -> st_size
    serves_malloc: bool = False  # the one whose `malloc` the process calls
    source: str = "heap"  # its sites' source: "heap" for the one serving malloc, "heap:KIND[:PREFIX]"

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.prefix}" if self.prefix else self.kind

    @property
    def shown(self) -> str:
        """The path to say: a deleted library probed through /proc/PID/map_files (code_files) by
        the name it was mapped under ('/usr/lib/.../libjemalloc.so.2 (deleted)')."""
        if "/map_files/" in self.path:
            try:
                return os.readlink(self.path)
            except OSError:
                pass
        return self.path


@dataclass(frozen=True)
class ModuleSymbols:
    names: frozenset[str]
    functions: dict[str, tuple[int, int]]  # defined function -> (file offset, size)
    static: bool


@lru_cache(maxsize=256)
def _module_symbols(path: str, mtime_ns: int) -> ModuleSymbols | None:
    opened = open_elf(path)
    if opened is None:
        return None
    with opened:
        try:
            segs = segments(opened.elf)
            funcs: dict[str, tuple[int, int]] = {}
            for section in (".dynsym", ".symtab"):
                for sym in read_symbols(opened.elf, section):
                    if sym.kind == STT_NOTYPE or sym.name in funcs:
                        continue
                    off = vaddr_to_offset(segs, sym.addr)
                    if off is not None:
                        funcs[sym.name] = (off, sym.size)
            return ModuleSymbols(frozenset(funcs), funcs, is_static(opened.elf))
        except Exception:  # noqa: BLE001 - a malformed file defines nothing
            return None


def module_symbols(path: str) -> ModuleSymbols | None:
    """The defined functions of an ELF file (cached per path and modification time)."""
    try:
        return _module_symbols(path, os.stat(path).st_mtime_ns)
    except OSError:
        return None


# The names the allocator scan asks about, and the endings of the prefixed ones (PREFIXmallocx, ...),
# of the families registered at import (scan_symbols asks the registry as it is at each call).
SCAN_NAMES = registry.scan_names()
SCAN_SUFFIXES = registry.scan_suffixes()


@lru_cache(maxsize=256)
def _scan_symbols(path: str, mtime_ns: int, names: frozenset[str], suffixes: tuple[str, ...]) -> ModuleSymbols | None:
    q = query_functions(path, names, suffixes)
    return None if q is None else ModuleSymbols(frozenset(q.functions), q.functions, q.static)


def scan_symbols(path: str) -> ModuleSymbols | None:
    """The defined functions of an ELF file that the allocator scan can ask about (SCAN_NAMES,
    and names ending with one of SCAN_SUFFIXES): what module_symbols gives for those names,
    read vectorised (common.elf.query_functions) — milliseconds for a C++ library with hundreds
    of thousands of symbols, where module_symbols takes seconds."""
    try:
        return _scan_symbols(path, os.stat(path).st_mtime_ns, registry.scan_names(), registry.scan_suffixes())
    except OSError:
        return None


def _entries(syms: ModuleSymbols, table: dict[str, str], prefix: str = "") -> dict[str, str]:
    return {prefix + name: prog for name, prog in table.items() if prefix + name in syms.names}


def _family_entries(syms: ModuleSymbols, f: Family, prefix: str = "") -> dict[str, str]:
    """The family's own entry points and purge calls `syms` defines."""
    return {**_entries(syms, f.entries, prefix), **_entries(syms, f.purges, prefix)}


ALLOCATORS_FACT = "allocators-2"  # tracer/allocators/facts.py kind; bump when allocators_in's answer changes
PLACEMENT_FACT = "placement-2"  # likewise for tracer/allocators/placement.py's


def allocators_in(path: str, is_exe: bool) -> list[Allocator]:
    """The allocators module `path` holds (most hold none; libc holds glibc's), kept per file
    between runs (tracer/allocators/facts.py)."""
    from . import facts as filecache  # noqa: PLC0415

    extra = f"{is_exe}|{registry.fingerprint()}"  # a family added or changed: scan again
    cached = filecache.get(ALLOCATORS_FACT, path, extra)
    if isinstance(cached, list):
        try:
            return [Allocator(path=path, **a) for a in cached]
        except TypeError:
            pass  # another shape: scan again
    found = scan_allocators(path, is_exe)
    filecache.put(
        ALLOCATORS_FACT,
        path,
        [
            {"kind": a.kind, "prefix": a.prefix, "entries": a.entries, "offsets": a.offsets, "sizes": a.sizes}
            for a in found
        ],
        extra,
    )
    return found


def scan_allocators(path: str, is_exe: bool, syms: ModuleSymbols | None = None) -> list[Allocator]:
    """allocators_in without the file cache, from `syms` (default: scan_symbols(path); the
    tests compare it with module_symbols(path), every defined function)."""
    if syms is None:
        syms = scan_symbols(path)
    if syms is None:
        return []
    base = os.path.basename(path)
    found: list[Allocator] = []
    std = _entries(syms, STANDARD)
    has_std = "malloc" in std and "free" in std
    # a module of the standard API is the family whose marker it defines (the markers that need
    # no standard API beside them first: tcmalloc's tc_malloc, mimalloc's mi_malloc, then
    # jemalloc's mallocx beside malloc and free), else its library's family, else static or custom
    fam = next(
        (
            f
            for f in sorted(registry.families(), key=lambda f: f.marker_needs_standard)
            if f.marker and f.marker in syms.names and (has_std or not f.marker_needs_standard)
        ),
        None,
    )
    if fam is not None:
        found.append(Allocator(path, fam.name, entries={**std, **_family_entries(syms, fam)}))
    elif has_std:
        lib = registry.library_family(base)
        kind = lib.name if lib is not None else ("static" if syms.static and is_exe else "custom")
        found.append(Allocator(path, kind, entries={**std, **(_family_entries(syms, lib) if lib else {})}))
    # prefixed builds (jemalloc's je_, Rust's _rjem_): PREFIX + marker beside an allocation and a
    # free of the family's, plain or sized
    for f in registry.families():
        if not f.prefix_marker:
            continue
        for name in sorted(syms.names):
            if name.endswith(f.prefix_marker) and name != f.prefix_marker:
                prefix = name[: -len(f.prefix_marker)]
                allocs = any(prefix + n in syms.names for n in f.prefix_allocs)
                frees = any(prefix + n in syms.names for n in f.prefix_frees)
                if allocs and frees:
                    entries = {**_entries(syms, STANDARD, prefix), **_family_entries(syms, f, prefix)}
                    found.append(Allocator(path, f.name, prefix=prefix, entries=entries))
    for a in found:
        a.offsets = {s: syms.functions[s][0] for s in a.entries}
        a.sizes = {s: syms.functions[s][1] for s in a.entries}
    return found


def file_id(path: str) -> tuple[int, int] | None:
    """(device, inode) of `path`: one file under two names (/lib and /usr/lib on a merged-/usr
    system) is one set of probes, not two."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def code_files(maps: list[Mapping], pid: int = 0) -> list[str]:
    """The files mapped executable, in address-space order, once each (by file, not by name). A
    file deleted or replaced on disk since it was mapped (a library upgraded under a running
    daemon) is /proc/PID/map_files/START-END of `pid`: its symbols are read and its probes
    attached there (the kernel resolves the link to the mapped inode)."""
    files: list[str] = []
    ids: set[tuple[int, int]] = set()
    for m in maps:
        path = live_file(pid, m) if m.path.endswith(DELETED) else m.path
        if m.path.endswith(DELETED) and "/map_files/" not in path:
            continue  # gone, and no pid to reach the mapped inode: the name may hold another file now
        if m.is_file and "x" in m.perms and path not in files:
            fid = file_id(path)
            if fid is not None and fid not in ids:
                ids.add(fid)
                files.append(path)
    return files


def find_allocators(exe_path: str, maps: list[Mapping], pid: int = 0) -> list[Allocator]:
    """Every allocator of the process, the one serving `malloc` first: the executable's when it
    defines malloc, else a known allocator library (preloaded tcmalloc or mimalloc, libjemalloc),
    else libc. The others keep their own source name, heap:KIND[:PREFIX]. `pid`: the process
    whose maps these are (a deleted library's allocator is found through it, code_files)."""
    files = code_files(maps, pid)
    exe_real = os.path.realpath(exe_path) if exe_path else ""
    found: list[Allocator] = []
    for path in files:
        found += allocators_in(path, os.path.realpath(path) == exe_real)
    if not found:
        return []
    order = {f.name: i for i, f in enumerate(registry.families())}

    def rank(a: Allocator) -> tuple:
        is_exe = os.path.realpath(a.path) == exe_real
        return (a.prefix != "" or "malloc" not in a.entries, not is_exe, order.get(a.kind, len(order)))

    found.sort(key=rank)
    if found[0].prefix == "" and "malloc" in found[0].entries:
        found[0].serves_malloc = True
    seen: set[str] = set()
    for a in found:
        if a.serves_malloc:
            a.source = "heap"
        else:
            src = f"heap:{a.label}"
            while src in seen:
                src += "'"
            a.source = src
        seen.add(a.source)
    return found


# Argument registers each entry program reads (besides %rsp): what probe placement must keep.
def _reads() -> dict[str, tuple[int, ...]]:
    from .placement import REG_DI, REG_DX, REG_SI  # noqa: PLC0415 (capstone)

    di, si, dx = REG_DI, REG_SI, REG_DX
    return {
        "malloc_enter": (di,),
        "calloc_enter": (di, si),
        "realloc_enter": (di, si),
        "reallocarray_enter": (di, si, dx),
        "posix_memalign_enter": (di, dx),
        "aligned_alloc_enter": (si,),
        "memalign_enter": (si,),
        "valloc_enter": (di,),
        "pvalloc_enter": (di,),
        "malloc_trim_enter": (di,),
        "mallctl_enter": (di,),
        "free_enter": (di,),
    }


@dataclass
class Probe:
    """One function to probe: where its entry (and return) probe sits."""

    symbol: str
    program: str  # BPF entry program
    path: str
    offset: int  # file offset of the probe (the function's, or behind a straight-line prefix)
    moved: bool
    reason: str
    returns: bool  # a return probe too (every allocating call; frees are entry-only)


@dataclass
class Plan:
    """What the probes of one allocator would be, proved on the code (tracer/allocators/placement.py)."""

    allocator: Allocator
    probes: list[Probe] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # symbol -> symbol at the same address
    skipped: dict[str, str] = field(default_factory=dict)  # symbol -> why

    def as_dict(self, attached: list[str] | None = None) -> dict:
        """meta.json `probes.allocators[]`: {kind, module, attached, skipped, placement, ...}."""
        a = self.allocator
        return {
            "kind": a.kind,
            "module": a.shown,
            "prefix": a.prefix,
            "source": a.source,
            "serves_malloc": a.serves_malloc,
            "attached": attached if attached is not None else [p.symbol for p in self.probes],
            "aliases": self.aliases,
            "skipped": self.skipped,
            "placement": {p.symbol: p.reason for p in self.probes if p.moved},
        }


def plan_allocator(a: Allocator) -> Plan:
    """The probes of allocator `a`: one per address (symbols sharing one, like glibc's memalign
    and aligned_alloc or tcmalloc's malloc and tc_malloc, are counted once), placed on an
    emulated instruction where the code proves it equivalent."""
    from . import facts as filecache  # noqa: PLC0415

    known = filecache.get(PLACEMENT_FACT, a.path)
    known = dict(known) if isinstance(known, dict) else {}
    learned = False

    def place(prog: str, off: int, size: int) -> tuple[int, bool, str]:
        nonlocal learned
        k = f"{prog}:{off}:{size}"
        if k in known and isinstance(known[k], list) and len(known[k]) == 3:
            return tuple(known[k])
        from .placement import place_entry, place_probe  # noqa: PLC0415 (capstone)

        # frees are entry-only: behind a NULL check they skip free(NULL) calls too
        pl = place_entry(a.path, off, size) if prog in FREES else None
        if pl is None or not pl.moved:
            pl = place_probe(a.path, off, size, _reads()[prog])
        known[k] = [pl.offset, pl.moved, pl.reason]
        learned = True
        return pl.offset, pl.moved, pl.reason

    plan = Plan(a)
    table = STANDARD if not a.prefix else {a.prefix + k: v for k, v in STANDARD.items()}
    for sym in table:
        if sym not in a.entries:
            plan.skipped[sym] = f"not defined by {os.path.basename(a.shown)}"
    by_offset: dict[int, str] = {}
    for sym, prog in a.entries.items():
        off = a.offsets[sym]
        if off in by_offset:
            plan.aliases[sym] = by_offset[off]  # one address, one probe: never counted twice
            continue
        by_offset[off] = sym
        offset, moved, reason = place(prog, off, a.sizes.get(sym, 0))
        plan.probes.append(Probe(sym, prog, a.path, offset, moved, reason, prog not in FREES))
    if learned:
        filecache.put(PLACEMENT_FACT, a.path, known)
    return plan
