"""reports.analysis on synthetic traces whose contents the tests choose: rankings by every sort
key, growth fits, verdicts, ages, threads, flows, totals and the report JSON contract.

Ground truth: every site's live-bytes series is written here, interval by interval (interval
seq ends at seq seconds); slopes and R² are worked out by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from synth import SynthTrace

from common.errors import UsageError
from reports import analysis as A
from reports.render.jsonout import to_json
from reports.render.text import to_text
from reports.trace import load_trace

N = 10  # intervals, 1 s each
# Live bytes at the end of intervals 1..10 for every site (its ground truth).
SERIES = {
    "grow": [1000 * i for i in range(1, N + 1)],  # slope 1000 B/s, R² 1
    "plateau": [2000, 4000, 6000, 8000] + [8000] * 6,  # flat over the last half
    "spike": [0, 0, 50000, 50000] + [2000] * 6,  # peak 50000, 2000 left
    "freed": [0, 3000, 3000, 0, 0, 0, 0, 0, 0, 0],  # nothing left
    # Last half (x = 6..10): y = 7000 4000 9000 5000 8000, mean 6600; Σ(x-8)(y-ȳ) = 3000,
    # Σ(x-8)² = 10 -> slope 300 B/s; SS_reg = 300² * 10 = 900000, SS_tot = 17200000 ->
    # R² = 900000 / 17200000. The rise (300 * 4 s = 1200 B) would be material: only R² saves it.
    "noisy": [3000, 6000, 2000, 9000, 5000, 7000, 4000, 9000, 5000, 8000],
    # Steady +100 B/s (R² 1) on 100 kB: rise 400 B < 10% of live -> not "growing".
    "drift": [100000] * 5 + [100100, 100200, 100300, 100400, 100500],
}
THREAD_OF = {"grow": 101, "plateau": 102, "spike": 103, "freed": 103, "noisy": 104, "drift": 105}
NAMES = {101: "pworker-1", 102: "pworker-2", 103: "io-1", 104: "pworker-3", 105: "main"}
# Outstanding blocks at the end: (site, allocated at second). Ages at the end (t = 10 s).
LIVE_AT = [("grow", 0.5), ("grow", 3.0), ("plateau", 4.0), ("spike", 2.5), ("noisy", 7.25), ("drift", 1.0)]
AGES = {"grow": 9.5, "plateau": 6.0, "spike": 7.5, "noisy": 2.75, "drift": 9.0}
RSS = [(10 + i) << 20 for i in range(1, N + 1)]
RSS[6] = 40 << 20  # peak RSS at interval 7
RSS_PEAK, RSS_NOW = 40 << 20, 20 << 20
FLOWS = {(101, 102): (6000, 3, 3_000_000_000, 2_000_000_000), (103, 101): (50000, 1, 500_000_000, 500_000_000)}
NOISY_SLOPE, NOISY_R2 = 300.0, 900000 / 17200000


def counters(series: list[int], i: int) -> tuple[int, int, int, int]:
    """Cumulative (alloc_bytes, alloc_count, free_bytes, free_count) giving live series[i]:
    every interval allocates 100000 more bytes (20 blocks) and frees the rest."""
    alloc = 100000 * (i + 1)
    return alloc, 20 * (i + 1), alloc - series[i], 20 * (i + 1) - (1 if series[i] else 0)


def frames(name: str) -> list[str]:
    return ["malloc", name, "worker_main", "start_thread"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    t = SynthTrace(tmp_path_factory.mktemp("an") / "a.allocscope", labels={"pw": "3"})
    sid = {
        name: t.stack(frames(name), ["malloc.c", f"{name}.c", "worker.c", "pthread.c"], [1, 10, 20, 30])
        for name in SERIES
    }
    for tid, name in NAMES.items():
        t.thread(tid, name)
    for i in range(N):
        t.interval(
            {(sid[n], THREAD_OF[n]): counters(s, i) for n, s in SERIES.items()},
            rss=RSS[i],
            flows=FLOWS if i == N - 1 else None,
            lost={"lost_stack_full": 3, "lost_ring_full": 2, "lost_novel_full": 1} if i == N - 1 else None,
        )
    for name, at in LIVE_AT:
        t.live_block(sid[name], THREAD_OF[name], 64, at)
    return load_trace(t.close())


@pytest.fixture(scope="module")
def ranked(trace):
    return {sort: A.rank_sites(trace, sort=sort) for sort in A.SORT_KEYS}


def names(df) -> list[str]:
    return [site[0].function for site in df["site"]]


def row(df, name: str):
    return df[[s[0].function == name for s in df["site"]]].iloc[0]


def test_rank_by_live(ranked):
    df = ranked["live"]
    # noisy and plateau both end at 8000; noisy's higher peak (9000) breaks the tie.
    assert names(df) == ["drift", "grow", "noisy", "plateau", "spike", "freed"]
    assert df["live_bytes"].tolist() == [100500, 10000, 8000, 8000, 2000, 0]
    assert df["rank"].tolist() == [1, 2, 3, 4, 5, 6]


def test_rank_by_peak(ranked):
    df = ranked["peak"]
    assert names(df) == ["drift", "spike", "grow", "noisy", "plateau", "freed"]
    assert df["peak_live_bytes"].tolist() == [100500, 50000, 10000, 9000, 8000, 3000]


def test_rank_by_growth(ranked):
    df = ranked["growth"]
    # Growing sites first, then by slope; the zero slopes by live bytes.
    assert names(df) == ["grow", "noisy", "drift", "plateau", "spike", "freed"]
    assert df["growth_bytes_per_s"].tolist() == pytest.approx([1000.0, NOISY_SLOPE, 100.0, 0.0, 0.0, 0.0])


def test_rank_by_age(ranked):
    df = ranked["age"]
    assert names(df) == ["grow", "drift", "spike", "plateau", "noisy", "freed"]
    ages = df["oldest_age_s"].tolist()
    assert ages[:5] == pytest.approx([AGES[n] for n in names(df)[:5]])
    assert math.isnan(ages[5])  # nothing outstanding


def test_unknown_sort_is_a_usage_error(trace):
    with pytest.raises(UsageError, match="unknown sort 'size'"):
        A.rank_sites(trace, sort="size")


@pytest.mark.parametrize(
    "name,verdict",
    [
        ("grow", "growing"),
        ("plateau", "plateaued"),
        ("spike", "transient"),
        ("freed", "freed"),
        ("noisy", "plateaued"),
        ("drift", "plateaued"),
    ],
)
def test_verdicts(ranked, name, verdict):
    assert row(ranked["live"], name)["verdict"] == verdict


def test_growth_fit_numbers(ranked):
    df = ranked["live"]
    assert row(df, "grow")["growth_r2"] == pytest.approx(1.0)
    assert row(df, "noisy")["growth_bytes_per_s"] == pytest.approx(NOISY_SLOPE)
    assert row(df, "noisy")["growth_r2"] == pytest.approx(NOISY_R2)
    assert row(df, "drift")["growth_r2"] == pytest.approx(1.0)
    assert row(df, "plateau")["growth_r2"] == 1.0  # a flat line fits exactly


def test_timelines_are_the_series(ranked, trace):
    df = ranked["live"]
    for name, series in SERIES.items():
        assert row(df, name)["timeline"] == series
    tl = A.site_timeline(trace)
    assert list(tl.index) == list(range(1, N + 1))
    col = next(c for c in tl.columns if c[0].function == "noisy")
    assert tl[col].tolist() == SERIES["noisy"]


def test_verdict_rules_at_their_boundaries():
    # transient: live <= 25% of peak
    assert A.verdict(25, 100, 0.0, 1.0, 5.0, 5) == "transient"
    assert A.verdict(26, 100, 0.0, 1.0, 5.0, 5) == "plateaued"
    assert A.verdict(0, 100, 0.0, 1.0, 5.0, 5) == "freed"
    # growing: R² >= 0.8, rise >= 10% of live, >= 4 points
    assert A.verdict(1000, 1000, 25.0, 0.8, 4.0, 5) == "growing"  # rise 100 = 10%
    assert A.verdict(1000, 1000, 24.0, 0.8, 4.0, 5) == "plateaued"  # rise 96 < 10%
    assert A.verdict(1000, 1000, 25.0, 0.79, 4.0, 5) == "plateaued"  # poor fit
    assert A.verdict(1000, 1000, 500.0, 1.0, 2.0, 3) == "new"  # too few intervals to judge
    assert A.verdict(1000, 1000, 0.0, 1.0, 0.0, 1) == "new"
    assert A.verdict(1000, 1000, 500.0, math.nan, 2.0, 4) == "plateaued"


def test_fit_growth_and_window():
    x = np.array([6.0, 7, 8, 9, 10])
    y = np.array([[7000, 10], [4000, 20], [9000, 30], [5000, 40], [8000, 50]])
    slope, r2 = A.fit_growth(x, y)
    assert slope.tolist() == pytest.approx([NOISY_SLOPE, 10.0])
    assert r2.tolist() == pytest.approx([NOISY_R2, 1.0])
    assert [A.fit_window(n) for n in (1, 3, 4, 7, 10, 11, 100)] == [1, 3, 4, 4, 5, 6, 50]


def test_timeline_points():
    assert A.timeline_points(3) == [0, 1, 2]
    pts = A.timeline_points(1000, 50)
    assert len(pts) == 50 and pts[0] == 0 and pts[-1] == 999


def test_threads(trace):
    th = A.thread_table(trace)
    assert th["tid"].tolist() == [105, 101, 104, 102, 103]
    assert th["name"].tolist() == ["main", "pworker-1", "pworker-3", "pworker-2", "io-1"]
    assert th["live_bytes"].tolist() == [100500, 10000, 8000, 8000, 2000]
    # io-1 holds spike + freed: peak of their sum is 50000 + 3000 at interval 3.
    assert th.set_index("tid").loc[103, "peak_live_bytes"] == 53000


def test_thread_groups(trace):
    g = A.thread_group_table(trace).set_index("group")
    assert list(g.index) == ["main", "pworker-N", "io-N"]
    assert g.loc["pworker-N", "threads"] == 3
    assert g.loc["pworker-N", "live_bytes"] == 10000 + 8000 + 8000
    # peak of grow + plateau + noisy summed per interval: interval 10 = 10000 + 8000 + 8000,
    # interval 8 = 8000 + 8000 + 9000 = 25000; the max is 26000.
    assert g.loc["pworker-N", "peak_live_bytes"] == 26000
    assert A.thread_group("pworker-12") == "pworker-N"
    assert A.thread_group("rpc7-w10") == "rpcN-wN"


def test_flows(trace):
    f = A.flow_table(trace)
    assert f[["alloc_thread", "free_thread", "bytes", "count"]].values.tolist() == [
        ["io-1", "pworker-1", 50000, 1],
        ["pworker-1", "pworker-2", 6000, 3],
    ]
    assert f["mean_wait_s"].tolist() == pytest.approx([0.5, 1.0])
    assert f["max_wait_s"].tolist() == pytest.approx([0.5, 2.0])


def test_totals_and_advice(trace):
    tot = A.totals(trace)
    live_end = sum(s[-1] for s in SERIES.values())
    live_peak = max(sum(s[i] for s in SERIES.values()) for i in range(N))
    assert (tot["live_bytes"], tot["peak_live_bytes"]) == (live_end, live_peak)
    assert (tot["rss_bytes"], tot["peak_rss_bytes"]) == (RSS_NOW, RSS_PEAK)
    assert tot["lost_events"] == 6
    assert tot["losses"] == {"lost_stack_full": 3, "lost_ring_full": 2, "lost_novel_full": 1}
    adv = A.advice(trace, tot)
    assert len(adv) == 3
    assert any(a.startswith("lost_ring_full=2: the event ring overflowed") for a in adv)
    assert any(a.startswith("lost_novel_full=1: ") for a in adv)  # unknown counters get advice too


def test_report_json_contract(trace):
    doc = A.build_report(trace, sort="growth")
    assert doc["schema"] == "allocscope.report/1"
    assert set(doc["target"]) >= {"pid", "comm", "exe", "labels"}
    assert doc["target"]["labels"] == {"pw": "3"}
    assert set(doc["totals"]) >= {
        "live_bytes",
        "live_count",
        "peak_live_bytes",
        "rss_bytes",
        "peak_rss_bytes",
        "lost_events",
    }
    assert {"arenas", "trims", "threads"} <= set(doc)
    assert doc["sort"] == "growth" and doc["timeline_seq"] == list(range(1, N + 1))
    site_keys = {
        "rank",
        "live_bytes",
        "live_count",
        "peak_live_bytes",
        "alloc_bytes",
        "alloc_count",
        "frames",
        "threads",
        "growth_bytes_per_s",
        "growth_r2",
        "oldest_age_s",
        "verdict",
        "timeline",
    }
    for s in doc["sites"]:
        assert site_keys <= set(s)
        assert set(s["frames"][0]) == {"function", "module", "file", "line"}
        assert all(set(t) >= {"tid", "name", "live_bytes"} for t in s["threads"])
    first = doc["sites"][0]
    assert [f["function"] for f in first["frames"]] == ["grow", "worker_main", "start_thread"]  # malloc folded
    assert (
        first["rank"],
        first["verdict"],
        first["growth_bytes_per_s"],
        first["growth_r2"],
        first["oldest_age_s"],
        first["timeline"],
    ) == (1, "growing", 1000.0, 1.0, 9.5, SERIES["grow"])
    freed = doc["sites"][-1]
    assert (freed["verdict"], freed["oldest_age_s"]) == ("freed", None)
    assert set(doc["threads"][0]) >= {"tid", "name", "live_bytes", "live_count", "peak_live_bytes"}
    to_json(doc)  # serializable


def test_report_text(trace):
    text = to_text(A.build_report(trace, sort="age"))
    assert "locations by oldest allocation" in text
    assert "growing" in text and "transient" in text
    assert "lost_ring_full=2" in text


def test_incomplete_trace_has_no_ages(tmp_path):
    t = SynthTrace(tmp_path / "cut.allocscope")
    s = t.stack(["leak", "main"])
    for i in range(1, 6):
        t.interval({(s, 1): (100 * i, i, 0, 0)})
    t.live_block(s, 1, 100, 0.5)  # never written: the recording was cut short
    tr = load_trace(t.close(complete=False))
    df = A.rank_sites(tr, sort="age")
    assert math.isnan(df["oldest_age_s"].iloc[0])
    assert df["verdict"].iloc[0] == "growing"
    assert df["growth_bytes_per_s"].iloc[0] == pytest.approx(100.0)


def test_short_trace_is_never_growing(tmp_path):
    t = SynthTrace(tmp_path / "short.allocscope")
    s = t.stack(["leak", "main"])
    for i in range(1, 4):
        t.interval({(s, 1): (1000 * i, i, 0, 0)})
    df = A.rank_sites(load_trace(t.close()))
    assert df["verdict"].tolist() == ["new"]  # 3 intervals: too few to judge
    assert df["growth_bytes_per_s"].iloc[0] == pytest.approx(1000.0)
