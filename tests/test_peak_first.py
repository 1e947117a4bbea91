"""Reports lead with the peak when most of it was freed by the end (issue 14): the text and HTML
reports show the sites that held the peak first, the HTML flame graph opens "at the peak", and
the JSON keeps its order (sites by live bytes, as --sort says).

Ground truth (intervals of 1 s; live bytes at the end of each; P = 8 MiB + 1):

    site (innermost, after folding)  tid  source  seq 1   2        3          4         5        6
    synthesize_partition             201  heap    P       P        2P         P         0        0
    synthesize_partition             202  heap    0       P        P          0         0        0
    append_log_record                203  heap    0       40000    72000      120000    0        0
    scratch                          1    heap    0       0        0          0         5 MiB    0
    _dl_map_segments (ld.so, mmap)   1    mmap    53248   ...................................... 53248
    _dl_allocate_tls_storage (ld.so) 1    heap    12288   ...................................... 12288

Live total: 65536 + P, 65536 + 2P + 40000, 65536 + 3P + 72000 (the peak, seq 3),
65536 + P + 120000, 65536 + 5 MiB, 65536 (the end: 0.3% of the peak).
"""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from click.testing import CliRunner
from synth import SynthTrace

from allocscope.cli.app import main
from reports import analysis as A
from reports.render.html import flame_data, flame_tree, site_chart_data, to_html
from reports.render.text import to_text
from reports.trace import load_trace

P = (8 << 20) + 1
LOADER, TLS = 53248, 12288
PEAK_SEQ, PEAK_TOTAL, END_TOTAL = 3, LOADER + TLS + 3 * P + 72000, LOADER + TLS
LD = "/lib64/ld-linux-x86-64.so.2"


def _build(path) -> str:
    t = SynthTrace(path, exe="/usr/bin/provingd")
    part = t.stack(["malloc", "synthesize_partition", "partition_worker", "start_thread"])
    log = t.stack(["malloc", "append_log_record", "gpu_thread", "start_thread"])
    scratch = t.stack(["malloc", "scratch", "main"])
    loader = t.stack(["mmap", "_dl_map_segments", "_dl_map_object", "dl_main"], module=LD)
    tls = t.stack(["malloc", "_dl_allocate_tls_storage", "init_tls", "dl_main"], module=LD)
    for tid, name in ((1, "provingd"), (201, "pworker-1"), (202, "pworker-2"), (203, "gpu")):
        t.thread(tid, name)
    t.interval({(part, 201): (P, 1, 0, 0), (loader, 1, "mmap"): (LOADER, 1, 0, 0), (tls, 1): (TLS, 1, 0, 0)})
    t.interval({(part, 202): (P, 1, 0, 0), (log, 203): (40000, 10, 0, 0)})
    t.interval({(part, 201): (2 * P, 2, 0, 0), (log, 203): (72000, 18, 0, 0)})
    t.interval({(part, 201): (2 * P, 2, P, 1), (part, 202): (P, 1, P, 1), (log, 203): (120000, 30, 0, 0)})
    t.interval(
        {(part, 201): (2 * P, 2, 2 * P, 2), (log, 203): (120000, 30, 120000, 30), (scratch, 1): (5 << 20, 1, 0, 0)}
    )
    t.interval({(scratch, 1): (5 << 20, 1, 5 << 20, 1)})
    return t.close()


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return _build(tmp_path_factory.mktemp("peak") / "bug.allocscope")


@pytest.fixture(scope="module")
def trace(path):
    return load_trace(path)


@pytest.fixture(scope="module")
def stacks(trace):
    return A.symbolize_stacks(trace)


@pytest.fixture(scope="module")
def doc(trace, stacks):
    return A.build_report(trace, stacks=stacks)


def fn(site: dict) -> str:
    return site["frames"][0]["function"]


