"""Issue 21: memory held by threads that are waiting, and what freeing costs — against targets
that time themselves (CLOCK_MONOTONIC around the call).

* waits (tests/targets/waits.c): holder-1..3 hold 1, 2, 3 MiB (+ their pointer arrays) while
  blocked on a mutex main holds for 1.5 s; unmapper munmaps 6 regions of 16..96 MiB it mapped in
  map_regions; main fragments the main arena and calls malloc_trim(0).
* rustd --gpu-ms: the synth threads block in `hand_off`'s `SyncSender::send` (sync_channel(1))
  while the gpu thread "proves" each partition.
"""

from __future__ import annotations

import json
import re
import signal

import pytest
from rust_targets import RUSTD_SRC, build_rustd
from support import Proc, cli, record_attached, report_json, report_json_text, stop_tracer

from reports.trace import load_trace

pytestmark = pytest.mark.bpf


def _own(stdout: str) -> dict:
    holders = {
        int(m[0]): {"tid": int(m[1]), "held": int(m[2]), "waited_ns": int(m[3])}
        for m in re.findall(r"holder (\d) tid=(\d+) held=(\d+) waited_ns=(\d+)", stdout)
    }
    um = re.search(r"unmapper tid=(\d+) bytes=(\d+) ns=(\d+)", stdout)
    tr = re.search(r"trim tid=(\d+) ns=(\d+)", stdout)
    assert len(holders) == 3 and um and tr, stdout
    return {
        "holders": holders,
        "unmap": {"tid": int(um[1]), "bytes": int(um[2]), "ns": int(um[3])},
        "trim": {"tid": int(tr[1]), "ns": int(tr[2])},
    }


def within(got: float, want: float, frac: float = 0.10) -> bool:
    return abs(got - want) <= frac * want


def test_waits_holdings_and_freeing_costs(targets, tmp_path):
    out = tmp_path / "waits.allocscope"
    p = cli("record", "-q", "-o", str(out), "--interval", "0.25", "--", str(targets["waits"]), check=True)
    own = _own(p.stdout)
    # the box-wide programs run raw (no tracepoint record filled per context switch or flush)
    probes = json.loads((out / "meta.json").read_text())["probes"]
    assert probes["raw_tracepoints"] == ["sched:sched_switch", "tlb:tlb_flush"], probes["tracepoints"]
    rep, report_text = report_json_text(out)  # `report --format json`, and its text
    w = rep["waits"]
    assert w["traced"] and w["wait_min_ms"] == 1.0 and w["lost"] == 0
    # a thread's offcpu entry outlives its waits (ts 0 while it runs): only real waits are blocked
    # rows, each begun within the recording (main ran again after its 1.5 s with the mutex held)
    t = load_trace(out)
    iv = t.intervals.set_index("seq")["ts_ns"]
    b = t.blocked
    span = int(iv.max() - iv.min()) + 2_000_000_000
    assert len(b) and (b["since_ns"] >= int(iv.min()) - 2_000_000_000).all(), b
    assert ((b["waited_ns"] > 0) & (b["waited_ns"] <= span)).all(), b
    # held while waiting: at the peak the three holders are blocked in wait_for_gate, each holding
    # exactly what it allocated in hold_buffers
    pk = w["peak"]
    gate = next(d for d in pk["by_location"] if d["function"] == "wait_for_gate")
    assert pk["by_location"][0] is gate
    assert gate["threads"] == 3 and gate["file"].endswith("waits.c")
    held = {t["tid"]: t["held_bytes"] for t in gate["thread_list"]}
    assert held == {h["tid"]: h["held"] for h in own["holders"].values()}
    assert gate["held_bytes"] == sum(h["held"] for h in own["holders"].values())
    assert {h["function"] for h in gate["held"]} == {"hold_buffers"}
    assert sum(h["blocks"] for h in gate["held"]) == 1 + 2 + 3 + 3  # the MiB blocks and 3 pointer arrays
    assert {t["name"] for t in gate["thread_list"]} == {"holder-1", "holder-2", "holder-3"}
    assert all(t["state"] == "S" for t in gate["thread_list"])
    # how long: each holder's waits at wait_for_gate sum to what it measured around the lock
    off = next(d for d in w["off_cpu"] if d["function"] == "wait_for_gate")
    assert off["n_threads"] == 3
    by_tid = {t["tid"]: t for t in off["by_thread"]}
    for h in own["holders"].values():
        got = by_tid[h["tid"]]["total_s"]
        assert within(got, h["waited_ns"] / 1e9), (got, h)
    assert within(gate["longest_s"], max(h["waited_ns"] for h in own["holders"].values()) / 1e9, 0.5)
    # what freeing cost: the unmapper's munmaps of what map_regions mapped: calls, bytes, time
    fr = w["freeing"]
    loc = next(d for d in fr["by_location"] if d["function"] == "map_regions")
    assert loc["calls"] == 6 and loc["requested_bytes"] == own["unmap"]["bytes"]
    assert within(loc["duration_s"], own["unmap"]["ns"] / 1e9), (loc, own["unmap"])
    um = next(r for r in fr["by_thread"] if r["tid"] == own["unmap"]["tid"] and r["kind"] == "munmap")
    assert um["thread"] == "unmapper" and um["calls"] >= 6
    # the TLB flushes those munmaps cost (tlb:tlb_flush on the target's threads): one at least each
    assert fr["tlb"]["local_mm_shootdown"]["flushes"] >= 6, fr["tlb"]
    # malloc_trim on the main thread, timed
    trim = next(x for x in fr["purges"] if x["function"] == "malloc_trim")
    assert trim["tid"] == own["trim"]["tid"] and trim["thread"] == "waits-main" and trim["calls"] == 1
    assert within(trim["duration_s"], own["trim"]["ns"] / 1e9), (trim, own["trim"])
    # the text report says it
    text = report_text  # what `allocscope report OUT` prints
    assert "Held while waiting" in text and "wait_for_gate" in text and "What giving memory back cost" in text
    html = tmp_path / "waits.html"
    cli("report", str(out), "--format", "html", "-o", str(html), check=True)
    page = html.read_text()
    assert '<section id="waits"><h2>Held while waiting</h2>' in page and "wait_for_gate" in page


