"""SIGINT, SIGTERM and SIGHUP while recording: kept as a reason to stop, never a traceback.

Light on purpose (no third-party import): the `allocscope` command installs one at its very
first line (allocscope/cli/entry.py), so a Ctrl-C that comes while Python is still importing or BCC
still compiling is honoured like any other.
"""

from __future__ import annotations

import signal
import sys


class StopRequest:
    """SIGINT, SIGTERM and SIGHUP: the first one is kept as the reason to stop; one that arrives
    while the trace is being finished only gets a word. The CLI installs it before anything
    else and keeps it for the life of the process, so no moment of start-up or shutdown falls
    back to Python's KeyboardInterrupt; record() installs one itself when given none."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, quiet: bool = False) -> None:
        self.reason: str | None = None
        self.signals = 0  # how many came (a launched program's grace: one more cuts it short)
        self.finalizing = False
        self.quiet = quiet
        self._previous: dict = {}

    def install(self) -> StopRequest:
        self._previous = {s: signal.signal(s, self.handle) for s in self.SIGNALS}
        return self

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def ignore(self) -> None:
        """From now on the signals are ignored (the process is on its way out)."""
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_IGN)

    def request(self, reason: str) -> None:
        """A stop asked for by the program itself (`top`: the q key, --iterations, a closed
        stdout); the first reason, signal or not, is the one kept."""
        if self.reason is None:
            self.reason = reason

    def handle(self, signum, _frame) -> None:
        self.signals += 1
        if self.reason is None:
            self.reason = signal.Signals(signum).name
        elif self.finalizing and not self.quiet:
            print("allocscope: finalizing the trace, please wait", file=sys.stderr)
