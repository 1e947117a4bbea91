"""The fleet, end to end (issue 44): a real Prometheus server (Debian's `prometheus`, on loopback,
its own config and storage in a temporary directory, killed at the end and by `timeout` if the
test dies) scrapes `allocscope watch --metrics` over a daemon holding known bytes at known
places, and the figures are read back through Prometheus' HTTP query API; the daemon is then
SIGKILLed and the end is counted, then started again: a restart, the new pid in the info metric.
The trace the info metric names is read with DuckDB. The rule file passes `promtool check rules`
and its unit tests. Without BPF: tests/test_metrics.py."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support import ROOT, build, need_tool, unavailable, wait_for

RULES = ROOT / "contrib" / "prometheus"

# After SIGUSR1: main holds BLOCKS blocks of SIZE at hold_blocks() and pauses; a "waiter" thread
# holds WAITER_BLOCKS of WAITER_SIZE (also at hold_blocks) while blocked in wait_at_gate().
# Prints "held MAIN_BYTES WAITER_BYTES", then stays until killed.
HOLDER_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 37
#define SIZE ((size_t)(1 << 20) + 4096)
#define WAITER_BLOCKS 3
#define WAITER_SIZE ((size_t)(2 << 20) + 8192)

static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep[BLOCKS + WAITER_BLOCKS];

__attribute__((noinline)) size_t hold_blocks(int n, size_t size, int at)
{
    for (int i = 0; i < n; i++) {
        keep[at + i] = malloc(size);
        memset(keep[at + i], 0x5a, size);
    }
    return (size_t)n * size;
}

__attribute__((noinline)) void wait_at_gate(void)
{
    pthread_mutex_lock(&gate);
    pthread_mutex_unlock(&gate);
}

static void *waiter(void *arg)
{
    (void)arg;
    hold_blocks(WAITER_BLOCKS, WAITER_SIZE, BLOCKS);
    wait_at_gate();
    return NULL;
}

int main(void)
{
    sigset_t usr1;
    int sig;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    pthread_mutex_lock(&gate);
    printf("ready %d\n", getpid());
    fflush(stdout);
    sigwait(&usr1, &sig);
    pthread_t t;
    pthread_create(&t, NULL, waiter, NULL);
    size_t held = hold_blocks(BLOCKS, SIZE, 0);
    printf("held %zu %zu\n", held, (size_t)WAITER_BLOCKS * WAITER_SIZE);
    fflush(stdout);
    for (;;)
        pause();
}
"""
SIZE = (1 << 20) + 4096  # one allocation of the main thread: the tolerance


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A prometheus server on loopback scraping `target` every second, with the repo's rules."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(RULES / 'allocscope-rules.yml'))}]\n"
            "scrape_configs:\n"
            "  - job_name: allocscope\n"
            f"    static_configs: [{{targets: [{json.dumps(target)}]}}]\n"
        )
        exe = need_tool("prometheus")
        self.log = (tmp / "prometheus.log").open("w")
        self.p = subprocess.Popen(
            [
                "timeout",
                "-s",
                "KILL",
                "600",  # it stops by itself if this test dies
                exe,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, q: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            doc = json.loads(urllib.request.urlopen(url, timeout=5).read())
        except OSError:
            return []
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def value(self, q: str) -> float | None:
        r = self.query(q)
        return float(r[0]["value"][1]) if len(r) == 1 else None

    def until(self, q: str, ok, timeout: float) -> float:
        """The value of `q` (one series) once `ok(value)` holds; fails with the last answer."""
        end = time.monotonic() + timeout
        last: list[dict] = []
        while time.monotonic() < end:
            last = self.query(q)
            if len(last) == 1 and ok(float(last[0]["value"][1])):
                return float(last[0]["value"][1])
            time.sleep(0.5)
        raise AssertionError(f"{q} in Prometheus after {timeout}s: {last}")

    def stop(self) -> None:
        self.p.kill()
        self.p.wait(10)
        self.log.close()


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(target: str) -> Prometheus:
        d = tmp_path / f"prom{len(started)}"
        d.mkdir()
        pr = Prometheus(d, target)
        started.append(pr)
        return pr

    yield start
    for pr in started:
        pr.stop()


def test_rules_pass_promtool():
    promtool = need_tool("promtool")
    for args in (["check", "rules", "allocscope-rules.yml"], ["check", "config", "prometheus.yml"]):
        p = subprocess.run([promtool, *args], cwd=RULES, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
    test = [promtool, "test", "rules", "allocscope-rules.test.yml"]
    p = subprocess.run(test, cwd=RULES, capture_output=True, text=True)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


@pytest.mark.bpf
def test_prometheus_scrapes_watch(tmp_path, procs, tracers, prometheus):
    exe = build(tmp_path / "holder", _source(tmp_path), flags=["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"])
    port = free_port()
    prom = prometheus(f"127.0.0.1:{port}")
    tgt = procs(exe)
    tgt.expect("ready")
    out = tmp_path / "traces"
    tr = tracers(
        "watch",
        "--pid",
        tgt.pid,
        "-o",
        out,
        "--metrics",
        f"127.0.0.1:{port}",
        "--label",
        "pw=2",
        "--mode",
        "full",
        "--interval",
        "1",
    )
    wait_for(
        lambda: any(out.glob("*/meta.json")) or tr.poll() is not None, timeout=120, what="watch attached to the daemon"
    )
    assert tr.poll() is None, tr.stderr.read()
    tgt.signal(signal.SIGUSR1)
    main_bytes, waiter_bytes = (int(x) for x in tgt.expect("held").split()[1:3])

    # the site's live bytes as Prometheus stored them: the daemon's own count, within one allocation
    site = 'allocscope_location_live_bytes{location=~"hold_blocks .*"}'
    got = prom.until(site, lambda v: abs(v - (main_bytes + waiter_bytes)) <= SIZE, timeout=90)
    assert abs(got - (main_bytes + waiter_bytes)) <= SIZE, (got, main_bytes + waiter_bytes)
    labels = prom.query(site)[0]["metric"]
    assert labels["pw"] == "2" and labels["job"] == "allocscope" and labels["instance"] == f"127.0.0.1:{port}"
    assert labels["location"].startswith("hold_blocks holder.c:"), labels
    rss = prom.value('allocscope_rss_bytes{pw="2"}')
    assert rss is not None and rss >= main_bytes + waiter_bytes
    waiting = prom.until('allocscope_waiting_held_bytes{wait=~"wait_at_gate .*"}', lambda v: v > 0, timeout=30)
    assert abs(waiting - waiter_bytes) <= SIZE, (waiting, waiter_bytes)
    info = prom.query('allocscope_target_info{pw="2"}')
    trace = Path(info[0]["metric"]["trace"])
    assert info[0]["metric"]["pid"] == str(tgt.pid) and trace.parent == out and (trace / "meta.json").exists()

    tgt.kill()  # SIGKILL: watch stays, waiting for the next incarnation
    prom.until('allocscope_target_ends_total{reason="killed",pw="2"}', lambda v: v == 1, timeout=60)
    assert prom.value('allocscope_up{pw="2"}') == 0
    assert prom.value('sum(allocscope_target_ends_total{pw="2"})') == 1
    assert tr.poll() is None, "watch keeps watching after its target was killed"

    # the daemon restarted (the same command line): a new incarnation, its own series
    again = procs(exe)
    again.expect("ready")
    prom.until('allocscope_target_restarts_total{pw="2"}', lambda v: v == 1, timeout=60)
    prom.until(f'allocscope_target_info{{pw="2",pid="{again.pid}"}}', lambda v: v == 1, timeout=30)
    assert prom.value('allocscope_up{pw="2"}') == 1
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()

    # the same trace's Parquet parts, read by DuckDB as a fleet would: per stack, the live bytes
    # of its last row; the main thread's and the waiter's stacks hold exactly what they said
    try:
        import duckdb
    except ImportError:
        unavailable("duckdb (the test extras: pip install -e '.[test]')")
    live = duckdb.sql(
        f"""
        WITH last AS (
          SELECT stack_id, arg_max(alloc_bytes - free_bytes, seq) AS live
          FROM read_parquet('{trace}/parts/sites-*.parquet', union_by_name = true)
          GROUP BY stack_id, tid, source)
        SELECT stack_id, sum(live) FROM last GROUP BY stack_id
        """
    ).fetchall()
    per_stack = sorted(int(v) for _sid, v in live)
    assert main_bytes in per_stack and waiter_bytes in per_stack, per_stack


def _source(tmp: Path) -> Path:
    src = tmp / "holder.c"
    src.write_text(HOLDER_C)
    return src
