"""gperftools' tcmalloc (full and minimal): tc_* beside its malloc/free overrides."""

from __future__ import annotations

from .family import Family

TCMALLOC = Family(
    name="tcmalloc",
    libraries=("libtcmalloc",),
    marker="tc_malloc",
    entries={
        "tc_malloc": "malloc_enter",
        "tc_malloc_skip_new_handler": "malloc_enter",
        "tc_calloc": "calloc_enter",
        "tc_realloc": "realloc_enter",
        "tc_free": "free_enter",
        "tc_free_sized": "free_enter",
        "tc_memalign": "memalign_enter",
        "tc_posix_memalign": "posix_memalign_enter",
        "tc_valloc": "valloc_enter",
        "tc_pvalloc": "pvalloc_enter",
        "tc_new": "malloc_enter",
        "tc_newarray": "malloc_enter",
        "tc_new_nothrow": "malloc_enter",
        "tc_newarray_nothrow": "malloc_enter",
        "tc_delete": "free_enter",
        "tc_deletearray": "free_enter",
        "tc_delete_sized": "free_enter",
        "tc_deletearray_sized": "free_enter",
    },
    # ReleaseFreeMemory() and ReleaseToSystem(n) share one program
    purges={
        "MallocExtension_ReleaseFreeMemory": "malloc_trim_enter",
        "MallocExtension_ReleaseToSystem": "malloc_trim_enter",
    },
    symbol_prefixes=("tc_",),
    internal_patterns=(r"^tcmalloc::",),
    purge_function="MallocExtension_Release*",
    purge_arg="none",
    retention="free spans of its page heap, released at its release rate",
    owns_brk=True,  # it grows the break with sbrk where it serves malloc
    knob="TCMALLOC_RELEASE_RATE=10 (default 1) returns free spans sooner",
    advice=(
        "TCMALLOC_RELEASE_RATE=10 (default 1; 0 never releases) returns free spans "
        "sooner; MallocExtension::instance()->ReleaseFreeMemory() after a burst returns them at once"
    ),
)
