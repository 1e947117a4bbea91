"""How a target's end is named (tracer/process/ending.py) from its wait status, its memory cgroups'
OOM counters and, where the recording watched it, the kernel's oom:mark_victim: every case of the
decision on cgroup directories made here (cgroup v2's memory.events and memory.max), no BPF. The
real OOM kills are tests/test_faults_bpf.py's."""

from __future__ import annotations

import signal

import pytest

from reports.analysis.ending import end_finding, end_text
from tracer.process.ending import Cgroup, CgroupWatch, OomMark, describe_end, read_events

SIGKILLED = signal.SIGKILL  # a wait status: killed by SIGKILL, no core
EXITED_0 = 0
VICTIM = {"pid": 4242, "time": 3.2, "anon_rss_bytes": 47 << 20, "file_rss_bytes": 3 << 19, "shmem_rss_bytes": 0}


def _cgroups(tmp_path, limit: int | None = 48 << 20) -> CgroupWatch:
    """The target's cgroup /box/job (with `limit`) under /box (none): counters all 0 at the start."""
    groups = []
    for path, lim in (("/box/job", limit), ("/box", None)):
        d = tmp_path / path.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
        (d / "memory.max").write_text(str(lim) if lim else "max")
        groups.append(Cgroup(path, lim, read_events(str(d)), str(d)))
    return CgroupWatch(groups, 0)


def _count(tmp_path, path: str, oom: int, oom_kill: int) -> None:
    (tmp_path / path.strip("/") / "memory.events").write_text(f"low 0\nhigh 0\nmax 9\noom {oom}\noom_kill {oom_kill}\n")


def test_without_the_mark_the_counters_tell(tmp_path):
    """Not watched (an old kernel, no tracefs): a SIGKILL with the cgroup's oom_kill risen is an
    OOM kill by the cgroup whose `oom` rose; without a rise it is a plain kill."""
    w = _cgroups(tmp_path)
    assert describe_end("target exited", SIGKILLED, w)["reason"] == "killed"
    _count(tmp_path, "/box/job", 1, 1)
    end = describe_end("target exited", SIGKILLED, w)
    assert end["reason"] == "oom_killed" and end["signal"] == "SIGKILL"
    assert end["oom"] == {
        "scope": "cgroup",
        "cgroup": "/box/job",
        "limit_bytes": 48 << 20,
        "told_by": "cgroup_counters",
    }


def test_the_mark_decides_where_it_was_watched(tmp_path):
    """Watched: the counters risen but the OOM killer chose another process of the cgroup, so
    the target's SIGKILL was someone's kill -9; marked, it is an OOM kill with the kernel's figures."""
    w = _cgroups(tmp_path)
    _count(tmp_path, "/box/job", 1, 1)
    end = describe_end("target exited", SIGKILLED, w, 4.0, OomMark(None))
    assert (end["reason"], end["signal"], end["oom"]) == ("killed", "SIGKILL", None)
    end = describe_end("target exited", SIGKILLED, w, 4.0, OomMark(VICTIM))
    assert end["reason"] == "oom_killed"
    assert end["oom"] == {
        "scope": "cgroup",
        "cgroup": "/box/job",
        "limit_bytes": 48 << 20,
        "told_by": "mark_victim",
        "victim": VICTIM,
    }


def test_a_marked_victim_with_no_cgroup_at_its_limit_was_the_machines(tmp_path):
    """Marked, and no cgroup of the target counted an `oom` (the machine ran out of memory; the
    counters of the cgroup say oom_kill only): scope global. With no memory cgroup to read at
    all, the mark still names the kill, without a scope."""
    w = _cgroups(tmp_path, limit=None)
    _count(tmp_path, "/box/job", 0, 1)
    end = describe_end("target exited", SIGKILLED, w, 1.0, OomMark(VICTIM))
    assert end["oom"]["scope"] == "global" and end["oom"]["cgroup"] is None
    assert end_text(end) == "OOM-killed (the whole machine was out of memory)"
    end = describe_end("target exited", SIGKILLED, CgroupWatch([], 0), 1.0, OomMark(VICTIM))
    assert end["reason"] == "oom_killed" and end["oom"]["scope"] is None and end["oom"]["victim"] == VICTIM
    assert end_text(end) == "OOM-killed"


