"""The trace format (version 6, `VERSION` below; older traces stay readable): a directory, written
by the tracer, read by reports.

    TRACE/
      meta.json                   format, version, target, labels, probes, clock; `complete` last
      parts/<table>-<seq>.parquet one Parquet file per table per interval, written under a
                                  temporary name and renamed, so a file that exists is whole
                                  (codec and encodings vary: small parts are plain, writer.py);
                                  from version 6 a part may hold the rows of several intervals:
                                  those after its table's part before it, up to <seq> (the
                                  writer held them, writer.py hold_s)

Tables (columns; `seq` is the interval number, 1-based):
  intervals  seq, ts_ns, elapsed_s, rss_bytes, rss_anon_bytes, rss_file_bytes, rss_shmem_bytes,
             hwm_bytes, heap_live_bytes, heap_peak_bytes, mmap_live_bytes, live_bytes,
             live_count, arena_resident_bytes (glibc heaps, pagemap), residency_ms (its cost),
             measured_ns (when the residency figures were read; ts_ns is when the counters were),
             lost_* and n_* counters (cumulative)
  sites      seq, stack_id, tid, source ('heap'|'mmap'|'brk'), alloc_bytes, alloc_count,
             free_bytes, free_count, peak_live_bytes   — cumulative counters per (stack, allocating
             thread, source); a part holds only the rows that changed in that interval
  stacks     stack_id, idx, ip, module, build_id, offset (file offset, -1: no file), syscall
             (1 where the frame was recovered from the word at the user sp of a syscall; 2
             where a DWARF-unwound stack found it by a frame-pointer step: no CFI row covered
             the frame below),
             function, file, line (null unless symbolized when written; reports symbolize
             the rest offline from module + build_id + offset)
  threads    seq, ts_ns, tid, name, event ('seen'|'rename'|'exit')
  flows      seq, alloc_tid, free_tid, bytes, count, wait_ns_sum, wait_ns_max (cumulative)
  events     seq, ts_ns, type, tid, addr, len, addr2, len2, ret, flags, prot, fd, in_api,
             stack_id, released_bytes: what reached user space one by one — malloc_trim calls,
             code mappings, exec, and the rare mmap-family shapes the probes hand over (version
             1: every mmap/munmap/mremap/brk/madvise, with released_bytes)
  releases   seq, tid, kind ('munmap'|'madvise'|'brk'), in_api, calls, requested_bytes,
             released_bytes (drop of anon RSS), duration_ns (time in the syscalls), stack_id (a
             munmap of memory mapped outside the allocators: the stack that mapped it; 0 else) —
             cumulative per (thread, kind, allocator call, stack); changed rows only (version 2;
             duration_ns and stack_id: version 4, 0 in older traces)
  waits      seq, tid, stack_id, count, total_ns, max_ns — off-CPU waits (sched_switch: blocked
             sleeping or in D) at least the recording's wait_min_ns long, cumulative per (thread,
             user stack where it blocked); changed rows only (version 4)
  blocked    seq, tid, stack_id, since_ns (monotonic), waited_ns, state ('S'|'D') — the threads
             blocked at the snapshot for at least wait_min_ns (version 4)
  maps       seq, start, end, perms, offset, inode, path, build_id (written when they change)
  heaps      seq, start, end, reserved_end, kind ('main'|'thread'|'mmap'), arena ('main', the
             arena address for thread heaps, 'mmap' for the allocator's mmapped chunks),
             resident_bytes (pagemap), estimated (1 when sampled) — written at the end
  allocators seq, source ('heap' | 'heap:KIND[:PREFIX]'), kind (KIND[:PREFIX]), mapped_bytes,
             resident_bytes, live_bytes, ranges — every interval, one row per allocator: its own
             mappings (those it made inside its calls; glibc's heaps and chunks), how much of them
             is resident (PAGEMAP_SCAN), its sites' live bytes (version 3)
  purges     seq, ts_ns, tid, source, function, name, duration_ns, rss_before_bytes,
             rss_after_bytes, released_bytes — one row per purge call of an allocator
             (malloc_trim, mallctl, MallocExtension_Release*, mi_collect; `name`: mallctl's
             name argument), released = the drop of anon RSS across the call (version 3)
  pyframes   stack_id, idx, code, lasti, entry — a stack's CPython frames, innermost first (the
             code object's key: its address hashed with its identity; the instruction index; 1 on
             an eval loop's first frame)
  pycode     seq, code, name, qualname, file, firstlineno, linetable — the code objects those
             frames name, read from the running process (docs/python.md)
  live       seq, addr, size, stack_id, tid, ts_ns, api, source (the final live table)
  census     seq, when ('attach'|'end'), arena ('main', a thread arena's address, 'mmap': glibc's
             mmapped chunks), heaps, system_bytes, in_use_bytes (chunks in use, fastbin and
             tcache entries not), free_bytes (free chunks in the bins), fastbin_bytes,
             tcache_bytes, top_bytes, resident_bytes (mmapped chunks; -1 else), chunks (walked),
             walked_bytes, sampled (1: part estimated past the time budget), tcache_estimated,
             ms — glibc's arenas read from outside at the attach and at the end
             (tracer/allocators/census.py; chunk bytes, mallinfo2's units) (version 5)
  symbols    seq, build_id, module, start (file offset), size, name (mangled) — only with
             --embed-symbols: the function symbols of each module first seen on a stack in
             that interval (tracer/record/embed_symbols.py writes them, reports/symbolize/embedded.py reads them)

A reader takes, for every table, the parts whose seq is <= the last seq that has an
`intervals` part: every finished interval is readable after a SIGKILL of tracer or target.
"""

