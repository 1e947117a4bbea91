"""Reports of GPU memory on synthetic traces (tests/synth.py): GPU memory (source cuda-device)
never mixes with host figures, pinned and managed host memory are attributed by site, the RSS
split gives RssShmem and the device share of RssFile to their sites, diff and HTML show GPU
memory apart.

Ground truth (final state per (stack, thread, source); MiB = 1 << 20):

    site (innermost)   tid  source         interval 1      interval 2       interval 3 (end)   live at end
    load_batch         201  heap           10000 B/10      -                free 4000 B/4      6000 B / 6
    upload_weights     202  cuda-device    3 x 64 MiB      5 x 64 MiB       free 2 x 64 MiB    192 MiB / 3
    scratch_buffers    202  cuda-device    -               4 x 2 MiB        free all           0
    stage              202  heap           4096 B/1        -                -                  4096 B / 1
    stage              202  cuda-device    1 MiB/1         -                -                  1 MiB / 1
    pin_buffers        203  cuda-pinned    3 x 8 MiB       -                free 8 MiB         16 MiB / 2
    register_buffer    203  cuda-pinned    1 MiB/1 (cuMemHostRegister_v2 of alloc_buffer's block)   1 MiB / 1
    alloc_buffer       203  heap           1 MiB/1         -                -                  1 MiB / 1
    managed_pool       203  cuda-managed   2 x 2 MiB       -                -                  4 MiB / 2
    shm_ring           203  shmem          56 KiB/1        -                -                  56 KiB / 1
    map_dri            201  device         64 KiB/1        -                -                  64 KiB / 1

GPU memory live: 193 MiB, 329 MiB, 193 MiB at the end of intervals 1..3 (peak 329 MiB, 4 blocks
at the end). Host: the rest (CUDA host: pinned 17 MiB with the registration, managed 4 MiB).
RSS at the end: 64 MiB, of which RssShmem 16 MiB + 56 KiB + 3 MiB (mapped before the attach) and
RssFile 10 MiB.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from support import chromium, need_tool
from synth import SynthTrace

from allocscope.cli.app import main
from allocscope.cli.diff import diff
from reports import analysis as A
from reports.analysis.diff import diff_traces
from reports.render.csvout import to_csv
from reports.render.diff_text import diff_to_text
from reports.render.flamegraph import folded_stacks
from reports.render.html import site_chart_data, timeline_data, to_html
from reports.render.pprof import parse_pprof, to_pprof
from reports.render.text import to_text
from reports.trace import load_trace

KIB, MIB = 1 << 10, 1 << 20
HOST_LIVE = 6000 + 4096 + 16 * MIB + MIB + MIB + 4 * MIB + 56 * KIB + 64 * KIB
HOST_COUNT = 6 + 1 + 2 + 1 + 1 + 2 + 1 + 1
DEVICE_LIVE, DEVICE_PEAK = 193 * MIB, 329 * MIB
RSS, SHMEM, FILE = 64 * MIB, 16 * MIB + 56 * KIB + 3 * MIB, 10 * MIB
DRIVER = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"


def build(path, made: int = 5, kept: int = 3, driver: bool = True) -> str:
    """The trace of the module docstring; upload_weights makes `made` blocks of 64 MiB by the
    end of interval 2 and keeps `kept` (another run makes and keeps more)."""
    t = SynthTrace(path, labels={"gpus": "1"})
    st = {
        name: t.stack(frames)
        for name, frames in {
            "load_batch": ["malloc", "load_batch", "main"],
            "upload_weights": ["upload_weights", "gpu_main", "start_thread"],
            "scratch_buffers": ["scratch_buffers", "gpu_main", "start_thread"],
            "stage": ["stage", "gpu_main", "start_thread"],
            "pin_buffers": ["pin_buffers", "io_main", "start_thread"],
            "register_buffer": ["register_buffer", "io_main", "start_thread"],
            "alloc_buffer": ["malloc", "alloc_buffer", "io_main", "start_thread"],
            "managed_pool": ["managed_pool", "io_main", "start_thread"],
            "shm_ring": ["mmap", "shm_ring", "io_main", "start_thread"],
            "map_dri": ["mmap", "map_dri", "main"],
        }.items()
    }
    if driver:
        t.cuda_driver(DRIVER)
    t.thread(201, "main")
    t.thread(202, "gpu-0")
    t.thread(203, "pinner")
    w = 64 * MIB
    t.interval(
        {
            (st["load_batch"], 201): (10000, 10, 0, 0),
            (st["upload_weights"], 202, "cuda-device"): (3 * w, 3, 0, 0),
            (st["stage"], 202): (4096, 1, 0, 0),
            (st["stage"], 202, "cuda-device"): (MIB, 1, 0, 0),
            (st["pin_buffers"], 203, "cuda-pinned"): (24 * MIB, 3, 0, 0),
            (st["register_buffer"], 203, "cuda-pinned"): (MIB, 1, 0, 0),
            (st["alloc_buffer"], 203): (MIB, 1, 0, 0),
            (st["managed_pool"], 203, "cuda-managed"): (4 * MIB, 2, 0, 0),
            (st["shm_ring"], 203, "shmem"): (56 * KIB, 1, 0, 0),
            (st["map_dri"], 201, "device"): (64 * KIB, 1, 0, 0),
        },
        rss=RSS // 2,
    )
    t.interval(
        {
            (st["upload_weights"], 202, "cuda-device"): (made * w, made, 0, 0),
            (st["scratch_buffers"], 202, "cuda-device"): (8 * MIB, 4, 0, 0),
        },
        rss=RSS,
    )
    t.interval(
        {
            (st["load_batch"], 201): (10000, 10, 4000, 4),
            (st["upload_weights"], 202, "cuda-device"): (made * w, made, (made - kept) * w, made - kept),
            (st["scratch_buffers"], 202, "cuda-device"): (8 * MIB, 4, 8 * MIB, 4),
            (st["pin_buffers"], 203, "cuda-pinned"): (24 * MIB, 3, 8 * MIB, 1),
        },
        rss=RSS,
        shmem=SHMEM,
        file=FILE,
    )
    t.live_block(st["register_buffer"], 203, MIB, at_s=0.5, source="cuda-pinned", api="cu_host_register")
    t.live_block(st["alloc_buffer"], 203, MIB, at_s=0.4)
    for _ in range(2):
        t.live_block(st["pin_buffers"], 203, 8 * MIB, at_s=0.3, source="cuda-pinned", api="cu_host_alloc")
    # another row group, with its own dictionary of api names (as the tracer's streamed chunks)
    t.live_blocks(st["load_batch"], 201, [1000] * 6, at_s=0.2)
    return t.close()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return load_trace(build(tmp_path_factory.mktemp("gpu") / "a.allocscope"))


@pytest.fixture(scope="module")
def report(trace):
    return A.build_report(trace)


def by_fn(doc: dict) -> dict[str, dict]:
    return {s["frames"][0]["function"]: s for s in doc["sites"]}


def fn_of_rank(doc: dict, ranks: list[int]) -> list[str]:
    names = {s["rank"]: s["frames"][0]["function"] for s in doc["sites"]}
    return [names[r] for r in ranks]


# --------------------------------------------------------------------------------------------- totals
def test_totals_keep_gpu_memory_apart(report):
    tot = report["totals"]
    assert (tot["live_bytes"], tot["live_count"]) == (HOST_LIVE, HOST_COUNT)  # no GPU byte, no GPU block
    assert tot["peak_live_bytes"] == 10000 + 4096 + 30 * MIB + 120 * KIB  # intervals 1-2, before the frees
    assert (tot["device_bytes"], tot["device_peak_bytes"], tot["device_count"]) == (DEVICE_LIVE, DEVICE_PEAK, 4)
    assert tot["cuda_host_bytes"] == 21 * MIB  # pinned 16 + registered 1 + managed 4
    assert tot["live_by_source"] == {
        "cuda-device": DEVICE_LIVE,
        "cuda-managed": 4 * MIB,
        "cuda-pinned": 17 * MIB,
        "device": 64 * KIB,
        "heap": 6000 + 4096 + MIB,
        "shmem": 56 * KIB,
    }
    assert sum(s["live_bytes"] for s in report["sites"]) == HOST_LIVE
    assert sum(s["device_live_bytes"] for s in report["sites"]) == DEVICE_LIVE
    assert sum(t["live_bytes"] for t in report["threads"]) == HOST_LIVE
    assert sum(t["device_live_bytes"] for t in report["threads"]) == DEVICE_LIVE


def test_a_trace_without_gpu_columns_has_zero_gpu_totals(trace):
    """Traces recorded before GPU memory was traced have no such interval columns."""
    old = replace(
        trace,
        intervals=trace.intervals.drop(columns=["device_live_bytes", "device_peak_bytes", "cuda_host_live_bytes"]),
    )
    tot = A.totals(old)
    assert (tot["device_bytes"], tot["device_peak_bytes"], tot["cuda_host_bytes"]) == (0, 0, 0)
    assert tot["device_count"] == 4  # from the sites, which still have their GPU rows


# --------------------------------------------------------------------------------------------- sites
def test_sites_carry_gpu_memory_in_their_own_keys(report):
    s = by_fn(report)
    w = s["upload_weights"]
    host = (
        "live_bytes",
        "live_count",
        "peak_live_bytes",
        "alloc_bytes",
        "alloc_count",
        "free_bytes",
        "free_count",
        "at_peak_bytes",
    )
    assert {k: w[k] for k in host} == dict.fromkeys(host, 0)  # device memory is not host memory
    assert {k: w[k] for k in A.DEVICE_SITE_KEYS} == {
        "device_live_bytes": 192 * MIB,
        "device_live_count": 3,
        "device_peak_bytes": 320 * MIB,
        "device_alloc_bytes": 320 * MIB,
        "device_alloc_count": 5,
        "device_free_bytes": 128 * MIB,
        "device_free_count": 2,
    }
    assert (w["sources"], w["live_by_source"], w["timeline"]) == (
        ["cuda-device"],
        {"cuda-device": 192 * MIB},
        [0, 0, 0],
    )
    assert w["verdict"] == "new"  # judged on its GPU memory (not freed: 192 of a 320 MiB peak held), 3 intervals
    assert w["threads"] == [{"tid": 202, "name": "gpu-0", "live_bytes": 0, "device_live_bytes": 192 * MIB}]
    scratch = s["scratch_buffers"]
    assert (scratch["device_live_bytes"], scratch["device_peak_bytes"], scratch["verdict"]) == (0, 8 * MIB, "freed")
    # one stack with host and GPU memory: each in its own keys
    stage = s["stage"]
    assert (stage["live_bytes"], stage["live_count"], stage["peak_live_bytes"], stage["alloc_bytes"]) == (
        4096,
        1,
        4096,
        4096,
    )
    assert (stage["device_live_bytes"], stage["device_live_count"], stage["device_peak_bytes"]) == (MIB, 1, MIB)
    assert stage["sources"] == ["cuda-device", "heap"]
    assert stage["live_by_source"] == {"cuda-device": MIB, "heap": 4096}
    assert stage["threads"] == [{"tid": 202, "name": "gpu-0", "live_bytes": 4096, "device_live_bytes": MIB}]
    pin = s["pin_buffers"]
    assert (pin["live_bytes"], pin["live_count"], pin["peak_live_bytes"], pin["device_live_bytes"]) == (
        16 * MIB,
        2,
        24 * MIB,
        0,
    )
    assert (pin["sources"], pin["live_by_source"]) == (["cuda-pinned"], {"cuda-pinned": 16 * MIB})
    assert (s["managed_pool"]["sources"], s["shm_ring"]["sources"], s["map_dri"]["sources"]) == (
        ["cuda-managed"],
        ["shmem"],
        ["device"],
    )


def test_gpu_block(report):
    g = report["gpu"]
    assert (g["seen"], g["driver"], g["probed"], g["skipped"]) == (
        True,
        DRIVER,
        ["cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostAlloc"],
        {},
    )
    assert fn_of_rank(report, g["device_ranks"]) == ["upload_weights", "stage", "scratch_buffers"]
    assert fn_of_rank(report, g["host_ranks"]) == ["pin_buffers", "managed_pool", "register_buffer"]


def test_gpu_block_without_a_driver(tmp_path):
    """Pinned memory seen only as mappings of /dev/nvidiactl (no driver probed): seen, no driver.
    Shared memory alone is not CUDA memory."""
    t = SynthTrace(tmp_path / "m.allocscope")
    pin, shm = t.stack(["mmap", "map_ctl", "main"]), t.stack(["mmap", "shm_ring", "main"])
    t.interval({(pin, 1, "cuda-pinned"): (2 * MIB, 1, 0, 0), (shm, 1, "shmem"): (MIB, 1, 0, 0)})
    doc = A.build_report(load_trace(t.close()))
    g = doc["gpu"]
    assert (g["seen"], g["driver"], g["probed"], g["device_ranks"]) == (True, None, [], [])
    assert fn_of_rank(doc, g["host_ranks"]) == ["map_ctl"]
    text = to_text(doc)
    assert "[no CUDA driver probed: mappings only]" in text and "CUDA driver" not in text.splitlines()[2]
    t2 = SynthTrace(tmp_path / "s.allocscope")
    t2.interval({(t2.stack(["mmap", "shm_ring", "main"]), 1, "shmem"): (MIB, 1, 0, 0)})
    plain = A.build_report(load_trace(t2.close()))
    assert plain["gpu"] == {
        "seen": False,
        "driver": None,
        "probed": [],
        "skipped": {},
        "device_ranks": [],
        "host_ranks": [],
        "device_location_ranks": [],
        "host_location_ranks": [],
    }
    assert "GPU" not in to_text(plain)


# --------------------------------------------------------------------------------------------- threads
def test_threads_keep_gpu_memory_apart(report):
    th = {t["name"]: t for t in report["threads"]}
    assert th["gpu-0"] == {
        "tid": 202,
        "name": "gpu-0",
        "live_bytes": 4096,
        "live_count": 1,
        "peak_live_bytes": 4096,
        "alloc_bytes": 4096,
        "alloc_count": 1,
        "device_live_bytes": DEVICE_LIVE,
        "device_live_count": 4,
        "device_peak_bytes": DEVICE_PEAK,
        "device_alloc_bytes": 329 * MIB,
        "device_alloc_count": 10,
    }
    pinner = 16 * MIB + MIB + MIB + 4 * MIB + 56 * KIB
    assert (
        th["pinner"]["live_bytes"],
        th["pinner"]["live_count"],
        th["pinner"]["peak_live_bytes"],
        th["pinner"]["device_live_bytes"],
    ) == (pinner, 7, pinner + 8 * MIB, 0)
    assert [t["name"] for t in report["threads"]] == ["pinner", "main", "gpu-0"]  # by host bytes
    groups = {g["group"]: g for g in report["thread_groups"]}
    assert (
        groups["gpu-N"]["live_bytes"],
        groups["gpu-N"]["device_live_bytes"],
        groups["gpu-N"]["device_peak_bytes"],
    ) == (4096, DEVICE_LIVE, DEVICE_PEAK)
    assert groups["pinner"]["device_live_bytes"] == 0


# --------------------------------------------------------------------------------------------- RSS split
def test_rss_split_attributes_shmem_and_device_files(report):
    d = report["rss_decomposition"]
    assert (d["rss_bytes"], d["shmem_bytes"], d["file_bytes"], d["sum_bytes"]) == (RSS, SHMEM, FILE, RSS)
    # the registration pins alloc_buffer's malloc'd block in place: anonymous memory, not shmem
    assert d["shmem_sources"] == {"shmem": 56 * KIB, "cuda-pinned": 16 * MIB}
    assert (d["shmem_attributed_bytes"], d["shmem_unattributed_bytes"]) == (16 * MIB + 56 * KIB, 3 * MIB)
    assert d["file_device_sources"] == {"cuda-managed": 4 * MIB, "device": 64 * KIB}
    assert (d["file_device_bytes"], d["file_regular_bytes"]) == (4 * MIB + 64 * KIB, FILE - 4 * MIB - 64 * KIB)
    said = "16.1 MiB of it at the shmem and cuda-pinned sites, 3.0 MiB mapped before the attach"
    assert any(said in a for a in report["advice"]), report["advice"]


def test_rss_split_is_capped_by_the_counters(tmp_path):
    """Mapped sizes beyond what the kernel counts resident are not attributed beyond it."""
    t = SynthTrace(tmp_path / "c.allocscope")
    t.interval(
        {
            (t.stack(["mmap", "shm_ring", "main"]), 1, "shmem"): (8 * MIB, 1, 0, 0),
            (t.stack(["mmap", "map_uvm", "main"]), 1, "cuda-managed"): (6 * MIB, 1, 0, 0),
        },
        rss=20 * MIB,
        shmem=5 * MIB,
        file=2 * MIB,
    )
    d = A.build_report(load_trace(t.close()))["rss_decomposition"]
    assert (d["shmem_attributed_bytes"], d["shmem_unattributed_bytes"]) == (5 * MIB, 0)
    assert (d["file_device_bytes"], d["file_regular_bytes"]) == (2 * MIB, 0)
    assert (d["shmem_sources"], d["file_device_sources"]) == ({"shmem": 8 * MIB}, {"cuda-managed": 6 * MIB})


# --------------------------------------------------------------------------------------------- text
def test_text_report_has_a_gpu_section(report):
    text = to_text(report)
    lines = text.splitlines()
    assert lines[2] == f"CUDA driver {DRIVER}: 3 calls probed"
    assert "  GPU now     193.0 MiB  in 4 allocations, peak 329.0 MiB   (device memory: in no host figure)" in lines
    assert "  CUDA host    21.0 MiB   (pinned and managed through the driver API: part of live now)" in lines
    assert (
        "    shmem 19.1 MiB = 16.1 MiB at shmem 56.0 KiB, cuda-pinned 16.0 MiB sites + 3.0 MiB not traced; "
        "file 10.0 MiB = 4.1 MiB device-mapped (cuda-managed 4.0 MiB, device 64.0 KiB sites) "
        "+ 5.9 MiB regular files"
    ) in lines
    gpu = lines.index(
        next(
            x
            for x in lines
            if x.startswith("GPU memory  device 193.0 MiB live at the end, peak 329.0 MiB; CUDA host 21.0 MiB")
        )
    )
    section = lines[gpu : lines.index("", gpu)]
    dev = [x.split() for x in section if x.endswith("[synthd]") and "MiB" in x and "pinner" not in x]
    assert [(r[1:3], r[-2]) for r in dev] == [
        ((["192.0", "MiB"]), "upload_weights"),
        ((["1.0", "MiB"]), "stage"),
        ((["0", "B"]), "scratch_buffers"),
    ]
    pinned = [x.split() for x in section if "pinner(203)" in x]
    assert [(r[-2], r[1] + r[2], r[3] + r[4]) for r in pinned] == [
        ("pin_buffers", "16.0MiB", "0B"),
        ("managed_pool", "0B", "4.0MiB"),
        ("register_buffer", "1.0MiB", "0B"),
    ]
    assert any(x.split()[:6] == ["202", "gpu-0", "193.0", "MiB", "4", "329.0"] for x in section)
    # the main site table shows GPU bytes in a column of their own
    head = next(x for x in lines if x.lstrip().startswith("#      live"))
    assert head.split()[-3:] == ["device", "stacks", "location"]


# --------------------------------------------------------------------------------------------- diff
@pytest.fixture(scope="module")
def diff_doc(tmp_path_factory, trace):
    b = load_trace(build(tmp_path_factory.mktemp("gpu-b") / "b.allocscope", made=6, kept=4))
    return diff_traces(trace, b)


def test_diff_compares_gpu_memory_apart(diff_doc):
    tot = diff_doc["totals"]
    assert {
        k: tot["delta"][k]
        for k in (
            "live_bytes",
            "peak_live_bytes",
            "device_bytes",
            "device_peak_bytes",
            "device_count",
            "cuda_host_bytes",
        )
    } == {
        "live_bytes": 0,
        "peak_live_bytes": 0,
        "device_bytes": 64 * MIB,
        "device_peak_bytes": 64 * MIB,
        "device_count": 1,
        "cuda_host_bytes": 0,
    }
    assert (tot["a"]["device_bytes"], tot["b"]["device_bytes"]) == (DEVICE_LIVE, DEVICE_LIVE + 64 * MIB)
    w = next(s for s in diff_doc["sites"] if s["frames"][0]["function"] == "upload_weights")
    assert {
        k: w[k]
        for k in (
            "a_device_peak_bytes",
            "b_device_peak_bytes",
            "device_peak_delta_bytes",
            "a_device_live_bytes",
            "b_device_live_bytes",
            "device_live_delta_bytes",
            "a_peak_live_bytes",
            "b_peak_live_bytes",
            "delta_bytes",
            "live_delta_bytes",
        )
    } == {
        "a_device_peak_bytes": 320 * MIB,
        "b_device_peak_bytes": 384 * MIB,
        "device_peak_delta_bytes": 64 * MIB,
        "a_device_live_bytes": 192 * MIB,
        "b_device_live_bytes": 256 * MIB,
        "device_live_delta_bytes": 64 * MIB,
        "a_peak_live_bytes": 0,
        "b_peak_live_bytes": 0,
        "delta_bytes": 0,
        "live_delta_bytes": 0,
    }
    gpu_n = next(g for g in diff_doc["thread_groups"] if g["group"] == "gpu-N")
    assert (
        gpu_n["a_device_live_bytes"],
        gpu_n["b_device_live_bytes"],
        gpu_n["device_live_delta_bytes"],
        gpu_n["peak_delta_bytes"],
    ) == (DEVICE_LIVE, DEVICE_LIVE + 64 * MIB, 64 * MIB, 0)


def test_diff_sorts_by_gpu_memory_and_shows_it(trace, diff_doc, tmp_path):
    b = load_trace(build(tmp_path / "b.allocscope", made=6, kept=4))
    doc = diff_traces(trace, b, sort="device")
    assert [s["frames"][0]["function"] for s in doc["sites"][:3]] == ["upload_weights", "pin_buffers", "managed_pool"]
    lines = diff_to_text(diff_doc).splitlines()
    assert [x.split()[:5] for x in lines if x.lstrip().startswith(("GPU now", "GPU peak"))] == [
        ["GPU", "now", "193.0", "MiB", "257.0"],
        ["GPU", "peak", "329.0", "MiB", "393.0"],
    ]
    i = lines.index("GPU memory by location (3 of 3, by |GPU peak delta|; not in the host figures above)")
    assert lines[i + 3].split() == [
        "320.0",
        "MiB",
        "384.0",
        "MiB",
        "+64.0",
        "MiB",
        "192.0",
        "MiB",
        "256.0",
        "MiB",
        "+64.0",
        "MiB",
        "upload_weights",
        "[synthd]",
    ]


# --------------------------------------------------------------------------------------------- exports
def test_html_gpu_series_and_columns(trace, report):
    series = {s["label"]: s["values"] for s in timeline_data(trace)["series"]}
    assert series["GPU memory (device)"] == [193 * MIB, DEVICE_PEAK, DEVICE_LIVE]
    assert series["live, CUDA host"] == [29 * MIB, 29 * MIB, 21 * MIB]
    assert series["live, total"][-1] == HOST_LIVE
    stacked = site_chart_data(trace, report, A.symbolize_stacks(trace))
    assert sum(s["values"][-1] for s in stacked["series"]) == HOST_LIVE  # host sites only
    assert not any("upload_weights" in s["label"] for s in stacked["series"])
    page = to_html(trace, report)
    assert '<section id="gpu"><h2>GPU memory</h2>' in page
    assert f"CUDA driver <code>{DRIVER}</code> (3 calls probed)" in page
    assert '<th class="num">device</th><th class="num">device peak</th>' in page
    assert '<div class="k">GPU now</div><div class="v">193.0 MiB</div>' in page
    assert f'title="{16 * MIB + 56 * KIB} bytes"' in page  # the shmem share of the RSS split


def test_html_gpu_page_draws_in_chromium(trace, report, tmp_path):
    """The page with its GPU series, cards and section draws: the timeline's legend lists GPU
    memory and the host series, the GPU tables are there."""
    exe = need_tool("chromium")
    page = tmp_path / "gpu.html"
    page.write_text(to_html(trace, report), encoding="utf-8")
    dom = chromium(exe, tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri()).stdout
    assert 'data-rendered="1"' in dom, "the page script did not finish"
    ink = re.search(r'id="chart-timeline"[^>]*data-ink="(\d+)"', dom) or re.search(
        r'data-ink="(\d+)"[^>]*id="chart-timeline"', dom
    )
    assert ink and int(ink.group(1)) > 5000
    legend = re.findall(r'class="u-label">([^<]*)<', dom)
    assert {"GPU memory (device)", "live, CUDA host", "live, total", "RSS"} <= set(legend), legend
    assert dom.count('<table class="gpu-sites">') == 1 and dom.count('<table class="gpu-host">') == 1


def test_html_without_gpu_memory_has_no_gpu_parts(tmp_path):
    t = SynthTrace(tmp_path / "h.allocscope")
    t.interval({(t.stack(["malloc", "f", "main"]), 1): (100, 1, 0, 0)}, rss=MIB)
    tr = load_trace(t.close())
    assert [s["label"] for s in timeline_data(tr)["series"]] == [
        "RSS",
        "live, heap API",
        "live, mmap/brk",
        "live, total",
    ]
    page = to_html(tr, A.build_report(tr))
    assert 'id="gpu"' not in page and "device peak" not in page and "CUDA driver" not in page


def test_folded_pprof_csv_keep_gpu_memory_apart(trace, report):
    assert sum(folded_stacks(trace, "live_bytes").values()) == HOST_LIVE
    assert folded_stacks(trace, "device_live_bytes") == {
        ("start_thread", "gpu_main", "upload_weights"): 192 * MIB,
        ("start_thread", "gpu_main", "stage"): MIB,
    }
    prof = parse_pprof(to_pprof(trace))
    assert sum(s.value[3] for s in prof.sample) == HOST_LIVE  # inuse_space
    assert sum(s.value[1] for s in prof.sample) == sum(s["alloc_bytes"] for s in report["sites"])
    lines = to_csv(report).splitlines()
    head = lines[0].split(",")
    rows = {r.split(",")[6]: dict(zip(head, r.split(","))) for r in lines[1:]}
    assert [rows["upload_weights  [synthd]"][c] for c in ("device_live_bytes", "device_peak_bytes")] == [
        str(192 * MIB),
        str(320 * MIB),
    ]
    assert rows["stage  [synthd]"][head[1]] == "4096"


def test_cuda_host_memory_is_no_allocator_chunk(tmp_path):
    """The tracer measures every live block outside glibc's heaps as an allocator chunk (`mmap`
    ranges of the heaps table), pinned memory the driver mapped too: a range of it alone is left
    out, one merged with a chunk's loses its pages, so none of it is called retained."""
    t = SynthTrace(tmp_path / "r.allocscope")
    s_heap, s_pin = t.stack(["malloc", "load", "main"]), t.stack(["pin", "main"])
    main, chunk, pin, merged = 0x10000000, 0x7F0000000000, 0x7F1000000000, 0x7F2000000000
    t.interval(
        {(s_heap, 1): (100000 + 3 * MIB, 3, 0, 0), (s_pin, 1, "cuda-pinned"): (12 * MIB, 2, 0, 0)},
        rss=64 * MIB,
        shmem=12 * MIB,
    )
    t.live_block(s_heap, 1, 100000, at_s=0.1, addr=main + 16)
    t.live_block(s_heap, 1, 2 * MIB, at_s=0.1, addr=chunk + 16)
    t.live_block(s_heap, 1, MIB, at_s=0.1, addr=merged + 16)
    t.live_block(s_pin, 1, 8 * MIB, at_s=0.1, source="cuda-pinned", api="cu_host_alloc", addr=pin)
    t.live_block(s_pin, 1, 4 * MIB, at_s=0.1, source="cuda-pinned", api="cu_host_alloc", addr=merged + MIB + 4096)
    t.heaps(
        [
            (main, main + MIB, main + MIB, "main", "main", 512 * KIB, 0),
            (chunk, chunk + 2 * MIB + 4096, chunk + 2 * MIB + 4096, "mmap", "mmap", 2 * MIB + 4096, 0),
            (pin - 4096, pin + 8 * MIB, pin + 8 * MIB, "mmap", "mmap", 8 * MIB + 4096, 0),
            (merged, merged + 5 * MIB + 4096, merged + 5 * MIB + 4096, "mmap", "mmap", 5 * MIB + 4096, 0),
        ]
    )
    tr = load_trace(t.close())
    ar = {a["id"]: a for a in A.arena_table(tr).to_dict("records")}
    assert (
        ar["mmap"]["live_bytes"],
        ar["mmap"]["resident_bytes"],
        ar["mmap"]["retained_bytes"],
        ar["mmap"]["estimated"],
    ) == (3 * MIB, 3 * MIB + 2 * 4096, 2 * 4096, True)
    assert (ar["main"]["live_bytes"], ar["main"]["retained_bytes"], ar["main"]["estimated"]) == (
        100000,
        512 * KIB - 100000,
        False,
    )
    d = A.rss_decomposition(tr)
    assert (d["retained_bytes"], d["live_heap_bytes"]) == (512 * KIB - 100000 + 2 * 4096, 100000 + 3 * MIB)
    assert d["other_anon_bytes"] == 52 * MIB - (512 * KIB + 3 * MIB + 2 * 4096)


