"""What the tests share (fixtures are in conftest.py, the bpf(2) layer in tracer/bpf/objects.py):

* paths and flags: ROOT, TARGETS_SRC, CFLAGS_FP, IN_CI (CI=true: what would be skipped fails);
* `build`: compile a C/C++/Rust target; `run_c_with_header`: a C main() against allocscope.h;
  `need_tool` / `need`: a tool or file a test needs, a skip here and a failure under CI=true
  (scripts/setup-host.sh installs every one of them);
* the CLI: `cli` (run and capture), `cli_bg` (started), `report_json`, `one_line_error`; both
  warm the unwind cache of the test's own targets first (`warm_targets`);
* processes: `Proc` (a target whose stdout lines are awaited through a reader thread),
  `wait_for`, `attached`, `record_run` (its parts: `record_attached`, `stop_tracer`);
* frames of a JSON report: `functions`.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS_SRC = ROOT / "tests" / "targets"
CFLAGS_FP = ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-pthread"]
IN_CI = os.environ.get("CI", "").lower() == "true"


# --------------------------------------------------------------------------- what a test needs


def unavailable(what: str) -> NoReturn:
    """Skip the test for want of `what` (a tool, a file, a capability); under CI=true fail it:
    CI's set-up installs everything, so a skip there would hide a test that never ran."""
    if IN_CI:
        pytest.fail(f"CI=true but {what} (scripts/setup-host.sh provides it)", pytrace=False)
    pytest.skip(what)


def find_tool(name: str, *elsewhere: str) -> str | None:
    """Path of the program `name`: on PATH, else the first of `elsewhere` that is executable."""
    for cand in (shutil.which(name), *(os.path.expanduser(p) for p in elsewhere)):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def need_tool(name: str, *elsewhere: str) -> str:
    """find_tool, or the test is `unavailable`."""
    path = find_tool(name, *elsewhere)
    if path is None:
        unavailable(f"{name} is not installed")
    return path


def need(paths: Sequence[str], what: str) -> str:
    """The first of `paths` that exists."""
    for p in paths:
        if os.path.exists(p):
            return p
    unavailable(f"{what} is not installed")


RUSTC_ELSEWHERE = ("~/.cargo/bin/rustc", "/usr/local/cargo/bin/rustc", "/root/.cargo/bin/rustc")


def build(
    exe: Path | str,
    *inputs: Path | str,
    flags: Sequence[str] = CFLAGS_FP,
    cc: str = "gcc",
    cwd: Path | str | None = None,
) -> Path:
    """Compile `inputs` (sources, then libraries and linker flags) into `exe`: `cc FLAGS -o EXE
    INPUTS`. Frame pointers and -g by default; raises when the compiler fails."""
    subprocess.run([cc, *flags, "-o", str(exe), *map(str, inputs)], check=True, cwd=cwd)
    return Path(exe)


def run_c_with_header(tmp: Path, body: Sequence[str]) -> str:
    """Compile and run, in `tmp`, a C main() of `body` lines that sees probes/allocscope.h as BPF
    does (sizeof / offsetof checks of the layouts the tracer shares with the kernel); its stdout."""
    from tracer.base.layout import PROBES_DIR

    head = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>", '#include "allocscope.h"']
    src = tmp / "sz.c"
    src.write_text("\n".join([*head, "int main(void){", *body, "return 0;}"]))
    exe = build(tmp / "sz", src, flags=[f"-I{PROBES_DIR}"])
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless chromium `exe` (need_tool("chromium")) with a private profile under `tmp`, a
    1400x2000 window and `args` (--dump-dom URL, --screenshot=PNG URL...)."""
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={tmp / 'profile'}",
            "--window-size=1400,2000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def bpf_problem() -> str | None:
    """Why BPF tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root"
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        return f"BCC not importable: {e}"
    if not os.path.exists("/sys/kernel/tracing/uprobe_events") and not os.path.exists(
        "/sys/kernel/debug/tracing/uprobe_events"
    ):
        return "tracefs not mounted"
    return None


# --------------------------------------------------------------------------- the CLI


