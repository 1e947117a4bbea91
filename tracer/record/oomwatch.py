"""The OOM killer's marks of its victims beside one recording (oom:mark_victim, a BPF program of
its own: tracer/bpf/oom.py): loaded in a thread from the start (from the store in milliseconds;
a compile where the store cannot serve, never in the probes' way), asked at the end whether the
target was killed (tracer/record/finish.py)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..process.ending import OomMark

if TYPE_CHECKING:
    from ..bpf.oom import OomVictims


class OomWatch:
    """One recording's watch of oom:mark_victim (Recorder.ooms)."""

    def __init__(self) -> None:
        self.victims: OomVictims | None = None  # the program, once loaded (None: not watched)
        self.how = ""  # meta.json probes.oom: how it is watched, or why not
        self.live = threading.Event()  # the probes are live (or the recording ended): BCC is free
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._load, name="oom victims", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        """In the thread: the program, loaded once the probes are live."""
        from ..bpf.oom import open_victims  # noqa: PLC0415

        victims, how = open_victims(lambda: self.live.wait() and not self._closed)
        with self._lock:
            self.how = how
            if not self._closed:
                self.victims = victims
                return
        if victims is not None:
            victims.close()  # the recording ended before it was loaded

    def mark(self, pids: set[int], since_ns: int, alive_ns: int, wait_s: float) -> OomMark | None:
        """What oom:mark_victim says of the target (`pids`: its pid and threads; None: not
        watched). A mark of it since `since_ns` counts whenever it came; no mark counts only
        where the program was attached before the target was last known alive (`alive_ns`):
        else the kill may have come first, and the cgroups' counters tell. Waits up to `wait_s`
        for the program to load."""
        if self._thread is not None:
            self._thread.join(wait_s)
        victims = self.victims
        if victims is None:
            return None
        found = victims.victim(pids, since_ns)
        if found is not None:
            return OomMark(found)
        return OomMark(None) if victims.attached_ns <= alive_ns else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            victims, self.victims = self.victims, None
        self.live.set()
        if victims is not None:
            victims.close()
