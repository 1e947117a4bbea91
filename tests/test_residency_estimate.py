"""Residency mode's first touches told as what they are, without BPF: the estimate of
reports/analysis/touches.py (capped by the RSS the exact rows leave, the latest touches kept, a
page touched again counted once), the printed equations (reports/analysis/equations.py) and
their check, and the metrics that keep first touches out of allocscope_live_bytes. The real
recordings: tests/test_equations_bpf.py."""

from __future__ import annotations

import numpy as np
from synth import SynthTrace
from test_live import GROW, T_GROW, FakeSymbolizer, Feed

from reports.analysis import build_report
from reports.analysis.equations import allocator_equation, allocator_terms, equation_holds
from reports.analysis.invariants import STRICT_ENV, check_report, report_violations
from reports.analysis.touches import latest_share
from reports.live.metrics import FleetMetrics
from reports.render.text import to_text
from reports.trace import load_trace

MIB = 1 << 20


def test_sort_touching_freed_pages_again_counts_once():
    """A sort: 40 MiB touched, freed, touched again, 5 times, by one row; a cache of 10 MiB
    touched once at first by another. The RSS outside the exact rows stays 50 MiB: the estimate
    never passes it, and keeps the latest touches (the sort's last 40 MiB, then the rest)."""
    sort = np.cumsum([40 * MIB] * 5, dtype=np.float64)
    cache = np.full(5, 10 * MIB, dtype=np.float64)
    cum = np.stack([sort, cache], axis=1)
    cap = np.full(5, 50 * MIB, dtype=np.float64)
    est = latest_share(cum, cap)
    assert est.sum(axis=1).max() <= 50 * MIB
    assert est[0].tolist() == [40 * MIB, 10 * MIB]  # nothing dropped yet: 50 MiB touched in all
    assert est[-1].tolist() == [50 * MIB, 0]  # the latest 50 MiB of touches are all the sort's
    # no RSS left beside the exact rows: no estimate at all
    assert latest_share(cum, np.zeros(5)).sum() == 0


def test_estimate_shares_the_cut_interval_by_what_each_touched():
    cum = np.array([[8 * MIB, 0], [8 * MIB, 4 * MIB], [12 * MIB, 8 * MIB]], dtype=np.float64)
    est = latest_share(cum, np.array([100 * MIB, 6 * MIB, 6 * MIB], dtype=np.float64))
    assert est[0].tolist() == [8 * MIB, 0]
    assert est[1].tolist() == [2 * MIB, 4 * MIB]  # the 4 MiB of interval 2, then 2 of interval 1's 8
    assert est[2].tolist() == [3 * MIB, 3 * MIB]  # interval 3 touched 4 + 4: 6 of it kept, half each


def _alloc(name, resident, live, retained, before=None, unsure=0):
    return {
        "name": name,
        "source": "heap",
        "resident": resident,
        "live": live,
        "retained": retained,
        "live_before_attach": before,
        "before_or_retained": unsure,
        "released": 0,
    }


def test_allocator_lines_are_equations_launched_and_attached():
    """xz -9 (launched): 673.1 MiB live, 134.0 MiB resident; redis (attached): 41.8 MiB live,
    13.4 MiB resident in the mappings it made since the attach."""
    xz = _alloc("glibc", 134 * MIB, 673 * MIB, 340, before=656)
    allocator_terms([xz], outside=0, attached=False)
    eq = allocator_equation(xz)
    assert equation_holds(eq), eq
    assert [(t["label"], t["sign"]) for t in eq["terms"]][1] == ("live not resident (allocated, never touched)", -1)
    assert xz["live_not_resident"] == 673 * MIB - 134 * MIB + 656 + 340
    redis = _alloc("jemalloc", 13 * MIB, 42 * MIB, 0)
    allocator_terms([redis], outside=200 * MIB, attached=True)
    eq = allocator_equation(redis)
    assert equation_holds(eq) and redis["live_outside"] == 29 * MIB and redis["live_not_resident"] == 0
    assert eq["terms"][1]["label"] == "live in its mappings from before the attach"


