"""The live view of `allocscope top` and `record`'s status line, fed synthetic snapshots the way
the recorder's observer is (reports/live/model.py, reports/live/text.py, allocscope/cli/observers.py): exact
per-site and per-thread figures, the age bound, folding, sorting, symbolization once per stack,
and the screens and blocks they render. No BPF: the real thing is tests/test_top_bpf.py."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from support import ROOT, cli, one_line_error, wait_for

from allocscope.cli.observers import BatchPrinter, StatusLine
from reports.live.model import AGE_POINTS, LiveModel, StatusModel, oldest_age_bound
from reports.live.text import ScreenState, batch_block, screen_lines, screen_text, status_text
from reports.symbolize import Frame
from tracer.record.signals import StopRequest

APP = "/opt/app/bin/grower"
# file offset -> (function, file, line): what the fake symbolizer answers
FUNCS = {
    0x10: ("grow_tick", "grower.c", 30),
    0x20: ("grower_main", "grower.c", 59),
    0x30: ("keep_config", "grower.c", 31),
    0x40: ("burst", "grower.c", 35),
    0x50: ("xmalloc", "xm.c", 7),
    0x60: ("main", "grower.c", 90),
}
GROW, CONFIG, BURST, GROW_VIA_XMALLOC, GROW_OTHER_PATH = 1, 2, 3, 4, 5
STACKS = {
    GROW: [0x10, 0x20, 0x60],
    CONFIG: [0x30, 0x20, 0x60],
    BURST: [0x40, 0x20, 0x60],
    GROW_VIA_XMALLOC: [0x50, 0x10, 0x20, 0x60],
    GROW_OTHER_PATH: [0x10, 0x40, 0x20, 0x60],
}
T_GROW, T_MAIN = 11, 10


class FakeSymbolizer:
    """Answers from FUNCS and counts what it was asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def symbolize(self, module, offsets, build_id=None, return_addresses=True):
        offsets = list(offsets)
        self.asked += offsets
        return {o: [Frame(FUNCS[o][0], module, FUNCS[o][1], FUNCS[o][2], o)] for o in offsets}


def stack_columns(sids) -> dict[str, list]:
    cols: dict[str, list] = {
        k: [] for k in ("stack_id", "idx", "ip", "module", "build_id", "offset", "syscall", "function", "file", "line")
    }
    for sid in sids:
        for i, off in enumerate(STACKS[sid]):
            for k, v in (
                ("stack_id", sid),
                ("idx", i),
                ("ip", 0x400000 + off),
                ("module", APP),
                ("build_id", "ab12"),
                ("offset", off),
                ("syscall", 0),
                ("function", None),
                ("file", None),
                ("line", None),
            ):
                cols[k].append(v)
    return cols


@dataclass
class Snap:
    seq: int
    final: bool
    row: dict
    sites: dict
    changed: list
    stack_columns: dict | None
    names: dict
    allocator: str = "glibc /usr/lib/x86_64-linux-gnu/libc.so.6"


@dataclass
class Feed:
    """Cumulative counters, as the recorder keeps them, turned into snapshots."""

    sites: dict = field(default_factory=dict)
    known: set = field(default_factory=set)
    seq: int = 0

    def step(self, t: float, updates: dict, rss: int = 4 << 20, final: bool = False, **row) -> Snap:
        self.seq += 1
        sites = dict(self.sites)
        sites.update(updates)
        self.sites = sites
        new = sorted({k[0] for k in updates} - self.known)
        self.known |= set(new)
        live = sum(v[0] - v[2] for v in sites.values())
        r = {
            "seq": self.seq,
            "ts_ns": int(t * 1e9),
            "elapsed_s": t,
            "rss_bytes": rss,
            "rss_anon_bytes": rss // 2,
            "rss_file_bytes": rss // 2,
            "rss_shmem_bytes": 0,
            "live_bytes": live,
            "heap_live_bytes": live,
            "mmap_live_bytes": 0,
            "device_live_bytes": 0,
            "lost_live_full": 0,
            "lost_live_full_bytes": 0,
            **row,
        }
        return Snap(
            self.seq,
            final,
            r,
            sites,
            list(updates),
            stack_columns(new) if new else None,
            {T_GROW: "grower", T_MAIN: "grower-main"},
        )


