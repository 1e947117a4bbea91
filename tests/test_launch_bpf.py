"""Launch mode (`record -- CMD`) is a clean wrapper (issue 53): the program's stdout is its own,
byte for byte; allocscope's lines are on stderr only; allocscope exits with the program's status;
a program still running when the recording stops gets SIGTERM — its process group, when
allocscope is not the foreground job of a terminal (these tests run it in a new session: no
terminal) — and SIGKILL only after --grace, said on stderr; no child of it is left behind."""

from __future__ import annotations

import gzip
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT, attached, build, report_json, wait_for

pytestmark = pytest.mark.bpf

ALLOCSCOPE = [sys.executable, "-m", "allocscope"]


def run(*args: str, stdout=subprocess.PIPE, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """`allocscope ARGS` in a session of its own (no controlling terminal, like a CI job or a unit)."""
    return subprocess.run(
        [*ALLOCSCOPE, *args],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=stdout is subprocess.PIPE,
        timeout=timeout,
        cwd=str(ROOT),
        start_new_session=True,
    )


def ours(stderr: str | bytes) -> list[str]:
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    return text.splitlines()


def gone(pid: int) -> bool:
    """No process `pid`, or only a zombie on its way to being reaped by init."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def test_stdout_is_the_programs_byte_for_byte(tmp_path):
    """`record -q -o T -- gzip -c FILE > OUT`: OUT is gzip's own output, nothing of ours in it."""
    src = tmp_path / "services"
    src.write_bytes(Path("/etc/services").read_bytes() * 4)
    out = tmp_path / "s.gz"
    trace = tmp_path / "g.allocscope"
    with open(out, "wb") as f:
        p = run("record", "-q", "-o", str(trace), "--", "gzip", "-c", str(src), stdout=f)
    assert p.returncode == 0, p.stderr
    own = subprocess.run(["gzip", "-c", str(src)], capture_output=True, check=True).stdout
    assert out.read_bytes() == own
    assert gzip.decompress(out.read_bytes()) == src.read_bytes()
    [line] = ours(p.stderr)  # -q: the summary, on stderr, and nothing else
    assert line.startswith(f"allocscope: wrote {trace}: ") and "(target exited with code 0)" in line, line
    assert (trace / "meta.json").exists()


def test_exit_status_is_the_programs(tmp_path):
    p = run("record", "-o", str(tmp_path / "e.allocscope"), "--", "sh", "-c", "exit 7")
    assert p.returncode == 7, p.stderr
    assert p.stdout == ""
    assert all(line.startswith("allocscope: ") for line in ours(p.stderr)), p.stderr
    assert "(target exited with code 7)" in ours(p.stderr)[-1], p.stderr


def test_sigpipe_ends_the_program_as_in_a_shell(tmp_path):
    """`record -- yes | head -2`: yes gets SIGPIPE's default action back (Python ignores it) and
    dies of it, and allocscope exits 128+13 as a shell reports it."""
    tr = subprocess.Popen(
        [*ALLOCSCOPE, "record", "-q", "-o", str(tmp_path / "y.allocscope"), "--", "yes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=str(ROOT),
        start_new_session=True,
    )
    assert tr.stdout is not None and tr.stderr is not None
    assert [tr.stdout.readline(), tr.stdout.readline()] == [b"y\n", b"y\n"]
    tr.stdout.close()  # like head -2
    assert tr.wait(120) == 128 + signal.SIGPIPE, tr.stderr.read()
    assert "(target killed by SIGPIPE)" in tr.stderr.read().decode()


EXECS = """#!/bin/sh
echo before
exec /bin/sh "$(dirname "$0")/after.sh"
"""
# the program it becomes: untraced soon after the exec (TracerPid 0: allocscope let it go), then ends
AFTER = """sleep 1.2
i=0
while [ $i -lt 100 ]; do
    t=$(awk '/TracerPid/ {print $2}' /proc/$$/status)
    [ "$t" = 0 ] && break
    sleep 0.05; i=$((i+1))
done
echo "tracer $t"
echo after
exit 5
"""


def test_a_script_that_execs_runs_to_its_end(tmp_path):
    """`record -- ./script` of a `#!/bin/sh` script (the kernel runs its interpreter: probed is
    dash's allocator, not the script file's) that execs another program: the trace ends at the
    exec, but the program is neither killed nor left: allocscope waits for it, its stdout is
    whole and allocscope exits with its status."""
    script = tmp_path / "execs.sh"
    script.write_text(EXECS)
    script.chmod(0o755)
    (tmp_path / "after.sh").write_text(AFTER)
    trace = tmp_path / "x.allocscope"
    p = run("record", "-o", str(trace), "--", str(script))
    assert p.returncode == 5, p.stderr
    assert p.stdout == "before\ntracer 0\nafter\n"  # whole, and the program it became no longer ptraced
    lines = ours(p.stderr)
    assert all(line.startswith("allocscope: ") for line in lines), lines
    assert "(the target exec'd another program)" in lines[-2], lines
    assert lines[-1].startswith("allocscope: execs.sh (pid ") and lines[-1].endswith(
        f"exec'd {os.path.realpath('/bin/sh')}: the trace ends at the exec; "
        "waiting for the program to end (allocscope exits with its status)"
    ), lines
    assert not any("SIGTERM" in line or "SIGKILL" in line for line in lines), lines
    rep = report_json(trace)
    assert rep["target"]["exe"] == os.path.realpath("/bin/sh"), rep["target"]
    assert rep["recording"]["end"]["reason"] == "exec", rep["recording"]["end"]
    assert rep["totals"]["heap_live_bytes"] > 0  # dash's own mallocs before the exec


KEEPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void *volatile kept[7];
__attribute__((noinline)) void keep_block(int i) { kept[i] = malloc(3000); memset(kept[i], 1, 3000); }
int main(int argc, char **argv) {
    for (int i = 0; i < 7; i++)
        keep_block(i);
    for (int i = 0; i < argc; i++)
        printf("%s\n", argv[i]);
    const char *path = getenv("PATH");
    printf("PATH %.*s\n", (int)strcspn(path, ":"), path);
    return 0;
}
"""
# pyenv's shim, as `pyenv rehash` writes it (@ROOT@ stands for PYENV_ROOT)
SHIM = """#!/usr/bin/env bash
set -e
[ -n "$PYENV_DEBUG" ] && set -x

program="${0##*/}"

export PYENV_ROOT="@ROOT@"
exec "@ROOT@/libexec/pyenv" exec "$program" "$@"
"""
# a stand-in for pyenv itself: `which NAME` and `exec NAME ARGS` of its one version, 9.9
PYENV = """#!/bin/sh
case "$1" in
which) echo "$PYENV_ROOT/versions/9.9/bin/$2" ;;
exec) shift; p=$1; shift; PATH="$PYENV_ROOT/versions/9.9/bin:$PATH" exec "$PYENV_ROOT/versions/9.9/bin/$p" "$@" ;;
esac
"""


def test_wrappers_that_only_exec_are_followed_to_the_program(tmp_path):
    """`record -- ./script` of a `#!/usr/bin/env -S keeper --flag` script, and `record -- keeper`
    where keeper is a pyenv shim (pyenv itself a stand-in: its shim's text is pyenv's): the
    program they would exec is launched as they would run it (env: the name from PATH, its
    arguments then the script's path; pyenv: `pyenv which`, its folder first in PATH), traced
    from its first instruction: its 7 blocks of keep_block, and its own exit, not an exec."""
    src = tmp_path / "keeper.c"
    src.write_text(KEEPER)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    keeper = build(bindir / "keeper", src)
    script = tmp_path / "wrapped.sh"
    script.write_text("#!/usr/bin/env -S keeper --flag\n")
    script.chmod(0o755)
    pyroot = tmp_path / "pyroot"
    for d in ("libexec", "shims", "versions/9.9/bin"):
        (pyroot / d).mkdir(parents=True)
    (pyroot / "libexec/pyenv").write_text(PYENV)
    (pyroot / "shims/keeper").write_text(SHIM.replace("@ROOT@", str(pyroot)))
    (pyroot / "versions/9.9/bin/keeper").write_bytes(keeper.read_bytes())
    for f in ("libexec/pyenv", "shims/keeper", "versions/9.9/bin/keeper"):
        (pyroot / f).chmod(0o755)
    real = str(pyroot / "versions/9.9/bin/keeper")
    cases = [
        ("env", bindir, [str(script), "x"], str(keeper), ["keeper", "--flag", str(script), "x"], str(bindir),
         f"{script} runs keeper through env: recording {keeper}"),
        ("pyenv", pyroot / "shims", ["keeper", "y"], real, [real, "y"], str(pyroot / "versions/9.9/bin"),
         f"keeper is a pyenv shim: recording {real}"),
    ]  # fmt: skip
    for name, first, argv, exe, printed, path0, said in cases:
        env = {**os.environ, "PATH": f"{first}:{os.environ['PATH']}"}
        trace = tmp_path / f"{name}.allocscope"
        p = run("record", "-o", str(trace), "--", *argv, env=env)
        assert p.returncode == 0, (name, p.stderr)
        assert p.stdout.splitlines() == [*printed, f"PATH {path0}"], (name, p.stdout)
        assert ours(p.stderr)[0] == f"allocscope: {said}, from its first instruction", (name, p.stderr)
        rep = report_json(trace)
        assert rep["target"]["exe"] == exe, (name, rep["target"])
        assert rep["recording"]["end"]["reason"] != "exec", (name, rep["recording"]["end"])
        [loc] = [x for x in rep["locations"] if x["function"] == "keep_block"]
        assert (loc["live_bytes"], loc["live_count"]) == (7 * 3000, 7), (name, loc)


TRAPPED = """
trap 'echo trapped > "$1/trapped"; exit 3' TERM
sleep 300 & echo $! > "$1/sleep.pid"
wait
"""


def test_duration_sigterms_the_program_and_its_children(tmp_path):
    """--duration: the trace is finished, then SIGTERM to the program's process group: its TERM
    trap runs (exit 3, allocscope's status), its `sleep` child ends too; no SIGKILL."""
    script = tmp_path / "trapped.sh"
    script.write_text(TRAPPED)
    trace = tmp_path / "d.allocscope"
    p = run("record", "-o", str(trace), "--duration", "1", "--", "sh", str(script), str(tmp_path))
    assert p.returncode == 3, p.stderr
    assert (tmp_path / "trapped").read_text() == "trapped\n"
    sleeper = int((tmp_path / "sleep.pid").read_text())
    wait_for(lambda: gone(sleeper), timeout=5, what="the program's sleep child to end")
    lines = ours(p.stderr)
    assert lines[-2].startswith(f"allocscope: wrote {trace}: ") and "(duration)" in lines[-2], lines
    assert lines[-1].startswith("allocscope: recording stopped (--duration): SIGTERM to sh (pid "), lines
    assert lines[-1].endswith("and its process group; SIGKILL in 5 s if still running"), lines
    assert not any("SIGKILL to" in line for line in lines), lines
    meta = (trace / "meta.json").read_text()
    assert '"complete": true' in meta and '"reason": "stopped"' in meta


IGNORES_TERM = """
trap '' TERM
sleep 300 & echo $! > "$1/sleep.pid"
wait
"""


def test_sigint_then_sigkill_after_the_grace_period(tmp_path):
    """SIGINT to allocscope: a program that ignores SIGTERM (and its child, which inherits that)
    gets SIGKILL --grace seconds later, to its process group, said on stderr; exit 137."""
    script = tmp_path / "ignores.sh"
    script.write_text(IGNORES_TERM)
    trace = tmp_path / "k.allocscope"
    tr = subprocess.Popen(
        [*ALLOCSCOPE, "record", "-o", str(trace), "--grace", "0.5", "--", "sh", str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: attached(trace) and (tmp_path / "sleep.pid").exists() or tr.poll() is not None,
            timeout=120,
            what="the recording",
        )
        tr.send_signal(signal.SIGINT)
        out, err = tr.communicate(timeout=60)
    finally:
        if tr.poll() is None:
            tr.kill()
    assert tr.returncode == 128 + 9, err
    assert out == ""
    lines = ours(err)
    assert "(SIGINT)" in lines[-3], lines
    assert lines[-2].startswith("allocscope: recording stopped (SIGINT): SIGTERM to sh (pid "), lines
    assert lines[-1].startswith("allocscope: sh (pid ") and lines[-1].endswith(
        "still running (0.5 s after SIGTERM): SIGKILL to its process group"
    ), lines
    sleeper = int((tmp_path / "sleep.pid").read_text())
    wait_for(lambda: gone(sleeper), timeout=5, what="the program's sleep child to be killed")
    assert os.path.exists(trace / "meta.json")


def test_at_a_terminal_the_program_shares_our_group_and_its_children_get_the_sigterm(tmp_path):
    """allocscope in the foreground of a terminal (a pty, as a shell starts it): the program stays
    in allocscope's process group (it could read the terminal; Ctrl-C would reach it); at
    --duration the SIGTERM goes to it and its children, never to allocscope: the trap runs, the
    sleep child ends, allocscope exits 3."""
    script = tmp_path / "trapped.sh"
    script.write_text(TRAPPED)
    trace = tmp_path / "t.allocscope"
    argv = [*ALLOCSCOPE, "record", "-o", str(trace), "--duration", "1", "--", "sh", str(script), str(tmp_path)]
    pid, fd = pty.fork()  # the child: a session leader, the pty its controlling terminal, in the foreground
    if pid == 0:
        try:
            os.chdir(ROOT)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    seen = b""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if not select.select([fd], [], [], 1)[0]:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's last process has closed it
            break
        if not data:
            break
        seen += data
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 3, text
    assert (tmp_path / "trapped").read_text() == "trapped\n"
    sleeper = int((tmp_path / "sleep.pid").read_text())
    wait_for(lambda: gone(sleeper), timeout=5, what="the program's sleep child to end")
    assert "SIGTERM to sh (pid " in text and ") and its children; SIGKILL in 5 s" in text, text
    assert "process group" not in text and "SIGKILL to" not in text, text


def test_top_batch_launch_follows_the_same_rules(tmp_path):
    """`top --batch -- CMD`: the blocks on stdout, our lines on stderr; --iterations stops the
    recording, the program gets SIGTERM (its TERM trap runs, its child ends) and allocscope exits
    with its status."""
    script = tmp_path / "trapped.sh"
    script.write_text(TRAPPED)
    p = run("top", "--batch", "--iterations", "1", "--interval", "0.5", "--", "sh", str(script), str(tmp_path))
    assert p.returncode == 3, p.stderr
    assert p.stdout.startswith("== ") and p.stdout.endswith("-- ended: 1 iteration\n"), p.stdout
    assert (tmp_path / "trapped").read_text() == "trapped\n"
    sleeper = int((tmp_path / "sleep.pid").read_text())
    wait_for(lambda: gone(sleeper), timeout=5, what="the program's sleep child to end")
    lines = ours(p.stderr)
    assert all(line.startswith("allocscope: ") for line in lines), lines
    assert lines[-1].startswith("allocscope: recording stopped (1 iteration): SIGTERM to sh (pid "), lines
    # a program that exec'd another one ends the view there, and --iterations still bounds the run:
    # stopped at once (not waited for, as record waits), its status allocscope's (143: SIGTERM)
    t0 = time.monotonic()
    p = run("top", "--batch", "--iterations", "3", "--interval", "0.5", "--", "sh", "-c", "exec sleep 60")
    assert p.returncode == 143 and time.monotonic() - t0 < 20, p.stderr
    lines = ours(p.stderr)
    assert lines[-1].startswith("allocscope: recording stopped (--iterations): SIGTERM to sh (pid "), lines
    assert lines[-2].endswith(f"exec'd {os.path.realpath(shutil.which('sleep'))}: the trace ends at the exec"), lines
