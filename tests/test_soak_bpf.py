"""The CI form of bench/soak.py: ~45 s of redis-benchmark against a recorded redis-server.
The tracer's RSS stays flat after warm-up and its BPF maps hold no more than the live set;
the full 30-minute soak and its figures are in README ("Limits and guarantees")."""
from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import IN_CI, ROOT

pytestmark = pytest.mark.bpf

DURATION, SAMPLE, WARMUP, KEYSPACE, REQUESTS = 45, 2, 15, 2000, 2000


def _soak_module():
    spec = importlib.util.spec_from_file_location("allocscope_soak", ROOT / "bench" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def soak(tmp_path_factory) -> dict:
    mod = _soak_module()
    try:
        mod.ensure_redis()
    except Exception as e:  # noqa: BLE001
        if IN_CI:
            pytest.fail(f"CI=true but redis-server cannot be installed: {e}")
        pytest.skip(f"no redis-server: {e}")
    s = mod.soak(DURATION, SAMPLE, WARMUP, REQUESTS, KEYSPACE, tmp_path_factory.mktemp("soak"), progress=print)
    print(json.dumps({k: v for k, v in s.items() if k != "samples"}, indent=1))
    return s


def test_soak_recording_finishes(soak):
    assert soak["tracer_exit"] == 0, soak["tracer_stderr"]
    assert "(SIGINT)" in soak["tracer_summary"] and "lost 0" in soak["tracer_summary"], soak["tracer_summary"]
    assert soak["benchmark_rounds"] >= 1
    assert soak["trace_mib"] > 0


def test_soak_tracer_rss_flat_after_warmup(soak):
    assert soak["tracer_rss_growth_after_warmup_mib"] < 16, [round(s["tracer_rss"] / 2**20, 1) for s in soak["samples"]]
    assert soak["tracer_rss_last_mib"] < 512


def test_soak_maps_bounded_by_the_live_set(soak):
    last = soak["maps_last"]
    mx = soak["maps_max"]
    assert mx["sysargs"] <= 8, mx  # redis has a handful of threads
    assert mx["stacks"] <= 2000 and mx["sites"] <= 4000 and mx["flows"] <= 64, mx
    after = [s["maps"]["live"] for s in soak["samples"] if s["t_s"] >= WARMUP]
    assert after and last["live"] <= 2 * after[0] + 20000, after  # follows redis' bounded key space
    assert mx["live"] <= 200 * KEYSPACE, mx
