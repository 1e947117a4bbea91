"""The in-kernel unwinder's maps for one target: `urows` (every module's rows, a contiguous slice
each), the `umaps` LPM trie (address prefix -> slice, load bias) kept in step with the target's
executable mappings, and the modules pending (`upending`: stacks cut short there) until built
(tracer/unwind/building.py). Nothing here needs BCC: `Unwinder` gets the BCC table objects from
tracer/bpf/."""

from __future__ import annotations

import ctypes as ct
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ..base.cachedir import cache_dir
from ..process.procfs import Mapping
from . import building
from .building import POLL_S, BuildPool, build_all, load_rows, peek, prefixes
from .rows import MAX_SLICE

# --------------------------------------------------------------------------- BPF side

MODULE_SLOTS = 1024  # `upending` entries (AS_UNWIND_MODULES, probes/unwind_dwarf.h); slot 0: their sum
UMAP_PENDING = 1  # as_umap.flags (AS_UMAP_PENDING)


@dataclass
class Module:
    key: str
    path: str
    begin: int  # first row in `urows`
    count: int
    slices: list[tuple[int, int, int, int]]  # (pc_lo, pc_hi, begin, count)
    cached: bool
    seconds: float
    slot: int = 0  # in `upending` (pending modules)
    pending: bool = False  # registered, rows not loaded yet


@dataclass
class Pending:
    """A module registered without its rows: the stacks cut short there, and its build."""

    module: Module
    open_path: str  # the file to build from (/proc/PID/map_files/...)
    cfi_bytes: int
    stacks: int = 0  # stacks cut short at it (upending[slot])
    first_ns: int = 0
    last_ns: int = 0
    future: Future | None = None  # its build, while it runs
    built_ns: int = 0  # when its rows went in (CLOCK_MONOTONIC), 0: not yet
    build_s: float = 0.0
    rows: int = 0
    error: str = ""


class UmapKey(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("addr", ct.c_uint8 * 8)]


class Umap(ct.Structure):
    _fields_ = [
        ("bias", ct.c_uint64),
        ("begin", ct.c_uint32),
        ("count", ct.c_uint32),
        ("module", ct.c_uint32),
        ("flags", ct.c_uint32),
    ]


class Urow(ct.Structure):
    _fields_ = [("pc", ct.c_uint32), ("cfa_off", ct.c_int16), ("cfa_type", ct.c_uint8), ("rbp_off", ct.c_uint8)]


class Upending(ct.Structure):
    _fields_ = [("stacks", ct.c_uint64), ("first_ns", ct.c_uint64), ("last_ns", ct.c_uint64)]


MAP_LAYOUTS = {"urows": (ct.c_uint32, Urow), "umaps": (UmapKey, Umap), "upending": (ct.c_uint32, Upending)}


def slices_of(n: int, rows: np.ndarray, begin: int) -> list[tuple[int, int, int, int]]:
    out = []
    for a in range(0, n, MAX_SLICE):
        b = min(n, a + MAX_SLICE)
        lo = int(rows["pc"][a]) if a else 0
        hi = int(rows["pc"][b]) if b < n else 1 << 32
        out.append((lo, hi, begin + a, b - a))
    return out


