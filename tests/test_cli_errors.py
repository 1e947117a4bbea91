"""Every bad input: one line on stderr, a non-zero exit, no traceback, nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import cli, one_line_error, wait_for
from synth import SynthTrace


@pytest.fixture
def good_trace(tmp_path):
    t = SynthTrace(tmp_path / "good.allocscope")
    s = t.stack(["f", "main"])
    t.interval({(s, 1): (100, 1, 0, 0)})
    return t.close()


# --- report: traces that are missing, foreign, corrupt, future ------------------------------


def test_report_missing(tmp_path):
    one_line_error(cli("report", str(tmp_path / "nope")), "no such trace")


def test_report_plain_file(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("hello")
    one_line_error(cli("report", str(f)), "not an allocscope trace")


def test_report_empty_dir(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    one_line_error(cli("report", str(d)), "not an allocscope trace")


def test_report_corrupt_meta(good_trace):
    with open(os.path.join(good_trace, "meta.json"), "w") as f:
        f.write('{"format": "allocscope.tra')
    one_line_error(cli("report", good_trace), "corrupt")


def test_report_foreign_meta(good_trace):
    with open(os.path.join(good_trace, "meta.json"), "w") as f:
        json.dump({"format": "perf.data", "version": 1}, f)
    one_line_error(cli("report", good_trace), "not an allocscope trace")


def test_report_future_version(good_trace):
    meta = json.loads(Path(good_trace, "meta.json").read_text())
    meta["version"] = 99
    with open(os.path.join(good_trace, "meta.json"), "w") as f:
        json.dump(meta, f)
    one_line_error(cli("report", good_trace), "newer allocscope")


def test_report_truncated_part_is_skipped_with_warning(good_trace):
    part = os.path.join(good_trace, "parts", "sites-000001.parquet")
    data = Path(part).read_bytes()
    with open(part, "wb") as f:
        f.write(data[: len(data) // 2])
    p = cli("report", good_trace, "--format", "json")
    assert p.returncode == 5, p.stderr  # damaged: said, and exit 5 (issue 53)
    assert "damaged part parts/sites-000001.parquet: truncated" in p.stderr
    p = cli("report", good_trace, "--format", "json", "--allow-damaged")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert [d["part"] for d in rep["integrity"]["damaged"]] == ["sites-000001.parquet"]


def test_report_no_finished_interval(good_trace):
    for n in os.listdir(os.path.join(good_trace, "parts")):
        if n.startswith("intervals-"):
            os.unlink(os.path.join(good_trace, "parts", n))
    one_line_error(cli("report", good_trace), "no finished interval")


def test_report_complete_trace_without_its_parts(good_trace):
    """A finished trace copied without parts/ was said to have 'no finished interval (the
    recording stopped before its first snapshot)': its meta.json says complete."""
    shutil.rmtree(os.path.join(good_trace, "parts"))
    one_line_error(cli("report", good_trace), "cannot read its tables, parts/: No such file or directory", code=5)


def test_report_json_output_file(good_trace, tmp_path):
    out = tmp_path / "r.json"
    p = cli("report", good_trace, "--format", "json", "-o", str(out))
    assert p.returncode == 0 and p.stdout == ""
    assert json.loads(out.read_text())["sites"][0]["live_bytes"] == 100


