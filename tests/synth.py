"""Build allocscope traces with known contents, without BPF or root, through the real writer.

    t = SynthTrace(tmp_path / "a.allocscope", labels={"pw": "10"})
    s = t.stack(["make_partition", "worker_main", "start_thread"])     # innermost first
    t.thread(101, "pworker-1")
    t.interval(sites={(s, 101): (alloc_bytes, alloc_count, free_bytes, free_count)}, rss=10 << 20)
    ...
    t.live_block(s, 101, size=4096, at_s=2.5)   # an allocation still outstanding at the end
    t.close()                      # writes the live table and marks the trace complete

Site counters are cumulative, as the tracer writes them; `interval` writes only the rows that
changed, like the tracer. Interval `seq` ends at MONO0 + seq * interval_s (CLOCK_MONOTONIC ns),
so a live block allocated at `at_s` is `n * interval_s - at_s` seconds old at the end.
`id_base`/`ip_base` give the same code different stack ids and addresses, as another run has.

GPU memory, as the tracer writes it: a site key's source may be any of the trace's names
('cuda-device', 'cuda-pinned', 'cuda-managed', 'shmem', 'device'...). Each interval row gets the
tracer's totals from the sites: `live_bytes` = host memory only (heap + mmap family + CUDA host),
`cuda_host_live_bytes` (cuda-pinned and cuda-managed sites: made through the driver API),
`device_live_bytes` and `device_peak_bytes` (cuda-device sites), and `live_count` counts every
block, GPU allocations included, as the kernel's counter does. `t.cuda_driver(...)` records
meta.json `probes.cuda`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from common.tracefile import format as F
from common.tracefile.writer import TraceWriter

MONO0 = 1_000_000_000_000
DEVICE = ("cuda-device",)
CUDA_HOST = ("cuda-pinned", "cuda-managed")


class SynthTrace:
    def __init__(
        self,
        path,
        labels: dict | None = None,
        exe: str = "/usr/bin/synthd",
        pid: int = 4242,
        interval_s: float = 1.0,
        module: str = "/usr/bin/synthd",
        id_base: int = 0x1000,
        ip_base: int = 0x400000,
    ) -> None:
        self.path = str(path)
        self.w = TraceWriter(self.path)
        self.module = module
        self.interval_s = interval_s
        self.id_base = id_base
        self.ip_base = ip_base
        self.seq = 0
        self.meta = {
            "format": F.FORMAT,
            "version": F.VERSION,
            "complete": False,
            "labels": dict(labels or {}),
            "interval_s": interval_s,
            "clock": {"monotonic_ns": MONO0, "wall_s": 1.7e9},
            "target": {"pid": pid, "comm": exe.rsplit("/", 1)[-1][:15], "exe": exe},
            "probes": {
                "allocator": "/lib/x86_64-linux-gnu/libc.so.6",
                "allocator_kind": "glibc",
                "attached": ["malloc", "free"],
                "aliases": {},
                "skipped": {},
                "tracepoints": [],
            },
        }
        self.w.write_meta(self.meta)
        self._stacks: dict[tuple, int] = {}
        self._stack_rows: list[dict] = []
        self._prev: dict = {}
        self._state: dict = {}
        self._threads: list[tuple] = []
        self._events: list[tuple] = []
        self._live: list[dict] = []
        self._live_batches: list[pa.Table] = []
        self._heaps: list[tuple] = []
        self.peak_live = 0
        self.device_peak = 0

    def stack(
        self,
        functions: list[str],
        files: list[str] | None = None,
        lines: list[int] | None = None,
        module: str | list[str] | None = None,
    ) -> int:
        """Register a stack (function names innermost first); returns its stack id. `module`: of
        every frame (default: the trace's), or a list, one per frame."""
        modules = list(module) if isinstance(module, list) else [module or self.module] * len(functions)
        key = (tuple(functions), tuple(files or ()), tuple(lines or ()), tuple(modules))
        if key in self._stacks:
            return self._stacks[key]
        sid = self.id_base + len(self._stacks) * 7919  # arbitrary, like a hash
        self._stacks[key] = sid
        for i, fn in enumerate(functions):
            self._stack_rows.append(
                {
                    "stack_id": sid,
                    "idx": i,
                    "ip": self.ip_base + 16 * len(self._stack_rows),
                    "module": modules[i],
                    "build_id": "",
                    "offset": 0x1000 + 16 * len(self._stack_rows),
                    "syscall": 0,
                    "function": fn,
                    "file": files[i] if files else None,
                    "line": lines[i] if lines else None,
                }
            )
        return sid

    def cuda_driver(
        self,
        module: str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        attached: tuple[str, ...] = ("cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostAlloc"),
        skipped: dict | None = None,
    ) -> None:
        """meta.json `probes.cuda`, as the tracer writes it when it probed a driver."""
        self.meta["probes"]["cuda"] = {
            "module": module,
            "attached": list(attached),
            "skipped": dict(skipped or {}),
            "placement": {},
        }
        self.w.write_meta(self.meta)

    def thread(self, tid: int, name: str, event: str = "seen") -> None:
        self._threads.append((tid, name, event))

    def trim(self, tid: int, at_s: float, duration_s: float, ret: int = 1) -> None:
        self._events.append(("trim", tid, at_s, duration_s, ret))

    def live_block(
        self,
        stack_id: int,
        tid: int,
        size: int,
        at_s: float,
        source: str = "heap",
        api: str = "malloc",
        addr: int | None = None,
    ) -> None:
        """An allocation outstanding at the end, made `at_s` seconds after the start; written
        into the final `live` table by close()."""
        addr = 0x7F0000000000 + 64 * len(self._live) if addr is None else addr
        self._live.append(
            {
                "addr": addr,
                "size": size,
                "stack_id": stack_id,
                "tid": tid,
                "ts_ns": MONO0 + int(at_s * 1e9),
                "api": api,
                "source": source,
            }
        )

    def live_blocks(self, stack_ids, tids, sizes, at_s, addrs=None, source: str = "heap", api: str = "malloc") -> None:
        """Many outstanding allocations at once (numpy arrays or scalars broadcast to the
        length of `sizes`), for live tables of millions of rows: written by close() as one
        part of several row groups, like the tracer's streamed live table."""

        n = len(sizes)

        def col(v, dt):
            return np.broadcast_to(np.asarray(v, dtype=dt), (n,))

        addr = (
            np.asarray(addrs, dtype=np.uint64)
            if addrs is not None
            else np.uint64(0x7E0000000000) + np.arange(n, dtype=np.uint64) * np.uint64(64)
        )
        ts = (MONO0 + np.round(col(at_s, np.float64) * 1e9)).astype(np.int64)
        self._live_batches.append(
            pa.table(
                {
                    "seq": pa.array(np.zeros(n, dtype=np.int32)),
                    "addr": pa.array(addr),
                    "size": pa.array(col(sizes, np.int64)),
                    "stack_id": pa.array(col(stack_ids, np.uint64)),
                    "tid": pa.array(col(tids, np.uint32)),
                    "ts_ns": pa.array(ts),
                    "api": pa.array([api] * n, pa.string()) if n < 1000 else pa.repeat(api, n),
                    "source": pa.repeat(source, n),
                },
                schema=F.SCHEMAS["live"],
            )
        )

    def _columns(self, part: str, seq: int, /, **cols: list) -> None:
        """Write the `part` of interval `seq` from its columns (the seq column added; positional
        parameters, since a column may be called `name`)."""
        n = len(next(iter(cols.values())))
        self.w.write_part(part, seq, pa.table({"seq": [seq] * n, **cols}, schema=F.SCHEMAS[part]))

    def heaps(self, rows: list[tuple]) -> None:
        """The tracer's end-of-run `heaps` table: (start, end, reserved_end, kind, arena,
        resident_bytes, estimated) per glibc heap or mmapped chunk range."""
        self._heaps = list(rows)

    def interval(
        self,
        sites: dict,
        rss: int = 0,
        flows: dict | None = None,
        lost: dict | None = None,
        shmem: int = 0,
        file: int = 0,
        peak_snapshot: bool = False,
    ) -> None:
        """sites: {(stack_id, tid) or (stack_id, tid, source): (alloc_bytes, alloc_count,
        free_bytes, free_count)} cumulative; keys not given keep their previous values.
        lost: cumulative lost_* counters to set in this interval's row. rss: RSS in all, of
        which `shmem` is RssShmem, `file` RssFile and the rest RssAnon. peak_snapshot: the row
        is a peak snapshot (tracer/record/peaks.py), meta.json gets the margin."""
        self.seq += 1
        seq = self.seq
        for k, v in sites.items():
            key = k if len(k) == 3 else (k[0], k[1], "heap")
            prev_peak = self._state.get(key, (0, 0, 0, 0, 0))[4]
            self._state[key] = (*v, max(prev_peak, v[0] - v[2]))
        rows = [(k, v) for k, v in self._state.items() if self._prev.get(k) != v]
        self._prev = dict(self._state)
        if rows:
            self._columns(
                "sites",
                seq,
                stack_id=[k[0] for k, _ in rows],
                tid=[k[1] for k, _ in rows],
                source=[k[2] for k, _ in rows],
                alloc_bytes=[v[0] for _, v in rows],
                alloc_count=[v[1] for _, v in rows],
                free_bytes=[v[2] for _, v in rows],
                free_count=[v[3] for _, v in rows],
                peak_live_bytes=[v[4] for _, v in rows],
            )
        if self._stack_rows:
            self.w.write_part("stacks", seq, pa.Table.from_pylist(self._stack_rows, schema=F.SCHEMAS["stacks"]))
            self._stack_rows = []
        if self._threads:
            r = self._threads
            self._columns(
                "threads",
                seq,
                ts_ns=[MONO0] * len(r),
                tid=[x[0] for x in r],
                name=[x[1] for x in r],
                event=[x[2] for x in r],
            )
            self._threads = []
        if self._events:
            rows_ev = [
                {
                    "seq": seq,
                    "ts_ns": MONO0 + int(at * 1e9),
                    "type": typ,
                    "tid": tid,
                    "addr": 0,
                    "len": 0,
                    "addr2": 0,
                    "len2": int(dur * 1e9),
                    "ret": ret,
                    "flags": 0,
                    "prot": 0,
                    "fd": -1,
                    "in_api": "malloc_trim",
                    "stack_id": 0,
                    "released_bytes": 0,
                }
                for typ, tid, at, dur, ret in self._events
            ]
            self.w.write_part("events", seq, pa.Table.from_pylist(rows_ev, schema=F.SCHEMAS["events"]))
            self._events = []
        if flows:
            items = sorted(flows.items())
            self._columns(
                "flows",
                seq,
                alloc_tid=[k[0] for k, _ in items],
                free_tid=[k[1] for k, _ in items],
                bytes=[v[0] for _, v in items],
                count=[v[1] for _, v in items],
                wait_ns_sum=[v[2] for _, v in items],
                wait_ns_max=[v[3] for _, v in items],
            )

        def live_of(sources=None, but=()):
            return sum(
                v[0] - v[2] for k, v in self._state.items() if (sources is None or k[2] in sources) and k[2] not in but
            )

        live = live_of(but=DEVICE)
        count = sum(v[1] - v[3] for v in self._state.values())
        heap = live_of(("heap",))
        cuda_host = live_of(CUDA_HOST)
        device = live_of(DEVICE)
        self.peak_live = max(self.peak_live, live)
        self.device_peak = max(self.device_peak, device)
        row = {
            "seq": seq,
            "ts_ns": MONO0 + int(seq * self.interval_s * 1e9),
            "elapsed_s": seq * self.interval_s,
            "rss_bytes": rss,
            "rss_anon_bytes": rss - shmem - file,
            "rss_file_bytes": file,
            "rss_shmem_bytes": shmem,
            "hwm_bytes": rss,
            "heap_live_bytes": heap,
            "heap_peak_bytes": self.peak_live,
            "mmap_live_bytes": live - heap - cuda_host,
            "cuda_host_live_bytes": cuda_host,
            "device_live_bytes": device,
            "device_peak_bytes": self.device_peak,
            "live_bytes": live,
            "live_count": count,
            "target_alive": 1,
            "lost_live_full": 0,
            "lost_stack_full": 0,
            "n_allocs": 0,
            "n_frees": 0,
        }
        row.update(lost or {})
        if peak_snapshot:
            row["peak_snapshot"] = 1
            self.meta.setdefault("peaks", {"margin_fraction": 0.01, "margin_min_bytes": 1 << 20})
        self.w.write_part("intervals", seq, pa.table({k: [v] for k, v in row.items()}))

    def close(self, complete: bool = True) -> str:
        """Write the final live table (complete traces only, like the tracer) and meta.json."""
        if complete and (self._live or self._live_batches):
            rows = [{"seq": self.seq, **r} for r in self._live]
            tabs = [pa.Table.from_pylist(rows, schema=F.SCHEMAS["live"])] + [
                t.set_column(0, "seq", pa.array(np.full(t.num_rows, self.seq, dtype=np.int32)))
                for t in self._live_batches
            ]
            batches = [b for t in tabs for b in t.to_batches(max_chunksize=1 << 18)]
            self.w.write_part_batches("live", self.seq, F.SCHEMAS["live"], batches)
        if complete and self._heaps:
            names = [f.name for f in F.SCHEMAS["heaps"]]
            self.w.write_part(
                "heaps",
                self.seq,
                pa.table(
                    {
                        n: [self.seq] * len(self._heaps) if n == "seq" else [r[i - 1] for r in self._heaps]
                        for i, n in enumerate(names)
                    },
                    schema=F.SCHEMAS["heaps"],
                ),
            )
        if complete:
            self.meta.update({"complete": True, "end_reason": "duration", "intervals": self.seq})
            self.w.write_meta(self.meta)
        self.w.close()
        return self.path