def grower_run(model: LiveModel, ticks: int = 5) -> Feed:
    """keep_config 2000 B at t=1; grow_tick 3333 B a second from t=1 (one of them through
    xmalloc, folded into the same site); burst 1 MiB allocated and freed every second."""
    feed = Feed()
    for k in range(1, ticks + 1):
        upd = {
            (GROW, T_GROW, "heap"): (3333 * k, k, 0, 0, 3333 * k),
            (BURST, T_GROW, "heap"): (k << 20, k, k << 20, k, 1 << 20),
        }
        if k == 1:
            upd[(CONFIG, T_MAIN, "heap")] = (2000, 1, 0, 0, 2000)
        if k == 3:
            upd[(GROW_VIA_XMALLOC, T_GROW, "heap")] = (3333, 1, 0, 0, 3333)
        model.update(feed.step(float(k), upd))
    return feed


def fn(site) -> str:
    return site[0].function


# --- the model ------------------------------------------------------------------------------


def test_site_figures_exact():
    model = LiveModel(symbolizer=FakeSymbolizer())
    grower_run(model)
    view = model.view()
    ranked = view.ranked("live")
    assert [fn(s["site"]) for s in ranked] == ["grow_tick", "keep_config", "burst"]
    g = ranked[0]
    assert g["rank"] == 1
    assert g["live_bytes"] == 6 * 3333 and g["live_count"] == 6  # xmalloc folded: one site, two stacks
    assert g["delta_bytes"] == 3333 and g["allocs_per_s"] == 1.0
    assert g["verdict"] == "growing" and g["growth_bytes_per_s"] == pytest.approx(3333 * 5 / 4, rel=0.25)
    assert g["oldest_age_s"] == 4.0  # first block in the interval ending at t=1
    assert g["top_thread"] == "grower" and g["top_tid"] == T_GROW
    assert [f.function for f in g["stack"]] == ["grow_tick", "grower_main", "main"]
    c = ranked[1]
    assert (c["live_bytes"], c["delta_bytes"], c["verdict"], c["oldest_age_s"]) == (2000, 0, "plateaued", 4.0)
    assert c["top_thread"] == "grower-main"
    b = ranked[2]
    assert (b["live_bytes"], b["peak_live_bytes"], b["verdict"], b["allocs_per_s"]) == (0, 1 << 20, "freed", 1.0)
    assert math.isnan(b["oldest_age_s"])
    assert view.row["live_bytes"] == 6 * 3333 + 2000 and view.rss_peak_bytes == 4 << 20
    assert view.timeline_live == [3333 + 2000, 2 * 3333 + 2000, 4 * 3333 + 2000, 5 * 3333 + 2000, 6 * 3333 + 2000]


def test_sorts_rank_as_reports_do():
    model = LiveModel(symbolizer=FakeSymbolizer())
    grower_run(model)
    view = model.view()
    assert [fn(s["site"]) for s in view.ranked("peak")] == ["burst", "grow_tick", "keep_config"]
    assert fn(view.ranked("growth")[0]["site"]) == "grow_tick"
    # equal age bounds: ties by live bytes
    assert [fn(s["site"]) for s in view.ranked("age")] == ["grow_tick", "keep_config", "burst"]


def test_threads_view():
    model = LiveModel(symbolizer=FakeSymbolizer())
    grower_run(model)
    threads = model.view().threads
    assert [(t["tid"], t["name"], t["live_bytes"], t["delta_bytes"], t["sites"]) for t in threads] == [
        (T_GROW, "grower", 6 * 3333, 3333, 2),
        (T_MAIN, "grower-main", 2000, 0, 1),
    ]
    assert fn(threads[0]["top_site"]) == "grow_tick" and threads[0]["allocs_per_s"] == 2.0


def test_each_stack_symbolized_once():
    sym = FakeSymbolizer()
    model = LiveModel(symbolizer=sym)
    feed = grower_run(model)
    assert sorted(sym.asked) == sorted(FUNCS)  # every offset once, though stacks share frames
    n = len(sym.asked)
    model.update(feed.step(6.0, {(GROW, T_GROW, "heap"): (3333 * 6, 6, 0, 0, 3333 * 6)}))
    model.view()
    assert len(sym.asked) == n  # a refresh with no new stack asks nothing


