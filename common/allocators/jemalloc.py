"""jemalloc: libjemalloc, a static build, or a prefixed one linked into the executable (je_, and
Rust's tikv-jemallocator / jemalloc-sys: _rjem_)."""

from __future__ import annotations

from .family import Family

JEMALLOC = Family(
    name="jemalloc",
    libraries=("libjemalloc",),
    marker="mallocx",
    marker_needs_standard=True,
    # its own API, by C signature: mallocx(size, flags) a malloc, rallocx(ptr, size, flags) a
    # realloc, sdallocx(ptr, size, flags) and dallocx(ptr, flags) a free
    entries={"mallocx": "malloc_enter", "rallocx": "realloc_enter", "sdallocx": "free_enter", "dallocx": "free_enter"},
    # mallctl: the probe reads the name and reports only purges (probes/heap.h mallctl_purges)
    purges={"mallctl": "mallctl_enter"},
    # A Rust global allocator calling only the *allocx family lets the linker drop PREFIXmalloc
    # and PREFIXfree: mallocx with an allocation and a free of either kind is enough.
    prefix_marker="mallocx",
    prefix_allocs=("malloc", "rallocx"),
    prefix_frees=("free", "sdallocx"),
    symbol_prefixes=("je_", "_rjem_"),
    internal_patterns=(r"^(je_|_rjem_)\w*(dalloc|tcache_bin_flush)",),
    background_threads=("jemalloc_bg",),
    purge_function="mallctl",
    purge_arg="cstring",
    retention="dirty and muzzy pages of its extents, kept until their decay time (dirty_decay_ms) passes",
    conf_var="MALLOC_CONF",
    knob="{conf}=dirty_decay_ms:1000,muzzy_decay_ms:0 returns them sooner",
    advice=(
        "return them sooner with {conf}=dirty_decay_ms:1000,muzzy_decay_ms:0 "
        "(default 10000/0), or background_thread:true so purging does not wait for "
        'allocation calls; mallctl("arena.<i>.purge") after a burst returns them at once'
    ),
)
