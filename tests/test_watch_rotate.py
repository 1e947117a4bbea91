"""`watch --max-traces N` (tracer/watch/traces.py rotate): starting a trace removes old ones so that
at most N remain, the incarnations that ended well first and the killed or OOM-killed last, so a
night's failure outlives the restarts after it; nothing but allocscope traces is ever removed. On
trace directories made here (meta.json as the recorder writes it), no BPF."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tracer.watch.watcher import rotate


def _trace(d: Path, name: str, when: int, reason: str | None) -> Path:
    """A trace directory `name` last written at `when` (its end's reason; None: not complete)."""
    p = d / name
    p.mkdir()
    meta: dict = {"format": "allocscope.trace", "version": 6, "complete": reason is not None}
    if reason is not None:
        meta["end"] = {"reason": reason, "signal": "SIGKILL" if "kill" in reason else None}
    (p / "meta.json").write_text(json.dumps(meta))
    os.utime(p, (when, when))
    return p


def test_the_failures_outlive_the_restarts_after_them(tmp_path):
    ends = ["exited", "oom_killed", "exited", "killed", None, "stopped"]  # oldest first
    made = [_trace(tmp_path, f"provingd-{100 + i}.allocscope", 1_000 + i, r) for i, r in enumerate(ends)]
    old = _trace(tmp_path, "provingd-100.allocscope.old", 900, "exited")  # record's TRACE.old beside it
    said: list[str] = []
    gone = rotate(str(tmp_path), 4, said.append)  # 6 there, the new one makes 7: 3 go
    assert [Path(p).name for p in gone] == [
        "provingd-100.allocscope",
        "provingd-102.allocscope",
        "provingd-104.allocscope",
    ]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["provingd-101.allocscope", "provingd-103.allocscope", "provingd-105.allocscope"]
    assert not old.exists() and made[1].exists() and made[3].exists()
    assert said == ["rotated out 3 old trace(s) (--max-traces 4); 2 of killed or OOM-killed incarnations kept longest"]


def test_only_failures_left_the_oldest_go(tmp_path):
    for i, r in enumerate(["oom_killed", "killed", "oom_killed"]):
        _trace(tmp_path, f"d-{i}.allocscope", 2_000 + i, r)
    said: list[str] = []
    assert [Path(p).name for p in rotate(str(tmp_path), 2, said.append)] == ["d-0.allocscope", "d-1.allocscope"]
    assert said == ["rotated out 2 old trace(s) (--max-traces 2); 1 of killed or OOM-killed incarnations kept longest"]
    said.clear()
    assert rotate(str(tmp_path), 5, said.append) == [] and said == []  # room enough: nothing said


def test_nothing_but_traces_is_removed(tmp_path):
    (tmp_path / "notes.allocscope").mkdir()  # named like one, no meta.json
    (tmp_path / "notes.allocscope" / "x").write_text("mine")
    (tmp_path / "other").mkdir()
    (tmp_path / "file.allocscope").write_text("not a directory")
    _trace(tmp_path, "d-1.allocscope", 3_000, "exited")
    assert [Path(p).name for p in rotate(str(tmp_path), 1, lambda m: None)] == ["d-1.allocscope"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.allocscope", "notes.allocscope", "other"]


def test_the_traces_being_written_are_never_rotated_out(tmp_path):
    """Several processes followed at once: the traces other processes are writing now (`busy`,
    not complete yet, the oldest) stay, and count toward N; the oldest finished ones go."""
    w1 = _trace(tmp_path, "w-1.allocscope", 1_000, None)  # being written since the start
    w2 = _trace(tmp_path, "w-2.allocscope", 1_001, None)
    for i in range(3):
        _trace(tmp_path, f"r-{i}.allocscope", 2_000 + i, "exited")
    gone = rotate(str(tmp_path), 4, lambda m: None, busy=[str(w1), str(w2)])  # 5 there, the new one makes 6: 2 go
    assert [Path(p).name for p in gone] == ["r-0.allocscope", "r-1.allocscope"]
    assert w1.exists() and w2.exists()
    assert rotate(str(tmp_path), 2, lambda m: None, busy=[str(w1), str(w2)]) == [str(tmp_path / "r-2.allocscope")]
    assert rotate(str(tmp_path), 1, lambda m: None, busy=[str(w1), str(w2)]) == []  # only busy ones left
    assert w1.exists() and w2.exists()
