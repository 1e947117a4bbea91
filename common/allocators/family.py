"""What one allocator family is, as facts: the shape every module of common/allocators/ fills in
(glibc.py, jemalloc.py, tcmalloc.py, mimalloc.py) and the registry (common/allocators/__init__.py)
lists. Facts only: no I/O, no third-party import, so the tracer (discovery, placement, retention,
purges, --inject) and the reports (advice, findings, allocator memory, stacks, waits) read the same
ones; behaviour that differs by family stays in the module that runs it, keyed by these facts."""

from __future__ import annotations

from dataclasses import dataclass, field

# The standard C allocation API (glibc, jemalloc, tcmalloc and mimalloc overrides, static and
# custom allocators): symbol -> BPF entry program of probes/allocscope.c. All share the return
# program `alloc_return` except the frees (entry only).
STANDARD: dict[str, str] = {
    "malloc": "malloc_enter",
    "calloc": "calloc_enter",
    "realloc": "realloc_enter",
    "reallocarray": "reallocarray_enter",
    "posix_memalign": "posix_memalign_enter",
    "aligned_alloc": "aligned_alloc_enter",
    "memalign": "memalign_enter",
    "valloc": "valloc_enter",
    "pvalloc": "pvalloc_enter",
    "malloc_trim": "malloc_trim_enter",
    "free": "free_enter",
}
FREES = frozenset({"free_enter"})  # entry-only programs
# The BPF programs that measure a purge call one by one (the anon RSS dropped across it): probed
# entry and return even under --inject (tracer/allocators/purges.py).
PURGE_PROGRAMS = ("malloc_trim_enter", "mallctl_enter")


@dataclass(frozen=True)
class Family:
    """One allocator family's facts. A module holding the standard API (malloc and free) is of
    this family when it defines `marker` (and, with `marker_needs_standard`, malloc and free too),
    or else when its file name starts with one of `libraries`."""

    name: str  # the kind: allocators' `kind` in meta.json, the `allocators` table, reports
    libraries: tuple[str, ...] = ()  # file-name prefixes of its shared library (libjemalloc, libc.so)
    marker: str = ""  # a symbol only this family defines (tc_malloc, mi_malloc, mallocx); '' none
    marker_needs_standard: bool = False  # the marker counts only beside malloc and free
    entries: dict[str, str] = field(default_factory=dict)  # its own API: symbol -> BPF entry program
    purges: dict[str, str] = field(default_factory=dict)  # its purge/trim calls: symbol -> program
    # Prefixed builds (jemalloc's je_, Rust's _rjem_): PREFIX + prefix_marker beside one of
    # PREFIX + prefix_allocs and one of PREFIX + prefix_frees is this family, prefix PREFIX.
    prefix_marker: str = ""
    prefix_allocs: tuple[str, ...] = ()
    prefix_frees: tuple[str, ...] = ()
    symbol_prefixes: tuple[str, ...] = ()  # of its entry points on stacks (je_, _rjem_, tc_, mi_)
    internal_patterns: tuple[str, ...] = ()  # regexes of its internal freeing frames (waits)
    background_threads: tuple[str, ...] = ()  # name prefixes of its own threads (jemalloc_bg_thd)
    purge_function: str = "malloc_trim"  # how its purge calls are named in the `purges` table
    purge_arg: str = "int"  # what a purge call's first argument is: int | cstring | force_bit | none
    retention: str = ""  # what its retained memory is (free and resident in its own mappings)
    owns_brk: bool = False  # where it serves malloc, the `[heap]` (the break) is its (sbrk)
    segment_area: tuple[int, int] | None = None  # where it alone maps its memory, [lo, hi)
    conf_var: str = ""  # its configuration variable, prefixed like its symbols (MALLOC_CONF)
    knob: str = ""  # the short knob of a finding ({conf}: conf_env(prefix))
    advice: str = ""  # the advice of the report ({conf} likewise)
    advice_by_arena: bool = False  # its advice comes from the arena table (glibc), not `advice`

    def conf_env(self, prefix: str = "") -> str:
        """Its configuration variable as a build with symbol prefix `prefix` reads it: jemalloc
        reads PREFIX_MALLOC_CONF, the prefix upper-cased (_rjem_ -> _RJEM_MALLOC_CONF)."""
        return (prefix.upper() if prefix else "") + self.conf_var

    def knob_text(self, prefix: str = "") -> str:
        return self.knob.format(conf=self.conf_env(prefix))

    def advice_text(self, prefix: str = "") -> str:
        return self.advice.format(conf=self.conf_env(prefix))

    def scan_names(self) -> set[str]:
        """The symbols the allocator scan asks about for this family, unprefixed."""
        return {*self.entries, *self.purges, *([self.marker] if self.marker else [])}

    def prefix_suffixes(self) -> set[str]:
        """The endings of its prefixed symbols (PREFIXmallocx, ...): '' for none."""
        if not self.prefix_marker:
            return set()
        return {*STANDARD, *self.entries, *self.purges, self.prefix_marker, *self.prefix_allocs, *self.prefix_frees}
