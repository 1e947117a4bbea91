"""Each part's size and CRC-32, so that a reader can tell a part as written from a damaged,
truncated or missing one (docs/trace-format.md, "Checksums"). No pyarrow here.

    TRACE/parts/checksums     one line per part: `<name> <size> <crc32, 8 hex digits>`

The writer appends a part's line just after renaming the part into place (writer.py), and
fsyncs the list with the parts. Appending keeps it crash-safe the way the parts are: after a
SIGKILL of the tracer the list holds every part but, at most, the one renamed last (read as
"not verifiable", never as damaged); a last line without its newline is a write cut short.
A name listed twice is the later line's. `watch --keep` exchanges the parts directory whole
(TraceWriter.replace_parts): the new directory gets a list of its own, written whole before the
exchange, with the lines of the parts linked from the old one and fresh ones for the parts
written into it, so a reader sees the old list with the old parts or the new with the new.

meta.json's `checksums` ("crc32") says the writer kept the list: a trace that says so and has
no list has lost it. Traces written before the list read as before, "not verifiable".
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass

NAME = "checksums"  # parts/checksums
ALGORITHM = "crc32"  # meta.json `checksums`
HEADER = b"# allocscope parts checksums: name size crc32\n"
CHUNK = 1 << 20
_LINE = re.compile(rb"([A-Za-z0-9_.-]+) ([0-9]+) ([0-9a-f]{8})")


@dataclass(frozen=True)
class Sum:
    size: int
    crc: int


def line(name: str, size: int, crc: int) -> bytes:
    return f"{name} {size} {crc:08x}\n".encode()


def crc_fd(fd: int) -> tuple[int, int]:
    """(size, CRC-32) of the file open at `fd`, read from its start (pread: the offset stays)."""
    crc, off = 0, 0
    while True:
        b = os.pread(fd, CHUNK, off)
        if not b:
            return off, crc
        crc = zlib.crc32(b, crc)
        off += len(b)


def crc_file(name: str, dir_fd: int | None = None) -> tuple[int, int]:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return crc_fd(fd)
    finally:
        os.close(fd)


def parse(data: bytes) -> tuple[dict[str, Sum], str | None]:
    """The list's entries, and what is wrong with it (None: nothing). A last line without its
    newline (an append cut short by a kill) is left out, not wrong."""
    sums: dict[str, Sum] = {}
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line cut short
    for i, raw in enumerate(lines, 1):
        if not raw or raw.startswith(b"#"):
            continue
        m = _LINE.fullmatch(raw)
        if m is None:
            return sums, f"line {i} of parts/{NAME} is not `name size crc32`"
        sums[m.group(1).decode()] = Sum(int(m.group(2)), int(m.group(3), 16))
    return sums, None


def render(sums: dict[str, Sum]) -> bytes:
    return HEADER + b"".join(line(n, s.size, s.crc) for n, s in sorted(sums.items()))


def check(path: str, want: Sum) -> str | None:
    """What is wrong with the part at `path` against its listed size and CRC (None: nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "missing (the checksum list has it)"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    try:
        size = os.fstat(fd).st_size
        if size != want.size:
            if size == 0:
                return f"empty (written {want.size} bytes)"
            if size < want.size:
                return f"truncated ({size} of the {want.size} bytes written)"
            return f"{size} bytes, {want.size} written"
        _, crc = crc_fd(fd)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    finally:
        os.close(fd)
    if crc != want.crc:
        return f"not as written: its bytes changed (CRC-32 {crc:08x}, written {want.crc:08x})"
    return None
