"""GPU memory through the CUDA driver API, and shared mappings, against a stand-in driver.

The stand-in (tests/targets/cuda/libcuda_standin.c) is built here as libcuda.so.1 in a private
directory, with -fcf-protection so each entry point starts with endbr64 as the real driver's do; it
exports the real names and C signatures and maps pinned and managed memory as rw-s shared memfd
mappings inside the calls, as the real driver maps its device files. It is not the driver: the
docs/gpu-memory.md says what was and was not checked against a real one.
"""
from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from support import CFLAGS_FP, attached, build, cli, report_json, wait_for

from reports.trace import load_trace

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent / "targets" / "cuda"
MIB = 1 << 20
PAGE = 4096
# innermost function -> (source, live bytes, live blocks, allocations, thread)
EXPECTED = {
    "pin_host_alloc": ("cuda-pinned", 2 * (7 * MIB + 4099), 2, 3, "pinner"),
    "pin_alloc_host": ("cuda-pinned", 2 * 3 * MIB, 2, 2, "pinner"),
    "pin_register": ("cuda-pinned", MIB, 1, 2, "pinner"),
    "dev_alloc": ("cuda-device", 3 * 64 * MIB, 3, 5, "gpu-0"),
    "dev_pitch": ("cuda-device", 1024 * 77, 1, 1, "gpu-0"),
    "dev_async": ("cuda-device", 0, 0, 4, "gpu-0"),
    "dev_create": ("cuda-device", 2 * MIB, 1, 2, "gpu-0"),
    "managed_alloc": ("cuda-managed", 2 * (2 * MIB + 1), 2, 3, "managed"),
    "shm_anon": ("shmem", 9 * PAGE, 1, 1, "managed"),
    "shm_memfd": ("shmem", 5 * PAGE, 1, 1, "managed"),
    "devzero_map": ("mmap", 3 * PAGE, 1, 1, "managed"),
}
# CUDA calls the program makes that reach the stand-in's bookkeeping malloc (one each; the
# failing ones too): pinner 3+1+2+2+1+1, gpu 5+2+1+4+4+2+1+2, managed 3+1
DRIVER_MALLOCS = (3 + 1 + 2 + 2 + 1 + 1) + (5 + 2 + 1 + 4 + 4 + 2 + 1 + 2) + (3 + 1)


@pytest.fixture(scope="module")
def cuda_bins(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cuda")
    libdir = d / "driver"
    libdir.mkdir()
    build(libdir / "libcuda.so.1", HERE / "libcuda_standin.c",
          flags=["-shared", "-fPIC", *CFLAGS_FP, "-fcf-protection", "-Wl,-soname,libcuda.so.1"])
    return {"libdir": libdir, "prog": build(d / "cudaprog", HERE / "cudaprog.c", "-ldl")}


def by_function(rep: dict) -> dict[str, dict]:
    """Report sites summed by innermost function; GPU memory (the device_* keys) apart from host
    memory (live_bytes, live_count, alloc_count)."""
    keys = ("live_bytes", "live_count", "alloc_count", "device_live_bytes", "device_live_count",
            "device_alloc_count")
    agg: dict[str, dict] = defaultdict(lambda: {**dict.fromkeys(keys, 0), "sources": set(), "threads": set()})
    for s in rep["sites"]:
        a = agg[s["frames"][0]["function"]]
        for k in keys:
            a[k] += s[k]
        a["sources"] |= set(s["sources"])
        a["threads"] |= {t["name"] for t in s["threads"]}
    return agg


def _lines(stream) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in stream], daemon=True).start()
    return q


def _await(q: queue.Queue, needle: str, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = q.get(timeout=max(0.01, end - time.monotonic()))
        except queue.Empty:
            break
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r}")


