"""mimalloc: its own API (mi_*) beside its malloc/free overrides."""

from __future__ import annotations

from .family import Family

# mimalloc 2.x (os.c `_mi_os_get_aligned_hint`): segments of up to 1 GiB are mapped at hint
# addresses from 2 TiB, wrapping after 30 TiB (above 32 TiB: its huge OS pages), aligned to the
# segment size (32 MiB).
MI_HINT_BASE, MI_HINT_MAX = 2 << 40, 30 << 40

MIMALLOC = Family(
    name="mimalloc",
    libraries=("libmimalloc",),
    marker="mi_malloc",
    entries={
        "mi_malloc": "malloc_enter",
        "mi_zalloc": "malloc_enter",
        "mi_calloc": "calloc_enter",
        "mi_mallocn": "calloc_enter",
        "mi_realloc": "realloc_enter",
        "mi_reallocn": "reallocarray_enter",
        "mi_reallocarray": "reallocarray_enter",
        "mi_malloc_aligned": "malloc_enter",
        "mi_zalloc_aligned": "malloc_enter",
        "mi_realloc_aligned": "realloc_enter",
        "mi_posix_memalign": "posix_memalign_enter",
        "mi_aligned_alloc": "aligned_alloc_enter",
        "mi_memalign": "memalign_enter",
        "mi_valloc": "valloc_enter",
        "mi_pvalloc": "pvalloc_enter",
        "mi_new": "malloc_enter",
        "mi_free": "free_enter",
        "mi_free_size": "free_enter",
        "mi_free_aligned": "free_enter",
        "mi_free_size_aligned": "free_enter",
    },
    purges={"mi_collect": "malloc_trim_enter"},
    symbol_prefixes=("mi_",),
    internal_patterns=(r"^mi_free",),
    purge_function="mi_collect",
    purge_arg="force_bit",  # mi_collect(bool force)
    retention="free pages of its segments, purged after its purge delay (2.0: reset with MADV_FREE)",
    segment_area=(MI_HINT_BASE, MI_HINT_MAX),
    knob="MIMALLOC_PURGE_DELAY=0 purges at once",
    advice=(
        "MIMALLOC_PURGE_DELAY=0 (mimalloc 2.1+; 2.0: MIMALLOC_RESET_DELAY and "
        "MIMALLOC_SEGMENT_DECOMMIT_DELAY) purges at once, mi_collect(true) after a burst; "
        "mimalloc 2.0 resets with MADV_FREE, whose pages stay in RSS until memory is short "
        "(MIMALLOC_RESET_DECOMMITS=1 decommits instead)"
    ),
)
