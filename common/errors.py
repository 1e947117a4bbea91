"""One error hierarchy for the whole tool. The CLI prints `allocscope: <message>` on one line and
exits with `exit_code`; anything that is not an AllocscopeError is a bug and keeps its traceback."""

from __future__ import annotations


class AllocscopeError(Exception):
    """A problem the user can act on. `str(err)` is the one line shown."""

    exit_code = 1


class UsageError(AllocscopeError):
    """Bad options or arguments."""

    exit_code = 2


class TargetError(AllocscopeError):
    """The process to trace cannot be found or used (no such pid, kernel thread, zombie...)."""

    exit_code = 3


class NoAllocatorError(TargetError):
    """The target maps no malloc/free (statically linked and stripped, or caught before the
    loader mapped its libraries: `watch` looks again once its code mappings change)."""


class PermissionProblem(AllocscopeError):
    """Not root / no CAP_BPF / BPF or tracefs unavailable."""

    exit_code = 4


class TraceFileError(AllocscopeError):
    """A trace that is missing, unreadable, corrupt, foreign or from a future version."""

    exit_code = 5


class OutputError(AllocscopeError):
    """Cannot write the output (exists and is not a trace, symlink, read-only, disk full)."""

    exit_code = 6


class Interrupted(AllocscopeError):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) arrived while the probes were being set up: they were
    detached and nothing was recorded; an earlier trace at the output path was left as it was."""

    exit_code = 130
