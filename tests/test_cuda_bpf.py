"""GPU memory through the CUDA driver API and the runtime API, and shared mappings, against a
stand-in driver and runtime.

The stand-in driver (tests/targets/cuda/libcuda_standin.c) is built here as libcuda.so.1 in a
private directory, with -fcf-protection so each entry point starts with endbr64 as the real
driver's do; it exports the real names and C signatures and maps pinned and managed memory as
rw-s shared memfd mappings inside the calls, as the real driver maps its device files. The
stand-in runtime (libcudart_standin.c) is built beside it as libcudart.so.13, calling the driver
as the real one does. Both are stripped of their symbol tables (-s), as the vendor's are: their
calls keep their names (.dynsym), their internals are addresses. They are not the driver and the
runtime: docs/gpu-memory.md and docs/gpu.md say what was and was not checked against real ones.

The locations name the code that asked (docs/gpu.md): a CUDA call's internals are folded, the
location is its caller with the call named; the stripped driver's own mallocs outside any
allocation call are one location per driver call they were made in.
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
from support import CFLAGS_FP, attached, build, report_json_text, wait_for

from reports.trace import load_trace

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent / "targets" / "cuda"
MIB = 1 << 20
PAGE = 4096
# (innermost function, the CUDA call it made) -> (source, live bytes, live blocks, allocations,
# thread): the driver's probed calls are named on their own memory too (their frame is not on the
# stack at their return: put back from the stacks of the driver's mallocs inside them, docs/gpu.md)
EXPECTED = {
    ("pin_host_alloc", "cuMemHostAlloc"): ("cuda-pinned", 2 * (7 * MIB + 4099), 2, 3, "pinner"),
    ("pin_alloc_host", "cuMemAllocHost_v2"): ("cuda-pinned", 2 * 3 * MIB, 2, 2, "pinner"),
    ("pin_register", "cuMemHostRegister_v2"): ("cuda-pinned", MIB, 1, 2, "pinner"),
    ("dev_alloc", "cuMemAlloc_v2"): ("cuda-device", 3 * 64 * MIB, 3, 5, "gpu-0"),
    ("dev_pitch", "cuMemAllocPitch_v2"): ("cuda-device", 1024 * 77, 1, 1, "gpu-0"),
    ("dev_async", "cuMemAllocAsync"): ("cuda-device", 0, 0, 4, "gpu-0"),
    ("dev_create", "cuMemCreate"): ("cuda-device", 2 * MIB, 1, 2, "gpu-0"),
    ("managed_alloc", "cuMemAllocManaged"): ("cuda-managed", 2 * (2 * MIB + 1), 2, 3, "managed"),
    ("shm_anon", None): ("shmem", 9 * PAGE, 1, 1, "managed"),
    ("shm_memfd", None): ("shmem", 5 * PAGE, 1, 1, "managed"),
    ("devzero_map", None): ("mmap", 3 * PAGE, 1, 1, "managed"),
}
# The stand-in driver's bookkeeping malloc (freed) in each call, failing ones too: folded to the
# program's function that made the call, the call named -> allocations
BOOKKEEPING = {
    ("pin_host_alloc", "cuMemHostAlloc"): 3,
    ("pin_host_alloc", "cuMemFreeHost"): 1,
    ("pin_alloc_host", "cuMemAllocHost_v2"): 2,  # cuMemHostAlloc inside it: the outermost call is named
    ("pin_register", "cuMemHostRegister_v2"): 2,
    ("pin_register", "cuMemHostUnregister"): 1,
    ("pin_fail", "cuMemHostAlloc"): 1,
    ("dev_alloc", "cuMemAlloc_v2"): 5,
    ("dev_alloc", "cuMemFree_v2"): 2,
    ("dev_pitch", "cuMemAllocPitch_v2"): 1,
    ("dev_async", "cuMemAllocAsync"): 4,
    ("dev_async", "cuMemFreeAsync"): 4,
    ("dev_create", "cuMemCreate"): 2,
    ("dev_create", "cuMemRelease"): 1,
    ("dev_fail", "cuMemAlloc_v2"): 2,
    ("managed_alloc", "cuMemAllocManaged"): 3,
    ("managed_alloc", "cuMemFree_v2"): 1,
    ("rt_malloc", "cudaFree"): 1,
}
# Through the runtime (thread cudart): the program's function, the runtime call named. rt_malloc:
# 3 x 16 MiB of device memory (one freed), the driver's bookkeeping in each cuMemAlloc_v2 and the
# runtime's own state (RT_STATE_BYTES, kept) malloc'd in its first call; rt_host: pinned memory,
# 2 x 4 MiB by cudaHostAlloc, 2 MiB by cudaMallocHost, and the driver's bookkeeping in each.
# (function, call) -> (host live bytes, blocks, allocations, device live bytes, blocks, allocations)
RT_STATE_BYTES = 4000
RUNTIME = {
    ("rt_malloc", "cudaMalloc"): (RT_STATE_BYTES, 1, 3 + 1, 2 * 16 * MIB, 2, 3),
    ("rt_host", "cudaHostAlloc"): (2 * 4 * MIB, 2, 2 + 2, 0, 0, 0),
    ("rt_host", "cudaMallocHost"): (2 * MIB, 1, 1 + 1, 0, 0, 0),
}
# The stripped driver's own state, malloc'd (and kept) by its internals in cuInit and in each of
# the two cuCtxCreate_v2: location -> (live bytes, blocks, distinct stacks: return addresses)
DRIVER_STATE = {
    "cuCtxCreate_v2": (2 * (3000 + 1000 + 512), 6, 3),
    "cuInit": (2048, 1, 1),
}


@pytest.fixture(scope="module")
def cuda_bins(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cuda")
    libdir = d / "driver"
    libdir.mkdir()
    lib = ["-shared", "-fPIC", *CFLAGS_FP, "-fcf-protection", "-s"]  # stripped, as the vendor's
    build(libdir / "libcuda.so.1", HERE / "libcuda_standin.c", flags=[*lib, "-Wl,-soname,libcuda.so.1"])
    build(
        libdir / "libcudart.so.13",
        HERE / "libcudart_standin.c",
        f"-L{libdir}",
        "-l:libcuda.so.1",
        "-Wl,-rpath,$ORIGIN",
        flags=[*lib, "-Wl,-soname,libcudart.so.13"],
    )
    return {"libdir": libdir, "prog": build(d / "cudaprog", HERE / "cudaprog.c", "-ldl")}


def by_function(rep: dict) -> dict[tuple[str, str | None], dict]:
    """Report sites summed by innermost function and the CUDA call it made; GPU memory (the
    device_* keys) apart from host memory (live_bytes, live_count, alloc_count)."""
    keys = ("live_bytes", "live_count", "alloc_count", "device_live_bytes", "device_live_count", "device_alloc_count")
    agg: dict[tuple, dict] = defaultdict(lambda: {**dict.fromkeys(keys, 0), "sources": set(), "threads": set()})
    for s in rep["sites"]:
        a = agg[s["frames"][0]["function"], s["frames"][0].get("call")]
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
    tgt = subprocess.Popen(
        [str(cuda_bins["prog"]), str(cuda_bins["libdir"]), "--linger"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
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
    rep, report_text = report_json_text(out)  # `report --format json`, and its text
    assert rep["recording"]["probes"]["uprobes"] == uprobes
    agg = by_function(rep)
    for fn, (source, live, count, allocs, thread) in EXPECTED.items():
        # one row per call: its CUDA memory and the driver's bookkeeping mallocs (freed) inside it
        a, book = agg[fn], BOOKKEEPING.get(fn, 0)
        host = (a["live_bytes"], a["live_count"], a["alloc_count"])
        device = (a["device_live_bytes"], a["device_live_count"], a["device_alloc_count"])
        if source == "cuda-device":  # GPU memory: in the device_* keys, none of it in the host ones
            assert (device, host) == ((live, count, allocs), (0, 0, book)), (fn, a)
        else:
            assert (host, device) == ((live, count, allocs + book), (0, 0, 0)), (fn, a)
        assert a["sources"] == {source} | ({"heap"} if book else set()), (fn, a["sources"])
        assert a["threads"] == {thread}, (fn, a["threads"])
        assert fn[1] is None or (fn[0], None) not in agg, fn  # no second row of the same code without the call
    # nothing counted twice: the stand-in's own memfd mappings inside the calls are not sites,
    # the program's regular-file mapping is not an allocation
    assert {k for k, a in agg.items() if "shmem" in a["sources"]} == {("shm_anon", None), ("shm_memfd", None)}
    assert not [k for k in agg if k[0] == "file_map"]
    # the driver's own mallocs inside its calls are heap allocations (freed) of the code that made
    # the call, the call named; the runtime's calls the same, their device and pinned memory too
    book = {
        k: (a["alloc_count"], a["live_bytes"], a["sources"], a["device_alloc_count"])
        for k, a in agg.items()
        if k[1] and k not in RUNTIME and k not in EXPECTED
    }
    assert book == {k: (n, 0, {"heap"}, 0) for k, n in BOOKKEEPING.items() if k not in EXPECTED}
    for k, (live, count, allocs, dlive, dcount, dallocs) in RUNTIME.items():
        a = agg[k]
        assert (
            a["live_bytes"],
            a["live_count"],
            a["alloc_count"],
            a["device_live_bytes"],
            a["device_live_count"],
            a["device_alloc_count"],
            a["threads"],
        ) == (live, count, allocs, dlive, dcount, dallocs, {"cudart"}), k
    assert agg["rt_malloc", "cudaMalloc"]["sources"] == {"heap", "cuda-device"}
    assert (
        agg["rt_host", "cudaHostAlloc"]["sources"]
        == agg["rt_host", "cudaMallocHost"]["sources"]
        == {"heap", "cuda-pinned"}
    )
    # failed calls allocate no CUDA memory: their rows hold the bookkeeping alone
    assert agg["pin_fail", "cuMemHostAlloc"]["sources"] == agg["dev_fail", "cuMemAlloc_v2"]["sources"] == {"heap"}
    # locations: the runtime's callers with the call named; the stripped driver's own state one
    # location per driver call ("inside libcuda.so.1, called from cuCtxCreate_v2"), never one per
    # return address; nothing else of the stripped libraries is a location
    locs = rep["locations"]
    rt = {
        (x["function"], x.get("call")): (x["live_bytes"], x["device_live_bytes"], x["key_quality"])
        for x in locs
        if x["function"].startswith("rt_")
    }
    assert rt == {k: (v[0], v[3], "line") for k, v in RUNTIME.items()} | {("rt_malloc", "cudaFree"): (0, 0, "line")}
    libcuda = str(cuda_bins["libdir"] / "libcuda.so.1")
    inside = {
        x["function"]: (x["live_bytes"], x["live_count"], x["n_stacks"], x["location"]) for x in locs if x.get("inside")
    }
    assert inside == {fn: (*v, f"{fn}|libcuda.so.1||inside=libcuda.so.1") for fn, v in DRIVER_STATE.items()}
    assert {x["inside"] for x in locs if x.get("inside")} == {libcuda}
    stripped = [x for x in locs if x["module"].startswith(str(cuda_bins["libdir"])) and not x.get("inside")]
    assert stripped == [], [x["location"] for x in stripped]
    # the sites keep their addresses: the driver state's 4 stacks start inside libcuda.so.1
    firsts = [s["frames"][0] for s in rep["sites"] if s["frames"][0]["module"].startswith(str(cuda_bins["libdir"]))]
    assert len(firsts) == 4 and all(f["function"].startswith("libcuda.so.1+0x") for f in firsts), firsts
    probes = rep["recording"]["probes"]["cuda"]
    assert probes["module"].endswith("libcuda.so.1") and len(probes["attached"]) == 14, probes
    assert "cuMemHostAlloc" in probes["placement"]  # behind endbr64, on the push
    # GPU memory is its own total; host totals hold pinned and managed memory, not device memory
    t = load_trace(out)
    last = t.intervals.iloc[-1]
    gpu0 = 3 * 64 * MIB + 1024 * 77 + 2 * MIB
    device = gpu0 + 2 * 16 * MIB  # and the runtime's
    assert int(last["device_live_bytes"]) == device
    assert int(last["device_peak_bytes"]) == 5 * 64 * MIB  # before dev_alloc's two frees
    # pinned and managed memory; the registered 1 MiB is malloc'd memory already in the totals
    rt_pinned = 2 * 4 * MIB + 2 * MIB
    host_cuda = 2 * (7 * MIB + 4099) + 2 * 3 * MIB + 2 * (2 * MIB + 1) + rt_pinned
    assert int(last["cuda_host_live_bytes"]) == host_cuda
    assert int(last["live_bytes"]) < device  # the 194 MiB of device memory are not in it
    # ... and the report says the same: GPU memory in totals of its own, never in the host ones
    tot = rep["totals"]
    assert (tot["device_bytes"], tot["device_peak_bytes"], tot["device_count"], tot["cuda_host_bytes"]) == (
        device,
        5 * 64 * MIB,
        3 + 1 + 1 + 2,
        host_cuda,
    )
    assert tot["live_bytes"] == int(last["live_bytes"]) and tot["peak_live_bytes"] < device
    assert tot["live_by_source"]["cuda-device"] == device
    assert sum(x["device_live_bytes"] for x in rep["sites"]) == device
    threads = {x["name"]: x for x in rep["threads"]}
    assert (
        threads["gpu-0"]["device_live_bytes"],
        threads["gpu-0"]["device_live_count"],
        threads["gpu-0"]["device_peak_bytes"],
    ) == (gpu0, 5, 5 * 64 * MIB)
    assert (
        threads["cudart"]["device_live_bytes"],
        threads["cudart"]["device_live_count"],
        threads["cudart"]["device_peak_bytes"],
    ) == (2 * 16 * MIB, 2, 3 * 16 * MIB)
    assert threads["pinner"]["device_live_bytes"] == threads["managed"]["device_live_bytes"] == 0
    assert threads["gpu-0"]["live_bytes"] == 0  # the stand-in's bookkeeping mallocs are all freed
    # the RSS split: the program's shared anonymous and memfd mappings and the pinned memory are
    # RssShmem's owners (the registration pins a malloc'd block: anonymous, not shmem)
    dec = rep["rss_decomposition"]
    pinned = 2 * (7 * MIB + 4099) + 2 * 3 * MIB + rt_pinned
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
    text = report_text  # what `allocscope report OUT` prints
    assert f"CUDA driver {probes['module']}: 14 calls probed" in text
    assert "  GPU now     226.1 MiB  in 7 allocations, peak 320.0 MiB" in text
    gpu = text[text.index("\nGPU memory  device 226.1 MiB live at the end, peak 320.0 MiB") :]
    gpu = gpu[: gpu.index("\n\n")]
    fns = [k[0] for k in EXPECTED] + [k[0] for k in RUNTIME]

    def sites_in(thread: str) -> list[str]:  # the section's sites with bytes of that thread, in order
        return [next(fn for fn in fns if f" {fn} " in line) for line in gpu.splitlines() if f"{thread}(" in line]

    assert sites_in("gpu-0") == ["dev_alloc", "dev_create", "dev_pitch"]  # dev_async: nothing live
    assert sites_in("pinner") == ["pin_host_alloc", "pin_alloc_host", "pin_register"]
    assert sites_in("managed") == ["managed_alloc"]
    assert sites_in("cudart") == ["rt_malloc", "rt_host", "rt_host"]
    rt_lines = [line for line in gpu.splitlines() if "cudart(" in line]
    assert [line[line.index(" rt_") :].split("  [")[0].split()[-1] for line in rt_lines] == [
        "cudaMalloc",
        "cudaHostAlloc",
        "cudaMallocHost",
    ], rt_lines
    assert "inside libcuda.so.1, called from cuCtxCreate_v2  [libcuda.so.1]" in text
