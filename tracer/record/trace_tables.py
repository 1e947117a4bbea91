"""One small writer per trace table, each keeping the little state its table needs between
snapshots (what was written last, what is new). The Recorder calls them from its snapshot
(tracer/record/recorder.py); each returns the part to write, or None when there is nothing new.

Tables and columns: common/tracefile/format.py. Everything here is per distinct site, stack,
thread or mapping — never per allocation: per-allocation data stays in the kernel.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from common.tracefile import format as F

from ..allocators.arenas import Heap, Pagemap, chunk_ranges, find_heaps, outside_heaps
from ..base import layout as L
from ..process import procfs
from ..process.mappings import MapIndex
from ..unwind.rows import STACK_DWARF
from .regions import RegionTracker

API = L.API_NAMES
EVT = L.EVENT_NAMES
SRC = L.SOURCE_NAMES

SiteKey = tuple[int, int, str]  # (stack id, allocating tid, source)


def table_part(name: str, rows: list[tuple], seq: int) -> pa.Table:
    """A part of table `name` from rows holding every column after `seq`, in schema order."""
    names = F.SCHEMAS[name].names
    cols = {n: [r[i - 1] for r in rows] if i else [seq] * len(rows) for i, n in enumerate(names)}
    return pa.table(cols, schema=F.SCHEMAS[name])


class SiteTable:
    """Cumulative counters per (stack, thread, source): the kernel's (allocator API, mmap-family
    regions, sampled faults) plus what the rare-shape tracker allocated and freed. A part holds
    the rows that changed."""

    def __init__(self) -> None:
        self.current: dict[SiteKey, tuple] = {}

    def update(
        self, kernel_sites: list[tuple[np.ndarray, np.ndarray]], tracker: RegionTracker, names: dict[int, str]
    ) -> list[SiteKey]:
        """Merge this snapshot's counters (source ids named by `names`); the keys that changed
        since the last one."""
        now: dict[SiteKey, tuple] = {}
        for keys, vals in kernel_sites:
            for k, v in zip(keys.tolist(), vals.tolist()):
                now[(k[0], k[1], names.get(k[2], str(k[2])))] = tuple(v)
        for key, st in tracker.sites.items():
            mine = st.as_tuple()
            k = now.get(key)
            if k is None:
                now[key] = mine
            else:  # counters add up; the peak is the larger of the two views and the live now
                live = k[0] + mine[0] - k[2] - mine[2]
                now[key] = (k[0] + mine[0], k[1] + mine[1], k[2] + mine[2], k[3] + mine[3], max(k[4], mine[4], live))
        changed = [k for k, v in now.items() if self.current.get(k) != v]
        self.current = now
        return changed

    def part(self, seq: int, changed: list[SiteKey]) -> pa.Table | None:
        if not changed:
            return None
        return table_part("sites", [(*k, *self.current[k]) for k in changed], seq)


class StackTable:
    """Frames of the stacks first named in this snapshot, each frame's module, build ID and
    file offset resolved against the maps of the moment."""

    def __init__(self) -> None:
        self.known: set[int] = {0}

    def new_ids(self, wanted: set[int]) -> list[int]:
        return sorted(s for s in wanted if s not in self.known)

    def columns(self, stacks: dict[int, tuple[int, int, list[int]]], index: MapIndex) -> dict[str, list]:
        """stack id -> (flags, extra, ips) as the probes keep them, to the `stacks` columns."""
        cols: dict[str, list] = {k: [] for k in F.SCHEMAS["stacks"].names}
        for sid, (flags, extra, ips) in stacks.items():
            # DWARF stacks: `extra` marks frames found by a frame-pointer step (syscall = 2).
            frames = [(ip, 2 if flags & STACK_DWARF and extra >> i & 1 else 0) for i, ip in enumerate(ips)]
            # In a syscall the frame-pointer walk skips the wrapper's caller; the word at the
            # user sp is its return address when it points into code.
            if flags & L.STACK_SYSCALL and extra and index.is_code(extra) and (len(ips) < 2 or ips[1] != extra):
                frames.insert(1, (extra, 1))
            for i, (ip, sc) in enumerate(frames):
                mod, bid, off = index.resolve(ip)
                for name, v in (
                    ("stack_id", sid),
                    ("idx", i),
                    ("ip", ip),
                    ("module", mod),
                    ("build_id", bid),
                    ("offset", off),
                    ("syscall", sc),
                    ("function", None),
                    ("file", None),
                    ("line", None),
                ):
                    cols[name].append(v)
            self.known.add(sid)
        return cols


class ThreadTable:
    """Thread names: seen at the attach or when a thread first allocates, renamed, exited."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.rows: list[tuple] = []  # (seq, ts_ns, tid, name, event), not written yet

    def seen(self, seq: int, ts_ns: int, names: dict[int, str]) -> None:
        for tid, name in names.items():
            self.names[tid] = name
            self.rows.append((seq, ts_ns, tid, name, "seen"))

    def event(self, seq: int, ts_ns: int, tid: int, name: str, event: str) -> None:
        self.names[tid] = name
        self.rows.append((seq, ts_ns, tid, name, event))

    def exec_renamed(self, tid: int, comm: str) -> None:
        """exec renamed the thread just before (task_rename): what it allocated was the old
        program's, under its old name; drop that rename."""
        for i in range(len(self.rows) - 1, -1, -1):
            if self.rows[i][2] == tid and self.rows[i][4] == "rename":
                if self.rows[i][3] == comm:
                    del self.rows[i]
                break

    def look_up(self, pid: int, tids: set[int], seq: int, ts_ns: int) -> None:
        """Names of threads not seen yet, from /proc (they may be gone already)."""
        for tid in tids - set(self.names):
            try:
                self.seen(seq, ts_ns, {tid: procfs.comm(pid, tid)})
            except OSError:
                continue

    def part(self, seq: int) -> pa.Table | None:
        if not self.rows:
            return None
        rows, self.rows = self.rows, []
        return table_part("threads", [r[1:] for r in rows], seq)