def test_output_that_cannot_be_written_is_exit_6(good_trace):
    """A report to -o or to a stdout that cannot be written (a full disk: /dev/full) is one line
    and exit 6, output (README) — not exit 1, not an OSError traceback at the flush."""
    one_line_error(cli("report", good_trace, "-o", "/dev/full"), "cannot write /dev/full: No space left", code=6)
    with open("/dev/full", "w") as full:
        for args in (
            ["report", good_trace],
            ["report", good_trace, "--format", "pprof"],
            ["diff", good_trace, good_trace],
        ):
            p = subprocess.run(
                [sys.executable, "-m", "allocscope", *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120
            )
            one_line_error(p, "cannot write to stdout: No space left on device", code=6)


# --- record: argument errors (before anything is attached or written) ---------------------


def test_record_no_target(tmp_path):
    one_line_error(cli("record", "-o", str(tmp_path / "t")), "no target", code=2)


def test_record_two_targets(tmp_path):
    one_line_error(cli("record", "--pid", "1", "--pgrep", "x", "-o", str(tmp_path / "t")), "only one", code=2)


def test_record_no_output():
    one_line_error(cli("record", "--pid", "1"), "-o", code=2)


@pytest.mark.parametrize("label", ["pw", "=3", "a b=1"])
def test_record_bad_label(tmp_path, label):
    one_line_error(cli("record", "--pid", "1", "-o", str(tmp_path / "t"), "--label", label), "KEY=VALUE", code=2)


def test_record_label_given_twice(tmp_path):
    """--label pw=10 --label pw=12 kept the last without a word: the trace said pw=12."""
    p = cli("record", "--pid", "1", "-o", str(tmp_path / "t"), "--label", "pw=10", "--label", "pw=12")
    one_line_error(p, "--label pw given twice: pw=10 and pw=12", code=2)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--uprobe-sessions", "on"], "needs --sample-bytes"),
        (["--uprobe-sessions", "on", "--sample-bytes", "4096", "--mode", "residency"], "needs --sample-bytes"),
        (["--uprobe-sessions", "on", "--sample-bytes", "4096", "--uprobes", "perf"], "not with --uprobes perf"),
        # residency mode probes no heap call: a sampling rate for them was silently ignored
        (
            ["--mode", "residency", "--sample-bytes", "4096"],
            "--sample-bytes samples heap calls, which --mode residency",
        ),
    ],
)
def test_record_bad_uprobe_options(tmp_path, args, needle):
    one_line_error(cli("record", "-o", str(tmp_path / "t.allocscope"), *args, "--", "true"), needle)


def test_record_bad_interval(tmp_path):
    one_line_error(cli("record", "--pid", "1", "-o", str(tmp_path / "t"), "--interval", "0"), "interval", code=2)


def test_record_negative_duration(tmp_path):
    one_line_error(cli("record", "--pid", "1", "-o", str(tmp_path / "t"), "--duration", "-3"), "duration", code=2)


def test_record_not_root(tmp_path):
    if os.geteuid() != 0:
        p = cli("record", "--pid", "1", "-o", str(tmp_path / "t"))
    else:
        os.chmod(tmp_path, 0o777)
        p = cli("record", "--pid", "1", "-o", str(tmp_path / "t"), preexec_fn=lambda: os.setuid(65534))
    one_line_error(p, "root")
    assert not (tmp_path / "t").exists()


# --- record: target and output errors (need root to get that far) ---------------------------

root_only = pytest.mark.root  # to get past the root check


@root_only
def test_record_no_such_pid(tmp_path):
    one_line_error(cli("record", "--pid", "4999999", "-o", str(tmp_path / "t")), "no process with pid 4999999")
    assert not (tmp_path / "t").exists()


@root_only
def test_record_kernel_thread(tmp_path):
    one_line_error(cli("record", "--pid", "2", "-o", str(tmp_path / "t")), "kernel thread")


@root_only
def test_record_zombie(tmp_path):
    z = subprocess.Popen(["true"])
    # exited, not reaped: a zombie (under load `true` can take a while to even start)
    wait_for(
        lambda: Path(f"/proc/{z.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
        timeout=30,
        what="the child to become a zombie",
    )
    try:
        one_line_error(cli("record", "--pid", str(z.pid), "-o", str(tmp_path / "t")), "zombie")
    finally:
        z.wait()


@root_only
def test_record_pgrep_no_match(tmp_path):
    one_line_error(cli("record", "--pgrep", "no-such-process-xq7z", "-o", str(tmp_path / "t")), "matches no process")
    # the pattern as the shell took it, not Python's repr (which doubled every backslash)
    p = cli("record", "--pgrep", r"no-such \*:7399", "-o", str(tmp_path / "t"))
    one_line_error(p, r"--pgrep 'no-such \*:7399' matches no process", code=3)


@root_only
def test_record_pgrep_several(tmp_path):
    tag = f"allocscope-test-{os.getpid()}"
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag]) for _ in range(2)]
    time.sleep(0.2)
    try:
        err = one_line_error(cli("record", "--pgrep", tag, "-o", str(tmp_path / "t")), "matches 2 processes")
        for s in sleepers:
            assert str(s.pid) in err  # lists the candidates
    finally:
        for s in sleepers:
            s.kill()
            s.wait()