def test_fold_option_folds_live_sites():
    from reports.analysis import parse_fold

    model = LiveModel(fold=parse_fold("grow_tick"), symbolizer=FakeSymbolizer())
    grower_run(model)
    assert fn(model.view().ranked("live")[0]["site"]) == "grower_main"


def test_age_bound_fifo_exact_and_thinned_still_a_bound():
    # one block a second, freed in allocation order two seconds later: the oldest live one
    # is always the one allocated in the interval before last
    model = LiveModel(symbolizer=FakeSymbolizer())
    feed = Feed()
    for k in range(1, 301):
        freed = max(0, k - 2)
        model.update(feed.step(float(k), {(GROW, T_GROW, "heap"): (100 * k, k, 100 * freed, freed, 200)}))
        if k in (3, 10, 300):
            s = model.view().ranked("live")[0]
            assert s["live_count"] == 2 and s["oldest_age_s"] == 1.0, (k, s["oldest_age_s"])
    assert len(model.sites[0].counts) <= AGE_POINTS
    # a leak: nothing freed, the first block is the oldest however many change points are kept
    model = LiveModel(symbolizer=FakeSymbolizer())
    feed = Feed()
    for k in range(1, 301):
        model.update(feed.step(float(k), {(GROW, T_GROW, "heap"): (100 * k, k, 0, 0, 100 * k)}))
    assert len(model.sites[0].counts) <= AGE_POINTS
    assert model.view().ranked("live")[0]["oldest_age_s"] == 299.0


def test_age_bound_never_above_the_truth():
    # LIFO: blocks 1..5 allocated at t=1..5, the last 3 freed at t=6: blocks 1 and 2 live,
    # the oldest 5 s old; the counters can only prove 1 + 1 = 2 frees... so the bound is <= 5
    counts = [(1.0, 1), (2.0, 2), (3.0, 3), (4.0, 4), (5.0, 5)]
    assert oldest_age_bound(counts, 3, 6.0) == 2.0
    assert oldest_age_bound(counts, 0, 6.0) == 5.0  # nothing freed: exact
    assert oldest_age_bound(counts, 5, 6.0) is None  # nothing outstanding


def test_status_model_symbolizes_only_the_top_stack():
    sym = FakeSymbolizer()
    model = StatusModel(symbolizer=sym)
    feed = Feed()
    model.update(
        feed.step(1.0, {(GROW, T_GROW, "heap"): (3333, 1, 0, 0, 3333), (CONFIG, T_MAIN, "heap"): (2000, 1, 0, 0, 2000)})
    )
    frames, live = model.top()
    assert (frames[0].function, live) == ("grow_tick", 3333)
    assert sorted(sym.asked) == [0x10, 0x20, 0x60]  # keep_config's stack was never symbolized
    assert status_text(1.0, feed.step(1.0, {}).row, model.lost, model.top(), 200) == (
        "allocscope: 1s  RSS 4.0 MiB  live 5.2 KiB  lost 0  top: grow_tick grower.c:30 3.3 KiB"
    )


def test_one_location_sums_the_stacks_that_reach_it():
    def run(model):
        feed = Feed()
        for i in range(1, 6):
            model.update(
                feed.step(
                    float(i),
                    {
                        (GROW, T_GROW, "heap"): (1000 * i, i, 0, 0, 1000 * i),
                        (GROW_OTHER_PATH, T_MAIN, "heap"): (700 * i, i, 0, 0, 700 * i),
                    },
                )
            )
        return model.view().ranked("live")

    [loc] = run(LiveModel(symbolizer=FakeSymbolizer()))
    assert ([f.function for f in loc["site"]], loc["n_stacks"]) == (["grow_tick"], 2)
    assert (loc["live_bytes"], loc["live_count"], loc["delta_bytes"]) == (8500, 10, 1700)
    assert loc["verdict"] == "growing" and loc["growth_bytes_per_s"] == pytest.approx(1700)
    assert dict(loc["threads"]) == {T_GROW: 5000, T_MAIN: 3500}
    stacks = run(LiveModel(symbolizer=FakeSymbolizer(), by="stack"))
    assert [(s["live_bytes"], s["n_stacks"]) for s in stacks] == [(5000, 1), (3500, 1)]
    [fn] = run(LiveModel(symbolizer=FakeSymbolizer(), by="function"))
    assert fn["live_bytes"] == 8500


