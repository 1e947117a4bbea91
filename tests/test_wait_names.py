"""One name for one wait, in `top` and in the report (issue 53): redis (a stripped executable) waits
in epoll through code of its own without a symbol; the report said "inside redis-check-rdb, called
from aeMain" where `top` said "redis-check-rdb+0x64e51". Both now name waits by
reports/analysis/waits.py's wait_group. No BPF: the live model is fed a snapshot with a blocked
thread, as the recorder's observer feeds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from reports.analysis.stacks import FrameInfo
from reports.analysis.waits import wait_place
from reports.live.metrics import wait_name
from reports.live.model import LiveModel
from reports.live.text import waiting_text
from reports.render.shared import frame_text
from reports.symbolize import Frame

REDIS = "/usr/bin/redis-check-rdb"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
# offset -> what the symbolizer answers: libc's epoll_wait, two of redis' own frames without a
# symbol (as a stripped build gives them), then aeMain and main
FRAMES = {
    (LIBC, 0x1000): ("epoll_wait", None, None),
    (REDIS, 0x64E51): ("redis-check-rdb+0x64e51", None, None),
    (REDIS, 0x64F00): ("redis-check-rdb+0x64f00", None, None),
    (REDIS, 0x3000): ("aeMain", "ae.c", 496),
    (REDIS, 0x4000): ("main", "server.c", 7200),
}
WAIT_STACK = [(LIBC, 0x1000), (REDIS, 0x64E51), (REDIS, 0x64F00), (REDIS, 0x3000), (REDIS, 0x4000)]
SID, TID = 42, 7
NAME = "inside redis-check-rdb, called from aeMain"


class Symbolizer:
    def symbolize(self, module, offsets, build_id=None, return_addresses=True):
        return {o: [Frame(*FRAMES[module, o][:1], module, *FRAMES[module, o][1:], o)] for o in offsets}


@dataclass
class Snap:
    seq: int = 1
    final: bool = False
    row: dict = field(default_factory=lambda: {"seq": 1, "elapsed_s": 1.0, "rss_bytes": 1 << 20, "live_bytes": 0})
    sites: dict = field(default_factory=dict)
    changed: list = field(default_factory=list)
    stack_columns: dict | None = None
    names: dict = field(default_factory=dict)
    blocked: tuple = ()


def columns() -> dict[str, list]:
    cols: dict[str, list] = {
        k: [] for k in ("stack_id", "idx", "ip", "module", "build_id", "offset", "syscall", "function", "file", "line")
    }
    for i, (module, off) in enumerate(WAIT_STACK):
        for k, v in (
            ("stack_id", SID),
            ("idx", i),
            ("ip", 0x400000 + off),
            ("module", module),
            ("build_id", "cd34"),
            ("offset", off),
            ("syscall", 0),
            ("function", None),
            ("file", None),
            ("line", None),
        ):
            cols[k].append(v)
    return cols


def test_the_report_names_the_wait_inside_the_stripped_executable():
    frames = tuple(FrameInfo(FRAMES[k][0], k[0], FRAMES[k][1], FRAMES[k][2]) for k in WAIT_STACK)
    place = wait_place(frames)
    assert (place["function"], place["inside"], place["file"], place["line"]) == ("aeMain", REDIS, "ae.c", 496)
    assert frame_text(place).startswith(f"{NAME} ae.c:496"), frame_text(place)


def test_top_names_the_wait_as_the_report_does():
    model = LiveModel(symbolizer=Symbolizer())
    # two threads blocked there (2 s and 3.5 s so far): one row
    blocked = ((TID, SID, 0, 2_000_000_000, 1), (TID + 1, SID, 0, 3_500_000_000, 1))
    model.update(Snap(stack_columns=columns(), blocked=blocked))
    [w] = model.waiting
    assert (w["function"], w["inside"], w["threads"], w["longest_s"]) == ("aeMain", REDIS, 2, 3.5)
    frames = tuple(FrameInfo(FRAMES[k][0], k[0], FRAMES[k][1], FRAMES[k][2]) for k in WAIT_STACK)
    assert w["location"] == wait_place(frames)["location"]  # the report's key for the same place
    line = waiting_text(SimpleNamespace(waiting=model.waiting))
    assert line == f"waiting: {NAME} 2 thr holding 0 B (longest 3.5s)", line
    assert "+0x" not in line
    assert wait_name(w) == f"{NAME} ae.c:496"  # the metrics' `wait` label too


def test_a_thread_of_the_allocators_own_waits_in_its_entry_not_in_clone3():
    """redis' jemalloc_bg_thd blocks with jemalloc's frames (allocator code: waiting machinery)
    on libc's; every frame folds, and the place was the outermost one, `clone3`, in the report's
    "Held while waiting" and top's "waiting: clone3 1 thr". It is the thread's entry function."""
    je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    frames = (
        FrameInfo("__futex_abstimed_wait_common", LIBC, None, None),
        FrameInfo("pthread_cond_timedwait", LIBC, None, None),
        FrameInfo("background_thread_sleep", je, None, None),
        FrameInfo("background_thread_entry", je, None, None),
        FrameInfo("start_thread", LIBC, "pthread_create.c", 442),
        FrameInfo("clone3", LIBC, "clone3.S", 81),
    )
    place = wait_place(frames)
    assert (place["function"], place["module"]) == ("background_thread_entry", je), place
    # the redis stack keeps its own place (nothing folds past the code that decided to wait)
    main = tuple(FrameInfo(FRAMES[k][0], k[0], FRAMES[k][1], FRAMES[k][2]) for k in WAIT_STACK)
    assert wait_place(main)["function"] == "aeMain"