class Unwinder:
    """Keeps the BPF unwind maps in step with the target's executable mappings.

    Lazy (`record --pid`, `top --pid`): a module whose rows are cached is loaded at once; any
    other is registered pending (its whole mapping in `umaps`, no rows) unless its CFI is tiny.
    tick() — called by the recorder's loop — reads `upending`, builds the modules stacks crossed
    in a BuildPool, most-hit first, and loads them. Eager (launch mode): every module's rows are
    loaded before the mapping is entered (preload: all at once in the pool)."""

    def __init__(
        self,
        bpf,
        pid: int,
        capacity: int,
        progress: Callable[[str], None] | None = None,
        use_cache: bool = True,
        update_batch=None,
        lazy: bool = True,
        workers: int | None = None,
    ) -> None:
        self.pid = pid
        self.rows_map = bpf[b"urows"]
        self.lpm = bpf[b"umaps"]
        self.gen_map = bpf[b"ugen"]  # the probes' stack cache drops what it kept when this moves
        self.pend_map = bpf[b"upending"]
        self.gen = 0
        self.capacity = capacity
        self.progress = progress or (lambda _m: None)
        self.use_cache = use_cache
        self.lazy = lazy
        self.pool = BuildPool(workers, use_cache)
        self._update_batch = update_batch
        self.next_row = 0
        self.next_slot = 1
        self.inline_cfi, self.inline_left, _ = building.build_costs()
        self.modules: dict[str, Module] = {}
        self.by_file: dict[tuple[str, int], str | None] = {}  # (path, inode) -> module key
        self.pending: dict[str, Pending] = {}  # key -> every module that was registered pending
        self.prebuilt: dict[str, np.ndarray] = {}  # preload: rows built in the pool (a cache that cannot be written)
        self.failed: dict[str, str] = {}
        self.entries: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        self.seconds = 0.0
        self.t0_ns = time.monotonic_ns()  # the recording's start (the recorder sets it once the probes are live)
        self._maps: list[Mapping] = []
        self._next_poll = 0
        self._total = 0  # upending[0].stacks when last read

    # -- modules ---------------------------------------------------------------------------

    def _open_path(self, m: Mapping) -> str:
        """The mapped file: /proc/PID/map_files survives deletion and mount namespaces."""
        mf = f"/proc/{self.pid}/map_files/{m.start:x}-{m.end:x}"
        if m.start and os.path.exists(mf):
            return mf
        return m.path.removesuffix(" (deleted)")

    def module(self, m: Mapping) -> Module | None:
        ident = (m.path, m.inode)
        if ident in self.by_file:
            key = self.by_file[ident]
            return self.modules.get(key) if key else None
        t0 = time.perf_counter()
        path = self._open_path(m)
        try:
            key, rows, cfi = peek(path, self.use_cache)
            if key in self.modules:
                self.by_file[ident] = key
                return self.modules[key]
            cached = rows is not None
            if rows is not None and self.lazy and self.next_row + len(rows) > self.capacity // 2:
                # Warm but big: the table is kept for the modules stacks cross. Past half of it
                # at attach, a cached module waits like an unbuilt one (loaded from the cache,
                # in milliseconds, once a stack crosses it): a process whose every table is
                # cached (doctor --warm) cannot fill the table with modules no stack reaches.
                return self._pend(ident, key, m.path, path, cfi)
            if rows is None and key in self.prebuilt:
                rows = self.prebuilt.pop(key)
            elif rows is None:
                if self.lazy and not cfi <= min(self.inline_cfi, self.inline_left):
                    return self._pend(ident, key, m.path, path, cfi)
                if self.lazy:
                    self.inline_left -= cfi
                key, rows, cached = load_rows(path, self.use_cache)
        except Exception as e:  # noqa: BLE001 - any malformed ELF/CFI: that module falls back
            self.failed[m.path] = f"unreadable: {type(e).__name__}: {str(e)[:120]}"
            self.by_file[ident] = None
            return None
        mod = self._add(key, m.path, rows, cached, time.perf_counter() - t0)
        self.by_file[ident] = key if mod is not None else None
        return mod

    def _add(self, key: str, path: str, rows: np.ndarray, cached: bool, seconds: float) -> Module | None:
        n = len(rows)
        if self.next_row + n > self.capacity:
            self.failed[path] = f"unwind row table full ({self.capacity} rows)"
            return None
        begin = self.next_row
        if n:
            self._write_rows(begin, rows)
        self.next_row += n
        mod = Module(key, path, begin, n, slices_of(n, rows, begin), cached, seconds)
        self.modules[key] = mod
        if not cached and seconds > 0.5:
            self.progress(f"unwind tables for {os.path.basename(path)}: {n} rows in {seconds:.1f}s (cached now)")
        return mod

    def _pend(self, ident: tuple[str, int], key: str, path: str, open_path: str, cfi: int) -> Module | None:
        """Register a module without rows: stacks reaching it end there until it is built."""
        if self.next_slot >= MODULE_SLOTS:
            self.failed[path] = f"more than {MODULE_SLOTS - 1} modules waiting for their unwind tables"
            self.by_file[ident] = None
            return None
        mod = Module(key, path, 0, 0, [], False, 0.0, slot=self.next_slot, pending=True)
        self.next_slot += 1
        self.modules[key] = mod
        self.by_file[ident] = key
        self.pending[key] = Pending(mod, open_path, cfi)
        return mod

    def _write_rows(self, begin: int, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows)
        step = 1 << 16
        for a in range(0, len(rows), step):
            chunk = rows[a : a + step]
            keys = np.arange(begin + a, begin + a + len(chunk), dtype=np.uint32)
            if self._update_batch is not None:
                cnt = ct.c_uint32(len(chunk))
                if self._update_batch(
                    self.rows_map.map_fd, keys.ctypes.data, chunk.ctypes.data, ct.byref(cnt)
                ) == 0 and cnt.value == len(chunk):
                    continue
            leaf = self.rows_map.Leaf
            for k, (pc, off, typ, rbp) in zip(keys.tolist(), chunk.tolist()):
                self.rows_map[self.rows_map.Key(k)] = leaf(pc, off, typ, rbp & 0xFF)

    # -- pending modules -------------------------------------------------------------------

    def waiting(self) -> bool:
        """Modules are pending: tick() has work every POLL_S (the recorder's loop wakes that often)."""
        return any(p.module.pending for p in self.pending.values())

    def tick(self, force: bool = False) -> bool:
        """Read which pending modules stacks crossed, build them (most-hit first, as many at once
        as the pool has workers and memory allows), load the ones built. At most every POLL_S:
        one read of slot 0 (the sum) unless it moved or builds run. True when `umaps` changed."""
        waiting = [p for p in self.pending.values() if p.module.pending]
        if not waiting:
            return False
        now = time.monotonic_ns()
        if not force and now < self._next_poll:
            return False
        self._next_poll = now + int(POLL_S * 1e9)
        total = self._read_slot(0)[0]
        if total == self._total and not force and not any(p.future is not None for p in waiting):
            return False
        self._total = total
        self._read_hits(waiting)
        changed = self._collect(waiting)
        for p in sorted(
            (p for p in waiting if p.stacks and p.future is None and p.module.pending), key=lambda p: -p.stacks
        ):
            if not self.pool.can_start(p.cfi_bytes):
                break  # the most-hit waits for a worker (or memory), not overtaken
            p.future = self.pool.submit(p.open_path, p.cfi_bytes)
        return changed

    def _read_slot(self, slot: int) -> tuple[int, int, int]:
        try:
            v = self.pend_map[self.pend_map.Key(slot)]
        except KeyError:
            return 0, 0, 0
        return int(v.stacks), int(v.first_ns), int(v.last_ns)

    def _read_hits(self, which: list[Pending]) -> None:
        for p in which:
            p.stacks, p.first_ns, p.last_ns = self._read_slot(p.module.slot)

    def _collect(self, waiting: list[Pending]) -> bool:
        done = [(p, p.future) for p in waiting if p.future is not None and p.future.done()]
        for p, fut in done:
            p.future = None
            mod = p.module
            try:
                _key, rows, p.build_s = fut.result()
            except Exception as e:  # noqa: BLE001 - whatever the ELF did to the builder: that module falls back
                p.error = f"{type(e).__name__}: {str(e)[:120]}"
                self.failed[mod.path] = f"unwind table not built: {p.error}"
                mod.pending = False  # no rows: frame-pointer steps there, as for a module without CFI
                continue
            n = len(rows)
            if self.next_row + n > self.capacity:
                p.error = f"unwind row table full ({self.capacity} rows)"
                self.failed[mod.path] = p.error
                mod.pending = False
                continue
            if n:
                self._write_rows(self.next_row, rows)
            mod.begin, mod.count, mod.slices = self.next_row, n, slices_of(n, rows, self.next_row)
            self.next_row += n
            mod.seconds, mod.pending = p.build_s, False
            p.rows = n
        if not done:
            return False
        self.update(self._maps)  # the entries of the built modules now point at their rows
        now = time.monotonic_ns()
        for p, _fut in done:
            if not p.error:
                p.built_ns = now
                self.progress(
                    f"unwind table for {os.path.basename(p.module.path)}: {p.rows} rows in "
                    f"{p.build_s:.1f} s; stacks through it complete from +{self._rel(now):.1f} s"
                )
        return True

    def finish(self) -> None:
        """Before the final metadata: the last counts (of every module that was pending), and the
        builds still running stopped."""
        self._read_hits(list(self.pending.values()))
        self.close()

    def close(self) -> None:
        self.pool.close()

    def _rel(self, ns: int) -> float:
        return max(0.0, (ns - self.t0_ns) / 1e9)

    # -- mappings ---------------------------------------------------------------------------

    def preload(self, maps: list[Mapping]) -> None:
        """Build and load the tables of these files without mapping addresses (launch mode:
        the libraries are not mapped yet). The uncached ones are built all at once in the pool."""
        t0 = time.perf_counter()
        files = [m for m in maps if m.is_file and "x" in m.perms]
        built = build_all([self._open_path(m) for m in files], self.pool, self.progress, self.use_cache)
        for res in built.values():
            if not isinstance(res, str):
                self.prebuilt[res[0]] = res[1]
        for m in files:
            self.module(m)
        self.prebuilt.clear()
        self.seconds += time.perf_counter() - t0

    def update(self, maps: list[Mapping]) -> None:
        """Make `umaps` describe exactly the executable file mappings in `maps`."""
        t0 = time.perf_counter()
        self._maps = maps
        want: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        for m in maps:
            if not (m.is_file and "x" in m.perms) or m.end <= m.start:
                continue
            mod = self.module(m)
            if mod is None:
                continue
            bias = (m.start - m.offset) & 0xFFFFFFFFFFFFFFFF
            if mod.pending:  # the whole mapping: any pc in it ends the stack there, counted
                for addr, plen in prefixes(m.start, m.end):
                    want[(addr, plen)] = (bias, 0, 0, mod.slot, UMAP_PENDING)
                continue
            if mod.count == 0:
                continue
            for lo, hi, begin, count in mod.slices:
                a, b = max(m.start, m.start - m.offset + lo), min(m.end, m.start - m.offset + hi)
                for addr, plen in prefixes(a, b) if a < b else ():
                    want[(addr, plen)] = (bias, begin, count, mod.slot, 0)
        changed = False
        for k, v in want.items():  # new values first: a prefix changing hands is never missing
            if self.entries.get(k) != v:
                changed = True
                try:
                    self.lpm[self._key(*k)] = self.lpm.Leaf(*v)
                except Exception:  # noqa: BLE001 - BCC raises bare Exception: the trie is full
                    self.failed["[umaps]"] = f"address map full ({len(self.entries)} prefixes)"
                    continue
                self.entries[k] = v
        for k in [k for k in self.entries if k not in want]:
            try:
                del self.lpm[self._key(*k)]
            except KeyError:
                pass
            del self.entries[k]
            changed = True
        if changed:
            self.gen += 1
            self.gen_map[self.gen_map.Key(0)] = self.gen_map.Leaf(self.gen)
        self.seconds += time.perf_counter() - t0

    def _key(self, addr: int, plen: int):
        key = self.lpm.Key()
        key.prefixlen = plen
        for i, b in enumerate(addr.to_bytes(8, "big")):
            key.addr[i] = b
        return key

    def meta(self) -> dict:
        """meta.json `unwind`: see unwinder_meta."""
        return unwinder_meta(self)