def test_no_wait_status(tmp_path):
    """The status is not known (reaped already, a kernel before PIDFD_INFO_EXIT): the mark names
    an OOM kill (SIGKILL is what it sends); not marked, "exited" as before."""
    w = _cgroups(tmp_path)
    end = describe_end("target exited", None, w, 1.0, OomMark(VICTIM))
    assert (end["reason"], end["signal"], end["oom"]["told_by"]) == ("oom_killed", "SIGKILL", "mark_victim")
    _count(tmp_path, "/box/job", 1, 1)
    end = describe_end("target exited", None, w, 1.0, OomMark(None))
    assert (end["reason"], end["signal"], end["oom"]) == ("exited", None, None)


@pytest.mark.parametrize("status", [EXITED_0, signal.SIGTERM])
def test_only_a_sigkill_is_an_oom_kill(tmp_path, status):
    """A mark (of a process that then exited or died of another signal first: the OOM reaper's
    SIGKILL came too late) never turns another end into an OOM kill."""
    end = describe_end("target exited", status, _cgroups(tmp_path), 1.0, OomMark(VICTIM))
    assert end["reason"] == ("exited" if status == EXITED_0 else "killed") and end["oom"] is None


def test_the_first_finding_says_what_the_kernel_counted():
    """The kernel's figures at the kill come first in the finding, beside the last RSS read alive."""
    end = {
        "reason": "oom_killed",
        "signal": "SIGKILL",
        "time": 3.25,
        "oom": {
            "scope": "cgroup",
            "cgroup": "/box/job",
            "limit_bytes": 48 << 20,
            "told_by": "mark_victim",
            "victim": VICTIM,
        },
    }
    doc = {"recording": {"end": end}, "totals": {"rss_bytes": 40 << 20}, "locations": []}
    text = end_finding(doc)["text"]
    assert text == (
        "OOM-killed by the memory cgroup /box/job (limit 48.0 MiB) at +3.2s: at the kill, the kernel counted "
        "anon-rss 47.0 MiB, file-rss 1.5 MiB, shmem-rss 0 B; RSS 40.0 MiB."
    ), text


def test_on_end_environment_of_an_oom_kill():
    """`watch --on-end`'s environment (tracer/watch/triggers.py end_env) of an OOM-killed incarnation:
    how it ended, the cgroup that was full, the last RSS measured alive; empty, never "None"."""
    from types import SimpleNamespace

    from tracer.watch.triggers import end_env

    end = describe_end("target exited", SIGKILLED, None, 2.0, OomMark(VICTIM))
    rec = SimpleNamespace(
        end=end | {"oom": end["oom"] | {"cgroup": "/box/job"}},
        opts=SimpleNamespace(output="/var/lib/allocscope/provingd-4242.allocscope"),
        target=SimpleNamespace(pid=4242),
        snapshots=SimpleNamespace(last_rss={"rss_bytes": 50 << 20}),
    )
    assert end_env(rec) == {
        "ALLOCSCOPE_TRACE": "/var/lib/allocscope/provingd-4242.allocscope",
        "ALLOCSCOPE_PID": "4242",
        "ALLOCSCOPE_END": "oom_killed",
        "ALLOCSCOPE_EXIT_CODE": "",
        "ALLOCSCOPE_SIGNAL": "SIGKILL",
        "ALLOCSCOPE_OOM_CGROUP": "/box/job",
        "ALLOCSCOPE_RSS_BYTES": str(50 << 20),
    }


