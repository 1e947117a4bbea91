"""Peak snapshots (issue #32): a burst shorter than the interval, its allocation function reached
through 8 callers (tests/targets/burst.c: 8 threads hold 384 MiB together for 100 ms, then free).
The kernel wakes the tracer when the live total passes its high-water mark by the margin, the
tracer reads the per-stack counters at once, so the at-peak table, `at_peak.live_bytes` and the
location's own peak are the program's own count within the margin — text, JSON, diff."""

from __future__ import annotations

import json
import re

import pytest
from support import cli, record_run, report_json

from reports.trace import load_trace

pytestmark = pytest.mark.bpf


def test_burst_shorter_than_interval(targets, procs, tracers, tmp_path):
    out = tmp_path / "burst.allocscope"
    tgt_lines: list[str] = []

    def argv_procs(*argv):
        p = procs(*argv)
        orig = p.expect

        def expect(prefix, timeout=60):
            line = orig(prefix if prefix != "done" else "held", timeout)
            tgt_lines.append(line)
            return orig("done", timeout) if prefix == "done" else line

        p.expect = expect
        return p

    tr = record_run(argv_procs, tracers, out, [targets["burst"]], interval="1")
    m = re.match(r"held (\d+) keep (\d+)", tgt_lines[-1])
    assert m, tgt_lines
    burst, keep = int(m[1]), int(m[2])
    assert burst == 384 << 20
    t = load_trace(out)
    iv = t.intervals
    snaps = iv[iv["peak_snapshot"] == 1]
    assert len(snaps) >= 1, iv[["seq", "live_bytes", "peak_snapshot"]]
    rep = report_json(out)
    tot, peak = rep["totals"], rep["at_peak"]
    margin = tot["peak_margin_bytes"]
    assert margin == max(tot["peak_live_bytes"] // 100, 1 << 20)
    # the total's peak is the kernel's high-water mark, exact
    assert burst + keep <= tot["peak_live_bytes"] <= burst + keep + (1 << 20), tot
    # the moment of the peak is a peak snapshot, within the margin of it
    assert peak["peak_snapshot"] is True, peak
    assert peak["margin_bytes"] == margin
    assert tot["peak_live_bytes"] - margin <= peak["live_bytes"] <= tot["peak_live_bytes"], (peak, tot)
    assert tot["intervals"] + tot["peak_snapshots"] == int(iv["seq"].max())
    # record's summary line counts the intervals as the report does, not the peak snapshots
    summary = tr.stderr.read()
    assert f": {tot['intervals']} interval{'' if tot['intervals'] == 1 else 's'} in " in summary, (summary, tot)
    [loc] = [x for x in rep["locations"] if x["function"] == "burst_alloc"]
    assert loc["n_stacks"] == 8
    # the location's own peak and its bytes at the peak: the program's count, within the margin
    assert burst - margin <= loc["peak_live_bytes"] <= burst, loc["peak_live_bytes"]
    assert burst - margin <= loc["at_peak_bytes"] <= burst, loc["at_peak_bytes"]
    assert loc["at_peak_rank"] == 1
    assert loc["live_bytes"] == 0
    # per-location peaks and the total's peak agree within the margin
    assert loc["peak_live_bytes"] <= tot["peak_live_bytes"]
    assert tot["peak_live_bytes"] - loc["peak_live_bytes"] <= margin + keep
    # the text: "Held at the peak" leads (the burst was freed), burst_alloc first with its bytes
    text = cli("report", str(out), "--by", "location", check=True).stdout
    assert "Held at the peak" in text and "a peak snapshot within" in text, text[:2000]
    held = text[text.index("Held at the peak") :]
    first = next(line for line in held.splitlines() if re.match(r"\s+1\s", line))
    assert "burst_alloc" in first, first
    mib = float(re.search(r"([\d.]+) MiB", first)[1])
    assert abs(mib * (1 << 20) - burst) <= margin, first
    # the flame graph's at-peak view holds the burst
    from reports.analysis import symbolize_stacks
    from reports.render.html import flame_data

    views = flame_data(t, rep, symbolize_stacks(t))
    assert views["default"] == "peak"
    assert burst - margin <= views["views"]["peak"]["v"] <= tot["peak_live_bytes"]
    # diff: a_/b_peak of the location
    doc = json.loads(cli("diff", str(out), str(out), "--format", "json", check=True).stdout)
    [d] = [x for x in doc["locations"] if x["function"] == "burst_alloc"]
    assert d["a_peak_live_bytes"] == d["b_peak_live_bytes"] == loc["peak_live_bytes"]
    print(
        f"\nburst {burst} + keep {keep}: total peak {tot['peak_live_bytes']}, at the peak {peak['live_bytes']} "
        f"(peak snapshot at {peak['elapsed_s']} s), location peak {loc['peak_live_bytes']}, at peak "
        f"{loc['at_peak_bytes']}; margin {margin}; {tot['peak_snapshots']} peak snapshots, "
        f"{tot['intervals']} intervals; tracer: {t.meta.get('peaks')}"
    )
