"""Crash-safe trace writer: every part is written whole under a temporary name and renamed into
place, so a file that exists is whole; meta.json is rewritten the same way and says
`complete: true` only after the last part.

What survives what:
  - a killed tracer or target (SIGKILL included) never corrupts a trace: a part's rename happens
    after its last byte is written, and the kernel keeps what was written when a process dies; a
    reader takes every interval up to the last `intervals` part.
  - a power loss or OS crash: parts are fsynced in batches, by a thread of their own, at the end
    of an interval at most every `sync_s` seconds (SYNC_S), then their directory; meta.json is
    fsynced (after every part before it) each time it is written. After a power loss the
    intervals up to the last finished batch are on disk whole; those of the last seconds may
    be missing or empty, which the reader skips with a warning. An fsync per part in the
    tracer's loop cost more wall time than everything else the writer does.

Small parts (under SMALL_PART_BYTES in memory: most parts of an interval hold a few rows) are
written uncompressed, without dictionary pages, statistics or the Arrow schema (the Parquet
types read back as the same Arrow types): zstd and dictionary pages made them larger, and a
fresh zstd context per column chunk was a tenth of the tracer's CPU. Readers read whatever
codec the Parquet footer names.

Held parts (hold_s > 0, held.py; the recorder asks for it, tracer/record/recorder.py): small parts are kept
in memory and written together every `hold_s` seconds, at the end of an interval (its
`intervals` part last), one part per table holding the rows of all the intervals since the last
write, named with the last of them (the trace format's version 6); a large part, a streamed one,
sync(), write_meta() and close() write what is held first. Each Parquet file costs ~0.1 ms of
CPU to write whatever its rows (the `intervals` part, ~70 columns, ~0.8 ms), so holding 4 s cuts
the writer's CPU about fourfold. What a SIGKILL loses on top: the intervals finished since the
last write (less than hold_s seconds of them); the trace still reads whole up to the one before.
The first interval is written at once (a trace exists as soon as the recording does).

Files are created 0600 inside a 0700 directory, never through a symlink, and the writer never
replaces a path that is not an allocscope trace.

Every part's size and CRC-32 go into parts/checksums as it is renamed into place (checksums.py,
kept by sumlist.py):
the reader tells a damaged, truncated or missing part from one as written; meta.json says
`checksums: "crc32"`. A CRC of a small part costs ~1 us and its line one write(2).
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import OutputError

from . import checksums as C
from . import format as F
from .held import HeldParts
from .paths import check_output, is_trace_dir, prepare_output  # noqa: F401 (their home: no pyarrow)
from .sumlist import ChecksumList

SYNC_S = 5.0  # seconds between batched fsyncs of the parts (power-loss durability; 0: every part)
SMALL_PART_BYTES = 64 << 10  # parts under this (Arrow bytes) are written plain
SMALL_PART_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False, "store_schema": False}


def parquet_options(table: str, nbytes: int | None, small_part_bytes: int = SMALL_PART_BYTES) -> dict:
    """pyarrow write options of a part of `table` holding `nbytes` of Arrow data (None: a
    streamed part, of a size not known before it is written)."""
    if nbytes is not None and nbytes < small_part_bytes:
        return SMALL_PART_OPTIONS
    return {"compression": "zstd", **F.PARQUET_OPTIONS.get(table, {})}


def hold_lock(dirfd: int) -> None:
    """flock the trace directory for as long as it is written (the kernel lets go when the
    descriptor is closed or the tracer dies): a reader tells a recording under way from one
    that was cut short (reader.being_recorded). A file system without locks: nothing held."""
    try:
        fcntl.flock(dirfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


class TraceWriter:
    def __init__(
        self,
        path: str,
        sync_s: float = SYNC_S,
        small_part_bytes: int = SMALL_PART_BYTES,
        clock=time.monotonic,
        hold_s: float = 0.0,
    ) -> None:
        self.path = path
        try:
            os.mkdir(path, 0o700)
            self._dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            os.mkdir(F.PARTS, 0o700, dir_fd=self._dirfd)
            self._partsfd = os.open(F.PARTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._dirfd)
            hold_lock(self._dirfd)
        except FileExistsError:
            raise OutputError(f"{path} appeared while starting; not overwriting it") from None
        except OSError as e:
            raise OutputError(f"cannot create trace directory {path}: {e.strerror}") from None
        self.bytes_written = 0
        self.sync_s = sync_s
        self.small_part_bytes = small_part_bytes
        self._clock = clock
        self._synced_at = clock()
        self._unsynced: list[str] = []  # parts renamed into place, not handed to the fsync thread yet
        self._pool: ThreadPoolExecutor | None = None  # the fsync thread, started with the first batch
        self._batch: Future | None = None  # the batch it is fsyncing
        self.syncs = 0  # batches fsynced (tests, bench)
        self.hold_s = hold_s
        self._held = HeldParts(hold_s, clock)  # small parts not written yet
        self.parts_written = 0  # Parquet files (tests, bench)
        self._sums = ChecksumList()  # parts/checksums

    def _fail(self, name: str, e: OSError) -> OutputError:
        if e.errno == errno.ENOSPC or "No space left" in str(e):
            return OutputError(f"disk full while writing {self.path}; the intervals already written are kept")
        return OutputError(f"cannot write {self.path}/{name}: {e.strerror or e}")

    def _atomic(self, dirfd: int, name: str, fill, sync: bool, part: bool = False, crc: int | None = None) -> int:
        """Create `name` under a temporary name, fill(fd) it and rename it into place: a file that
        exists is whole. With `sync` the file is fsynced before the rename and the directory
        after it. fill returns False to write nothing (the temporary file is removed). A `part`
        is listed in parts/checksums after its rename, with `crc` (None: read back from the
        file). Returns the bytes written."""
        tmp = f".{name}.tmp"
        try:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
            try:
                keep = fill(fd) is not False
                size = os.fstat(fd).st_size
                if keep and part and crc is None:
                    size, crc = C.crc_fd(fd)
                if keep and sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if not keep:
                os.unlink(tmp, dir_fd=dirfd)
                return 0
            os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            if sync:
                os.fsync(dirfd)
            if part:  # listed after its rename (and, with sync, after the rename is on disk)
                self._sums.add(self._partsfd, name, size, crc or 0, sync)
        except OSError as e:  # pyarrow's ArrowIOError is an OSError too
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            raise self._fail(name, e) from None
        except BaseException:  # e.g. the source of a streamed part failed: no temporary file left
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            raise
        self.bytes_written += size
        return size

    def _atomic_write(self, dirfd: int, name: str, data, sync: bool, part: bool = False) -> int:
        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]

        return self._atomic(dirfd, name, fill, sync, part, zlib.crc32(data) if part else None)

    def _part_written(self, table: str, name: str, size: int) -> None:
        if size and self.sync_s > 0:
            self._unsynced.append(name)
        # A batch ends with an interval (its `intervals` part is its last): a batch is whole intervals.
        if table == "intervals" and self._clock() - self._synced_at >= self.sync_s:
            self._synced_at = self._clock()
            self._wait_batch()  # one batch in flight at most: a slow disk slows the writer, no queue grows
            names, self._unsynced = self._unsynced, []
            if names:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="trace-fsync")
                self._batch = self._pool.submit(self._fsync, names)

    def _wait_batch(self) -> None:
        """Wait for the batch being fsynced; its error (OutputError) is raised here."""
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.result()

    def write_part(self, table: str, seq: int, data: pa.Table) -> None:
        if data.num_rows == 0 and table != "intervals":
            return
        nbytes = data.get_total_buffer_size()
        if self.hold_s > 0 and nbytes < self.small_part_bytes:
            if self._held.hold(table, seq, data, nbytes):
                self.write_held()
            return
        self.write_held()  # first: a part's rows come after those of its table's part before it
        self._write(table, seq, data, nbytes)

    def _write(self, table: str, seq: int, data: pa.Table, nbytes: int) -> None:
        buf = io.BytesIO()
        pq.write_table(data, buf, **parquet_options(table, nbytes, self.small_part_bytes))
        name = F.part_name(table, seq)
        self._part_written(
            table, name, self._atomic_write(self._partsfd, name, buf.getbuffer(), self.sync_s <= 0, part=True)
        )
        self.parts_written += 1

    def write_held(self) -> None:
        """Write the held parts (held.py): per table one part of all its rows, named with its last
        seq; the `intervals` part last (a reader takes nothing named after the last one)."""
        for table, seq, data in self._held.take():
            self._write(table, seq, data, data.get_total_buffer_size())

    def write_part_batches(self, table: str, seq: int, schema: pa.Schema, batches) -> int:
        """Stream record batches (an iterable, consumed once) into one part, one row group per
        batch, so a table of millions of rows is never held whole in memory (zstd: such a part
        is large). Same guarantees as write_part: temporary name, rename; nothing is written
        when there are no rows. Returns the rows written."""
        rows = 0
        self.write_held()

        def fill(fd: int) -> bool:
            nonlocal rows
            with (
                os.fdopen(fd, "wb", buffering=1 << 20, closefd=False) as f,
                pq.ParquetWriter(f, schema, **parquet_options(table, None)) as pw,
            ):
                for b in batches:
                    if b.num_rows:
                        pw.write_batch(b)
                        rows += b.num_rows
            return rows > 0 or table == "intervals"

        name = F.part_name(table, seq)
        self._part_written(table, name, self._atomic(self._partsfd, name, fill, self.sync_s <= 0, part=True))
        return rows

    def sync(self) -> None:
        """Write what is held; fsync every part written so far, then their directory; returns
        when they are on disk."""
        self.write_held()
        self._wait_batch()
        names, self._unsynced = self._unsynced, []
        self._synced_at = self._clock()
        self._fsync(names)

    def _fsync(self, names: list[str]) -> None:
        """fsync these parts, then their directory (on the fsync thread, or inline)."""
        if not names:
            return
        for name in names:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._partsfd)
            except FileNotFoundError:  # removed by someone else: nothing to keep
                continue
            except OSError as e:
                raise self._fail(name, e) from None
            try:
                os.fsync(fd)
            except OSError as e:
                raise self._fail(name, e) from None
            finally:
                os.close(fd)
        try:  # the renames before the list: a power loss never leaves a line of a part not renamed
            os.fsync(self._partsfd)
            self._sums.fsync()
        except OSError as e:
            raise self._fail(F.PARTS, e) from None
        self.syncs += 1

    @property
    def parts_fd(self) -> int:
        """The parts directory (a reader of the parts written so far: tracer/watch/keep.py)."""
        return self._partsfd

    def replace_parts(self, fill) -> None:
        """Replace the whole parts directory in one step (`allocscope watch --keep`: old intervals
        dropped, tracer/watch/keep.py): what is held is written and every part fsynced, then
        `fill(new_dirfd, old_dirfd)` fills a new directory beside it (hard links of the parts that
        stay, the new ones written and fsynced), its parts/checksums is written (the lines of the
        linked parts, fresh ones for those written), and the two are exchanged atomically
        (renameat2 RENAME_EXCHANGE): a reader, or a crash at any moment, sees the old set or the
        new one, never a mix. The old set is removed after."""
        self.sync()
        new, old = f".{F.PARTS}.new", f".{F.PARTS}.old"
        for stale in (new, old):
            _remove_dir(self._dirfd, stale)
        try:
            os.mkdir(new, 0o700, dir_fd=self._dirfd)
            newfd = os.open(new, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._dirfd)
            try:
                fill(newfd, self._partsfd)
                sums = self._sums.relist(newfd, self._partsfd)
                self._atomic_write(newfd, C.NAME, C.render(sums), True)
                os.fsync(newfd)
            finally:
                os.close(newfd)
            _exchange(self._dirfd, new, F.PARTS)
            os.fsync(self._dirfd)
            os.close(self._partsfd)
            self._partsfd = os.open(F.PARTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._dirfd)
            self._sums.reopen(self._partsfd, sums)
            os.rename(new, old, src_dir_fd=self._dirfd, dst_dir_fd=self._dirfd)
        except OSError as e:
            _remove_dir(self._dirfd, new)
            raise self._fail(F.PARTS, e) from None
        _remove_dir(self._dirfd, old)

    def write_meta(self, meta: dict) -> None:
        """Rewrite meta.json, fsynced, after fsyncing every part before it: `complete: true`
        on disk means every part is. It says `checksums`: the parts are listed."""
        self.sync()
        meta = {**meta, "checksums": C.ALGORITHM}
        data = json.dumps(meta, indent=1, sort_keys=True, default=str).encode()
        self._atomic_write(self._dirfd, F.META, data, True)

    def close(self) -> None:
        if getattr(self, "_partsfd", -1) >= 0:
            try:  # an interrupted recording: its last parts get their fsync too, where it can
                self.sync()
            except OutputError:
                pass
            finally:
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                    self._pool = None
        if hasattr(self, "_sums"):
            self._sums.close()
        for fd in (getattr(self, "_partsfd", -1), getattr(self, "_dirfd", -1)):
            if fd >= 0:
                os.close(fd)
        self._partsfd = self._dirfd = -1


def _exchange(dirfd: int, a: str, b: str) -> None:
    """Swap two names of one directory atomically (renameat2 RENAME_EXCHANGE, Linux 3.15)."""
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(dirfd, a.encode(), dirfd, b.encode(), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _remove_dir(dirfd: int, name: str) -> None:
    """Remove directory `name` (of dirfd) and the files in it; nothing if it is not there."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
    except OSError:
        return
    try:
        for n in os.listdir(fd):
            try:
                os.unlink(n, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dirfd)
    except OSError:
        pass


class NullWriter:
    """A TraceWriter that keeps nothing: `allocscope top` without -o writes nothing to disk."""

    path = ""
    bytes_written = 0

    def write_meta(self, meta: dict) -> None:
        pass

    def write_part(self, table: str, seq: int, tab) -> None:
        pass

    def write_part_batches(self, table: str, seq: int, schema, batches) -> None:
        for _ in batches:  # still consumed: the batches read the kernel's maps
            pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass
