"""Issue 19's shapes, recorded: one allocation site reached through many stacks.

* rustd (tests/targets/rustd, a cargo build over Debian's crates: tests/rust_targets.py): a rayon
  pool synth-0..3 building 16 MiB partitions by Vec::push, a gpu thread keeping the last H, a
  tokio runtime (tokio-rt) allocating request records, all through a #[global_allocator] over
  the statically linked `_rjem_` jemalloc; release build, no frame pointers (DWARF unwinding);
* recurse (tests/targets/recurse.c, -O2 -fomit-frame-pointer): make_block(), one malloc, under
  walk/even/odd recursion from threads rec-0..2.

The figures are exact against the ground truth each target prints on its `done` line: each
function is ONE location (locations[]) holding exactly the live blocks, first in the report, and
the sum of its sites (one per stack; how many is printed, not asserted: 14-26 for the partitions,
~23 for make_block) gives the same; the diff of two rustd runs of different size matches the
partition location in both and computes its ratio from the whole place.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from rust_targets import build_rustd
from support import TARGETS_SRC, attached, build, cli, functions, report_json, report_json_text, wait_for

from reports.render.diff_text import diff_to_text

pytestmark = pytest.mark.bpf

NOFP_CFLAGS = ["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-Wall"]


def record(procs, tracers, out: Path, argv: list, labels: tuple = ()) -> dict:
    """record_run's protocol (ready, SIGUSR1, done), keeping the ground truth of `done {json}`."""
    tgt = procs(*argv)
    tgt.expect("ready")
    tr = tracers("record", "--pid", tgt.pid, "-o", out, "--interval", "0.5", *labels)
    wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
    assert tr.poll() is None, tr.stderr.read()
    tgt.signal(signal.SIGUSR1)
    truth = json.loads(tgt.expect("done", timeout=60).split(" ", 1)[1])
    time.sleep(0.6)
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()
    return truth


# Rust allocator frames a site must not keep (reports/analysis/stacks.py folds them): the program's
# GlobalAlloc impl, the shims `__rustc::__rust_alloc`..., `<alloc::alloc::Global>::grow_impl`,
# `<u8 as alloc::vec::spec_from_elem::SpecFromElem>`.
RUST_ALLOC_FRAME = re.compile(
    r"as core::alloc::global::GlobalAlloc>::|^(__rustc::)?__r(ust|dl|g)_"
    r"|^<?alloc::|^<\S+ as alloc::"
)


def innermost(site: dict) -> str:
    return site["frames"][0]["function"]


def location(rep: dict, needle: str) -> dict:
    """The one location whose function contains `needle` (several: the test fails)."""
    found = [x for x in rep["locations"] if needle in x["function"]]
    assert len(found) == 1, [(x["location"], x["live_bytes"]) for x in found]
    return found[0]


def by_innermost(rep: dict, needle: str) -> dict:
    """Sites whose innermost frame's function contains `needle`, summed."""
    sites = [s for s in rep["sites"] if needle in innermost(s)]
    return {
        "sites": sites,
        "live_bytes": sum(s["live_bytes"] for s in sites),
        "live_count": sum(s["live_count"] for s in sites),
        "alloc_count": sum(s["alloc_count"] for s in sites),
        "threads": {t["name"] for s in sites for t in s["threads"]},
        "stacks": {tuple(functions(s["frames"])) for s in sites},
    }


def describe(name: str, agg: dict) -> None:
    print(
        f"\n{name}: {len(agg['sites'])} sites, {len(agg['stacks'])} distinct stacks, "
        f"live {agg['live_bytes']} B in {agg['live_count']}, threads {sorted(agg['threads'])}"
    )
    raw = sum(1 for s in agg["sites"] if name in s["frames"][0]["function"])
    print(f"  sites whose frames[0] itself is {name}: {raw}")
    if agg["sites"]:
        print("  frames[0:4] of the first:", json.dumps(agg["sites"][0]["frames"][:4]))


