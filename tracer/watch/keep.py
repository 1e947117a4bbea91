"""`watch --keep`: a trace recorded for days keeps only the last part of its interval history.

Every `period(keep_s)` seconds, the intervals older than --keep are dropped from the trace being
written, in one atomic step (TraceWriter.replace_parts: a new parts directory exchanged with the
old one). What is always kept, whatever was dropped:

* the state at the newest dropped interval C (the base): every cumulative table's last row per
  key up to C (sites, releases, waits, allocators, flows), the maps, the `intervals` row of C —
  so the live state since the attach, by stack, thread and source, is whole;
* the composition at the peak of the dropped intervals (the one with most live bytes) and at each
  trigger (`--when-rss`, tracer/watch/triggers.py): the same rows as of that interval, and its
  `intervals` row and blocked threads;
* everything that is not per interval: stacks, threads, events, census, purges, symbols, live.

The parts older than 10 minutes (or --keep, the shorter) are merged into one part per table at
the same step (the reader takes a part's rows after its table's part before it: format version
6), so a trace holds a few dozen files however long it runs.

Rows kept for a pinned interval P are written with seq P (the state as of P), so the reports read
a dropped range as a gap in the timeline. meta.json's `kept` says what was dropped:
{keep_s, dropped_intervals, dropped_through_seq, dropped_through_s, compactions, pinned}; the
report's `totals.intervals` counts the intervals the trace holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.tracefile import format as F
from common.tracefile.writer import TraceWriter, parquet_options

KEYED = {  # cumulative tables: the last row of each key up to a pinned interval
    "sites": ("stack_id", "tid", "source"),
    "releases": ("tid", "kind", "in_api", "stack_id"),
    "waits": ("tid", "stack_id"),
    "flows": ("alloc_tid", "free_tid"),
    "allocators": ("source",),
}
SNAPSHOTS = ("maps", "heaps")  # whole snapshots: the last one up to a pinned interval
AT_SEQ = ("blocked",)  # rows of the pinned intervals themselves
REDUCED = ("intervals", *KEYED, *SNAPSHOTS, *AT_SEQ)
MERGE_S = 600.0  # parts older than this (or than --keep) are merged into one per table: few files


def period(keep_s: float) -> float:
    """How often the history is cut: half of --keep, at least 1 s, at most 5 minutes."""
    return min(max(keep_s / 2, 1.0), 300.0)


def install(watcher) -> None:
    """Cut the history of each incarnation's trace as it is recorded (watcher.options.keep_s)."""
    if watcher.options.keep_s is None:
        return
    state: dict = {}

    def observe(watch, snap, rec) -> None:
        keep_s = watch.options.keep_s
        if snap.final:
            return
        st = state.setdefault(id(rec), {"next": time.monotonic() + period(keep_s)})
        if time.monotonic() < st["next"]:
            return
        st["next"] = time.monotonic() + period(keep_s)
        try:
            if cut(rec, keep_s) and rec.kept:
                from ..record.meta import trace_meta  # noqa: PLC0415

                rec.writer.write_meta(trace_meta(rec, False))  # what was dropped, said at once
        except Exception as e:  # noqa: BLE001 - the history stays longer; the recording goes on
            watch.progress(f"--keep: could not drop old intervals ({type(e).__name__}: {str(e)[:120]})")

    watcher.observers.append(observe)


def _parts(dirfd: int) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for n in os.listdir(dirfd):
        parsed = F.parse_part_name(n)
        if parsed:
            out.setdefault(parsed[0], []).append((parsed[1], n))
    for v in out.values():
        v.sort()
    return out


