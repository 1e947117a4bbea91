"""`allocscope watch` (issue 43): a daemon restarted three times, each incarnation SIGKILLed at a
known number of bytes held at one site, short-lived incarnations killed while the probes attach
in between; --keep bounding a trace's history while its live state stays whole; --when-rss and
--on-trigger; a SIGKILLed watcher leaving no daemon stopped; `record --pid` of a target that dies
while it attaches. Ground truth: tests/targets/restartd.c prints what it holds.

The watch records in its default mode (residency: the mmap family, exact and live per mapping),
so a 1 MiB + 4 KiB block is glibc's mmapped chunk: its pages, CHUNK bytes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT, cli, report_json, wait_for

from common.units import human_bytes

pytestmark = pytest.mark.bpf

BLOCK = (1 << 20) + 4096  # restartd's block
PAGE = os.sysconf("SC_PAGE_SIZE")
CHUNK = (BLOCK + 16 + PAGE - 1) // PAGE * PAGE  # glibc's mmapped chunk of one block: header, pages


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def held_line(d) -> tuple[int, int]:
    _, nbytes, blocks = d.expect("held", 60).split()
    return int(nbytes), int(blocks)


def hold_rows(rep: dict) -> list[dict]:
    return [r for r in rep["locations"] if r.get("function") == "hold_partitions"]


def test_watch_follows_restarts_and_names_each_end(targets, procs, watches, tmp_path):
    exe = targets["restartd"]
    out = tmp_path / "traces"
    # --on-end: each complete trace handed to a command with how it ended
    hook = (
        f'{{ env | grep ^ALLOCSCOPE_ | sort; {sys.executable} -c "import json, os; '
        f"print('complete', json.load(open(os.environ['ALLOCSCOPE_TRACE'] + '/meta.json'))['complete'])\"; }}"
        f" > {tmp_path}/end-$ALLOCSCOPE_PID"
    )
    w = watches("--pgrep", f"^{exe} (hold|exit)", "-o", out, "--interval", "0.5", "--on-end", hook)
    w.expect("watching", 240)  # the probes are built (compiled once) before the first incarnation
    truth = {}
    for n in (40, 56, 72):
        d = procs(exe, "hold", n)
        w.expect(f"recording pid {d.pid}")
        nbytes, blocks = held_line(d)  # it ran only once the probes were live: held at its exec
        assert (nbytes, blocks) == (n * BLOCK, n)
        truth[d.pid] = blocks
        time.sleep(1.2)  # a snapshot with all of it
        d.signal(signal.SIGKILL)
        w.expect(f"pid {d.pid} killed by SIGKILL")
        # a short-lived incarnation, killed while it is held and the probes attach
        s = subprocess.Popen([str(exe), "exit", "100"])
        wait_for(lambda s=s: state(s.pid) in ("T", "t", "Z", "gone"), timeout=10, what="held at its exec")
        was = state(s.pid)
        s.kill()
        s.wait(10)
        w.expect(f"pid {s.pid}", 30 if was in ("T", "t") else 0.1)  # one line: it ended while held
    assert w.stop() == 0
    err = "".join(w.all)
    print(err)  # shown when the test fails: the watch's debug lines, each hold and release
    assert "Traceback" not in err, err
    traces = sorted(out.glob("restartd-*.allocscope"))
    by_pid = {json.loads((t / "meta.json").read_text())["target"]["pid"]: t for t in traces}
    assert set(truth) <= set(by_pid), (truth, traces)
    for pid, blocks in truth.items():
        rep = report_json(by_pid[pid])
        end = rep["recording"]["end"]
        assert end["reason"] == "killed" and end["signal"] == "SIGKILL", end
        assert rep["recording"]["end_reason"] == "target exited"  # kept for readers of today
        rows = hold_rows(rep)
        mapped = sum(r["live_by_source"].get("mmap", 0) for r in rows)
        # the composition at the kill: every block the daemon said it holds, from the first one
        # (held at its exec, and at each library the loader maps until its unwind rows are in)
        top = [(r["function"], r["live_by_source"]) for r in rep["locations"][:6]]
        assert mapped == blocks * CHUNK, (blocks, top)
        first = rep["findings"][0]
        assert first["kind"] == "ended" and first["text"].startswith("Killed by SIGKILL"), first
        # the ended finding says what the table beside it says (residency: exact mmap bytes plus
        # the first-touch estimate, never the raw cumulative touches), and at least the exact part
        named = [r for r in rows if r["location"] == first["figures"]["location"]]
        assert len(named) == 1 and "hold_partitions" in first["text"], (first, top)
        exact = named[0]["live_bytes"] - named[0]["live_by_source"].get("fault", 0)
        assert first["figures"]["live_bytes"] == named[0]["live_bytes"] >= exact > 0, (first, named)
        assert f"held {human_bytes(named[0]['live_bytes'])}" in first["text"], first
        assert ("estimate from sampled first touches" in first["text"]) == bool(
            named[0]["live_by_source"].get("fault")
        ), (first, named)
        assert rep["totals"]["rss_bytes"] >= blocks * BLOCK  # the last RSS measured alive, not a dead 0
        said = wait_for(lambda pid=pid: _complete_file(tmp_path / f"end-{pid}"), 10, "--on-end's file")
        env = dict(ln.split("=", 1) for ln in said[:-1])
        assert said[-1] == "complete True"  # the trace was complete on disk when the command ran
        rss = int(env.pop("ALLOCSCOPE_RSS_BYTES"))
        assert rss == rep["totals"]["rss_bytes"] and rss >= blocks * BLOCK, (rss, rep["totals"])
        want = {
            "ALLOCSCOPE_END": "killed",
            "ALLOCSCOPE_EXIT_CODE": "",
            "ALLOCSCOPE_OOM_CGROUP": "",
            "ALLOCSCOPE_PID": str(pid),
            "ALLOCSCOPE_SIGNAL": "SIGKILL",
            "ALLOCSCOPE_TRACE": str(by_pid[pid]),
        }
        assert {k: env.get(k) for k in want} == want, env  # (and the test's own ALLOCSCOPE_ settings)
    for t in traces:  # the short-lived ones: killed while held, before their recording began
        m = json.loads((t / "meta.json").read_text())
        assert m["target"]["pid"] in truth or (m.get("end") or {}).get("reason") in ("killed", "exited"), m


def test_watch_names_a_real_oom_kill_and_tells_on_end(memory_cgroup, targets, watches, tmp_path):
    """The night's failure, end to end: a restarted daemon, held at its exec and traced from its
    first allocation, grows until the OOM killer of its memory cgroup (48 MiB) ends it. The watch
    says so, its trace is OOM-killed by the kernel's own mark (with the kernel's figures and the
    site that grew), and --on-end is handed the end the moment the trace is complete."""
    exe = targets["restartd"]
    cg, procs_file = memory_cgroup("allocscope-watch-oom")
    out = tmp_path / "traces"
    hook = f"env | grep ^ALLOCSCOPE_ | sort > {tmp_path}/end-$ALLOCSCOPE_PID"
    w = watches("--pgrep", f"^{exe} oom", "-o", out, "--interval", "0.5", "--on-end", hook)
    w.expect("watching", 240)
    # joins the cgroup, then execs the daemon: the watch's gate holds it at that exec
    d = subprocess.Popen(
        ["/bin/sh", "-c", f"echo $$ > {procs_file} && exec {exe} oom 2 50"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    w.expect(f"recording pid {d.pid}", 60)
    assert d.wait(60) == -signal.SIGKILL
    line = w.expect(f"pid {d.pid} OOM-killed by the memory cgroup ", 30)
    assert re.search(rf"/{cg.name} \(limit 48\.0 MiB, anon-rss \d+\.\d MiB at the kill\): wrote ", line), line
    said = wait_for(lambda: _env_file(tmp_path / f"end-{d.pid}"), 10, "--on-end's file")
    assert w.stop() == 0
    trace = out / line.split("wrote ")[1].split(" (")[0].rsplit("/", 1)[1]
    rep = report_json(trace)
    end = rep["recording"]["end"]
    assert end["reason"] == "oom_killed" and end["oom"]["told_by"] == "mark_victim", end
    assert end["oom"]["cgroup"].endswith(f"/{cg.name}") and end["oom"]["victim"]["pid"] == d.pid, end
    anon = end["oom"]["victim"]["anon_rss_bytes"]
    assert 24 << 20 <= anon <= 48 << 20, anon
    grew = sum(r["live_bytes"] for r in rep["locations"] if r.get("function") == "grow_until_killed")
    assert grew >= 20 << 20, [(r.get("function"), r["live_bytes"]) for r in rep["locations"][:5]]
    # the default's composition never above the RSS high-water (issue 50), which is at least the
    # RSS the kernel counted at the kill: what was mapped then counted up to it
    victim = end["oom"]["victim"]
    at_kill = victim["anon_rss_bytes"] + victim["file_rss_bytes"] + victim["shmem_rss_bytes"]
    tot = rep["totals"]
    assert tot["hwm_bytes"] >= at_kill and tot["peak_live_bytes"] <= tot["hwm_bytes"], (tot, victim)
    assert rep["at_peak"]["live_bytes"] <= tot["hwm_bytes"] and rep["recording"]["invariants"] == [], rep["at_peak"]
    first = rep["findings"][0]["text"]
    assert first.startswith(f"OOM-killed by the memory cgroup {end['oom']['cgroup']} (limit 48.0 MiB)"), first
    assert "the kernel counted anon-rss " in first and "grow_until_killed" in first, first
    # what it held at the kill, from the last RSS read while it was alive, never the kernel's
    # teardown (readgate.dying: the GPU box's 24 GiB victims read RSS 0 and held nothing)
    assert re.search(r"; RSS \d+\.\d MiB = live heap ", first) and re.search(r"grow_until_killed \S+ held \d", first), (
        first
    )
    want = {
        "ALLOCSCOPE_END": "oom_killed",
        "ALLOCSCOPE_SIGNAL": "SIGKILL",
        "ALLOCSCOPE_EXIT_CODE": "",
        "ALLOCSCOPE_OOM_CGROUP": end["oom"]["cgroup"],
        "ALLOCSCOPE_PID": str(d.pid),
        "ALLOCSCOPE_TRACE": str(trace),
    }
    assert {k: said.get(k) for k in want} == want, said


def _env_file(path: Path) -> dict[str, str] | None:
    """The ALLOCSCOPE_ variables a command wrote, once it has written them."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    env = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    return env if env.get("ALLOCSCOPE_TRACE", "").endswith(".allocscope") else None


