"""reports.analysis.diff and `allocscope diff` on two synthetic runs of one program, pw=10 vs pw=12.

The runs differ in everything a real second run changes: PID, stack ids, instruction
addresses, install directory of the binary and build directory of the sources. Ground truth
(bytes each site holds, per thread, per interval) is chosen here; every expected number in the
asserts is derived from it in the comments.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from click.testing import CliRunner
from support import one_line_error
from synth import SynthTrace

from allocscope.cli import diff as cmd_diff
from allocscope.cli.diff import diff
from common.errors import UsageError
from reports import analysis as A
from reports.analysis import diff as D
from reports.render.diff_text import diff_to_text
from reports.render.jsonout import to_json
from reports.trace import load_trace

# Site -> (function, line). Frames: malloc, <function>, worker_main, start_thread.
LINES = {"linear": 10, "superlinear": 20, "only_a": 30, "only_b": 40, "tiny": 50}
MAIN_TID = 1


def stack(t: SynthTrace, run: str, name: str, module_dir: str | None = None) -> int:
    src = f"/build/{run}/src"
    return t.stack(
        ["malloc", name, "worker_main", "start_thread"],
        ["/usr/src/glibc/malloc.c", f"{src}/{name}.c", f"{src}/worker.c", "/usr/src/glibc/pthread.c"],
        [3000, LINES[name], 99, 400],
        module=f"{module_dir or f'/opt/{run}'}/bin/provingd",
    )


def run_trace(
    path,
    pw: int,
    run: str,
    pid: int,
    id_base: int,
    superlinear_per_thread: int,
    exe: str = "/opt/provingd/bin/provingd",
    free_superlinear: bool = False,
) -> str:
    """3 intervals: per worker thread, `linear` holds 2000 then 4000, 4000 bytes and
    `superlinear` half then all of `superlinear_per_thread` (in B, half of it is freed in the
    last interval); the main thread holds the one-run sites and `tiny`."""
    t = SynthTrace(
        path, labels={"pw": str(pw), "host": "lab1"}, pid=pid, id_base=id_base, ip_base=id_base << 8, exe=exe
    )
    workers = list(range(100, 100 + pw))
    # B splits `linear` over two stack ids whose frames only differ in the module directory.
    lin = {
        tid: stack(t, run, "linear", f"/opt/{run}{'-copy' if run == 'b' and i % 2 else ''}")
        for i, tid in enumerate(workers)
    }
    sup = stack(t, run, "superlinear")
    own = stack(t, run, "only_a" if run == "a" else "only_b")
    tiny = stack(t, run, "tiny")
    t.thread(MAIN_TID, "main")
    for i, tid in enumerate(workers, 1):
        t.thread(tid, f"pworker-{i}")
    s = superlinear_per_thread
    for step in (1, 2, 3):
        sites = {}
        for tid in workers:
            sites[(lin[tid], tid)] = (2000 * min(step, 2), min(step, 2), 0, 0)
            freed = s // 2 if free_superlinear and step == 3 else 0
            sites[(sup, tid)] = (s // 2 * min(step, 2), min(step, 2), freed, 1 if freed else 0)
        sites[(own, MAIN_TID)] = (3000, 3, 0, 0) if run == "a" else (5000, 5, 0, 0)
        sites[(tiny, MAIN_TID)] = (10, 1, 0, 0) if run == "a" else (100, 1, 0, 0)
        t.interval(sites, rss=(100 + 10 * step) << 20 if run == "a" else (120 + 10 * step) << 20)
    return t.close()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    a = run_trace(d / "pw10.allocscope", 10, "a", 4242, 0x1000, 1000)
    b = run_trace(d / "pw12.allocscope", 12, "b", 5151, 0x77000, 2500, free_superlinear=True)
    return a, b


@pytest.fixture(scope="module")
def traces(paths):
    return load_trace(paths[0]), load_trace(paths[1])


@pytest.fixture(scope="module")
def doc(traces):
    return D.diff_traces(*traces, per="pw")


def by_fn(doc: dict) -> dict[str, dict]:
    return {s["frames"][0]["function"]: s for s in doc["sites"]}


# Ground truth per site (A peak, B peak, A live, B live):
#   linear      10 x 4000 = 40000   12 x 4000 = 48000   (scales with pw: ratio 1.2)
#   superlinear 10 x 1000 = 10000   12 x 2500 = 30000   B live 12 x 1250 = 15000 (ratio 3.0)
#   only_a      3000 -> 0;  only_b 0 -> 5000;  tiny 10 -> 100 (ratio 10, but only 90 bytes)
# Sum of |delta| = 8000 + 20000 + 3000 + 5000 + 90 = 36090; 1% = 360.9.


def test_traces_really_differ_in_ids_addresses_and_pids(traces):
    a, b = traces
    assert set(a.stacks["stack_id"]).isdisjoint(set(b.stacks["stack_id"]))
    assert set(a.stacks["ip"]).isdisjoint(set(b.stacks["ip"]))
    assert a.meta["target"]["pid"] != b.meta["target"]["pid"]
    assert b.stacks[b.stacks["function"] == "linear"]["stack_id"].nunique() == 2


def test_sites_match_by_frames_and_sort_by_abs_delta(doc):
    fns = [s["frames"][0]["function"] for s in doc["sites"]]
    assert fns == ["superlinear", "linear", "only_b", "only_a", "tiny"]
    assert [s["delta_bytes"] for s in doc["sites"]] == [20000, 8000, 5000, -3000, 90]
    lin = by_fn(doc)["linear"]
    assert (lin["a_peak_live_bytes"], lin["b_peak_live_bytes"], lin["in"]) == (40000, 48000, "both")
    assert lin["frames"] == [
        {"function": "linear", "module": "provingd", "file": "linear.c", "line": 10},
        {"function": "worker_main", "module": "provingd", "file": "worker.c", "line": 99},
        {"function": "start_thread", "module": "provingd", "file": "pthread.c", "line": 400},
    ]


def test_site_values(doc):
    s = by_fn(doc)
    sup = s["superlinear"]
    assert (sup["a_peak_live_bytes"], sup["b_peak_live_bytes"], sup["a_live_bytes"], sup["b_live_bytes"]) == (
        10000,
        30000,
        10000,
        15000,
    )
    assert (sup["live_delta_bytes"], sup["a_alloc_bytes"], sup["b_alloc_bytes"], sup["alloc_delta_bytes"]) == (
        5000,
        10000,
        30000,
        20000,
    )
    assert (sup["a_alloc_count"], sup["b_alloc_count"], sup["alloc_count_delta"]) == (20, 24, 4)
    assert sup["ratio"] == 3.0
    assert (sup["a_verdict"], sup["b_verdict"]) == ("new", "new")  # 3 intervals: too few to judge
    assert (s["only_b"]["in"], s["only_b"]["ratio"], s["only_b"]["a_verdict"]) == ("b", None, None)
    assert (s["only_a"]["in"], s["only_a"]["ratio"], s["only_a"]["b_peak_live_bytes"]) == ("a", 0.0, 0)
    assert s["tiny"]["ratio"] == 10.0


def test_normalization_flags_out_of_proportion_sites(doc):
    assert doc["per"]["label"] == "pw"
    assert (doc["per"]["a"], doc["per"]["b"], doc["per"]["expected_ratio"]) == (10.0, 12.0, 1.2)
    s = by_fn(doc)
    lin, sup = s["linear"], s["superlinear"]
    assert lin["scaling"] == pytest.approx(1.0) and lin["flagged"] is False
    assert (lin["expected_b_peak_live_bytes"], lin["excess_bytes"]) == (48000, 0)
    assert sup["scaling"] == pytest.approx(2.5) and sup["flagged"] is True  # 3.0 / 1.2
    assert (sup["expected_b_peak_live_bytes"], sup["excess_bytes"]) == (12000, 18000)
    assert s["only_b"]["flagged"] is True and s["only_b"]["scaling"] is None  # new in B: infinite
    assert s["tiny"]["flagged"] is False  # 10 / 1.2 out of proportion, but 90 B < 1% of 36090 B
    assert s["only_a"]["flagged"] is False
    assert doc["totals"]["expected_b_peak_live_bytes"] == round(53010 * 1.2)


def test_without_per_nothing_is_flagged(traces):
    doc = D.diff_traces(*traces)
    assert doc["per"] is None
    assert not any(s["flagged"] for s in doc["sites"])
    assert all(s["scaling"] is None and s["excess_bytes"] is None for s in doc["sites"])


@pytest.mark.parametrize(
    "sort,order",
    [
        ("delta", ["superlinear", "linear", "only_b", "only_a", "tiny"]),
        ("live", ["linear", "superlinear", "only_b", "only_a", "tiny"]),  # 8000, 5000 = 5000 (B peak), 3000, 90
        ("alloc", ["superlinear", "linear", "only_b", "only_a", "tiny"]),  # 20000, 8000, 5000, 3000, 90
        ("ratio", ["only_b", "tiny", "superlinear", "linear", "only_a"]),  # inf, 10, 3, 1.2, 0
        ("excess", ["superlinear", "only_b", "only_a", "tiny", "linear"]),  # 18000, 5000, 3600, 88, 0
    ],
)
def test_sorts(traces, sort, order):
    doc = D.diff_traces(*traces, per="pw", sort=sort)
    assert [s["frames"][0]["function"] for s in doc["sites"]] == order


def test_thread_groups(doc):
    g = {x["group"]: x for x in doc["thread_groups"]}
    assert set(g) == {"pworker-N", "main"}
    w = g["pworker-N"]
    assert (w["a_threads"], w["b_threads"]) == (10, 12)
    # A: linear 40000 + superlinear 10000. B: live 48000 + 15000; peak at interval 2: 48000 + 30000.
    assert (w["a_live_bytes"], w["b_live_bytes"], w["a_peak_live_bytes"], w["b_peak_live_bytes"]) == (
        50000,
        63000,
        50000,
        78000,
    )
    assert (w["peak_delta_bytes"], w["live_delta_bytes"]) == (28000, 13000)
    m = g["main"]
    assert (m["a_threads"], m["a_live_bytes"], m["b_live_bytes"], m["peak_delta_bytes"]) == (1, 3010, 5100, 2090)
    assert [x["group"] for x in doc["thread_groups"]] == ["pworker-N", "main"]


def test_totals(doc):
    t = doc["totals"]
    assert (t["a"]["peak_live_bytes"], t["b"]["peak_live_bytes"], t["delta"]["peak_live_bytes"]) == (
        53010,
        83100,
        30090,
    )
    assert (t["a"]["live_bytes"], t["b"]["live_bytes"]) == (53010, 68100)
    assert (t["a"]["peak_rss_bytes"], t["b"]["peak_rss_bytes"]) == (130 << 20, 150 << 20)
    assert t["delta"]["rss_bytes"] == 20 << 20


def test_json_contract(doc):
    assert doc["schema"] == "allocscope.diff/1"
    assert doc["a"] == {"pw": "10", "host": "lab1"}  # "a": {labels}
    assert doc["b"] == {"pw": "12", "host": "lab1"}
    assert {"totals", "sites", "a", "b"} <= set(doc)
    ta = doc["traces"]["a"]
    assert (ta["pid"], ta["comm"], ta["exe"], ta["complete"], ta["labels"]) == (
        4242,
        "provingd",
        "/opt/provingd/bin/provingd",
        True,
        doc["a"],
    )
    assert doc["traces"]["b"]["pid"] == 5151
    for s in doc["sites"]:
        assert {"frames", "a_peak_live_bytes", "b_peak_live_bytes", "delta_bytes"} <= set(s)
        assert s["delta_bytes"] == s["b_peak_live_bytes"] - s["a_peak_live_bytes"]
    assert doc["warnings"] == []
    json.loads(to_json(doc))


def test_same_function_on_another_line_does_not_match(tmp_path):
    def one(name, line, seed):
        t = SynthTrace(tmp_path / name, id_base=seed)
        s = t.stack(["alloc_buf", "main"], ["buf.c", "main.c"], [line, 5])
        t.interval({(s, 1): (100, 1, 0, 0)})
        return load_trace(t.close())

    doc = D.diff_traces(one("x", 10, 1), one("y", 11, 99))
    # |delta| 100 both; the tie goes to the larger B peak.
    assert [(s["in"], s["frames"][0]["line"], s["delta_bytes"]) for s in doc["sites"]] == [
        ("b", 11, 100),
        ("a", 10, -100),
    ]


def test_different_programs_warn(tmp_path, traces):
    other = run_trace(tmp_path / "other", 10, "a", 77, 0x5000, 1000, exe="/usr/bin/otherd")
    doc = D.diff_traces(traces[0], load_trace(other))
    assert doc["warnings"] == [
        ("A and B are different programs (provingd vs otherd): only sites with the same symbolized frames match")
    ]
    assert "warning: A and B are different programs" in diff_to_text(doc)


def test_losses_and_incomplete_traces_warn(tmp_path, traces):
    t = SynthTrace(tmp_path / "lossy")
    t.interval({}, lost={"lost_ring_full": 4})
    doc = D.diff_traces(traces[0], load_trace(t.close(complete=False)))
    assert doc["warnings"] == [
        "A and B are different programs (provingd vs synthd): only sites with the same symbolized frames match",
        "B: trace is incomplete (recording was interrupted); read up to +1.0 s, its last snapshot",
        "B lost events, its numbers are lower bounds: lost_ring_full=4: the event ring overflowed: some "
        "mmap/munmap/thread events are missing",
    ]
    assert doc["totals"]["b"]["lost_events"] == 4 and doc["traces"]["b"]["complete"] is False


def test_per_label_errors(tmp_path, traces):
    bad = SynthTrace(tmp_path / "bad", labels={"pw": "twelve"})
    bad.interval({})
    bad = load_trace(bad.close())
    with pytest.raises(UsageError, match=r"trace A \(.*\) has no label cores \(its labels: host=lab1, pw=10\)"):
        D.diff_traces(traces[0], traces[0], per="cores")
    with pytest.raises(UsageError, match="trace B has pw='twelve', not a number"):
        D.diff_traces(traces[0], bad, per="pw")
    with pytest.raises(UsageError, match="--sort excess needs --per"):
        D.diff_traces(*traces, sort="excess")


def test_dataframe_api(traces):
    a, b = (D.summarize(t) for t in traces)
    df = D.diff_sites(a, b, per="pw")
    assert list(df.columns) == D.SITE_DIFF_COLUMNS
    assert df["flagged"].tolist() == [True, False, True, False, False]
    assert math.isinf(df.loc[df["in"] == "b", "ratio"].iloc[0])
    assert list(D.diff_thread_groups(a, b)["group"]) == ["pworker-N", "main"]
    # The per-trace numbers are analysis.rank_sites over the matched frames.
    ranked = A.rank_sites(traces[1], D.normalize_stacks(A.symbolize_stacks(traces[1])))
    assert sorted(ranked["peak_live_bytes"]) == sorted(df.loc[df["in"] != "a", "b_peak_live_bytes"])


def test_text(doc):
    text = diff_to_text(doc, top=3)
    lines = text.splitlines()
    assert (
        lines[0] == "allocscope diff — A: provingd pid 4242 [host=lab1 pw=10]  vs  B: provingd pid 5151 "
        "[host=lab1 pw=12]"
    )
    assert "a location scaling linearly has B/A = 12/10 = 1.20" in text
    head = lines.index(next(ln for ln in lines if ln.startswith("Top ")))
    assert lines[head] == "Top 3 of 5 locations, 2 flagged first, then by |peak delta|"
    rows = lines[head + 3 : head + 6]
    # Flagged first (superlinear, only_b), then by |delta| (linear).
    assert [r.split()[-2] for r in rows] == ["superlinear.c:20", "only_b.c:40", "linear.c:10"]
    assert [r.split()[:2] for r in rows] == [["!", "1"], ["!", "2"], ["3", "39.1"]]
    assert "+19.5 KiB" in rows[0] and "3.00x" in rows[0] and "2.50x" in rows[0] and "new" in rows[1]
    assert "pworker-N" in text


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_text_and_json(paths, tmp_path):
    r = CliRunner().invoke(diff, [*paths, "--per", "pw", "--top", "2"])
    assert r.exit_code == 0, r.output
    assert "[host=lab1 pw=10]" in r.stdout and "[host=lab1 pw=12]" in r.stdout
    assert "Top 2 of 5 locations, 2 flagged first" in r.stdout
    out = tmp_path / "d.json"
    r = CliRunner().invoke(diff, [*paths, "--format", "json", "--sort", "ratio", "-o", str(out)])
    assert r.exit_code == 0 and r.stdout == ""
    doc = json.loads(out.read_text())
    assert doc["schema"] == "allocscope.diff/1" and doc["sort"] == "ratio"
    assert doc["sites"][0]["frames"][0]["function"] == "only_b"


def test_cli_missing_trace(paths, tmp_path):
    r = CliRunner().invoke(diff, [paths[0], str(tmp_path / "nope")])
    one_line_error(r, f"no such trace: {tmp_path / 'nope'}", code=5)


def test_cli_corrupt_trace(paths, tmp_path):
    bad = tmp_path / "bad.allocscope"
    os.mkdir(bad)
    (bad / "meta.json").write_text("{not json")
    r = CliRunner().invoke(diff, [str(bad), paths[1]])
    one_line_error(r, "meta.json is corrupt", code=5)


def test_cli_bad_per(paths):
    r = CliRunner().invoke(diff, [*paths, "--per", "cores"])
    one_line_error(r, "has no label cores", code=2)


def test_cli_unwritable_output(paths, tmp_path):
    r = CliRunner().invoke(diff, [*paths, "-o", str(tmp_path / "no" / "such" / "dir.json")])
    one_line_error(r, "cannot write", code=6)  # README: 6 output


def test_cli_sorts_match_library():
    assert cmd_diff.SORTS == D.DIFF_SORTS
