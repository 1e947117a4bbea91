"""Finding a prefixed jemalloc from its symbols alone (tracer/allocators/discovery.py; no BPF): a Rust
global allocator that calls only the *allocx family lets the linker drop `_rjem_malloc` and
`_rjem_free` — such an executable still has a `_rjem_` jemalloc, probed through mallocx,
rallocx and sdallocx."""

from __future__ import annotations

from support import build

from tracer.allocators.discovery import allocators_in

ALLOCX_ONLY = r"""
#include <stddef.h>
#include <stdlib.h>
__attribute__((noinline, used)) void *_rjem_mallocx(size_t n, int flags) { (void)flags; return malloc(n); }
__attribute__((noinline, used)) void *_rjem_rallocx(void *p, size_t n, int flags) { (void)flags; return realloc(p, n); }
__attribute__((noinline, used)) void _rjem_sdallocx(void *p, size_t n, int flags) { (void)n; (void)flags; free(p); }
int main(void) { void *p = _rjem_mallocx(64, 0); p = _rjem_rallocx(p, 128, 0); _rjem_sdallocx(p, 128, 0); return 0; }
"""


def test_prefixed_jemalloc_with_only_the_allocx_family(tmp_path):
    src = tmp_path / "allocx.c"
    src.write_text(ALLOCX_ONLY)
    exe = build(tmp_path / "allocx", src, flags=["-O2", "-g"])
    found = [a for a in allocators_in(str(exe), True) if a.kind == "jemalloc"]
    assert [a.prefix for a in found] == ["_rjem_"]
    assert sorted(found[0].entries) == ["_rjem_mallocx", "_rjem_rallocx", "_rjem_sdallocx"]
    assert found[0].entries["_rjem_mallocx"] == "malloc_enter"


def test_a_lone_mallocx_is_no_allocator(tmp_path):
    src = tmp_path / "lone.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdlib.h>\n"
        "__attribute__((noinline, used)) void *xy_mallocx(size_t n, int f) { (void)f; return malloc(n); }\n"
        "int main(void) { free(xy_mallocx(8, 0)); return 0; }\n"
    )
    exe = build(tmp_path / "lone", src, flags=["-O2", "-g"])
    assert not [a for a in allocators_in(str(exe), True) if a.kind == "jemalloc" and a.prefix]
