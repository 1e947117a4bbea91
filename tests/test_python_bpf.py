"""CPython frames in the stacks (issue 51, docs/python.md): a running Python program attached with
`record --pid` under 3.11, 3.12 and 3.13, its allocations named by the Python lines that made
them. One recording per interpreter, every assertion on it; a second 3.12 run for the diff.

The target (tests/targets/python/app.py) keeps 13 bytearrays of 4 MiB made at `load_batch`
(called from `handle_request`, main thread), 11 blocks of 1 MiB made at `compact_segment` (the
"compactor" thread), 7 buffers of 2 MiB that zlib's C code made for `inflate` and 3 anonymous
mappings of 3 MiB made by the mmap module at `map_region`; it prints its own byte counts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from unittest.mock import ANY

import pytest

from tests.support import ROOT, cli, need, record_attached, report_json, stop_tracer, unavailable

APP = ROOT / "tests" / "targets" / "python" / "app.py"
PYENV = Path.home() / ".pyenv" / "versions"
INTERPRETERS = {
    "3.11": str(PYENV / "3.11.7/bin/python3.11"),
    "3.12": str(PYENV / "3.12.1/bin/python3.12"),
    "3.13": str(PYENV / "3.13.0/bin/python3.13"),
    "debian-3.11": "/usr/bin/python3.11",  # a static, stripped, fixed-address executable; zlib built in
}

pytestmark = pytest.mark.bpf  # conftest: a skip without BPF, a failure under CI=true


def lines_of(path: Path) -> dict[str, int]:
    """The `# line: NAME` markers of the target: NAME -> line number."""
    out = {}
    for i, text in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# line: (\w+)", text)
        if m:
            out[m.group(1)] = i
    return out


LINES = lines_of(APP)


def interpreter(version: str) -> str:
    return need([INTERPRETERS[version]], f"CPython {version}")


def record_app(procs, tracers, py: str, out: Path, scale: int = 1, *extra: str) -> dict[str, int]:
    """Record the app under `py` into `out` (`extra`: more record options); its own counts from
    its `done` line."""
    tgt = procs(py, "-u", APP, scale)
    tgt.expect("ready")
    tr = record_attached(tracers, tgt.pid, out, "--interval", "0.5", *extra)
    tgt.signal(signal.SIGUSR1)
    done = tgt.expect("done", timeout=90)
    stop_tracer(tr, 0.6)
    err = tr.stderr.read()
    assert "Python frames in the stacks" in err, err
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", done)}


def py_frames(loc: dict) -> list[tuple[str, str | None, int]]:
    """(function, file, line) of a location's Python frames, innermost first."""
    return [(f["function"], f["file"], f["line"]) for f in loc["frames"] if f["module"] == "python"]


def location(rep: dict, function: str) -> dict:
    found = [loc for loc in rep["locations"] if loc["function"] == function and loc["module"] == "python"]
    assert len(found) == 1, [(loc["function"], loc["module"], loc["file"]) for loc in rep["locations"][:12]]
    return found[0]