def test_stacks_cut_short_are_said_but_are_no_loss():
    """lost_stack_pending (a stack cut short while its module's unwind table was built) counts no
    lost event, nor do the *_bytes counters: the status line, the batch block, the record summary
    and the report's totals.lost_events share one definition (common/tracefile/names.py)."""
    from allocscope.cli.recording import summary_text
    from common.tracefile.names import lost_events
    from tracer.record.recorder import Summary

    row = {"lost_ring_full": 12, "lost_ring_full_bytes": 4096, "lost_stack_pending": 37, "n_allocs": 9}
    assert lost_events(row) == 12 and lost_events({"lost_stack_pending": 37}) == 0
    model, status, feed = LiveModel(symbolizer=FakeSymbolizer()), StatusModel(symbolizer=FakeSymbolizer()), Feed()
    snap = feed.step(1.0, {(GROW, T_GROW, "heap"): (1000, 1, 0, 0, 1000)}, lost_stack_pending=37)
    for m in (model, status):
        m.update(snap)
    assert model.view().lost == 0 and status.lost == 0
    assert batch_block(model.view(), "live", 2, "12:00:01").splitlines()[0].endswith("lost 0, 37 stacks cut short")
    snap = feed.step(2.0, {}, lost_stack_pending=37, lost_ring_full=12, lost_ring_full_bytes=4096)
    for m in (model, status):
        m.update(snap)
    assert model.view().lost == 12 and status.lost == 12
    head = batch_block(model.view(), "live", 2, "12:00:02").splitlines()[0]
    assert head.endswith("lost 12 (ring_full 12), 37 stacks cut short"), head
    s = Summary("/t/x.allocscope", 2.0, 2, "SIGINT", 0, 0, 0, 0, 1 << 10, {"reason": "stopped"}, 37)
    assert summary_text(s).endswith("lost 0 (37 stacks cut short while unwind tables were built); 1.0 KiB on disk")
    # so do stacks kept to their innermost 64 frames (too deep, or a frame the unwinder cannot follow)
    assert lost_events({"lost_stack_truncated": 2262, "lost_ring_full": 1}) == 1
    s = Summary("/t/x.allocscope", 2.0, 2, "SIGINT", 0, 0, 0, 0, 1 << 10, {"reason": "stopped"}, 0, 2262)
    assert summary_text(s).endswith(
        "lost 0 (2262 stacks kept to their innermost frames (too deep, or a frame the unwinder cannot follow)); "
        "1.0 KiB on disk"
    )
    snap = feed.step(3.0, {}, lost_stack_pending=37, lost_stack_truncated=5, lost_ring_full=12)
    model.update(snap)
    assert (
        batch_block(model.view(), "live", 2, "12:00:03")
        .splitlines()[0]
        .endswith("lost 12 (ring_full 12), 42 stacks cut short")
    )


def test_verdict_is_new_until_four_intervals():
    model, feed = LiveModel(symbolizer=FakeSymbolizer()), Feed()
    verdicts = []
    for i in range(1, 6):
        model.update(feed.step(float(i), {(GROW, T_GROW, "heap"): (1000 * i, i, 0, 0, 1000 * i)}))
        verdicts.append(model.view().ranked("live")[0]["verdict"])
    assert verdicts == ["new", "new", "new", "growing", "growing"]


# --- what is rendered -----------------------------------------------------------------------------