def test_rustd_partitions_records(tmp_path, procs, tracers):
    exe = build_rustd()
    out = tmp_path / "rustd.allocscope"
    truth = record(procs, tracers, out, [exe, "--partitions", 16, "--hold", 3])
    assert truth == {
        "partition_bytes": 16 << 20,
        "partitions": 16,
        "partitions_live": 3,
        "partitions_dropped": 13,
        "records": 2000,
        "record_bytes": 1000,
        "staging_bytes": (2 << 20) + 8192,
    }
    rep = report_json(out)
    probes = rep["recording"]["probes"]
    allocs = {(a["kind"], a["prefix"]): a for a in probes["allocators"]}
    rjem = allocs[("jemalloc", "_rjem_")]
    assert rjem["module"] == str(exe) and rjem["source"] == "heap:jemalloc:_rjem_", rjem
    assert {"_rjem_mallocx", "_rjem_rallocx", "_rjem_sdallocx"} <= set(rjem["attached"]), rjem

    part = by_innermost(rep, "synthesize_partition")
    recs = by_innermost(rep, "make_request_record")
    stage = by_innermost(rep, "gpu_staging_buffer")
    for name, agg in (("synthesize_partition", part), ("make_request_record", recs), ("gpu_staging_buffer", stage)):
        describe(name, agg)
    print("top sites' innermost frames:", [innermost(s) for s in rep["sites"][:12]])
    assert not [s["frames"][0] for s in rep["sites"] if RUST_ALLOC_FRAME.search(innermost(s)) and s["live_bytes"]], (
        "an allocator frame left as a site's innermost frame"
    )

    # one location each, exact, the partitions first
    loc = location(rep, "synthesize_partition")
    assert rep["locations"][0] is loc
    assert (loc["live_bytes"], loc["live_count"], loc["alloc_count"]) == (
        part["live_bytes"],
        part["live_count"],
        part["alloc_count"],
    )
    assert loc["live_count"] == truth["partitions_live"]
    assert loc["key_quality"] == "line" and loc["file"].endswith("main.rs") and loc["line"]
    assert loc["n_stacks"] == len(part["sites"]) and sorted(loc["stacks"]) == sorted(s["rank"] for s in part["sites"])
    assert all(s["location"] == loc["location"] for s in part["sites"])
    print(f"synthesize_partition: one location {loc['location']} over {loc['n_stacks']} stacks")
    rl, sl = location(rep, "make_request_record"), location(rep, "gpu_staging_buffer")
    assert (rl["live_bytes"], rl["live_count"]) == (truth["records"] * truth["record_bytes"], truth["records"])
    assert (sl["live_bytes"], sl["live_count"]) == (truth["staging_bytes"], 1)
    assert {t["name"] for t in loc["threads"]} <= {f"synth-{i}" for i in range(4)}

    assert (part["live_bytes"], part["live_count"]) == (
        truth["partitions_live"] * truth["partition_bytes"],
        truth["partitions_live"],
    )
    assert part["threads"] and all(t.startswith("synth-") for t in part["threads"]), part["threads"]
    assert (recs["live_bytes"], recs["live_count"], recs["alloc_count"]) == (
        truth["records"] * truth["record_bytes"],
        truth["records"],
        truth["records"],
    )
    assert recs["threads"] == {"tokio-rt"}, recs["threads"]
    assert (stage["live_bytes"], stage["live_count"], stage["threads"]) == (truth["staging_bytes"], 1, {"gpu"})
    assert rep["totals"]["lost_events"] == 0


