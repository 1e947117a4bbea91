"""`--metrics` without BPF: the exporter (reports/live/prometheus.py over reports/live/metrics.py) fed
synthetic snapshots the way the recorder's observer is, scraped over real HTTP and parsed with
prometheus_client's parser: exact figures, the target's labels on every series, the top-K bound,
restarts and ends across incarnations; bad input is one line. The real thing (a daemon, watch,
a Prometheus server): tests/test_prometheus_bpf.py."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from support import cli, one_line_error, unavailable, wait_for
from test_live import CONFIG, GROW, T_GROW, T_MAIN, FakeSymbolizer, Feed

from common.errors import UsageError
from reports.live.prometheus import MetricsExporter, parse_listen
from tracer.process.cgroups import tightest_limit as cgroup_limit

GROW_SITE = "grow_tick grower.c:30"
CONFIG_SITE = "keep_config grower.c:31"


def scrape(exp: MetricsExporter) -> dict[tuple, float]:
    """{(name, sorted label items): value} of one GET of /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    exp.flush()
    text = urllib.request.urlopen(exp.url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def series(samples: dict, name: str) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def one(samples: dict, name: str, **labels) -> float:
    want = tuple(sorted({"pw": "12", **labels}.items()))
    return samples[(name, want)]


@pytest.fixture
def exporter():
    made = []

    def make(top_k: int = 10) -> MetricsExporter:
        e = MetricsExporter("127.0.0.1:0", {"pw": "12"}, top_k)
        e.metrics.sym = FakeSymbolizer()
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def feed_incarnation(exp: MetricsExporter, ticks: int, lost: int = 0) -> Feed:
    """keep_config holds 2000 B from t=1; grow_tick adds 3333 B a second."""
    feed = Feed()
    for k in range(1, ticks + 1):
        upd = {(GROW, T_GROW, "heap"): (3333 * k, k, 0, 0, 3333 * k)}
        if k == 1:
            upd[(CONFIG, T_MAIN, "heap")] = (2000, 1, 0, 0, 2000)
        exp.observe(feed.step(float(k), upd, rss=9 << 20, lost_live_full=lost, lost_stack_truncated=7))
    return feed


def test_figures_labels_and_incarnations(exporter):
    exp = exporter(top_k=10)
    s = scrape(exp)
    assert one(s, "allocscope_up") == 0  # nothing traced yet
    assert one(s, "allocscope_target_restarts_total") == 0
    exp.target_started(101, "grower", "/var/lib/allocscope/grower-101.allocscope")
    feed_incarnation(exp, 5, lost=3)
    s = scrape(exp)
    assert all(dict(labels).get("pw") == "12" for _n, labels in s), "every series carries --label pw=12"
    assert one(s, "allocscope_up") == 1
    assert one(s, "allocscope_rss_bytes") == 9 << 20
    assert one(s, "allocscope_live_bytes", source="heap") == 5 * 3333 + 2000
    assert series(s, "allocscope_location_live_bytes") == {
        (("location", GROW_SITE), ("pw", "12")): 5 * 3333,
        (("location", CONFIG_SITE), ("pw", "12")): 2000,
    }
    assert one(s, "allocscope_lost_events_total", kind="live_full") == 3
    # stacks kept to their innermost frames are no loss (the report's lost_events): no such series
    assert not [lb for _n, lb in s if dict(lb).get("kind") == "stack_truncated"], s
    assert 0 < one(s, "allocscope_exporter_cpu_seconds_total") < 60
    assert one(s, "allocscope_target_info", pid="101", comm="grower", trace="/var/lib/allocscope/grower-101.allocscope")
    assert {dict(lb)["reason"]: v for lb, v in series(s, "allocscope_target_ends_total").items()} == {
        "exited": 0,
        "killed": 0,
        "oom_killed": 0,
        "exec": 0,
        "stopped": 0,
    }

    exp.target_ended("killed")
    s = scrape(exp)
    assert one(s, "allocscope_up") == 0
    assert one(s, "allocscope_target_ends_total", reason="killed") == 1
    assert not series(s, "allocscope_rss_bytes") and not series(s, "allocscope_location_live_bytes")
    assert one(s, "allocscope_lost_events_total", kind="live_full") == 3  # counters outlive the incarnation

    exp.target_started(202, "grower", "/var/lib/allocscope/grower-202.allocscope")
    feed_incarnation(exp, 2, lost=4)
    s = scrape(exp)
    assert one(s, "allocscope_up") == 1
    assert one(s, "allocscope_target_restarts_total") == 1
    assert one(s, "allocscope_location_live_bytes", location=GROW_SITE) == 2 * 3333  # this incarnation's only
    assert one(s, "allocscope_lost_events_total", kind="live_full") == 3 + 4  # monotonic across restarts
    assert series(s, "allocscope_target_info") == {
        (("comm", "grower"), ("pid", "202"), ("pw", "12"), ("trace", "/var/lib/allocscope/grower-202.allocscope")): 1
    }


def test_top_k_bounds_the_locations(exporter):
    """K=1: only the location holding most has a series; when another overtakes it, the first
    disappears (the label set stays bounded however long it runs)."""
    exp = exporter(top_k=1)
    exp.target_started(7, "grower", None)
    feed = feed_incarnation(exp, 1)  # grow_tick 3333 B > keep_config 2000 B
    assert set(series(scrape(exp), "allocscope_location_live_bytes")) == {(("location", GROW_SITE), ("pw", "12"))}
    exp.observe(feed.step(2.0, {(CONFIG, T_MAIN, "heap"): (9000, 2, 0, 0, 9000)}))
    assert series(scrape(exp), "allocscope_location_live_bytes") == {(("location", CONFIG_SITE), ("pw", "12")): 9000}


def test_a_stalled_exporter_merges_snapshots(exporter):
    """While the exporter's thread is stuck (here: its first symbolization blocks), snapshots
    are merged into the one waiting, not queued: once it runs again it handles a few and its
    figures are exactly those of all 40."""
    import threading

    gate = threading.Event()

    class Stuck(FakeSymbolizer):
        def symbolize(self, *a, **kw):
            gate.wait(30)
            return super().symbolize(*a, **kw)

    exp = exporter()
    exp.metrics.sym = Stuck()
    exp.target_started(7, "grower", None)
    feed = Feed()
    for k in range(1, 41):
        upd = {(GROW, T_GROW, "heap"): (3333 * k, k, 0, 0, 3333 * k)}
        if k == 20:
            upd[(CONFIG, T_MAIN, "heap")] = (2000, 1, 0, 0, 2000)  # a stack first seen while stuck
        exp.observe(feed.step(float(k), upd))
    gate.set()
    s = scrape(exp)
    assert exp.snapshots <= 3, exp.snapshots
    assert series(s, "allocscope_location_live_bytes") == {
        (("location", GROW_SITE), ("pw", "12")): 40 * 3333,
        (("location", CONFIG_SITE), ("pw", "12")): 2000,
    }


def test_allocator_split_sums_to_resident(exporter):
    """An attached recording without a census: what the allocator's mappings held at the attach
    is before_or_retained, never retained; a launched one: all free memory is retained."""
    exp = exporter()
    exp.target_started(7, "grower", None)
    feed = Feed()
    for k, resident in ((1, 40 << 20), (2, 64 << 20)):
        snap = feed.step(float(k), {(GROW, T_GROW, "heap"): (k << 20, k, 0, 0, k << 20)})
        snap.allocators = (("heap", "glibc", 96 << 20, resident, k << 20, 3),)
        exp.observe(snap)
    split = {dict(lb)["kind"]: v for lb, v in series(scrape(exp), "allocscope_allocator_bytes").items()}
    assert split == {"live": 2 << 20, "before_or_retained": 40 << 20, "retained": (64 - 2 - 40) << 20}
    exp.target_started(8, "grower", None, launched=True)
    snap = Feed().step(1.0, {(GROW, T_GROW, "heap"): (1 << 20, 1, 0, 0, 1 << 20)})
    snap.allocators = (("heap", "glibc", 96 << 20, 40 << 20, 1 << 20, 3),)
    exp.observe(snap)
    split = {dict(lb)["kind"]: v for lb, v in series(scrape(exp), "allocscope_allocator_bytes").items()}
    assert split == {"live": 1 << 20, "retained": 39 << 20, "before_attach": 0}


def test_bad_listen_addresses_and_busy_ports():
    assert parse_listen("127.0.0.1:9479") == ("127.0.0.1", 9479)
    assert parse_listen("[::1]:9479") == ("::1", 9479)
    for bad in ("9479", "localhost", ":9479", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(UsageError, match="HOST:PORT"):
            parse_listen(bad)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UsageError, match="in use"):
            MetricsExporter(f"127.0.0.1:{busy.getsockname()[1]}", {}, 10)
    with pytest.raises(UsageError, match="no such local address"):
        MetricsExporter("192.0.2.1:9479", {}, 10)  # TEST-NET: never this box's


def test_cli_bad_metrics_input_is_one_line(tmp_path):
    out = str(tmp_path / "t")
    one_line_error(cli("record", "--pid", "1", "-o", out, "--metrics", "nowhere"), "HOST:PORT", code=2)
    one_line_error(
        cli("record", "--pid", "1", "-o", out, "--metrics", "127.0.0.1:9479", "--label", "p-w=12"),
        "label name",
        code=2,
    )
    one_line_error(
        cli("record", "--pid", "1", "-o", out, "--metrics", "127.0.0.1:9479", "--label", "location=x"),
        "exporter's own",
        code=2,
    )


@pytest.mark.root
def test_cgroup_limit_is_the_tightest_on_the_way_up():
    """A process in a child cgroup (limit 96 MiB) of a parent limited to 64 MiB: 64 MiB; in the
    parent with no limit of its own anywhere: None. cgroup v2 (memory.max) or v1 (memory
    controller's memory.limit_in_bytes), whichever this box has."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        root, knob = "/sys/fs/cgroup", "memory.max"
        if "memory" not in Path(f"{root}/cgroup.subtree_control").read_text().split():
            unavailable("cgroup v2 without the memory controller enabled for children")
    elif os.path.isdir("/sys/fs/cgroup/memory"):
        root, knob = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
    else:
        unavailable("no memory cgroup hierarchy")
    parent = f"{root}/allocscope-test-{os.getpid()}"
    child = f"{parent}/worker"
    os.makedirs(child)
    if knob == "memory.max":
        Path(f"{parent}/cgroup.subtree_control").write_text("+memory")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert cgroup_limit(sleeper.pid) is None or cgroup_limit(sleeper.pid) > 64 << 20  # not in ours yet
        Path(f"{child}/{knob}").write_text(str(96 << 20))
        Path(f"{child}/cgroup.procs").write_text(str(sleeper.pid))
        assert cgroup_limit(sleeper.pid) == 96 << 20
        Path(f"{parent}/{knob}").write_text(str(64 << 20))
        assert cgroup_limit(sleeper.pid) == 64 << 20
    finally:
        sleeper.kill()
        sleeper.wait()
        wait_for(lambda: not Path(f"{child}/cgroup.procs").read_text().strip(), what="the cgroup emptied")
        os.rmdir(child)
        os.rmdir(parent)


def test_watch_workers_each_their_own_series_bounded(monkeypatch):
    """watch follows several processes at once: each its own figures under `worker` (the lowest
    slot free when it started), a restart taking the slot its predecessor freed, at most
    MAX_WORKERS slots (one more is refused, its snapshots dropped); `worker` is not a --label."""
    import reports.live.prometheus as M

    monkeypatch.setattr(M, "MAX_WORKERS", 3)
    exp = MetricsExporter("127.0.0.1:0", {"pw": "12"}, 10, workers=True)
    exp.metrics.sym = FakeSymbolizer()
    try:
        assert one(scrape(exp), "allocscope_up", worker="0") == 0  # nothing traced yet
        feeds = {}
        for pid, ticks in ((101, 5), (202, 2)):
            assert exp.target_started(pid, "grower", f"/t/grower-{pid}.allocscope") is True
            feeds[pid] = Feed()
            for k in range(1, ticks + 1):
                exp.observe(feeds[pid].step(float(k), {(GROW, T_GROW, "heap"): (3333 * k, k, 0, 0, 3333 * k)}), pid)
        s = scrape(exp)
        info = {dict(lb)["worker"]: dict(lb)["pid"] for lb in series(s, "allocscope_target_info")}
        assert info == {"0": "101", "1": "202"}
        assert one(s, "allocscope_location_live_bytes", worker="0", location=GROW_SITE) == 5 * 3333
        assert one(s, "allocscope_location_live_bytes", worker="1", location=GROW_SITE) == 2 * 3333
        assert one(s, "allocscope_up", worker="0") == one(s, "allocscope_up", worker="1") == 1

        exp.target_ended("killed", 101)
        s = scrape(exp)
        assert one(s, "allocscope_up", worker="0") == 0 and one(s, "allocscope_up", worker="1") == 1
        assert one(s, "allocscope_target_ends_total", worker="0", reason="killed") == 1
        assert one(s, "allocscope_target_ends_total", worker="1", reason="killed") == 0
        assert exp.target_started(303, "grower", "/t/grower-303.allocscope") is True  # the freed slot
        assert exp.target_started(404, "grower", "/t/grower-404.allocscope") is True
        assert exp.target_started(505, "grower", "/t/grower-505.allocscope") is False  # over the cap
        exp.observe(Feed().step(1.0, {(GROW, T_GROW, "heap"): (7, 1, 0, 0, 7)}), 505)  # dropped
        s = scrape(exp)
        info = {dict(lb)["worker"]: dict(lb)["pid"] for lb in series(s, "allocscope_target_info")}
        assert info == {"0": "303", "1": "202", "2": "404"}, info
        assert one(s, "allocscope_target_restarts_total", worker="0") == 1
        assert {dict(lb)["worker"] for lb in series(s, "allocscope_up")} == {"0", "1", "2"}
    finally:
        exp.close()
    with pytest.raises(UsageError, match="worker"):
        MetricsExporter("127.0.0.1:0", {"worker": "3"}, 10, workers=True)


def test_listeners_fan_out_as_the_commands_wire_them(monkeypatch):
    """common.listeners.Listeners, as record/top/watch build theirs (allocscope/cli/listeners.py):
    none -> no observer for the recorder; a view (a plain callable) and the exporter each get
    every snapshot, in order; a start the exporter cannot serve says False, and its end and
    snapshots reach the view all the same."""
    import reports.live.prometheus as M
    from allocscope.cli.listeners import start_listeners
    from common.listeners import Listeners

    assert Listeners().observer is None and len(start_listeners(None, {"pw": "12"})) == 0
    monkeypatch.setattr(M, "MAX_WORKERS", 1)
    said: list[str] = []
    out = start_listeners("127.0.0.1:0", {"pw": "12"}, 10, said.append, workers=True)
    (exp,) = out.of(MetricsExporter)
    exp.metrics.sym = FakeSymbolizer()
    seen: list[int] = []
    out.add(lambda snap: seen.append(int(snap.seq)))
    try:
        assert said == [f"metrics on {exp.url}"]
        assert out.target_started(101, "grower", None) is True
        assert out.target_started(202, "grower", None) is False  # beyond the exporter's one worker
        feeds = {101: Feed(), 202: Feed()}
        for k in (1, 2):
            for pid, per in ((101, 1000), (202, 7)):
                out.observe(feeds[pid].step(float(k), {(GROW, T_GROW, "heap"): (per * k, k, 0, 0, per * k)}), pid)
        assert seen == [1, 1, 2, 2]  # the view: every snapshot of both
        out.target_ended("killed", 202)  # not served: nothing changes on the exporter
        s = scrape(exp)
        assert one(s, "allocscope_location_live_bytes", worker="0", location=GROW_SITE) == 2000
        assert one(s, "allocscope_up", worker="0") == 1
        out.target_ended("exited", 101)
        s = scrape(exp)
        assert one(s, "allocscope_up", worker="0") == 0
        assert one(s, "allocscope_target_ends_total", worker="0", reason="exited") == 1
        assert one(s, "allocscope_target_ends_total", worker="0", reason="killed") == 0
    finally:
        out.close()
    assert exp.closed
