"""The allocator families' registry (common/allocators/) is what discovery, retention, purges,
advice and the findings' knobs read: a family registered here, one module's worth of facts, is
found in a synthetic symbol table (plain and prefixed), owns the memory of its segment area in
this process, names its purge calls and gets its advice and knob, with no other module edited
(docs/architecture.md, "Where a new allocator family goes")."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from common import allocators as registry
from common.allocators import PURGE_PROGRAMS, Family
from reports.analysis.advice import allocator_advice
from reports.analysis.findings import report_findings
from tracer.allocators import discovery
from tracer.allocators.discovery import ModuleSymbols, scan_allocators
from tracer.allocators.placement import ENTRY_READS
from tracer.allocators.retention import AllocatorMeter, Owner, purge_function
from tracer.process import procfs

PAGE = os.sysconf("SC_PAGE_SIZE")
AREA = 0x2800_0000_0000 + PAGE  # 40 TiB: nothing of this process maps there; no 64 MiB boundary inside
AREA_PAGES = 16

FAKE = Family(
    name="snfake",
    libraries=("libsnfake",),
    marker="sn_malloc",
    entries={"sn_malloc": "malloc_enter", "sn_calloc": "calloc_enter", "sn_free": "free_enter"},
    purges={"sn_collect": "malloc_trim_enter"},
    prefix_marker="sn_alloc_x",
    prefix_allocs=("sn_alloc_x",),
    prefix_frees=("sn_free_x",),
    symbol_prefixes=("sn_",),
    internal_patterns=(r"^snfake::",),
    background_threads=("snfake_bg",),
    purge_function="sn_collect",
    purge_arg="force_bit",
    segment_area=(AREA, AREA + AREA_PAGES * PAGE),
    conf_var="SNFAKE_CONF",
    knob="{conf}=decay:0 returns them sooner",
    advice="set {conf}=decay:0, or call sn_collect(true) after a burst",
)


@pytest.fixture
def fake() -> Iterator[Family]:
    registry.register(FAKE)
    try:
        yield FAKE
    finally:
        registry.unregister(FAKE.name)
    assert registry.family(FAKE.name) is None


def symbols(names: list[str]) -> ModuleSymbols:
    funcs = {n: (0x1000 + 0x40 * i, 0x20) for i, n in enumerate(names)}
    return ModuleSymbols(frozenset(funcs), funcs, False)


def test_builtin_facts_are_what_discovery_reads():
    names = [f.name for f in registry.families()]
    assert names == ["jemalloc", "tcmalloc", "mimalloc", "glibc"]  # the rank when several serve malloc
    assert registry.scan_names() == discovery.SCAN_NAMES and registry.scan_suffixes() == discovery.SCAN_SUFFIXES
    for f in registry.families():
        assert set(f.entries) | set(f.purges) <= discovery.SCAN_NAMES
        # every program a family names is one the probes have and placement knows how to read
        assert {p.removesuffix("_enter") for p in f.entries.values()} <= set(ENTRY_READS), f.name
        assert set(f.purges.values()) <= set(PURGE_PROGRAMS), f.name
    assert registry.library_family("libjemalloc.so.2") is registry.family("jemalloc")
    assert registry.library_family("libc.so.6") is registry.family("glibc")
    assert registry.library_family("libstdc++.so.6") is None
    assert registry.background_family("jemalloc_bg_thd") is registry.family("jemalloc")
    assert registry.symbol_prefix_rx() == "je_|_rjem_|tc_|mi_"


def test_a_registered_family_is_discovered(fake):
    assert {"sn_malloc", "sn_calloc", "sn_free", "sn_collect"} <= registry.scan_names()
    assert {"sn_alloc_x", "sn_free_x"} <= set(registry.scan_suffixes())
    syms = symbols(["malloc", "free", "calloc", "sn_malloc", "sn_calloc", "sn_free", "sn_collect", "sn_other"])
    (a,) = scan_allocators("/opt/libsomething.so", False, syms)
    assert (a.kind, a.prefix) == ("snfake", "")
    assert a.entries == {
        "malloc": "malloc_enter",
        "free": "free_enter",
        "calloc": "calloc_enter",
        "sn_malloc": "malloc_enter",
        "sn_calloc": "calloc_enter",
        "sn_free": "free_enter",
        "sn_collect": "malloc_trim_enter",
    }
    assert a.offsets["sn_collect"] == syms.functions["sn_collect"][0]
    # by its library's name alone (no marker): the standard API there is the family's
    (b,) = scan_allocators("/opt/libsnfake.so.1", False, symbols(["malloc", "free"]))
    assert b.kind == "snfake" and b.entries == {"malloc": "malloc_enter", "free": "free_enter"}
    # a prefixed build linked into the executable, beside nothing else
    (c,) = scan_allocators("/opt/app", True, symbols(["_rsn_sn_alloc_x", "_rsn_sn_free_x", "_rsn_sn_collect"]))
    assert (c.kind, c.prefix, c.label) == ("snfake", "_rsn_", "snfake:_rsn_")
    assert c.entries == {"_rsn_sn_collect": "malloc_trim_enter"}
    # an allocation without a free of the family's is not one
    assert scan_allocators("/opt/app", True, symbols(["_rsn_sn_alloc_x"])) == []


def test_its_patterns_and_cache_key(fake):
    """Its library, entry-point prefix and freeing frames join the patterns stacks.py and
    waits.py compile, and a scan kept per file (tracer/allocators/facts.py) is keyed anew."""
    assert registry.symbol_prefix_rx() == "je_|_rjem_|tc_|mi_|sn_"
    assert registry.library_rx().endswith("|libsnfake\\w*")
    assert registry.internal_rx() == r"^(je_|_rjem_)\w*(dalloc|tcache_bin_flush)|^tcmalloc::|^mi_free|^snfake::"
    with_fake = registry.fingerprint()
    registry.unregister(fake.name)
    without = registry.fingerprint()
    assert with_fake != without
    registry.register(fake)
    assert registry.fingerprint() == with_fake


def test_unregistered_it_is_not(fake):
    registry.unregister(fake.name)
    syms = symbols(["malloc", "free", "sn_malloc", "sn_free"])
    (a,) = scan_allocators("/opt/libsomething.so", False, syms)
    assert a.kind == "custom" and a.entries == {"malloc": "malloc_enter", "free": "free_enter"}
    assert "sn_malloc" not in registry.scan_names()


def test_its_purges_and_background_threads(fake):
    assert purge_function("snfake", 0, 1) == ("sn_collect", "force")
    assert purge_function("snfake:_rsn_", 0, 0) == ("sn_collect", "")
    assert purge_function("custom", 0, 7) == ("malloc_trim", "7")
    assert registry.background_family("snfake_bg:3") is fake


def test_its_segment_area_is_its_memory(fake):
    """This process maps AREA_PAGES pages in the fake family's segment area and touches 3: the
    meter gives them to it (mapped and resident, exact), and to nobody once it is unregistered."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    size = AREA_PAGES * PAGE
    map_fixed_noreplace = 0x100000
    addr = libc.mmap(AREA, size, 3, 0x22 | map_fixed_noreplace, -1, 0)  # rw, private anonymous
    assert addr == AREA, os.strerror(ctypes.get_errno())
    try:
        for i in (0, 5, 15):
            ctypes.memset(AREA + i * PAGE, 1, 8)
        pid = os.getpid()
        owners = [Owner("heap:snfake", "snfake", "snfake", False)]
        rows, _ms = AllocatorMeter(pid, 1 << 16, owners).measure({}, [], {}, procfs.read_maps(pid))
        assert rows == [("heap:snfake", "snfake", size, 3 * PAGE, 0, 1)]
        registry.unregister(fake.name)
        rows, _ms = AllocatorMeter(pid, 1 << 16, owners).measure({}, [], {}, procfs.read_maps(pid))
        assert rows == [("heap:snfake", "snfake", 0, 0, 0, 0)]
    finally:
        libc.munmap(ctypes.c_void_p(AREA), ctypes.c_size_t(size))


def test_its_advice_and_knob(fake):
    rss = 400 << 20
    dec = {
        "rss_bytes": rss,
        "allocators": [
            {
                "name": "snfake:_rsn_",
                "source": "heap:snfake:_rsn_",
                "kind": "snfake",
                "retained": 200 << 20,
                "released": 0,
            }
        ],
    }
    assert allocator_advice(dec) == [
        "snfake:_rsn_ retains 200.0 MiB (50% of RSS) of freed pages: set _RSN_SNFAKE_CONF=decay:0, "
        "or call sn_collect(true) after a burst"
    ]
    doc = {"rss_decomposition": dec, "totals": {"live_bytes": 0, "peak_live_bytes": 0}}
    retained = [f for f in report_findings(doc) if f["kind"] == "retained"]
    assert [f["text"] for f in retained] == [
        "snfake:_rsn_ keeps 200.0 MiB resident that is not live (50.0% of RSS 400.0 MiB): "
        "_RSN_SNFAKE_CONF=decay:0 returns them sooner."
    ]
    registry.unregister(fake.name)
    assert allocator_advice(dec) == ["snfake:_rsn_ retains 200.0 MiB (50% of RSS) of freed pages"]
