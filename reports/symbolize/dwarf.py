"""Encodings every DWARF section shares (DWARF 2-5): LEB128 numbers, NUL-terminated strings,
string-section lookups and unit initial lengths. Used by the line-program reader (lines.py) and
the .debug_info reader (dies.py)."""

from __future__ import annotations

from typing import Literal

ByteOrder = Literal["little", "big"]


class Malformed(Exception):
    """DWARF data this reader can't decode (a header, a form, a version)."""


def uleb(buf: bytes, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 at `pos`: (value, offset after it)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def sleb(buf: bytes, pos: int) -> tuple[int, int]:
    """Signed LEB128 at `pos`: (value, offset after it)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if byte & 0x40:
                result -= 1 << shift
            return result, pos


def cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """NUL-terminated string at `pos`: (text, offset after the NUL)."""
    end = buf.index(b"\0", pos)
    return buf[pos:end].decode("utf-8", "surrogateescape"), end + 1


def string_at(data: bytes, offset: int) -> str | None:
    """The string at `offset` of a string section (.debug_str, .debug_line_str), None past its end."""
    if offset >= len(data):
        return None
    end = data.find(b"\0", offset)
    return data[offset : end if end >= 0 else len(data)].decode("utf-8", "surrogateescape")


def initial_length(buf: bytes, pos: int, order: ByteOrder) -> tuple[int, int, int]:
    """A DWARF unit's initial length at `pos`: (length, offset of what follows, offset size),
    the 64-bit form (0xffffffff escape) included."""
    length = int.from_bytes(buf[pos : pos + 4], order)
    if length == 0xFFFFFFFF:
        return int.from_bytes(buf[pos + 4 : pos + 12], order), pos + 12, 8
    return length, pos + 4, 4
