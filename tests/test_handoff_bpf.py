"""Memory handed downstream is charged to who holds it (issue 46), against tests/targets/handoff.c:
6 synth threads make partitions and send them over a one-slot channel to `gpu`, which forwards
them to `finalizer` (it frees all but the last 3). While `gpu` stalls, 2 synth threads are blocked
in channel_send, each holding the partition it is sending (and any it made before that is still
live), and 4 wait in take_job: what they made was passed on. The target prints, per synth
thread, its state and the bytes of its partitions still live."""

from __future__ import annotations

import re
import signal
import time

import pytest
from support import cli, record_attached, report_json_text, stop_tracer

from reports.units import human_bytes

pytestmark = pytest.mark.bpf
PART = (4 << 20) + 1024


def test_handed_on_partitions_are_not_held_by_idle_threads(targets, procs, tracers, tmp_path):
    tgt = procs(targets["handoff"])
    tgt.expect("ready")
    out = tmp_path / "handoff.allocscope"
    tr = record_attached(tracers, tgt.pid, out, "--interval", "0.5")
    tgt.signal(signal.SIGUSR1)
    own = {}
    for _ in range(6):
        m = re.match(r"stall (\S+) tid=(\d+) state=(\w+) made_live=(\d+)", tgt.expect("stall "))
        own[m[1]] = {"tid": int(m[2]), "state": m[3], "live": int(m[4])}
    tgt.expect("stalled")
    tgt.expect("done", timeout=30)
    time.sleep(0.6)
    stop_tracer(tr, 0.6)
    senders = {k: v for k, v in own.items() if v["state"] == "sending"}
    idle = {k: v for k, v in own.items() if v["state"] == "idle"}
    assert len(senders) == 2 and len(idle) == 4, own
    assert sum(v["live"] for v in own.values()) == 7 * PART  # 2 freed by the finalizer

    rep, report_text = report_json_text(out)  # `report --format json`, and its text
    pk = rep["waits"]["peak"]
    loc = {d["function"]: d for d in pk["by_location"]}
    send, take = loc["channel_send"], loc["take_job"]
    # the blocked senders hold what they made (the partition being sent, and an earlier one
    # still live downstream: the report cannot tell it apart from the one in hand)
    assert send["threads"] == 2, send
    assert {t["tid"]: t["held_bytes"] for t in send["thread_list"]} == {v["tid"]: v["live"] for v in senders.values()}
    assert send["held_bytes"] == sum(v["live"] for v in senders.values()) and send["handed_on_bytes"] == 0
    assert {h["function"] for h in send["held"]} == {"make_partition"}
    # the idle synth threads hold nothing: what they made was passed on, to the thread that frees it
    assert take["threads"] == 4 and take["held_bytes"] == 0, take
    assert take["handed_on_bytes"] == sum(v["live"] for v in idle.values())
    assert {t["tid"]: t["handed_on_bytes"] for t in take["thread_list"]} == {v["tid"]: v["live"] for v in idle.values()}
    assert (take["allocated_by"], take["passed_to_names"]) == ("synth-*", "finalizer"), take
    assert [h["function"] for h in take["handed_on"]] == ["make_partition"]
    # the senders' partitions (and main's stdio buffer), nothing more: how many the senders made is
    # timing (a sender may have an earlier one still live downstream), their count is the daemon's
    assert send["held_bytes"] <= pk["held_bytes"] < send["held_bytes"] + (64 << 10), (pk["held_bytes"], send)
    # the findings and the text say so
    assert not any("take_job" in f["text"] for f in rep["findings"]), rep["findings"]
    text = report_text  # what `allocscope report OUT` prints
    handed = human_bytes(sum(v["live"] for v in idle.values()))
    want = rf"take_job handoff\.c:\d+  \[handoff\]: {re.escape(handed)} allocated by synth-\*, passed on to finalizer"
    assert re.search(want, text), text
    page = cli("report", str(out), "--format", "html", check=True).stdout
    assert "allocated by synth-*, passed on to finalizer" in page
