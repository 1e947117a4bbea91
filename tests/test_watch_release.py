"""Any failure of one incarnation's recording under the watch lets a held process go (issue 50's
soak: a recording that failed with FileNotFoundError left its daemon stopped at its exec for good),
and says it in one line. No BPF: the gate is a stand-in that notes what it is told."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tracer.record.signals import StopRequest
from tracer.watch.incarnation import Tracing


class Gate:
    def __init__(self) -> None:
        self.released: list[int] = []
        self.unfollowed: list[int] = []

    def release(self, pid: int, why: str = "") -> None:
        self.released.append(pid)

    def unfollow(self, pid: int) -> None:
        self.unfollowed.append(pid)


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize(
    "error", [FileNotFoundError(2, "No such file or directory"), RuntimeError("two\nlines"), KeyError("x")]
)
def test_a_failed_recording_lets_its_held_process_go(monkeypatch, held, error):
    said: list[str] = []
    gate = Gate()
    watch = SimpleNamespace(stop=StopRequest(), progress=said.append, gate=gate)
    t = Tracing(watch, (4242, 1), held)  # type: ignore[arg-type]

    def fail() -> None:
        raise error

    monkeypatch.setattr(t, "_trace", fail)
    t._thread()
    assert t.done.is_set()
    assert gate.released == ([4242] if held else []) and gate.unfollowed == gate.released
    (line,) = said
    assert "\n" not in line and line.startswith(f"pid 4242: its recording failed ({type(error).__name__}: "), line
    assert line.endswith("; it runs untraced") == held, line