@pytest.mark.parametrize("version", sorted(INTERPRETERS))
def test_python_lines_name_the_memory(version, procs, tracers, tmp_path):
    py = interpreter(version)
    out = tmp_path / "t"
    own = record_app(procs, tracers, py, out)
    rep = report_json(out)
    app = str(APP)
    meta = json.loads((out / "meta.json").read_text())["python"]
    want = subprocess.check_output([py, "-c", "import sys; print(*sys.version_info[:3], sep='.')"], text=True).strip()
    assert (meta["version"], meta["layout"]) == (want, "debug offsets" if version == "3.13" else "table"), meta

    # main thread: load_batch's line, reached from handle_request, the program's own count
    lb = location(rep, "load_batch")
    assert lb["location"] == f"load_batch|python|app.py:{LINES['load_batch']}"
    assert py_frames(lb)[:2] == [
        ("load_batch", app, LINES["load_batch"]),
        ("handle_request", app, LINES["handle_request"]),
    ]
    assert abs(lb["live_bytes"] - own["batches"]) <= 0.05 * own["batches"], (lb["live_bytes"], own)
    assert lb["live_count"] == 13
    natives = [f["function"] for f in lb["full_frames"] if f["module"] != "python"]
    assert "_PyEval_EvalFrameDefault" not in natives  # replaced by the Python frames it ran
    # the native frames it ran under the line (bytearray's) stand above the first Python frame
    first_py = [f["module"] for f in lb["frames"]].index("python")
    assert any("bytearray" in f["function"].lower() for f in lb["frames"][:first_py]), lb["frames"][:first_py]
    assert [t["tid"] for t in lb["threads"]] == [own["pid"]]

    # worker thread: compact_segment, called from compactor, in that thread
    cs = location(rep, "compact_segment")
    assert py_frames(cs)[:2] == [
        ("compact_segment", app, LINES["compact_segment"]),
        ("compactor", app, LINES["compactor"]),
    ]
    assert abs(cs["live_bytes"] - own["segments"]) <= 0.05 * own["segments"], (cs["live_bytes"], own)
    assert [t["tid"] for t in cs["threads"]] == [own["worker"]], cs["threads"]

    # a thread started after the attach: named by the thread walk (each snapshot at least) before it allocates
    late = location(rep, "late_block")
    assert py_frames(late)[:2] == [("late_block", app, LINES["late_block"]), ("late_worker", app, LINES["late_worker"])]
    assert abs(late["live_bytes"] - own["lates"]) <= 0.05 * own["lates"], (late["live_bytes"], own)

    # what the frames say: a generator's frame under its consumer, a key function under the C
    # code of sorted() that called it back, a coroutine under the coroutine awaiting it
    gen = location(rep, "chunks")
    assert py_frames(gen)[:2] == [("chunks", app, LINES["chunk_gen"]), ("collect", app, LINES["collect"])]
    assert gen["live_bytes"] >= own["chunks"] and gen["live_count"] == 3
    key = location(rep, "sort_key")
    assert py_frames(key)[:2] == [("sort_key", app, LINES["sort_key"]), ("sort_keys", app, LINES["sort_keys"])]
    assert abs(key["live_bytes"] - own["keys"]) <= 0.05 * own["keys"], (key["live_bytes"], own)
    fr = key["frames"]
    i, j = (next(n for n, f in enumerate(fr) if f["function"] == name) for name in ("sort_key", "sort_keys"))
    between = [f["function"] for f in fr[i + 1 : j] if f["module"] != "python"]
    assert between, fr[i : j + 1]  # sorted()'s C frames between the key function and its caller
    if not version.startswith("debian"):  # Debian's list_sort is a stripped static function
        assert any("sort" in f for f in between), between
    co = location(rep, "fetch")
    assert py_frames(co)[:2] == [("fetch", app, LINES["fetch"]), ("serve", app, LINES["serve"])]
    assert abs(co["live_bytes"] - own["fetches"]) <= 0.05 * own["fetches"], (co["live_bytes"], own)

    # a C extension (zlib) named by the Python line that called it, its own frames under it
    inf = location(rep, "inflate")
    assert py_frames(inf)[0] == ("inflate", app, LINES["inflate"])
    assert abs(inf["live_bytes"] - own["inflates"]) <= 0.05 * own["inflates"], (inf["live_bytes"], own)
    zsites = [s for s in rep["sites"] if s["location"] == inf["location"]]
    above = [s["frames"][: [f["module"] for f in s["frames"]].index("python")] for s in zsites]
    assert all(above), above  # the native frames zlib ran under the line
    if not version.startswith("debian"):  # pyenv's zlib module has its symbols
        assert any(any(f["function"].startswith("zlib_decompress") for f in a) for a in above), above

    # the mmap family (a system call, no allocator): Python's mmap module's anonymous mappings,
    # every page touched, named by the line that mapped them, the mapping's bytes exactly
    mp = location(rep, "map_region")
    assert py_frames(mp)[:2] == [("map_region", app, LINES["map_region"]), ("map_buffers", app, LINES["map_buffers"])]
    assert (mp["live_bytes"], mp["live_count"]) == (own["maps"], 3), (mp["live_bytes"], mp["live_count"], own)
    assert mp["sources"] == ["shmem"], mp["sources"]  # mmap.mmap(-1, n): MAP_SHARED | MAP_ANONYMOUS
    full = mp["full_frames"]
    natives = [f["function"] for f in full[: [f["module"] for f in full].index("python")]]
    assert natives, full  # the module's C code (and the syscall's wrapper) above the line
    if not version.startswith("debian"):  # pyenv's mmap module has its symbols
        assert "new_mmap_object" in natives, natives

    # deeper than the probe keeps (AS_PY_DEPTH 32): 32 frames all kept, nothing said; 43 frames
    # cut to the innermost 32 and a frame saying so in place of the rest, never shown as whole
    leaf = f"descend|python|app.py:{LINES['descend_leaf']}"
    deep = {s["live_bytes"]: s for s in rep["sites"] if s["location"] == leaf}
    whole, cut = (next(s for b, s in deep.items() if 0 < b - own[k] <= 64) for k in ("whole", "cut"))
    descent = [("descend", app, LINES["descend_leaf"])] + [("descend", app, LINES["descend"])] * 29
    assert py_frames(whole) == [*descent, ("main", app, LINES["whole"]), ("<module>", app, LINES["module"])]
    assert py_frames(cut) == [*descent, ("descend", app, LINES["descend"]), ("descend", app, LINES["descend"])] + [
        ("[outer Python frames cut: 32 kept]", None, None)
    ]
    full = [(f["function"], f["module"]) for f in cut["full_frames"]]
    below = full[full.index(("[outer Python frames cut: 32 kept]", "python")) + 1 :]
    assert below and all(m != "python" for _, m in below), full  # the interpreter's C frames under it

    # exec'd code, freed once run (0.2 s after its allocation, the snapshots 0.5 s apart): named,
    # its code object read when its stack was stored
    snip = [loc for loc in rep["locations"] if loc["location"] == "<module>|python|<snippet>:2"]
    assert len(snip) == 1, [loc["location"] for loc in rep["locations"] if loc["live_bytes"] >= own["snip"]]
    assert py_frames(snip[0])[:2] == [("<module>", "<snippet>", 2), ("main", app, LINES["snippet"])]
    assert 0 < snip[0]["live_bytes"] - own["snip"] <= 64, (snip[0]["live_bytes"], own)

    # threads started while recording that allocate at once (a ThreadPoolExecutor's, spawned by
    # its first submits): found by the probe itself, before the tracer's next thread walk
    pool = location(rep, "pool_block")
    assert py_frames(pool)[:2] == [("pool_block", app, LINES["pool_block"]), ("_WorkItem.run", ANY, ANY)], pool
    assert abs(pool["live_bytes"] - own["pools"]) <= 0.05 * own["pools"], (pool["live_bytes"], own)
    assert own["pid"] not in [t["tid"] for t in pool["threads"]], pool["threads"]

    # a subinterpreter the main thread entered: its frames first, then, under the C code that ran
    # it, the main interpreter's line that entered it
    sub = [loc for loc in rep["locations"] if loc["location"] == "sub_block|python|<string>:3"]
    assert len(sub) == 1, [loc["location"] for loc in rep["locations"] if loc["live_bytes"] >= own["sub"]]
    assert 0 < sub[0]["live_bytes"] - own["sub"] <= 64, (sub[0]["live_bytes"], own)
    fr = [(f["function"], f["module"] == "python") for f in sub[0]["frames"]]
    i, j = fr.index(("sub_block", True)), fr.index(("run_in_sub", True))
    assert fr[i + 1] == ("<module>", True) and fr[j + 1] == ("main", True), fr
    assert not all(p for _, p in fr[i + 2 : j]), fr  # run_string's C frames between
    assert py_frames(sub[0])[1] == ("<module>", "<string>", 4) and py_frames(sub[0])[2][2] == LINES["run_in_sub"]

    # --no-python: the native places as before, no Python frame anywhere
    native = json.loads(cli("report", str(out), "--format", "json", "--no-python", check=True).stdout)
    assert all(loc["module"] != "python" for loc in native["locations"])
    assert not any(f["module"] == "python" for s in native["sites"] for f in s["full_frames"])