def test_waits_under_inject(targets, tracers, tmp_path):
    """The same program attached with --inject (waits --signal): the waits, what the blocked
    threads hold (each holder's 1 MiB blocks exact: >= N; its 8..24-byte pointer array sampled
    or not: + 0 or N), the munmaps and malloc_trim, timed, against the program's own clocks."""
    n = 65536
    out = tmp_path / "waits-inject.allocscope"
    tgt = Proc([targets["waits"], "--signal"])
    try:
        tgt.expect("ready")
        tr = record_attached(tracers, tgt.pid, out, "--interval", "0.25", "--inject", "--sample-bytes", n)
        tgt.signal(signal.SIGUSR1)
        assert tgt.p.wait(30) == 0
        stdout = "".join(iter(lambda: tgt.lines.get(timeout=5), None))
        stop_tracer(tr, 0.4)
    finally:
        tgt.kill()
    own = _own(stdout)
    rep = report_json(out)
    assert rep["recording"]["probes"]["heap"] == "inject"
    w = rep["waits"]
    assert w["traced"] and w["lost"] == 0
    gate = w["peak"]["by_location"][0]
    assert gate["function"] == "wait_for_gate" and gate["threads"] == 3
    for t in gate["thread_list"]:
        i = int(t["name"].split("-")[1])
        assert t["tid"] == own["holders"][i]["tid"] and i << 20 <= t["held_bytes"] <= (i << 20) + n, (t, own)
    assert {h["function"] for h in gate["held"]} == {"hold_buffers"}
    off = next(d for d in w["off_cpu"] if d["function"] == "wait_for_gate")
    by_tid = {t["tid"]: t["total_s"] for t in off["by_thread"]}
    for h in own["holders"].values():
        assert within(by_tid[h["tid"]], h["waited_ns"] / 1e9), (by_tid, h)
    # freeing: the munmaps through the agent's hooks (no syscall tracepoint), timed across the call
    fr = w["freeing"]
    loc = next(d for d in fr["by_location"] if d["function"] == "map_regions")
    assert loc["calls"] == 6 and loc["requested_bytes"] == own["unmap"]["bytes"]
    assert within(loc["duration_s"], own["unmap"]["ns"] / 1e9), (loc, own["unmap"])
    assert fr["tlb"]["local_mm_shootdown"]["flushes"] >= 6, fr["tlb"]
    # malloc_trim keeps its uprobe (not hooked): timed, and its madvises are its own, not the
    # program's (~400 calls on waits-main before the fix)
    trim = next(x for x in fr["purges"] if x["function"] == "malloc_trim")
    assert trim["tid"] == own["trim"]["tid"] and trim["thread"] == "waits-main" and trim["calls"] == 1
    assert within(trim["duration_s"], own["trim"]["ns"] / 1e9), (trim, own["trim"])
    assert not [r for r in fr["by_thread"] if r["thread"] == "waits-main" and r["kind"] == "madvise"], fr["by_thread"]
    assert "malloc_trim" in rep["recording"]["probes"]["attached"]


def test_waits_off_records_none(targets, tmp_path):
    out = tmp_path / "nowaits.allocscope"
    cli("record", "-q", "-o", str(out), "--wait-min", "0", "--", str(targets["waits"]), check=True)
    w = report_json(out)["waits"]
    assert not w["traced"] and w["peak"] is None and w["off_cpu"] == [] and w["blocking_switches"] == 0


def test_rust_sync_channel_send_is_the_wait(tmp_path, procs, tracers):
    """The synth threads block in SyncSender::send inside hand_off (std's mpmc and futex frames
    folded): the wait is at the send call of the user's code, holding their partitions."""
    exe = build_rustd()
    src = (RUSTD_SRC / "src" / "main.rs").read_text().splitlines()
    send_line = next(i for i, line in enumerate(src, 1) if "(SEND_LINE)" in line)
    out = tmp_path / "rustd-wait.allocscope"
    tgt = procs(exe, "--partitions", "8", "--hold", "1", "--mb", "4", "--records", "10", "--gpu-ms", "400")
    tgt.expect("ready")
    tr = record_attached(tracers, tgt.pid, out, "--interval", "0.25")
    tgt.signal(signal.SIGUSR1)
    tgt.expect("done", timeout=60)
    stop_tracer(tr, 0.5)
    w = report_json(out)["waits"]
    send = [d for d in w["off_cpu"] if d["function"].endswith("hand_off")]
    assert len(send) == 1, [(d["function"], d["line"]) for d in w["off_cpu"]]
    send = send[0]
    assert send["file"].endswith("main.rs") and send["line"] == send_line, send
    assert all(n.startswith("synth-") for n in send["threads"]) and send["waits"] >= 3
    pk = w["peak"]["by_location"][0]
    assert pk["function"].endswith("hand_off") and pk["held_bytes"] >= pk["threads"] * (4 << 20)
    assert any(h["function"].endswith("synthesize_partition") for h in pk["held"])