@pytest.mark.parametrize("uprobes", ["multi", "perf"])
def test_cuda_driver_memory_exact(cuda_bins, tmp_path, tracers, uprobes):
    tgt = subprocess.Popen([str(cuda_bins["prog"]), str(cuda_bins["libdir"]), "--linger"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        out_lines = _lines(tgt.stdout)
        _await(out_lines, "ready")
        out = tmp_path / "cuda.allocscope"
        tr = tracers("record", "--pid", tgt.pid, "-o", out, "--interval", "0.5", "--uprobes", uprobes)
        wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
        assert tr.poll() is None, tr.stderr.read()
        err_lines = _lines(tr.stderr)
        tgt.send_signal(signal.SIGUSR1)
        _await(out_lines, "loaded")
        line = _await(err_lines, "CUDA driver")  # probed after the dlopen, before any call
        assert "14 calls probed" in line, line
        tgt.stdin.write("go\n")
        tgt.stdin.flush()
        _await(out_lines, "done")
        time.sleep(0.6)
        tr.send_signal(signal.SIGINT)
        assert tr.wait(60) == 0
    finally:
        tgt.kill()
        tgt.wait(10)
    rep = report_json(out)
    assert rep["recording"]["probes"]["uprobes"] == uprobes
    agg = by_function(rep)
    for fn, (source, live, count, allocs, thread) in EXPECTED.items():
        a = agg[fn]
        host = (a["live_bytes"], a["live_count"], a["alloc_count"])
        device = (a["device_live_bytes"], a["device_live_count"], a["device_alloc_count"])
        if source == "cuda-device":  # GPU memory: in the device_* keys, none of it in the host ones
            assert (device, host) == ((live, count, allocs), (0, 0, 0)), (fn, a)
        else:
            assert (host, device) == ((live, count, allocs), (0, 0, 0)), (fn, a)
        assert a["sources"] == {source}, (fn, a["sources"])
        assert a["threads"] == {thread}, (fn, a["threads"])
    # nothing counted twice: the stand-in's own memfd mappings inside the calls are not sites,
    # the program's regular-file mapping is not an allocation
    assert not [s for s in rep["sites"] if s["frames"][0]["function"] in ("shared_map", "file_map")]
    # the driver's own mallocs inside its calls are counted as heap allocations (freed)
    book = agg["bookkeeping"]
    assert (book["alloc_count"], book["live_bytes"], book["sources"]) == (DRIVER_MALLOCS, 0, {"heap"}), book
    # failed calls allocate nothing
    assert "pin_fail" not in agg and "dev_fail" not in agg
    probes = rep["recording"]["probes"]["cuda"]
    assert probes["module"].endswith("libcuda.so.1") and len(probes["attached"]) == 14, probes
    assert "cuMemHostAlloc" in probes["placement"]  # behind endbr64, on the push
    # GPU memory is its own total; host totals hold pinned and managed memory, not device memory
    t = load_trace(out)
    last = t.intervals.iloc[-1]
    device = 3 * 64 * MIB + 1024 * 77 + 2 * MIB
    assert int(last["device_live_bytes"]) == device
    assert int(last["device_peak_bytes"]) == 5 * 64 * MIB  # before dev_alloc's two frees
    # pinned and managed memory; the registered 1 MiB is malloc'd memory already in the totals
    host_cuda = 2 * (7 * MIB + 4099) + 2 * 3 * MIB + 2 * (2 * MIB + 1)
    assert int(last["cuda_host_live_bytes"]) == host_cuda
    assert int(last["live_bytes"]) < device  # the 194 MiB of device memory are not in it
    # ... and the report says the same: GPU memory in totals of its own, never in the host ones
    tot = rep["totals"]
    assert (tot["device_bytes"], tot["device_peak_bytes"], tot["device_count"], tot["cuda_host_bytes"]) == \
        (device, 5 * 64 * MIB, 3 + 1 + 1, host_cuda)
    assert tot["live_bytes"] == int(last["live_bytes"]) and tot["peak_live_bytes"] < device
    assert tot["live_by_source"]["cuda-device"] == device
    assert sum(x["device_live_bytes"] for x in rep["sites"]) == device
    threads = {x["name"]: x for x in rep["threads"]}
    assert (threads["gpu-0"]["device_live_bytes"], threads["gpu-0"]["device_live_count"],
            threads["gpu-0"]["device_peak_bytes"]) == (device, 5, 5 * 64 * MIB)
    assert threads["pinner"]["device_live_bytes"] == threads["managed"]["device_live_bytes"] == 0
    assert threads["gpu-0"]["live_bytes"] == 0  # the stand-in's bookkeeping mallocs are all freed
    # the RSS split: the program's shared anonymous and memfd mappings and the pinned memory are
    # RssShmem's owners (the registration pins a malloc'd block: anonymous, not shmem)
    dec = rep["rss_decomposition"]
    pinned = 2 * (7 * MIB + 4099) + 2 * 3 * MIB
    assert dec["shmem_sources"] == {"shmem": (9 + 5) * PAGE, "cuda-pinned": pinned}
    assert dec["shmem_attributed_bytes"] == (9 + 5) * PAGE + pinned
    assert dec["shmem_unattributed_bytes"] == dec["shmem_bytes"] - dec["shmem_attributed_bytes"]
    # the stand-in maps managed memory as memfd (RssShmem, not RssFile as /dev/nvidia-uvm is):
    # what RssShmem holds beyond the sites is the page rounding and the managed memory
    rounding = 2 * (2 * PAGE - 4099)
    assert abs(dec["shmem_unattributed_bytes"] - rounding - 2 * (2 * MIB + PAGE)) <= 64 * PAGE  # kernel counter lag
    # pinned memory is no allocator chunk: pin_buffer's two untouched 1 MiB chunks are glibc's
    # mmapped chunks (a header page each at most resident), the 20 MiB pinned beside them are not
    chunks = next(a for a in rep["arenas"] if a["id"] == "mmap")
    assert (chunks["live_bytes"], chunks["resident_bytes"] <= 2 * PAGE) == (2 * MIB, True), chunks
    assert dec["retained_bytes"] < MIB and dec["sum_bytes"] == dec["rss_bytes"], dec
    assert dec["file_device_sources"] == {"cuda-managed": 2 * (2 * MIB + 1)}
    assert dec["file_device_bytes"] == min(dec["file_bytes"], 2 * (2 * MIB + 1))
    # the text report: the driver probed, device memory apart, the GPU section
    text = cli("report", str(out), check=True).stdout
    assert f"CUDA driver {probes['module']}: 14 calls probed" in text
    assert "  GPU now     194.1 MiB  in 5 allocations, peak 320.0 MiB" in text
    gpu = text[text.index("\nGPU memory  device 194.1 MiB live at the end, peak 320.0 MiB"):]
    gpu = gpu[:gpu.index("\n\n")]

    def sites_in(thread: str) -> list[str]:  # the section's sites with bytes of that thread, in order
        return [next(fn for fn in EXPECTED if f" {fn} " in line) for line in gpu.splitlines() if f"{thread}(" in line]

    assert sites_in("gpu-0") == ["dev_alloc", "dev_create", "dev_pitch"]  # dev_async: nothing live
    assert sites_in("pinner") == ["pin_host_alloc", "pin_alloc_host", "pin_register"]
    assert sites_in("managed") == ["managed_alloc"]
