"""Real probes on tests/targets/apis.c and busy.c, whose allocations are known exactly.

Sizes and counts below are the constants of apis.c; every figure is asserted to the byte.
"""

from __future__ import annotations

import ctypes as ct
import json
import os
import signal
import time
from collections import defaultdict

import pytest
from support import attached, cli, functions, report_json, wait_for

from tracer.bpf.objects import prog_exists, prog_names, tracer_objects

pytestmark = pytest.mark.bpf

PAGE = 4096
# innermost user function -> (live bytes, live blocks, allocations, thread)
EXPECTED = {
    "leak_malloc": (7 * 1013, 7, 7, "alpha"),
    "leak_calloc": (11 * 17 * 61, 11, 11, "alpha"),
    "leak_realloc": (3 * 5003, 3, 6, "alpha"),  # 3 malloc(100) grown by realloc to 5003
    "leak_reallocarray": (5 * 13 * 97, 5, 5, "alpha"),
    "leak_posix_memalign": (3 * 777, 3, 3, "alpha"),
    "leak_aligned_alloc": (2 * 2048, 2, 2, "alpha"),
    "leak_memalign": (2 * 999, 2, 2, "alpha"),  # same address as aligned_alloc in glibc
    "leak_valloc": (2 * 3001, 2, 2, "alpha"),
    "leak_pvalloc": (5000, 1, 1, "alpha"),
    "churn": (0, 0, 1000, "alpha"),
    "big_malloc": (1048583, 1, 1, "alpha"),
    "map_partial": (3 * PAGE, 1, 1, "alpha"),  # 5 pages, 2 unmapped
    "map_remap": (9 * PAGE, 1, 1, "alpha"),  # 4 pages grown to 9
    "map_shrink": (2 * PAGE, 1, 1, "alpha"),  # 8 pages shrunk to 2
    "map_full_unmap": (0, 0, 1, "alpha"),
    "handoff_alloc": (0, 0, 29, "alpha"),  # freed by beta
    "leak_beta": (13 * 2203, 13, 13, "beta"),
}


def by_function(rep: dict) -> dict[str, dict]:
    """Aggregate report sites by their innermost (folded) frame function."""
    agg: dict[str, dict] = defaultdict(
        lambda: {
            "live_bytes": 0,
            "live_count": 0,
            "alloc_count": 0,
            "alloc_bytes": 0,
            "threads": defaultdict(int),
            "sites": [],
        }
    )
    for s in rep["sites"]:
        fn = s["frames"][0]["function"]
        a = agg[fn]
        for k in ("live_bytes", "live_count", "alloc_count", "alloc_bytes"):
            a[k] += s[k]
        for t in s["threads"]:  # live bytes by allocating thread name (0 for sites that net out)
            a["threads"][t["name"]] += t["live_bytes"]
        a["sites"].append(s)
    return agg


def check_apis_report(rep: dict, launched: bool) -> None:
    assert rep["schema"] == "allocscope.report/1"
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    agg = by_function(rep)
    for fn, (live, count, allocs, thread) in EXPECTED.items():
        assert fn in agg, f"no site for {fn}; sites: {sorted(agg)}"
        a = agg[fn]
        assert (a["live_bytes"], a["live_count"], a["alloc_count"]) == (live, count, allocs), (fn, a)
        assert set(a["threads"]) == {thread}, (fn, a["threads"])
        assert dict(a["threads"]) == {thread: live}, (fn, a["threads"])  # every live byte is that thread's
    # churn nets out; its peak is one block
    assert agg["churn"]["alloc_bytes"] == 1000 * 4099
    assert max(s["peak_live_bytes"] for s in agg["churn"]["sites"]) == 4099
    # frames in order, immediate caller present on both stack paths: uretprobe (malloc family)
    # and syscall tracepoint (mmap family, word at the user sp)
    for fn in ("leak_malloc", "map_partial", "leak_beta"):
        site = agg[fn]["sites"][0]
        names = functions(site["frames"])
        main = "beta_main" if fn == "leak_beta" else "alpha_main"
        assert names[:3] == [fn, main, "start_thread"], names
        assert site["frames"][0]["file"].endswith("apis.c") and site["frames"][0]["line"] > 0
    # glibc serves malloc(1048583) by mmap inside malloc: counted once, as the malloc
    mmap_sites_alpha = [
        s for s in rep["sites"] if "mmap" in s["sources"] and any(t["name"] == "alpha" for t in s["threads"])
    ]
    assert sum(s["live_bytes"] for s in mmap_sites_alpha) == (3 + 9 + 2) * PAGE
    # pre-attach blocks freed after attach are ignored (pid mode) or fully seen (launch mode)
    if launched:
        assert agg["pre_attach_alloc"]["alloc_count"] == 5 and agg["pre_attach_alloc"]["live_bytes"] == 0
    else:
        assert "pre_attach_alloc" not in agg
    assert all(s["live_bytes"] >= 0 and s["live_count"] >= 0 for s in rep["sites"])
    threads = {t["name"]: t for t in rep["threads"]}
    assert threads["beta"]["live_bytes"] == 13 * 2203
    alpha_live = sum(v[0] for k, v in EXPECTED.items() if v[3] == "alpha")
    assert threads["alpha"]["live_bytes"] == alpha_live
    flows = {(f["alloc_thread"], f["free_thread"]): f for f in rep["flows"]}
    assert flows[("alpha", "beta")]["bytes"] == 29 * 3331 and flows[("alpha", "beta")]["count"] == 29
    # aliases: one probe per address
    probes = rep["recording"]["probes"]
    assert probes["aliases"].get("memalign") == "aligned_alloc"
    assert rep["trims"] and rep["trims"][0]["thread"] == "alpha" and rep["trims"][0]["returned"] in (0, 1)