@root_only
def test_record_pgrep_never_matches_tracer(tmp_path):
    """The pattern is on our own command line; the tracer (and its parents) must not match."""
    one_line_error(
        cli("record", "--pgrep", "pattern-only-in-tracer-argv-9x", "-o", str(tmp_path / "t")), "matches no process"
    )


@root_only
def test_record_bad_regex(tmp_path):
    one_line_error(cli("record", "--pgrep", "a(b", "-o", str(tmp_path / "t")), "regular expression", code=2)


@root_only
def test_record_output_symlink(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    one_line_error(cli("record", "--pid", "1", "-o", str(tmp_path / "link")), "symlink")


@root_only
def test_record_output_existing_non_trace(tmp_path):
    f = tmp_path / "precious.txt"
    f.write_text("keep me")
    one_line_error(cli("record", "--pid", "1", "-o", str(f)), "not an allocscope trace")
    assert f.read_text() == "keep me"


@root_only
def test_record_output_dir_missing(tmp_path):
    one_line_error(cli("record", "--pid", "1", "-o", str(tmp_path / "no" / "t")), "does not exist")


@root_only
def test_record_command_not_found(tmp_path):
    one_line_error(cli("record", "-o", str(tmp_path / "t"), "--", "/no/such/binary"), "not found")


@root_only
def test_record_script_with_a_missing_interpreter(tmp_path):
    """A `#!` script is probed in its interpreter; one that does not exist is said as such, not
    as 'no malloc/free found in /no/such/interp (statically linked and stripped?)'."""
    script = tmp_path / "bad.sh"
    script.write_text("#!/no/such/interp\necho hi\n")
    script.chmod(0o755)
    for args in (["-o", str(tmp_path / "t")], ["--dry-run"]):
        p = cli("record", *args, "--", str(script))
        one_line_error(p, f"cannot run {script}: its interpreter /no/such/interp: No such file or directory", code=3)
    assert not (tmp_path / "t").exists()


@root_only
def test_record_tracefs_not_mounted(tmp_path):
    """In a private mount namespace without tracefs: one line naming the fix, nothing written."""
    out = tmp_path / "t"
    script = (
        "umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug 2>/dev/null; "
        f"exec {sys.executable} -m allocscope record -o {out} -- /bin/true"
    )
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    one_line_error(p, "tracefs", "mount -t tracefs")
    assert p.returncode == 4
    assert not out.exists()


# --- usage errors, every command: one line, exit 2, never click's usage block (issue 53) -------


@pytest.mark.parametrize(
    "args,needle",
    [
        (["record", "--duration", "abc", "--pid", "1", "-o", "t"], "Invalid value for '--duration': 'abc'"),
        (["record", "--bogus"], "No such option '--bogus'"),
        (["top", "--interval", "x", "--batch", "--pid", "1"], "Invalid value for '--interval': 'x'"),
        (["top", "--sort", "nope", "--pid", "1"], "Invalid value for '--sort': 'nope'"),
        (["doctor", "--pid", "abc"], "Invalid value for '--pid' / '-p': 'abc'"),
        (["demo", "--pw-a", "99"], "Invalid value for '--pw-a': 99"),
        (["report"], "Missing argument 'TRACE'"),
        (["nosuch"], "No such command 'nosuch'"),
        (["record", "--grace", "nan", "--", "true"], "Invalid value for '--grace': 'nan'"),
        (["record", "--grace", "-1", "--", "true"], "Invalid value for '--grace': '-1'"),
    ],
)
def test_click_usage_errors_are_one_line(args, needle):
    err = one_line_error(cli(*args), needle, code=2)
    assert "Usage:" not in err and "Try '" not in err
    command = args[0] if args[0] != "nosuch" else ""
    assert err.endswith(f"(see {' '.join(['allocscope', command]).strip()} --help)"), err


def test_no_command_shows_the_help():
    p = cli()
    assert "Usage:" in p.stdout + p.stderr and "Commands:" in p.stdout + p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--duration", "nan"], "--duration must be > 0 seconds"),
        (["--duration", "inf"], "--duration must be > 0 seconds"),
        (["--interval", "1e300"], "--interval must be > 0 seconds"),
        (["--max-live", "99999999999999"], "--max-live must be at most 268435456"),
        (["--sample-bytes", "99999999999999999999"], "--sample-bytes must be at most"),
        (["--wait-min", "nan"], "--wait-min must be a number of ms >= 0"),
    ],
)
def test_record_bad_numbers(tmp_path, args, needle):
    one_line_error(cli("record", "--pid", "1", "-o", str(tmp_path / "t"), *args), needle, code=2)
    assert not (tmp_path / "t").exists()