def test_python_diff_by_line(procs, tracers, tmp_path):
    """Two runs of the 3.12 app, 13 and 26 batches: the diff's growth is load_batch's line."""
    py = interpreter("3.12")
    a, b = tmp_path / "a", tmp_path / "b"
    record_app(procs, tracers, py, a, 1)
    own = record_app(procs, tracers, py, b, 2)
    d = json.loads(cli("diff", str(a), str(b), "--format", "json", check=True).stdout)
    rows = [r for r in d["locations"] if r["function"] == "load_batch"]
    assert len(rows) == 1, [r.get("function") for r in d["locations"][:10]]
    delta = rows[0]["live_delta_bytes"]
    assert abs(delta - own["batches"] / 2) <= 0.05 * own["batches"] / 2, (delta, own)
    assert d["locations"][0]["function"] == "load_batch"  # the largest change


def test_python_first_touches(procs, tracers, tmp_path):
    """Residency mode (no allocator probes) of the 3.12 app: the mmap module's mappings named by
    the line that mapped them, exactly, and the sampled first touches of their pages by the line
    that touched them (every page written once, one sample in 4 standing for 4 pages)."""
    py = interpreter("3.12")
    out = tmp_path / "t"
    own = record_app(procs, tracers, py, out, 1, "--mode", "residency", "--fault-sample", "4", "--fault-duty", "1")
    rep = report_json(out)
    app = str(APP)
    by_line = {
        loc["line"]: loc
        for loc in rep["locations"]
        if loc["function"] == "map_region" and loc["module"] == "python" and loc["file"] == app
    }
    mapped, touched = by_line[LINES["map_region"]], by_line[LINES["map_touch"]]
    assert (mapped["live_bytes"], mapped["live_count"], mapped["sources"]) == (own["maps"], 3, ["shmem"]), mapped
    assert touched["sources"] == ["fault"], touched["sources"]
    want = [("map_region", app, LINES["map_touch"]), ("map_buffers", app, LINES["map_buffers"])]
    assert py_frames(touched)[:2] == want, py_frames(touched)
    assert abs(touched["alloc_bytes"] - own["maps"]) <= 0.05 * own["maps"], (touched["alloc_bytes"], own)