from __future__ import annotations

import pyarrow as pa

from .names import FORMAT, META, PARTS  # noqa: F401 (the names live where no pyarrow is imported)

VERSION = 6  # 2: the `releases` table; `events` holds only what went to user space; 3: `allocators`, `purges`;
# 4: `waits`, `blocked`, releases' duration_ns and stack_id; 5: `census`, intervals.peak_snapshot;
# 6: a part may hold several intervals' rows (held parts, writer.py)
# Columns added in a later version, and what they read as in a trace written before it.
ADDED_COLUMNS: dict[str, dict[str, int]] = {"releases": {"duration_ns": 0, "stack_id": 0}}

U64, I64, I32, U32, STR, F64 = pa.uint64(), pa.int64(), pa.int32(), pa.uint32(), pa.string(), pa.float64()

SCHEMAS: dict[str, pa.Schema] = {
    "sites": pa.schema(
        [
            ("seq", I32),
            ("stack_id", U64),
            ("tid", U32),
            ("source", STR),
            ("alloc_bytes", I64),
            ("alloc_count", I64),
            ("free_bytes", I64),
            ("free_count", I64),
            ("peak_live_bytes", I64),
        ]
    ),
    "stacks": pa.schema(
        [
            ("stack_id", U64),
            ("idx", I32),
            ("ip", U64),
            ("module", STR),
            ("build_id", STR),
            ("offset", I64),
            ("syscall", pa.int8()),
            ("function", STR),
            ("file", STR),
            ("line", I32),
        ]
    ),
    "threads": pa.schema([("seq", I32), ("ts_ns", I64), ("tid", U32), ("name", STR), ("event", STR)]),
    "flows": pa.schema(
        [
            ("seq", I32),
            ("alloc_tid", U32),
            ("free_tid", U32),
            ("bytes", I64),
            ("count", I64),
            ("wait_ns_sum", I64),
            ("wait_ns_max", I64),
        ]
    ),
    "events": pa.schema(
        [
            ("seq", I32),
            ("ts_ns", I64),
            ("type", STR),
            ("tid", U32),
            ("addr", U64),
            ("len", U64),
            ("addr2", U64),
            ("len2", U64),
            ("ret", I64),
            ("flags", U32),
            ("prot", U32),
            ("fd", I32),
            ("in_api", STR),
            ("stack_id", U64),
            ("released_bytes", I64),
        ]
    ),
    "releases": pa.schema(
        [
            ("seq", I32),
            ("tid", U32),
            ("kind", STR),
            ("in_api", STR),
            ("calls", I64),
            ("requested_bytes", I64),
            ("released_bytes", I64),
            ("duration_ns", I64),
            ("stack_id", U64),
        ]
    ),
    "waits": pa.schema(
        [("seq", I32), ("tid", U32), ("stack_id", U64), ("count", I64), ("total_ns", I64), ("max_ns", I64)]
    ),
    "blocked": pa.schema(
        [("seq", I32), ("tid", U32), ("stack_id", U64), ("since_ns", I64), ("waited_ns", I64), ("state", STR)]
    ),
    "maps": pa.schema(
        [
            ("seq", I32),
            ("start", U64),
            ("end", U64),
            ("perms", STR),
            ("offset", U64),
            ("inode", U64),
            ("path", STR),
            ("build_id", STR),
        ]
    ),
    "heaps": pa.schema(
        [
            ("seq", I32),
            ("start", U64),
            ("end", U64),
            ("reserved_end", U64),
            ("kind", STR),
            ("arena", STR),
            ("resident_bytes", I64),
            ("estimated", pa.int8()),
        ]
    ),
    "allocators": pa.schema(
        [
            ("seq", I32),
            ("source", STR),
            ("kind", STR),
            ("mapped_bytes", I64),
            ("resident_bytes", I64),
            ("live_bytes", I64),
            ("ranges", I32),
        ]
    ),
    "purges": pa.schema(
        [
            ("seq", I32),
            ("ts_ns", I64),
            ("tid", U32),
            ("source", STR),
            ("function", STR),
            ("name", STR),
            ("duration_ns", I64),
            ("rss_before_bytes", I64),
            ("rss_after_bytes", I64),
            ("released_bytes", I64),
        ]
    ),
    "census": pa.schema(
        [
            ("seq", I32),
            ("when", STR),
            ("arena", STR),
            ("heaps", I32),
            ("system_bytes", I64),
            ("in_use_bytes", I64),
            ("free_bytes", I64),
            ("fastbin_bytes", I64),
            ("tcache_bytes", I64),
            ("top_bytes", I64),
            ("resident_bytes", I64),
            ("chunks", I64),
            ("walked_bytes", I64),
            ("sampled", pa.int8()),
            ("tcache_estimated", pa.int8()),
            ("ms", F64),
        ]
    ),
    # CPython's frames of a stack (docs/python.md): innermost first, `lasti` the instruction index
    # in the code object (code units), `entry` 1 on the first frame of an eval-loop call
    "pyframes": pa.schema([("stack_id", U64), ("idx", I32), ("code", U64), ("lasti", I32), ("entry", pa.int8())]),
    # the code objects `pyframes` names, read from the running process: `linetable` is co_linetable
    "pycode": pa.schema(
        [
            ("seq", I32),
            ("code", U64),
            ("name", STR),
            ("qualname", STR),
            ("file", STR),
            ("firstlineno", I32),
            ("linetable", pa.binary()),
        ]
    ),
    "live": pa.schema(
        [
            ("seq", I32),
            ("addr", U64),
            ("size", I64),
            ("stack_id", U64),
            ("tid", U32),
            ("ts_ns", I64),
            ("api", STR),
            ("source", STR),
        ]
    ),
}
# `intervals` columns vary with the counters the probe has; its schema is inferred.
TABLES = ["intervals", *SCHEMAS]
# Optional, read apart from the tables above (load_trace leaves it to reports/symbolize/embedded.py).
SYMBOLS = "symbols"
SYMBOLS_SCHEMA = pa.schema(
    [("seq", I32), ("build_id", STR), ("module", STR), ("start", U64), ("size", U64), ("name", STR)]
)

# Parquet encodings per table (readers see the same columns and types whatever these are): the
# live table's addresses and times are nearly all distinct, so dictionary pages are tried and
# thrown away for them; delta encoding writes and reads them several times faster and smaller.
PARQUET_OPTIONS: dict[str, dict] = {
    "live": {
        "use_dictionary": ["seq", "size", "stack_id", "tid", "api", "source"],
        "column_encoding": {"addr": "DELTA_BINARY_PACKED", "ts_ns": "DELTA_BINARY_PACKED"},
    },
}


def part_name(table: str, seq: int) -> str:
    return f"{table}-{seq:06d}.parquet"


def parse_part_name(name: str) -> tuple[str, int] | None:
    if not name.endswith(".parquet"):
        return None
    stem = name[: -len(".parquet")]
    table, _, seq = stem.rpartition("-")
    if table not in TABLES or not seq.isdigit():
        return None
    return table, int(seq)