def test_recurse_one_site(tmp_path, procs, tracers):
    exe = build(tmp_path / "recurse", TARGETS_SRC / "recurse.c", flags=NOFP_CFLAGS)
    out = tmp_path / "recurse.allocscope"
    truth = record(procs, tracers, out, [exe])
    assert truth == {
        "block_bytes": (3 << 20) + 4096,
        "blocks": 36,
        "live": 7,
        "live_bytes": 7 * ((3 << 20) + 4096),
        "threads": 3,
    }
    rep, report_text = report_json_text(out)  # `report --format json`, and its text
    assert json.loads((out / "meta.json").read_text())["unwind"]["mode"] == "dwarf"
    blk = by_innermost(rep, "make_block")
    describe("make_block", blk)
    assert (blk["live_bytes"], blk["live_count"], blk["alloc_count"]) == (
        truth["live_bytes"],
        truth["live"],
        truth["blocks"],
    )
    assert blk["threads"] == {"rec-0", "rec-1", "rec-2"}, blk["threads"]
    assert rep["totals"]["lost_events"] == 0
    loc = location(rep, "make_block")
    assert rep["locations"][0] is loc and len(blk["sites"]) > 1
    assert (loc["live_bytes"], loc["live_count"], loc["alloc_count"]) == (
        truth["live_bytes"],
        truth["live"],
        truth["blocks"],
    )
    assert {t["name"] for t in loc["threads"]} == {"rec-0", "rec-1", "rec-2"}
    assert loc["n_stacks"] == len(blk["sites"]) and loc["file"].endswith("recurse.c")
    text = report_text  # what `allocscope report OUT` prints
    tables = text[text.index("\nTotals\n") :]  # below the findings, which name it too
    rows = [ln for ln in tables.splitlines() if "make_block recurse.c" in ln and "MiB" in ln]
    assert rows and rows[0].split()[1:3] == ["21.0", "MiB"], text  # 7 x 3 MiB + 4 KiB, one row
    assert f"reached by {loc['n_stacks']} stacks" in text
    assert "(recursion)" in text or "×" in text  # walk/even/odd runs collapsed when a stack is shown


def test_rustd_diff_matches_the_location(tmp_path, procs, tracers):
    exe = build_rustd()
    a, b = tmp_path / "a.allocscope", tmp_path / "b.allocscope"
    ta = record(procs, tracers, a, [exe, "--partitions", 12, "--hold", 2, "--mb", 8], ("--label", "pw=2"))
    tb = record(procs, tracers, b, [exe, "--partitions", 24, "--hold", 4, "--mb", 8], ("--label", "pw=4"))
    doc = json.loads(cli("diff", str(a), str(b), "--per", "pw", "--format", "json", check=True).stdout)
    assert doc["by"] == "location"
    syn = [x for x in doc["locations"] if "synthesize_partition" in x["function"]]
    assert len(syn) == 1 and syn[0]["in"] == "both", syn
    x = syn[0]
    assert (x["a_live_bytes"], x["b_live_bytes"]) == (
        ta["partitions_live"] * ta["partition_bytes"],
        tb["partitions_live"] * tb["partition_bytes"],
    )
    ra, rb = (location(report_json(p), "synthesize_partition") for p in (a, b))
    assert (x["a_peak_live_bytes"], x["b_peak_live_bytes"]) == (ra["peak_live_bytes"], rb["peak_live_bytes"])
    assert x["ratio"] == pytest.approx(rb["peak_live_bytes"] / ra["peak_live_bytes"], rel=1e-3)
    assert x["scaling"] == pytest.approx(x["ratio"] / 2, rel=1e-3)
    for fn in ("make_request_record", "gpu_staging_buffer"):
        [y] = [y for y in doc["locations"] if fn in y["function"]]
        assert y["in"] == "both" and y["a_live_bytes"] == y["b_live_bytes"] and y["b_live_bytes"] > 0
    stacks_only = [
        s for s in doc["sites"] if s["in"] != "both" and "synthesize_partition" in s["frames"][0]["function"]
    ]
    print(f"\nper stack, {len(stacks_only)} synthesize_partition sites are only in A or B; per location: none")
    # the text of that same document, as `diff` without --format prints it (diff_to_text: one CLI
    # run and its symbolization of the two traces, not two)
    text = diff_to_text(doc)
    tables = text[text.index("\nTotals\n") :]  # below the findings
    assert sum(1 for ln in tables.splitlines() if "synthesize_partition" in ln and "x" in ln and "MiB" in ln) == 1


def test_rustd_dry_run_finds_rjem(tmp_path, procs):
    exe = build_rustd()
    tgt = procs(exe, "--partitions", 4, "--hold", 1, "--mb", 1)
    tgt.expect("ready")
    p = cli("record", "--pid", str(tgt.pid), "--dry-run", check=True)
    assert "_rjem_" in p.stdout and "_rjem_mallocx" in p.stdout, p.stdout
