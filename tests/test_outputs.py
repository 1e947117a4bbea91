"""Tests for the export formats: pprof, folded stacks, CSV and the self-contained HTML report.

One synthetic trace with hand-computed contents (final state per (stack, thread, source)):

    stack (innermost first)                               tid  source  alloc B/n    free B/n   live B/n
    A malloc<-make_partition<-load_partition<-serve<-main 101  heap    3000/30      1000/10    2000/20
    B operator new<-Cache::insert<-serve<-main            101  heap     512/2          0/0      512/2
    C malloc<-make_partition<-load_partition<-worker<-st  102  heap    8000/8       2000/2     6000/6
    C (same stack)                                        103  heap    2048/2          0/0     2048/2
    D calloc<-scratch<-worker<-start_thread               102  heap     300/3        300/3        0/0
    E mmap<-map_arena<-worker<-start_thread               102  mmap 1048576/1    1048576/1      0/0

so live 10560 B in 30 blocks, 1062436 B allocated in 46 calls. Threads: 101 synthd,
102 pworker-1, 103 pworker-2.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from support import chromium, need_tool, unavailable
from synth import SynthTrace

from reports.analysis import build_report, symbolize_stacks
from reports.render.csvout import to_csv
from reports.render.flamegraph import folded_stacks, to_folded
from reports.render.html import flame_tree, site_chart_data, timeline_data, to_html
from reports.render.pprof import DEFAULT_SAMPLE_TYPE, parse_pprof, to_pprof
from reports.trace import Trace, load_trace

SRC = "/src/synthd/"
LIVE_BYTES, LIVE_COUNT, ALLOC_BYTES, ALLOC_COUNT = 10560, 30, 1062436, 46


def _build(path: Path) -> str:
    t = SynthTrace(path, labels={"pw": "12"})
    a = t.stack(
        ["malloc", "make_partition", "load_partition", "serve", "main"],
        files=[None, SRC + "partition.c", SRC + "partition.c", SRC + "server.c", SRC + "main.c"],
        lines=[None, 42, 88, 120, 15],
    )
    b = t.stack(["operator new(unsigned long)", "Cache::insert", "serve", "main"])
    c = t.stack(["malloc", "make_partition", "load_partition", "worker", "start_thread"])
    d = t.stack(["calloc", "scratch", "worker", "start_thread"])
    e = t.stack(["mmap", "map_arena", "worker", "start_thread"])
    t.thread(101, "synthd")
    t.thread(102, "pworker-1")
    t.thread(103, "pworker-2")
    t.interval({(a, 101): (1000, 10, 0, 0), (c, 102): (4000, 4, 1000, 1)}, rss=10 << 20)
    t.interval(
        {
            (a, 101): (3000, 30, 1000, 10),
            (b, 101): (512, 2, 0, 0),
            (c, 103): (2048, 2, 0, 0),
            (d, 102): (300, 3, 300, 3),
            (e, 102, "mmap"): (1 << 20, 1, 0, 0),
        },
        rss=12 << 20,
        flows={(102, 101): (1000, 10, 5_000_000, 1_000_000)},
    )
    t.interval(
        {(c, 102): (8000, 8, 2000, 2), (e, 102, "mmap"): (1 << 20, 1, 1 << 20, 1)},
        rss=11 << 20,
        flows={(102, 101): (1000, 10, 5_000_000, 1_000_000)},
    )
    return t.close()


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Trace:
    return load_trace(_build(tmp_path_factory.mktemp("outputs") / "a.allocscope"))


@pytest.fixture(scope="module")
def report(trace) -> dict:
    return build_report(trace)


DIFF_DOC = {
    "a": {"pw": "10"},
    "b": {"pw": "12"},
    "sites": [
        {
            "frames": [{"function": "make_partition", "module": "/usr/bin/synthd", "file": None, "line": None}],
            "a_peak_live_bytes": 1000,
            "b_peak_live_bytes": 8048,
            "delta_bytes": 7048,
        }
    ],
}


def test_report_matches_the_documented_contents(report):
    """The expectations below rest on these numbers."""
    assert sum(s["live_bytes"] for s in report["sites"]) == report["totals"]["live_bytes"] == LIVE_BYTES
    assert sum(s["alloc_bytes"] for s in report["sites"]) == ALLOC_BYTES
    assert [s["frames"][0]["function"] for s in report["sites"]] == [
        "make_partition",
        "make_partition",
        "Cache::insert",
        "map_arena",
        "scratch",
    ]


# --------------------------------------------------------------------------------------------- pprof
def _frames_of(prof, sample) -> list[tuple[str, str, int]]:
    st = prof.string_table
    funcs = {f.id: f for f in prof.function}
    locs = {loc.id: loc for loc in prof.location}
    out = []
    for lid in sample.location_id:
        line = locs[lid].line[0]
        fn = funcs[line.function_id]
        out.append((st[fn.name], st[fn.filename], line.line))
    return out


def _labels(prof, sample) -> dict:
    st = prof.string_table
    return {st[lb.key]: (st[lb.str] if lb.str else lb.num) for lb in sample.label}


def test_pprof_sample_types_and_totals(trace, report):
    prof = parse_pprof(to_pprof(trace))
    st = prof.string_table
    assert st[0] == ""
    types = [(st[t.type], st[t.unit]) for t in prof.sample_type]
    assert types == [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert st[prof.default_sample_type] == DEFAULT_SAMPLE_TYPE == "inuse_space"
    totals = [sum(s.value[i] for s in prof.sample) for i in range(4)]
    assert totals == [ALLOC_COUNT, ALLOC_BYTES, LIVE_COUNT, LIVE_BYTES]
    assert totals[3] == sum(s["live_bytes"] for s in report["sites"]) == report["totals"]["live_bytes"]
    assert totals[1] == sum(s["alloc_bytes"] for s in report["sites"])
    assert prof.duration_nanos == 3_000_000_000
    assert [st[c] for c in prof.comment] == ["allocscope: pid 4242 /usr/bin/synthd", "pw=12"]


def test_pprof_samples_stacks_and_labels(trace):
    prof = parse_pprof(to_pprof(trace))
    got = {}
    for s in prof.sample:
        lab = _labels(prof, s)
        frames = _frames_of(prof, s)
        got[(lab["tid"], frames[0][0])] = (lab["thread"], [f[0] for f in frames], list(s.value))
    assert got == {
        (101, "make_partition"): (
            "synthd",
            ["make_partition", "load_partition", "serve", "main"],
            [30, 3000, 20, 2000],
        ),
        (101, "Cache::insert"): ("synthd", ["Cache::insert", "serve", "main"], [2, 512, 2, 512]),
        (102, "make_partition"): (
            "pworker-1",
            ["make_partition", "load_partition", "worker", "start_thread"],
            [8, 8000, 6, 6000],
        ),
        (103, "make_partition"): (
            "pworker-2",
            ["make_partition", "load_partition", "worker", "start_thread"],
            [2, 2048, 2, 2048],
        ),
        (102, "scratch"): ("pworker-1", ["scratch", "worker", "start_thread"], [3, 300, 0, 0]),
        (102, "map_arena"): ("pworker-1", ["map_arena", "worker", "start_thread"], [1, 1 << 20, 0, 0]),
    }
    # File and line of the frames that have them.
    a = next(s for s in prof.sample if _labels(prof, s)["tid"] == 101 and len(s.location_id) == 4)
    assert _frames_of(prof, a) == [
        ("make_partition", SRC + "partition.c", 42),
        ("load_partition", SRC + "partition.c", 88),
        ("serve", SRC + "server.c", 120),
        ("main", SRC + "main.c", 15),
    ]


def test_pprof_ids_and_mappings(trace):
    """Every id is nonzero and unique, every reference resolves, and each location's address maps
    back to its frame's file offset through its mapping (as pprof computes it)."""
    t = Trace(**{**trace.__dict__, "stacks": trace.stacks.assign(build_id="0123abcd")})
    prof = parse_pprof(to_pprof(t))
    st = prof.string_table
    for coll in (prof.mapping, prof.location, prof.function):
        ids = [x.id for x in coll]
        assert all(ids) and len(set(ids)) == len(ids)
    maps = {m.id: m for m in prof.mapping}
    assert [
        (st[m.filename], st[m.build_id], m.has_functions, m.has_filenames, m.has_line_numbers) for m in prof.mapping
    ] == [("/usr/bin/synthd", "0123abcd", True, True, True)]
    funcs = {f.id for f in prof.function}
    offsets = dict(zip(t.stacks["ip"].astype(int), t.stacks["offset"].astype(int)))
    for loc in prof.location:
        m = maps[loc.mapping_id]
        assert m.memory_start <= loc.address < m.memory_limit
        assert loc.address - m.memory_start + m.file_offset == offsets[loc.address]
        assert [ln.function_id in funcs for ln in loc.line] == [True]
    locs = {loc.id for loc in prof.location}
    assert all(lid in locs for s in prof.sample for lid in s.location_id)
    # One location per captured frame: 4 + 3 + 4 + 3 + 3 site frames; C's two threads share theirs.
    assert len(prof.location) == 17