def unwinder_meta(u: Unwinder) -> dict:
    """meta.json `unwind` of an Unwinder `u` (with the probes' mode): `pending` lists every module stacks were cut
    short at (or that was built) while its table was not loaded, most-hit first — stacks,
    first_s / last_s (seconds since the recording's start), built_s (when its rows went in;
    None: not by the end), build_s (the build's own seconds), rows, error."""
    crossed = [p for p in u.pending.values() if p.stacks or p.built_ns or p.error]
    return {
        "modules": len(u.modules),
        "rows": u.next_row,
        "capacity": u.capacity,
        "prefixes": len(u.entries),
        "seconds": round(u.seconds, 3),
        "built": sorted(
            os.path.basename(m.path)
            for k, m in u.modules.items()
            if not (m.cached or m.pending or (k in u.pending and u.pending[k].error))
        ),
        "failed": dict(u.failed),
        "lazy": u.lazy,
        "pending": [
            {
                "module": p.module.path,
                "stacks": p.stacks,
                "first_s": round(u._rel(p.first_ns), 3) if p.first_ns else None,
                "last_s": round(u._rel(p.last_ns), 3) if p.last_ns else None,
                "built_s": round(u._rel(p.built_ns), 3) if p.built_ns else None,
                "build_s": round(p.build_s, 3),
                "rows": p.rows,
                "error": p.error,
            }
            for p in sorted(crossed, key=lambda p: -p.stacks)
        ],
        "never_crossed": sum(1 for p in u.pending.values() if p not in crossed),
    }


