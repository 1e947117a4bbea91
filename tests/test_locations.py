"""Locations: one row per place in the code, whatever the stacks that reach it (synthetic traces
with known counters; no BPF). A work-stealing pool reaches one allocation through many stacks: the
report, the diff and the text must show it as one location with the stacks' summed figures."""

from __future__ import annotations

import json

import pytest

from reports import analysis as A
from reports.analysis.diff import diff_traces
from reports.analysis.stacks import FrameInfo, collapse_recursion, group_of, key_quality, location_key
from reports.render.diff_text import diff_to_text
from reports.render.jsonout import to_json
from reports.render.text import to_text
from reports.trace import load_trace
from tests.synth import SynthTrace

MIB = 1 << 20
SYN = "synthesize_partition"
# Three ways a rayon-like pool reaches synthesize_partition (innermost first), all from the same
# line; the recursion differs from steal to steal.
PATHS = [
    ["__rust_alloc", SYN, "helper", "helper", "in_worker", "main_loop"],
    ["__rust_alloc", SYN, "helper", "join_context", "helper", "join_context", "helper", "in_worker", "main_loop"],
    ["__rust_alloc", SYN, "run_inline", "helper", "in_worker", "main_loop"],
]


def _stack(t: SynthTrace, fns: list[str], line: int = 42) -> int:
    files = ["alloc.rs"] + ["main.rs"] * (len(fns) - 1)
    lines = [10, line] + [100 + len(f) for f in fns[2:]]  # a function calls its callee from one line
    return t.stack(fns, files, lines)


def _pool_trace(path, n_live: int, pw: int, id_base: int = 0x1000, ip_base: int = 0x400000) -> str:
    """Each path holds a known number of 16 MiB partitions over 6 intervals (one grows by one per
    interval on the first path); another site (a request record at another line) holds 2000 x 1000
    B. Interval counters are cumulative."""
    t = SynthTrace(path, labels={"pw": str(pw)}, id_base=id_base, ip_base=ip_base)
    t.thread(11, "synth-0")
    t.thread(12, "synth-1")
    ids = [_stack(t, p) for p in PATHS]
    rec = t.stack(["malloc", "make_request_record", "serve"], ["m.c", "main.rs", "main.rs"], [1, 77, 80])
    held = [n_live - 2, 1, 1]
    for i in range(1, 7):
        sites = {}
        for k, sid in enumerate(ids):
            live = held[k] if k else max(1, held[0] - 6 + i)
            allocs = live + 2 * k + i  # some freed: allocs - live partitions freed
            sites[(sid, 11 + k % 2)] = (allocs * 16 * MIB, allocs, (allocs - live) * 16 * MIB, allocs - live)
        sites[(rec, 11)] = (2000 * 1000, 2000, 0, 0)
        t.interval(sites, rss=1 << 30)
    return t.close()


def test_group_of_and_keys():
    f = FrameInfo(SYN, "/opt/rustd/target/release/rustd", "/src/rustd/src/main.rs", 42)
    site = (f, FrameInfo("helper", f.module, "/r/rayon.rs", 9))
    assert group_of(site, "stack") == site
    assert group_of(site, "location") == (f,)
    assert group_of(site, "function") == (FrameInfo(SYN, f.module, None, None),)
    assert location_key(group_of(site, "location")) == f"{SYN}|rustd|main.rs:42"
    assert key_quality(f) == "line"
    assert key_quality(FrameInfo(SYN, "m", None, None)) == "function"
    assert key_quality(FrameInfo("rustd+0x1f2e", "m", None, None)) == "address"
    assert key_quality(FrameInfo("[stack lost]", "", None, None)) == "address"


def test_collapse_recursion():
    a, b, c, d = "a", "b", "c", "d"
    assert collapse_recursion([a, b, c, b, c, b, c, d]) == [([a], 1), ([b, c], 3), ([d], 1)]
    assert collapse_recursion([a, a, a, a]) == [([a], 4)]
    assert collapse_recursion([a, b, c]) == [([a], 1), ([b], 1), ([c], 1)]
    assert collapse_recursion([]) == []