def test_batch_block():
    model = LiveModel(symbolizer=FakeSymbolizer())
    grower_run(model)
    lines = batch_block(model.view(), "live", 2, "12:00:05").splitlines()
    assert lines[0] == (
        "== 12:00:05 +5.0s  RSS 4.0 MiB (peak 4.0 MiB)  live 21.5 KiB (+3.3 KiB)  heap 21.5 KiB  mmap 0 B  lost 0"
    )
    assert lines[1] == "   top 2 of 3 locations by live bytes"  # 2 rows shown of the 3 ranked
    assert lines[2].split() == ["LIVE", "CHANGE", "PEAK", "GROWTH/s", "VERDICT", "AGE", "ALLOC/s", "THREAD", "LOCATION"]
    assert lines[3].split()[:4] == ["19.5", "KiB", "+3.3", "KiB"]
    assert "growing" in lines[3] and ">=4s" in lines[3] and " 1.0 " in lines[3]
    assert lines[3].split()[-3:] == ["grower", "grow_tick", "grower.c:30"]  # the location
    by_stack = LiveModel(symbolizer=FakeSymbolizer(), by="stack")
    grower_run(by_stack)
    lines = batch_block(by_stack.view(), "live", 2, "12:00:05").splitlines()
    assert lines[1] == "   top 2 of 3 sites by live bytes" and lines[2].split()[-1] == "SITE"
    assert lines[3].split()[-9:] == [
        "grower",
        "grow_tick",
        "grower.c:30",
        "<",
        "grower_main",
        "grower.c:59",
        "<",
        "main",
        "grower.c:90",
    ]
    assert lines[4].split()[:5] == ["2.0", "KiB", "0", "B", "2.0"] and "keep_config" in lines[4]
    assert len(lines) == 5  # --top 2


class Collect:
    """A stream that keeps what is written to it."""

    text = ""

    def write(self, t):
        self.text += t

    def flush(self):
        pass


def test_batch_printer_stops_after_iterations_and_on_a_closed_pipe():
    class Closed:
        def write(self, _text):
            raise BrokenPipeError

        def flush(self):
            pass

        def fileno(self):
            raise ValueError("no descriptor")

    stop = StopRequest()
    printer = BatchPrinter(Closed(), stop, None, "live", 5, None)
    printer.model = LiveModel(symbolizer=FakeSymbolizer())
    printer.observe(Feed().step(1.0, {(GROW, T_GROW, "heap"): (3333, 1, 0, 0, 3333)}))
    printer.pump.close()
    assert printer.closed and stop.reason == "stdout closed"

    out, stop = Collect(), StopRequest()
    printer = BatchPrinter(out, stop, None, "live", 5, 2)
    printer.model = LiveModel(symbolizer=FakeSymbolizer())
    feed = Feed()
    for k in (1, 2):
        printer.observe(feed.step(float(k), {(GROW, T_GROW, "heap"): (3333 * k, k, 0, 0, 3333 * k)}))
    assert stop.reason == "2 iterations"
    printer.observe(feed.step(2.1, {}, final=True))  # the final snapshot after the 2nd: not printed
    printer.pump.close()
    assert out.text.count("== ") == 2 and "[final]" not in out.text


def test_batch_printer_on_a_full_disk_stops_and_says_why():
    """`top --batch > mem.log` on a full disk (here /dev/full: ENOSPC at the flush): the recording
    is asked to stop and `error` is the line top exits 6 with — not an OSError traceback out of
    the printer's thread once the trace is finished."""
    with open("/dev/full", "w") as full:
        stop = StopRequest()
        printer = BatchPrinter(full, stop, None, "live", 5, None)
        printer.model = LiveModel(symbolizer=FakeSymbolizer())
        printer.observe(Feed().step(1.0, {(GROW, T_GROW, "heap"): (3333, 1, 0, 0, 3333)}))
        printer.pump.close()
    assert printer.closed and stop.reason == "stdout not writable"
    assert printer.error == "cannot write to stdout: No space left on device"


def test_status_line_in_place():
    err = Collect()
    status = StatusLine(err)
    status.model = StatusModel(symbolizer=FakeSymbolizer())
    feed = Feed()
    status.observe(feed.step(1.0, {(GROW, T_GROW, "heap"): (3333, 1, 0, 0, 3333)}))
    wait_for(lambda: status.shown, what="the status line")
    status.progress("a message")
    status.close()
    assert err.text.startswith("\r\x1b[Kallocscope: 1s  RSS 4.0 MiB  live 3.3 KiB  lost 0  top: grow_tick")
    assert "\r\x1b[Kallocscope: a message\n" in err.text


def screen(state: ScreenState, width: int = 140, height: int = 30, ticks: int = 5) -> list[str]:
    model = LiveModel(symbolizer=FakeSymbolizer())
    grower_run(model, ticks)
    lines = screen_lines(model.view(), state, width, height)
    assert len(lines) <= height
    assert all(sum(len(t) for t, _ in line) <= width for line in lines)
    return screen_text(lines).splitlines()


