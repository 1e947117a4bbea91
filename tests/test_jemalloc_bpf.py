"""Real probes on a program linked against Debian's jemalloc (the allocator of redis-server).

jemalloc's `malloc` begins `cmp $0x1000,%rdi` and its `free` with nine plain instructions: both
would be single-stepped, so their probes (and malloc's return probe) move onto the first emulated
branch behind them. Every call must still be counted exactly once.
"""

from __future__ import annotations

import glob
import signal

import pytest
from support import ROOT, build, functions, record_attached, record_run, report_json, stop_tracer

pytestmark = pytest.mark.bpf

JEMALLOC = sorted(
    glob.glob("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2") + glob.glob("/lib/x86_64-linux-gnu/libjemalloc.so.2")
)


@pytest.fixture(scope="module")
def jem(tmp_path_factory):
    if not JEMALLOC:
        pytest.fail("libjemalloc.so.2 missing: `make setup` installs redis-server, which brings it")
    exe = tmp_path_factory.mktemp("jem") / "jem"
    return build(
        exe, ROOT / "tests/targets/jemalloc/jem.c", JEMALLOC[0], flags=["-O1", "-g", "-fno-omit-frame-pointer"]
    )


def test_jemalloc_calls_counted_once_with_moved_probes(jem, tmp_path, procs, tracers):
    import json

    out = tmp_path / "jem.allocscope"
    record_run(procs, tracers, out, [jem, "--wait-signal"])

    probes = json.loads((out / "meta.json").read_text())["probes"]
    assert probes["allocator_kind"] == "jemalloc", probes
    assert "ja" in probes["placement"]["malloc"] and "emulated" in probes["placement"]["malloc"]
    assert "emulated" in probes["placement"]["free"], probes["placement"]

    rep = report_json(out)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    got: dict[str, list[int]] = {}
    for s in rep["sites"]:
        fns = functions(s["frames"])
        fn = next((f for f in fns if f.startswith("jem_")), None)
        if fn:
            g = got.setdefault(fn, [0, 0, 0])
            g[0] += s["live_bytes"]
            g[1] += s["live_count"]
            g[2] += s["alloc_count"]
    assert got == {
        "jem_leak": [700 * 333, 700, 700],
        "jem_calloc": [9 * 13 * 41, 9, 9],
        "jem_realloc": [4 * 5000, 4, 8],  # 4 malloc(100), each moved by realloc to 5000 B
        "jem_churn": [0, 0, 5000],
    }, got
    from reports.trace import load_trace

    last = load_trace(out).intervals.iloc[-1]
    assert last["n_free_null"] == 100  # jemalloc's free probe sits before its NULL handling
    assert last["n_frees"] == 5000 + 4  # churn, and the 4 blocks realloc moved
    assert last["n_allocs"] == 700 + 9 + 8 + 5000


def test_an_allocator_library_deleted_under_a_running_program_is_still_probed(jem, tmp_path, procs, tracers):
    """A library upgraded under a running daemon (libjemalloc replaced by a package upgrade: its
    mapping says '(deleted)'): the allocator was not found there, glibc was taken for the one
    serving malloc and the report said 'No problem found' over nothing. It is found and probed
    through /proc/PID/map_files, and said by the name it was mapped under."""
    import json
    import shutil

    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(JEMALLOC[0], lib / "libjemalloc.so.2")
    tgt = procs("env", f"LD_LIBRARY_PATH={lib}", jem, "--wait-signal")
    tgt.expect("ready")
    (lib / "libjemalloc.so.2").unlink()  # upgraded on disk: the running copy is deleted,
    shutil.copy(JEMALLOC[0], lib / "libjemalloc.so.2")  # a new file (inode) under its name
    out = tmp_path / "gone.allocscope"
    tr = record_attached(tracers, tgt.pid, out, "--interval", "0.5")
    tgt.signal(signal.SIGUSR1)
    tgt.expect("done")
    stop_tracer(tr, 0.6)
    probes = json.loads((out / "meta.json").read_text())["probes"]
    assert probes["allocator_kind"] == "jemalloc", probes
    assert probes["allocator"] == f"{lib / 'libjemalloc.so.2'} (deleted)", probes["allocator"]
    rep = report_json(out)
    kinds = [a.get("kind") for a in rep["recording"]["allocators"]]
    assert kinds.count("jemalloc") == 1, rep["recording"]["allocators"]  # the new file is not the mapped one
    leak = [s for s in rep["sites"] if "jem_leak" in functions(s["frames"])]
    assert sum(s["live_count"] for s in leak) == 700 and sum(s["live_bytes"] for s in leak) == 700 * 333