def test_pprof_accepts_precomputed_stacks(trace):
    stacks = symbolize_stacks(trace)
    assert parse_pprof(to_pprof(trace, stacks)) == parse_pprof(to_pprof(trace))


# --------------------------------------------------------------------------------------------- folded
def test_folded_live_bytes_exact(trace):
    assert to_folded(trace) == (
        "main;serve;Cache::insert 512\n"
        "main;serve;load_partition;make_partition 2000\n"
        "start_thread;worker;load_partition;make_partition 8048\n"
    )


def test_folded_alloc_bytes_with_thread_root(trace):
    assert to_folded(trace, "alloc_bytes", thread_root=True) == (
        "pworker-1;start_thread;worker;load_partition;make_partition 8000\n"
        "pworker-1;start_thread;worker;map_arena 1048576\n"
        "pworker-1;start_thread;worker;scratch 300\n"
        "pworker-2;start_thread;worker;load_partition;make_partition 2048\n"
        "synthd;main;serve;Cache::insert 512\n"
        "synthd;main;serve;load_partition;make_partition 3000\n"
    )


def test_folded_counts_and_totals(trace, report):
    assert to_folded(trace, "live_count") == (
        "main;serve;Cache::insert 2\n"
        "main;serve;load_partition;make_partition 20\n"
        "start_thread;worker;load_partition;make_partition 8\n"
    )
    assert sum(folded_stacks(trace, "alloc_count").values()) == ALLOC_COUNT
    assert sum(folded_stacks(trace, "live_bytes").values()) == report["totals"]["live_bytes"]