def test_no_python_changes_nothing_for_native_targets():
    """A program without CPython: the runtime finds nothing (no pyconf set, no thread walked)."""
    from tracer.process.procfs import read_maps
    from tracer.runtimes.python import ProcMem, candidates, find_interpreter

    maps = read_maps(os.getpid())  # pytest itself is Python: the candidates are found...
    assert candidates(maps)
    sleeper = Path("/bin/sleep")
    if not sleeper.exists():
        unavailable("/bin/sleep")
    import subprocess

    p = subprocess.Popen([str(sleeper), "30"])
    try:
        mem = ProcMem(p.pid)
        try:
            assert find_interpreter(mem, read_maps(p.pid)) is None  # ...and none in a native program
        finally:
            mem.close()
    finally:
        p.kill()
        p.wait()


def test_python_launched(tmp_path):
    """`record -- python SCRIPT`: the interpreter is found once the loader maps it (the tracer's
    view of the process is taken after the exec), its lines named as when attached."""
    py = interpreter("3.12")
    script = tmp_path / "grow.py"
    body = "held = []\n\ndef grow():\n    for _ in range(17):\n        held.append(bytearray(1 << 20))  # line 5\n"
    script.write_text(body + "\ngrow()\nimport time\ntime.sleep(1.2)  # alive at the next snapshot: its code is read\n")
    out = tmp_path / "t"
    r = cli("record", "-q", "-o", str(out), "--interval", "0.5", "--", py, str(script), timeout=180)
    assert r.returncode == 0, r.stderr
    # freed at the interpreter's exit: ranked by peak
    rep = json.loads(cli("report", str(out), "--format", "json", "--sort", "peak", check=True).stdout)
    grow = location(rep, "grow")
    assert py_frames(grow)[:2] == [("grow", str(script), 5), ("<module>", str(script), 7)]
    assert grow["alloc_count"] == 17 and abs(grow["alloc_bytes"] - 17 * (1 << 20)) <= 17 * 64, grow["alloc_bytes"]
    assert json.loads((out / "meta.json").read_text())["python_frames"] is True
    # --no-python-frames: the walk off at record time; the same 17 MiB at native places, no Python frame
    off = tmp_path / "off"
    r = cli(
        "record", "-q", "--no-python-frames", "-o", str(off), "--interval", "0.5", "--", py, str(script), timeout=180
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(cli("report", str(off), "--format", "json", "--sort", "peak", check=True).stdout)
    assert not any(f["module"] == "python" for s in rep["sites"] for f in s["full_frames"])
    meta = json.loads((off / "meta.json").read_text())
    assert meta["python_frames"] is False and "python" not in meta, meta.get("python")
    top = max(rep["locations"], key=lambda x: x["alloc_bytes"])
    assert top["alloc_count"] >= 17 and top["alloc_bytes"] >= 17 * (1 << 20), top