class EventLog:
    """What reached the tracer one by one (malloc_trim, code mapped, exec, rare mmap shapes)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add(self, ev: L.Event, released: int = 0) -> None:
        self.rows.append(
            (
                ev.ts_ns,
                EVT.get(ev.type, str(ev.type)),
                ev.tid,
                ev.addr,
                ev.len,
                ev.addr2,
                ev.len2,
                ev.ret,
                ev.flags,
                ev.prot,
                ev.fd,
                API.get(ev.in_api, ""),
                ev.stack_id,
                released,
            )
        )

    def stack_ids(self) -> set[int]:
        return {r[12] for r in self.rows}

    def tids(self) -> set[int]:
        return {r[2] for r in self.rows}

    def part(self, seq: int) -> pa.Table | None:
        if not self.rows:
            return None
        rows, self.rows = self.rows, []
        return table_part("events", rows, seq)


def flow_part(seq: int, kernel: tuple[np.ndarray, np.ndarray], tracker: RegionTracker) -> pa.Table | None:
    """(allocating thread, freeing thread) frees, cumulative: the kernel's plus the tracker's."""
    fk, fv = kernel
    flows: dict[tuple[int, int], list[int]] = {}
    for k, v in zip(fk.tolist(), fv.tolist()):
        flows[(k[0], k[1])] = list(v)
    for k, v in tracker.flows.items():
        f = flows.setdefault(k, [0, 0, 0, 0])
        f[0] += v[0]
        f[1] += v[1]
        f[2] += v[2]
        f[3] = max(f[3], v[3])
    if not flows:
        return None
    return table_part("flows", [(*k, *v) for k, v in sorted(flows.items())], seq)


class ReleaseTable:
    """Memory handed back to the kernel per (thread, kind, allocator call, stack of the region
    unmapped), cumulative: the rows that changed."""

    def __init__(self) -> None:
        self.last: dict[tuple[int, int, int, int], tuple] = {}

    def part(self, seq: int, kernel: tuple[np.ndarray, np.ndarray]) -> pa.Table | None:
        rows = []
        for k, v in zip(*(a.tolist() for a in kernel)):
            key, val = (k[0], k[1], k[2], k[3]), tuple(v)
            if self.last.get(key) != val:
                self.last[key] = val
                rows.append(
                    (key[0], EVT.get(key[1], str(key[1])), API.get(key[2], ""), val[0], val[1], val[2], val[3], key[3])
                )
        return table_part("releases", rows, seq) if rows else None

    def stack_ids(self) -> set[int]:
        return {k[3] for k in self.last if k[3]}


class WaitTable:
    """Off-CPU waits of the target's threads: `waits`, cumulative per (thread, stack), the rows
    that changed; `blocked`, the threads blocked at the snapshot (at least the threshold long)."""

    def __init__(self, wait_min_ns: int) -> None:
        self.wait_min_ns = wait_min_ns
        self.last: dict[tuple[int, int], tuple] = {}
        self.new_stacks: set[int] = set()
        self.new_tids: set[int] = set()
        self.blocked: list[tuple] = []  # the last snapshot's blocked threads (the `blocked` rows)
        self.ignore_tids: set[int] = set()  # --inject: the agent's watchdog, not the program's

    def parts(
        self, seq: int, kernel: tuple[np.ndarray, np.ndarray], offcpu: tuple[np.ndarray, np.ndarray], now_ns: int
    ) -> tuple[pa.Table | None, pa.Table | None]:
        rows = []
        ignore = self.ignore_tids
        for k, v in zip(*(a.tolist() for a in kernel)):
            key, val = (k[1], k[0]), tuple(v)
            if key[0] in ignore:
                continue
            if self.last.get(key) != val:
                if key not in self.last:
                    self.new_stacks.add(key[1])
                    self.new_tids.add(key[0])
                self.last[key] = val
                rows.append((*key, *val))
        blocked = []
        for tid, v in zip(*(a.tolist() for a in offcpu)):
            if tid in ignore:
                continue
            since, sid, state = v[0], v[1], v[2]
            if since and now_ns - since >= self.wait_min_ns:  # since 0: running (its entry kept)
                blocked.append((tid, sid, since, now_ns - since, "D" if state == 2 else "S"))
                self.new_stacks.add(sid)
                self.new_tids.add(tid)
        self.blocked = blocked
        return (
            table_part("waits", rows, seq) if rows else None,
            table_part("blocked", blocked, seq) if blocked else None,
        )

    def take_new(self) -> tuple[set[int], set[int]]:
        """Stacks and threads first named since the last call (for the stacks and threads tables)."""
        out = (self.new_stacks - {0}, self.new_tids)
        self.new_stacks, self.new_tids = set(), set()
        return out


class HeapMeter:
    """Resident bytes of glibc's heaps, every interval within a page budget; at the end also per
    heap and per allocator-mmapped chunk (the `heaps` table)."""

    def __init__(self, pid: int, budget_pages: int, glibc: bool) -> None:
        self.pid, self.budget, self.glibc = pid, budget_pages, glibc
        self.live_blocks: tuple[np.ndarray, np.ndarray] | None = None  # (addresses, sizes) outside heaps
        self.heaps: list[Heap] | None = None  # as found at the last measure

    def measure(
        self, seq: int, final: bool, maps: list[procfs.Mapping] | None = None, same_heaps: bool = False
    ) -> tuple[int, float, pa.Table | None]:
        """(resident bytes of the heaps, ms it took, the `heaps` part at the end); `maps`: the
        snapshot's read of /proc/PID/maps (None: read here); `same_heaps`: the heaps are those of
        the last measure (no mapping can have changed since: tracer/record/readgate.py)."""
        t0 = time.perf_counter()
        try:
            if same_heaps and self.heaps is not None:
                heaps = self.heaps
            else:
                self.heaps = None
                heaps = find_heaps(self.pid, procfs.read_maps(self.pid) if maps is None else maps)
                self.heaps = heaps
            spans = [(h.start, h.end, h.reserved_end, h.kind, h.arena) for h in heaps]
            if final and self.live_blocks is not None and self.glibc:
                spans += [(lo, hi, hi, "mmap", "mmap") for lo, hi in chunk_ranges(self.live_blocks, heaps)]
            with Pagemap(self.pid, self.budget) as pm:
                res = pm.resident_many([(sp[0], sp[1]) for sp in spans])
                est = int(pm.estimated)
        except OSError:
            return -1, (time.perf_counter() - t0) * 1e3, None
        total = sum(r for sp, r in zip(spans, res) if sp[3] != "mmap")
        ms = (time.perf_counter() - t0) * 1e3
        part = table_part("heaps", [(*sp, r, est) for sp, r in zip(spans, res)], seq) if final else None
        return total, ms, part


class LiveTable:
    """The final live table, streamed: the kernel's live map is read in chunks straight into
    preallocated numpy buffers (Probes.iter_live) and every chunk becomes one Parquet row group
    at once, so the tracer never holds the whole table — millions of rows are normal; what it
    takes is a few chunks (64 Ki blocks each: 2.5 MiB of read buffer, ~3 MiB of Arrow columns),
    ~30 MiB of peak RSS in all, whatever the number of blocks. No per-row Python objects. Then
    GPU allocations and registrations, then the mmap-family regions (kernel side and tracker).
    Kept for the `heaps` table: the blocks outside glibc's heaps (its mmapped chunks; each a
    mapping, so few)."""

    def __init__(self, probes, tracker: RegionTracker, source_names: dict[int, str]) -> None:
        self.probes, self.tracker = probes, tracker
        self.names = pa.array([API.get(i, str(i)) for i in range(max(API) + 1)])
        top = max(source_names) + 1
        self.sources = pa.array([source_names.get(i, str(i)) for i in range(top)])

    def _batch(self, seq: int, addr: np.ndarray, vals: np.ndarray) -> pa.RecordBatch:
        api = vals["api"].astype(np.int32)
        api[(api < 0) | (api >= len(self.names))] = 0
        src = vals["source"].astype(np.int32)
        src[(src < 0) | (src >= len(self.sources))] = 0
        return pa.record_batch(
            [
                pa.array(np.full(len(addr), seq, dtype=np.int32)),
                pa.array(addr.astype(np.uint64)),
                pa.array(vals["size"].astype(np.int64)),
                pa.array(vals["stack_id"].astype(np.uint64)),
                pa.array(vals["tid"].astype(np.uint32)),
                pa.array(vals["ts_ns"].astype(np.int64)),
                self.names.take(pa.array(api)),
                self.sources.take(pa.array(src)),
            ],
            schema=F.SCHEMAS["live"],
        )

    def batches(self, seq: int, heaps, kept: list[tuple[np.ndarray, np.ndarray]]):
        heap_api = L.enum("AS_API_MMAP")  # the malloc family's apis are below it
        for keys, vals in self.probes.iter_live():
            if heaps is not None:  # glibc's own blocks outside its heaps: its mmapped chunks
                out = outside_heaps(keys, heaps) & (vals["source"] == L.enum("AS_SRC_HEAP")) & (vals["api"] < heap_api)
                kept.append((keys[out].astype(np.uint64), vals["size"][out].astype(np.int64)))
            yield self._batch(seq, keys, vals)  # keys is a view of the read buffer: written now
        dk, dv = self.probes.read_dev_live()  # GPU memory and pinned registrations
        if len(dk):
            yield self._batch(seq, dk["value"], dv)
        reg = self.tracker.live()
        keys, vals = self.probes.read_regions()
        for start, v in zip(keys.tolist(), vals.tolist()):
            reg.append((start, v[0] - start, v[1], v[3], v[2], SRC.get(v[4], "mmap")))
        if reg:
            yield pa.RecordBatch.from_pydict(
                {
                    "seq": [seq] * len(reg),
                    "addr": [r[0] for r in reg],
                    "size": [r[1] for r in reg],
                    "stack_id": [r[2] for r in reg],
                    "tid": [r[3] for r in reg],
                    "ts_ns": [r[4] for r in reg],
                    "api": [r[5] for r in reg],
                    "source": [r[5] for r in reg],
                },
                schema=F.SCHEMAS["live"],
            )

    def write(self, writer, seq: int, pid: int | None, read_maps=None) -> tuple[np.ndarray, np.ndarray] | None:
        """Stream the part; the blocks outside glibc's heaps when `pid` (glibc, readable);
        `read_maps()`: the snapshot's maps (default: /proc/PID/maps read here)."""
        heaps = None
        if pid is not None:
            try:
                heaps = find_heaps(pid, read_maps() if read_maps is not None else procfs.read_maps(pid))
            except OSError:
                heaps = None
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        writer.write_part_batches("live", seq, F.SCHEMAS["live"], self.batches(seq, heaps, kept))
        if heaps is None:
            return None
        return (
            np.concatenate([a for a, _ in kept]) if kept else np.empty(0, np.uint64),
            np.concatenate([s for _, s in kept]) if kept else np.empty(0, np.int64),
        )
