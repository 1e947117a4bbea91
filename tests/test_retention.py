"""The range arithmetic of tracer/allocators/retention.py (which allocator owns which bytes) and the knob
each allocator's advice names."""

from __future__ import annotations

from reports.analysis.advice import allocator_advice, conf_env
from tracer.allocators.arenas import merge_ranges
from tracer.allocators.retention import intersect_ranges, purge_function, subtract_ranges


def test_ranges():
    assert merge_ranges([(5, 10), (0, 6), (20, 30), (30, 31)]) == [(0, 10), (20, 31)]
    assert subtract_ranges([(0, 100), (200, 300)], [(10, 20), (50, 60), (90, 210)]) == [
        (0, 10),
        (20, 50),
        (60, 90),
        (210, 300),
    ]
    assert subtract_ranges([(0, 100)], []) == [(0, 100)]
    assert intersect_ranges([(0, 100), (150, 200)], [(50, 160), (190, 400)]) == [(50, 100), (150, 160), (190, 200)]


def test_purge_names():
    assert purge_function("mimalloc", 0, 1) == ("mi_collect", "force")
    assert purge_function("glibc", 0, 0) == ("malloc_trim", "0")


def test_advice_knobs():
    assert conf_env("_rjem_") == "_RJEM_MALLOC_CONF" and conf_env("") == "MALLOC_CONF"
    dec = {
        "rss_bytes": 400 << 20,
        "allocators": [
            {
                "name": "jemalloc:_rjem_",
                "source": "heap:jemalloc:_rjem_",
                "kind": "jemalloc",
                "retained": 180 << 20,
                "released": 0,
            },
            {"name": "tcmalloc", "source": "heap", "kind": "tcmalloc", "retained": 100 << 20, "released": 3 << 20},
            {"name": "mimalloc", "source": "heap:mimalloc", "kind": "mimalloc", "retained": 50 << 20, "released": 0},
        ],
    }
    adv = allocator_advice(dec)
    assert any("180.0 MiB (45% of RSS)" in a and "_RJEM_MALLOC_CONF=dirty_decay_ms" in a for a in adv), adv
    assert any("100.0 MiB (25% of RSS)" in a and "TCMALLOC_RELEASE_RATE" in a and "released 3.0 MiB" in a for a in adv)
    assert not any("mimalloc" in a for a in adv)  # 12% of RSS: under the 20% bar
