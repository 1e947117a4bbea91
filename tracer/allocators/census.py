"""A census of glibc malloc's arenas, read from outside: which chunks are in use, which free.

Memory allocated before the attach is invisible to the probes; without a census the RSS split
could only call everything resident in glibc's heaps that the probes did not see allocated
"retained". The census tells them apart, read-only: /proc/PID/mem is read (pread), the process is
never stopped, never called into, its arena locks never taken — so a chunk being split or
merged while it is read can make one heap's walk stop early (counted, the rest estimated).

* main_arena: its address from libc's symbols (libc6-dbg's debug file found by build ID, or
  libc's own .symtab), else found by its shape in libc's writable data: 127 bins in a row, each
  either empty (fd == bk == the bin's own address - 16) or both pointers leading out of libc.
* the arenas: main_arena's `next` ring; each thread arena's heaps are the 64 MiB-aligned mappings
  whose heap_info.ar_ptr names it (tracer/allocators/arenas.py find_heaps).
* each heap is walked chunk by chunk from its first chunk (size | flags; the PREV_INUSE bit of
  the next chunk says whether one is in use) up to the arena's top chunk (or the fenceposts at
  the end of a heap that is not the arena's last).
* fastbin chunks and tcache entries look in use to that walk: fastbins are walked from the arena
  (fd pointers demangled, glibc 2.32+ safe-linking), tcaches read from every in-use chunk shaped
  like a tcache_perthread_struct (0x290 bytes; counts[64] then entries[64], each entry's chunk
  of the bin's size): they count as free. Threads whose tcache was not found: estimated from the
  ones found, said so (`tcache_estimated`).
* glibc's own mmapped chunks (above the mmap threshold): each an anonymous mapping starting with
  a chunk header with IS_MMAPPED, its size (plus the alignment gap) the mapping's length.
* bounded in time: past `budget_s` the heaps not walked yet (and the rest of one being walked)
  are estimated from the walked ones' shares of in-use and free bytes (`sampled`); fastbin lists
  (one read an entry) are followed until half a budget more, the entries beyond counted in use.

Figures are chunk bytes (a block's usable size + 8 bytes of header, 16-byte rounded), what the
heap spends on it — `mallinfo2()`'s units.
"""

from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from ..process import procfs
from .arenas import HEAP_MAX, find_heaps

# struct malloc_state (glibc 2.27+, 64-bit): mutex, flags, have_fastchunks, fastbinsY[10], top,
# last_remainder, bins[254], binmap[4], next, next_free, attached_threads, system_mem, max_system_mem
AR_FASTBINS, NFASTBINS = 16, 10
AR_TOP, AR_BINS, NBINS = 96, 112, 127
AR_NEXT, AR_SYSTEM_MEM = 2160, 2184
ARENA_SIZE = 2200
TCACHE_CHUNK = 0x290  # tcache_perthread_struct (2.30+: uint16 counts[64], entries[64]) + header
TCACHE_BINS = 64
MIN_CHUNK = 32
WINDOW = 32 << 20  # bytes of a heap read at once
DEFAULT_BUDGET_S = 2.0
PREV_INUSE, IS_MMAPPED = 1, 2

ROW_FIELDS = (
    "arena",
    "heaps",
    "system_bytes",
    "in_use_bytes",
    "free_bytes",
    "fastbin_bytes",
    "tcache_bytes",
    "top_bytes",
    "resident_bytes",
    "chunks",
    "walked_bytes",
    "sampled",
    "tcache_estimated",
    "ms",
)


@dataclass
class ArenaCensus:
    arena: str  # 'main', the arena's address (hex), or 'mmap' (mmapped chunks)
    heaps: int = 0
    system_bytes: int = 0  # the arena's heaps (its system_mem), or the mmapped chunks' bytes
    in_use_bytes: int = 0  # chunks in use (fastbin and tcache entries not: they are free)
    free_bytes: int = 0  # free chunks in the bins (the walk's PREV_INUSE)
    fastbin_bytes: int = 0
    tcache_bytes: int = 0
    top_bytes: int = 0
    resident_bytes: int = -1  # mmapped chunks only: their resident pages
    chunks: int = 0  # walked
    walked_bytes: int = 0
    sampled: bool = False
    tcache_estimated: bool = False
    ms: float = 0.0
    tcaches: list = field(default_factory=list, repr=False)  # addresses of tcache structs found

    def row(self) -> tuple:
        return tuple(int(v) if isinstance(v, bool) else v for v in (getattr(self, f) for f in ROW_FIELDS))