def test_the_watch_says_an_oom_kill_in_one_line():
    """The watch's line at an incarnation's end (tracer/watch/watcher.py oom_words): the report's
    words, sizes for people, the kernel's anon-rss where its mark gave it."""
    from tracer.watch.watcher import oom_words

    cgroup = {
        "scope": "cgroup",
        "cgroup": "/box/job",
        "limit_bytes": 2 << 30,
        "told_by": "mark_victim",
        "victim": VICTIM,
    }
    assert (
        oom_words(cgroup) == "OOM-killed by the memory cgroup /box/job (limit 2.0 GiB, anon-rss 47.0 MiB at the kill)"
    )
    told = {"scope": "global", "cgroup": None, "limit_bytes": None, "told_by": "cgroup_counters"}
    assert oom_words(told) == "OOM-killed (the whole machine was out of memory)"
    assert oom_words({"scope": None, "victim": {"pid": 1, "time": 0.5}}) == "OOM-killed"


def _v1(
    tmp_path, path: str, limit: int | None, failcnt: int = 0, max_usage: int = 0, under_oom: int = 0, kills: int = 0
):
    """A cgroup v1 memory directory: no memory.events, memory.oom_control and its neighbours."""
    d = tmp_path / "v1" / path.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom {under_oom}\noom_kill {kills}\n")
    (d / "memory.failcnt").write_text(f"{failcnt}\n")
    (d / "memory.max_usage_in_bytes").write_text(f"{max_usage}\n")
    (d / "memory.limit_in_bytes").write_text(f"{limit if limit else 9223372036854771712}\n")
    return d


def _v1_watch(tmp_path, job_limit: int | None, box_limit: int | None, **job) -> CgroupWatch:
    """The target's v1 cgroup /box/job under /box, read at the start (failcnt of /box/job as `job` says)."""
    from tracer.process.ending import read_limit

    groups = []
    for path, lim, kw in (("/box/job", job_limit, job), ("/box", box_limit, {})):
        d = _v1(tmp_path, path, lim, **kw)
        groups.append(Cgroup(path, read_limit(str(d)), read_events(str(d)), str(d)))
    return CgroupWatch(groups, 0)


MIB = 1 << 20


def test_v1_a_cgroup_at_its_limit_is_the_cgroups_oom(tmp_path):
    """cgroup v1 (no `oom` count): the cgroup's failcnt rose and its high-water mark reached its
    300 MiB limit: a marked victim's OOM kill is the cgroup's, with its path and limit (issue 50:
    redis in a v1 cgroup was told "the whole machine")."""
    w = _v1_watch(tmp_path, 300 * MIB, None, failcnt=3, max_usage=120 * MIB)
    assert read_events(w.cgroups[0].dir) == {
        "oom_kill_disable": 0,
        "under_oom": 0,
        "oom_kill": 0,
        "failcnt": 3,
        "max_usage": 120 * MIB,
        "oom": 3,
    }
    _v1(tmp_path, "/box/job", 300 * MIB, failcnt=82, max_usage=300 * MIB, kills=1)
    end = describe_end("target exited", SIGKILLED, w, 9.0, OomMark(VICTIM))
    assert end["reason"] == "oom_killed"
    assert {k: end["oom"][k] for k in ("scope", "cgroup", "limit_bytes")} == {
        "scope": "cgroup",
        "cgroup": "/box/job",
        "limit_bytes": 300 * MIB,
    }
    assert end_text(end) == "OOM-killed by the memory cgroup /box/job (limit 300.0 MiB)"
    # a memcg OOM under way says it alone (its failcnt read before the kill's charges)
    w = _v1_watch(tmp_path, 300 * MIB, None)
    _v1(tmp_path, "/box/job", 300 * MIB, under_oom=1)
    assert describe_end("target exited", SIGKILLED, w, 9.0, OomMark(VICTIM))["oom"]["scope"] == "cgroup"