@pytest.mark.parametrize("uprobes", ["multi", "perf"])
def test_launch_mode_exact(targets, tmp_path, uprobes):
    """Exact through uprobe_multi links (one entry program per module, a cookie per address) and
    through a perf event per probe (the path of kernels before 6.6)."""
    out = tmp_path / "launch.allocscope"
    p = cli("record", "-q", "--uprobes", uprobes, "-o", str(out), "--", str(targets["apis"]), check=True)
    assert json.loads((out / "meta.json").read_text())["probes"]["uprobes"] == uprobes
    assert "wrote" in p.stderr and "(target exited with code 0)" in p.stderr, p.stderr  # ours: on stderr
    st = os.stat(out / "meta.json")
    assert st.st_mode & 0o777 == 0o600
    check_apis_report(report_json(out), launched=True)


def _record_pid(targets, tmp_path, procs, tracers, how: str):
    tgt = procs(targets["apis"], "--wait-signal", "--linger", f"--tag={tmp_path.name}")
    tgt.expect("ready")
    out = tmp_path / f"{how}.allocscope"
    sel = ["--pid", str(tgt.pid)] if how == "pid" else ["--pgrep", f"apis .*--tag={tmp_path.name}"]
    tr = tracers("record", *sel, "-o", out, "--interval", "0.5", "--label", "mode=" + how)
    wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
    assert tr.poll() is None, tr.stderr.read()
    tgt.signal(signal.SIGUSR1)
    tgt.expect("done")
    return tgt, tr, out


def test_pid_mode_exact(targets, tmp_path, procs, tracers):
    tgt, tr, out = _record_pid(targets, tmp_path, procs, tracers, "pid")
    time.sleep(0.6)
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()
    assert tgt.p.poll() is None  # target unharmed
    rep = report_json(out)
    assert rep["target"]["labels"] == {"mode": "pid"}
    check_apis_report(rep, launched=False)


def test_pgrep_mode_exact(targets, tmp_path, procs, tracers):
    _tgt, tr, out = _record_pid(targets, tmp_path, procs, tracers, "pgrep")
    tr.send_signal(signal.SIGTERM)
    assert tr.wait(60) == 0, tr.stderr.read()
    check_apis_report(report_json(out), launched=False)


def test_target_sigkilled_ends_recording(targets, tmp_path, procs, tracers):
    tgt, tr, out = _record_pid(targets, tmp_path, procs, tracers, "pid")
    tgt.signal(signal.SIGKILL)
    assert tr.wait(60) == 0, tr.stderr.read()
    assert "(target killed by SIGKILL)" in tr.stderr.read()
    rep = report_json(out)
    assert rep["recording"]["complete"] is True
    check_apis_report(rep, launched=False)  # symbolized after the process is gone


def test_tracer_sigkilled_leaves_target_and_readable_trace(targets, tmp_path, procs, tracers):
    tgt, tr, out = _record_pid(targets, tmp_path, procs, tracers, "pid")
    assert "heap_entry" in prog_names()  # the entry program of the uprobe_multi links
    ours = tracer_objects(tr.pid)["progs"]  # by id: other tracers on this machine load the same names
    assert ours
    wait_for(lambda: (out / "parts" / "intervals-000002.parquet").exists(), what="two finished intervals")
    tr.send_signal(signal.SIGKILL)
    tr.wait(30)
    time.sleep(0.2)
    assert tgt.p.poll() is None, "the target must survive the tracer's death"
    wait_for(lambda: not any(prog_exists(p) for p in ours), timeout=5, what="the killed tracer's programs freed")
    # the target still runs normally with the probes gone
    tgt.signal(signal.SIGSTOP)
    tgt.signal(signal.SIGCONT)
    assert tgt.p.poll() is None
    rep = report_json(out)
    assert rep["recording"]["complete"] is False
    assert any("incomplete" in w for w in rep["recording"]["warnings"])
    agg = by_function(rep)
    assert agg["leak_beta"]["live_bytes"] == 13 * 2203  # finished intervals hold the work