def test_screen_sites_and_sort_label():
    text = screen(ScreenState(target="pid 42 (grower)"))
    assert text[0].startswith("allocscope top  pid 42 (grower)  glibc /usr/lib/x86_64-linux-gnu/libc.so.6  mode full")
    assert text[1].startswith("RSS 4.0 MiB  peak 4.0 MiB  anon 2.0 MiB  file 2.0 MiB  shmem 0 B")
    assert text[2] == "live 21.5 KiB  heap 21.5 KiB  mmap 0 B  lost 0"
    assert text[3].startswith("RSS  ") and text[4].startswith("live ")
    assert text[5].startswith("locations by live bytes (3)   sort: live")
    assert text[6].split()[:3] == ["#", "LIVE", "CHANGE"]
    first = text[7].split()
    assert first[:5] == ["1", "19.5", "KiB", "+3.3", "KiB"] and "grow_tick" in text[7] and "≥4s" in text[7]
    assert text[-1].startswith("s sort  t threads")
    peak = screen(ScreenState(sort="peak"))
    assert peak[5].startswith("locations by peak live bytes (3)   sort: peak") and "burst" in peak[7]


def test_screen_narrow_small_frozen_expanded_threads():
    narrow = screen(ScreenState(), width=70)
    assert "PEAK" not in narrow[6] and "grow_tick" in narrow[7]
    small = screen(ScreenState(ended="ended: target exited"), width=50, height=10)
    assert small == ["terminal too small: 50x10", "allocscope top needs 60x12", "ended: target exited"]
    assert "FROZEN" in screen(ScreenState(frozen=True))[0]
    stack = screen(ScreenState(expanded=True, selected=0, sort="live"))
    assert stack[5].startswith("location #1 by live bytes: grow_tick grower.c:30")
    assert stack[6] == "live 19.5 KiB  peak 19.5 KiB  6 blocks  growing +4.2 KiB/s  age ≥4s  1.0 allocs/s"
    assert [ln.split()[1] for ln in stack[8:11]] == ["grow_tick", "grower_main", "main"]
    assert stack[11] == "threads holding it: grower (11) 19.5 KiB"
    threads = screen(ScreenState(threads=True))
    assert threads[5].startswith("threads by live bytes (2)")
    assert threads[7].split()[:4] == ["11", "grower", "19.5", "KiB"]
    ascii_ = screen(ScreenState(unicode=False))
    assert ">=4s" in ascii_[7] and all(ch.isascii() for ch in "".join(ascii_))


def test_screen_ended_line():
    text = screen(ScreenState(ended="ended: target exited; nothing written (no -o)  (q: quit)"))
    assert text[-2] == "ended: target exited; nothing written (no -o)  (q: quit)"


# --- the command's bad input ------------------------------------------------------------------------


def test_top_usage_errors():
    one_line_error(cli("top", "--pid", "1", "--iterations", "3"), "--iterations needs --batch", code=2)
    # stdin and stdout are pipes here: the full screen cannot be drawn
    one_line_error(cli("top", "--pid", "1"), "needs a terminal", "--batch", code=2)
    one_line_error(cli("top", "--pid", "1", "--batch", "--interval", "0"), "--interval must be > 0", code=2)
    one_line_error(cli("top", "--batch"), "no target", code=2)
    one_line_error(cli("top", "--pid", "1", "--batch", "--fold", ""), "--fold", code=2)
    p = cli("top", "--batch", "--iterations", "0", "--pid", "1")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_top_help_lists_the_probe_options():
    p = subprocess.run(
        [sys.executable, "-m", "allocscope", "top", "--help"], capture_output=True, text=True, cwd=str(ROOT), check=True
    )
    for opt in (
        "--interval",
        "--max-live",
        "--unwind",
        "--mode",
        "--sample-bytes",
        "--sort",
        "--threads",
        "--batch",
        "--iterations",
        "-o, --output",
        "--fold",
    ):
        assert opt in p.stdout, opt
    assert "[default: 2.0]" in p.stdout


def test_target_gone_rss_unknown():
    model = LiveModel(symbolizer=FakeSymbolizer())
    feed = grower_run(model, 2)
    model.update(feed.step(2.5, {}, rss=-1, final=True))
    view = model.view()
    assert view.final and view.timeline_rss == [4 << 20] * 3  # the last RSS read stays on the timeline
    text = screen_text(screen_lines(view, ScreenState(), 140, 30)).splitlines()
    assert text[1].startswith("RSS -  peak 4.0 MiB")
    head = batch_block(view, "live", 1, "12:00:03").splitlines()[0]
    assert head.startswith("== 12:00:03 +2.5s  RSS - (peak 4.0 MiB)") and head.endswith("lost 0  [final]")


