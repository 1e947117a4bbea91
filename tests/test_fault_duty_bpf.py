"""Residency mode's page-fault events open a share of each second (--fault-duty, issue 50): they
are closed in between (the kernel's per-fault perf work gone with them), each sample stands for
fault_sample / duty pages, and the fault count stays exact (the process' own)."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import threading
import time
from pathlib import Path

import pytest
from bcc.perf import Perf
from support import cli_bg, report_json

from reports.trace import load_trace
from tracer.bpf.syscall import perf_event_bpf

pytestmark = pytest.mark.bpf
PAGE = 4096
SECONDS, MIB_PER_S = 6, 40  # toucher: 40 MiB of first touches a second, steadily, for 6 s


def perf_fds(pid: int) -> int:
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
            except OSError:
                pass
    except OSError:
        pass
    return n


def test_fault_events_open_a_tenth_of_the_time_and_the_estimate_holds(targets, tmp_path: Path):
    out = tmp_path / "duty.allocscope"
    tr = cli_bg(
        "record",
        "-q",
        "--mode",
        "residency",
        "-o",
        str(out),
        "--",
        str(targets["toucher"]),
        str(SECONDS),
        str(MIB_PER_S),
    )
    seen: list[int] = []
    while tr.poll() is None:  # the tracer's perf-event fds (tracepoints too), every 10 ms
        seen.append(perf_fds(tr.pid))
        time.sleep(0.01)
    assert tr.wait(60) == 0, tr.stderr.read() if tr.stderr else ""
    closed = max(set(seen), key=seen.count)  # the steady level: the tracepoints' events, no fault event
    steady = [n for n in seen if closed <= n <= closed + 2]  # start-up and shutdown aside
    assert closed + 2 in steady, sorted(set(seen))  # one event each on the main thread and "toucher"
    share = sum(n > closed for n in steady) / len(steady)
    assert 0.03 <= share <= 0.3, share  # open ~10 % of the time, closed in between

    touched = SECONDS * MIB_PER_S * 256  # pages
    t = load_trace(out)
    last = t.intervals.iloc[-1]
    assert touched <= int(last["n_faults"]) <= touched + 2000, int(last["n_faults"])  # exact: the process' own
    sites = t.final_sites()
    faults = sites[sites["source"] == "fault"]
    samples = int(last["n_fault_samples"])
    assert int(faults["alloc_count"].sum()) == 160 * samples  # 1 in 16, open 1/10 of the time
    rep = report_json(out)
    est = sum(
        s["alloc_count"]
        for s in rep["sites"]
        if s["frames"][0]["function"] == "touch_pages" and "fault" in s["sources"]
    )
    # time-sampled: ~6 windows of 0.1 s at random phases over a steady toucher
    assert 0.4 * touched <= est <= 2.0 * touched, (est, touched)


def test_a_thread_gone_before_its_event_opens_is_said_nowhere(capfd):
    """The duty cycle lists the target's threads and opens an event on each; one that exits in
    between gives ESRCH, which is ordinary: -ESRCH back, and nothing on stderr (libbcc's
    bpf_attach_perf_event_raw printed "perf_event_open failed: No such process" on the watch's
    terminal). A real event on this thread, the program fd left out: it opens, and closes."""
    attr = Perf.perf_event_attr()
    attr.type, attr.config, attr.size, attr.sample_period = 1, 2, ct.sizeof(attr), 1000
    t = threading.Thread(target=lambda: None)
    t.start()
    gone = t.native_id
    t.join()
    for _ in range(500):  # join() returns before the kernel thread is gone
        if not os.path.exists(f"/proc/self/task/{gone}"):
            break
        time.sleep(0.002)
    assert perf_event_bpf(attr, gone, 0) == -errno.ESRCH
    assert capfd.readouterr().err == ""
    fd = perf_event_bpf(attr, threading.get_native_id(), 0)  # prog fd 0: SET_BPF refuses it
    assert fd == -errno.EINVAL or fd == -errno.EBADF, fd
    assert capfd.readouterr().err == ""
