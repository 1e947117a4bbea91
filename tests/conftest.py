"""Shared fixtures. Two tiers:

* pure tests: synthetic traces, CLI runner; run anywhere;
* `bpf` tests: real probes on the C programs in tests/targets, as root. Without root/BPF they
  skip — except when CI=true, where a missing BPF capability fails the run. `root` tests (no
  BPF, but root) likewise.

Helpers live in support.py; the bpf(2) layer in tracer/bpf/objects.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# every report a test builds, in this process or a CLI subprocess, fails on a part larger than
# its whole (reports/analysis/invariants.py)
os.environ["ALLOCSCOPE_INVARIANTS"] = "fail"

from support import (
    CFLAGS_FP,
    IN_CI,
    TARGETS_SRC,
    Proc,
    Watch,
    bpf_problem,
    build,
    cli_bg,
    make_memory_cgroup,
    unavailable,
    warm_runtime,
)


def pytest_runtest_setup(item):
    if "root" in item.keywords and os.geteuid() != 0:
        unavailable("the test needs root and this is not root")
    if "bpf" not in item.keywords:
        return
    problem = bpf_problem()
    if problem is None:
        warm_runtime()  # complete stacks through libc & co from the first allocation (support.warm_targets)
        return
    if IN_CI:
        pytest.fail(f"CI=true but BPF is unavailable here: {problem}", pytrace=False)
    pytest.skip(f"needs root + BPF: {problem}")


@pytest.fixture(scope="session")
def targets(tmp_path_factory) -> dict[str, Path]:
    """Compile every tests/targets/*.c (frame pointers on) once per session."""
    out = tmp_path_factory.mktemp("targets")
    return {
        src.stem: build(out / src.stem, src, flags=[*CFLAGS_FP, "-Wall"]) for src in sorted(TARGETS_SRC.glob("*.c"))
    }


@pytest.fixture
def procs():
    started: list[Proc] = []

    def start(*argv) -> Proc:
        pr = Proc([str(a) for a in argv])
        started.append(pr)
        return pr

    yield start
    for pr in started:
        pr.kill()


@pytest.fixture
def watches():
    """start(*args): `allocscope watch ARGS` (support.Watch), killed after the test."""
    started: list[Watch] = []

    def start(*args) -> Watch:
        w = Watch(*args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()


@pytest.fixture
def tracers():
    started: list[subprocess.Popen] = []

    def start(*args) -> subprocess.Popen:
        p = cli_bg(*[str(a) for a in args])
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(30)


@pytest.fixture
def memory_cgroup():
    """make(name): a memory cgroup of 48 MiB made for the test (v2, else v1; skipped where none
    can be made, a failure under CI), removed after the test's processes: (its directory, the
    file to write a pid into)."""
    made: list[Path] = []

    def make(name: str) -> tuple[Path, Path]:
        try:
            cg, procs = make_memory_cgroup(f"{name}-{os.getpid()}", 48 << 20)
        except (OSError, StopIteration) as e:
            if IN_CI:
                pytest.fail(f"CI=true but no memory cgroup can be made: {e}")
            pytest.skip(f"no memory cgroup: {e}")
        made.append(cg)
        return cg, procs

    yield make
    for cg in made:
        for _ in range(50):  # its processes are being reaped
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