def test_location_is_one_row_with_the_stacks_summed(tmp_path):
    t = load_trace(_pool_trace(tmp_path / "a.allocscope", n_live=5, pw=2))
    doc = A.build_report(t)
    assert doc["by"] == "location"
    syn_sites = [s for s in doc["sites"] if s["frames"][0]["function"] == SYN]
    assert len(syn_sites) == 3  # three stacks...
    locs = [x for x in doc["locations"] if x["function"] == SYN]
    assert len(locs) == 1  # ...one location
    loc = locs[0]
    assert doc["locations"][0] is loc  # the most live, first
    assert (loc["live_bytes"], loc["live_count"]) == (5 * 16 * MIB, 5)
    assert loc["live_bytes"] == sum(s["live_bytes"] for s in syn_sites)
    assert loc["alloc_count"] == sum(s["alloc_count"] for s in syn_sites)
    assert loc["location"] == f"{SYN}|synthd|main.rs:42" and loc["key_quality"] == "line"
    assert (loc["file"], loc["line"]) == ("main.rs", 42)
    assert loc["n_stacks"] == 3
    assert sorted(loc["stacks"]) == sorted(s["rank"] for s in syn_sites)
    # its stacks holding most first: the first path holds 3 partitions
    first = next(s for s in doc["sites"] if s["rank"] == loc["stacks"][0])
    assert first["live_bytes"] == 3 * 16 * MIB
    assert loc["frames"] == first["frames"]  # frames: the largest stack's
    assert all(s["location"] == loc["location"] for s in syn_sites)
    # the peak of the sum: the first path rose 1 partition per interval to 3, the others held 1
    assert loc["peak_live_bytes"] == 5 * 16 * MIB
    assert loc["timeline"] == [16 * MIB * (2 + min(3, max(1, 3 - 6 + i))) for i in range(1, 7)]
    assert {x["tid"] for x in loc["threads"]} == {11, 12}
    rec = next(x for x in doc["locations"] if x["function"] == "make_request_record")
    assert (rec["live_bytes"], rec["live_count"], rec["n_stacks"]) == (2000 * 1000, 2000, 1)
    assert doc["locations"][1] is rec
    json.loads(to_json(doc))  # strict JSON


def test_text_report_lists_locations_and_their_largest_stacks(tmp_path):
    doc = A.build_report(load_trace(_pool_trace(tmp_path / "a.allocscope", n_live=5, pw=2)))
    text = to_text(doc)
    assert "Top 2 of 2 locations by live bytes" in text
    assert "(4 distinct stacks; --by stack lists them)" in text
    tables = text[text.index("\nTotals\n") :]  # below the findings, which name it too
    rows = [ln for ln in tables.splitlines() if SYN in ln and "80.0 MiB" in ln]
    assert len(rows) == 1 and rows[0].split()[1:3] == ["80.0", "MiB"]
    assert "reached by 3 stacks:" in text
    assert "stack #1: 48.0 MiB live in 3 blocks" in text
    # recursion collapsed: helper < join_context twice shown once with x2
    assert "×2 (recursion)" in text
    by_stack = to_text(A.build_report(load_trace(tmp_path / "a.allocscope"), by="stack"))
    assert "Top 4 of 4 sites by live bytes" in by_stack
    by_stack = by_stack[by_stack.index("\nTotals\n") :]
    assert sum(1 for ln in by_stack.splitlines() if ln.strip().startswith(tuple("1234")) and SYN in ln) == 3


def test_by_function_merges_lines(tmp_path):
    t = SynthTrace(tmp_path / "f.allocscope")
    a = t.stack(["malloc", "fill", "main"], ["m.c", "f.c", "f.c"], [1, 10, 50])
    b = t.stack(["malloc", "fill", "main"], ["m.c", "f.c", "f.c"], [1, 12, 51])
    t.interval({(a, 1): (300, 3, 0, 0), (b, 1): (7000, 7, 0, 0)})
    tr = load_trace(t.close())
    assert [x["live_bytes"] for x in A.build_report(tr)["locations"]] == [7000, 300]
    doc = A.build_report(tr, by="function")
    assert [(x["function"], x["live_bytes"], x["live_count"], x["n_stacks"]) for x in doc["locations"]] == [
        ("fill", 7300, 10, 2)
    ]
    assert doc["locations"][0]["key_quality"] == "function"
    assert "Top 1 of 1 functions" in to_text(doc)


LIBX, LIBC = "/opt/vendor/libx.so.3", "/lib/x86_64-linux-gnu/libc.so.6"


