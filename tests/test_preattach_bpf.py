"""An allocator's memory mapped before the attach (issue 46): mimalloc's segments, found by their
shape. The retain target (tests/targets/retain/retain.c --warm) bursts once before the attach,
keeps one block in 32 and lets mimalloc decommit the rest (its segments stay mapped, abandoned
by the warm-up thread); after the attach it bursts again into those segments (no new mapping)
and frees 7 of 8 blocks. The target measures what appeared in its RSS since the attach; the
report's retained must be that less the live blocks, not "other anonymous" memory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import CFLAGS_FP, Proc, build, need, record_attached, report_json, stop_tracer

from reports.trace import load_trace

pytestmark = pytest.mark.bpf

SRC = Path(__file__).resolve().parent / "targets" / "retain" / "retain.c"
MIMALLOC = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
TRUTH = re.compile(r"truth (\S+) live=(\d+) retained=(\d+) resident=(\d+) rss=(\d+)")
MIB = 1 << 20


def test_mimalloc_segments_from_before_the_attach(tmp_path, tracers):
    retain = build(tmp_path / "retain", SRC, "-ldl", flags=[*CFLAGS_FP, "-Wall"])
    env = dict(os.environ, LD_PRELOAD=need([MIMALLOC], "mimalloc (a Debian package make setup installs)"))
    tgt = Proc([retain, "--blocks", "384", "--mib", "1", "--warm"], env=env, stdin=subprocess.PIPE)
    try:
        assert tgt.expect("ready").split()[2] == "mimalloc"
        out = tmp_path / "mi.allocscope"
        tr = record_attached(tracers, tgt.pid, out, "--interval", "0.5")
        time.sleep(0.8)  # an interval measures what mimalloc holds at the attach, before the burst
        tgt.signal(signal.SIGUSR1)
        m = TRUTH.match(tgt.expect("truth "))
        tgt.expect("freed")
        time.sleep(1.3)  # two intervals with the target still
        stop_tracer(tr, 0.6)
    finally:
        tgt.kill()
    live, retained = int(m[2]), int(m[3])
    assert live == 48 * MIB and retained > 250 * MIB, m[0]  # 336 of 384 MiB freed, not decommitted yet
    t = load_trace(out)
    first = t.allocators[t.allocators["seq"] == t.allocators["seq"].min()].set_index("source").loc["heap"]
    assert int(first["mapped_bytes"]) >= 384 * MIB  # the segments mapped before the attach are found
    rep = report_json(out)
    dec = rep["rss_decomposition"]
    mi = next(a for a in dec["allocators"] if a["kind"] == "mimalloc")
    assert abs(mi["live"] - live) <= 0.01 * live, (mi, m[0])
    assert abs(mi["retained"] - retained) <= 0.15 * retained, (mi, m[0])
    # what mimalloc held at the attach (the warm-up's kept blocks) is "before the attach or retained"
    assert mi["before_or_retained"] <= 16 * MIB, mi
    assert dec["other_anon_bytes"] < 0.10 * dec["rss_bytes"], dec