def test_folded_rejects_unknown_metric(trace):
    with pytest.raises(ValueError, match="unknown metric"):
        to_folded(trace, "peak_bytes")


# --------------------------------------------------------------------------------------------- csv
def test_csv_rows_exact(report):
    rows = list(csv.reader(io.StringIO(to_csv(report))))
    w = "  [synthd]"
    assert rows == [
        [
            "rank",
            "live_bytes",
            "live_count",
            "peak_live_bytes",
            "alloc_bytes",
            "alloc_count",
            "top_frame",
            "frames",
            "full_frames",
            "device_live_bytes",
            "device_peak_bytes",
            "location",
        ],
        [
            "1",
            "8048",
            "8",
            "8048",
            "10048",
            "10",
            "make_partition" + w,
            f"make_partition{w} <- load_partition{w} <- worker{w} <- start_thread{w}",
            f"malloc{w} <- make_partition{w} <- load_partition{w} <- worker{w} <- start_thread{w}",
            "0",
            "0",
            "make_partition|synthd|",
        ],
        [
            "2",
            "2000",
            "20",
            "2000",
            "3000",
            "30",
            f"make_partition partition.c:42{w}",
            (
                f"make_partition partition.c:42{w} <- load_partition partition.c:88{w} <- serve server.c:120{w}"
                f" <- main main.c:15{w}"
            ),
            (
                f"malloc{w} <- make_partition partition.c:42{w} <- load_partition partition.c:88{w}"
                f" <- serve server.c:120{w} <- main main.c:15{w}"
            ),
            "0",
            "0",
            "make_partition|synthd|partition.c:42",
        ],
        [
            "3",
            "512",
            "2",
            "512",
            "512",
            "2",
            "Cache::insert" + w,
            f"Cache::insert{w} <- serve{w} <- main{w}",
            f"operator new(unsigned long){w} <- Cache::insert{w} <- serve{w} <- main{w}",
            "0",
            "0",
            "Cache::insert|synthd|",
        ],
        [
            "4",
            "0",
            "0",
            "1048576",
            "1048576",
            "1",
            "map_arena" + w,
            f"map_arena{w} <- worker{w} <- start_thread{w}",
            f"mmap{w} <- map_arena{w} <- worker{w} <- start_thread{w}",
            "0",
            "0",
            "map_arena|synthd|",
        ],
        [
            "5",
            "0",
            "0",
            "0",
            "300",
            "3",
            "scratch" + w,
            f"scratch{w} <- worker{w} <- start_thread{w}",
            f"calloc{w} <- scratch{w} <- worker{w} <- start_thread{w}",
            "0",
            "0",
            "scratch|synthd|",
        ],
    ]