def test_weak_keys_are_said_and_never_merge_addresses(tmp_path):
    # a stack without any symbol: one location per return address
    t = SynthTrace(tmp_path / "w.allocscope")
    a = t.stack(["malloc", "libx.so.3+0x1200", "libx.so.3+0x1f00"], module=[LIBC, LIBX, LIBX])
    b = t.stack(["malloc", "libx.so.3+0x1300", "libx.so.3+0x1f00"], module=[LIBC, LIBX, LIBX])
    t.interval({(a, 1): (100, 1, 0, 0), (b, 1): (200, 2, 0, 0)})
    doc = A.build_report(load_trace(t.close()))
    assert [(x["function"], x["key_quality"]) for x in doc["locations"]] == [
        ("libx.so.3+0x1300", "address"),
        ("libx.so.3+0x1200", "address"),
    ]
    assert "(no symbol: one location per address)" in to_text(doc)


def test_stripped_module_frames_under_their_symbolized_caller(tmp_path):
    """A stripped library's internals that malloc (the driver's own memory inside libcuda): their
    bytes are one location per stripped module and innermost caller with a symbol ("inside
    libx.so.3, called from x_init"), whatever the return addresses inside; another caller is
    another location; the stacks stay under it."""
    t = SynthTrace(tmp_path / "s.allocscope")
    exe = "/usr/bin/synthd"
    m5 = [LIBC, LIBX, LIBX, LIBX, exe]
    # x_init (exported, in .dynsym) reaches malloc through two internal paths, 3 addresses
    i1 = t.stack(["malloc", "libx.so.3+0x1200", "libx.so.3+0x1800", "x_init", "main"], module=m5)
    i2 = t.stack(["malloc", "libx.so.3+0x1340", "x_init", "main"], module=[LIBC, LIBX, LIBX, exe])
    i3 = t.stack(["malloc", "libx.so.3+0x1200", "libx.so.3+0x1800", "x_init", "setup"], module=m5)
    # x_open: the same internals, another caller
    o1 = t.stack(["malloc", "libx.so.3+0x1200", "libx.so.3+0x1a00", "x_open", "main"], module=m5)
    # the program's own code at a stripped address: its caller's name, inside the program
    p1 = t.stack(["malloc", "synthd+0x4400", "serve", "main"], ["m.c", None, "s.c", "s.c"], [1, None, 12, 40])
    # a stripped program's frames under libc's start (a thread's, main's): the whole program would
    # be one row — they keep their addresses
    s1 = t.stack(["malloc", "synthd+0x5100", "synthd+0x5800", "start_thread"], module=[LIBC, exe, exe, LIBC])
    s2 = t.stack(["malloc", "synthd+0x5200", "synthd+0x5800", "start_thread"], module=[LIBC, exe, exe, LIBC])
    t.interval(
        {
            (i1, 1): (1000, 10, 0, 0),
            (i2, 1): (300, 3, 0, 0),
            (i3, 2): (64, 1, 0, 0),
            (o1, 1): (7000, 7, 1000, 1),
            (p1, 1): (50, 1, 0, 0),
            (s1, 3): (40, 1, 0, 0),
            (s2, 3): (30, 1, 0, 0),
        }
    )
    doc = A.build_report(load_trace(t.close()))
    locs = [
        (x["function"], x.get("inside"), x["live_bytes"], x["live_count"], x["n_stacks"], x["key_quality"])
        for x in doc["locations"]
    ]
    assert locs == [
        ("x_open", LIBX, 6000, 6, 1, "inside"),
        ("x_init", LIBX, 1364, 14, 3, "inside"),
        ("serve", "/usr/bin/synthd", 50, 1, 1, "inside"),
        ("synthd+0x5100", None, 40, 1, 1, "address"),
        ("synthd+0x5200", None, 30, 1, 1, "address"),
    ]
    keys = [x["location"] for x in doc["locations"]]
    assert keys[:3] == [
        "x_open|libx.so.3||inside=libx.so.3",
        "x_init|libx.so.3||inside=libx.so.3",
        "serve|synthd|s.c:12|inside=synthd",
    ]
    # every site names its location; the sites keep their own frames
    assert sorted(x["location"] for x in doc["sites"]) == sorted([keys[1]] * 3 + [keys[0]] + keys[2:])
    assert {x["frames"][0]["function"] for x in doc["sites"]} == {
        "libx.so.3+0x1200",
        "libx.so.3+0x1340",
        "synthd+0x4400",
        "synthd+0x5100",
        "synthd+0x5200",
    }
    text = to_text(doc)
    assert "inside libx.so.3, called from x_init  [libx.so.3]" in text
    assert "inside synthd, called from serve s.c:12  [synthd]" in text
    noted = {
        ln.split("  [")[0].split()[-1] for ln in text.splitlines() if "(no symbol: one location per address)" in ln
    }
    assert noted == {"synthd+0x5100", "synthd+0x5200"}
    # by function: the same keys without lines
    fdoc = A.build_report(load_trace(tmp_path / "s.allocscope"), by="function")
    assert [(x["function"], x["live_bytes"]) for x in fdoc["locations"]] == [
        ("x_open", 6000),
        ("x_init", 1364),
        ("serve", 50),
        ("synthd+0x5100", 40),
        ("synthd+0x5200", 30),
    ]