def test_peak_interval_and_rule(trace, doc):
    assert A.peak_seq(trace) == PEAK_SEQ
    assert doc["totals"]["peak_live_bytes"] == PEAK_TOTAL and doc["totals"]["live_bytes"] == END_TOTAL
    assert doc["at_peak"] == {
        "seq": PEAK_SEQ,
        "elapsed_s": 3.0,
        "live_bytes": PEAK_TOTAL,
        "peak_first": True,
        "max_fraction": 0.25,
        "peak_snapshot": False,
        "margin_bytes": 0,
    }
    # The rule at its boundary: live at the end <= 25% of the peak.
    assert A.peak_first({"live_bytes": 25, "peak_live_bytes": 100})
    assert not A.peak_first({"live_bytes": 26, "peak_live_bytes": 100})
    assert not A.peak_first({"live_bytes": 0, "peak_live_bytes": 0})


def test_json_keeps_its_order_and_adds_the_peak(doc):
    # Sites by live bytes at the end (ties by peak, then allocated), exactly as before.
    assert [(fn(s), s["rank"], s["live_bytes"], s["peak_live_bytes"]) for s in doc["sites"]] == [
        ("_dl_map_segments", 1, LOADER, LOADER),
        ("_dl_allocate_tls_storage", 2, TLS, TLS),
        ("synthesize_partition", 3, 0, 3 * P),
        ("scratch", 4, 0, 5 << 20),
        ("append_log_record", 5, 0, 120000),
    ]
    assert doc["sort"] == "live"
    # Bytes each held at the moment of the peak, and the order the people-facing reports use.
    assert {fn(s): (s["at_peak_bytes"], s["at_peak_rank"]) for s in doc["sites"]} == {
        "synthesize_partition": (3 * P, 1),
        "append_log_record": (72000, 2),
        "_dl_map_segments": (LOADER, 3),
        "_dl_allocate_tls_storage": (TLS, 4),
        "scratch": (0, 5),
    }
    assert sum(s["at_peak_bytes"] for s in doc["sites"]) == PEAK_TOTAL


def test_text_leads_with_the_peak(doc):
    text = to_text(doc, top=3)
    lines = text.splitlines()
    assert "live 64.0 KiB is 0.3% of the 24.1 MiB peak (<= 25%)" in text
    head = lines.index("Held at the peak (3.0s, live 24.1 MiB): top 3 of 4 locations by bytes live at that moment")
    rows = [ln.split() for ln in lines[head + 3 : head + 6]]
    assert [(r[0], r[1] + " " + r[2], r[3], r[-2]) for r in rows] == [
        ("1", "24.0 MiB", "99.5%", "synthesize_partition"),
        ("2", "70.3 KiB", "0.3%", "append_log_record"),
        ("3", "52.0 KiB", "0.2%", "_dl_map_segments"),
    ]
    assert lines[head + 6] == ""
    # The details follow the same order; the live-at-the-end table comes after, in its own order.
    assert lines[head + 7] == "#1 24.0 MiB at the peak  (its own peak 24.0 MiB, live at the end 0 B)"
    end = lines.index("Top 3 of 5 locations by live bytes at the end")
    assert end > head + 7
    assert [ln.split()[-2] for ln in lines[end + 3 : end + 6]] == [
        "_dl_map_segments",
        "_dl_allocate_tls_storage",
        "synthesize_partition",
    ]
    # The first site row anywhere in the report is the partition pile-up.
    first_row = next(ln for ln in lines if re.match(r"^\s+1\s", ln))
    assert "synthesize_partition" in first_row


def test_text_without_a_freed_peak_is_unchanged(tmp_path):
    t = SynthTrace(tmp_path / "held.allocscope")
    a, b = t.stack(["malloc", "keep", "main"]), t.stack(["malloc", "spike", "main"])
    t.interval({(a, 1): (1001, 1, 0, 0), (b, 1): (3000, 1, 0, 0)})
    t.interval({(b, 1): (3000, 1, 3000, 1)})  # end 1001 of peak 4001: just over 25%
    tr = load_trace(t.close())
    doc = A.build_report(tr)
    assert doc["at_peak"]["peak_first"] is False and doc["at_peak"]["seq"] == 1
    text = to_text(doc)
    assert "Held at the peak" not in text and "Top 2 of 2 locations by live bytes\n" in text
    assert flame_data(tr, doc, A.symbolize_stacks(tr))["default"] == "end"


