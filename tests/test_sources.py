"""Sources kept apart in reports: totals.by_source (with each source's layer), and --source on
report and diff, against a synthetic trace with known figures per source."""

from __future__ import annotations

import json

from support import cli, one_line_error
from synth import SynthTrace

RJ = "heap:jemalloc:_rjem_"


def _trace(path, scale: int = 1) -> str:
    t = SynthTrace(path)
    a = t.stack(["load_config", "main"])
    b = t.stack(["rust_vec_push", "worker"])
    c = t.stack(["pool_objects", "worker"])
    d = t.stack(["map_buffers", "worker"])
    t.interval(
        {
            (a, 1, "heap"): (1000 * scale, 2, 0, 0),
            (b, 2, RJ): (8192 * scale, 4, 4096, 2),
            (c, 2, "custom:pool_get"): (600 * scale, 3, 200, 1),
            (d, 2, "mmap"): (4096 * scale, 1, 0, 0),
        }
    )
    return t.close()


def test_totals_by_source_with_layers(tmp_path):
    doc = json.loads(cli("report", _trace(tmp_path / "a.allocscope"), "--format", "json", check=True).stdout)
    by = doc["totals"]["by_source"]
    assert by == {
        "custom:pool_get": {
            "layer": "custom",
            "live_bytes": 400,
            "live_count": 2,
            "alloc_bytes": 600,
            "alloc_count": 3,
        },
        "heap": {"layer": "heap", "live_bytes": 1000, "live_count": 2, "alloc_bytes": 1000, "alloc_count": 2},
        RJ: {"layer": "heap", "live_bytes": 4096, "live_count": 2, "alloc_bytes": 8192, "alloc_count": 4},
        "mmap": {"layer": "kernel", "live_bytes": 4096, "live_count": 1, "alloc_bytes": 4096, "alloc_count": 1},
    }


def test_source_filter_on_report_and_diff(tmp_path):
    a = _trace(tmp_path / "a.allocscope")
    b = _trace(tmp_path / "b.allocscope", scale=3)
    doc = json.loads(cli("report", a, "--format", "json", "--source", "heap*", check=True).stdout)
    assert doc["source_filter"] == ["heap*"]
    assert [(s["frames"][0]["function"], s["live_bytes"]) for s in doc["sites"]] == [
        ("rust_vec_push", 4096),
        ("load_config", 1000),
    ]
    text = cli("report", a, "--source", "custom:*,mmap", check=True).stdout
    assert "sites of sources custom:*, mmap only" in text
    assert "pool_objects" in text and "map_buffers" in text and "rust_vec_push" not in text
    d = json.loads(cli("diff", a, b, "--format", "json", "--source", "custom:pool_get", check=True).stdout)
    assert [(s["frames"][0]["function"], s["a_peak_live_bytes"], s["b_peak_live_bytes"]) for s in d["sites"]] == [
        ("pool_objects", 400, 3 * 600 - 200)
    ]


def test_source_filter_errors(tmp_path):
    a = _trace(tmp_path / "a.allocscope")
    one_line_error(cli("report", a, "--source", "cuda-*"), "matches no source", "heap:jemalloc:_rjem_", code=2)
    one_line_error(cli("diff", a, a, "--source", ","), "--source wants", code=2)