def test_diff_matches_locations_across_runs(tmp_path):
    # the same program, another run: other stack ids and addresses, and other stacks (B has a
    # fourth path A never took) — the location matches, its ratio is over the whole place
    a = load_trace(_pool_trace(tmp_path / "a.allocscope", n_live=5, pw=2))
    tb = SynthTrace(tmp_path / "b.allocscope", labels={"pw": "4"}, id_base=0x9000, ip_base=0x7F0000)
    tb.thread(21, "synth-0")
    paths = PATHS[1:] + [["__rust_alloc", SYN, "helper", "helper", "helper", "in_worker", "main_loop"]]
    ids = [_stack(tb, p) for p in paths]
    rec = tb.stack(["malloc", "make_request_record", "serve"], ["m.c", "main.rs", "main.rs"], [1, 77, 80])
    for _ in range(6):
        tb.interval(
            {
                (ids[0], 21): (4 * 16 * MIB, 4, 0, 0),
                (ids[1], 21): (3 * 16 * MIB, 3, 0, 0),
                (ids[2], 21): (3 * 16 * MIB, 3, 0, 0),
                (rec, 21): (2000 * 1000, 2000, 0, 0),
            }
        )
    b = load_trace(tb.close())
    doc = diff_traces(a, b, per="pw")
    locs = doc["locations"]
    syn = [x for x in locs if x["function"] == SYN]
    assert len(syn) == 1 and syn[0]["in"] == "both"
    x = syn[0]
    assert (x["a_peak_live_bytes"], x["b_peak_live_bytes"]) == (5 * 16 * MIB, 10 * 16 * MIB)
    assert x["ratio"] == pytest.approx(2.0) and x["scaling"] == pytest.approx(1.0)
    assert x["location"] == f"{SYN}|synthd|main.rs:42"
    assert not x["flagged"]
    assert not [y for y in locs if y["in"] != "both"]  # nothing new, nothing gone
    assert any(y["in"] != "both" for y in doc["sites"])  # while the stacks do not all match
    text = diff_to_text(doc)
    assert "of 2 locations" in text and " new " not in text
    assert sum(1 for ln in text.splitlines() if SYN in ln and "2.00x" in ln) == 1


def test_verdict_new_until_the_fit_has_its_points(tmp_path):
    t = SynthTrace(tmp_path / "n.allocscope")
    s = t.stack(["malloc", "grow", "main"])
    for i in range(1, 4):
        t.interval({(s, 1): (i * MIB, i, 0, 0)})
    doc = A.build_report(load_trace(t.close()))
    assert doc["locations"][0]["verdict"] == "new"
    assert doc["locations"][0]["growth_bytes_per_s"] == pytest.approx(MIB)


def test_recording_allocators_contract(tmp_path):
    t = SynthTrace(tmp_path / "r.allocscope")
    allocs = [
        {
            "kind": "jemalloc",
            "module": "/usr/bin/rustd",
            "attached": ["malloc"],
            "skipped": {},
            "placement": {"malloc": "entry"},
        }
    ]
    t.meta["probes"]["allocators"] = allocs
    t.w.write_meta(t.meta)
    s = t.stack(["malloc", "f", "main"])
    t.interval({(s, 1): (10, 1, 0, 0)})
    doc = A.build_report(load_trace(t.close()))
    assert doc["recording"]["allocators"] == allocs
