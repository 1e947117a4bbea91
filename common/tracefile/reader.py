"""Load an allocscope trace into pandas DataFrames. No BCC, no root: runs anywhere.

    >>> from reports.trace import load_trace      # or common.tracefile.reader
    >>> t = load_trace("pw12.allocscope")
    >>> t.sites.head()        # cumulative counters per (stack, thread, source) per interval
    >>> t.final_sites()       # the last state of every (stack, thread, source)

DataFrames (columns as in common.tracefile.format): intervals, sites, stacks, threads, flows, events,
maps, live. Only parts up to the last finished interval are read, so a trace whose tracer was
killed reads the same as one stopped cleanly at that interval.

Every part read is first checked against the trace's checksum list (integrity.py): a part not
as written, truncated, missing, unreadable or not of its table is left out and named in
`Trace.integrity` (its `damaged`), never in `warnings`, so that the reports can withhold what
depends on it (reports.analysis.integrity) and the CLI can exit non-zero.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import TraceFileError

from . import format as F
from .conform import conform_part, first_line, sanitize
from .integrity import Integrity


@dataclass
class Trace:
    path: str
    meta: dict
    intervals: pd.DataFrame
    sites: pd.DataFrame
    stacks: pd.DataFrame
    threads: pd.DataFrame
    flows: pd.DataFrame
    events: pd.DataFrame
    maps: pd.DataFrame
    # The final live table (one row per outstanding block: millions are normal). load_trace
    # keeps it as Arrow (`live_table`) and makes the DataFrame on first use of `live`; the
    # reports aggregate it straight from Arrow (`live_batches`) and never build it.
    # (a default factory, not a default: a class attribute `live` would hide __getattr__)
    live: pd.DataFrame = field(default_factory=lambda: None, repr=False)  # None: not given (__post_init__)
    warnings: list[str] = field(default_factory=list)
    heaps: pd.DataFrame = field(default_factory=lambda: _empty("heaps"))
    releases: pd.DataFrame = field(default_factory=lambda: _empty("releases"))
    allocators: pd.DataFrame = field(default_factory=lambda: _empty("allocators"))  # version 3
    purges: pd.DataFrame = field(default_factory=lambda: _empty("purges"))  # version 3
    waits: pd.DataFrame = field(default_factory=lambda: _empty("waits"))  # version 4
    blocked: pd.DataFrame = field(default_factory=lambda: _empty("blocked"))  # version 4
    census: pd.DataFrame = field(default_factory=lambda: _empty("census"))  # version 5
    pyframes: pd.DataFrame = field(default_factory=lambda: _empty("pyframes"))  # CPython frames (docs/python.md)
    pycode: pd.DataFrame = field(default_factory=lambda: _empty("pycode"))
    live_table: pa.Table | None = field(default=None, repr=False, compare=False)
    integrity: Integrity = field(default_factory=Integrity, repr=False, compare=False)  # what was verified

    def __post_init__(self) -> None:
        if self.live is None:
            if self.live_table is None:
                self.live = _empty("live")
            else:
                del self.__dict__["live"]  # built from live_table on first use (__getattr__)

    def __getattr__(self, name: str):
        if name == "live":  # only while not built yet
            tab = self.__dict__.get("live_table")
            df = _empty("live") if tab is None else _live_frame(tab)
            self.__dict__["live"] = df
            return df
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def live_rows(self) -> int:
        """Rows of the live table, without building its DataFrame."""
        if "live" in self.__dict__ or self.live_table is None:
            return len(self.live)
        return self.live_table.num_rows

    def live_batches(self, columns: list[str]):
        """The live table in batches (the row groups it was written in), each a dict of numpy
        arrays, zero-copy views of Arrow's memory when the DataFrame was never built: reports
        aggregate millions of rows without a pandas conversion or a concatenated copy. `source`
        comes as a boolean array `heap` (source == 'heap') instead of strings."""
        if "live" in self.__dict__ or self.live_table is None:
            df = self.live
            if len(df):
                yield {
                    ("heap" if c == "source" else c): (
                        (df["source"] == "heap").to_numpy(dtype=bool) if c == "source" else df[c].to_numpy()
                    )
                    for c in columns
                }
            return
        for batch in self.live_table.select(columns).to_batches():
            if batch.num_rows:
                yield {
                    ("heap" if c == "source" else c): (
                        _equals(batch.column(c), "heap")
                        if c == "source"
                        else batch.column(c).to_numpy(zero_copy_only=False)
                    )
                    for c in columns
                }

    @property
    def complete(self) -> bool:
        return bool(self.meta.get("complete"))

    @property
    def last_seq(self) -> int:
        return int(self.intervals["seq"].max()) if len(self.intervals) else 0

    @property
    def labels(self) -> dict:
        return dict(self.meta.get("labels") or {})

    def final_sites(self) -> pd.DataFrame:
        """Last row of every (stack_id, tid, source), with live_bytes and live_count."""
        if self.sites.empty:
            df = self.sites.copy()
        else:
            df = self.sites.sort_values("seq").drop_duplicates(["stack_id", "tid", "source"], keep="last")
        df = df.assign(live_bytes=df["alloc_bytes"] - df["free_bytes"], live_count=df["alloc_count"] - df["free_count"])
        return df.reset_index(drop=True)

    def thread_names(self) -> dict[int, str]:
        """tid -> last known name (renames and exits included)."""
        if self.threads.empty:
            return {}
        df = self.threads.sort_values(["seq", "ts_ns"])
        return {int(t): str(n) for t, n in zip(df["tid"], df["name"])}

    def final_flows(self) -> pd.DataFrame:
        if self.flows.empty:
            return self.flows
        last = self.flows["seq"].max()
        return self.flows[self.flows["seq"] == last].reset_index(drop=True)


DICT_COLUMNS = {"live": ["api", "source"]}


def _read_part(path: str, dictionaries: list[str] | None) -> pa.Table:
    """One Parquet part, row group by row group: the decoding buffers of one row group are
    freed before the next is read (a 10 M-row live table peaks ~130 MiB lower than read_table)."""
    if dictionaries:  # only the columns this part has (a part of another table lacks them)
        names = set(pq.read_schema(path).names)
        dictionaries = [c for c in dictionaries if c in names]
    pf = pq.ParquetFile(path, read_dictionary=dictionaries or None)
    groups = [pf.read_row_group(i) for i in range(pf.num_row_groups)]
    tab = pa.concat_tables(groups) if groups else pf.schema_arrow.empty_table()
    tab.validate(full=True)  # damaged strings (invalid UTF-8) fail here, not later in pandas
    return tab


def _live_frame(tab: pa.Table) -> pd.DataFrame:
    """The live table as pandas: numbers in one block per column, strings categorical."""
    return tab.to_pandas(strings_to_categorical=True, split_blocks=True)


def _equals(arr: pa.Array, value: str) -> np.ndarray:
    """arr == value as a numpy boolean array; a dictionary array is compared by its indices."""
    if pa.types.is_dictionary(arr.type):
        hit = [i for i, v in enumerate(arr.dictionary.to_pylist()) if v == value]
        idx = arr.indices.to_numpy(zero_copy_only=False)
        return idx == hit[0] if len(hit) == 1 else np.isin(idx, hit)
    return pc.equal(arr, value).to_numpy(zero_copy_only=False)


def _empty(table: str) -> pd.DataFrame:
    if table in F.SCHEMAS:
        return F.SCHEMAS[table].empty_table().to_pandas()
    return pd.DataFrame({"seq": pd.Series(dtype="int32")})


def read_meta(path: str) -> dict:
    if not os.path.exists(path):
        raise TraceFileError(f"no such trace: {path}")
    if not os.path.isdir(path):
        raise TraceFileError(
            f"{path} is not an allocscope trace (a trace is a directory written by 'allocscope record')"
        )
    mpath = os.path.join(path, F.META)
    try:
        with open(mpath, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise TraceFileError(f"{path} is not an allocscope trace (no {F.META})") from None
    except OSError as e:
        raise TraceFileError(f"cannot read {mpath}: {e.strerror}") from None
    try:
        meta = json.loads(raw)
    except ValueError:
        raise TraceFileError(f"{path}: {F.META} is corrupt (not JSON)") from None
    if not isinstance(meta, dict) or meta.get("format") != F.FORMAT:
        fmt = meta.get("format") if isinstance(meta, dict) else "?"
        raise TraceFileError(f"{path} is not an allocscope trace (format {fmt!r})")
    version = meta.get("version")
    if not isinstance(version, int):
        raise TraceFileError(f"{path}: {F.META} has no valid format version")
    if version > F.VERSION:
        raise TraceFileError(
            f"{path} was written by a newer allocscope (trace format {version}; "
            f"this one reads up to {F.VERSION}); upgrade allocscope"
        )
    return meta


def load_trace(path: str, progress=None) -> Trace:
    """Read a trace directory. Raises TraceFileError (one line) for anything unreadable. A trace
    being recorded by `watch --keep` may have its parts directory exchanged while it is read
    (TraceWriter.replace_parts): then it is read again, so that the parts and their checksum
    list are of one set."""
    path = os.fspath(path)
    for _ in range(3):
        before = _inode(os.path.join(path, F.PARTS))
        t = _load(path, progress)
        if _inode(os.path.join(path, F.PARTS)) == before:
            break
    return t


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _load(path: str, progress) -> Trace:
    meta = read_meta(path)
    pdir = os.path.join(path, F.PARTS)
    try:
        names = os.listdir(pdir)
    except OSError as e:
        if meta.get("complete") or not isinstance(e, FileNotFoundError):
            # the writer makes parts/ with the trace: a trace without it lost its tables
            raise TraceFileError(f"{path}: cannot read its tables, {F.PARTS}/: {e.strerror}") from None
        names = []
    parts: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for n in names:
        parsed = F.parse_part_name(n) or _symbols_part(n)
        if parsed:
            parts[parsed[0]].append((parsed[1], n))
    meta, warnings = sanitize(meta)  # fields of the wrong type: dropped, with a warning
    integrity = Integrity.open(pdir, meta)
    frames: dict = {}
    held = meta.get("version", 0) >= 6  # parts may hold several intervals' rows (writer.py hold_s)

    def read(table: str, max_seq: int | None):
        chunks = []
        after = 0  # a part holds rows of the intervals after its table's part before it (version 6)
        for seq, n in sorted(parts.get(table, [])):
            if max_seq is not None and seq > max_seq:
                continue
            after, prev = seq, after
            if not integrity.admit(pdir, n, table):
                continue
            try:
                # The live table can hold millions of rows: its few distinct strings are read
                # as dictionaries (categoricals in pandas), never as one Python string a row.
                chunk = _read_part(os.path.join(pdir, n), DICT_COLUMNS.get(table))
            except (OSError, pa.ArrowException) as e:
                integrity.damage(n, table, f"unreadable, skipped ({first_line(e)})")
                continue
            try:  # a part holding another table (or damaged values) is skipped, never mixed in
                chunk, dropped = conform_part(table, chunk, F.SCHEMAS, seq, prev if held else None)
            except ValueError as e:
                integrity.damage(n, table, f"not a valid {table} part, skipped ({e})")
                continue
            if dropped:
                integrity.damage(n, table, f"{dropped} rows with missing values skipped")
            chunks.append(chunk)
        if not chunks:
            return _empty(table)
        try:
            tab = pa.concat_tables(chunks, promote_options="default")
        except pa.ArrowException as e:
            raise TraceFileError(f"{path}: parts of table {table} disagree ({e})") from None
        if table == "live":
            return tab  # kept as Arrow; Trace.live converts it when asked
        return tab.to_pandas()

    if progress:
        progress(f"loading {path}")
    intervals = read("intervals", None)
    if intervals.empty or "seq" not in intervals:
        integrity.missing(set(names), 1 << 62)  # no interval read: every listed part not there is missing
        bad = [d for d in integrity.damaged if d.table == "intervals"]
        if bad:
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            raise TraceFileError(f"{path} has no finished interval that reads: {bad[0].text()}{more}")
        raise TraceFileError(f"{path} has no finished interval (the recording stopped before its first snapshot)")
    intervals = intervals.sort_values("seq").reset_index(drop=True)
    last = int(intervals["seq"].max())
    integrity.missing(set(names), last)
    for table in F.SCHEMAS:
        frames[table] = read(table, last)
    for seq, n in sorted(parts.get(F.SYMBOLS, [])):  # read apart (reports/symbolize/embedded.py)
        if seq <= last:
            integrity.admit(pdir, n, F.SYMBOLS)
    if not isinstance(frames["live"], pd.DataFrame):  # Arrow, conformed part by part
        frames["live_table"] = frames.pop("live")
    # Integrity: columns the reports rely on.
    for table, schema in F.SCHEMAS.items():
        if table not in frames:
            continue
        missing = [c for c in schema.names if c not in frames[table].columns]
        if missing:
            raise TraceFileError(f"{path}: table {table} lacks columns {missing}; corrupt or foreign trace")
    if not meta.get("complete"):
        # the time, not the seq: peak snapshots take seqs too, and the report counts intervals apart
        upto = float(intervals["elapsed_s"].iloc[-1]) if "elapsed_s" in intervals else 0.0
        if being_recorded(path):  # a recording or watch under way: nothing was cut short
            meta = {**meta, "end_reason": meta.get("end_reason") or STILL_RECORDING}
            warnings.append(f"trace is still being recorded; read up to +{upto:.1f} s, its last snapshot so far")
        else:
            warnings.append(
                f"trace is incomplete (recording was interrupted); read up to +{upto:.1f} s, its last snapshot"
            )
    return Trace(path=path, meta=meta, intervals=intervals, warnings=warnings, integrity=integrity, **frames)


STILL_RECORDING = "still being recorded"  # the `end_reason` of a trace a tracer is writing now


def being_recorded(path: str) -> bool:
    """A tracer holds the trace directory's lock (writer.hold_lock): it is being written now. A
    tracer that was killed holds nothing (the kernel let go), and neither does a complete trace."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # our shared lock goes with it
    return False


def _symbols_part(name: str) -> tuple[str, int] | None:
    """('symbols', seq) of a symbols part (--embed-symbols: not one of the tables read here)."""
    stem = name.removesuffix(".parquet")
    table, _, seq = stem.rpartition("-")
    return (table, int(seq)) if table == F.SYMBOLS and stem != name and seq.isdigit() else None
