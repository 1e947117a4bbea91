"""Watching a recording as it goes, without the full screen: `record`'s status line and
`top --batch`'s blocks. The recorder hands every snapshot to an observer in its own thread;
the observers here only queue it, and a thread of theirs does the work (symbolizing, ranking,
writing), so a slow terminal or a first symbolization never delays a snapshot. They are views:
plain snapshot callables a command adds to its Listeners (common/listeners.py) beside the exporters."""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

from common.listeners import Listeners, Pump
from reports.analysis import Folding
from reports.live.model import LiveModel, StatusModel
from reports.live.text import batch_block, status_text

CLEAR_LINE = "\r\x1b[K"


class StatusLine:
    """`record` on a terminal: one line on `stream` (stderr), rewritten in place after every
    snapshot — elapsed, RSS, live, lost, the stack holding most. Progress messages go above it."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.model = StatusModel()
        self.lock = threading.Lock()
        self.shown = False
        self.pump = Pump(self._show, "allocscope-status")
        self.observe = self.pump.observe

    def _write(self, text: str) -> None:
        with self.lock:
            self.stream.write(text)
            self.stream.flush()

    def _show(self, snap) -> None:
        self.model.update(snap)
        width = terminal_width(self.stream) - 1
        line = status_text(float(snap.row.get("elapsed_s", 0.0)), snap.row, self.model.lost, self.model.top(), width)
        self._write(CLEAR_LINE + line)
        self.shown = True

    def progress(self, msg: str) -> None:
        self._write((CLEAR_LINE if self.shown else "") + f"allocscope: {msg}\n")
        self.shown = False

    def close(self) -> None:
        try:
            self.pump.close()
        finally:
            if self.shown:
                self._write(CLEAR_LINE)


class BatchPrinter:
    """`top --batch`: one block per snapshot on `out` (reports.live.text.batch_block), flushed.
    With `iterations`, the recording is asked to stop after that many intervals (the final
    snapshot that follows is not printed). A closed `out` (the reader of the pipe went away)
    stops the recording too, quietly: the trace is still finalized; one that cannot be written
    (ENOSPC, EIO) stops it the same way, and `error` says why."""

    def __init__(
        self, out, stop, fold: Folding | None, sort: str, top: int, iterations: int | None, by: str = "location"
    ) -> None:
        self.out = out
        self.stop = stop
        self.model = LiveModel(fold, by=by)
        self.sort, self.top, self.iterations = sort, top, iterations
        self.intervals = 0  # snapshots before the final one (counted in the recorder's thread)
        self.printed = 0
        self.closed = False
        self.error = ""  # stdout could not be written (not a closed pipe): top exits 6 with it
        self.pump = Pump(self._print, "allocscope-batch")

    def observe(self, snap) -> None:
        if not snap.final:
            self.intervals += 1
            if self.iterations is not None and self.intervals >= self.iterations:
                self.stop.request(f"{self.iterations} iteration{'' if self.iterations == 1 else 's'}")
        self.pump.observe(snap)

    def _print(self, snap) -> None:
        self.model.update(snap)
        if self.closed or (snap.final and self.iterations is not None and self.printed >= self.iterations):
            return
        self.write(batch_block(self.model.view(), self.sort, self.top, wall_clock(snap.row)))
        self.printed += 1

    def write(self, text: str) -> None:
        if self.closed:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except OSError as e:
            self.closed = True
            if isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE:
                self.stop.request("stdout closed")
            else:  # a full disk under `> mem.log`: the trace is finished, then one line and exit 6
                self.error = f"cannot write to stdout: {e.strerror or e}"
                self.stop.request("stdout not writable")
            silence(self.out)


def record_batch(
    target,
    opts,
    stop,
    out,
    fold: Folding | None,
    sort: str,
    top: int,
    iterations: int | None,
    progress=None,
    by: str = "location",
    early=None,
    listeners: Listeners | None = None,
):
    """`top --batch`: record `target` (tracer.record.recorder) with a BatchPrinter on `out` watching
    beside `listeners` (the exporters: allocscope/cli/listeners.py), then the closing line. Returns
    (Summary, the printer)."""
    from tracer.record import recorder as rec  # noqa: PLC0415

    printer = BatchPrinter(out, stop, fold, sort, top, iterations, by)
    watching = Listeners(printer.observe, *(listeners.all if listeners is not None else ()))
    try:
        s = rec.record(target, opts, progress, stop=stop, observer=watching.observer, early=early)
    except BaseException:
        printer.pump.close(check=False)
        raise
    printer.pump.close()
    from reports.analysis.ending import closing_text  # noqa: PLC0415 (pandas: loaded by now)

    printer.write(f"-- ended: {closing_text(s.end, s.end_reason)}\n")
    return s, printer


def terminal_width(stream, default: int = 100) -> int:
    """Columns of the terminal `stream` writes to (`default` when it does not say)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or default
    except (OSError, ValueError, AttributeError):
        return default


def wall_clock(row: dict) -> str:
    """HH:MM:SS of a snapshot (its `ts_ns` is CLOCK_MONOTONIC), not of the moment it is printed."""
    ago = (time.monotonic_ns() - int(row.get("ts_ns") or time.monotonic_ns())) / 1e9
    return time.strftime("%H:%M:%S", time.localtime(time.time() - max(0.0, ago)))


def silence(out) -> None:
    """Point a closed stream's descriptor at /dev/null, so nothing — Python's last flush at exit
    included — writes to the closed pipe again."""
    try:
        fd = out.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError):
        pass
    if out is sys.stdout:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