def test_a_peak_no_snapshot_caught_leads_with_nothing(tmp_path):
    """A postgres backend: palloc's blocks come and go between snapshots, so every snapshot has 0 B
    live while the kernel's high-water says 66.8 KiB. The report led with the peak's table anyway:
    "Held at the peak (interval None, live 0 B): top 0 of 0 locations", an empty table."""
    t = SynthTrace(tmp_path / "between.allocscope")
    a = t.stack(["malloc", "palloc", "main"])
    t.interval({(a, 1): (8192, 1, 8192, 1)})
    t.peak_live = 68352  # the kernel's heap high-water, reached between two snapshots
    t.interval({(a, 1): (16384, 2, 16384, 2)})
    doc = A.build_report(load_trace(t.close()))
    assert doc["totals"]["peak_live_bytes"] == 68352 and doc["totals"]["live_bytes"] == 0
    assert doc["at_peak"]["seq"] is None and doc["at_peak"]["peak_first"] is False
    text = to_text(doc)
    assert "Held at the peak" not in text and "interval None" not in text, text


def test_cli_text_report(path):
    r = CliRunner().invoke(main, ["report", path, "--top", "2"])
    assert r.exit_code == 0, r.output
    first_row = next(ln for ln in r.stdout.splitlines() if re.match(r"^\s+1\s", ln))
    assert first_row.split()[1:3] == ["24.0", "MiB"] and "synthesize_partition" in first_row
    js = CliRunner().invoke(main, ["report", path, "--format", "json"])
    assert [fn(s) for s in json.loads(js.stdout)["sites"]][:2] == ["_dl_map_segments", "_dl_allocate_tls_storage"]


# --------------------------------------------------------------------------------------------- html
def test_flame_at_the_peak_is_the_sites_at_the_peak(trace, stacks, doc):
    flame = flame_data(trace, doc, stacks)
    assert flame["default"] == "peak"
    assert flame["views"]["peak"] == {
        "n": "all",
        "v": PEAK_TOTAL,
        "c": [
            {
                "n": "start_thread",
                "v": 3 * P + 72000,
                "c": [
                    {"n": "partition_worker", "v": 3 * P, "c": [{"n": "synthesize_partition", "v": 3 * P}]},
                    {"n": "gpu_thread", "v": 72000, "c": [{"n": "append_log_record", "v": 72000}]},
                ],
            },
            {
                "n": "dl_main",
                "v": LOADER + TLS,
                "c": [
                    {"n": "_dl_map_object", "v": LOADER, "c": [{"n": "_dl_map_segments", "v": LOADER}]},
                    {"n": "init_tls", "v": TLS, "c": [{"n": "_dl_allocate_tls_storage", "v": TLS}]},
                ],
            },
        ],
    }
    # Each leaf is its site's live bytes at the peak interval, as the report computed them.
    leaves = {}

    def walk(n):
        for c in n.get("c", []):
            walk(c) if "c" in c else leaves.__setitem__(c["n"], c["v"])

    walk(flame["views"]["peak"])
    assert leaves == {fn(s): s["at_peak_bytes"] for s in doc["sites"] if s["at_peak_bytes"]}
    assert flame["views"]["end"] == flame_tree(trace, stacks) and flame["views"]["end"]["v"] == END_TOTAL


def test_flame_tree_at_any_interval(trace, stacks):
    assert flame_tree(trace, stacks, at_seq=5) == {
        "n": "all",
        "v": LOADER + TLS + (5 << 20),
        "c": [
            {"n": "main", "v": 5 << 20, "c": [{"n": "scratch", "v": 5 << 20}]},
            {
                "n": "dl_main",
                "v": LOADER + TLS,
                "c": [
                    {"n": "_dl_map_object", "v": LOADER, "c": [{"n": "_dl_map_segments", "v": LOADER}]},
                    {"n": "init_tls", "v": TLS, "c": [{"n": "_dl_allocate_tls_storage", "v": TLS}]},
                ],
            },
        ],
    }


