"""The demo daemon recorded for real: the diff between two pw settings of the buggy daemon puts
the partition-synthesis site first with a peak that grows with pw; the fixed daemon stays
bounded by pw+2 partitions."""
from __future__ import annotations

import pytest

from allocscope.demo import run_demo

pytestmark = pytest.mark.bpf
MIB8 = 8 << 20


def test_demo_finds_the_pile_up(tmp_path):
    res = run_demo(tmp_path / "demo", pw_a=2, pw_b=3, partitions=30)
    diff = res["diff"]
    assert diff["schema"] == "allocscope.diff/1"
    assert diff["a"]["pw"] == "2" and diff["b"]["pw"] == "3"
    first = diff["sites"][0]
    assert first["frames"][0]["function"] == "synthesize_partition"
    assert first["b_peak_live_bytes"] > first["a_peak_live_bytes"] > 0
    assert first["delta_bytes"] == first["b_peak_live_bytes"] - first["a_peak_live_bytes"]
    peaks = res["peaks"]
    assert peaks["bug_b"] > (3 + 2) * MIB8          # the pile-up: beyond what the permits should allow
    assert peaks["fixed_b"] <= (3 + 2) * MIB8       # fixed: at most pw + 2 partitions
    assert peaks["fixed_b"] >= MIB8
    html = res["html"].read_text()
    assert "synthesize_partition" in html and "<script" in html
