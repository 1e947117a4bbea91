"""The users' own allocation and free functions (--alloc-fn, --free-fn), for the pools and slab
caches a tool cannot know: the grammar, and where the functions are.

    --alloc-fn 'SYMBOL[@MODULE]:size=argN'             returns the pointer, like malloc
    --alloc-fn 'SYMBOL[@MODULE]:size=argN,out=argM'    stores the pointer at *argM and returns a
                                                       status (0: success), like posix_memalign
    --alloc-fn 'SYMBOL[@MODULE]:count=argN,size=argM'  calloc-like: count x size bytes
    --free-fn  'SYMBOL[@MODULE]:ptr=argN'

`arg0` is the first argument (x86-64: up to arg5). MODULE is a path or a soname (libpool.so.1)
or a file name; without it the executable, then any mapped module that defines SYMBOL. Their
sites carry the source `custom:SYMBOL`, a layer above the heap and the kernel: a pool's objects
live in slabs its allocator or mmap already counted, so they are kept out of the totals.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from common.elf import query_functions
from common.errors import TargetError, UsageError

from ..process.procfs import Mapping
from .discovery import code_files

MAX_ARG = 5
_ARG = re.compile(r"arg([0-9]+)")


@dataclass(frozen=True)
class CustomFn:
    spec: str
    symbol: str
    module: str  # as given ('' : the executable, then any module)
    free: bool
    size_arg: int | None = None
    count_arg: int | None = None
    out_arg: int | None = None
    ptr_arg: int | None = None

    @property
    def source(self) -> str:
        return f"custom:{self.symbol}"

    def reads(self) -> tuple[int, ...]:
        """The argument numbers the probe reads."""
        return tuple(a for a in (self.size_arg, self.count_arg, self.out_arg, self.ptr_arg) if a is not None)


def parse(spec: str, free: bool) -> CustomFn:
    """One --alloc-fn (free=False) or --free-fn spec; UsageError (one line) when malformed."""
    flag = "--free-fn" if free else "--alloc-fn"
    grammar = (
        "SYMBOL[@MODULE]:ptr=argN"
        if free
        else "SYMBOL[@MODULE]:size=argN[,out=argM] or SYMBOL[@MODULE]:count=argN,size=argM"
    )
    head, sep, args = spec.partition(":")
    symbol, _, module = head.partition("@")
    symbol, module = symbol.strip(), module.strip()
    if not sep or not symbol or (("@" in head) and not module) or any(c.isspace() for c in symbol):
        raise UsageError(f"{flag} {spec!r}: expected {grammar}")
    allowed = ("ptr",) if free else ("size", "count", "out")
    given: dict[str, int] = {}
    for part in args.split(","):
        key, eq, val = part.partition("=")
        key, val = key.strip(), val.strip()
        m = _ARG.fullmatch(val)
        if not eq or key not in allowed or not m:
            raise UsageError(
                f"{flag} {spec!r}: {part.strip() or '(empty)'!r} is not one of "
                f"{', '.join(k + '=argN' for k in allowed)}; expected {grammar}"
            )
        if key in given:
            raise UsageError(f"{flag} {spec!r}: {key} given twice")
        n = int(m.group(1))
        if n > MAX_ARG:
            raise UsageError(f"{flag} {spec!r}: arg{n} is not a register argument (arg0..arg{MAX_ARG})")
        given[key] = n
    if free:
        if "ptr" not in given:
            raise UsageError(f"{flag} {spec!r}: no ptr=argN; expected {grammar}")
        return CustomFn(spec, symbol, module, True, ptr_arg=given["ptr"])
    if "size" not in given:
        raise UsageError(f"{flag} {spec!r}: no size=argN; expected {grammar}")
    if len(set(given.values())) != len(given):
        raise UsageError(f"{flag} {spec!r}: one argument cannot be two things")
    return CustomFn(
        spec, symbol, module, False, size_arg=given["size"], count_arg=given.get("count"), out_arg=given.get("out")
    )


def parse_all(alloc_specs, free_specs) -> list[CustomFn]:
    fns = [parse(s, False) for s in alloc_specs or ()] + [parse(s, True) for s in free_specs or ()]
    seen: set[tuple[str, str]] = set()
    for f in fns:
        if (f.symbol, f.module) in seen:
            raise UsageError(f"{f.symbol} is given more than once (--alloc-fn/--free-fn)")
        seen.add((f.symbol, f.module))
    return fns


def _matches(path: str, module: str) -> bool:
    if "/" in module:
        return os.path.realpath(path) == os.path.realpath(module)
    base = os.path.basename(path)
    return base == module or base.startswith(module + ".")  # libpool.so matches libpool.so.1


@dataclass(frozen=True)
class Located:
    fn: CustomFn
    path: str
    offset: int  # file offset of the function
    size: int


def locate(fn: CustomFn, exe: str, maps: list[Mapping]) -> Located:
    """Where the function is: TargetError (one line) for a module the process does not map or a
    symbol no candidate module defines."""
    files = code_files(maps)
    exe_real = os.path.realpath(exe) if exe else ""
    if fn.module:
        candidates = [p for p in files if _matches(p, fn.module)]
        if not candidates:
            raise TargetError(f"{fn.spec!r}: the process maps no module {fn.module!r}")
    else:
        candidates = [p for p in files if os.path.realpath(p) == exe_real] + [
            p for p in files if os.path.realpath(p) != exe_real
        ]
    for path in candidates:  # the one name asked, read vectorised (a C++ library has 100k+ symbols)
        q = query_functions(path, [fn.symbol])
        if q is not None and fn.symbol in q.functions:
            off, size = q.functions[fn.symbol]
            return Located(fn, path, off, size)
    where = fn.module or "the executable or any module it maps"
    raise TargetError(f"{fn.spec!r}: no function {fn.symbol!r} in {where}")
