"""Crash-safe trace writer: every part is written under a temporary name, fsynced and renamed;
meta.json is rewritten the same way and says `complete: true` only after the last part.

Files are created 0600 inside a 0700 directory, never through a symlink, and the writer never
replaces a path that is not an allocscope trace.
"""
from __future__ import annotations

import errno
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import OutputError

from . import format as F
from .paths import check_output, is_trace_dir, prepare_output  # noqa: F401 (their home: no pyarrow)

SMALL_PART_BYTES = 64 << 10  # parts under this (in memory) are not compressed


class TraceWriter:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.mkdir(path, 0o700)
            self._dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            os.mkdir(F.PARTS, 0o700, dir_fd=self._dirfd)
            self._partsfd = os.open(F.PARTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                    dir_fd=self._dirfd)
        except FileExistsError:
            raise OutputError(f"{path} appeared while starting; not overwriting it") from None
        except OSError as e:
            raise OutputError(f"cannot create trace directory {path}: {e.strerror}") from None
        self.bytes_written = 0

    def _atomic(self, dirfd: int, name: str, fill) -> int:
        """Create `name` under a temporary name, fill(fd) it, fsync and rename it into place:
        a file that exists is whole. fill returns False to write nothing (the temporary file is
        removed). Returns the bytes written."""
        tmp = f".{name}.tmp"
        try:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dirfd)
            try:
                keep = fill(fd) is not False
                size = os.fstat(fd).st_size
                if keep:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if not keep:
                os.unlink(tmp, dir_fd=dirfd)
                return 0
            os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except OSError as e:  # pyarrow's ArrowIOError is an OSError too
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            if e.errno == errno.ENOSPC or "No space left" in str(e):
                raise OutputError(f"disk full while writing {self.path}; "
                                  "the intervals already written are kept") from None
            raise OutputError(f"cannot write {self.path}/{name}: {e.strerror or e}") from None
        except BaseException:  # e.g. the source of a streamed part failed: no temporary file left
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            raise
        self.bytes_written += size
        return size

    def _atomic_write(self, dirfd: int, name: str, data: bytes) -> None:
        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        self._atomic(dirfd, name, fill)

    def write_part(self, table: str, seq: int, data: pa.Table) -> None:
        if data.num_rows == 0 and table != "intervals":
            return
        buf = io.BytesIO()
        # A part of a few rows (every interval's `intervals` row, 70 columns) gains nothing from zstd
        # and its per-column compressor costs ~3 ms: small parts are written uncompressed.
        comp = "zstd" if data.nbytes >= SMALL_PART_BYTES else "none"
        pq.write_table(data, buf, compression=comp, **F.PARQUET_OPTIONS.get(table, {}))
        self._atomic_write(self._partsfd, F.part_name(table, seq), buf.getvalue())

    def write_part_batches(self, table: str, seq: int, schema: pa.Schema, batches) -> int:
        """Stream record batches (an iterable, consumed once) into one part, one row group per
        batch, so a table of millions of rows is never held whole in memory. Same guarantees as
        write_part: temporary name, fsync, rename; nothing is written when there are no rows.
        Returns the rows written."""
        rows = 0

        def fill(fd: int) -> bool:
            nonlocal rows
            with os.fdopen(fd, "wb", buffering=1 << 20, closefd=False) as f, \
                    pq.ParquetWriter(f, schema, compression="zstd", **F.PARQUET_OPTIONS.get(table, {})) as pw:
                for b in batches:
                    if b.num_rows:
                        pw.write_batch(b)
                        rows += b.num_rows
            return rows > 0 or table == "intervals"
        self._atomic(self._partsfd, F.part_name(table, seq), fill)
        return rows

    def write_meta(self, meta: dict) -> None:
        data = json.dumps(meta, indent=1, sort_keys=True, default=str).encode()
        self._atomic_write(self._dirfd, F.META, data)

    def close(self) -> None:
        for fd in (getattr(self, "_partsfd", -1), getattr(self, "_dirfd", -1)):
            if fd >= 0:
                os.close(fd)
        self._partsfd = self._dirfd = -1


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

    def close(self) -> None:
        pass