def _complete_file(path: Path) -> list[str] | None:
    """The lines of a file a command is writing, once its last line is in."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return lines if lines and lines[-1].startswith("complete ") else None


def test_watch_keep_bounds_history_and_when_rss_keeps_a_snapshot(targets, procs, watches, tmp_path):
    exe = targets["restartd"]
    out = tmp_path / "traces"
    said = tmp_path / "trigger.env"
    w = watches(
        "--pgrep", f"^{exe} hold", "-o", out, "--interval", "0.25", "--keep", "2s",
        "--when-rss", "40M", "--on-trigger", f"env | grep ^ALLOCSCOPE_ > {said}",
    )  # fmt: skip
    w.expect("watching", 240)
    d = procs(exe, "hold", 64, 100)  # 64 blocks, one each 100 ms: 6.4 s of growth
    w.expect(f"recording pid {d.pid}")
    w.expect("kept as snapshot 'rss'", 30)
    nbytes, blocks = held_line(d)
    time.sleep(3)
    d.signal(signal.SIGKILL)
    line = w.expect(f"pid {d.pid} killed by SIGKILL")
    assert w.stop() == 0
    assert "Traceback" not in "".join(w.all)
    trace = Path(line.split("wrote ", 1)[1].split(" (", 1)[0])
    meta = json.loads((trace / "meta.json").read_text())
    kept, trig = meta["kept"], meta["triggers"][0]
    assert kept["dropped_intervals"] > 0 and kept["keep_s"] == 2.0, kept
    rep = report_json(trace)
    total = meta["intervals"]
    # intervals held: the last --keep (and at most one cut period more), the peak, the trigger, the base
    assert rep["totals"]["intervals"] <= (2 + 1 + 1.5) / 0.25 + 4, (rep["totals"]["intervals"], total, kept)
    assert rep["totals"]["intervals"] + kept["dropped_intervals"] >= total - 2
    # the live state since the attach is whole, whatever was dropped
    top = [(r["function"], r["live_by_source"]) for r in rep["locations"][:6]]
    assert sum(r["live_by_source"].get("mmap", 0) for r in hold_rows(rep)) == blocks * CHUNK, (
        top,
        rep["totals"]["lost_events"],
    )
    # the trigger: RSS passed 40 MiB; its snapshot kept and readable; the command saw the trace
    assert trig["name"] == "rss" and trig["rss_bytes"] >= 40 << 20 and trig["seq"] in kept["pinned"], trig
    env = dict(line.strip().split("=", 1) for line in said.read_text().splitlines())
    assert env["ALLOCSCOPE_TRACE"] == str(trace) and env["ALLOCSCOPE_PID"] == str(d.pid), env
    folded = cli("report", str(trace), "--format", "folded", "--at", "rss", "--source", "mmap", check=True).stdout
    at_rss = sum(int(x.rsplit(" ", 1)[1]) for x in folded.splitlines() if "hold_partitions" in x)
    # the blocks mapped when RSS passed 40 MiB: about 40 MiB of them, fewer than all 64
    assert (40 << 20) - 4 * CHUNK <= at_rss <= trig["rss_bytes"] and at_rss < blocks * CHUNK, (at_rss, trig)


def test_watcher_killed_leaves_no_daemon_stopped(targets, procs, watches, tmp_path):
    exe = targets["restartd"]
    w = watches("--pgrep", f"^{exe} hold", "-o", tmp_path / "t", "--interval", "0.5")
    w.expect("watching", 240)
    from tracer.bpf.objects import prog_exists, tracer_objects

    gate = tracer_objects(w.p.pid)["progs"]  # the gate's programs
    assert gate
    d = procs(exe, "hold", 4)
    wait_for(lambda: state(d.pid) in ("T", "t"), timeout=10, what="held at its exec")
    progs = gate | tracer_objects(w.p.pid)["progs"]
    w.p.send_signal(signal.SIGKILL)  # while the probes attach to the held daemon
    w.p.wait(10)
    assert held_line(d) == (4 * BLOCK, 4)  # the guardian let it go: it ran
    assert state(d.pid) in ("S", "R")
    # no BPF program of the watch is left loaded (the gate's and the recording's, whatever it had)
    wait_for(lambda: not any(prog_exists(p) for p in progs), timeout=10, what="the watch's programs gone")


def test_record_pid_target_dies_during_attach(targets, procs, tmp_path):
    d = procs(targets["restartd"], "hold", 1)
    d.expect("held")
    out = tmp_path / "x.allocscope"
    r = subprocess.Popen(
        [sys.executable, "-m", "allocscope", "record", "--verbose", "--pid", str(d.pid), "-o", str(out)],
        stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
    )  # fmt: skip
    err = []
    for line in r.stderr:  # killed once the tracer has read its maps and while the probes load
        err.append(line)
        if "maps, allocators, symbol scans" in line:
            d.signal(signal.SIGKILL)
            break
    err += r.stderr.readlines()
    assert r.wait(60) == 3, err
    last = err[-1]
    assert "Traceback" not in "".join(err), err
    assert f"process {d.pid} (restartd) ended while allocscope was attaching (killed by SIGKILL)" in last, err
    assert "nothing was recorded" in last and not out.exists()


def test_a_second_watch_of_one_program_finds_it_without_holding_it(targets, procs, watches, tmp_path):
    """Two gates holding one program name would let each other's holds go (tracer/watch/claims.py):
    the second watch says so and finds the incarnations by a look at /proc; the first still holds
    each at its exec and traces it from its first allocation."""
    exe = targets["restartd"]
    a = watches("--pgrep", f"^{exe} hold", "-o", tmp_path / "a", "--interval", "0.5")
    assert "held at their exec" in a.expect("watching", 240)
    b = watches("--pgrep", f"^{exe} hold", "-o", tmp_path / "b", "--interval", "0.5")
    said = b.expect("another allocscope watch", 240)
    assert f"another allocscope watch (pid {a.p.pid}) holds restartd at its exec" in said, said
    assert "held at their exec" not in b.expect("watching", 60)
    d = procs(exe, "hold", 8)
    a.expect(f"recording pid {d.pid}")
    assert held_line(d) == (8 * BLOCK, 8)  # it ran once the first watch's probes were live
    b.expect(f"recording pid {d.pid}", 30)  # the second found it running
    time.sleep(1.2)  # a snapshot with all of it
    d.signal(signal.SIGKILL)
    for w in (a, b):
        w.expect(f"pid {d.pid} killed by SIGKILL")
    assert a.stop() == 0 and b.stop() == 0
    for w in (a, b):
        assert "Traceback" not in "".join(w.all), "".join(w.all)
    (trace,) = (tmp_path / "a").glob("restartd-*.allocscope")
    rows = hold_rows(report_json(trace))
    assert sum(r["live_by_source"].get("mmap", 0) for r in rows) == 8 * CHUNK  # from the first block
    (second,) = (tmp_path / "b").glob("restartd-*.allocscope")
    assert report_json(second)["recording"]["end"]["reason"] == "killed"


def test_a_held_daemon_runs_on_when_its_traces_folder_is_gone(targets, procs, watches, tmp_path):
    """Issue 50's soak: the traces folder removed under the watch left the next incarnation held
    at its exec for good (its recording failed before it began). Now the folder is made again
    (one line); where it cannot be, the watch says so in one line and lets the daemon run."""
    exe = targets["restartd"]
    out = tmp_path / "t"
    w = watches("--pgrep", f"^{exe} hold", "-o", out, "--interval", "0.5")
    w.expect("watching", 240)
    shutil.rmtree(out)
    d = procs(exe, "hold", 4)
    w.expect(f"{out} was removed under the watch: made it again", 30)
    w.expect(f"recording pid {d.pid}")
    assert held_line(d) == (4 * BLOCK, 4)  # held at its exec, then let go once the probes were live
    time.sleep(1.2)  # a snapshot with all of it: the composition at a kill is the last measured alive
    d.signal(signal.SIGKILL)
    w.expect(f"pid {d.pid} killed by SIGKILL")
    (trace,) = out.glob("restartd-*.allocscope")
    assert sum(r["live_by_source"].get("mmap", 0) for r in hold_rows(report_json(trace))) == 4 * CHUNK
    shutil.rmtree(out)
    out.write_text("a file where the folder was\n")  # it cannot be made again
    e = procs(exe, "hold", 2)
    said = w.expect(f"pid {e.pid}: cannot write its trace: {out} is gone", 30)
    assert said.rstrip().endswith("it runs untraced"), said
    assert held_line(e) == (2 * BLOCK, 2)  # it ran: not stopped for good
    assert state(e.pid) in ("S", "R")
    e.signal(signal.SIGKILL)
    assert w.stop() == 0
    err = "".join(w.all)
    assert "Traceback" not in err, err
