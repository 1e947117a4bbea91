"""`allocscope top` and `record`'s status line on real probes: the full screen driven in a real
terminal (tmux: send-keys, capture-pane), `--batch` blocks read from a pipe, the status line on
a pseudo-terminal and not on a pipe. Target: tests/targets/grower.c (a known growing site in a
thread named "grower")."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shlex
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from support import ROOT, attached, need_tool, report_json, wait_for

from reports.units import human_bytes, human_delta

pytestmark = pytest.mark.bpf
GROW, CONFIG, BURST = 3333, 2000, 1 << 20  # grower.c's sizes
AUTO_TICKS = 40
ALLOCSCOPE = [sys.executable, "-m", "allocscope"]
GROW_LINE = next(
    i for i, ln in enumerate((ROOT / "tests/targets/grower.c").read_text().splitlines(), 1) if "void grow_tick(" in ln
)


def by_function(rep: dict) -> dict[str, dict]:
    return {s["frames"][0]["function"]: s for s in rep["sites"] if s["frames"]}


# --- the full screen, in tmux ---------------------------------------------------------------------


class Tmux:
    """One tmux server of our own (its socket in the test's directory) with one window of a
    fixed size."""

    def __init__(self, tmp: Path) -> None:
        self.tool = need_tool("tmux")
        self.socket = str(tmp / "tmux.sock")
        self.rc = tmp / "rc"

    def run(self, *args: str) -> str:
        return subprocess.run([self.tool, "-S", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def start(self, argv: list[str], width: int = 160, height: int = 40) -> None:
        cmd = f"cd {shlex.quote(str(ROOT))} && LANG=C.UTF-8 {shlex.join(argv)}; echo $? > {self.rc}; sleep 600"
        self.run("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), cmd)

    def screen(self) -> list[str]:
        return self.run("capture-pane", "-p", "-t", "top").splitlines()

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "top", *keys)

    def wait_screen(self, pred, what: str, timeout: float = 30) -> list[str]:
        """The screen once `pred` holds on it and it is whole: the same on two captures in a row.
        curses sends a frame's changes top-down, and a capture taken while they are still
        arriving (a loaded box) has the new sort label above the previous frame's rows."""
        last: list[str] = []
        before: list[str] | None = None

        def check():
            nonlocal last, before
            last = self.screen()
            whole, before = last == before, last
            return whole and pred(last)

        try:
            wait_for(check, timeout=timeout, what=what, step=0.2)
        except AssertionError:
            raise AssertionError(f"{what}; the screen:\n" + "\n".join(last)) from None
        return last

    def exit_code(self, timeout: float = 60) -> int:
        wait_for(lambda: self.rc.exists() and self.rc.read_text().strip(), timeout=timeout, what="top to exit")
        return int(self.rc.read_text())

    def close(self) -> None:
        subprocess.run([self.tool, "-S", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux(tmp_path):
    t = Tmux(tmp_path)
    yield t
    t.close()


def site_rows(screen: list[str]) -> list[str]:
    """The rows of the sites table: the lines after the column header that start with a rank."""
    for i, line in enumerate(screen):
        if line.lstrip().startswith("#") and "LIVE" in line:
            return [r for r in screen[i + 1 :] if re.match(r"\s*\d+\s", r)]
    return []


def sort_label(screen: list[str]) -> str | None:
    m = next((re.search(r"sort: (\w+)", ln) for ln in screen if "sort: " in ln), None)
    return m.group(1) if m else None


def first_row(screen: list[str]) -> str:
    rows = site_rows(screen)
    return rows[0] if rows else ""


def test_top_screen_ranks_sorts_and_quits(targets, procs, tmp_path, tmux):
    tgt = procs(targets["grower"], "--auto", str(AUTO_TICKS))
    tgt.expect("ready")
    out = tmp_path / "top.allocscope"
    tmux.start([*ALLOCSCOPE, "top", "--pid", str(tgt.pid), "--interval", "0.5", "-o", str(out)])
    wait_for(lambda: attached(out) or tmux.rc.exists(), timeout=120, what="probes attached")
    assert not tmux.rc.exists(), tmux.screen()
    tgt.signal(signal.SIGUSR1)
    tgt.expect("done", timeout=60)
    grown = human_bytes(AUTO_TICKS * GROW)
    screen = tmux.wait_screen(lambda s: grown in first_row(s), f"grow_tick first with {grown}")
    row = first_row(screen)
    assert row.split()[:3] == ["1", *grown.split()] and "grow_tick grower.c:" in row and " grower " in row, row
    assert sort_label(screen) == "live"
    assert screen[0].startswith(f"allocscope top  pid {tgt.pid} (grower)  glibc ") and "mode full" in screen[0]
    assert screen[2].startswith("live ") and "lost 0" in screen[2]
    # s cycles the sort: growth, peak (burst: 1 MiB, all freed), age (keep_config: the oldest block)
    tmux.keys("s")
    tmux.wait_screen(lambda s: sort_label(s) == "growth", "sort: growth")
    tmux.keys("s")
    screen = tmux.wait_screen(lambda s: sort_label(s) == "peak", "sort: peak")
    row = first_row(screen)
    assert "burst grower.c:" in row and row.split()[1:3] == ["0", "B"] and human_bytes(BURST) in row, row
    assert "locations by peak live bytes (3)" in "\n".join(screen)
    tmux.keys("s")
    screen = tmux.wait_screen(lambda s: sort_label(s) == "age", "sort: age")
    assert "keep_config grower.c:" in first_row(screen) and human_bytes(CONFIG) in first_row(screen)
    # enter: the selected site's full stack (j: the second row, grow_tick); escape: back
    tmux.keys("j", "Enter")
    screen = tmux.wait_screen(lambda s: any("full stack, innermost first" in ln for ln in s), "the full stack")
    assert any(ln.startswith("location #2 by oldest allocation: grow_tick") for ln in screen), screen
    assert any(re.match(r"\s+\d+\s+grower_main grower.c:\d+\s+\[grower\]", ln) for ln in screen), screen
    assert "threads holding it: grower " in "\n".join(screen)
    tmux.keys("Escape", "t")
    screen = tmux.wait_screen(lambda s: any(ln.startswith("threads by live bytes") for ln in s), "threads view")
    row = next(ln for ln in screen if re.match(r"\s+\d+\s+grower\s", ln))
    assert row.split()[2:4] == (human_bytes(AUTO_TICKS * GROW + CONFIG)).split(), row
    tmux.keys("t", " ")
    tmux.wait_screen(lambda s: "FROZEN" in s[0], "frozen")
    # a terminal too small, then big again
    tmux.run("resize-window", "-t", "top", "-x", "50", "-y", "10")
    tmux.wait_screen(lambda s: s and s[0].startswith("terminal too small: 50x10"), "too small")
    tmux.run("resize-window", "-t", "top", "-x", "160", "-y", "40")
    tmux.keys(" ")
    tmux.wait_screen(lambda s: "FROZEN" not in s[0] and site_rows(s), "the table again")
    # q: the trace is finalized, the last frame stays on the terminal with why it ended
    tmux.keys("q")
    assert tmux.exit_code() == 0, tmux.screen()
    screen = tmux.screen()
    text = "\n".join(screen)
    assert f"ended: quit; trace written to {out}" in text, text
    assert re.search(rf"allocscope: wrote {re.escape(str(out))}: \d+ intervals? in [\d.]+s \(quit\)", text), text
    assert tgt.p.poll() is None  # the target runs on
    # the trace is complete and says what the screen said
    rep = report_json(out)
    assert rep["recording"]["complete"] is True and rep["recording"]["end_reason"] == "quit"
    sites = by_function(rep)
    assert (sites["grow_tick"]["live_bytes"], sites["grow_tick"]["alloc_count"]) == (AUTO_TICKS * GROW, AUTO_TICKS)
    assert human_bytes(sites["grow_tick"]["live_bytes"]) == grown
    assert sites["keep_config"]["live_bytes"] == CONFIG
    assert (sites["burst"]["live_bytes"], sites["burst"]["peak_live_bytes"]) == (0, BURST)
    assert [t["name"] for t in sites["grow_tick"]["threads"]] == ["grower"]


def test_top_launch_target_exit_keeps_last_frame(targets, tmp_path, tmux):
    # the command exits by itself: the last frame stays up, saying so, until q
    tmux.start([*ALLOCSCOPE, "top", "--interval", "0.5", "--", str(targets["sizes"])])
    screen = tmux.wait_screen(
        lambda s: any("ended: exited with code 0" in ln for ln in s), "the target's exit", timeout=120
    )
    assert any("ended: exited with code 0; nothing written (no -o)  (q: quit)" in ln for ln in screen), screen
    rows = site_rows(screen)  # sizes.c keeps them all: 1500 x 50000 B, 20000 x 1000 B, 100000 x 64 B
    for row, (fn, live) in zip(
        rows, [("medium_blocks", 1500 * 50000), ("small_blocks", 20000 * 1000), ("tiny_blocks", 100000 * 64)]
    ):
        assert f"{fn} sizes.c:" in row and row.split()[1:3] == human_bytes(live).split(), rows
    time.sleep(1.0)
    assert not tmux.rc.exists()  # still waiting for q
    tmux.keys("q")
    assert tmux.exit_code() == 0
    text = "\n".join(tmux.screen())
    assert "ended: exited with code 0; nothing written (no -o)" in text and "medium_blocks" in text


# --- --batch ---------------------------------------------------------------------------------------


class Lines:
    """Every line a process writes to a pipe, collected by a thread."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.eof = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
        self.eof = True

    def blocks(self) -> list[list[str]]:
        out: list[list[str]] = []
        for line in list(self.lines):
            if line.startswith("== "):
                out.append([line])
            elif out and not line.startswith("-- "):
                out[-1].append(line)
        return out


def grow_row(block: list[str]) -> list[str] | None:
    row = next((ln for ln in block if "grow_tick grower.c:" in ln), None)
    return row.split() if row else None


def test_top_batch_blocks(targets, procs, tmp_path):
    tgt = procs(targets["grower"])
    tgt.expect("ready")
    out = tmp_path / "batch.allocscope"
    iterations = 18
    top = subprocess.Popen(
        [
            *ALLOCSCOPE,
            "top",
            "--pid",
            str(tgt.pid),
            "--batch",
            "--interval",
            "0.5",
            "--iterations",
            str(iterations),
            "-o",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
    )
    lines = Lines(top.stdout)
    try:
        wait_for(lambda: lines.blocks() or top.poll() is not None, timeout=120, what="the first block")
        ticks = 4
        for k in range(1, ticks + 1):
            tgt.signal(signal.SIGUSR1)
            tgt.expect(f"tick {k}")
            want = human_bytes(k * GROW).split()
            wait_for(
                lambda w=want: any((grow_row(b) or [])[:2] == w for b in lines.blocks()),
                timeout=30,
                what=f"a block with {k} ticks",
            )
        assert top.wait(60) == 0, top.stderr.read()
    finally:
        if top.poll() is None:
            top.kill()
    wait_for(lambda: lines.eof, what="stdout closed")
    blocks = lines.blocks()
    assert len(blocks) == iterations, lines.lines
    assert lines.lines[-1] == f"-- ended: {iterations} iterations"
    for b in blocks:
        assert re.match(r"== \d\d:\d\d:\d\d \+[\d.]+s  RSS [\d.]+ \w+ \(peak [\d.]+ \w+\)  live ", b[0]), b[0]
        assert b[0].endswith("lost 0")
    # grow_tick: one tick at most per interval (the next tick waited for the block showing the
    # last one), so each change is exactly one block of 3333 B or nothing
    shown = [grow_row(b) for b in blocks if grow_row(b)]
    lives = [" ".join(r[:2]) for r in shown]
    changes = [" ".join(r[2:4]) for r in shown]
    assert set(changes) <= {human_delta(GROW), "0 B"}, changes
    assert changes.count(human_delta(GROW)) == ticks and changes[0] == human_delta(GROW)
    assert sorted(set(lives), key=lives.index) == [human_bytes(k * GROW) for k in range(1, ticks + 1)]
    assert all(r[r.index("grow_tick") - 1] == "grower" for r in shown), shown  # the thread column
    last = blocks[-1]
    assert last[1] == "   1 locations by live bytes" and last[3].split()[:2] == human_bytes(ticks * GROW).split()
    assert "allocscope: wrote" in top.stderr.read()
    rep = report_json(out)
    g = by_function(rep)["grow_tick"]
    assert (g["live_bytes"], g["alloc_count"]) == (ticks * GROW, ticks)
    assert rep["recording"]["end_reason"] == f"{iterations} iterations"
    assert tgt.p.poll() is None


def test_top_batch_closed_pipe_finalizes_quietly(targets, procs, tmp_path):
    tgt = procs(targets["grower"])
    tgt.expect("ready")
    out = tmp_path / "pipe.allocscope"
    top = subprocess.Popen(
        [*ALLOCSCOPE, "top", "--pid", str(tgt.pid), "--batch", "--interval", "0.3", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
    )
    try:
        assert top.stdout.readline().startswith("== ")  # like `| head -1`
        top.stdout.close()
        assert top.wait(60) == 0
    finally:
        if top.poll() is None:
            top.kill()
    err = top.stderr.read()
    assert "Traceback" not in err and "Broken" not in err and "Exception" not in err, err
    assert "wrote" not in err  # quiet: no summary
    rep = report_json(out)
    assert rep["recording"]["complete"] is True and rep["recording"]["end_reason"] == "stdout closed"
    assert tgt.p.poll() is None


# --- record's status line ---------------------------------------------------------------------------


def test_record_status_line_on_a_tty_not_on_a_pipe(targets, procs, tmp_path):
    tgt = procs(targets["grower"])
    tgt.expect("ready")
    # stderr on a pseudo-terminal: the status line, rewritten in place
    out = tmp_path / "tty.allocscope"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 200, 0, 0))  # 200 columns
    rec = subprocess.Popen(
        [*ALLOCSCOPE, "record", "--pid", str(tgt.pid), "-o", str(out), "--interval", "0.3"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
        cwd=str(ROOT),
    )
    os.close(slave)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            seen.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: attached(out) or rec.poll() is not None, timeout=120, what="probes attached")
        tgt.signal(signal.SIGUSR1)
        tgt.expect("tick 1")
        status = f"top: grow_tick grower.c:{GROW_LINE} {human_bytes(GROW)}"
        wait_for(lambda: status.encode() in seen, timeout=30, what="the status line")
        rec.send_signal(signal.SIGINT)
        assert rec.wait(60) == 0
    finally:
        if rec.poll() is None:
            rec.kill()
    reader.join(5)
    os.close(master)
    text = seen.decode()
    lines = re.findall(r"\r\x1b\[K(allocscope: [^\r\n]*)", text)
    assert any(
        re.fullmatch(rf"allocscope: \d+s  RSS [\d.]+ \w+  live {human_bytes(GROW)}  lost 0  {status}", ln)
        for ln in lines
    ), lines
    summary = text.index("allocscope: wrote")  # on stderr, as every line of ours; stdout: nothing
    assert text[:summary].endswith(("\r\x1b[K", "\n")) and "\x1b" not in text[summary:], text[-300:]
    assert rec.stdout.read() == ""
    # stderr on a pipe: progress lines only
    out2 = tmp_path / "pipe.allocscope"
    p = subprocess.run(
        [*ALLOCSCOPE, "record", "--pid", str(tgt.pid), "-o", str(out2), "--interval", "0.3", "--duration", "1.5"],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr and "\x1b" not in p.stderr and "top:" not in p.stderr, p.stderr
    assert all(ln.startswith("allocscope: ") for ln in p.stderr.splitlines())
    assert tgt.p.poll() is None
