"""The options of `allocscope watch` (allocscope/cli/watch.py fills them): the watch's own, read by
the watcher (tracer/watch/watcher.py), each incarnation's recording (incarnation.py), --keep
(keep.py) and --when-rss / --on-end (triggers.py). Each recording's own are RecordOptions
(tracer/base/options.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WatchOptions:
    out_dir: str
    pattern: str | None = None  # --pgrep
    pid: int | None = None  # --pid: that process, then what runs its command line
    keep_s: float | None = None  # --keep: seconds of interval history kept per trace (None: all)
    max_traces: int = 20  # --max-traces: traces kept in out_dir (the oldest removed first)
    max_processes: int = 32  # --max-processes: processes recorded at once (more wait for room)
    when_rss: int | None = None  # --when-rss: bytes
    on_trigger: str | None = None  # --on-trigger: a shell command run when a trigger fires
    on_end: str | None = None  # --on-end: a shell command run when a trace is complete
    hold: bool = True  # stop new incarnations at their exec (--no-hold: attach as found)
    comms: list[str] = field(default_factory=list)  # --comm: program names the gate holds
