"""waits.still_owns on the stack shapes of issue 46 (no BPF): whether a blocked thread still owns
what it allocated, or passed it on. Frames innermost first, as the report folds them."""

from __future__ import annotations

from reports.analysis.stacks import FrameInfo
from reports.analysis.waits import name_pattern, still_owns


def _f(fn: str, line: int | None = None) -> FrameInfo:
    return FrameInfo(fn, "/bin/d", "/src/d.c" if line else None, line)


ROOT = (_f("start_thread"), _f("clone3"))


def test_a_sender_owns_an_idle_worker_does_not():
    """C: synth_main loops take_job() (line 10) then run_job() (line 11); run_job makes the
    partition (line 20) then sends it (line 21)."""
    alloc = (_f("make_partition", 30), _f("run_job", 20), _f("synth_main", 11), *ROOT)
    assert still_owns(alloc, (_f("channel_send", 40), _f("run_job", 21), _f("synth_main", 11), *ROOT))
    assert not still_owns(alloc, (_f("take_job", 50), _f("synth_main", 10), *ROOT))
    # a permit taken before the allocation in the same loop (provingd's sem_wait): the next iteration
    loop = (_f("synthesize_partition", 5), _f("partition_worker", 520), *ROOT)
    assert not still_owns(loop, (_f("partition_worker", 517), *ROOT))
    assert still_owns(loop, (_f("channel_push", 9), _f("partition_worker", 535), *ROOT))
    # blocked inside the allocating function itself: work in progress
    assert still_owns(alloc, (_f("make_partition", 31), _f("run_job", 20), _f("synth_main", 11), *ROOT))


def test_rayon_shapes():
    """rustd: map_fold's closure calls the map closure and the for_each one from one line; an
    idle pool thread parts from the job's stack far out, in the pool's main loop."""
    common = (
        _f("map_fold::{{closure}}", 88),
        _f("Iterator::fold", 2647),
        _f("execute", 70),
        _f("main_loop", 30),
        *ROOT,
    )
    alloc = (_f("synthesize_partition", 99), _f("main::{{closure}}", 267), _f("call_mut", 274), *common)
    send = (_f("hand_off", 107), _f("main::{{closure}}", 268), _f("call", 263), _f("with::{{closure}}", 317), *common)
    idle = (_f("Sleep::sleep", 5), _f("main_loop", 31), *ROOT)
    assert still_owns(alloc, send)
    assert not still_owns(alloc, idle)


def test_name_pattern():
    assert name_pattern([f"synth-{i}" for i in range(1, 18)]) == "synth-*"
    assert name_pattern(["gpu", "finalizer", "finalizer"]) == "finalizer/gpu"
