"""glibc's malloc (ptmalloc): libc's, the allocator of last resort; its arenas are read from
outside (tracer/allocators/arenas.py, census.py) and its advice comes by arena
(reports/analysis/advice.py residency_advice)."""

from __future__ import annotations

from .family import Family

GLIBC = Family(
    name="glibc",
    libraries=("libc.so", "libc-"),
    purge_function="malloc_trim",
    purge_arg="int",  # malloc_trim(pad)
    retention="free chunks of its heaps and arenas, returned by malloc_trim or at the heap's top (M_TRIM_THRESHOLD)",
    knob="MALLOC_ARENA_MAX=2..4 caps the arenas, malloc_trim(0) after bursts returns free pages",
    advice_by_arena=True,
)