def test_cli_folded_device_metric_and_diff_sort(trace, tmp_path):
    r = CliRunner().invoke(main, ["report", trace.path, "--format", "folded", "--metric", "device_live_bytes"])
    assert r.exit_code == 0, r.output
    assert r.output == f"start_thread;gpu_main;stage {MIB}\nstart_thread;gpu_main;upload_weights {192 * MIB}\n"
    b = build(tmp_path / "b.allocscope", made=6, kept=4)
    r = CliRunner().invoke(diff, [trace.path, b, "--sort", "device", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert "Top 1 of 10 locations, by |GPU memory peak delta|" in r.output


# --------------------------------------------------------------------------------------------- CUDA calls folded
CUDART, CUDA = "/opt/nv/lib/libcudart.so.13", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
C10, TORCH, LIBC = "/opt/torch/lib/libc10_cuda.so", "/opt/torch/lib/libtorch_cuda.so", "/lib/x86_64-linux-gnu/libc.so.6"
ALLOC_BLOCK = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block(AllocParams&, bool)"
SLOWPATH = "at::CachingHostAllocatorImpl<at::cuda::CUDAStream>::allocate_host_memory_slowpath(unsigned long)"


def fi(spec: str) -> A.FrameInfo:
    fn, _, mod = spec.rpartition("@")
    return A.FrameInfo(fn, mod, None, None)


@pytest.mark.parametrize(
    "stack,site,call",
    [
        # torch's device memory, as the probe on cuMemAlloc_v2's return sees it: libcudart's stripped
        # internals inside cudaMalloc
        (
            [
                f"libcudart.so.13+0x41b5e@{CUDART}",
                f"libcudart.so.13+0x3a010@{CUDART}",
                f"cudaMalloc@{CUDART}",
                f"{ALLOC_BLOCK}@{C10}",
                f"NativeCachingAllocator::malloc@{C10}",
                f"at::detail::empty_cuda@{TORCH}",
            ],
            [ALLOC_BLOCK, "NativeCachingAllocator::malloc", "at::detail::empty_cuda"],
            "cudaMalloc",
        ),
        # the driver's own malloc inside cuMemAlloc_v2 inside cudaMalloc: the same place, the same call
        (
            [
                f"libcuda.so.580.159.04+0x2f00a@{CUDA}",
                f"cuMemAlloc_v2@{CUDA}",
                f"libcudart.so.13+0x41b59@{CUDART}",
                f"cudaMalloc@{CUDART}",
                f"{ALLOC_BLOCK}@{C10}",
            ],
            [ALLOC_BLOCK],
            "cudaMalloc",
        ),
        # glibc's mmap inside the driver's malloc inside cudaHostAlloc (pinned memory's slow path)
        (
            [
                f"mmap64@{LIBC}",
                f"sysmalloc@{LIBC}",
                f"malloc@{LIBC}",
                f"libcuda.so.580.159.04+0x1000@{CUDA}",
                f"cuMemHostAlloc@{CUDA}",
                f"libcudart.so.13+0x41c5e@{CUDART}",
                f"cudaHostAlloc@{CUDART}",
                f"{SLOWPATH}@{TORCH}",
                f"at::getPinnedMemoryAllocator@{TORCH}",
            ],
            [SLOWPATH, "at::getPinnedMemoryAllocator"],
            "cudaHostAlloc",
        ),
        # a driver-API program: the call's internals in the driver, the caller the program's
        (
            [
                f"libcuda.so.580.159.04+0x2f00a@{CUDA}",
                f"cuMemCreate@{CUDA}",
                "vmm_reserve@/usr/bin/drv",
                "main@/usr/bin/drv",
            ],
            ["vmm_reserve", "main"],
            "cuMemCreate",
        ),
        # the runtime linked into the program (its internals: the program's own module)
        (
            [
                "prog+0x9100@/usr/bin/prog",
                "cudaMallocAsync@/usr/bin/prog",
                "upload@/usr/bin/prog",
                "main@/usr/bin/prog",
            ],
            ["upload", "main"],
            "cudaMallocAsync",
        ),
        # frees fold the same way (a munmap inside cudaFreeHost)
        (
            [
                f"munmap@{LIBC}",
                f"libcuda.so.580.159.04+0x5000@{CUDA}",
                f"cuMemFreeHost@{CUDA}",
                f"cudaFreeHost@{CUDART}",
                "release@/usr/bin/prog",
            ],
            ["release"],
            "cudaFreeHost",
        ),
        # a frame of other code inside the call (a callback of the program's) is no runtime internal:
        # nothing is folded past it
        (
            ["on_alloc@/usr/bin/prog", f"cudaMallocManaged@{CUDART}", "caller@/usr/bin/prog"],
            ["on_alloc", "cudaMallocManaged", "caller"],
            None,
        ),
        # a name that only starts like one (PyTorch's own wrapper) is not an entry point
        (
            [f"c10::cuda::cudaMallocMaybeCapturing(void**, unsigned long)@{C10}", f"{ALLOC_BLOCK}@{C10}"],
            ["c10::cuda::cudaMallocMaybeCapturing(void**, unsigned long)", ALLOC_BLOCK],
            None,
        ),
    ],
)
def test_cuda_calls_fold_to_their_caller(stack, site, call):
    folded = A.fold_frames(tuple(fi(s) for s in stack))
    assert [f.function for f in folded] == site
    assert (folded[0].call, [f.call for f in folded[1:]]) == (call, [None] * (len(site) - 1))


def test_cuda_locations_name_the_caller_and_the_call(tmp_path):
    """Per location: the code that called the runtime (alloc_block, the host allocator's slow
    path), the call it made named in the row and in the key; its own malloc elsewhere is another
    location; the driver's own mallocs outside any allocation call are one row per driver entry
    point called ("inside libcuda..., called from cuCtxCreate_v2"), not one per return address."""
    t = SynthTrace(tmp_path / "t.allocscope")
    t.thread(7, "pt_main_thread")

    def stack(*specs: str) -> int:
        return t.stack([s.rpartition("@")[0] for s in specs], module=[s.rpartition("@")[2] for s in specs])

    up = [f"{ALLOC_BLOCK}@{C10}", f"NativeCachingAllocator::malloc@{C10}", f"at::detail::empty_cuda@{TORCH}"]
    dev = stack(f"libcudart.so.13+0x41b5e@{CUDART}", f"cudaMalloc@{CUDART}", *up)
    drv_malloc = stack(
        f"libcuda.so.580.159.04+0x2f00a@{CUDA}",
        f"cuMemAlloc_v2@{CUDA}",
        f"libcudart.so.13+0x41b59@{CUDART}",
        f"cudaMalloc@{CUDART}",
        *up,
    )
    own_malloc = stack(f"malloc@{LIBC}", *up)
    pinned = stack(f"libcudart.so.13+0x41c5e@{CUDART}", f"cudaHostAlloc@{CUDART}", f"{SLOWPATH}@{TORCH}")
    ctx = [
        stack(
            f"malloc@{LIBC}",
            f"libcuda.so.580.159.04+0x{a:x}@{CUDA}",
            f"libcuda.so.580.159.04+0x{b:x}@{CUDA}",
            f"cuCtxCreate_v2@{CUDA}",
            "main@/usr/bin/python3.12",
        )
        for a, b in ((0x1000, 0x2000), (0x1100, 0x2000), (0x1200, 0x2200))
    ]
    init = stack(f"malloc@{LIBC}", f"libcuda.so.580.159.04+0x1000@{CUDA}", f"cuInit@{CUDA}", "main@/usr/bin/python3.12")
    t.interval(
        {
            (dev, 7, "cuda-device"): (600 * MIB, 3, 0, 0),
            (drv_malloc, 7): (3 * 96, 3, 0, 0),
            (own_malloc, 7): (4096, 1, 0, 0),
            (pinned, 7, "cuda-pinned"): (128 * MIB, 1, 0, 0),
            (ctx[0], 7): (1000, 10, 0, 0),
            (ctx[1], 7): (2000, 20, 0, 0),
            (ctx[2], 7): (3000, 30, 0, 0),
            (init, 7): (500, 5, 0, 0),
        }
    )
    doc = A.build_report(load_trace(t.close()))
    rows = {
        x["location"]: (x["live_bytes"], x["live_count"], x["device_live_bytes"], x["n_stacks"])
        for x in doc["locations"]
    }
    assert rows == {
        # the device memory and the driver's mallocs inside the same call: one folded stack
        f"{ALLOC_BLOCK}|libc10_cuda.so||call=cudaMalloc": (3 * 96, 3, 600 * MIB, 1),
        f"{ALLOC_BLOCK}|libc10_cuda.so|": (4096, 1, 0, 1),
        f"{SLOWPATH}|libtorch_cuda.so||call=cudaHostAlloc": (128 * MIB, 1, 0, 1),
        "cuCtxCreate_v2|libcuda.so.580.159.04||inside=libcuda.so.580.159.04": (6000, 60, 0, 3),
        "cuInit|libcuda.so.580.159.04||inside=libcuda.so.580.159.04": (500, 5, 0, 1),
    }
    loc = {x["location"]: x for x in doc["locations"]}
    dev_row = loc[f"{ALLOC_BLOCK}|libc10_cuda.so||call=cudaMalloc"]
    assert (dev_row["function"], dev_row["call"], "inside" in dev_row, dev_row["key_quality"]) == (
        ALLOC_BLOCK,
        "cudaMalloc",
        False,
        "function",
    )
    ctx_row = loc["cuCtxCreate_v2|libcuda.so.580.159.04||inside=libcuda.so.580.159.04"]
    assert (ctx_row["inside"], "call" in ctx_row, ctx_row["key_quality"]) == (CUDA, False, "inside")
    # the sites: their first frame is the caller, naming the call; the driver's stacks keep their addresses
    sites = {(x["frames"][0]["function"], x["frames"][0].get("call")) for x in doc["sites"]}
    assert (ALLOC_BLOCK, "cudaMalloc") in sites and (ALLOC_BLOCK, None) in sites
    assert ("libcuda.so.580.159.04+0x1000", None) in sites and ("libcuda.so.580.159.04+0x1200", None) in sites
    text = to_text(doc)
    assert f"{ALLOC_BLOCK} via cudaMalloc  [libc10_cuda.so]" in text
    assert f"{SLOWPATH} via cudaHostAlloc  [libtorch_cuda.so]" in text
    assert "inside libcuda.so.580.159.04, called from cuCtxCreate_v2  [libcuda.so.580.159.04]" in text
    assert "no symbol" not in text
    # under it, its stacks from their innermost (stripped) frame
    ctx_text = text[text.index("inside libcuda.so.580.159.04, called from cuCtxCreate_v2") :]
    assert ctx_text.index("  libcuda.so.580.159.04+0x1200  [") < ctx_text.index("  cuCtxCreate_v2  [")
    # the same in the GPU section, the CSV (the sites' first frame) and the HTML page
    gpu = text[text.index("\nGPU memory") :]
    assert f"{ALLOC_BLOCK} via cudaMalloc" in gpu and f"{SLOWPATH} via cudaHostAlloc" in gpu
    assert f"{ALLOC_BLOCK} via cudaMalloc  [libc10_cuda.so]" in to_csv(A.build_report(load_trace(t.path), by="stack"))
    page = to_html(load_trace(t.path), doc)
    assert "inside libcuda.so.580.159.04, called from cuCtxCreate_v2" in page


def test_findings_say_what_holds_gpu_memory(report):
    from reports.analysis.findings import report_findings

    dev = [f for f in report_findings(report) if f["kind"] == "device"]
    assert len(dev) == 1, report_findings(report)
    assert dev[0]["figures"] == {"device_bytes": DEVICE_LIVE, "device_peak_bytes": DEVICE_PEAK}
    # 192 of the 193 MiB live at the end are upload_weights' (the stage's 1 MiB the rest)
    assert dev[0]["text"].startswith(
        "GPU: 193.0 MiB of device memory live at the end (peak 329.0 MiB), 99.5% of it at upload_weights"
    ), dev[0]["text"]
