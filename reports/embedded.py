"""Symbol tables carried inside a trace (`allocscope record --embed-symbols`).

A trace normally names frames by module + build ID + file offset and is symbolized from the
module files (and their debug files) wherever the report runs. With --embed-symbols the
recorder also stores, for every module that appears on a stack, its function symbols as the
symbolizer would use them (.symtab, the separate debug file's .symtab, .dynsym), so the trace
can be symbolized on a machine that has none of these files:

    TRACE/parts/symbols-<seq>.parquet   seq, build_id, module, start, size, name

`start` is a file offset (like the `offset` of `stacks`), `size` the bytes the function covers,
`name` the raw (mangled) symbol; reports demangle it. Parts are written in the interval that
first needed the module, under the same crash-safe rules as every other part. Reports use them
only for frames the module files cannot resolve (file missing, or another build on disk); file
and line numbers are not embedded.
"""
from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from common.elf import module_symbols
from common.tracefile import format as F

from .symbolize import demangle

TABLE = "symbols"
SCHEMA = pa.schema([("seq", pa.int32()), ("build_id", pa.string()), ("module", pa.string()),
                    ("start", pa.uint64()), ("size", pa.uint64()), ("name", pa.string())])


def symbols_table(seq: int, modules: Iterable[tuple[str, str]]) -> pa.Table:
    """The `symbols` part for (module path, build id) pairs."""
    cols: dict[str, list] = {n: [] for n in SCHEMA.names}
    for path, bid in modules:
        clean = path.removesuffix(" (deleted)")
        for start, size, name in module_symbols(clean, bid or None):
            cols["seq"].append(seq)
            cols["build_id"].append(bid or "")
            cols["module"].append(path)
            cols["start"].append(start)
            cols["size"].append(size)
            cols["name"].append(name)
    return pa.table(cols, schema=SCHEMA)


def embed_new_modules(recorder, seq: int, stack_cols: dict[str, list]) -> None:
    """Recorder hook: write the symbols of modules first seen on the stacks written now."""
    done: set = recorder.__dict__.setdefault("_embedded_modules", set())
    new = []
    for mod, bid, off in zip(stack_cols["module"], stack_cols["build_id"], stack_cols["offset"]):
        key = (mod, bid)
        if off >= 0 and mod and key not in done:
            done.add(key)
            new.append(key)
    if new:
        recorder.writer.write_part(TABLE, seq, symbols_table(seq, new))


class EmbeddedSymbols:
    """Lookup of embedded symbols by (build id or module path, file offset)."""

    def __init__(self, rows: Iterable[tuple[str, str, int, int, str]]) -> None:
        tables: dict[str, list[tuple[int, int, str]]] = {}
        for bid, module, start, size, name in rows:
            for key in {bid, module} - {""}:
                tables.setdefault(key, []).append((start, size, name))
        self._tables = {}
        for key, syms in tables.items():
            syms.sort()
            self._tables[key] = ([s[0] for s in syms], syms)

    def __bool__(self) -> bool:
        return bool(self._tables)

    def lookup(self, build_id: str | None, module: str, offset: int, return_address: bool = True) -> str | None:
        """Demangled name of the function covering `offset` (offset - 1 for return addresses)."""
        t = self._tables.get(build_id or "") or self._tables.get(module)
        if t is None:
            return None
        look = offset - 1 if return_address and offset > 0 else offset
        starts, syms = t
        i = bisect_right(starts, look) - 1
        for j in range(i, max(i - 8, -1), -1):
            start, size, name = syms[j]
            if start <= look < start + max(size, 1):
                return demangle(name)
        return None


def load(trace) -> EmbeddedSymbols:
    """The embedded symbols of a loaded trace (parts up to its last finished interval)."""
    pdir = os.path.join(trace.path, F.PARTS)
    rows = []
    try:
        names = sorted(os.listdir(pdir))
    except OSError:
        names = []
    for n in names:
        if not (n.startswith(TABLE + "-") and n.endswith(".parquet")):
            continue
        seq = n[len(TABLE) + 1:-len(".parquet")]
        if not seq.isdigit() or int(seq) > trace.last_seq:
            continue
        try:
            t = pq.read_table(os.path.join(pdir, n)).to_pydict()
        except (OSError, pa.ArrowException):
            continue
        rows += zip(t["build_id"], t["module"], t["start"], t["size"], t["name"])
    return EmbeddedSymbols(rows)
