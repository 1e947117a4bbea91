"""The allocator families, one module each (glibc.py, jemalloc.py, tcmalloc.py, mimalloc.py),
and the one list every other module loops over: discovery (tracer/allocators/discovery.py), the
probes' placement and purges, retention (tracer/allocators/retention.py), --inject's hooks, the
advice and findings' knobs, allocator memory, stacks and waits (reports/analysis/).

The list's order is the rank of a family when several serve the standard API in one process
(tracer/allocators/discovery.py find_allocators: a known allocator library before libc's).
Adding a family is a module here, a line in FAMILIES, and a test target (docs/architecture.md,
"Where a new allocator family goes"). A module not in any family (a static or custom allocator
in the executable) gets kind `static` or `custom` and no family.
"""

from __future__ import annotations

import hashlib
import re

from .family import FREES, PURGE_PROGRAMS, STANDARD, Family
from .glibc import GLIBC
from .jemalloc import JEMALLOC
from .mimalloc import MIMALLOC
from .tcmalloc import TCMALLOC

__all__ = [
    "FAMILIES",
    "FREES",
    "PURGE_PROGRAMS",
    "STANDARD",
    "Family",
    "background_family",
    "families",
    "family",
    "fingerprint",
    "internal_rx",
    "library_family",
    "library_rx",
    "register",
    "scan_names",
    "scan_suffixes",
    "symbol_prefix_rx",
    "unregister",
]

FAMILIES: list[Family] = [JEMALLOC, TCMALLOC, MIMALLOC, GLIBC]


def families() -> tuple[Family, ...]:
    """Every registered family, in rank order."""
    return tuple(FAMILIES)


def family(name: str | None) -> Family | None:
    """The family of kind `name` ('jemalloc'; 'jemalloc:_rjem_' too), None for static, custom or
    unknown ones."""
    kind = (name or "").split(":", 1)[0]
    return next((f for f in FAMILIES if f.name == kind), None)


def register(f: Family, before: str | None = None) -> Family:
    """Add family `f` (before family `before`, else last but glibc, the allocator of last resort);
    it replaces a family of its name. Returns it."""
    unregister(f.name)
    at = next((i for i, g in enumerate(FAMILIES) if g.name == (before or GLIBC.name)), len(FAMILIES))
    FAMILIES.insert(at, f)
    return f


def unregister(name: str) -> None:
    FAMILIES[:] = [f for f in FAMILIES if f.name != name]


def library_family(basename: str) -> Family | None:
    """The family whose shared library `basename` is (libjemalloc.so.2 -> jemalloc)."""
    return next((f for f in FAMILIES if f.libraries and basename.startswith(f.libraries)), None)


def background_family(thread_name: str) -> Family | None:
    """The family whose own background thread `thread_name` is (jemalloc_bg_thd -> jemalloc)."""
    return next((f for f in FAMILIES if f.background_threads and thread_name.startswith(f.background_threads)), None)


def scan_names() -> frozenset[str]:
    """The symbols the allocator scan asks every module about (the standard API and every
    family's own, purges and markers)."""
    return frozenset({*STANDARD, *(n for f in FAMILIES for n in f.scan_names())})


def scan_suffixes() -> tuple[str, ...]:
    """The endings of the prefixed symbols the scan asks about (PREFIXmallocx, ...)."""
    return tuple(sorted({s for f in FAMILIES for s in f.prefix_suffixes()}))


def symbol_prefix_rx() -> str:
    """'je_|_rjem_|tc_|mi_': the prefixes of the families' entry points on stacks, a regex group."""
    return "|".join(re.escape(p) for f in FAMILIES for p in f.symbol_prefixes)


def library_rx() -> str:
    """'libjemalloc|libtcmalloc\\w*|...': the families' shared libraries (but libc's, which has a
    line of its own wherever libraries are matched), a regex group matched at a file name's start."""
    return "|".join(re.escape(lib) + r"\w*" for f in FAMILIES if f.name != GLIBC.name for lib in f.libraries)


def internal_rx() -> str:
    """The families' internal freeing frames (jemalloc's tcache flush, tcmalloc::, mi_free...),
    one regex of alternatives; a regex that matches nothing when none has any."""
    return "|".join(p for f in FAMILIES for p in f.internal_patterns) or r"(?!)"


def fingerprint() -> str:
    """A short hash of the facts discovery reads: a scan kept per file (tracer/allocators/facts.py)
    is read again when a family is added or changed."""
    text = repr(
        [
            (f.name, f.libraries, f.marker, f.marker_needs_standard, sorted(f.entries.items()))
            + (sorted(f.purges.items()), f.prefix_marker, f.prefix_allocs, f.prefix_frees)
            for f in FAMILIES
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]