def test_a_broken_equation_is_a_violation_said_at_the_top_of_the_text(tmp_path, monkeypatch):
    t = SynthTrace(tmp_path / "t.allocscope")
    t.thread(101, "synthd")
    s = t.stack(["malloc", "fill", "main"], files=[None, "/src/a.c", "/src/a.c"], lines=[None, 3, 9])
    t.interval({(s, 101): (4 * MIB, 4, 0, 0)}, rss=8 * MIB)
    doc = build_report(load_trace(t.close()))
    eqs = doc["rss_decomposition"]["equations"]
    assert eqs and all(equation_holds(e) for e in eqs) and report_violations(doc) == []
    rss = eqs[0]
    assert rss["name"] == "RSS" and rss["whole"] == doc["rss_decomposition"]["rss_bytes"]
    monkeypatch.delenv(STRICT_ENV, raising=False)
    rss["terms"][0]["bytes"] += 3 * MIB  # a term that outgrows its whole
    check_report(doc)
    text = to_text(doc)
    head = text[: text.index("Findings")]
    assert "warning: report check: RSS 8.0 MiB = " in head and "does not add up" in head, head
    assert any("does not add up" in v for v in doc["recording"]["invariants"])


def test_first_touches_are_not_live_bytes_in_the_metrics():
    m = FleetMetrics(10, symbolizer=FakeSymbolizer())
    m.started(7, "sortd", None)
    feed = Feed()
    m.update(feed.step(1.0, {(GROW, T_GROW, "mmap"): (40 * MIB, 1, 0, 0, 40 * MIB)}))
    m.update(feed.step(2.0, {(GROW, T_GROW, "fault"): (120 * MIB, 30720, 0, 0, 120 * MIB)}))
    fams = {f.name: f for f in m.families()}
    live = {dict(lb)["source"]: v for lb, v in fams["allocscope_live_bytes"].samples}
    assert live == {"mmap": 40 * MIB}  # what a dashboard sums: no first touches in it
    assert fams["allocscope_first_touched_bytes"].samples == (((), float(120 * MIB)),)
    locs = dict(fams["allocscope_location_live_bytes"].samples)
    assert list(locs.values()) == [float(40 * MIB)]  # the location's own figure: no first touches either


def test_shared_memory_advice_names_cuda_only_where_cuda_is_mapped():
    """PostgreSQL's shared buffers (issue 53: its advice spoke of pinned CUDA host memory)."""
    import pandas as pd

    from reports.analysis.advice import cuda_mapped, residency_advice

    dec = {
        "rss_bytes": 200 * MIB,
        "live_heap_bytes": 0,
        "other_anon_bytes": 20 * MIB,
        "shmem_bytes": 150 * MIB,
        "shmem_attributed_bytes": 0,
        "shmem_unattributed_bytes": 150 * MIB,
    }
    arenas = pd.DataFrame(columns=["id", "kind", "retained_bytes"])
    postgres = residency_advice(arenas, dec, cuda_mapped({"probes": {}}, {"mmap": 1, "shmem": 2}))
    assert postgres and postgres[0].startswith("150.0 MiB is shared memory (shared anonymous mappings")
    # in the units of the RSS line above it (postgres' 10.6 MiB of shmem read "10 MiB", its 0 B "0 MiB")
    assert postgres[0].endswith("): 0 B of it at the shmem sites, 150.0 MiB mapped before the attach or not traced")
    assert not any("CUDA" in a or "cuda" in a for a in postgres), postgres
    gpu = residency_advice(arenas, dec, cuda_mapped({"probes": {"cuda": {"module": "/usr/lib/libcuda.so.1"}}}))
    assert "pinned CUDA host memory" in gpu[0] and "cuda-pinned sites" in gpu[0]
    assert cuda_mapped({}, {"cuda-pinned": 4096})


def test_a_residency_composition_above_the_rss_high_water_is_a_violation_even_when_exact():
    """Issue 50's soak: 1.50 GiB live at the peak, all of it exact mmap rows (mapped partitions),
    beside a 1.44 GiB RSS high-water. Exact mapped bytes are no excuse: mapped is not resident."""
    doc = {
        "totals": {"peak_live_bytes": 1536 * MIB, "hwm_bytes": 1475 * MIB},
        "at_peak": {"live_bytes": 1536 * MIB, "estimate": True, "touch_estimate_bytes": 0, "exact_bytes": 1536 * MIB},
        "locations": [{"at_peak_bytes": 1536 * MIB}],
    }
    (bad,) = report_violations(doc)
    assert bad.startswith("at the peak: the composition 1.5 GiB > the RSS high-water 1.4 GiB"), bad
    doc["at_peak"] |= {"live_bytes": 1475 * MIB, "exact_bytes": 1475 * MIB, "untouched_bytes": 61 * MIB}
    doc["totals"]["peak_live_bytes"] = 1475 * MIB
    doc["locations"] = [{"at_peak_bytes": 1475 * MIB}]
    assert report_violations(doc) == []  # the untouched 61 MiB said apart, not counted live