def test_v1_the_parent_at_its_limit_is_named(tmp_path):
    """The limit is the parent's (/box, 1 GiB; the job has none): the OOM is /box's."""
    w = _v1_watch(tmp_path, None, 1 << 30)
    _v1(tmp_path, "/box/job", None, failcnt=0, max_usage=900 * MIB, kills=1)
    _v1(tmp_path, "/box", 1 << 30, failcnt=40, max_usage=1 << 30)
    oom = describe_end("target exited", SIGKILLED, w, 9.0, OomMark(VICTIM))["oom"]
    assert (oom["scope"], oom["cgroup"], oom["limit_bytes"]) == ("cgroup", "/box", 1 << 30), oom


def test_v1_a_global_oom_is_never_claimed_for_a_cgroup(tmp_path):
    """The whole machine ran out while the target's cgroup (300 MiB) was far from its limit: its
    failcnt did not rise since the start (it had once, long before: 5), no memcg OOM under way, its
    high-water mark below the limit: "global", no cgroup, no limit. A failcnt that rose while the
    high-water mark stayed below the limit (charges refused then reclaimed, never at it) is no
    cgroup OOM either."""
    w = _v1_watch(tmp_path, 300 * MIB, None, failcnt=5, max_usage=300 * MIB)
    _v1(tmp_path, "/box/job", 300 * MIB, failcnt=5, max_usage=300 * MIB, kills=1)
    end = describe_end("target exited", SIGKILLED, w, 9.0, OomMark(VICTIM))
    assert end["reason"] == "oom_killed"
    assert (end["oom"]["scope"], end["oom"]["cgroup"], end["oom"]["limit_bytes"]) == ("global", None, None)
    assert end_text(end) == "OOM-killed (the whole machine was out of memory)"
    doc = {"recording": {"end": end}, "totals": {}, "locations": []}
    assert "none of its memory cgroups had reached its limit" in end_finding(doc)["text"]
    w = _v1_watch(tmp_path, 300 * MIB, None, failcnt=0, max_usage=100 * MIB)
    _v1(tmp_path, "/box/job", 300 * MIB, failcnt=9, max_usage=200 * MIB, kills=1)
    assert describe_end("target exited", SIGKILLED, w, 9.0, OomMark(VICTIM))["oom"]["scope"] == "global"


def test_a_target_moved_to_another_cgroup_is_followed(tmp_path, monkeypatch):
    """Written into a limited cgroup's cgroup.procs after the recording started: followed there
    (CgroupWatch.follow), its counters from then on; the cgroups of the start kept their own."""
    import tracer.process.ending as ending

    w = _v1_watch(tmp_path, None, None)
    job = _v1(tmp_path, "/box/job", None)
    limited = _v1(tmp_path, "/box/tight", 48 * MIB, failcnt=2, max_usage=10 * MIB)
    box = tmp_path / "v1" / "box"
    monkeypatch.setattr(ending, "chain", lambda pid: [("/box/tight", str(limited)), ("/box", str(box))])
    monkeypatch.setattr(ending, "running", lambda pid: False)
    assert not w.follow(4242)  # exiting: the kernel moves it to the root; not followed (issue 50)
    monkeypatch.setattr(ending, "running", lambda pid: True)
    assert w.follow(4242) and [g.path for g in w.cgroups] == ["/box/tight", "/box"]
    assert not w.follow(4242)  # nothing changed since
    assert w.cgroups[0].events["failcnt"] == 2 and w.cgroups[0].limit == 48 * MIB
    _v1(tmp_path, "/box/tight", 48 * MIB, failcnt=30, max_usage=48 * MIB, kills=1)
    oom = describe_end("target exited", SIGKILLED, w, 9.0, OomMark(VICTIM))["oom"]
    assert (oom["scope"], oom["cgroup"], oom["limit_bytes"]) == ("cgroup", "/box/tight", 48 * MIB), oom
    assert job.exists()
