"""Per-interval site reads of what changed (issue 33, tracer/record/sitechanges.py, probes/changes.h).

One recording of tests/targets/sitechurn.c under --inject (every 4 KiB block sampled: the
counters are exact) with a buffer of 32 named keys per interval: 300 sites appear at once (an
overflow: the whole map is read), then one site changes per round (the named keys only), then 100
at once (overflow again), then one more. After each round, once the tracer has written three
more intervals, the `sites` parts written so far must give every site its exact cumulative
counters: a change the named keys missed would show only in the final snapshot (a whole-map
read), too late.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import CFLAGS_FP, TARGETS_SRC, attached, build, wait_for

pytestmark = pytest.mark.bpf

N, BURST, CAP = 300, 100, 32


def parts(out: Path, table: str) -> list[Path]:
    return sorted((out / "parts").glob(f"{table}-*.parquet"))


def site_state(out: Path) -> dict[tuple, tuple]:
    """Each site's latest counters in the parts written so far."""
    state: dict[tuple, tuple] = {}
    for p in parts(out, "sites"):
        for r in pq.read_table(p).to_pylist():
            state[(r["stack_id"], r["tid"], r["source"])] = (
                r["alloc_bytes"],
                r["alloc_count"],
                r["free_bytes"],
                r["free_count"],
            )
    return state


def check(out: Path, touched: int) -> None:
    """`touched` sites have had a second block (the first `touched` of them round robin)."""
    state = [v for k, v in site_state(out).items() if k[2] == "heap"]
    twice = [v for v in state if v == (8192, 2, 4096, 1)]
    once = [v for v in state if v == (4096, 1, 0, 0)]
    assert len(state) == N and len(twice) == touched and len(once) == N - touched, (
        len(state),
        len(twice),
        len(once),
        sorted(set(state))[:5],
    )


def test_changed_sites_exact_and_overflow(tmp_path, procs, tracers):
    exe = build(tmp_path / "sitechurn", TARGETS_SRC / "sitechurn.c", flags=CFLAGS_FP)
    tgt = procs(exe, N, BURST)
    tgt.expect("ready")
    out = tmp_path / "churn.allocscope"
    tr = tracers(
        "record",
        "--pid",
        tgt.pid,
        "--inject",
        "--sample-bytes",
        4096,
        "--unwind",
        "fp",
        "-o",
        out,
        "--interval",
        "0.2",
        "--wait-min",
        "0",
        "--site-changes",
        CAP,
    )
    wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
    assert tr.poll() is None, tr.stderr.read()

    def step(sig: int, touched: int) -> None:
        tgt.signal(sig)
        tgt.expect("ok")
        seen = len(parts(out, "intervals"))
        wait_for(lambda: len(parts(out, "intervals")) >= seen + 3, timeout=30, what="three more intervals")
        check(out, touched)

    step(signal.SIGUSR2, 0)  # 300 new sites: more than 32 named, the whole map read
    for r in range(1, 5):
        step(signal.SIGUSR1, r)  # one site: its key alone
    step(signal.SIGUSR2, 4 + BURST)  # 100 at once: overflow, the whole map again
    step(signal.SIGUSR1, 5 + BURST)
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()
    check(out, 5 + BURST)
    reads = json.loads((out / "meta.json").read_text())["interval_reads"]
    assert reads["site_changes"] == CAP, reads
    assert reads["overflows"] >= 2 and reads["unwritten"] == 0, reads
    assert reads["changed_reads"] >= 10, reads  # the one-site rounds: named keys only
    assert 3 <= reads["full_reads"] <= 8, reads  # first, the two bursts (each read twice), final
    assert 4 <= reads["keys_looked_up"] < 4 * N, reads
