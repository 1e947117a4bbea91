"""Every allocator a daemon runs, each with its own probes and source: a prefixed jemalloc in the
executable beside glibc's malloc from a library (a Rust daemon with tikv-jemallocator), tcmalloc
and mimalloc from Debian preloaded under the exact-figure target, and the user's own pool with
--alloc-fn / --free-fn."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path

import pytest
from support import CFLAGS_FP, build, need, record_run, report_json

from reports.trace import load_trace
from tracer.allocators.discovery import STANDARD

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent / "targets" / "allocators"


def by_function(rep: dict) -> dict[str, dict]:
    agg: dict[str, dict] = defaultdict(
        lambda: {"live_bytes": 0, "live_count": 0, "alloc_count": 0, "sources": set(), "threads": set()}
    )
    for s in rep["sites"]:
        a = agg[s["frames"][0]["function"]]
        for k in ("live_bytes", "live_count", "alloc_count"):
            a[k] += s[k]
        a["sources"] |= set(s["sources"])
        a["threads"] |= {t["name"] for t in s["threads"]}
    return agg


def check(agg: dict, expected: dict) -> None:
    for fn, (source, live, count, allocs, thread) in expected.items():
        a = agg[fn]
        assert (a["live_bytes"], a["live_count"], a["alloc_count"]) == (live, count, allocs), (fn, a)
        assert a["sources"] == {source}, (fn, a["sources"])
        assert a["threads"] == {thread}, (fn, a["threads"])


@pytest.mark.parametrize("uprobes", ["multi", "perf"])
def test_prefixed_jemalloc_beside_glibc(tmp_path, procs, tracers, uprobes):
    """Two allocators told apart per probed address: by the link's cookie, or (perf events) by
    the probe_src map."""
    lib = build(tmp_path / "libplain.so", HERE / "plain.c", flags=["-shared", "-fPIC", *CFLAGS_FP])
    exe = build(tmp_path / "rjem", HERE / "rjem.c", f"-L{tmp_path}", "-lplain", f"-Wl,-rpath,{tmp_path}")
    assert lib.exists()
    out = tmp_path / "rjem.allocscope"
    record_run(procs, tracers, out, [exe, "--linger"], record_args=("--uprobes", uprobes))
    rep = report_json(out)
    assert rep["recording"]["probes"]["uprobes"] == uprobes
    rj = "heap:jemalloc:_rjem_"
    check(
        by_function(rep),
        {
            "rust_vec_push": (rj, 5 * 4096, 5, 10, "worker"),  # 5 mallocx(64) grown by rallocx
            "rust_box_new": (rj, 4 * 333, 4, 7, "worker"),  # 3 dropped with sdallocx
            "rust_zeroed": (rj, 11 * 17 + 1000, 2, 2, "worker"),
            "rust_aligned": (rj, 777, 1, 1, "worker"),  # the failed posix_memalign is not one
            "rust_dealloc": (rj, 0, 0, 1, "worker"),  # dallocx
            "plain_alloc": ("heap", 6 * 2203, 6, 9, "worker"),  # glibc, from the C library
        },
    )
    probes = rep["recording"]["probes"]
    allocs = {(a["kind"], a["prefix"]): a for a in probes["allocators"]}
    assert allocs[("glibc", "")]["serves_malloc"] and allocs[("glibc", "")]["source"] == "heap"
    rjem = allocs[("jemalloc", "_rjem_")]
    assert rjem["module"] == str(exe) and rjem["source"] == rj and not rjem["serves_malloc"]
    assert {"_rjem_mallocx", "_rjem_rallocx", "_rjem_sdallocx", "_rjem_dallocx"} <= set(rjem["attached"])
    assert probes["allocator_kind"] == "glibc"  # the one serving malloc, as before
    assert rep["totals"]["lost_events"] == 0


@pytest.mark.parametrize("uprobes", ["multi", "perf"])
def test_pool_functions(tmp_path, procs, tracers, uprobes):
    exe = build(tmp_path / "pool", HERE / "pool.c")
    out = tmp_path / "pool.allocscope"
    args = (
        "--alloc-fn",
        "pool_get:size=arg1",
        "--alloc-fn",
        "pool_get_out:size=arg2,out=arg1",
        "--alloc-fn",
        "pool_calloc:count=arg1,size=arg2",
        "--free-fn",
        "pool_put:ptr=arg1",
        "--uprobes",
        uprobes,
    )
    record_run(procs, tracers, out, [exe, "--linger"], record_args=args)
    rep = report_json(out)
    agg = by_function(rep)
    check(
        agg,
        {
            "pool_objects": ("custom:pool_get", 60 * 200, 60, 100, "pooler"),
            "pool_out": ("custom:pool_get_out", 7 * 300, 7, 7, "pooler"),  # the failed call is not one
            "pool_zeroed": ("custom:pool_calloc", 5 * 3 * 50, 5, 5, "pooler"),
            "pool_new_slab": ("heap", 65536, 1, 1, "pooler"),  # the slab: once, as heap
        },
    )
    # the slab's malloc returns while pool_get's return probe is pending: its return address on
    # the stack is the uprobe trampoline; the unwinder takes the real one from the kernel's list
    slab = next(s for s in rep["sites"] if s["frames"][0]["function"] == "pool_new_slab")
    assert [f["function"] for f in slab["full_frames"]][:4] == ["pool_new_slab", "pool_get", "pool_objects", "pooler"]
    assert not any(f["function"].startswith("[uprobes]") for s in rep["sites"] for f in s["full_frames"])
    # the pool's objects live inside the slab: the host totals count the slab, not them again
    t = load_trace(out)
    last = t.intervals.iloc[-1]
    heap_sites = sum(s["live_bytes"] for s in rep["sites"] if set(s["sources"]) <= {"heap", "mmap", "brk"})
    assert int(last["live_bytes"]) == heap_sites
    assert rep["recording"]["probes"]["custom"] and {c["source"] for c in rep["recording"]["probes"]["custom"]} == {
        "custom:pool_get",
        "custom:pool_get_out",
        "custom:pool_calloc",
        "custom:pool_put",
    }


PRELOADS = {
    "tcmalloc-minimal": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "mimalloc": "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
}


@pytest.mark.parametrize("name", sorted(PRELOADS))
def test_preloaded_allocator_exact(targets, tmp_path, tracers, name):
    """The exact-figure target (tests/targets/apis.c) under tcmalloc or mimalloc preloaded:
    the same per-site and per-thread figures as under glibc."""
    from support import Proc, record_attached, stop_tracer
    from test_record_bpf import EXPECTED
    from test_record_bpf import by_function as apis_by_function

    lib = need([PRELOADS[name]], f"{name} (a Debian package make setup installs)")
    tgt = Proc([targets["apis"], "--wait-signal", "--linger"], env={**os.environ, "LD_PRELOAD": lib})
    try:
        tgt.expect("ready")
        out = tmp_path / f"{name}.allocscope"
        tr = record_attached(tracers, tgt.pid, out, "--interval", "0.5")
        tgt.signal(signal.SIGUSR1)
        tgt.expect("done")
        stop_tracer(tr, 0.6)
    finally:
        tgt.kill()
    rep = report_json(out)
    probes = rep["recording"]["probes"]
    assert probes["allocator_kind"] == name.split("-")[0], probes["allocator"]
    assert os.path.realpath(probes["allocator"]) == os.path.realpath(lib)
    agg = apis_by_function(rep)
    defined = {a["kind"]: a["attached"] + list(a["aliases"]) for a in probes["allocators"]}[name.split("-")[0]]
    for fn, (live, count, allocs, thread) in EXPECTED.items():
        a = agg[fn]
        assert (a["live_bytes"], a["live_count"], a["alloc_count"]) == (live, count, allocs), (name, fn, a)
        assert dict(a["threads"]) == {thread: live}, (name, fn, a["threads"])
        api = fn.removeprefix("leak_")
        # what the preloaded allocator lacks (tcmalloc: reallocarray) is glibc's, and says so
        expect = (
            {"heap:glibc"}
            if api in STANDARD and api not in defined
            else {"mmap"}
            if fn.startswith("map_")
            else {"heap"}
        )
        assert {src for s in a["sites"] for src in s["sources"]} == expect, (name, fn)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