class Mem:
    """Reads of the target's memory through /proc/PID/mem (pread: no ptrace stop)."""

    def __init__(self, pid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def close(self) -> None:
        os.close(self.fd)

    def read(self, addr: int, n: int) -> bytes:
        if not 0 <= addr < 1 << 63 or n <= 0:  # a damaged pointer: no read (pread takes an off_t)
            return b""
        try:
            return os.pread(self.fd, n, addr)
        except (OSError, OverflowError, ValueError):
            return b""

    def word(self, addr: int) -> int | None:
        b = self.read(addr, 8)
        return int.from_bytes(b, "little") if len(b) == 8 else None


# --- finding main_arena --------------------------------------------------------------------------


def libc_mappings(maps: list[procfs.Mapping]) -> list[procfs.Mapping]:
    """The mappings of the libc serving malloc (libc.so.6 / libc-2.NN.so)."""
    return [m for m in maps if re.fullmatch(r"libc(\.so\.6|-[\d.]+\.so)", os.path.basename(m.path))]


def _object_symbols(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """{name: st_value} of the OBJECT symbols `names` in the .symtab of the ELF file `path`."""
    from common.elf import open_elf  # noqa: PLC0415

    found = open_elf(path)
    if found is None:
        return {}
    with found:
        sec = found.elf.get_section_by_name(".symtab")
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return {}
        strtab = found.elf.get_section(sec["sh_link"]).data()
        syms = np.frombuffer(
            sec.data(),
            dtype=np.dtype(
                [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]
            ),
        )
        out = {}
        for n in names:
            i = strtab.find(b"\0" + n.encode() + b"\0")
            if i < 0:
                continue
            hit = syms[(syms["name"] == i + 1) & ((syms["info"] & 0xF) == 1)]
            if len(hit):
                out[n] = int(hit["value"][0])
        return out


def arena_from_symbols(libc_path: str) -> int | None:
    """main_arena's offset in libc (its link-time address): libc's .symtab, else the debug
    file of its build ID (libc6-dbg)."""
    from common.elf import DEBUG_DIRS, build_id, build_id_path  # noqa: PLC0415

    sym = _object_symbols(libc_path, ("main_arena",))
    if "main_arena" in sym:
        return sym["main_arena"]
    bid = build_id(libc_path)
    for d in DEBUG_DIRS if bid else ():
        p = build_id_path(d, bid)
        if os.path.isfile(p):
            sym = _object_symbols(p, ("main_arena",))
            if "main_arena" in sym:
                return sym["main_arena"]
    return None


def arena_by_shape(data: bytes, base: int, lo: int, hi: int) -> int | None:
    """main_arena's address in libc's writable data `data` (mapped at `base`; libc spans
    [lo, hi)): where 127 bins in a row are each empty (fd == bk == its own address - 16) or
    hold two pointers out of libc, at least 32 of them empty."""
    n = len(data) // 8
    w = np.frombuffer(data[: n * 8], dtype="<u8")
    addr = np.uint64(base) + np.arange(n, dtype=np.uint64) * np.uint64(8)
    empty = np.zeros(n, dtype=bool)
    empty[:-1] = (w[:-1] == addr[:-1] - np.uint64(16)) & (w[1:] == addr[:-1] - np.uint64(16))
    out_of_libc = (w != 0) & ((w < np.uint64(lo)) | (w >= np.uint64(hi))) & (w % np.uint64(16) == 0)
    full = np.zeros(n, dtype=bool)
    full[:-1] = out_of_libc[:-1] & out_of_libc[1:]
    best = None
    for j in np.flatnonzero(empty):
        for k in range(NBINS):  # j is bin k of some candidate
            start = j - 2 * k
            if start < AR_BINS // 8:
                break
            idx = start + 2 * np.arange(NBINS)
            if idx[-1] >= n:
                continue
            if (empty[idx] | full[idx]).all() and empty[idx].sum() >= 32:
                cand = base + 8 * int(start) - AR_BINS
                if best is None or cand == best:
                    best = cand
                    break
        if best is not None:
            return best
    return best


def find_main_arena(mem: Mem, maps: list[procfs.Mapping]) -> tuple[int | None, str]:
    """(main_arena's address in the target, how it was found: 'symbols' | 'shape' | why not)."""
    libc = libc_mappings(maps)
    if not libc:
        return None, "no libc mapped"
    path = libc[0].path
    base = min(m.start - m.offset for m in libc if m.offset == 0) if any(m.offset == 0 for m in libc) else None
    if base is not None:
        off = arena_from_symbols(path)
        if off is not None:
            return base + off, "symbols"
    lo, hi = min(m.start for m in libc), max(m.end for m in libc)
    # the writable data: libc's rw mapping and the anonymous one right after it (.bss)
    rw = [m for m in libc if m.perms.startswith("rw")]
    for m in rw:
        end = m.end
        nxt = next((x for x in maps if x.start == m.end and x.inode == 0 and x.perms.startswith("rw")), None)
        if nxt is not None:
            end = nxt.end
        data = mem.read(m.start, end - m.start)
        got = arena_by_shape(data, m.start, lo, hi)
        if got is not None:
            return got, "shape"
    return None, "main_arena not found (no symbols, no arena-shaped data in libc)"


# --- the walk ------------------------------------------------------------------------------------


@dataclass
class _Walk:
    in_use: int = 0
    free: int = 0
    chunks: int = 0
    walked: int = 0
    complete: bool = True
    tcache: list = field(default_factory=list)  # in-use chunks of TCACHE_CHUNK bytes


def walk_heap(mem: Mem, first: int, end: int, top: int, deadline: float) -> _Walk:
    """Walk the chunks from `first` up to `top` (the arena's top chunk, not counted) or `end` (a
    heap that is not the arena's last ends with fenceposts), WINDOW bytes read at a time. Stops
    at `deadline` or at a header that makes no sense (a chunk changing under us): complete False."""
    w = _Walk()
    stop = top if first <= top < end else end
    pos = first
    tc = w.tcache
    while pos < stop:
        # never past the top chunk's header: reading untouched pages through /proc/PID/mem maps
        # the zero page there, which pagemap then shows present
        buf = mem.read(pos, min(WINDOW, stop - pos) + 16)
        n = len(buf) // 8
        if n < 4:
            w.complete = False
            break
        words = memoryview(buf[: n * 8]).cast("Q")
        lim, stop_i = n - 2, (stop - pos) >> 3
        i, sz = 0, words[1]
        in_use = free = chunks = 0
        bad = late = False
        while True:
            s = sz & ~7
            if s < MIN_CHUNK or s & 15:
                bad = True
                break
            j = i + (s >> 3)
            if j > lim:
                break
            nsz = words[j + 1]
            if nsz & PREV_INUSE:
                in_use += s
                if s == TCACHE_CHUNK:
                    tc.append(pos + 8 * i)
            else:
                free += s
            chunks += 1
            i, sz = j, nsz
            if i >= stop_i:
                break
            if not chunks & 0x3FFF and time.perf_counter() > deadline:
                late = True
                break
        w.in_use += in_use
        w.free += free
        w.chunks += chunks
        w.walked += 8 * i
        pos += 8 * i
        if pos >= stop:
            break
        if bad:
            if (sz & ~7) != 16:  # 16: the fencepost that ends a heap; else the heap changed under us
                w.complete = False
            break
        if late or time.perf_counter() > deadline:
            w.complete = False
            break
        if i == 0:  # one chunk larger than the window: its next header read alone
            s = sz & ~7
            word = mem.word(pos + s + 8)
            if word is None or pos + s > stop:
                w.complete = False
                break
            if word & PREV_INUSE:
                w.in_use += s
            else:
                w.free += s
            w.chunks += 1
            w.walked += s
            pos += s
    return w


def _demangle(pos: int, v: int) -> int:
    return (pos >> 12) ^ v


def fastbin_bytes(mem: Mem, arena: int, deadline: float, limit: int = 1 << 24) -> tuple[int, bool]:
    """Bytes in the arena's fastbins (lists followed up to `limit` entries in all, until
    `deadline`: one read an entry); whether every list was followed to its end."""
    heads = mem.read(arena + AR_FASTBINS, 8 * NFASTBINS)
    if len(heads) != 8 * NFASTBINS:
        return 0, False
    total, ok, seen = 0, True, 0
    for k in range(NFASTBINS):
        p = int.from_bytes(heads[8 * k : 8 * k + 8], "little")
        want = 32 + 16 * k
        while p and seen < limit:
            if not seen & 0x3FF and time.perf_counter() > deadline:
                return total, False
            b = mem.read(p, 24)
            if len(b) != 24 or (int.from_bytes(b[8:16], "little") & ~7) != want:
                ok = False
                break
            total += want
            seen += 1
            raw = int.from_bytes(b[16:24], "little")
            nxt = _demangle(p + 16, raw)  # glibc 2.32+: PROTECT_PTR(&fd, next)
            if nxt & 15:
                nxt = raw  # older glibc: no safe-linking
            if nxt == p:
                break
            p = nxt
        if p and seen >= limit:
            ok = False
    return total, ok


def tcache_bytes(mem: Mem, chunk: int) -> int | None:
    """Bytes held by the tcache_perthread_struct at `chunk`, None when it is not one: counts
    0..65535 where entries are set and 0 where not, each entry a chunk of its bin's size."""
    b = mem.read(chunk, TCACHE_CHUNK)
    if len(b) != TCACHE_CHUNK:
        return None
    counts = struct.unpack_from("<64H", b, 16)
    entries = struct.unpack_from("<64Q", b, 16 + 128)
    if not any(entries):
        return 0 if not any(counts) else None
    total = 0
    for i, (c, e) in enumerate(zip(counts, entries)):
        if (c == 0) != (e == 0) or (e & 15):
            return None
        if e:
            hdr = mem.word(e - 8)
            if hdr is None or hdr & ~7 != 32 + 16 * i:
                return None
            total += c * (32 + 16 * i)
    return total


def mmapped_chunks(mem: Mem, maps: list[procfs.Mapping], heaps) -> list[tuple[int, int]]:
    """(start, end) of glibc's mmapped chunks: anonymous read-write mappings outside its heaps
    made of chunk headers with IS_MMAPPED, whose sizes (plus alignment gaps) fill the mapping."""
    out = []
    cuts = [(h.start, h.reserved_end) for h in heaps]
    for m in maps:
        if m.inode or m.path or not m.perms.startswith("rw") or any(lo <= m.start < hi for lo, hi in cuts):
            continue
        pos, ok = m.start, False
        while pos < m.end:
            b = mem.read(pos, 16)
            if len(b) != 16:
                break
            prev, size = int.from_bytes(b[:8], "little"), int.from_bytes(b[8:], "little")
            if not size & IS_MMAPPED or prev % 16 or (size & ~7) < 4096 or pos + prev + (size & ~7) > m.end:
                break
            out.append((pos, pos + prev + (size & ~7)))
            pos += prev + (size & ~7)
            ok = pos == m.end
        if not ok:
            while out and out[-1][0] >= m.start:
                out.pop()
    return out


def run_census(
    pid: int, maps: list[procfs.Mapping] | None = None, budget_s: float = DEFAULT_BUDGET_S, threads: int | None = None
) -> tuple[list[ArenaCensus], dict]:
    """The census of every glibc arena of `pid` (and its mmapped chunks); and how it went:
    {main_arena, found_by, ms, budget_s, sampled, arenas, threads, tcaches}. Raises OSError when
    the target's memory cannot be read."""
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    maps = procfs.read_maps(pid) if maps is None else maps
    mem = Mem(pid)
    try:
        main, how = find_main_arena(mem, maps)
        info = {"main_arena": f"{main:#x}" if main else None, "found_by": how, "budget_s": budget_s}
        if main is None:
            info.update(ms=round((time.perf_counter() - t0) * 1e3, 3), sampled=False)
            return [], info
        heaps = find_heaps(pid, maps)
        arenas = [main]
        a = mem.word(main + AR_NEXT)
        while a and a != main and len(arenas) < 4096:
            arenas.append(a)
            a = mem.word(a + AR_NEXT)
        heap_main = next((h for h in heaps if h.kind == "main"), None)
        out: list[ArenaCensus] = []
        walked_in = walked_free = walked_bytes = 0
        pending: list[tuple[ArenaCensus, int]] = []  # (arena, bytes not walked)
        for ar in arenas:
            t_ar = time.perf_counter()
            st = mem.read(ar, ARENA_SIZE)
            if len(st) != ARENA_SIZE:
                continue
            top = int.from_bytes(st[AR_TOP : AR_TOP + 8], "little")
            c = ArenaCensus("main" if ar == main else f"{ar:#x}")
            c.system_bytes = int.from_bytes(st[AR_SYSTEM_MEM : AR_SYSTEM_MEM + 8], "little")
            top_size = (mem.word(top + 8) or 0) & ~7 if top else 0
            c.top_bytes = top_size
            spans: list[tuple[int, int]] = []  # (first chunk, end)
            if ar == main:
                if heap_main is not None and top:
                    spans.append((heap_main.start, top + top_size))
            else:
                mine = sorted(
                    (h for h in heaps if h.kind == "thread" and int(h.arena, 16) == ar), key=lambda h: h.start
                )
                for h in mine:
                    size = mem.word(h.start + 16) or 0  # heap_info.size
                    if h.start <= ar < h.start + HEAP_MAX:  # the arena's first heap: malloc_state inside
                        p = ar + ARENA_SIZE
                        first = p + (-(p + 16) % 16)
                    else:  # heap_info, then the first chunk (heap_info's size: ar_ptr - its first heap)
                        first = h.start + _heap_info_size(mine, ar)
                    spans.append((first, h.start + min(size, HEAP_MAX)))
            c.heaps = len(spans)
            not_walked = 0
            for first, end in spans:
                if time.perf_counter() > deadline:
                    not_walked += end - first
                    c.sampled = True
                    continue
                w = walk_heap(mem, first, end, top, deadline)
                c.in_use_bytes += w.in_use
                c.free_bytes += w.free
                c.chunks += w.chunks
                c.walked_bytes += w.walked
                c.tcaches += w.tcache
                walked_in, walked_free, walked_bytes = (
                    walked_in + w.in_use,
                    walked_free + w.free,
                    walked_bytes + w.walked,
                )
                rest = (end - first) - w.walked - (top_size if first <= top < end else 0)
                if not w.complete and rest > 0:
                    not_walked += rest
                    c.sampled = True
            # fastbin entries: one read each, within the budget (and a grace of half of it)
            c.fastbin_bytes, whole = fastbin_bytes(mem, ar, deadline + budget_s / 2)
            if not whole:
                c.sampled = True  # lists cut short: the entries beyond count as in use
            pending.append((c, not_walked))
            c.ms = (time.perf_counter() - t_ar) * 1e3
            out.append(c)
        # what was not walked: the walked bytes' shares of in use and free
        for c, rest in pending:
            if rest > 0 and walked_bytes:
                c.in_use_bytes += int(rest * walked_in / walked_bytes)
                c.free_bytes += int(rest * walked_free / walked_bytes)
        # tcaches: the structs found, the bytes in them free; threads without one found estimated
        found = []
        for c in out:
            for ch in c.tcaches:
                b = tcache_bytes(mem, ch)
                if b is not None:
                    c.tcache_bytes += b
                    found.append(b)
        nthreads = threads if threads is not None else procfs_threads(pid)
        missing = max(0, min(nthreads, len(out) * 64) - len(found)) if found else 0
        if missing and found:
            per = sum(found) // len(found)
            c = out[0]
            c.tcache_bytes += per * missing
            c.tcache_estimated = True
        for c in out:
            moved = min(c.in_use_bytes, c.fastbin_bytes + c.tcache_bytes)
            c.in_use_bytes -= moved
        # glibc's mmapped chunks
        t_m = time.perf_counter()
        chunks = mmapped_chunks(mem, maps, heaps)
        if chunks:
            mm = ArenaCensus("mmap", chunks=len(chunks))
            mm.system_bytes = mm.in_use_bytes = sum(hi - lo for lo, hi in chunks)
            mm.walked_bytes = mm.system_bytes
            try:
                from .arenas import resident_meter  # noqa: PLC0415

                with resident_meter(pid) as pm:
                    mm.resident_bytes = sum(pm.resident_many(chunks))
            except OSError:
                mm.resident_bytes = -1
            mm.ms = (time.perf_counter() - t_m) * 1e3
            out.append(mm)
        info.update(
            ms=round((time.perf_counter() - t0) * 1e3, 3),
            sampled=any(c.sampled for c in out),
            arenas=len(arenas),
            threads=nthreads,
            tcaches=len(found),
            chunks=sum(c.chunks for c in out),
        )
        return out, info
    finally:
        mem.close()


def _heap_info_size(mine, ar: int) -> int:
    """sizeof(heap_info): where malloc_state starts in the arena's first heap (48 on glibc
    2.35+, 32 before)."""
    for h in mine:
        if h.start <= ar < h.start + HEAP_MAX:
            return ar - h.start
    return 48


def procfs_threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0