def test_allocators_line_in_the_header_and_batch_block():
    model, feed = LiveModel(symbolizer=FakeSymbolizer()), Feed()
    snap = feed.step(1.0, {(GROW, T_GROW, "heap"): (3 << 20, 3, 0, 0, 3 << 20)})
    # (source, label, mapped, resident, live, ranges), as tracer/allocators/retention.py measures them
    snap.allocators = (
        ("heap", "jemalloc:_rjem_", 96 << 20, 80 << 20, 48 << 20, 12),
        ("heap:glibc", "glibc", 8 << 20, 2 << 20, 1 << 20, 3),
    )
    model.update(snap)
    view = model.view()
    want = "alloc jemalloc:_rjem_ 48.0 MiB live / 32.0 MiB retained; glibc 1.0 MiB live / 1.0 MiB retained"
    assert batch_block(view, "live", 2, "12:00:01").splitlines()[-1] == "   " + want
    text = screen_text(screen_lines(view, ScreenState(target="pid 1 (t)"), 120, 30))
    assert want in text.splitlines()[3]
    model.update(feed.step(2.0, {}))  # a snapshot without allocator figures keeps the last ones
    assert model.view().allocators[0]["retained"] == 32 << 20


def test_top_closes_with_how_the_target_ended():
    """`top`'s last line says how the target ended when it did (as the report's header), else why
    the recording stopped."""
    from reports.analysis.ending import closing_text

    oom = {"reason": "oom_killed", "oom": {"scope": "cgroup", "cgroup": "/w", "limit_bytes": 2 << 30}}
    assert closing_text(oom, "target exited") == "OOM-killed by the memory cgroup /w (limit 2.0 GiB)"
    assert closing_text({"reason": "exited", "exit_code": 3}, "target exited") == "exited with code 3"
    assert closing_text({"reason": "killed", "signal": "SIGKILL"}, "target exited") == "killed by SIGKILL"
    assert closing_text({"reason": "exec"}, "exec") == "the target exec'd another program"
    assert closing_text({"reason": "stopped"}, "SIGINT") == "SIGINT"
    assert closing_text({"reason": "stopped"}, "5 iterations") == "5 iterations"
    assert closing_text(None, "quit") == "quit"


def test_the_recording_summary_says_how_the_target_ended():
    """`record`'s and `top`'s one-line summary: the end as the report says it (exit code, signal,
    OOM kill with the cgroup), else why the recording stopped; 1 interval, 2 intervals."""
    from allocscope.cli.recording import summary_text
    from tracer.record.recorder import Summary

    def line(intervals: int, end_reason: str, end: dict | None, path: str = "/t/x.allocscope") -> str:
        return summary_text(Summary(path, 2.04, intervals, end_reason, 3 << 20, 7, 2, 0, 48 << 10, end))

    tail = "live 3.0 MiB in 7 blocks at 2 sites; lost 0; 48.0 KiB on disk"
    assert line(2, "target exited", {"reason": "exited", "exit_code": 0}) == (
        f"allocscope: wrote /t/x.allocscope: 2 intervals in 2.0s (target exited with code 0); {tail}"
    )
    assert line(1, "target exited", {"reason": "killed", "signal": "SIGKILL"}) == (
        f"allocscope: wrote /t/x.allocscope: 1 interval in 2.0s (target killed by SIGKILL); {tail}"
    )
    oom = {"reason": "oom_killed", "oom": {"scope": "cgroup", "cgroup": "/w", "limit_bytes": 2 << 30}}
    assert "(target OOM-killed by the memory cgroup /w (limit 2.0 GiB));" in line(5, "target exited", oom)
    assert "(the target exec'd another program);" in line(5, "exec", {"reason": "exec"})
    assert line(3, "SIGINT", {"reason": "stopped"}, path="") == (
        f"allocscope: wrote nothing (no -o): 3 intervals in 2.0s (SIGINT); {tail}"
    )
    assert "(target exited);" in line(3, "target exited", None)  # an older recorder's words
