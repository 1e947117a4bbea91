"""--embed-symbols: the symbol tables of the modules on a trace's stacks, stored in the trace.

A trace names frames by module + build ID + file offset and is symbolized from the module files
wherever the report runs. With --embed-symbols the Recorder also stores, for every module that
appears on a stack, its function symbols as the symbolizer would use them (.symtab, the
separate debug file's .symtab, .dynsym; common.elf.module_symbols), so the trace can be
symbolized on a machine that has none of these files:

    TRACE/parts/symbols-<seq>.parquet   seq, build_id, module, start, size, name

`start` is a file offset (like the `offset` of `stacks`), `size` the bytes the function covers,
`name` the raw (mangled) symbol. A module's symbols go into the part of the interval that first
put it on a stack. File and line numbers are not embedded. reports/symbolize/embedded.py reads them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa

from common.elf import DEBUG_DIRS, build_id, module_symbols
from common.tracefile.format import SYMBOLS_SCHEMA

from ..process.mappings import DELETED, live_file
from ..process.procfs import read_maps


class SymbolEmbedder:
    """Owned by the Recorder: remembers which (module, build ID) pairs were embedded and makes the
    `symbols` part for the ones a new batch of stacks adds. Without --embed-symbols (`gone_only`)
    only the modules a report could not read back: deleted or replaced on disk since the target
    mapped them (a daemon running on across a package upgrade), read through /proc/PID/map_files
    while the target lives; once it has ended, nothing could name their frames."""

    def __init__(self, debug_dirs: Iterable[str] = DEBUG_DIRS, pid: int = 0, gone_only: bool = False) -> None:
        self.debug_dirs = tuple(debug_dirs)
        self.embedded: set[tuple[str, str]] = set()  # (module path, build ID) already in the trace
        self.pid = pid
        self.gone_only = gone_only

    def new_modules(self, stack_cols: dict[str, list]) -> list[tuple[str, str]]:
        """(module, build ID) of the file-backed frames of `stack_cols` (columns of a `stacks`
        part) not embedded yet, in order of appearance; they count as embedded from now on."""
        new = []
        for mod, bid, off in zip(stack_cols["module"], stack_cols["build_id"], stack_cols["offset"]):
            key = (mod, bid)
            if off >= 0 and mod and key not in self.embedded:
                self.embedded.add(key)
                new.append(key)
        return new

    def part(self, seq: int, stack_cols: dict[str, list]) -> pa.Table:
        """The `symbols` part of interval `seq` for the modules the stacks written now bring in
        (no rows when they bring none)."""
        cols: dict[str, list] = {n: [] for n in SYMBOLS_SCHEMA.names}
        for path, bid in self.new_modules(stack_cols):
            clean = path.removesuffix(DELETED)
            source = self._gone(clean, bid)
            if source is None and self.gone_only:
                continue  # on disk as traced: the report reads it there
            for start, size, name in module_symbols(source or clean, bid or None, self.debug_dirs):
                cols["seq"].append(seq)
                cols["build_id"].append(bid or "")
                cols["module"].append(path)
                cols["start"].append(start)
                cols["size"].append(size)
                cols["name"].append(name)
        return pa.table(cols, schema=SYMBOLS_SCHEMA)

    def _gone(self, path: str, bid: str) -> str | None:
        """Where to read `path` from when it is no longer on disk as the target mapped it (deleted,
        or another build there now): its mapping in /proc/PID/map_files; None when it is."""
        if os.path.exists(path) and (not bid or build_id(path) == bid):
            return None
        try:
            maps = read_maps(self.pid) if self.pid else []
        except OSError:
            maps = []
        for m in maps:
            if m.path == path + DELETED:
                return live_file(self.pid, m)
        return None