def _raw_uprobe_counter(pid: int):
    """A second, independent tracer on libc's malloc, registered like perf/bpftrace do
    (ref_ctr_offset 0), counting calls of `pid`."""
    from bcc import BPF

    from tracer.bpf.symbols import symbol_offsets
    from tracer.process.procfs import read_maps

    libc = next(m.path for m in read_maps(pid) if "libc.so" in m.path)
    off = symbol_offsets(libc, ["malloc"]).offsets["malloc"]
    b = BPF(
        text=b"""
    BPF_ARRAY(n, u64, 1);
    int count(struct pt_regs *ctx) { int k = 0; u64 *v = n.lookup(&k); if (v) __sync_fetch_and_add(v, 1); return 0; }
    """
    )
    fn = b.load_func(b"count", BPF.KPROBE)
    lib = ct.CDLL("libbcc.so.0", use_errno=True)
    attach = lib["bpf_attach_uprobe"]
    attach.restype = ct.c_int
    attach.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_uint64, ct.c_int, ct.c_uint32]
    ev = f"p_second_tracer_{os.getpid()}_{pid}".encode()
    fd = attach(fn.fd, 0, ev, libc.encode(), off, pid, 0)
    assert fd >= 0, f"second tracer could not attach: {os.strerror(ct.get_errno())}"
    b._add_uprobe_fd(ev, fd)
    return b


def test_second_tracer_attaches_beside_ours(targets, tmp_path, procs, tracers):
    """Our uprobes use ref_ctr_offset 0, so another tool's uprobe on the same malloc is accepted
    (python3-bpfcc 0.26 passes garbage there, and the kernel refuses mismatching pairs)."""
    tgt = procs(targets["busy"])
    tgt.expect("ready")
    first = _raw_uprobe_counter(tgt.pid)  # the other tool first ...
    out = tmp_path / "coexist.allocscope"
    tr = tracers("record", "--pid", tgt.pid, "-o", out, "--interval", "0.5")
    wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="attach beside another tracer")
    assert tr.poll() is None, tr.stderr.read()
    second = _raw_uprobe_counter(tgt.pid)  # ... and another one after ours
    time.sleep(0.5)
    n1 = first[b"n"][ct.c_int(0)].value
    n2 = second[b"n"][ct.c_int(0)].value
    first.cleanup()
    second.cleanup()
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0
    assert n1 > 0 and n2 > 0
    rep = report_json(out)
    assert any(s["frames"][0]["function"] == "churn_once" for s in rep["sites"])


def test_attach_while_threads_allocate(targets, tmp_path, procs, tracers):
    """Attach while 3 threads are inside malloc/free millions of times: pairing stays right,
    nothing goes negative, and a leak made after attach is exact."""
    tgt = procs(targets["busy"], "--threads", "3")
    tgt.expect("ready")
    time.sleep(0.3)
    out = tmp_path / "busy.allocscope"
    tr = tracers("record", "--pid", tgt.pid, "-o", out, "--interval", "0.5")
    wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="attach")
    time.sleep(1.0)
    tgt.signal(signal.SIGUSR1)
    tgt.expect("leaked")
    time.sleep(0.5)
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()
    rep = report_json(out)
    agg = by_function(rep)
    leak = agg["busy_leak"]
    assert (leak["live_bytes"], leak["live_count"], leak["alloc_count"]) == (101 * 7777, 101, 101)
    assert dict(leak["threads"]) == {"leaker": 101 * 7777}
    churn = agg["churn_once"]
    assert churn["alloc_count"] > 1000
    assert 0 <= churn["live_count"] <= 3  # at most one block in flight per churning thread
    losses = rep["totals"]["losses"]
    assert losses.get("lost_stale_entry", 0) == 0
    assert losses.get("lost_unmatched_ret", 0) <= 3  # only calls in flight at attach
    assert {t["name"] for t in rep["threads"]} >= {"churn-1", "churn-2", "churn-3", "leaker"}
    assert all(s["live_bytes"] >= 0 for s in rep["sites"])


def test_doctor_passes_here():
    p = cli("doctor")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tracing can work" in p.stdout
    assert "[FAIL]" not in p.stdout
    # kernel 6.18: both made and closed for real on the doctor's own malloc
    assert "uprobe_multi links and uprobe sessions available" in p.stdout, p.stdout
    # kernel 6.18 optimizes a uprobe on a 5-byte nop (--inject's markers)
    assert "[ok  ] inject markers: a uprobe on a 5-byte nop becomes a call" in p.stdout, p.stdout
    # kernel 6.18's oom:mark_victim has the victim's memory; the store's program serves it
    assert (
        "[ok  ] OOM kills: told by the kernel's own mark of its victim, oom:mark_victim (loads from the "
        "prebuilt program), with the victim's memory at the kill"
    ) in p.stdout, p.stdout
