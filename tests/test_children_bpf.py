"""A target whose work is in forked children (issue 53, item 8: `record --pgrep 'postgres -D'` said
"No problem found: 0 B live" while the backends did the work). The forker target
(tests/targets/forker.c) forks 3 workers that allocate 8 MiB each and churn for 0.3 s of CPU,
then 20 quick ones (20 ms each, most gone between two of the tracer's reads), while the parent
only waits: the recording counts all 23 (task:task_newtask; meta.json `children`), reads the
long ones in /proc, and the report says so at the top, in the text and in the JSON
(`recording.children`, `recording.warnings`)."""

from __future__ import annotations

import json
import signal

import pytest
from support import functions, record_attached, report_json_text, stop_tracer

pytestmark = pytest.mark.bpf

MIB = 1 << 20


def test_work_in_forked_children_is_said(targets, tmp_path, procs, tracers):
    tgt = procs(targets["forker"])
    tgt.expect("ready")
    out = tmp_path / "forker.allocscope"
    tr = record_attached(tracers, tgt.pid, out, "--interval", "0.2")
    tgt.signal(signal.SIGUSR1)
    workers = [int(tgt.expect("worker ").split()[1]) for _ in range(3)]
    tgt.expect("done")
    stop_tracer(tr, 0.4)
    meta = json.loads((out / "meta.json").read_text())
    kids = meta["children"]
    assert kids["forked"] == 23 and kids["seen"] + kids["unseen"] == 23 and kids["alive"] == 0, kids
    listed = {c["pid"]: c for c in kids["listed"]}
    assert set(workers) <= set(listed) and len(listed) == kids["seen"], kids
    assert all(listed[p]["exe"] == str(targets["forker"]) for p in workers), kids["listed"]
    assert {c["exe"] for c in kids["listed"]} <= {str(targets["forker"]), ""}  # a zombie's is unreadable
    assert kids["cpu_s"] >= 0.85 and kids["target_cpu_s"] < 0.1, kids  # 0.3 s of CPU each, the parent idle
    assert all(listed[p]["anon_max_bytes"] >= 8 * MIB for p in workers), kids["listed"]
    rep, report_text = report_json_text(out)  # `report --format json`, and its text
    rec = rep["recording"]
    assert rec["children"]["work_in_children"] is True and rec["children"]["forked"] == 23
    said = [w for w in rec["warnings"] if w.startswith("the work is in 23 forked children (pids ")]
    assert len(said) == 1, rec["warnings"]
    shown = said[0].split("(pids ")[1].split(")")[0].split(" and ")[0].split(", ")
    assert shown == [str(c["pid"]) for c in kids["listed"][:8]], (shown, said[0])
    assert "allocscope follows one process" in said[0] and f"--pid {shown[0]}" in said[0]
    # the parent allocated nothing of the workers' (their mallocs are not the target's)
    assert not [s for s in rep["sites"] if "worker" in functions(s["frames"])]
    text = report_text  # what `allocscope report OUT` prints
    top = text[: text.index("Totals")]
    assert "warning: the work is in 23 forked children (pids " in top, top
