"""reports.analysis.invariants: no part larger than the whole. The checks on documents that break
each rule once, the report's own record of a violation, and the test suite's strict mode
(conftest sets ALLOCSCOPE_INVARIANTS=fail, so every report a test builds is checked)."""

from __future__ import annotations

import copy
import os

import pytest
from synth import SynthTrace

from reports.analysis import build_report
from reports.analysis.invariants import STRICT_ENV, InvariantError, check_report, report_violations
from reports.render.text import to_text
from reports.trace import load_trace

MIB = 1 << 20

GOOD = {
    "totals": {"rss_bytes": 20 * MIB},
    "rss_decomposition": {
        "rss_bytes": 20 * MIB,
        "live_heap_bytes": 10 * MIB,
        "live_before_attach_bytes": 1 * MIB,
        "retained_bytes": 2 * MIB,
        "other_anon_bytes": 3 * MIB,
        "file_bytes": 4 * MIB,
        "shmem_bytes": 0,
        "sum_bytes": 20 * MIB,
        "allocator_resident_bytes": 13 * MIB,
        "allocators": [
            {
                "name": "glibc",
                "resident": 13 * MIB,
                "live": 10 * MIB,
                "live_before_attach": 1 * MIB,
                "retained": 2 * MIB,
            }
        ],
    },
    "arenas": [{"id": "main", "resident_bytes": 13 * MIB, "retained_bytes": 2 * MIB, "live_before_bytes": 1 * MIB}],
    "findings": [{"text": "glibc keeps 2.0 MiB resident that is not live (10.0% of RSS 20.0 MiB)."}],
}


def test_a_consistent_report_passes():
    assert report_violations(GOOD) == []


def _broken(edit) -> list[str]:
    doc = copy.deepcopy(GOOD)
    edit(doc)
    return report_violations(doc)


def test_each_rule_catches_its_part():
    """The issue's trim case, piece by piece: an arena claiming 146.5 MiB of a 16.9 MiB RSS."""

    def arena(d):
        d["arenas"][0].update(resident_bytes=153632768, retained_bytes=138 * MIB)

    def alloc(d):
        d["rss_decomposition"]["allocators"][0].update(resident=153632768, retained=138 * MIB)

    def split(d):
        d["rss_decomposition"]["other_anon_bytes"] = 30 * MIB
        d["rss_decomposition"]["sum_bytes"] = 47 * MIB

    def share(d):
        d["findings"][0]["text"] = "glibc keeps 131.9 MiB resident that is not live (780.3% of RSS 16.9 MiB)."

    assert any(v.startswith("arenas: resident 146.5 MiB > RSS 20.0 MiB") for v in _broken(arena))
    assert _broken(lambda d: d["arenas"][0].update(retained_bytes=13 * MIB)) == [
        "arena main: retained + live before the attach 14.0 MiB > its resident 13.0 MiB"
    ]
    assert _broken(alloc)[0] == "glibc resident 146.5 MiB > RSS 20.0 MiB"
    assert any("other_anon_bytes" in v for v in _broken(split))
    assert any("the parts sum to 47.0 MiB" in v for v in _broken(split))
    assert _broken(share) == ["finding 1 states a share over 100 %: 780.3%"]


def test_a_violation_is_a_warning_or_in_strict_mode_a_failure(monkeypatch):
    doc = copy.deepcopy(GOOD)
    doc["findings"][0]["text"] = "x held 9.0 MiB (100.7%)."
    doc["recording"] = {"warnings": ["older"]}
    monkeypatch.delenv(STRICT_ENV, raising=False)
    assert check_report(doc) == ["finding 1 states a share over 100 %: 100.7%"]
    assert doc["recording"]["invariants"] == ["finding 1 states a share over 100 %: 100.7%"]
    assert doc["recording"]["warnings"] == ["older", "report check: finding 1 states a share over 100 %: 100.7%"]
    monkeypatch.setenv(STRICT_ENV, "fail")
    with pytest.raises(InvariantError, match="100.7%"):
        check_report(copy.deepcopy(GOOD) | {"findings": doc["findings"]})


def test_the_suite_runs_strict():
    assert os.environ.get(STRICT_ENV) == "fail"


def test_build_report_records_and_renders_a_violation(tmp_path, monkeypatch):
    """A trace whose arena table claims more than the RSS: the report keeps going and says so."""
    t = SynthTrace(tmp_path / "t.allocscope")
    t.thread(101, "synthd")
    s = t.stack(["malloc", "fill", "main"], files=[None, "/src/a.c", "/src/a.c"], lines=[None, 3, 9])
    t.interval({(s, 101): (4 * MIB, 4, 0, 0)}, rss=8 * MIB)
    tr = load_trace(t.close())
    doc = build_report(tr)
    assert doc["recording"]["invariants"] == []
    monkeypatch.delenv(STRICT_ENV, raising=False)
    bad = copy.deepcopy(doc)
    bad["findings"].append({"text": "made up (250.0% of RSS)", "table": "Totals"})
    check_report(bad)
    text = to_text(bad)
    assert "warning: report check: finding 2 states a share over 100 %: 250.0%" in text
