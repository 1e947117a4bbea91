"""Symbol tables carried inside a trace (`allocscope record --embed-symbols`): the reading side.

tracer/record/embed_symbols.py stores, for every module that appears on a stack, its function symbols in
`symbols` parts (seq, build_id, module, start = file offset, size, name = raw symbol). Reports
use them only for frames the module files cannot resolve (file missing, or another build on
disk); they demangle the names. File and line numbers are not embedded.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from common.tracefile import format as F

from .demangle import demangle

TABLE = F.SYMBOLS


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
    rows: list[tuple[str, str, int, int, str]] = []
    try:
        names = sorted(os.listdir(pdir))
    except OSError:
        names = []
    for n in names:
        if not (n.startswith(TABLE + "-") and n.endswith(".parquet")):
            continue
        seq = n[len(TABLE) + 1 : -len(".parquet")]
        if not seq.isdigit() or int(seq) > trace.last_seq:
            continue
        try:
            t = pq.read_table(os.path.join(pdir, n)).to_pydict()
        except (OSError, pa.ArrowException):
            continue
        rows += zip(t["build_id"], t["module"], t["start"], t["size"], t["name"])
    return EmbeddedSymbols(rows)