# --------------------------------------------------------------------------- recorder glue


def start_unwinder(probes, maps: list[Mapping], launched: bool, progress=None) -> Unwinder | None:
    """Register the target's executable mappings before the probes attach: cached rows are
    loaded, any other module is left pending (built once stacks cross it: Unwinder.tick). Launch
    mode: `maps` are the files ldd resolves (not mapped yet): their rows are built (all at once)
    and loaded now, their addresses when the loader maps them (Recorder._maps_changed ->
    Unwinder.update), dlopen'd code at its mapping while the probes hold the thread."""
    unw = probes.unwinder(progress, lazy=not launched)
    if unw is None:
        return None
    if launched:
        unw.preload(maps)
    else:
        unw.update(maps)
        if unw.pending:
            unw.pool.start(2)  # the first builds need not wait for workers to start
    return unw


def warm(
    paths: list[str],
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    names: dict[str, str] | None = None,
) -> dict[str, tuple[str, np.ndarray, float] | str]:
    """Fill the cache with the tables of `paths` (doctor --warm), on every core."""
    pool = BuildPool(workers)
    try:
        return build_all(paths, pool, progress, names=names)
    finally:
        pool.close()


def warm_process(pid: int, say: Callable[[str], None], workers: int | None = None) -> bool:
    """doctor --warm: the tables of every executable file mapping of `pid`, built into the cache
    on every core, one line a module built and a summary. False when some could not be built."""
    from ..process.procfs import read_maps  # noqa: PLC0415

    seen: set[tuple[str, int]] = set()
    paths, names = [], {}
    for m in read_maps(pid):
        if m.is_file and "x" in m.perms and (m.path, m.inode) not in seen:
            seen.add((m.path, m.inode))
            mf = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
            paths.append(mf if os.path.exists(mf) else m.path.removesuffix(" (deleted)"))
            names[paths[-1]] = m.path
    t0 = time.perf_counter()
    n = max(1, workers or os.cpu_count() or 1)
    say(
        f"unwind tables of pid {pid}: {len(paths)} modules; building the uncached ones on {n} cores "
        f"into {cache_dir('unwind')}"
    )
    res = warm(paths, say, workers, names)
    bad = {p: r for p, r in res.items() if isinstance(r, str)}
    for p, why in bad.items():
        say(f"  not built: {names.get(p, p)}: {why}")
    say(
        f"unwind tables of pid {pid}: {len(res) - len(bad)} built, {len(paths) - len(res)} cached already, "
        f"{len(bad)} failed, in {time.perf_counter() - t0:.1f} s"
    )
    return not bad