def test_html_leads_with_the_peak(trace, stacks, doc):
    page = to_html(trace, doc, stacks=stacks)
    data = json.loads(
        htmllib.unescape(
            re.search(r'<script type="application/json" id="allocscope-data">(.*?)</script>', page, re.DOTALL).group(1)
        )
    )
    assert data["flame"]["default"] == "peak"
    # The stacked chart's legend: the sites that held the peak, numbered as in the site table.
    assert [s["label"] for s in data["sites"]["series"]] == [
        "#1 synthesize_partition",
        "#2 append_log_record",
        "#3 _dl_map_segments",
        "#4 _dl_allocate_tls_storage",
        "#5 scratch",
    ]
    assert data["sites"]["series"][0]["values"] == [P, 2 * P, 3 * P, P, 0, 0]
    assert (
        "<h2>Locations by bytes held at the peak (3.0s, live 24.1 MiB; live at the end 64.0 KiB: most of the peak "
        "was freed)</h2>" in page
    )
    table = page[page.index('<table class="sites">') :]
    rows = re.findall(r"<tr><td.*?</tr>", table[: table.index("</table>")])
    assert len(rows) == 5
    first = rows[0]
    assert '<td class="num">1</td>' in first and f'title="{3 * P} bytes"' in first and "synthesize_partition" in first
    assert "synthesize_partition" not in rows[1] and "append_log_record" in rows[1]
    assert 'data-view="peak">at the peak (3.0s, live 24.1 MiB)</button>' in page
    assert 'data-view="end">at the end (live 64.0 KiB)</button>' in page


def test_html_order_without_a_freed_peak(trace, stacks, doc):
    held = dict(doc, at_peak={**doc["at_peak"], "peak_first": False})
    labels = [s["label"] for s in site_chart_data(trace, held, stacks)["series"]]
    assert labels == [
        "#1 _dl_map_segments",
        "#2 _dl_allocate_tls_storage",
        "#3 synthesize_partition",
        "#4 scratch",
        "#5 append_log_record",
    ]
    assert flame_data(trace, held, stacks)["default"] == "end"
    assert "<h2>Locations by live bytes</h2>" in to_html(trace, held, stacks=stacks)


def test_peak_snapshot_row(tmp_path):
    """A peak snapshot (tracer/record/peaks.py) between two interval snapshots: the reports take the
    peak there (at_peak, the location's peak, the flame graph), and it is no interval."""
    t = SynthTrace(tmp_path / "snap.allocscope")
    a = [t.stack(["malloc", "alloc_fn", f"caller{i}", "start_thread"]) for i in range(4)]
    keep = t.stack(["malloc", "keep", "main"])
    t.interval({(keep, 1): (1000, 1, 0, 0)})
    t.interval({(a[i], 10 + i): (P, 1, 0, 0) for i in range(4)}, peak_snapshot=True)
    t.interval({(a[i], 10 + i): (P, 1, P, 1) for i in range(4)})
    tr = load_trace(t.close())
    doc = A.build_report(tr)
    assert doc["totals"]["intervals"] == 2 and doc["totals"]["peak_snapshots"] == 1
    assert doc["totals"]["peak_margin_bytes"] == max((4 * P + 1000) // 100, 1 << 20)
    assert doc["at_peak"]["seq"] == 2 and doc["at_peak"]["peak_snapshot"] is True
    assert doc["at_peak"]["live_bytes"] == 4 * P + 1000
    [loc] = [x for x in doc["locations"] if x["function"] == "alloc_fn"]
    assert (loc["peak_live_bytes"], loc["at_peak_bytes"], loc["at_peak_rank"], loc["n_stacks"]) == (4 * P, 4 * P, 1, 4)
    assert "a peak snapshot within 1.0 MiB of the high-water mark" in to_text(doc)
    assert flame_data(tr, doc, A.symbolize_stacks(tr))["views"]["peak"]["v"] == 4 * P + 1000
