"""What a live recording emits, and who listens: the one seam for an exporter (issue 52).

A recording under way (tracer/record/recorder.py; under `watch`, one per process followed,
tracer/watch/incarnation.py) tells its listeners three things, in this order, per target:

    target_started(pid, comm, trace_path, launched)  an incarnation begins (watch: every restart)
    observe(snap, pid)                               a snapshot (tracer.record.snapshot.Snapshot),
                                                     in the recorder's own thread: be quick
    target_ended(reason, pid)                        it ended; `reason` is recording.end.reason
                                                     (exited, killed, oom_killed, exec, stopped)

and `close()` once, when the command is done. `record`, `top` and `watch` build theirs through
one function (allocscope/cli/listeners.py: `start_listeners`) and hand them over the same way: the
recorder gets `Listeners.observer`, the watch the `Listeners` itself. An exporter (the Prometheus
one: reports/live/prometheus.py) implements SnapshotListener; a view that only draws snapshots
(record's status line, `top`'s screen and `--batch` blocks) is a plain callable, added as one.

`pid` is 0 under `record` and `top` (one target); under `watch` it tells the processes followed
at once apart. `target_ended` is called for every `target_started`, whatever it returned.

Stdlib only: the tracer, the reports and the CLI all import it (tests/test_layers.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class SnapshotListener(Protocol):
    """One listener of a live recording (see the module's docstring)."""

    def target_started(self, pid: int, comm: str, trace_path: str | None, launched: bool = False) -> bool | None:
        """A new incarnation; False: not served (a bounded exporter is full), the rest still comes."""
        ...

    def observe(self, snap, pid: int = 0) -> None:
        """A snapshot, in the recorder's thread: costs what a queue put costs, no more."""
        ...

    def target_ended(self, reason: str, pid: int = 0) -> None: ...

    def close(self) -> None: ...


class Observing:
    """A plain snapshot callable (a view: the status line, the screen, `--batch`) as a listener:
    it draws snapshots and nothing else; its owner closes it."""

    def __init__(self, fn: Callable[[object], None]) -> None:
        self.fn = fn

    def target_started(self, pid: int, comm: str, trace_path: str | None, launched: bool = False) -> bool:
        return True

    def observe(self, snap, pid: int = 0) -> None:
        self.fn(snap)

    def target_ended(self, reason: str, pid: int = 0) -> None:
        pass

    def close(self) -> None:
        pass


class Listeners:
    """Every listener of one command's recordings, told each thing in the order they were added
    (itself a SnapshotListener). `observer` is what the recorder takes: None when there is none
    (the recorder then needs no wakes for it)."""

    def __init__(self, *listeners: SnapshotListener | Callable | None) -> None:
        self.all: list[SnapshotListener] = []
        for x in listeners:
            self.add(x)

    def add(self, listener: SnapshotListener | Callable | None) -> None:
        """A listener, or a plain snapshot callable (wrapped in Observing); None is ignored."""
        if listener is None:
            return
        if isinstance(listener, SnapshotListener):
            self.all.append(listener)
        else:
            self.all.append(Observing(listener))

    def __len__(self) -> int:
        return len(self.all)

    def of(self, kind: type) -> list:
        """The listeners of one kind (the Prometheus exporter: its URL, tests)."""
        return [x for x in self.all if isinstance(x, kind)]

    @property
    def observer(self) -> Callable[[object], None] | None:
        if not self.all:
            return None
        if len(self.all) == 1:
            return self.all[0].observe
        return self.observe

    def target_started(self, pid: int, comm: str, trace_path: str | None, launched: bool = False) -> bool:
        """True when every listener serves this incarnation."""
        served = [x.target_started(pid, comm, trace_path, launched=launched) for x in self.all]
        return all(s is not False for s in served)

    def observe(self, snap, pid: int = 0) -> None:
        for x in self.all:
            x.observe(snap, pid)

    def target_ended(self, reason: str, pid: int = 0) -> None:
        for x in self.all:
            x.target_ended(reason, pid)

    def close(self) -> None:
        """Close each (what it queued is handled first); the first error is raised after all closed."""
        error: BaseException | None = None
        for x in self.all:
            try:
                x.close()
            except BaseException as e:  # noqa: BLE001 - every listener gets closed
                error = error or e
        if error is not None:
            raise error


class Pump:
    """A thread that takes the items `observe` queued and hands each to `handle`, in order;
    `close` waits until it has handled them all. How a listener keeps the recorder's thread
    free: the recorder pays a queue put, the work (symbolizing, ranking, writing) happens here."""

    def __init__(self, handle: Callable[[object], None], name: str) -> None:
        self.handle = handle
        self.queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def observe(self, item) -> None:  # in the recorder's thread: costs a queue put
        self.queue.put(item)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.handle(item)
                except Exception as e:  # noqa: BLE001 - raised again by close(), in the caller's thread
                    self.error = e

    def close(self, check: bool = True) -> None:
        """Wait until every queued item is handled; `check`: raise what handling raised."""
        self.queue.put(None)
        self.thread.join()
        if check and self.error is not None:
            raise self.error


__all__ = ["Listeners", "Observing", "Pump", "SnapshotListener"]
