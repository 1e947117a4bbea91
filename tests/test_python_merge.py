"""Python frames merged into native stacks (reports/analysis/stacks.py merge_python, docs/python.md)
and the location keyed on the innermost Python line: in a report and in `top`'s live model. Pure:
synthetic frames and columns, no BPF."""

from __future__ import annotations

from reports.analysis.stacks import FrameInfo, group_of, location_key, merge_python
from reports.live.model import StackFrames
from reports.symbolize.python import PY_MODULE, PyFrame, line_at

LIB = "/usr/lib/libpython3.12.so.1.0"


def native(*names: str) -> tuple[FrameInfo, ...]:
    return tuple(FrameInfo(n, LIB, "x.c", 1) for n in names)


def names(frames) -> list[str]:
    return [f.function for f in frames]


def test_each_eval_loop_call_gets_its_run_of_frames():
    # a C extension calling back into Python: two eval-loop calls, two runs (entry ends a run)
    st = native("PyByteArray_Resize", "_PyEval_EvalFrameDefault", "list_sort", "_PyEval_EvalFrameDefault", "main")
    py = [
        PyFrame("key", "app.py", 5, True),
        PyFrame("sort_rows", "app.py", 9, False),
        PyFrame("handle", "app.py", 12, False),
        PyFrame("<module>", "app.py", 20, True),
    ]
    got = merge_python(st, py)
    assert names(got) == ["PyByteArray_Resize", "key", "list_sort", "sort_rows", "handle", "<module>", "main"]
    assert [f.module == PY_MODULE for f in got] == [False, True, False, True, True, True, False]
    assert group_of(got)[0] == FrameInfo("key", PY_MODULE, "app.py", 5)
    assert location_key(group_of(got)) == "key|python|app.py:5"


def test_runs_left_over_go_outermost():
    # a native stack cut short before the second eval loop, or none known (stripped)
    py = [PyFrame("a", "m.py", 1, True), PyFrame("b", "m.py", 2, True)]
    assert names(merge_python(native("malloc_caller", "_PyEval_EvalFrameDefault"), py)) == ["malloc_caller", "a", "b"]
    assert names(merge_python(native("f", "g"), py)) == ["f", "g", "a", "b"]
    # more eval frames than runs (frames cut at 32): the extra stays native
    assert names(merge_python(native("_PyEval_EvalFrameDefault", "_PyEval_EvalFrameDefault"), py[:1])) == [
        "a",
        "_PyEval_EvalFrameDefault",
    ]


def test_line_at_an_unstarted_frame_is_its_first_line():
    assert line_at(b"", 42, -1) == 42
    assert line_at(b"", 42, 0) is None


def test_top_model_merges_python_frames():
    """The live model (allocscope top) gets the frames with each snapshot (Snapshot.python)."""
    stacks = {
        "stack_id": [7, 7, 7],
        "idx": [0, 1, 2],
        "ip": [1, 2, 3],
        "module": [LIB, LIB, LIB],
        "build_id": ["", "", ""],
        "offset": [-1, -1, -1],
        "syscall": [0, 0, 0],
        "function": ["PyByteArray_Resize", "_PyEval_EvalFrameDefault", "Py_RunMain"],
        "file": ["a.c", "ceval.c", "main.c"],
        "line": [1, 2, 3],
    }
    # a location table of one entry: 3 code units on the first line + 1 (one-line form, delta 1)
    table = bytes([0x80 | (11 << 3) | 2, 0, 4])
    pyframes = {"stack_id": [7, 7], "idx": [0, 1], "code": [100, 200], "lasti": [1, 0], "entry": [0, 1]}
    pycode = {
        "seq": [1, 1],
        "code": [100, 200],
        "name": ["load_batch", "<module>"],
        "qualname": ["Loader.load_batch", "<module>"],
        "file": ["/srv/app.py", "/srv/app.py"],
        "firstlineno": [25, 1],
        "linetable": [table, table],
    }
    sf = StackFrames(symbolizer=object())
    sf.add(stacks)
    sf.add_python([(pyframes, pycode)])
    assert sf.resolve_new() == [7]
    got = sf.get(7)
    assert [(f.function, f.line) for f in got] == [
        ("PyByteArray_Resize", 1),
        ("Loader.load_batch", 26),
        ("<module>", 2),
        ("Py_RunMain", 3),
    ]
    assert location_key(group_of(got)) == "Loader.load_batch|python|app.py:26"

    # the next snapshot: a stack id past 2**63 beside a small one still waiting (ids are hashes)
    big = (1 << 64) - 5
    sf.add_python([({"stack_id": [3], "idx": [0], "code": [100], "lasti": [0], "entry": [1]}, {})])
    sf.add_python([({"stack_id": [big], "idx": [0], "code": [100], "lasti": [1], "entry": [1]}, {})])
    sf.add({k: [big if k == "stack_id" else v[1]] for k, v in stacks.items()})
    assert sf.resolve_new() == [big]
    assert [(f.function, f.line) for f in sf.get(big)] == [("Loader.load_batch", 26)]


def test_a_cut_stack_says_so_in_its_run():
    """A stack deeper than the probe keeps (AS_PY_DEPTH): the tracer marks its last kept frame
    (pyframes.entry's ENTRY_CUT bit); python_frames adds a frame saying the outer frames were cut,
    in that frame's run (an entry flag on the last kept frame moves to it), so the merged stack
    does not read as whole and the next eval loop's C frame is not taken for the cut frames."""
    import pandas as pd

    from reports.render.shared import location_text
    from reports.symbolize.python import python_frames

    pyframes = pd.DataFrame(
        {"stack_id": [9, 9, 9, 5], "idx": [0, 1, 2, 0], "code": [100, 100, 100, 77], "lasti": [0, 0, 0, 0]}
        | {"entry": [0, 0, 3, 1]}  # idx 2: an eval loop's first frame, and the last kept one
    )
    pycode = pd.DataFrame(
        {"seq": [1], "code": [100], "name": ["recurse"], "qualname": ["recurse"], "file": ["/r.py"]}
        | {"firstlineno": [4], "linetable": [bytes([0x80 | (10 << 3) | 2, 0, 4])]}
    )
    got = python_frames(pyframes, pycode)
    assert [(f.function, f.entry) for f in got[9]] == [
        ("recurse", False),
        ("recurse", False),
        ("recurse", False),
        ("[outer Python frames cut: 3 kept]", True),
    ]
    st = native("PyByteArray_Resize", "_PyEval_EvalFrameDefault", "PyEval_EvalCode", "_PyEval_EvalFrameDefault")
    merged = merge_python(st, got[9])
    assert names(merged) == ["PyByteArray_Resize", *["recurse"] * 3, "[outer Python frames cut: 3 kept]"] + [
        "PyEval_EvalCode",
        "_PyEval_EvalFrameDefault",  # the cut frames' eval loop: no run of it was kept
    ]
    assert location_key(group_of(merged)) == "recurse|python|r.py:4"

    # a code object never read (freed before the tracer got to it): said why, not "no symbol"
    (unread,) = got[5]
    assert unread.function.startswith("[python code 0x") and unread.line is None
    loc = {"function": unread.function, "module": PY_MODULE, "file": None, "line": None, "key_quality": "address"}
    assert "freed before the tracer read it" in location_text(loc)
    assert "no symbol" in location_text(loc | {"module": LIB})
