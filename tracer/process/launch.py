"""A launched program (`record -- CMD`, `top -- CMD`) once its recording is over: how allocscope
ends it, and the status allocscope exits with (the program's, as a shell reports it).

A program that ended by itself ended the recording: its status is taken, nothing is sent. One
still running when the recording stopped (--duration, Ctrl-C/SIGTERM/SIGHUP to allocscope, `top`'s
q) is stopped, never left behind and never killed without a word:

1. the recording is finished first (the trace is complete and says "stopped");
2. Ctrl-C at a terminal reached the program itself (it shares allocscope's process group there):
   it gets the grace period to end on it; otherwise, and then if it is still running, SIGTERM —
   to its process group where it has its own (not at a terminal), so its children get it too;
3. whatever of it (or of its process group) is still running after the grace period gets SIGKILL,
   said on stderr; another signal to allocscope meanwhile cuts the grace period short.

The grace period is `--grace` (GRACE_S by default).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from .target import Target

GRACE_S = 5.0
EXEC_REASON = "target exec'd"  # how a recording that ended at the program's exec says why (tracer/record/events.py)
REAP_S = 5.0  # after a SIGKILL: the longest it is waited for


def shell_status(returncode: int | None) -> int:
    """A program's exit status as a shell says it: its exit code, 128+N for signal N; 1 when it
    is not known."""
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode & 0xFF


def _gone(target: Target, until: float, signals: Callable[[], int]) -> bool:
    """Wait until the program is reaped and its process group (if its own) empty, at most until
    `until` or until another signal reaches allocscope (`signals()` grew). True: all gone."""
    child = target.child
    assert child is not None
    seen = signals()
    while True:
        child.reap(min(until, time.monotonic() + 0.05))
        if child.returncode is not None and not child.group_alive():
            return True
        if time.monotonic() >= until or signals() != seen:
            return False


def end_program(
    target: Target,
    reason: str,
    grace: float = GRACE_S,
    say: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    signals: Callable[[], int] = lambda: 0,
    until: float | None = None,
    stopped_by: Callable[[], str | None] = lambda: None,
    bound: str = "--duration",
) -> int:
    """After the recording of launched `target`: its exit status (shell_status), the program
    ended as the module's docstring says. `reason`: why the recording stopped ("target exited",
    "duration", "SIGINT", "quit"...); `say`: progress (the SIGTERM), `warn`: what is always said
    (the SIGKILL); `signals`: how many signals allocscope received so far. A program that exec'd
    another one ended the recording but not its run: it is waited for like one still running
    under a wrapper, until it ends, until `until` (monotonic: what is left of --duration) or
    until a signal reaches allocscope (`stopped_by()`: its name), and only then stopped as above."""
    child = target.child
    assert child is not None
    child.on_hold = child.on_exec = None  # the probes are gone: a stop now is the program's own
    child.remember_tree()  # at a terminal: its children in our group (they are init's once it ends)
    say = say or (lambda msg: None)
    warn = warn or say
    if child.reap(time.monotonic()) is not None:
        return shell_status(child.returncode)  # ended by itself (its process group is its own affair)
    name = f"{child.name} (pid {child.pid})"
    if reason.startswith(EXEC_REASON):
        reason = _run_on(target, name, signals, until, stopped_by, say)
        if not reason:
            return shell_status(child.returncode)
    first = signals()
    why = bound if reason == "duration" else reason or "the recording stopped"
    if reason == "SIGINT" and not child.own_group:
        # Ctrl-C at the terminal went to the program too: its own way of ending first
        say(f"{name} got the Ctrl-C too: waiting up to {grace:g} s for it to end")
        if _gone(target, time.monotonic() + grace, signals):
            return shell_status(child.returncode)
    kin = "its process group" if child.own_group else "its children" if child.tree else ""
    to = f" and {kin}" if kin else ""
    say(f"recording stopped ({why}): SIGTERM to {name}{to}; SIGKILL in {grace:g} s if still running")
    child.signal(signal.SIGTERM)
    if not _gone(target, time.monotonic() + grace, signals):
        if child.returncode is None:
            still = f"{name} still running"
        else:
            still = f"{name} ended ({_ended(child.returncode)}), not all of {kin or 'its children'}"
        after = "another signal came" if signals() != first else f"{grace:g} s after SIGTERM"
        if child.own_group:
            whom = "its process group"
        else:
            whom = "its children" if child.returncode is not None else "it" + to
        warn(f"{still} ({after}): SIGKILL to {whom}")
        child.signal(signal.SIGKILL)
        child.reap(time.monotonic() + REAP_S)
    return shell_status(child.returncode)


def _run_on(
    target: Target,
    name: str,
    signals: Callable[[], int],
    until: float | None,
    why: Callable[[], str | None],
    say: Callable[[str], None],
) -> str:
    """A launched program exec'd another one: the recording ended there (the probed allocator
    and its blocks are gone, docs/limits.md), but the program runs on, and a wrapper waits for
    it. "" once it has ended by itself; else why it is to be stopped now: "duration", or the
    signal that reached allocscope."""
    child = target.child
    assert child is not None
    now = _image(child.pid)
    child.detach()  # untraced from here: its signals its own, a debugger welcome, our end not its end
    if until is not None and time.monotonic() >= until:  # the run's bound is already up: stopped at once
        say(f"{name} exec'd {now or 'another program'}: the trace ends at the exec")
        return "duration"
    say(
        f"{name} exec'd {now or 'another program'}: the trace ends at the exec; "
        "waiting for the program to end (allocscope exits with its status)"
    )
    first = signals()
    while True:
        step = time.monotonic() + 0.1
        if child.reap(step if until is None else min(step, until)) is not None:
            return ""
        if signals() != first:
            return why() or "a signal"
        if until is not None and time.monotonic() >= until:
            return "duration"


def _image(pid: int) -> str:
    """The program a process runs now (/proc/PID/exe); "" when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
