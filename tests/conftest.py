"""Shared fixtures. Two tiers:

* pure tests: synthetic traces, CLI runner; run anywhere;
* `bpf` tests: real probes on the C programs in tests/targets, as root. Without root/BPF they
  skip — except when CI=true, where a missing BPF capability fails the run.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGETS_SRC = ROOT / "tests" / "targets"
CFLAGS_FP = ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-pthread"]
IN_CI = os.environ.get("CI", "").lower() == "true"


def _bpf_problem() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        return f"BCC not importable: {e}"
    if not os.path.exists("/sys/kernel/tracing/uprobe_events") and \
            not os.path.exists("/sys/kernel/debug/tracing/uprobe_events"):
        return "tracefs not mounted"
    return None


def pytest_runtest_setup(item):
    if "bpf" not in item.keywords:
        return
    problem = _bpf_problem()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true but BPF is unavailable here: {problem}", pytrace=False)
    pytest.skip(f"needs root + BPF: {problem}")


@pytest.fixture(scope="session")
def targets(tmp_path_factory) -> dict[str, Path]:
    """Compile every tests/targets/*.c (frame pointers on) once per session."""
    out = tmp_path_factory.mktemp("targets")
    built = {}
    for src in sorted(TARGETS_SRC.glob("*.c")):
        exe = out / src.stem
        subprocess.run(["gcc", *CFLAGS_FP, "-Wall", "-o", str(exe), str(src)], check=True)
        built[src.stem] = exe
    return built


def cli(*args: str, timeout: float = 120, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run `python -m allocscope ARGS` and capture text output."""
    p = subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=str(ROOT), **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"allocscope {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def cli_bg(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "allocscope", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def report_json(trace: Path | str) -> dict:
    p = cli("report", str(trace), "--format", "json", check=True)
    return json.loads(p.stdout)


def wait_for(pred, timeout: float = 30, what: str = "condition", step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def attached(trace: Path) -> bool:
    """meta.json exists once the probes are attached."""
    return (Path(trace) / "meta.json").exists()


class Proc:
    """A target process whose stdout lines can be awaited (a reader thread queues them: select()
    on a buffered pipe would miss lines already read ahead)."""

    def __init__(self, argv: list[str], **popen_kw) -> None:
        import queue
        import threading

        popen_kw.setdefault("stderr", subprocess.PIPE)
        self.p = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, text=True, **popen_kw)
        self.pid = self.p.pid
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)  # EOF

    def expect(self, prefix: str, timeout: float = 60) -> str:
        import queue

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(f"target did not print {prefix!r} (rc={self.p.poll()})")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


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


def record_run(procs, tracers, out, argv: list, done: str = "done", interval: str = "0.5",
               record_args: tuple = ()) -> None:
    """Start the target `argv` (it prints "ready" and waits for SIGUSR1), record it with --pid
    into `out` (and `record_args`), release it, wait for its `done` line, stop the tracer with
    SIGINT (exit 0)."""
    tgt = procs(*argv)
    tgt.expect("ready")
    tr = tracers("record", "--pid", tgt.pid, "-o", out, "--interval", interval, *record_args)
    wait_for(lambda: attached(out) or tr.poll() is not None, what="probes attached")
    assert tr.poll() is None, tr.stderr.read()
    tgt.signal(signal.SIGUSR1)
    tgt.expect(done)
    time.sleep(float(interval) + 0.1)
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()


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
