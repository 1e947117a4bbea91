"""reports.analysis.findings: the findings on top of every report and diff, rule by rule, on synthetic
traces with known contents (the real demo recordings are checked in test_demo_bpf.py).

Every trace here is one program (/usr/bin/synthd), 1 s intervals, threads 101 main and
102..104 pworker-1..3. Waits and per-allocator residency are not in SynthTrace: those rules are
checked on a synthetic report document given the `waits` / `rss_decomposition` objects the
analysis makes (reports/analysis/waits.py, reports/analysis/residency.py), as the report carries them.
"""

from __future__ import annotations

import copy
import json

import pytest
from synth import SynthTrace
from test_diff import run_trace

from reports.analysis import build_report
from reports.analysis import findings as F
from reports.analysis.children import children_summary
from reports.analysis.diff import diff_traces
from reports.analysis.ending import end_finding
from reports.render.diff_text import diff_to_text
from reports.render.html_tables import waits_html
from reports.render.jsonout import to_json
from reports.render.text import to_text
from reports.trace import load_trace

SRC = "/src/synthd/"
MIB = 1 << 20


def _stack(t: SynthTrace, fn: str, line: int) -> int:
    return t.stack(
        ["malloc", fn, "worker", "start_thread"],
        files=[None, SRC + "w.c", SRC + "w.c", None],
        lines=[None, line, 7, None],
    )


def _threads(t: SynthTrace) -> None:
    t.thread(101, "synthd")
    for i in (1, 2, 3):
        t.thread(101 + i, f"pworker-{i}")


@pytest.fixture(scope="module")
def steady(tmp_path_factory):
    """10 intervals of a steady small heap: `cache` holds 600 KiB, `table` 200 KiB throughout,
    `scratch` allocates and frees 4 KiB every interval; RSS 8 MiB."""
    t = SynthTrace(tmp_path_factory.mktemp("f") / "steady.allocscope")
    _threads(t)
    cache, table, scratch = _stack(t, "cache_fill", 10), _stack(t, "table_init", 20), _stack(t, "scratch", 30)
    for i in range(1, 11):
        t.interval(
            {
                (cache, 102): (600 << 10, 6, 0, 0),
                (table, 101): (200 << 10, 2, 0, 0),
                (scratch, 103): (4096 * i, i, 4096 * i, i),
            },
            rss=8 * MIB,
        )
    return build_report(load_trace(t.close()))