def test_csv_quotes_commas_and_handles_no_sites():
    doc = {
        "sites": [
            {
                "rank": 1,
                "live_bytes": 1,
                "live_count": 1,
                "peak_live_bytes": 1,
                "alloc_bytes": 1,
                "alloc_count": 1,
                "frames": [{"function": "f<int, long>", "module": "", "file": None, "line": None}],
            }
        ]
    }
    assert to_csv(doc).splitlines()[1] == '1,1,1,1,1,1,"f<int, long>","f<int, long>","f<int, long>",0,0,'
    assert to_csv({"sites": []}) == (
        "rank,live_bytes,live_count,peak_live_bytes,alloc_bytes,alloc_count,top_frame,"
        "frames,full_frames,device_live_bytes,device_peak_bytes,location\n"
    )


# --------------------------------------------------------------------------------------------- html data
def test_html_chart_data(trace, report):
    stacks = symbolize_stacks(trace)
    tl = timeline_data(trace)
    assert tl["t"] == [1.0, 2.0, 3.0]
    assert {s["label"]: s["values"] for s in tl["series"]} == {
        "RSS": [10 << 20, 12 << 20, 11 << 20],
        "live, heap API": [4000, 7560, 10560],
        "live, mmap/brk": [0, 1 << 20, 0],
        "live, total": [4000, 7560 + (1 << 20), 10560],
    }
    # Live at the end (10560) is 1% of the peak (interval 2, 1 MiB of map_arena): the chart
    # leads with the sites that held the peak, numbered by their bytes then.
    assert report["at_peak"]["peak_first"] and report["at_peak"]["seq"] == 2
    sc = site_chart_data(trace, report, stacks)
    assert sc["t"] == [1.0, 2.0, 3.0]
    assert [(s["label"], s["values"]) for s in sc["series"]] == [
        ("#1 map_arena", [0, 1 << 20, 0]),
        ("#2 make_partition", [3000, 5048, 8048]),
        ("#3 make_partition", [1000, 2000, 2000]),
        ("#4 Cache::insert", [0, 512, 512]),
    ]
    # Without the peak to lead with, by rank.
    by_rank = dict(report, at_peak={**report["at_peak"], "peak_first": False})
    assert [(s["label"], s["values"]) for s in site_chart_data(trace, by_rank, stacks)["series"]] == [
        ("#1 make_partition", [3000, 5048, 8048]),
        ("#2 make_partition", [1000, 2000, 2000]),
        ("#3 Cache::insert", [0, 512, 512]),
        ("#4 map_arena", [0, 1 << 20, 0]),
    ]
    assert [(s["label"], s["values"]) for s in site_chart_data(trace, by_rank, stacks, top=1)["series"]] == [
        ("#1 make_partition", [3000, 5048, 8048]),
        ("other (3 locations)", [1000, 2512 + (1 << 20), 2512]),
    ]


def test_flame_tree(trace):
    assert flame_tree(trace, symbolize_stacks(trace)) == {
        "n": "all",
        "v": 10560,
        "c": [
            {
                "n": "start_thread",
                "v": 8048,
                "c": [
                    {
                        "n": "worker",
                        "v": 8048,
                        "c": [{"n": "load_partition", "v": 8048, "c": [{"n": "make_partition", "v": 8048}]}],
                    }
                ],
            },
            {
                "n": "main",
                "v": 2512,
                "c": [
                    {
                        "n": "serve",
                        "v": 2512,
                        "c": [
                            {"n": "load_partition", "v": 2000, "c": [{"n": "make_partition", "v": 2000}]},
                            {"n": "Cache::insert", "v": 512},
                        ],
                    }
                ],
            },
        ],
    }


