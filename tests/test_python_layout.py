"""The CPython layouts of tracer/runtimes/python.py checked against the real interpreters
(docs/python.md): offsetof() compiled against each version's internal headers, 3.13's own debug
offsets read from a running process, the thread walk, and the location-table decoder of
reports/symbolize/python.py against co_lines() of each version. No BPF."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from reports.symbolize.python import line_at
from tests.support import ROOT, need, need_tool
from tracer.process.procfs import read_maps
from tracer.runtimes.python import LAYOUTS, ProcMem, PythonFrames, find_interpreter, read_code, thread_states

PYENV = Path.home() / ".pyenv" / "versions"
# (interpreter, include directory): pyenv's three and Debian's own 3.11
BUILDS = {
    "3.11.7": (PYENV / "3.11.7/bin/python3.11", PYENV / "3.11.7/include/python3.11"),
    "3.12.1": (PYENV / "3.12.1/bin/python3.12", PYENV / "3.12.1/include/python3.12"),
    "3.13.0": (PYENV / "3.13.0/bin/python3.13", PYENV / "3.13.0/include/python3.13"),
    "debian-3.11": (Path("/usr/bin/python3.11"), Path("/usr/include/python3.11")),
}
TARGETS = ROOT / "tests" / "targets" / "python"


def build(name: str) -> tuple[str, Path]:
    exe, inc = BUILDS[name]
    need([str(exe)], f"CPython {name}")
    need([str(inc / "internal" / "pycore_frame.h")], f"CPython {name}'s internal headers")
    return str(exe), inc


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_layout_table_is_offsetof(name, tmp_path):
    exe, inc = build(name)
    gcc = need_tool("gcc")
    binary = tmp_path / "offsets"
    subprocess.run([gcc, "-w", f"-I{inc}", str(TARGETS / "offsets.c"), "-o", str(binary)], check=True)
    got = json.loads(subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout)
    version = tuple(
        int(x) for x in subprocess.check_output([exe, "-c", "import sys; print(*sys.version_info[:2])"]).split()
    )
    want = asdict(LAYOUTS[version])  # type: ignore[index]
    assert {k: got[k] for k in want} == want
    assert got["frame_size"] >= 72  # the probe reads the first 80 bytes of a frame: all it needs lie there


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_interpreter_found_and_threads_walked(name):
    """A running interpreter with a second thread: found in its maps, its version read, its
    layout from the debug offsets (3.13) or the table, both threads' tstates walked, and a code
    object read back."""
    exe, _ = build(name)
    code = (
        "import threading, sys; e = threading.Event(); t = threading.Thread(target=e.wait); t.start(); "
        "print('ready', threading.get_native_id(), t.native_id, flush=True); sys.stdin.read()"
    )
    p = subprocess.Popen([exe, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _, main_tid, worker_tid = p.stdout.readline().split()
        mem = ProcMem(p.pid)
        try:
            interp = find_interpreter(mem, read_maps(p.pid))
            assert interp is not None and interp.layout is not None
            out = subprocess.check_output([exe, "-c", "import sys; print(*sys.version_info[:3])"], text=True)
            assert interp.version == tuple(int(x) for x in out.split())
            assert interp.source == ("debug offsets" if interp.version[:2] == (3, 13) else "table")
            assert interp.layout == LAYOUTS[interp.version[:2]]
            states = thread_states(mem, interp)
            assert set(states) == {int(main_tid), int(worker_tid)}
            lay = interp.layout
            frame = mem.u64(states[int(main_tid)] + lay.tstate_current_frame)
            if lay.cframe_current_frame >= 0:
                frame = mem.u64(frame + lay.cframe_current_frame)
            c = read_code(mem, lay, mem.u64(frame + lay.frame_code))
            assert c is not None and (c.name, c.file) == ("<module>", "<string>")
        finally:
            mem.close()
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_location_table_lines_are_co_lines(name):
    exe, _ = build(name)
    src = ROOT / "tracer" / "runtimes" / "python.py"  # a file with classes, closures, comprehensions
    codes = json.loads(subprocess.check_output([exe, str(TARGETS / "codelines.py"), str(src)]))
    checked = 0
    for c in codes:
        table = bytes.fromhex(c["table"])
        for start, end, line in c["lines"]:
            for off in range(start, end, 2):
                assert line_at(table, c["first"], off // 2) == line, (c["first"], off)
                checked += 1
    assert checked > 1000
    assert os.path.exists(src)


def test_unknown_version_is_said_once_and_stays_native():
    """CPython 3.10 (no _PyInterpreterFrame): said once, no map touched, no thread walked."""
    exe = need([str(PYENV / "3.10.13/bin/python3.10")], "CPython 3.10 (pyenv)")
    p = subprocess.Popen(
        [exe, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []

    def tables(name: str):
        raise AssertionError(f"the probe's {name} touched for an unknown version")

    try:
        assert p.stdout.readline().startswith("ready")
        py = PythonFrames(p.pid, tables, said.append)
        try:
            maps = read_maps(p.pid)
            py.update(maps)
            py.update(maps)  # the maps changed: looked at once, said once
            py.tick()
            assert py.interp is None and py.tids == {}
            assert len(said) == 1 and "CPython 3.10" in said[0] and "stay native" in said[0], said
        finally:
            py.close()
    finally:
        p.kill()
        p.wait()
