"""`allocscope watch` over every matching process at once (issue 50): four daemons of one command
line, three started before the watch and one after (held at its exec), each holding a number of
blocks of its own (restartd wait K: K from its argv, allocated once the tracer is attached), each
SIGKILLed: four traces, each with its own site bytes equal to that daemon's own count, its own end,
its own --on-end, and its own series on --metrics (the `worker` label). A trace mixed up with
another daemon's has another daemon's count and fails."""

from __future__ import annotations

import json
import shutil
import signal
import time
import urllib.request

import pytest
from support import report_json, wait_for
from test_watch_bpf import BLOCK, CHUNK, held_line, hold_rows

pytestmark = pytest.mark.bpf


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def complete_file(path) -> list[str] | None:
    """The lines --on-end's command wrote, once its last line is in."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return lines if lines and lines[-1] == "complete True" else None


def said_each(w, needles: list[str], timeout: float = 60) -> None:
    """Every needle said by the watch, in any order (its processes' threads say them as they come)."""

    def missing() -> list[str]:
        text = "".join(w.said)
        return [n for n in needles if n not in text]

    try:
        wait_for(lambda: not missing(), timeout, "the watch's lines", step=0.1)
    except AssertionError:
        raise AssertionError(w.missed(str(missing()))) from None


def test_watch_follows_every_matching_process_each_its_own_trace(targets, procs, watches, tmp_path):
    # restartd under a name of its own: a watch claims its program name box-wide (one gate per name),
    # and test_watch_bpf.py's watches of restartd may run beside this file on the other worker
    exe = tmp_path / "fleetd"
    shutil.copy2(targets["restartd"], exe)
    out = tmp_path / "traces"
    end_file = f"{tmp_path}/end-$ALLOCSCOPE_PID"
    hook = f"env | grep ^ALLOCSCOPE_ | sort > {end_file}; echo complete True >> {end_file}"
    before = {}
    for k in (3, 5, 7):
        d = procs(exe, "wait", k)
        d.expect("ready", 30)
        before[d] = k
    w = watches("--pgrep", f"^{exe} wait", "-o", out, "--interval", "0.5", "--on-end", hook, "--metrics", "127.0.0.1:0")
    url = w.expect("metrics on http://", 60).split("metrics on ", 1)[1].strip()
    w.expect("watching", 240)
    said_each(w, [f"recording pid {d.pid}" for d in before])
    later = procs(exe, "wait", 9)
    said_each(w, [f"recording pid {later.pid}"])
    later.expect("ready", 30)  # it ran only once its probes were live: held at its exec
    daemons = {**before, later: 9}
    for d, k in daemons.items():
        d.signal(signal.SIGUSR1)
        assert held_line(d) == (k * BLOCK, k)

    def served(s: dict) -> dict | None:
        """The scrape once each worker's series say its own process's RSS with all it holds."""
        workers = {lb["worker"]: int(lb["pid"]) for lb, _v in s.get("allocscope_target_info", [])}
        rss = {workers.get(lb["worker"]): v for lb, v in s.get("allocscope_rss_bytes", [])}
        return s if all(rss.get(d.pid, 0) >= k * BLOCK for d, k in daemons.items()) else None

    s = wait_for(lambda: served(scrape(url)), 30, "each worker's RSS on --metrics")
    workers = {lb["worker"]: int(lb["pid"]) for lb, _v in s["allocscope_target_info"]}
    assert sorted(workers) == ["0", "1", "2", "3"] and set(workers.values()) == {d.pid for d in daemons}, workers
    assert sorted(lb["worker"] for lb, v in s["allocscope_up"] if v == 1) == ["0", "1", "2", "3"], s["allocscope_up"]
    time.sleep(1.0)  # a snapshot of each with all of it in its trace
    for d in daemons:
        d.signal(signal.SIGKILL)
    said_each(w, [f"pid {d.pid} killed by SIGKILL" for d in daemons])
    assert w.stop() == 0
    err = "".join(w.all)
    print(err)
    assert "Traceback" not in err and "processes match; following the oldest" not in err, err
    ends = {d.pid: next(ln for ln in w.all if f"pid {d.pid} killed by SIGKILL" in ln) for d in daemons}
    assert "traced from its exec" in ends[later.pid], ends  # the one started after: held at its exec
    assert not any("traced from its exec" in ends[d.pid] for d in before), ends
    traces = sorted(out.glob("fleetd-*.allocscope"))
    by_pid = {json.loads((t / "meta.json").read_text())["target"]["pid"]: t for t in traces}
    assert set(by_pid) == {d.pid for d in daemons}, (by_pid, err)
    for d, k in daemons.items():
        rep = report_json(by_pid[d.pid])
        end = rep["recording"]["end"]
        assert end["reason"] == "killed" and end["signal"] == "SIGKILL", (d.pid, end)
        mapped = sum(r["live_by_source"].get("mmap", 0) for r in hold_rows(rep))
        assert mapped == k * CHUNK, (d.pid, k, mapped, k * CHUNK)  # its own count, not another's
        said = wait_for(lambda p=d.pid: complete_file(tmp_path / f"end-{p}"), 10, "--on-end's file")
        env = dict(ln.split("=", 1) for ln in said[:-1])
        assert env["ALLOCSCOPE_PID"] == str(d.pid) and env["ALLOCSCOPE_END"] == "killed", env
        assert env["ALLOCSCOPE_TRACE"] == str(by_pid[d.pid]), env