# --------------------------------------------------------------------------------------------- html page
_REMOTE = [
    re.compile(r"""\b(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE),
    re.compile(r"""url\(\s*["']?\s*(?:https?:)?//""", re.IGNORECASE),
    re.compile(r"@import", re.IGNORECASE),
    re.compile(r"<link\b", re.IGNORECASE),
    re.compile(r"<script\b[^>]*\bsrc\s*=", re.IGNORECASE),
]


@pytest.fixture(scope="module")
def page(trace, report) -> str:
    return to_html(trace, report, DIFF_DOC)


def test_html_is_self_contained(page, trace, report):
    for rx in _REMOTE:
        assert not rx.search(page), f"external reference: {rx.search(page).group(0)!r}"
    assert page.count("<script") == 3  # data, uPlot, ours: all inline
    assert "uPlot" in page and 'id="allocscope-data"' in page
    assert not re.search(
        r"https?://",
        to_html(trace, report)
        .replace("http://www.w3.org/2000/svg", "")
        .replace("https://github.com/leeoniya/uPlot", ""),
    )


def test_html_tables(page, trace, report):
    for text in (
        "make_partition partition.c:42  [synthd]",
        "Cache::insert  [synthd]",
        "pworker-1",
        "pworker-2",
        "synthd(101)",
        "7.9 KiB",
        "Locations by bytes held at the peak (2.0s, live 1.0 MiB;",
        "Threads by live bytes",
        "Frees by allocating",
    ):
        assert text in page, text
    assert page.count("<tr><td") == 5 + 3 + 1 + 1  # sites, threads, flows, diff rows
    assert 'id="diff"' in page and "<b>pw=10</b>" in page and "+" in page
    assert 'id="diff"' not in to_html(trace, report)
    # the findings on top (here one line: no problem; the diff page's test checks the links)
    assert [f["kind"] for f in report["findings"]] == ["no_problem"]
    assert page.index('<ol class="findings" id="findings"><li>No problem found: ') < page.index('<div class="cards">')
    assert f'{report["findings"][0]["text"]} <span class="note">Totals</span></li></ol>' in page


def test_html_renders_inchromium(page, tmp_path):
    exe = need_tool("chromium")
    html_path = tmp_path / "report.html"
    html_path.write_text(page, encoding="utf-8")
    url = html_path.as_uri()

    dom = chromium(exe, tmp_path, "--virtual-time-budget=5000", "--dump-dom", url).stdout
    assert 'data-rendered="1"' in dom, "the page script did not finish"
    for chart in ("chart-timeline", "chart-sites"):
        m = re.search(rf'id="{chart}"[^>]*data-ink="(\d+)"', dom) or re.search(
            rf'data-ink="(\d+)"[^>]*id="{chart}"', dom
        )
        assert m, f"{chart} was not drawn"
        assert int(m.group(1)) > 5000, f"{chart}: only {m.group(1)} pixels painted"
        assert re.search(rf'id="{chart}".*?<canvas', dom, re.DOTALL)
    # The flame graph opens at the peak (interval 2): all; start_thread, worker, load_partition,
    # make_partition, map_arena; main, serve, load_partition, make_partition, Cache::insert.
    flame = re.search(r'<div id="flame-graph"[^>]*data-nodes="(\d+)"[^>]*>(.*?)</div>', dom, re.DOTALL)
    assert flame and flame.group(1) == "11"
    assert flame.group(2).count("<rect") == 11 and "map_arena" in flame.group(2)
    assert re.search(r'<div id="flame-graph"[^>]*data-view="peak"', dom)
    assert re.search(r'<button type="button" data-view="peak" aria-pressed="true">', dom)

    # The other view, as a click on its button draws it: the 10 frames live at the end.
    clicked = tmp_path / "clicked.html"
    clicked.write_text(
        page.replace("</body>", "<script>document.querySelector('button[data-view=end]').click()</script></body>"),
        encoding="utf-8",
    )
    dom = chromium(exe, tmp_path, "--virtual-time-budget=5000", "--dump-dom", clicked.as_uri()).stdout
    flame = re.search(r'<div id="flame-graph"[^>]*data-nodes="(\d+)"[^>]*>(.*?)</div>', dom, re.DOTALL)
    assert flame and flame.group(1) == "10" and flame.group(2).count("<rect") == 10
    assert re.search(r'<div id="flame-graph"[^>]*data-view="end"', dom) and "map_arena" not in flame.group(2)
    assert re.search(r'<button type="button" data-view="end" aria-pressed="true">', dom)

    png = tmp_path / "shot.png"
    chromium(exe, tmp_path, f"--screenshot={png}", url)
    try:
        from PIL import Image, ImageStat
    except ImportError:
        unavailable("Pillow is not installed (a test extra: pip install -e '.[test]')")
    with Image.open(png) as im:
        assert im.size == (1400, 2000)
        rgb = im.convert("RGB")
        assert ImageStat.Stat(rgb.convert("L")).var[0] > 200, "screenshot is (nearly) blank"
        # Charts, fills and the flame graph: many distinct colours, not just text on white.
        assert len(rgb.getcolors(maxcolors=1 << 20) or []) > 500


def test_exports_of_a_trace_without_allocations(tmp_path):
    t = SynthTrace(tmp_path / "empty.allocscope")
    t.interval({}, rss=1 << 20)
    trace = load_trace(t.close())
    report = build_report(trace)
    prof = parse_pprof(to_pprof(trace))
    assert len(prof.sample) == 0 and len(prof.sample_type) == 4
    assert to_folded(trace) == ""
    assert to_csv(report).count("\n") == 1
    page = to_html(trace, report)
    assert '"series":[]' in page and 'id="flame-graph"' in page


def test_json_is_strict_unknown_figures_are_null():
    import json as _json

    import numpy as np

    from reports.render.jsonout import to_json

    out = to_json({"a": float("nan"), "b": [np.float64("inf"), 1.5, np.int64(3)], "c": {"d": np.nan}})
    assert _json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}")) == {
        "a": None,
        "b": [None, 1.5, 3],
        "c": {"d": None},
    }