@pytest.fixture(scope="module")
def burst(tmp_path_factory):
    """A burst freed by the end: `make_partition` holds 8, 24, 40 MiB, then 0; `load_config`
    2 MiB throughout; `leaky` grows 1 MiB per interval (1..8 MiB over 8 intervals: live 8 MiB at
    the end)."""
    t = SynthTrace(tmp_path_factory.mktemp("f") / "burst.allocscope")
    _threads(t)
    part, cfg, leak = _stack(t, "make_partition", 42), _stack(t, "load_config", 12), _stack(t, "leaky", 99)
    held = [8, 24, 40, 0, 0, 0, 0, 0]
    for i, h in enumerate(held, 1):
        alloc = max(held[:i]) * MIB  # cumulative, freed down to `h`
        t.interval(
            {
                (part, 102): (alloc, alloc // MIB, alloc - h * MIB, (alloc - h * MIB) // MIB),
                (cfg, 101): (2 * MIB, 1, 0, 0),
                (leak, 103): (i * MIB, i, 0, 0),
            },
            rss=64 * MIB,
        )
    return build_report(load_trace(t.close()))


def test_steady_small_heap_says_no_problem_in_one_line(steady):
    f = steady["findings"]
    assert [x["kind"] for x in f] == ["no_problem"], f
    assert f[0]["text"] == (
        "No problem found: 800.0 KiB live at the end, peak 800.0 KiB; no burst, nothing growing, "
        "no blocked thread kept memory, the allocators keep little that is not live and no events "
        "that matter were lost."
    )
    text = to_text(steady)
    block = text[text.index("Findings") : text.index("\nTotals\n")].strip().splitlines()
    assert len(block) == 2 and block[1].startswith("  1. No problem found") and block[1].endswith("[Totals]"), block
    keys = [k for k in json.loads(to_json(steady)) if k != "integrity"]  # the damage check may lead
    assert keys[:2] == ["schema", "findings"]


def test_what_the_trace_does_not_cover_comes_first_never_no_problem(steady):
    """`record -- sh -c 'exec prog'` and a parent whose work is in forked children: the same small
    heap said "No problem found" about a program that was never traced; the first finding now says
    what the trace does not hold."""
    doc = copy.deepcopy(steady)
    doc["recording"]["end"] = {"reason": "exec", "time": 0.25, "exit_code": None, "signal": None, "oom": None}
    f = F.report_findings(doc, end_finding(doc))
    assert [x["kind"] for x in f] == ["ended", "peak"], f
    assert f[0]["text"] == (
        "The target exec'd another program at +0.2s: this trace holds only what the program before the exec "
        "allocated (its allocator and blocks went with it); record the new program itself (-- CMD, or --pid "
        "once it runs)."
    )
    doc = copy.deepcopy(steady)
    doc["recording"]["children"] = children_summary(
        {
            "children": {
                "seen": 1,
                "target_cpu_s": 0.0,
                "cpu_s": 2.77,
                "anon_max_bytes": 114 << 20,
                "listed": [{"pid": 27302}],
            }
        }
    )
    f = F.report_findings(doc)
    assert [x["kind"] for x in f] == ["children", "peak"], f
    assert f[0]["text"].startswith(
        "The work is in 1 forked child (pids 27302): 2.77s of CPU against 0.00s in the target"
    )
    assert f[0]["figures"] == {"children": 1, "cpu_s": 2.77, "target_cpu_s": 0.0}


def test_burst_names_the_peak_holder_and_the_growing_location(burst):
    f = burst["findings"]
    assert [x["kind"] for x in f] == ["peak", "growing"], f
    # At the peak (interval 3): make_partition 40 MiB, load_config 2, leaky 3 = 45 MiB live.
    peak = f[0]
    assert peak["text"] == ("At the peak (3.0s, 45.0 MiB live), make_partition w.c:42 held 40.0 MiB (88.9%).")
    assert peak["table"] == "Held at the peak" and peak["section"] == "sites"
    assert peak["figures"]["holders"] == [
        {"location": peak["figures"]["holders"][0]["location"], "function": "make_partition", "bytes": 40 * MIB}
    ]
    assert "waiting" not in peak["figures"]
    # leaky: +1 MiB/s over the last half, an exact line (R² 1.00), 8 MiB live at the end.
    grow = f[1]
    assert grow["text"] == (
        "leaky w.c:99 (+1.0 MiB/s, R² 1.00, 8.0 MiB live at the end) is still growing over the "
        "last half of the recording."
    )
    assert grow["figures"]["locations"][0]["growth_bytes_per_s"] == pytest.approx(MIB)
    # the text report shows them first, each with the table it comes from
    text = to_text(burst)
    assert text.index("Findings") < text.index("Totals") < text.index("Held at the peak (")
    assert "  1. At the peak (3.0s, 45.0 MiB live), make_partition" in text and "[Held at the peak]" in text


def test_peak_names_holders_until_most_is_covered(burst):
    doc = copy.deepcopy(burst)
    for loc in doc["locations"]:  # make_partition 50%, load_config 30%, leaky 20% of 100 at the peak
        loc["at_peak_bytes"] = {"make_partition": 50, "load_config": 30, "leaky": 20}[loc["function"]]
    doc["at_peak"]["live_bytes"] = 100
    named, whole, first = F.peak_holders(doc)
    assert [r["function"] for r in named] == ["make_partition", "load_config"] and first  # 80% covered: stop
    for loc in doc["locations"]:
        loc["at_peak_bytes"] = 90 if loc["function"] == "make_partition" else 5  # the others under 10%
    assert [r["function"] for r in F.peak_holders(doc)[0]] == ["make_partition"]


def _waits(kept: int, threads: int, in_call: bool = False) -> dict:
    """A report `waits` object (reports/analysis/waits.py) whose peak has one wait location: `threads`
    threads blocked in hand_off holding `kept` bytes of make_partition (in_call: blocked inside
    make_partition itself, so nothing is kept after the call)."""
    loc = {
        "location": "hand_off|synthd|w.c:77",
        "function": "sleep_ns" if in_call else "hand_off",
        "module": "/usr/bin/synthd",
        "file": SRC + "w.c",
        "line": 77,
    }
    held = {
        "location": "make_partition|synthd|w.c:42",
        "function": "make_partition",
        "module": "/usr/bin/synthd",
        "file": SRC + "w.c",
        "line": 42,
        "bytes": kept,
        "blocks": threads,
    }
    entry = {
        **loc,
        "threads": threads,
        "holding_threads": threads,
        "held_bytes": kept,
        "kept_bytes": 0 if in_call else kept,
        "keeping_threads": 0 if in_call else threads,
        "held": [held],
        "thread_list": [],
    }
    return {
        "traced": True,
        "wait_min_ms": 1.0,
        "peak": {
            "seq": 3,
            "elapsed_s": 2.5,
            "blocked": threads,
            "holding": threads,
            "held_bytes": kept,
            "by_location": [entry],
        },
        "freeing": {"by_thread": [], "purges": [], "tlb": {}},
    }


def test_blocked_threads_keeping_the_peak_join_the_first_finding(burst):
    doc = copy.deepcopy(burst)
    doc["waits"] = _waits(24 * MIB, 3)  # 24 of the 45 MiB live peak: >= 25%
    f = F.report_findings(doc)
    assert f[0]["kind"] == "peak" and len([x for x in f if x["kind"] == "waiting"]) == 0
    assert f[0]["text"] == (
        "At the peak (3.0s, 45.0 MiB live), make_partition w.c:42 held 40.0 MiB (88.9%); at +2.5s "
        "3 threads blocked in hand_off w.c:77 held 24.0 MiB of it."
    )
    assert f[0]["table"] == "Held at the peak; Held while waiting"
    assert f[0]["figures"]["waiting"]["threads"] == 3 and f[0]["figures"]["waiting"]["of_bytes"] == 24 * MIB
    # the table's header gives the moment by its time, as the report's header gives the duration: not
    # by its seq ("interval 3"), which peak snapshots also take (a 4-interval run said "interval 8")
    doc["waits"]["peak"]["by_location"][0].update(longest_s=1.5, handed_on_bytes=0, frames=[])
    assert "Held while waiting  (+2.5s: 3 threads blocked, 3 of them holding 24.0 MiB" in to_text(doc)
    assert "<p>+2.5s: 3 threads blocked, 3 of them holding" in waits_html(doc)


@pytest.mark.parametrize(
    "kept,threads,in_call",
    [
        (8 * MIB, 3, False),  # 8/45 MiB: under 25% of the peak
        (24 * MIB, 1, False),  # one thread: a hand-off, not a pile-up
        (24 * MIB, 3, True),
    ],
)  # blocked inside the allocating call
def test_no_waiting_finding_under_the_thresholds(burst, kept, threads, in_call):
    doc = copy.deepcopy(burst)
    doc["waits"] = _waits(kept, threads, in_call)
    assert F.kept_while_waiting(doc) is None
    f = F.report_findings(doc)
    assert "waiting" not in f[0]["figures"] and all(x["kind"] != "waiting" for x in f)


def test_a_wait_on_other_memory_is_its_own_finding(burst):
    doc = copy.deepcopy(burst)
    doc["waits"] = _waits(24 * MIB, 4)
    doc["waits"]["peak"]["by_location"][0]["held"][0].update(location="other|synthd|w.c:5", function="other")
    f = F.report_findings(doc)
    assert [x["kind"] for x in f][:2] == ["peak", "waiting"]
    assert f[1]["text"] == (
        "At +2.5s 4 threads blocked in hand_off w.c:77 held 24.0 MiB (53.3% of the live peak "
        "kept after the allocating call returned), most of it from other (24.0 MiB)."
    )


def test_retained_memory_names_the_allocator_and_its_knob(steady):
    doc = copy.deepcopy(steady)
    doc["rss_decomposition"] = {
        "rss_bytes": 100 * MIB,
        "retained_known": True,
        "allocators": [
            {"name": "jemalloc:_rjem_", "kind": "jemalloc", "retained": 30 * MIB, "resident": 40 * MIB},
            {"name": "glibc", "kind": "glibc", "retained": 3 * MIB, "resident": 4 * MIB},
        ],
    }
    f = F.report_findings(doc)
    assert [x["kind"] for x in f] == ["peak", "retained"], f
    assert f[0]["text"] == (
        "At the end (800.0 KiB live), cache_fill w.c:10 held 600.0 KiB (75.0%) and "
        "table_init w.c:20 held 200.0 KiB (25.0%)."
    )
    assert f[1]["text"] == (
        "jemalloc:_rjem_ keeps 30.0 MiB resident that is not live (30.0% of RSS 100.0 MiB): "
        "_RJEM_MALLOC_CONF=dirty_decay_ms:1000,muzzy_decay_ms:0 returns them sooner."
    )
    doc["rss_decomposition"]["allocators"][0]["retained"] = 3 * MIB  # 3% of RSS: nothing to say
    assert [x["kind"] for x in F.report_findings(doc)] == ["no_problem"]


def test_release_cost_and_tlb_shootdowns(steady):
    doc = copy.deepcopy(steady)
    doc["waits"] = {
        "traced": False,
        "peak": None,
        "freeing": {
            "by_thread": [
                {
                    "tid": 102,
                    "thread": "pworker-1",
                    "kind": "munmap",
                    "calls": 120,
                    "requested_bytes": 1,
                    "released_bytes": 1,
                    "duration_s": 0.25,
                }
            ],
            "purges": [],
            "tlb": {"remote_shootdown": {"flushes": 4000, "pages": 9000, "full": 3}},
        },
    }
    f = F.report_findings(doc)
    assert [x["kind"] for x in f] == ["peak", "release_cost"]
    assert f[1]["text"] == (
        "Giving memory back took 0.25s in the calls (most: munmap on pworker-1, 0.25s in 120 "
        "calls), with 4000 remote TLB shootdowns."
    )
    doc["waits"]["freeing"]["by_thread"][0]["duration_s"] = 0.01
    doc["waits"]["freeing"]["tlb"] = {}
    assert [x["kind"] for x in F.report_findings(doc)] == ["no_problem"]


def test_losses_that_matter(tmp_path):
    t = SynthTrace(tmp_path / "lost.allocscope")
    _threads(t)
    s = _stack(t, "cache_fill", 10)
    t.interval({(s, 102): (MIB, 1, 0, 0)}, rss=8 * MIB, lost={"lost_unmatched_ret": 3})
    t.interval({(s, 102): (MIB, 1, 0, 0)}, rss=8 * MIB, lost={"lost_unmatched_ret": 3})
    quiet = build_report(load_trace(t.close()))
    assert [x["kind"] for x in quiet["findings"]] == ["no_problem"]  # 3 returns in flight at attach: normal
    t = SynthTrace(tmp_path / "lost2.allocscope")
    s = _stack(t, "cache_fill", 10)
    t.interval({(s, 102): (MIB, 1, 0, 0)}, rss=8 * MIB, lost={"lost_site_full": 17, "lost_unmatched_ret": 3})
    f = build_report(load_trace(t.close()))["findings"]
    assert [x["kind"] for x in f] == ["peak", "losses"]
    assert f[1]["text"].startswith("Events were lost (lost_site_full=17): the figures above are lower bounds")


@pytest.fixture(scope="module")
def diff_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fdiff")
    return (
        run_trace(d / "pw10.allocscope", 10, "a", 4242, 0x1000, 1000),
        run_trace(d / "pw12.allocscope", 12, "b", 5151, 0x77000, 2500, free_superlinear=True),
    )


def test_diff_names_the_location_out_of_proportion_first(diff_paths):
    a, b = (load_trace(p) for p in diff_paths)
    doc = diff_traces(a, b, per="pw")
    f = doc["findings"]
    # superlinear: A 10 x 1000 = 10000 B at its peak, B 12 x 2500 = 30000 B: 3.00x where
    # pw 10->12 predicts 1.20x (2.50x linear), 30000 - 12000 = +18000 B beyond it.
    assert f[0]["kind"] == "out_of_proportion"
    assert f[0]["text"] == (
        "superlinear superlinear.c:20 grew out of proportion to pw: peak 9.8 KiB → 29.3 KiB, "
        "3.00x where pw 10→12 predicts 1.20x (2.50x linear scaling, +17.6 KiB beyond it)."
    )
    fig = f[0]["figures"]
    assert (fig["ratio"], fig["scaling"], fig["excess_bytes"]) == (3.0, 2.5, 18000)
    row = next(x for x in doc["locations"] if x["flagged"])
    assert (row["function"], row["ratio"]) == ("superlinear", fig["ratio"])
    # pworker-N: 10 x (4000 + 1000) = 50000 -> 12 x (4000 + 2500) = 78000 B
    groups = next(x for x in f if x["kind"] == "thread_groups")
    assert groups["text"] == (
        "Thread groups whose peak moved: pworker-N 48.8 KiB → 76.2 KiB (+27.3 KiB, 10 → 12 threads)."
    )
    text = diff_to_text(doc)
    assert text.index("Findings") < text.index("Totals") and "  1. superlinear superlinear.c:20 grew out" in text


def test_diff_of_a_run_with_itself_says_no_change(diff_paths):
    a = load_trace(diff_paths[0])
    f = diff_traces(a, a, per="pw")["findings"]
    assert [x["kind"] for x in f] == ["no_change"]
    # 10 workers x 5000 + 3000 + 10 = 53010 B
    assert f[0]["text"] == (
        "No material change: live peak 51.8 KiB → 51.8 KiB; no location grew out of proportion "
        "to pw, no thread group's peak moved and no blocked threads kept more."
    )


def test_cli_diff_html_and_report_at_peak(diff_paths, tmp_path):
    from click.testing import CliRunner
    from support import one_line_error

    from allocscope.cli.app import main

    out = tmp_path / "d.html"
    r = CliRunner().invoke(main, ["diff", *diff_paths, "--per", "pw", "--format", "html", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert 'id="findings"' in page and "superlinear superlinear.c:20 grew out of proportion to pw" in page
    assert 'class="diff-locations"' in page and 'id="flame-graph"' in page
    # --at peak: the stacks live at the live peak. B (pw=12) peaks at interval 2, before half of
    # `superlinear` is freed: 12 x 2500 B there, 12 x 1250 B at the end.
    r = CliRunner().invoke(main, ["report", diff_paths[1], "--format", "folded", "--at", "peak"])
    assert r.exit_code == 0, r.output
    assert "start_thread;worker_main;superlinear 30000\n" in r.stdout
    r = CliRunner().invoke(main, ["report", diff_paths[1], "--format", "folded"])
    assert "start_thread;worker_main;superlinear 15000\n" in r.stdout
    r = CliRunner().invoke(main, ["report", diff_paths[1], "--at", "peak"])
    one_line_error(r, "--at peak is for --format pprof and folded", code=2)


def test_release_cost_never_says_zero_seconds():
    """Issue 53 item 9: redis under load, 1578 remote TLB shootdowns and calls of a few µs read
    "Giving memory back took 0.00s in the calls"."""
    from reports.analysis.findings import duration_text, release_finding

    assert [duration_text(s) for s in (2.5, 0.19, 0.0031, 0.000042, 0.0)] == [
        "2.50s",
        "0.19s",
        "3.1 ms",
        "42 µs",
        "no measurable time",
    ]
    doc = {
        "waits": {
            "freeing": {
                "by_thread": [{"kind": "munmap", "thread": "redis-server", "calls": 12, "duration_s": 0.000042}],
                "tlb": {"remote_shootdown": {"flushes": 1578}},
            }
        }
    }
    f = release_finding(doc)
    assert f["text"] == (
        "1578 remote TLB shootdowns on its threads (from any page-table change: unmapping, mprotect, "
        "copy-on-write); giving memory back took 42 µs in the calls (most: munmap on redis-server, 42 µs in 12 calls)."
    )
    assert "0.00s" not in f["text"] and f["figures"]["remote_shootdowns"] == 1578
