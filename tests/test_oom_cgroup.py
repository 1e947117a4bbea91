"""Real OOM kills by a memory cgroup the test makes (cgroup v1 here, v2 where the box mounts it),
told by tracer/process/ending.py without BPF: several incarnations of a daemon in one cgroup, each
OOM-killed by its limit, each told "cgroup" with the limit, whatever the earlier incarnations left
in the cgroup's counters and however late the recorder's snapshot reads the victim.

Issue 50's soak (bench/results/2026-12-07-watch-soak-local.md): 2 of 9 such kills were told "the
whole machine": the snapshot after the kill read the exiting victim's /proc/PID/cgroup, which the
kernel had moved to the root ("memory:/"), and CgroupWatch.follow took it there."""

from __future__ import annotations

import signal
import subprocess
import time

from tracer.process.ending import CgroupWatch, OomMark, describe_end, running

LIMIT = 48 << 20  # the memory_cgroup fixture's


def _zombie(pid: int, timeout: float = 20.0) -> None:
    """Wait until `pid` (our child, not reaped) is a zombie."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise AssertionError(f"{pid} never ended")


def test_every_incarnation_oom_killed_by_its_cgroup_is_told_cgroup(memory_cgroup, targets):
    cg, procs_file = memory_cgroup("allocscope-oom-loop")
    exe = targets["restartd"]
    for n in range(3):  # three incarnations in one cgroup: the counters of the earlier ones stay
        d = subprocess.Popen(
            ["/bin/sh", "-c", f"echo $$ > {procs_file} && exec {exe} oom 2 5"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert d.stdout is not None and d.stdout.readline().startswith("grown "), n  # exec'd, in the cgroup
            watch = CgroupWatch.of(d.pid)  # the recording's start, as tracer/record/setup.py reads it
            assert watch.cgroups and watch.cgroups[0].path.endswith(f"/{cg.name}"), watch.cgroups
            assert watch.limit() == (watch.cgroups[0].path, LIMIT)
            _zombie(d.pid)  # OOM-killed, not reaped: the recorder's last snapshot may come now
            assert not running(d.pid)
            assert not watch.follow(d.pid), [g.path for g in watch.cgroups]  # the root is not followed
            status = d.wait(10)
        finally:
            if d.poll() is None:
                d.kill()
                d.wait(10)
        assert status == -signal.SIGKILL, (n, status)
        wait_status = signal.SIGKILL  # as waitpid() gives it: killed by SIGKILL, no core
        for mark in (OomMark({"pid": d.pid, "time": 1.0}), None):  # told by the kernel's mark, or by the counters
            end = describe_end("target exited", wait_status, watch, 2.0, mark)
            oom = end["oom"]
            assert end["reason"] == "oom_killed", (n, mark, end)
            assert (oom["scope"], oom["limit_bytes"]) == ("cgroup", LIMIT), (n, mark, oom)
            assert oom["cgroup"].endswith(f"/{cg.name}"), (n, oom)
