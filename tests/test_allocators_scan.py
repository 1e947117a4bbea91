"""The allocator scan's vectorised symbol query (common.elf.query_functions, through
tracer.allocators.discovery.scan_symbols) against the full read (read_symbols over every entry of .dynsym
and .symtab, tracer.allocators.discovery.module_symbols): the same allocators, entry points, offsets and
sizes, on the real allocators of this box and on a generated library built to trip a filter
that looks only at names' ends (tail-merged strings, versioned .symtab names, look-alikes, a
prefixed jemalloc with only its *allocx family)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import build, need

from tracer.allocators.discovery import SCAN_NAMES, SCAN_SUFFIXES, module_symbols, scan_allocators, scan_symbols

LIB = "/usr/lib/x86_64-linux-gnu"
# file, is it the executable, the allocators the scan finds there (kind[:prefix])
REAL = [
    (("/lib/x86_64-linux-gnu/libc.so.6", f"{LIB}/libc.so.6"), False, ["glibc"]),
    ((f"{LIB}/libstdc++.so.6",), False, []),
    ((f"{LIB}/libjemalloc.so.2",), False, ["jemalloc"]),  # its .dynstr has "dallocx" inside "sdallocx"
    ((f"{LIB}/libtcmalloc_minimal.so.4",), False, ["tcmalloc"]),
    ((f"{LIB}/libtcmalloc.so.4",), False, ["tcmalloc"]),
    ((f"{LIB}/libmimalloc.so.2",), False, ["mimalloc"]),
    (("/usr/lib/chromium/chromium",), True, ["custom"]),  # PartitionAlloc's malloc in a 297 MB executable
    (("/usr/bin/redis-server",), True, []),  # Debian's: libjemalloc.so.2 beside it
]


def asked(path: str) -> dict[str, tuple[int, int]]:
    """The functions of the full read that the scan can ask about."""
    full = module_symbols(path)
    assert full is not None, path
    return {n: v for n, v in full.functions.items() if n in SCAN_NAMES or n.endswith(SCAN_SUFFIXES)}


@pytest.mark.parametrize(("paths", "is_exe", "kinds"), REAL, ids=[os.path.basename(p[0][0]) for p in REAL])
def test_fast_scan_is_the_full_scan_on_real_files(paths, is_exe, kinds):
    path = need(paths, os.path.basename(paths[0]))
    fast = scan_symbols(path)
    assert fast is not None
    assert fast.functions == asked(path)
    assert fast.static == module_symbols(path).static
    found = scan_allocators(path, is_exe)
    assert found == scan_allocators(path, is_exe, module_symbols(path))
    assert [a.label for a in found] == kinds
    for a in found:  # every entry point located, at a function's offset with its size
        assert sorted(a.offsets) == sorted(a.entries) and all(a.sizes[s] > 0 for s in a.entries), a


GENERATED = r"""
#include <stddef.h>
#include <stdlib.h>
#define F __attribute__((noinline, used, visibility("default")))
/* a prefixed jemalloc with only the *allocx family (a Rust global allocator's shape) */
F void *zz_mallocx(size_t n, int f) { (void)f; return malloc(n); }
F void *zz_rallocx(void *p, size_t n, int f) { (void)f; return realloc(p, n); }
F void zz_sdallocx(void *p, size_t n, int f) { (void)n; (void)f; free(p); }
F void zz_dallocx(void *p, int f) { (void)f; free(p); }
/* look-alikes that end like the names asked for, and one a letter short */
F void *xmalloc(size_t n) { return malloc(n); }
F void *my_calloc(size_t a, size_t b) { return calloc(a, b); }
F void g_free(void *p) { free(p); }
F void *mallo(size_t n) { return malloc(n); }
F void *mallocxx(size_t n) { return malloc(n); }
/* versioned in .symtab: vv_mallocx@@V1 (and vv_free@@V1, vv_malloc@V0 beside vv_malloc@@V1) */
F void *vv_mallocx_impl(size_t n, int f) { (void)f; return malloc(n); }
F void vv_free_impl(void *p) { free(p); }
F void *vv_malloc_new(size_t n) { return malloc(n); }
F void *vv_malloc_old(size_t n) { return malloc(n + 1); }
__asm__(".symver vv_mallocx_impl, vv_mallocx@@V1");
__asm__(".symver vv_free_impl, vv_free@@V1");
__asm__(".symver vv_malloc_new, vv_malloc@@V1");
__asm__(".symver vv_malloc_old, vv_malloc@V0");
/* a local (static) allocator-named function: in .symtab only */
static __attribute__((noinline, used)) void *mi_malloc(size_t n) { return malloc(n + 2); }
F void *use_local(size_t n) { return mi_malloc(n); }
#ifdef EXE
int main(void) { return use_local(1) == NULL; }
#endif
"""


@pytest.mark.parametrize("shape", ["library", "executable"])
def test_fast_scan_is_the_full_scan_on_code_built_to_trip_it(tmp_path, shape):
    """As a shared library its functions are in .dynsym (unversioned) and .symtab; as an
    executable in .symtab alone, where the versioned ones are named vv_mallocx@@V1."""
    src = tmp_path / "gen.c"
    src.write_text(GENERATED)
    script = tmp_path / "gen.map"
    script.write_text("V0 { global: vv_malloc; }; V1 { global: *; } V0;\n")
    flags = ["-O2", f"-Wl,--version-script={script}"]
    path = str(
        build(tmp_path / "libgen.so", src, flags=[*flags, "-shared", "-fPIC"])
        if shape == "library"
        else build(tmp_path / "gen", src, flags=[*flags, "-DEXE"])
    )
    if shape == "executable":
        assert b"vv_mallocx@@V1\0" in Path(path).read_bytes()
    fast, full = scan_symbols(path), module_symbols(path)
    want = asked(path)
    assert fast.functions == want
    # what the generated names must have given, read the slow way: the test has teeth
    for name in (
        "zz_mallocx",
        "zz_rallocx",
        "zz_sdallocx",
        "zz_dallocx",
        "xmalloc",
        "my_calloc",
        "g_free",
        "vv_mallocx",
        "vv_free",
        "vv_malloc",
        "mi_malloc",
    ):
        assert name in want, (name, sorted(want))
    assert "mallo" in full.names and "mallo" not in fast.names
    assert "mallocxx" in full.names and "mallocxx" not in fast.names
    found = scan_allocators(path, shape == "executable")
    assert found == scan_allocators(path, shape == "executable", full)
    assert sorted(a.label for a in found) == ["jemalloc:vv_", "jemalloc:zz_", "mimalloc"]
    zz = next(a for a in found if a.prefix == "zz_")
    assert sorted(zz.entries) == ["zz_dallocx", "zz_mallocx", "zz_rallocx", "zz_sdallocx"]


def test_raw_headers_give_pyelftools_build_ids_and_cfi_sizes(tmp_path):
    """common.elf.build_id and tracer.unwind.building.peek read the headers with struct: the same build
    IDs (the unwind cache's key) and CFI sizes as pyelftools, on every real file above, on one
    without a build ID (keyed by its identity) and one with a 20-byte sha1 ID."""
    from common.elf import OpenedElf, elf_build_id
    from common.elf import build_id as fast_build_id
    from tracer.unwind.building import cfi_bytes, file_key, peek

    src = tmp_path / "m.c"
    src.write_text("int main(void) { return 0; }\n")
    files = [need(p, os.path.basename(p[0])) for p, _e, _k in REAL]
    files += [
        str(build(tmp_path / "noid", src, flags=["-O1", "-Wl,--build-id=none"])),
        str(build(tmp_path / "sha1", src, flags=["-O1", "-Wl,--build-id=sha1"])),
    ]
    for path in files:
        with OpenedElf.open(path) as opened:
            want = (file_key(opened), cfi_bytes(opened.elf))
            bid = elf_build_id(opened.elf) or ""
        assert fast_build_id.__wrapped__(path) == bid, path
        key, rows, cfi = peek(path, use_cache=False)
        assert (key, cfi) == want and rows is None, path
    assert fast_build_id.__wrapped__(files[-2]) == "" and file_key_is_noid(files[-2])
    assert len(fast_build_id.__wrapped__(files[-1])) == 40


def file_key_is_noid(path: str) -> bool:
    from tracer.unwind.building import peek

    return peek(path, use_cache=False)[0].startswith("noid-")