def warm_targets(args: Sequence[str]) -> None:
    """`record`/`top` --pid/--pgrep of a process this test started: its unwind tables built into
    the cache first, as `allocscope doctor --pid PID --warm` would (a file read a module once
    cached). `record --pid` builds a table only once stacks cross its module, cutting those
    stacks short meanwhile (docs/startup.md); the tests that check frames expect complete stacks
    from the first allocation. test_unwind_bpf.py::test_lazy_tables_cold_cache records cold."""
    if not args or args[0] not in ("record", "top"):
        return
    pids = []
    for i, a in enumerate(args[:-1]):
        if a in ("--pid", "-p") and args[i + 1].isdigit():
            pids.append(int(args[i + 1]))
        elif a == "--pgrep":
            try:
                pids += [pid for pid, cmd in _children() if re.search(args[i + 1], cmd)]
            except re.error:
                pass  # the CLI's error to give
    from tracer.unwind.unwinder import warm_process

    for pid in pids:
        if pid in dict(_children()):
            try:
                warm_process(pid, lambda _m: None)
            except OSError:
                pass  # gone already: the recording will say so


RUNTIME_LIBS = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2")
_warmed_runtime = False


def warm_runtime() -> None:
    """The unwind tables of the C/C++ runtime libraries every target maps, once a session (see
    warm_targets; for the tests that start the tracer some other way)."""
    global _warmed_runtime
    if _warmed_runtime:
        return
    _warmed_runtime = True
    from tracer.unwind.unwinder import warm

    paths = {
        os.path.realpath(p)
        for name in RUNTIME_LIBS
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")
        if os.path.exists(p := os.path.join(d, name))
    }
    warm(sorted(paths))


