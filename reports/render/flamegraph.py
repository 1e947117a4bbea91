"""Folded stacks ("collapsed" format) for flamegraph.pl, speedscope, inferno and the HTML report.

    main;serve;load_partition;make_partition 1048576

One line per distinct stack: frames outermost first, innermost last, joined by ';', then a
space and the value. Stacks are the report's sites (allocator wrappers folded away), so the
live_bytes lines add up to the report's site live bytes. Zero-value stacks are left out;
lines are sorted by stack. The metrics count host memory; `device_live_bytes` is the live GPU
memory (CUDA device memory) of each stack instead, never mixed with the others.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..analysis import Folding, FrameInfo, site_table
from ..trace import Trace

METRICS = ("live_bytes", "alloc_bytes", "live_count", "alloc_count", "device_live_bytes")


def frame_label(function: str) -> str:
    """A frame as folded-format text: ';' separates frames and newlines end lines, so neither
    may appear inside one (C++ and Rust names have neither in practice)."""
    return function.replace(";", ":").replace("\n", " ").replace("\r", " ")


def folded_stacks(
    trace: Trace,
    metric: str = "live_bytes",
    thread_root: bool = False,
    stacks: Mapping[int, tuple[FrameInfo, ...]] | None = None,
    fold: Folding | None = None,
    at_seq: int | None = None,
) -> dict[tuple[str, ...], int]:
    """Sum of `metric` per stack of frame labels, outermost first, at the end of the recording
    (with `at_seq`: at the end of that interval; the counters are cumulative). With
    `thread_root`, the allocating thread's name is prepended as the root frame (threads of one
    name share it). `fold`: wrappers folded out of sites (see analysis.fold_frames). Zero-value
    stacks are dropped. Host memory only, except `device_live_bytes`: GPU memory only."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    st = site_table(trace, dict(stacks) if stacks is not None else None, fold=fold, at_seq=at_seq)
    device = metric.startswith("device_")
    st = st[st["device"] == device]
    metric = metric.removeprefix("device_")
    names = trace.thread_names() if thread_root else {}
    out: dict[tuple[str, ...], int] = {}
    for site, tid, value in zip(st["site"], st["tid"], st[metric]):
        path = tuple(frame_label(f.function) for f in reversed(site))
        if thread_root:
            path = (frame_label(names.get(int(tid), f"tid {int(tid)}")), *path)
        out[path] = out.get(path, 0) + int(value)
    return {k: v for k, v in out.items() if v}


def to_folded(
    trace: Trace,
    metric: str = "live_bytes",
    thread_root: bool = False,
    stacks: Mapping[int, tuple[FrameInfo, ...]] | None = None,
    fold: Folding | None = None,
    at_seq: int | None = None,
) -> str:
    """The folded-stacks text (see the module docstring); '' when every stack is zero. `at_seq`:
    at the end of that interval instead of the end of the recording."""
    lines = [
        f"{';'.join(path)} {value}"
        for path, value in sorted(folded_stacks(trace, metric, thread_root, stacks, fold, at_seq).items())
    ]
    return "".join(line + "\n" for line in lines)