def _read(dirfd: int, names: Iterable[str]) -> pa.Table | None:
    tabs = []
    for n in names:
        fd = os.open(n, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
        with os.fdopen(fd, "rb") as f:
            tabs.append(pq.read_table(f))
    if not tabs:
        return None
    return pa.concat_tables(tabs, promote_options="default") if len(tabs) > 1 else tabs[0]


def _as_of(tab: pa.Table, p: int, keys: tuple[str, ...] | None) -> pa.Table:
    """The rows of `tab` that make its state as of interval p, with seq p: per key its last row
    up to p (keys), or the whole last snapshot up to p (None)."""
    upto = tab.filter(pc.less_equal(tab["seq"], p))
    if upto.num_rows == 0:
        return upto
    if keys is None:
        last = pc.max(upto["seq"]).as_py()
        rows = upto.filter(pc.equal(upto["seq"], last))
    else:
        df = upto.to_pandas()
        df = df.sort_values("seq", kind="stable").drop_duplicates(list(keys), keep="last")
        rows = pa.Table.from_pandas(df, schema=upto.schema, preserve_index=False)
    seq = pa.array([p] * rows.num_rows, rows.schema.field("seq").type)
    return rows.set_column(rows.schema.get_field_index("seq"), "seq", seq)


def cut(rec, keep_s: float, merge_s: float | None = None) -> bool:
    """Drop the intervals of `rec`'s trace older than keep_s, and merge the parts older than
    merge_s (default: MERGE_S or keep_s, the smaller) into one part per table (see the module
    docstring). Returns whether the parts directory was replaced."""
    w = rec.writer
    if not isinstance(w, TraceWriter):
        return False
    w.write_held()
    parts = _parts(w.parts_fd)
    ivals = parts.get("intervals") or []
    if len(ivals) < 2:
        return False
    now = time.monotonic_ns()
    horizon = now - int(keep_s * 1e9)
    merge_horizon = now - int(min(MERGE_S, keep_s) if merge_s is None else merge_s) * 1_000_000_000
    base = dict(getattr(rec, "kept", None) or {})
    done_through = int(base.get("dropped_through_seq") or 0)
    # C: the newest `intervals` part whose rows are all older than the horizon (parts end at
    # interval boundaries, for every table alike: writer.py), never the newest part; M likewise
    # for the merge
    tab = _read(w.parts_fd, [n for _, n in ivals])
    assert tab is not None
    last_ts = {int(s): int(t) for s, t in zip(tab["seq"].to_pylist(), tab["ts_ns"].to_pylist())}
    cands = [seq for seq, _ in ivals[:-1] if last_ts.get(seq, horizon) < horizon and seq > done_through]
    mcands = [seq for seq, _ in ivals[:-1] if last_ts.get(seq, merge_horizon) < merge_horizon]
    c = max(cands) if cands else 0
    pinned: list[int] = []
    n_dropped = 0
    dropped = tab.filter(pc.less_equal(tab["seq"], c))
    if c:
        lives = dropped["live_bytes"].to_pylist()
        seqs = dropped["seq"].to_pylist()
        peak = max(zip(lives, seqs))[1] if seqs else c
        triggers = [t["seq"] for t in getattr(rec, "triggers", []) if t.get("seq") and t["seq"] <= c]
        pinned = sorted({c, peak, *triggers})
        n_dropped = sum(1 for s in seqs if s not in set(pinned))
        if n_dropped == 0:
            c = 0
    m = max(mcands) if mcands else 0

    def lows(table: str) -> int:
        return c if c and table in REDUCED else 0

    merging = {t for t, plist in parts.items() if sum(1 for s, _ in plist if lows(t) < s <= m) > 1}
    if not c and not merging:
        return False

    def write(fd_dir: int, table: str, seq: int, out: pa.Table) -> None:
        name = F.part_name(table, seq)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd_dir)
        with os.fdopen(fd, "wb") as f:
            pq.write_table(out, f, **parquet_options(table, None))
            f.flush()
            os.fsync(f.fileno())

    def fill(newfd: int, oldfd: int) -> None:
        for table, plist in parts.items():
            lo = lows(table)
            old = [(s, n) for s, n in plist if s <= lo]
            mid = [(s, n) for s, n in plist if lo < s <= m] if table in merging else []
            for s, n in plist:
                if s > lo and (s, n) not in mid:
                    os.link(n, n, src_dir_fd=oldfd, dst_dir_fd=newfd)
            if old:
                t = _read(oldfd, [n for _, n in old])
                assert t is not None
                if table == "intervals" or table in AT_SEQ:
                    out = t.filter(pc.is_in(t["seq"], pa.array(pinned, t.schema.field("seq").type)))
                else:
                    out = pa.concat_tables([_as_of(t, p, KEYED.get(table)) for p in pinned])
                if out.num_rows or table == "intervals":
                    write(newfd, table, c, out)
            if mid:  # one part of their rows, named with the last: the rows after the part before it
                t = _read(oldfd, [n for _, n in mid])
                assert t is not None
                write(newfd, table, mid[-1][0], t)

    w.replace_parts(fill)
    if not c:
        return True
    elapsed = dropped["elapsed_s"].to_pylist()
    rec.kept = {
        "keep_s": keep_s,
        "dropped_intervals": int(base.get("dropped_intervals") or 0) + n_dropped,
        "dropped_through_seq": c,
        "dropped_through_s": float(max(elapsed)) if elapsed else 0.0,
        "compactions": int(base.get("compactions") or 0) + 1,
        "pinned": pinned,
    }
    return True