def _children() -> list[tuple[int, str]]:
    """(pid, command line) of the processes this one started."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.append((int(d), Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return out


def cli(*args: str, timeout: float = 120, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run `python -m allocscope ARGS` and capture text output."""
    warm_targets(args)
    p = subprocess.run(
        [sys.executable, "-m", "allocscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
        **kw,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"allocscope {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def cli_bg(*args: str) -> subprocess.Popen:
    warm_targets(args)
    return subprocess.Popen(
        [sys.executable, "-m", "allocscope", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
    )


def report_json(trace: Path | str) -> dict:
    p = cli("report", str(trace), "--format", "json", check=True)
    return json.loads(p.stdout)


def report_json_text(trace: Path | str) -> tuple[dict, str]:
    """report_json(trace), and the text `allocscope report TRACE` prints: to_text of that same
    document, which is what the CLI renders (allocscope/cli/report.py; identical on a rustd trace).
    One CLI run, one symbolization of the trace's modules, instead of two."""
    from reports.render.text import to_text

    rep = report_json(trace)
    return rep, to_text(rep) + "\n"


def one_line_error(result, *needles: str, code: int | None = None) -> str:
    """The CLI failed the way every user error should: non-zero exit (`code` if given), one line
    `allocscope: ...` on stderr holding every needle, no traceback. `result`
    is a CompletedProcess or a click test runner Result. Returns the line."""
    rc = result.returncode if hasattr(result, "returncode") else result.exit_code
    out = result.stdout or ""
    assert rc != 0, (out, result.stderr)
    if code is not None:
        assert rc == code, (rc, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in out, result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("allocscope: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def functions(frames: list[dict]) -> list[str]:
    """Function names of a report's frames, innermost first."""
    return [f["function"] for f in frames]


# --------------------------------------------------------------------------- processes


def fd_links(pid: int) -> dict[int, str]:
    """What each open descriptor of `pid` points at (/proc/PID/fd; one closed meanwhile is left out)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return out


def wait_for(pred, timeout: float = 30, what: str = "condition", step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def attached(trace: Path | str) -> bool:
    """meta.json exists once the probes are attached."""
    return (Path(trace) / "meta.json").exists()


class Proc:
    """A target process whose stdout lines can be awaited (a reader thread queues them: select()
    on a buffered pipe would miss lines already read ahead)."""

    def __init__(self, argv: list, read: str = "stdout", **popen_kw) -> None:
        """`read`: the stream whose lines expect() waits for (stdout, or stderr: `allocscope watch`)."""
        popen_kw.setdefault("stderr", subprocess.PIPE)
        popen_kw.setdefault("stdout", subprocess.PIPE)
        self.p = subprocess.Popen([str(a) for a in argv], text=True, **popen_kw)
        self.pid = self.p.pid
        self.lines: queue.Queue = queue.Queue()
        self.said: list[str] = []  # every line read so far
        threading.Thread(target=self._pump, args=(getattr(self.p, read),), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.said.append(line)
            self.lines.put(line)
        self.lines.put(None)  # EOF

    def expect(self, prefix: str, timeout: float = 60, anywhere: bool = False) -> str:
        """The next line that starts with `prefix` (`anywhere`: holds it), skipping the others."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith(prefix) or (anywhere and prefix in line):
                return line
        raise AssertionError(self.missed(prefix))

    def missed(self, what: str) -> str:
        return f"target did not print {what!r} (rc={self.p.poll()})"

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


def record_run(
    procs, tracers, out, argv: list, done: str = "done", interval: str = "0.5", record_args: tuple = ()
) -> subprocess.Popen:
    """Start the target `argv` (it prints "ready" and waits for SIGUSR1), record it with --pid
    into `out` (and `record_args`), release it, wait for its `done` line, stop the tracer with
    SIGINT (exit 0). Returns the tracer (its output unread)."""
    tgt = procs(*argv)
    tgt.expect("ready")
    tr = record_attached(tracers, tgt.pid, out, "--interval", interval, *record_args)
    tgt.signal(signal.SIGUSR1)
    tgt.expect(done)
    stop_tracer(tr, float(interval) + 0.1)
    return tr


def record_attached(tracers, pid: int, out, *args) -> subprocess.Popen:
    """`record --pid PID -o OUT ARGS` started by the `tracers` fixture: the tracer, once its probes
    are attached (it must not have exited)."""
    tr = tracers("record", "--pid", pid, "-o", out, *args)
    wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
    assert tr.poll() is None, tr.stderr.read()
    return tr


def stop_tracer(tr: subprocess.Popen, after: float) -> None:
    """Give the tracer `after` seconds more (its last interval), then SIGINT: it must exit 0."""
    time.sleep(after)
    tr.send_signal(signal.SIGINT)
    assert tr.wait(60) == 0, tr.stderr.read()


def make_memory_cgroup(name: str, limit: int) -> tuple[Path, Path]:
    """A memory cgroup with `limit` bytes (cgroup v2 when its memory controller is there, else
    v1). Returns (directory, the file to write a pid into)."""
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else False:
        sub = v2 / "cgroup.subtree_control"
        if "memory" not in sub.read_text().split():
            sub.write_text("+memory")
        d = v2 / name
        d.mkdir()
        (d / "memory.max").write_text(str(limit))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        return d, d / "cgroup.procs"
    v1 = Path("/sys/fs/cgroup/memory")
    if not (v1 / "memory.limit_in_bytes").exists():
        raise FileNotFoundError("no memory cgroup controller (v1 or v2)")
    own = next(
        (
            ln.split(":", 2)[2]
            for ln in Path("/proc/self/cgroup").read_text().splitlines()
            if ln.split(":")[1] == "memory"
        ),
        "/",
    )
    d = v1 / own.lstrip("/") / name
    d.mkdir()
    (d / "memory.limit_in_bytes").write_text(str(limit))
    return d, d / "cgroup.procs"


class Watch(Proc):
    """`allocscope watch ARGS` with its stderr lines awaited in order (anywhere in a line)."""

    def __init__(self, *args) -> None:
        cmd = [sys.executable, "-X", "faulthandler", "-m", "allocscope", "watch", *map(str, args)]
        # its debug lines (each hold and release, and why) say what happened when a test fails
        env = dict(os.environ, ALLOCSCOPE_WATCH_DEBUG="1")
        super().__init__(cmd, read="stderr", cwd=str(ROOT), env=env)

    @property
    def all(self) -> list[str]:
        return self.said

    def expect(self, needle: str, timeout: float = 60, anywhere: bool = True) -> str:
        return super().expect(needle, timeout, anywhere)

    def missed(self, what: str) -> str:
        if self.p.poll() is None:  # where it is: every thread's stack (faulthandler), then the lines
            self.p.send_signal(signal.SIGABRT)
            self.p.wait(10)
            time.sleep(0.3)
        return f"watch did not say {what!r}; it said:\n{''.join(self.said)}"

    def stop(self) -> int:
        self.p.send_signal(signal.SIGINT)
        rc = self.p.wait(60)
        time.sleep(0.1)
        return rc
