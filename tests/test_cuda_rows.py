"""One CUDA call, one row (issue 46), on synthetic traces shaped like the driver-API program on the
GPU box: device_weights calls cuMemAlloc_v2 at cudaalloc.c:14; the device bytes' stack is taken
at the call's return (the call's frame is not on it), the driver's own mallocs inside the call
have the call's frame (stripped driver: an address, then `cuMemAlloc_v2` from .dynsym) and then
exactly the same frames. And a stack cut short inside the stripped driver, no symbol anywhere,
is the driver's one row, never a bare `libcuda.so…+0x319e98`.

    row (innermost)                        tid source       live at the end
    device_weights :14 (cuMemAlloc_v2)     301 cuda-device  2 x 256 MiB (3 made)
      the driver's mallocs in that call    301 heap         3 x 1000 B
    device_weights :15 (cuMemFree_v2)      301 heap         bookkeeping, freed (48 B each)
    host_staging :22 (cuMemHostAlloc)      301 cuda-pinned  8 MiB
      the driver's mallocs in that call    301 heap         2000 B
    load_table :30, plain malloc           301 heap         4096 B
    libcuda +0x319e98 < +0x31a000          302 heap         640 B (a driver thread, no symbol)
"""

from __future__ import annotations

from synth import SynthTrace

from reports import analysis as A
from reports.render.text import to_text
from reports.trace import load_trace

MIB = 1 << 20
DRIVER = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
PROG = "/opt/cudaalloc/cudaalloc"
SRC = "/src/cudaalloc.c"


def _trace(path) -> A.Trace:
    t = SynthTrace(path, module=PROG)
    t.cuda_driver(DRIVER)
    t.thread(301, "cudaalloc")
    t.thread(302, "cuda-EvtHandlr")
    outer = (["main", "__libc_start_call_main"], [SRC, None], [40, None], [PROG, "/lib/libc.so.6"])

    def caller(fn, line, inner=(), inner_mod=()):
        fns, files, lines, mods = outer
        return t.stack(
            [*inner, fn, *fns],
            files=[None] * len(inner) + [SRC, *files],
            lines=[None] * len(inner) + [line, *lines],
            module=[*inner_mod, PROG, *mods],
        )

    libc = "/lib/libc.so.6"
    dev = caller("device_weights", 14)
    dev_book = caller(
        "device_weights",
        14,
        ["malloc", "libcuda.so.580.159.04+0x2a10", "cuMemAlloc_v2"],
        [libc, DRIVER, DRIVER],
    )
    free_book = caller("device_weights", 15, ["malloc", "cuMemFree_v2"], [libc, DRIVER])
    pin = caller("host_staging", 22)
    pin_book = caller("host_staging", 22, ["malloc", "cuMemHostAlloc"], [libc, DRIVER])
    table = caller("load_table", 30, ["malloc"], [libc])
    bare = t.stack(
        ["malloc", "libcuda.so.580.159.04+0x319e98", "libcuda.so.580.159.04+0x31a000"], module=[libc, DRIVER, DRIVER]
    )
    t.interval(
        {
            (dev, 301, "cuda-device"): (3 * 256 * MIB, 3, 256 * MIB, 1),
            (dev_book, 301): (3000, 3, 0, 0),
            (free_book, 301): (48, 1, 48, 1),
            (pin, 301, "cuda-pinned"): (8 * MIB, 1, 0, 0),
            (pin_book, 301): (2000, 1, 0, 0),
            (table, 301): (4096, 1, 0, 0),
            (bare, 302): (640, 1, 0, 0),
        },
        rss=64 * MIB,
    )
    return load_trace(t.close())


def test_a_cuda_call_is_one_row(tmp_path):
    doc = A.build_report(_trace(tmp_path / "c.allocscope"))
    rows = {(x["function"], x.get("call"), x["line"]): x for x in doc["locations"]}
    dev = rows["device_weights", "cuMemAlloc_v2", 14]
    # the device bytes and the driver's mallocs inside the same call: one row, both said
    assert (dev["device_live_bytes"], dev["device_alloc_count"], dev["live_bytes"], dev["alloc_count"]) == (
        2 * 256 * MIB,
        3,
        3000,
        3,
    )
    assert dev["location"] == "device_weights|cudaalloc|cudaalloc.c:14|call=cuMemAlloc_v2"
    assert set(dev["sources"]) == {"cuda-device", "heap"}
    pin = rows["host_staging", "cuMemHostAlloc", 22]
    assert (pin["live_bytes"], pin["alloc_count"], set(pin["sources"])) == (8 * MIB + 2000, 2, {"cuda-pinned", "heap"})
    # no second row of the same line without the call, the free's bookkeeping its own row
    assert not [k for k in rows if k[0] in ("device_weights", "host_staging") and k[1] is None]
    assert rows["device_weights", "cuMemFree_v2", 15]["live_bytes"] == 0
    assert rows["load_table", None, 30]["live_bytes"] == 4096
    # the driver thread's stack without any symbol: the driver's row, no bare address
    bare = [x for x in doc["locations"] if x.get("inside")]
    assert [(x["function"], x["live_bytes"], x["key_quality"]) for x in bare] == [
        ("[no caller with a symbol]", 640, "inside")
    ]
    assert not [x for x in doc["locations"] if "+0x" in x["function"]]
    text = to_text(doc)
    assert "device_weights cudaalloc.c:14 via cuMemAlloc_v2" in text
    assert "inside libcuda.so.580.159.04, no caller with a symbol" in text
    # the unfolded stack says the call: its frame put back on the device bytes' stack
    site = next(s for s in doc["sites"] if s["device_live_bytes"])
    assert site["frames"][0]["call"] == "cuMemAlloc_v2"


def test_two_calls_on_one_line_are_left_apart(tmp_path):
    """Two different calls whose stacks end at the same (function, line) cannot be told apart
    by frames: the device bytes keep their row without a call."""
    t = SynthTrace(tmp_path / "two.allocscope", module=PROG)
    t.cuda_driver(DRIVER)
    t.thread(301, "x")
    libc = "/lib/libc.so.6"
    files, lines = [None, None, SRC, SRC], [None, None, 9, 40]
    dev = t.stack(["both", "main"], files=[SRC, SRC], lines=[9, 40])
    a = t.stack(
        ["malloc", "cuMemAlloc_v2", "both", "main"], files=files, lines=lines, module=[libc, DRIVER, PROG, PROG]
    )
    b = t.stack(
        ["malloc", "cuMemAllocManaged", "both", "main"], files=files, lines=lines, module=[libc, DRIVER, PROG, PROG]
    )
    t.interval({(dev, 301, "cuda-device"): (MIB, 1, 0, 0), (a, 301): (10, 1, 0, 0), (b, 301): (20, 1, 0, 0)})
    doc = A.build_report(load_trace(t.close()))
    calls = sorted((x.get("call") or "", x["device_live_bytes"]) for x in doc["locations"])
    assert calls == [("", MIB), ("cuMemAllocManaged", 0), ("cuMemAlloc_v2", 0)]