# --------------------------------------------------------------------------------------------- the diff page
def _diff_run(path: Path, pw: int, held: dict[str, int], steps: int, interval_s: float, pid: int) -> str:
    """One run for the diff page: each function of `held` (stack malloc <- fn <- serve <- main,
    thread 101) reaches its bytes at interval 2 and keeps them; RSS 10 MiB + live."""
    t = SynthTrace(path, labels={"pw": str(pw)}, pid=pid, interval_s=interval_s)
    t.thread(101, "synthd")
    ids = {fn: t.stack(["malloc", fn, "serve", "main"]) for fn in held}
    for step in range(1, steps + 1):
        t.interval(
            {(ids[fn], 101): (b * min(step, 2) // 2, min(step, 2), 0, 0) for fn, b in held.items()},
            rss=(10 << 20) + sum(held.values()),
        )
    return t.close()


@pytest.fixture(scope="module")
def diff_page(tmp_path_factory):
    """pw=10 (A: 3 intervals of 1 s) vs pw=12 (B: 4 intervals of 0.5 s): `grows` 1000 -> 6000 B
    (6.00x where pw predicts 1.20x: flagged), `shrinks` 8000 -> 2000, `same` 4000 -> 4000."""
    from reports.analysis.diff import diff_document, summarize
    from reports.render.html_diff import to_diff_html

    d = tmp_path_factory.mktemp("diffpage")
    a = load_trace(_diff_run(d / "a.allocscope", 10, {"grows": 1000, "shrinks": 8000, "same": 4000}, 3, 1.0, 11))
    b = load_trace(_diff_run(d / "b.allocscope", 12, {"grows": 6000, "shrinks": 2000, "same": 4000}, 4, 0.5, 12))
    sa, sb = summarize(a), summarize(b)
    doc = diff_document(sa, sb, per="pw")
    return doc, to_diff_html(a, b, doc, stacks_a=sa.stacks, stacks_b=sb.stacks)


def test_diff_page_contents(diff_page):
    doc, page = diff_page
    for rx in _REMOTE:
        assert not rx.search(page), f"external reference: {rx.search(page).group(0)!r}"
    assert page.count("<script") == 3
    data = json.loads(re.search(r'id="allocscope-data">(.*?)</script>', page, re.DOTALL).group(1))
    tl = data["timeline"]  # seconds since each run's start: A 1, 2, 3; B 0.5, 1, 1.5, 2
    assert tl["t"] == [0.5, 1.0, 1.5, 2.0, 3.0]
    assert [(s["label"], s["values"]) for s in tl["series"] if "live" in s["label"]] == [
        ("A live", [None, 6500, None, 13000, 13000]),
        ("B live", [6000, 12000, 12000, 12000, None]),
    ]
    assert [s["label"] for s in tl["series"]] == ["A live", "A RSS", "B live", "B RSS"]
    tree = data["flame"]["views"]["diff"]  # width by B, `a`: A's bytes, each run at its own peak
    assert (tree["v"], tree["a"]) == (12000, 13000)
    leaves = {c["n"]: (c["v"], c["a"]) for c in tree["c"][0]["c"][0]["c"]}
    assert leaves == {"grows": (6000, 1000), "shrinks": (2000, 8000), "same": (4000, 4000)}
    # the locations table: `grows` flagged first, with its bars; findings on top
    assert page.index('id="findings"') < page.index('id="locations"')
    assert re.search(r'<tr class="flagged"><td>!</td>.*?grows', page)
    assert doc["findings"][0]["kind"] == "out_of_proportion" and "grows" in doc["findings"][0]["text"]
    assert page.count('class="bar a"') == 3 and 'href="#locations"' in page


def test_diff_page_renders_in_chromium(diff_page, tmp_path):
    exe = need_tool("chromium")
    path = tmp_path / "diff.html"  # stays in the test's tmp_path with its screenshot
    path.write_text(diff_page[1], encoding="utf-8")
    dom = chromium(exe, tmp_path, "--virtual-time-budget=5000", "--dump-dom", path.as_uri()).stdout
    assert 'data-rendered="1"' in dom, "the page script did not finish"
    m = re.search(r'id="chart-timeline"[^>]*data-ink="(\d+)"', dom) or re.search(
        r'data-ink="(\d+)"[^>]*id="chart-timeline"', dom
    )
    assert m and int(m.group(1)) > 5000, "the timeline was not drawn"
    assert all(f">{s}<" in dom for s in ("A live", "A RSS", "B live", "B RSS"))  # the legend: both runs
    flame = re.search(r'<div id="flame-graph"[^>]*data-nodes="(\d+)"[^>]*>(.*?)</div>', dom, re.DOTALL)
    assert flame and flame.group(1) == "6"  # all, main, serve, grows, shrinks, same
    svg = flame.group(2)
    # colour by growth B vs A: grows +83% red, shrinks -75% blue, same grey; all -8% pale blue
    for name, fill in (
        ("grows", "hsl(0,80%,55%)"),
        ("shrinks", "hsl(220,80%,58%)"),
        ("same", "hsl(0,0%,90%)"),
        ("all", "hsl(220,80%,85%)"),
    ):
        assert re.search(rf'<title>{name} — [^<]*</title><rect [^>]*fill="{re.escape(fill)}"', svg), (name, svg)
    png = tmp_path / "diff.png"
    chromium(exe, tmp_path, f"--screenshot={png}", path.as_uri())
    try:
        from PIL import Image, ImageStat
    except ImportError:
        unavailable("Pillow is not installed (a test extra: pip install -e '.[test]')")
    with Image.open(png) as im:
        rgb = im.convert("RGB")
        assert ImageStat.Stat(rgb.convert("L")).var[0] > 200, "screenshot is (nearly) blank"
        assert len(rgb.getcolors(maxcolors=1 << 20) or []) > 500
        red = sum(n for n, (r, g, b) in rgb.getcolors(maxcolors=1 << 20) if r > 200 and g < 110 and b < 110)
        assert red > 2000, "no red (grown) frames painted"