# --- not root: each command names itself (issue 53) ------------------------------------------


def as_nobody(*args: str) -> subprocess.CompletedProcess:
    """`allocscope ARGS` with root's uid and groups dropped (setpriv), as a user would run it."""
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-m", "allocscope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


@root_only
@pytest.mark.parametrize(
    "args",
    [
        ["record", "--pid", "1", "-o", "/tmp/allocscope-never-written"],
        ["top", "--batch", "--pid", "1"],
        ["watch", "--pid", "1", "-o", "/tmp/allocscope-never-written"],
        ["demo", "--out", "/tmp/allocscope-never-written"],
    ],
)
def test_not_root_names_the_command(args):
    one_line_error(as_nobody(*args), f"allocscope {args[0]} needs root", code=4)
    assert not os.path.exists("/tmp/allocscope-never-written")


@root_only
def test_doctor_pid_not_root_one_line():
    """A process of root's: its memory map is not readable by nobody (exit 4, permissions)."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for args in (["doctor", "--pid", str(sleeper.pid)], ["doctor", "--pid", str(sleeper.pid), "--warm"]):
            one_line_error(as_nobody(*args), f"memory map of pid {sleeper.pid} (sleep): permission denied", code=4)
    finally:
        sleeper.kill()
        sleeper.wait()


@root_only
def test_a_pid_whose_maps_cannot_be_read_is_one_line():
    """record/top/watch --pid of a process whose memory map the kernel refuses (root's process to
    nobody here; to root too, one of another user namespace such as a container's pid 1): the
    target is refused when it is resolved, exit 4 — not a PermissionError traceback from the
    first read of its maps."""
    sleeper = subprocess.Popen(["sleep", "60"])
    code = (
        "import sys; from common.errors import AllocscopeError\n"
        "from tracer.process.target import target_from_pid\n"
        "from tracer.watch.watcher import command_pattern\n"
        "for f in (target_from_pid, command_pattern):\n"
        "    try: f(int(sys.argv[1])); print('resolved')\n"
        "    except AllocscopeError as e: print(e.exit_code, e)\n"
    )
    try:
        p = subprocess.run(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                sys.executable,
                "-c",
                code,
                str(sleeper.pid),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    line = f"4 cannot read the memory map of pid {sleeper.pid} (sleep): permission denied (run allocscope as root)"
    assert p.stdout.splitlines() == [line, line], (p.stdout, p.stderr)


@root_only
def test_watch_pid_of_its_own_parent(tmp_path):
    """`watch --pid $$` names the shell the watch runs in: never matched (a parent of the tracer),
    it would watch nothing for ever; one line instead, exit 3, before anything is held."""
    p = cli("watch", "--pid", str(os.getpid()), "-o", str(tmp_path / "w"))
    one_line_error(p, f"pid {os.getpid()} (", "is a parent of this watch", code=3)


# --- paths that are no place for a trace (issue 53) ------------------------------------------


@root_only
def test_record_output_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for cmd in (["record"], ["top", "--batch"]):
        one_line_error(
            cli(*cmd, "--pid", "1", "-o", str(f / "sub")), f"cannot write {f / 'sub'}: Not a directory", code=6
        )
    assert f.read_text() == "x"


@root_only
def test_demo_out_unusable(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    one_line_error(cli("demo", "--out", "/proc/xyz"), "cannot write into --out /proc/xyz", code=6)
    one_line_error(cli("demo", "--out", str(f / "sub")), "Not a directory", code=6)
