"""CPython frames symbolized offline (docs/python.md): a code object's location table
(`co_linetable`, 3.11+: CPython's Objects/locations.md) mapped to the line of an instruction,
and the trace's `pyframes` + `pycode` tables to (function, file, line, entry) per stack.

The recorder kept, per stack, each frame's code object address and instruction index (code
units) and, per code object, its qualified name, file, first line and location table, read
from the running process (tracer/runtimes/python.py): nothing here needs the process.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

PY_MODULE = "python"  # the module of a Python frame (FrameInfo.module): not a file
ENTRY_CUT = 2  # pyframes.entry's bit (tracer/runtimes/python.py): the outer frames were cut after this one


class PyFrame(NamedTuple):
    function: str  # the code object's qualified name (Class.method, outer.<locals>.inner)
    file: str
    line: int | None
    entry: bool  # the first frame an _PyEval_EvalFrameDefault call ran (where a C frame sits above)


# `pyframes.entry` holds 1 on an eval loop's first frame; ENTRY_CUT on the last frame of a stack
# deeper than the probe keeps (AS_PY_DEPTH): python_frames then adds a frame saying so (cut_label)
# after it, in the same eval loop's run, so the report never shows a cut stack as whole.


def _varint(table: bytes, i: int) -> tuple[int, int]:
    b = table[i]
    val, shift, i = b & 63, 6, i + 1
    while b & 64:
        b = table[i]
        val |= (b & 63) << shift
        shift += 6
        i += 1
    return val, i


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    v, i = _varint(table, i)
    return (-(v >> 1) if v & 1 else v >> 1), i


def line_ranges(table: bytes, firstlineno: int) -> list[tuple[int, int, int | None]]:
    """(first code unit, end code unit, line or None) of each entry of a 3.11+ location table."""
    out: list[tuple[int, int, int | None]] = []
    line, addr, i, n = firstlineno, 0, 0, len(table)
    try:
        while i < n:
            first = table[i]
            i += 1
            code, length = (first >> 3) & 15, (first & 7) + 1
            this: int | None = line
            if code == 15:  # no location
                this = None
            elif code == 14:  # long form: line delta, end line, column, end column
                delta, i = _svarint(table, i)
                line += delta
                this = line
                for _ in range(3):
                    _, i = _varint(table, i)
            elif code == 13:  # no column
                delta, i = _svarint(table, i)
                line += delta
                this = line
            elif code >= 10:  # one line: the delta in the code, then two column bytes
                line += code - 10
                this = line
                i += 2
            else:  # short form: same line, one column byte
                i += 1
            out.append((addr, addr + length, this))
            addr += length
    except IndexError:  # a damaged table: what was read
        pass
    return out


def line_at(table: bytes, firstlineno: int, lasti: int) -> int | None:
    """The line of instruction `lasti` (code units); the first line for a frame that has not
    started (lasti < 0)."""
    if lasti < 0:
        return firstlineno
    for lo, hi, line in line_ranges(table, firstlineno):
        if lo <= lasti < hi:
            return line
    return None


def python_frames(pyframes: pd.DataFrame, pycode: pd.DataFrame) -> dict[int, list[PyFrame]]:
    """stack id -> its Python frames, innermost first (stacks without any are left out)."""
    if pyframes.empty:
        return {}
    codes: dict[int, tuple[str, str, int, bytes]] = {}
    cols = ("code", "qualname", "name", "file", "firstlineno", "linetable")
    for code, qual, name, file, first, table in zip(*(pycode[c] for c in cols)) if not pycode.empty else ():
        codes[int(code)] = (qual if isinstance(qual, str) and qual else name, file, int(first), bytes(table or b""))
    lines: dict[tuple[int, int], int | None] = {}
    out: dict[int, list[PyFrame]] = {}
    fr = pyframes.drop_duplicates(["stack_id", "idx"]).sort_values(["stack_id", "idx"])
    for sid, idx, code, lasti, flags in zip(fr["stack_id"], fr["idx"], fr["code"], fr["lasti"], fr["entry"]):
        entry, cut = bool(int(flags) & 1), bool(int(flags) & ENTRY_CUT)
        c = codes.get(int(code))
        if c is None:
            f = PyFrame(f"[python code {int(code):#x}]", "", None, entry and not cut)
        else:
            key = (int(code), int(lasti))
            if key not in lines:
                lines[key] = line_at(c[3], c[2], int(lasti))
            f = PyFrame(c[0], c[1], lines[key], entry and not cut)
        frames = out.setdefault(int(sid), [])
        frames.append(f)
        if cut:  # the probe kept idx + 1 frames, the outer ones it did not read: said, in their place
            frames.append(PyFrame(cut_label(int(idx) + 1), "", None, entry))
    return out


def cut_label(kept: int) -> str:
    """The frame standing for a stack's outer Python frames the probe did not keep."""
    return f"[outer Python frames cut: {kept} kept]"
