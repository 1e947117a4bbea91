"""A Python service whose memory is known (tests/test_python_bpf.py, docs/python.md).

Prints "ready", waits for SIGUSR1 (the tracer attached), warms up (transient), then: a worker thread ("compactor")
keeps SEGMENTS blocks of SEGMENT bytes made at `compact_segment`; the main thread keeps
BATCHES bytearrays of BATCH bytes made at `load_batch`, called from `handle_request`, and
INFLATES buffers of INFLATE bytes that zlib (a C extension) made, called at `inflate`; a thread
started after the attach keeps LATES bytearrays of LATE bytes made at `late_block`; a generator
(`chunks`), a key function `sorted` calls back (`sort_key`) and a coroutine (`fetch`) keep
theirs; `map_region` keeps MAPS anonymous mappings of MAP bytes (Python's mmap module: a
system call, no allocator), every page touched; `descend` keeps one bytearray made 32 Python
frames deep and one 43 deep (the probe keeps 32); exec'd code keeps SNIP bytes; a ThreadPoolExecutor's threads, started
on its first submits, POOLS blocks made at `pool_block`; a subinterpreter, SUB bytes made at its
`sub_block`, entered at `run_in_sub`. Prints
"done" with its own counts and keeps everything until killed. argv[1] scales the batches (the
diff of two runs). The `# line:` comments are how the test finds the lines.
"""

import asyncio
import mmap
import signal
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

BATCH = 4 << 20
BATCHES = 13 * (int(sys.argv[1]) if len(sys.argv) > 1 else 1)  # a prime count, scaled for the diff
SEGMENT = 1 << 20
SEGMENTS = 11
INFLATE = 2 << 20
INFLATES = 7
held: list = []


def load_batch(n):
    return bytearray(n)  # line: load_batch


def handle_request(i):
    held.append(load_batch(BATCH))  # line: handle_request


def compact_segment():
    return b"\x01" * SEGMENT  # line: compact_segment


def compactor(done):
    for _ in range(SEGMENTS):
        held.append(compact_segment())  # line: compactor
    done.set()


LATE = 512 << 10
LATES = 5


def late_block():
    return bytearray(LATE)  # line: late_block


def late_worker():
    """A thread started after the tracer attached: its PyThreadState is found by the next walk."""
    import time

    time.sleep(1.2)  # the thread walk runs at least every snapshot (0.5 s in the test)
    for _ in range(LATES):
        held.append(late_block())  # line: late_worker


CHUNK = 256 << 10
CHUNKS = 3
KEYS = 5
FETCH = 384 << 10
FETCHES = 2


def chunks(n):
    for _ in range(n):
        yield bytearray(CHUNK)  # line: chunk_gen


def collect():
    held.extend(chunks(CHUNKS))  # line: collect


def sort_key(i):
    held.append(bytearray(CHUNK))  # line: sort_key
    return -i


def sort_keys():
    return sorted(range(KEYS), key=sort_key)  # line: sort_keys


async def fetch():
    return bytearray(FETCH)  # line: fetch


async def serve():
    for _ in range(FETCHES):
        held.append(await fetch())  # line: serve


def inflate(payload):
    return zlib.decompress(payload)  # line: inflate


MAP = 3 << 20
MAPS = 3
PAGE = mmap.PAGESIZE


def map_region():
    m = mmap.mmap(-1, MAP)  # line: map_region
    for off in range(0, MAP, PAGE):  # every page touched (first touches: residency mode's samples)
        m[off] = 1  # line: map_touch
    return m


def map_buffers():
    for _ in range(MAPS):
        held.append(map_region())  # line: map_buffers


WHOLE = 640 << 10  # made 32 Python frames deep: every frame kept
CUT = 704 << 10  # made 43 deep: the outer 11 cut (AS_PY_DEPTH 32), and said so


def descend(n, size):
    if n == 0:
        return bytearray(size)  # line: descend_leaf
    return descend(n - 1, size)  # line: descend


POOL = 288 << 10
POOLS = 6


def pool_block(i):
    return bytearray(POOL)  # line: pool_block


SUB = 352 << 10
# run in a subinterpreter the main thread entered: its frames, then the main interpreter's
SUB_CODE = (
    f"import builtins, time\ndef sub_block():\n    return bytearray({SUB})\nbuiltins.kept = sub_block()\n"
    "time.sleep(0.2)\n"
)


def run_in_sub(interp):
    try:
        import _xxsubinterpreters as si
    except ImportError:  # 3.13
        import _interpreters as si
    si.run_string(interp, SUB_CODE)  # line: run_in_sub


SNIP = 320 << 10
# code run once and freed at once (a module body at import, exec'd code): its code object is
# read when the probe stores the stack (AS_EV_PYSTACK), not at the next snapshot (0.5 s later)
SNIPPET = "import time\nheld.append(bytearray(SNIP))\ntime.sleep(0.2)\n"


def warm_up(payload, seconds=1.5):
    """Transient work (all freed) while the tracer builds the unwind tables of libpython and zlib
    the first stacks cross: the held allocations after it have whole native stacks."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        zlib.decompress(payload)
        bytearray(1 << 16)
        time.sleep(0.01)


def main():
    go = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    payload = zlib.compress(b"\x00" * INFLATE)
    worker_go, worker_done = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (worker_go.wait(), compactor(worker_done)), name="compactor")
    worker.start()
    try:
        import _xxsubinterpreters as si
    except ImportError:  # 3.13
        import _interpreters as si
    sub = si.create()
    print("ready", flush=True)
    go.wait()
    late = threading.Thread(target=late_worker, name="late")
    late.start()
    warm_up(payload)
    worker_go.set()
    for i in range(BATCHES):
        handle_request(i)
    for _ in range(INFLATES):
        held.append(inflate(payload))
    collect()  # a generator
    sort_keys()  # C (sorted) calling back into Python
    asyncio.run(serve())  # coroutines
    map_buffers()  # the mmap family
    held.append(descend(29, WHOLE))  # line: whole (30 frames of descend, main, <module>: 32)
    held.append(descend(40, CUT))  # line: cut (43 frames)
    exec(compile(SNIPPET, "<snippet>", "exec"), {"held": held, "SNIP": SNIP})  # line: snippet
    run_in_sub(sub)
    with ThreadPoolExecutor(3) as pool:  # its threads start on the first submits and allocate at once
        held.extend(pool.map(pool_block, range(POOLS)))
    worker_done.wait()
    late.join()
    print(
        f"done batches={BATCHES * BATCH} segments={SEGMENTS * SEGMENT} inflates={INFLATES * INFLATE} "
        f"lates={LATES * LATE} chunks={CHUNKS * CHUNK} keys={KEYS * CHUNK} fetches={FETCHES * FETCH} "
        f"maps={MAPS * MAP} whole={WHOLE} cut={CUT} snip={SNIP} pools={POOLS * POOL} sub={SUB} "
        f"pid={threading.get_native_id()} worker={worker.native_id}",
        flush=True,
    )
    threading.Event().wait()


if __name__ == "__main__":
    main()  # line: module
