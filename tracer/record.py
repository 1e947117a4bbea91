"""The recording loop: attach, poll events, snapshot every interval, finalize.

Everything the reports need to symbolize later is written as the recording goes: for every
stack, each frame's module path, build ID and file offset, resolved against /proc/PID/maps as it
was when the stack was first seen; the maps themselves whenever they change.
"""
from __future__ import annotations

import bisect
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from common.elf import build_id
from common.errors import AllocscopeError, OutputError, PermissionProblem, TargetError, UsageError
from common.tracefile import format as F
from common.tracefile.writer import TraceWriter, prepare_output

from . import layout as L
from . import procfs
from .arenas import Pagemap, chunk_ranges, find_heaps, outside_heaps
from .cuda import find_driver
from .elfinfo import find_allocator
from .embed import SymbolEmbedder
from .regions import RegionTracker, SlowPath
from .unwind import STACK_DWARF, held_by_probe, start_unwinder, unwind_meta

API = L.API_NAMES
EVT = L.EVENT_NAMES
SRC = L.SOURCE_NAMES
EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK, EV_MADVISE, EV_TRIM, EV_NAME, EV_EXIT, EV_EXEC, EV_CODE = (
    L.enum(n) for n in ("AS_EV_MMAP", "AS_EV_MUNMAP", "AS_EV_MREMAP", "AS_EV_BRK", "AS_EV_MADVISE",
                        "AS_EV_TRIM", "AS_EV_THREAD_NAME", "AS_EV_THREAD_EXIT", "AS_EV_EXEC", "AS_EV_CODE"))
SLOW_EVENTS = (EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK)


@dataclass
class Target:
    pid: int
    start: int                      # /proc start time: guards against pid reuse
    exe: str
    comm: str
    child: Child | None = None
    release_fd: int = -1            # launch mode: write a byte to let the child exec
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        if self.child is not None and (self.child.poll() is not None or self.child.exiting):
            return False
        return procfs.is_alive(self.pid, self.start)

    def readable(self) -> bool:
        """/proc/PID/maps still describes the target (alive, or held at exit)."""
        if self.child is not None and self.child.exiting:
            return True
        return self.alive()


def require_root() -> None:
    """Root, a working bpf() syscall and tracefs: checked before anything is compiled or written,
    so a box that cannot trace gets one line, not a compiler's error dump."""
    if os.geteuid() != 0:
        raise PermissionProblem("allocscope record needs root (BPF and uprobes); run it with sudo")
    from .doctor import check_bpf_syscall, check_tracefs  # noqa: PLC0415

    for check in (check_bpf_syscall(), check_tracefs()):
        if not check.ok:
            raise PermissionProblem(f"{check.name}: {check.detail}; fix: {check.fix}")


def target_from_pid(pid: int) -> Target:
    procfs.check_target(pid)
    try:
        return Target(pid, procfs.starttime(pid), procfs.exe(pid), procfs.comm(pid))
    except OSError:
        raise TargetError(f"process {pid} exited before it could be traced") from None


def target_from_pgrep(pattern: str) -> Target:
    found = procfs.pgrep(pattern)
    if not found:
        raise TargetError(f"--pgrep {pattern!r} matches no process")
    if len(found) > 1:
        listing = "; ".join(f"{pid}: {line[:60]}" for pid, line in found[:8])
        more = f" (+{len(found) - 8} more)" if len(found) > 8 else ""
        raise TargetError(f"--pgrep {pattern!r} matches {len(found)} processes, give one with --pid: "
                          f"{listing}{more}")
    return target_from_pid(found[0][0])


_libc = None


def _ptrace(req: int, pid: int, addr: int = 0, data: int = 0) -> int:
    import ctypes  # noqa: PLC0415

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        _libc.ptrace.restype = ctypes.c_long
    return _libc.ptrace(req, pid, addr, data)


PTRACE_TRACEME, PTRACE_CONT, PTRACE_DETACH, PTRACE_SETOPTIONS = 0, 7, 17, 0x4200
PTRACE_O_TRACEEXIT, PTRACE_O_EXITKILL, PTRACE_EVENT_EXIT = 0x40, 0x100000, 6


class Child:
    """A command we launched. It is forked blocked before exec until released, and traced with
    ptrace for one reason only: to hold it for a moment at exit (PTRACE_EVENT_EXIT), while its
    memory map still exists, so the tracer can read /proc/PID/maps of a short-lived program.
    Signals it receives are passed through unchanged."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.exiting = False
        self.traced = True
        self.on_exec = None  # called at the exec stop, before the program runs
        self.on_hold = None  # called when the probes stop it at a code mapping (DWARF unwinding)

    def after_release(self) -> None:
        """Wait for the exec stop, ask for the exit stop, let it run."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            self.returncode = -1
            return
        if os.WIFSTOPPED(status):
            if self.on_exec is not None:
                self.on_exec()
            _ptrace(PTRACE_SETOPTIONS, self.pid, 0, PTRACE_O_TRACEEXIT | PTRACE_O_EXITKILL)
            _ptrace(PTRACE_CONT, self.pid, 0, 0)
        else:
            self.returncode = os.waitstatus_to_exitcode(status)  # exec failed

    def poll(self) -> int | None:
        while self.returncode is None and not self.exiting:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                break
            if not pid:
                break
            if os.WIFSTOPPED(status):
                if status >> 16 == PTRACE_EVENT_EXIT:
                    self.exiting = True  # held: maps still readable until resume()
                else:
                    sig = os.WSTOPSIG(status)
                    if sig == signal.SIGSTOP and self.on_hold is not None and held_by_probe(self.pid):
                        self.on_hold()  # held at a code mapping: map its unwind rows first
                        sig = 0
                    _ptrace(PTRACE_CONT, self.pid, 0, 0 if sig == signal.SIGTRAP else sig)
                continue
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def resume(self) -> None:
        if self.traced and self.returncode is None:
            _ptrace(PTRACE_DETACH, self.pid, 0, 0)
            self.traced = False
            self.exiting = False

    def wait(self, timeout: float) -> int | None:
        self.resume()
        end = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < end:
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait(5)


def target_from_command(argv: list[str]) -> Target:
    """Fork argv stopped before exec; the probes attach to its pid, then release() lets it
    exec, so it is traced from its first allocation."""
    if not argv:
        raise UsageError("no command given after --")
    exe = shutil.which(argv[0])
    if exe is None:
        raise TargetError(f"command not found or not executable: {argv[0]}")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: wait for the go byte, then exec; never returns into Python
        try:
            os.close(w)
            if os.read(r, 1) == b"g":
                os.close(r)
                _ptrace(PTRACE_TRACEME, 0)
                os.execv(exe, argv)
        except BaseException:  # noqa: BLE001 (the forked child must end in _exit, whatever happened)
            pass
        os._exit(127)
    os.close(r)
    return Target(pid, procfs.starttime(pid), os.path.realpath(exe), os.path.basename(argv[0])[:15],
                  child=Child(pid), release_fd=w, argv=list(argv))


def release(target: Target) -> None:
    if target.release_fd >= 0:
        os.write(target.release_fd, b"g")
        os.close(target.release_fd)
        target.release_fd = -1
        if target.child is not None:
            target.child.after_release()


def launch_maps(target: Target) -> list[procfs.Mapping]:
    """Mappings the launched program will have: its executable and the libraries the dynamic
    loader resolves for it (the child has not exec'd yet, so its own maps are ours)."""
    maps = [procfs.Mapping(0, 0, "r-xp", 0, 1, target.exe)]
    try:
        out = subprocess.run(["ldd", target.exe], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        parts = line.split("=>")
        path = (parts[1] if len(parts) > 1 else parts[0]).strip().split(" (")[0].strip()
        if path.startswith("/"):
            maps.append(procfs.Mapping(0, 0, "r-xp", 0, 1, path))
    return maps


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class MapIndex:
    """Resolve absolute addresses to (module, build id, file offset) with one maps snapshot."""

    def __init__(self, maps: list[procfs.Mapping]) -> None:
        self.maps = sorted(maps, key=lambda m: m.start)
        self.starts = [m.start for m in self.maps]

    def updated(self, maps: list[procfs.Mapping]) -> MapIndex:
        """A new index where `maps` win and older mappings they do not overlap are kept, so
        addresses in code that was unmapped since (dlclose, exit) still resolve."""
        new = sorted(maps, key=lambda m: m.start)
        starts = [m.start for m in new]
        keep = []
        for m in self.maps:
            i = bisect.bisect_left(starts, m.end)
            if i == 0 or new[i - 1].end <= m.start:
                keep.append(m)
        return MapIndex(new + keep)

    def find(self, ip: int) -> procfs.Mapping | None:
        i = bisect.bisect_right(self.starts, ip) - 1
        if i >= 0 and self.maps[i].start <= ip < self.maps[i].end:
            return self.maps[i]
        return None

    def resolve(self, ip: int) -> tuple[str, str, int]:
        m = self.find(ip)
        if m is None:
            return "", "", -1
        if not m.is_file:
            return m.path, "", -1
        path = m.path[:-len(" (deleted)")] if m.path.endswith(" (deleted)") else m.path
        return path, build_id(path), ip - m.start + m.offset

    def is_code(self, ip: int) -> bool:
        m = self.find(ip)
        return m is not None and "x" in m.perms


@dataclass
class RecordOptions:
    output: str
    duration: float | None = None
    interval: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    force: bool = False
    keep_cmdline: bool = False
    max_live: int = 1 << 20
    max_stacks: int = 1 << 16
    max_sites: int = 1 << 18
    quiet: bool = False
    mode: str = "full"          # full | residency
    sample_bytes: int = 0       # >0: byte-weighted sampling (mean one sample per N bytes)
    fault_sample: int = 16      # residency mode: one page fault in N recorded
    unwind: str = "dwarf"         # dwarf: CFI tables unwound in BPF (tracer/unwind.py); fp: frame pointers
    embed_symbols: bool = False   # store the symbol tables of the modules seen (tracer/embed.py)
    residency_budget_pages: int = 1 << 18  # pagemap pages read per interval (1 GiB of heap)
    probe_floor: bool = False     # bench: every probe attached, every program returning at once
    rss_tracepoint: bool = False  # bench: RSS kept by kmem:rss_stat instead of read when needed


@dataclass
class Summary:
    path: str
    seconds: float
    intervals: int
    end_reason: str
    live_bytes: int
    live_count: int
    sites: int
    lost: int
    bytes_written: int


class Recorder:
    def __init__(self, target: Target, opts: RecordOptions, progress=None) -> None:
        self.t = target
        self.o = opts
        self.progress = progress or (lambda msg: None)
        self.stop_reason: str | None = None
        self.seq = 0
        self.events: list[tuple] = []
        self.names: dict[int, str] = {}
        self.thread_rows: list[tuple] = []
        self.prev_sites: dict[tuple[int, int, str], tuple] = {}
        self.known_stacks: set[int] = {0}
        self.maps: list[procfs.Mapping] = []
        self.map_index = MapIndex([])
        self.maps_dirty = True
        self.regions = RegionTracker()
        self.slow: SlowPath | None = None    # the rare mmap-family shapes (set up in run())
        self.slow_events: list[L.Event] = []  # queued by on_event, replayed after each poll
        self.prev_releases: dict[tuple[int, int, int], tuple] = {}
        self.cuda_module: str | None = None  # the libcuda.so.1 probed, once the target maps it
        self.trims: list = []
        self.exec_seen = False
        self._pending_maps: list[procfs.Mapping] | None = None
        self.attach_window_returns = 0
        self.live_blocks: tuple[np.ndarray, np.ndarray] | None = None  # (addresses, sizes)
        self.symbol_embedder = SymbolEmbedder() if opts.embed_symbols else None

    # --- events (called from the ring buffer poll) --------------------------------------------

    def on_event(self, ev: L.Event) -> None:
        typ, tid, ts = ev.type, ev.tid, ev.ts_ns
        released = 0
        if typ in SLOW_EVENTS:
            self.slow_events.append(ev)  # replayed in order once the poll returns (replay_slow)
            if typ == EV_MMAP and ev.prot & 0x4 and not ev.in_api:
                self._maps_now()  # code mapped MAP_FIXED (ld.so, dlopen): read maps now
        elif typ == EV_CODE:
            self._maps_now()  # a library's code was mapped: read maps now
        elif typ in (EV_NAME, EV_EXIT):
            name = ev.comm.decode("utf-8", "replace")
            self.names[tid] = name
            self.thread_rows.append((self.seq + 1, ts, tid, name, "rename" if typ == EV_NAME else "exit"))
            return
        elif typ == EV_EXEC:
            # The program was replaced: the allocator we probe and every live block are gone.
            self.exec_seen = True
            # exec renamed the thread just before (task_rename): what it allocated was the old
            # program's, under its old name.
            comm = ev.comm.decode("utf-8", "replace")
            for i in range(len(self.thread_rows) - 1, -1, -1):
                if self.thread_rows[i][2] == tid and self.thread_rows[i][4] == "rename":
                    if self.thread_rows[i][3] == comm:
                        del self.thread_rows[i]
                    break
            if self.stop_reason is None:
                self.stop_reason = "target exec'd another program"
        elif typ == EV_TRIM:
            released = _s64(ev.len) - _s64(ev.addr2)  # anon RSS before - after: measured
        self.events.append((self.seq + 1, ts, EVT.get(typ, str(typ)), tid, ev.addr, ev.len, ev.addr2,
                            ev.len2, ev.ret, ev.flags, ev.prot, ev.fd, API.get(ev.in_api, ""),
                            ev.stack_id, released))

    def replay_slow(self) -> None:
        """The rare mmap-family shapes the probes handed over, in order (tracer/regions.py)."""
        if not self.slow_events:
            return
        evs, self.slow_events = self.slow_events, []
        replay = {EV_MMAP: self.slow.mmap, EV_MUNMAP: self.slow.munmap, EV_MREMAP: self.slow.mremap,
                  EV_BRK: self.slow.brk}
        for ev in evs:
            replay[ev.type](ev)
        self.slow.site_ext()

    # --- snapshot -------------------------------------------------------------------------

    def _maps_now(self) -> None:
        """Read the maps at once (code was mapped), keeping them to write at the next snapshot."""
        changed = self._refresh_maps()
        if changed is not None:
            self._pending_maps = changed

    def _attach_cuda(self, maps: list[procfs.Mapping]) -> None:
        """Probe the CUDA driver's allocation calls once the target maps libcuda.so.1."""
        if self.cuda_module is not None or getattr(self, "rep", None) is None:
            return
        path = find_driver(maps)
        if path is not None:
            self.cuda_module = path
            self.probes.attach_cuda(path)
            self.progress(f"CUDA driver {path}: {len(self.rep.cuda.get('attached', []))} calls probed")

    def _refresh_maps(self) -> list[procfs.Mapping] | None:
        try:
            maps = procfs.read_maps(self.t.pid)
        except OSError:
            return None
        if self.probes.target_gone():  # exec'd meanwhile: these are another program's maps
            self.exec_seen = self.exec_seen or self.t.alive()
            return None
        if maps != self.maps:
            self.maps = maps
            self.map_index = self.map_index.updated(maps)
            self._attach_cuda(maps)  # the CUDA driver dlopen'd since
            if getattr(self, "unwinder", None) is not None:
                self.unwinder.update(maps)  # dlopen'd code gets its unwind tables
            return maps
        return None

    def _stack_rows(self, new_ids: list[int]) -> dict[str, list]:
        cols: dict[str, list] = {k: [] for k in F.SCHEMAS["stacks"].names}
        for sid, (flags, extra, ips) in self.probes.read_stacks(new_ids).items():
            # DWARF stacks: `extra` marks frames found by a frame-pointer step (syscall = 2).
            frames = [(ip, 2 if flags & STACK_DWARF and extra >> i & 1 else 0) for i, ip in enumerate(ips)]
            # In a syscall the frame-pointer walk skips the wrapper's caller; the word at the
            # user sp is its return address when it points into code.
            if flags & L.STACK_SYSCALL and extra and self.map_index.is_code(extra) and \
                    (len(ips) < 2 or ips[1] != extra):
                frames.insert(1, (extra, 1))
            for i, (ip, sc) in enumerate(frames):
                mod, bid, off = self.map_index.resolve(ip)
                cols["stack_id"].append(sid)
                cols["idx"].append(i)
                cols["ip"].append(ip)
                cols["module"].append(mod)
                cols["build_id"].append(bid)
                cols["offset"].append(off)
                cols["syscall"].append(sc)
                cols["function"].append(None)
                cols["file"].append(None)
                cols["line"].append(None)
            self.known_stacks.add(sid)
        return cols

    def snapshot(self, final: bool = False) -> None:
        self.seq += 1
        seq = self.seq
        now = time.monotonic_ns()
        w = self.writer
        alive = self.t.alive()

        readable = self.t.readable() and not self.exec_seen  # after exec: another program's maps
        if self.maps_dirty or seq == 1:
            changed = self._refresh_maps() if readable else None
            self.maps_dirty = False
            changed = self._pending_maps or changed
            self._pending_maps = None
            if changed is not None:
                w.write_part("maps", seq, pa.table({
                    "seq": [seq] * len(changed), "start": [m.start for m in changed],
                    "end": [m.end for m in changed], "perms": [m.perms for m in changed],
                    "offset": [m.offset for m in changed], "inode": [m.inode for m in changed],
                    "path": [m.path for m in changed],
                    "build_id": [build_id(m.path) if m.is_file and "x" in m.perms else "" for m in changed],
                }, schema=F.SCHEMAS["maps"]))

        # Sites: the kernel side (heap API, mmap-family regions, sampled faults) plus what the
        # slow path's tracker freed or allocated; only changed rows.
        self.replay_slow()
        current: dict[tuple[int, int, str], tuple] = {}
        for keys, vals in (self.probes.read_sites(), self.probes.read_fault_sites()):
            for k, v in zip(keys.tolist(), vals.tolist()):
                current[(k[0], k[1], SRC.get(k[2], str(k[2])))] = tuple(v)
        for key, st in self.regions.sites.items():
            mine = st.as_tuple()
            k = current.get(key)
            if k is None:
                current[key] = mine
            else:  # counters add up; the peak is the larger of the two views and the live now
                live = k[0] + mine[0] - k[2] - mine[2]
                current[key] = (k[0] + mine[0], k[1] + mine[1], k[2] + mine[2], k[3] + mine[3],
                                max(k[4], mine[4], live))
        rows = [(k, v) for k, v in current.items() if self.prev_sites.get(k) != v]
        self.prev_sites = current
        if rows:
            w.write_part("sites", seq, pa.table({
                "seq": [seq] * len(rows), "stack_id": [k[0] for k, _ in rows], "tid": [k[1] for k, _ in rows],
                "source": [k[2] for k, _ in rows], "alloc_bytes": [v[0] for _, v in rows],
                "alloc_count": [v[1] for _, v in rows], "free_bytes": [v[2] for _, v in rows],
                "free_count": [v[3] for _, v in rows], "peak_live_bytes": [v[4] for _, v in rows],
            }, schema=F.SCHEMAS["sites"]))

        # Stacks first seen now (sites and events may name them).
        wanted = {k[0] for k, _ in rows} | {e[13] for e in self.events}
        new_ids = sorted(s for s in wanted if s not in self.known_stacks)
        if new_ids:
            if readable:
                self._refresh_maps()
            cols = self._stack_rows(new_ids)
            w.write_part("stacks", seq, pa.table(cols, schema=F.SCHEMAS["stacks"]))
            if self.symbol_embedder is not None:  # symbol tables of the modules on these stacks
                w.write_part(F.SYMBOLS, seq, self.symbol_embedder.part(seq, cols))

        # Threads: names of allocating threads not seen yet.
        tids = {k[1] for k in current} | {e[3] for e in self.events}
        if readable:
            for tid in tids - set(self.names):
                try:
                    name = procfs.comm(self.t.pid, tid)
                except OSError:
                    continue
                self.names[tid] = name
                self.thread_rows.append((seq, now, tid, name, "seen"))
        if self.thread_rows:
            r = self.thread_rows
            w.write_part("threads", seq, pa.table({
                "seq": [seq] * len(r), "ts_ns": [x[1] for x in r], "tid": [x[2] for x in r],
                "name": [x[3] for x in r], "event": [x[4] for x in r]}, schema=F.SCHEMAS["threads"]))
            self.thread_rows = []

        if self.events:
            ev = self.events
            names = [f.name for f in F.SCHEMAS["events"]]
            w.write_part("events", seq, pa.table(
                {n: [e[i] if i else seq for e in ev] for i, n in enumerate(names)}, schema=F.SCHEMAS["events"]))
            self.events = []

        fk, fv = self.probes.read_flows()
        flows: dict[tuple[int, int], list[int]] = {}
        for k, v in zip(fk.tolist(), fv.tolist()):
            flows[(k[0], k[1])] = list(v)
        for k, v in self.regions.flows.items():
            f = flows.setdefault(k, [0, 0, 0, 0])
            f[0] += v[0]
            f[1] += v[1]
            f[2] += v[2]
            f[3] = max(f[3], v[3])
        if flows:
            items = sorted(flows.items())
            w.write_part("flows", seq, pa.table({
                "seq": [seq] * len(items), "alloc_tid": [k[0] for k, _ in items],
                "free_tid": [k[1] for k, _ in items], "bytes": [v[0] for _, v in items],
                "count": [v[1] for _, v in items], "wait_ns_sum": [v[2] for _, v in items],
                "wait_ns_max": [v[3] for _, v in items]}, schema=F.SCHEMAS["flows"]))

        if final:
            self._write_live(seq, readable)

        self._write_releases(seq)

        counters = self.probes.read_counters()
        counters["n_attach_window_returns"] = self.attach_window_returns
        counters["lost_unmatched_ret"] -= self.attach_window_returns
        if self.o.mode == "residency":
            counters["n_faults"] = self.probes.fault_count()
        heap_live, heap_peak, reg_bytes, reg_count, cuda_host, dev_live, dev_peak = self.probes.read_totals()
        heap_count = counters["n_allocs"] - counters["n_frees"]
        mm_live = reg_bytes - self.slow.taken_bytes + self.regions.live_bytes()
        mm_count = reg_count - self.slow.taken_count + self.regions.live_count()
        try:
            mem = procfs.rss(self.t.pid) if readable else {}
        except OSError:
            mem = {}
        self.last_rss = mem or getattr(self, "last_rss", {})
        arena_res, res_ms = self._measure_heaps(seq, final, readable)
        row = {"seq": seq, "ts_ns": now, "elapsed_s": (now - self.t0) / 1e9,
               "rss_bytes": mem.get("rss_bytes", -1), "rss_anon_bytes": mem.get("rss_anon_bytes", -1),
               "rss_file_bytes": mem.get("rss_file_bytes", -1), "rss_shmem_bytes": mem.get("rss_shmem_bytes", -1),
               "hwm_bytes": mem.get("hwm_bytes", -1),
               "heap_live_bytes": heap_live, "heap_peak_bytes": heap_peak, "mmap_live_bytes": mm_live,
               "cuda_host_live_bytes": cuda_host, "device_live_bytes": dev_live, "device_peak_bytes": dev_peak,
               "live_bytes": heap_live + mm_live + cuda_host, "live_count": heap_count + mm_count,
               "target_alive": int(alive), "arena_resident_bytes": arena_res, "residency_ms": res_ms}
        row.update(counters)
        self.last_row = row
        w.write_part("intervals", seq, pa.table({k: [v] for k, v in row.items()}))

    def _write_releases(self, seq: int) -> None:
        """Memory handed back to the kernel per (thread, kind, allocator call), cumulative: the
        rows that changed."""
        keys, vals = self.probes.read_releases()
        rows = []
        for k, v in zip(keys.tolist(), vals.tolist()):
            key, val = (k[0], k[1], k[2]), tuple(v)
            if self.prev_releases.get(key) != val:
                self.prev_releases[key] = val
                rows.append((key, val))
        if rows:
            self.writer.write_part("releases", seq, pa.table({
                "seq": [seq] * len(rows), "tid": [k[0] for k, _ in rows],
                "kind": [EVT.get(k[1], str(k[1])) for k, _ in rows], "in_api": [API.get(k[2], "") for k, _ in rows],
                "calls": [v[0] for _, v in rows], "requested_bytes": [v[1] for _, v in rows],
                "released_bytes": [v[2] for _, v in rows]}, schema=F.SCHEMAS["releases"]))

    def _measure_heaps(self, seq: int, final: bool, readable: bool) -> tuple[int, float]:
        """Resident bytes of the glibc heaps (every interval, within the page budget); at the
        end also per heap and per allocator-mmapped chunk, written as the `heaps` table."""
        if not readable:
            return -1, 0.0
        t0 = time.perf_counter()
        try:
            maps = procfs.read_maps(self.t.pid)
            heaps = find_heaps(self.t.pid, maps)
            rows = []
            spans = [(h.start, h.end, h.reserved_end, h.kind, h.arena) for h in heaps]
            if final and self.live_blocks is not None and self.rep.allocator_kind == "glibc":
                spans += [(lo, hi, hi, "mmap", "mmap") for lo, hi in chunk_ranges(self.live_blocks, heaps)]
            with Pagemap(self.t.pid, self.o.residency_budget_pages) as pm:
                res = pm.resident_many([(sp[0], sp[1]) for sp in spans])
                est = int(pm.estimated)
            rows = [(*sp, r, est) for sp, r in zip(spans, res)]
            total = sum(r for sp, r in zip(spans, res) if sp[3] != "mmap")
        except OSError:
            return -1, (time.perf_counter() - t0) * 1e3
        ms = (time.perf_counter() - t0) * 1e3
        if final:
            names = [f.name for f in F.SCHEMAS["heaps"]]
            self.writer.write_part("heaps", seq, pa.table(
                {n: [seq] * len(rows) if n == "seq" else [r[i - 1] for r in rows] for i, n in enumerate(names)},
                schema=F.SCHEMAS["heaps"]))
        return total, ms

    def _write_live(self, seq: int, readable: bool) -> None:
        """The final live table, streamed: the BPF live map is read in chunks straight into
        preallocated numpy buffers (probe.iter_live) and every chunk becomes one Parquet row
        group at once, so the tracer never holds the whole table — millions of rows are normal;
        what it takes is a few chunks (64 Ki blocks each: 2.5 MiB of read buffer, ~3 MiB of
        Arrow columns), ~30 MiB of peak RSS in all, whatever the number of blocks. No per-row
        Python objects. Kept for the `heaps` table: the blocks that
        lie outside glibc's heaps (its mmapped chunks; each is a mapping, so there are few)."""
        heaps = None
        if readable and self.rep.allocator_kind == "glibc":
            try:
                heaps = find_heaps(self.t.pid, procfs.read_maps(self.t.pid))
            except OSError:
                heaps = None
        names = pa.array([API.get(i, str(i)) for i in range(max(API) + 1)])
        # what each API's blocks are: heap for the malloc family, cuda-* for the driver's
        sources = pa.array([SRC.get(L.api_source(i), "heap") for i in range(max(API) + 1)])
        schema = F.SCHEMAS["live"]
        kept_addr: list[np.ndarray] = []
        kept_size: list[np.ndarray] = []

        def batches():
            for keys, vals in self.probes.iter_live():
                n = len(keys)
                size = vals["size"].astype(np.int64)
                if heaps is not None:
                    out = outside_heaps(keys, heaps)
                    kept_addr.append(keys[out].astype(np.uint64))
                    kept_size.append(size[out])
                api = vals["api"].astype(np.int32)
                api[(api < 0) | (api >= len(names))] = 0
                # keys is a view of the read buffer: written before the next chunk is read
                yield pa.record_batch([
                    pa.array(np.full(n, seq, dtype=np.int32)), pa.array(keys.astype(np.uint64)),
                    pa.array(size), pa.array(vals["stack_id"].astype(np.uint64)),
                    pa.array(vals["tid"].astype(np.uint32)), pa.array(vals["ts_ns"].astype(np.int64)),
                    names.take(pa.array(api)), sources.take(pa.array(api))], schema=schema)
            dk, dv = self.probes.read_dev_live()  # GPU memory and pinned registrations
            if len(dk):
                api = dv["api"].astype(np.int32)
                api[(api < 0) | (api >= len(names))] = 0
                yield pa.record_batch([
                    pa.array(np.full(len(dk), seq, dtype=np.int32)), pa.array(dk["value"].astype(np.uint64)),
                    pa.array(dv["size"].astype(np.int64)), pa.array(dv["stack_id"].astype(np.uint64)),
                    pa.array(dv["tid"].astype(np.uint32)), pa.array(dv["ts_ns"].astype(np.int64)),
                    names.take(pa.array(api)), sources.take(pa.array(api))], schema=schema)
            reg = self.regions.live()
            keys, vals = self.probes.read_regions()
            for start, v in zip(keys.tolist(), vals.tolist()):
                src = SRC.get(v[4], "mmap")
                reg.append((start, v[0] - start, v[1], v[3], v[2], src))
            if reg:
                yield pa.RecordBatch.from_pydict({
                    "seq": [seq] * len(reg), "addr": [r[0] for r in reg], "size": [r[1] for r in reg],
                    "stack_id": [r[2] for r in reg], "tid": [r[3] for r in reg], "ts_ns": [r[4] for r in reg],
                    "api": [r[5] for r in reg], "source": [r[5] for r in reg]}, schema=schema)

        self.writer.write_part_batches("live", seq, schema, batches())
        if heaps is not None:
            self.live_blocks = (np.concatenate(kept_addr) if kept_addr else np.empty(0, np.uint64),
                                np.concatenate(kept_size) if kept_size else np.empty(0, np.int64))

    # --- lifecycle --------------------------------------------------------------------------

    def _meta(self, complete: bool) -> dict:
        t = self.t
        meta = {
            "format": F.FORMAT, "version": F.VERSION, "complete": complete,
            "tool": {"name": "allocscope", "version": "0.1.0"},
            "created": self.wall0,
            "clock": {"monotonic_ns": self.t0, "wall_s": self.wall0},
            "interval_s": self.o.interval,
            "labels": self.o.labels,
            "target": {"pid": t.pid, "comm": t.comm, "exe": t.exe, "exe_build_id": build_id(t.exe),
                       "launched": t.child is not None,
                       **({"argv": t.argv or procfs.cmdline(t.pid)} if self.o.keep_cmdline else {})},
            "host": {"kernel": platform.release(), "hostname": platform.node(),
                     "page_size": os.sysconf("SC_PAGE_SIZE")},
            "probes": {"allocator": self.rep.allocator, "allocator_kind": self.rep.allocator_kind,
                       "attached": self.rep.attached, "aliases": self.rep.aliases,
                       "skipped": self.rep.skipped, "tracepoints": self.rep.tracepoints,
                       "placement": self.rep.placement, "cuda": self.rep.cuda},
            "limits": {"max_live": self.o.max_live, "max_stacks": self.o.max_stacks,
                       "max_sites": self.o.max_sites},
            "mode": self.o.mode,
            "sampling": {"sample_bytes": self.o.sample_bytes,
                         "fault_sample": self.o.fault_sample if self.o.mode == "residency" else 0},
            "unwind": unwind_meta(self),
        }
        if complete:
            meta.update({"end_reason": self.stop_reason, "intervals": self.seq,
                         "duration_s": (time.monotonic_ns() - self.t0) / 1e9,
                         "target_exit": getattr(self, "target_exit", None),
                         "exec_seen": self.exec_seen,
                         "final_snapshot_s": round(getattr(self, "final_snapshot_s", 0.0), 3)})
            if getattr(self, "bpf_stats", None):
                meta["bpf_stats"] = self.bpf_stats  # with sysctl kernel.bpf_stats_enabled=1
        return meta

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name
        elif getattr(self, "finalizing", False) and not self.o.quiet:
            print("allocscope: finalizing the trace, please wait", file=sys.stderr)

    def run(self) -> Summary:
        # pyarrow imports pandas when it builds its first table (~0.6 s of CPU): import it now,
        # before the probes attach, not inside the first interval of the recording.
        import pandas  # noqa: F401, PLC0415

        from .probe import ProbeOptions, Probes  # noqa: PLC0415 (imports bcc)

        t = self.t
        self.t0 = time.monotonic_ns()
        self.wall0 = time.time()
        maps = launch_maps(t) if t.child is not None else procfs.read_maps(t.pid)
        alloc = find_allocator(t.exe, maps)
        if alloc is None:
            raise TargetError(f"no malloc/free found in {t.exe} or its libraries "
                              "(statically linked and stripped?); nothing to probe")
        brk = None
        if t.child is None:
            self.maps = maps
            self.map_index = MapIndex(maps)
            self._pending_maps = maps
            heap = next((m for m in maps if m.path == "[heap]"), None)
            brk = heap.end if heap else None
        self.probes = Probes(t.pid, ProbeOptions(max_live=self.o.max_live, max_stacks=self.o.max_stacks,
                                                 max_sites=self.o.max_sites, wait_exec=t.child is not None,
                                                 unwind=self.o.unwind, mode=self.o.mode,
                                                 sample_bytes=self.o.sample_bytes,
                                                 fault_sample=self.o.fault_sample, floor=self.o.probe_floor,
                                                 rss_tracepoint=self.o.rss_tracepoint))
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.writer = None
        try:
            self.probes.open_events(self.on_event)
            self.unwinder = start_unwinder(self.probes, maps, t.child is not None, self.progress)
            if t.child is not None and self.unwinder is not None:
                t.child.on_exec = self._maps_now  # exe and ld.so are mapped: their unwind tables
                t.child.on_hold = lambda: (self.probes.drain_events(), self._maps_now())
            self.slow = SlowPath(self.probes, self.regions, SRC)
            self.probes.seed(procfs.rss(t.pid) if t.child is None else {}, brk)
            self.rep = self.probes.attach(alloc)
            self._attach_cuda(maps)
            # Returns seen while probes were being attached belong to calls that began before
            # the attach: like pre-attach allocations, they are not losses.
            self.attach_window_returns = self.probes.read_counters()["lost_unmatched_ret"]
            # The clock (and --duration) starts once the probes are live, not while BCC compiles.
            self.t0 = time.monotonic_ns()
            self.wall0 = time.time()
            self.writer = TraceWriter(self.o.output)
            self.writer.write_meta(self._meta(False))
            self.names = procfs.thread_names(t.pid) if t.child is None else {}
            for tid, name in self.names.items():
                self.thread_rows.append((1, self.t0, tid, name, "seen"))
            release(t)
            self.progress(f"recording pid {t.pid} ({t.comm}); allocator {alloc.kind} "
                          f"{alloc.path}; Ctrl-C to stop")
            deadline = self.t0 + int(self.o.duration * 1e9) if self.o.duration else None
            next_snap = self.t0 + int(self.o.interval * 1e9)
            while self.stop_reason is None:
                now = time.monotonic_ns()
                wait_ms = max(0, min(next_snap - now, 100_000_000) // 1_000_000)
                self.probes.poll_events(int(wait_ms))
                self.replay_slow()
                now = time.monotonic_ns()
                if not t.alive():
                    self.stop_reason = "target exited"
                    break
                if deadline is not None and now >= deadline:
                    self.stop_reason = "duration"
                    break
                if now >= next_snap:
                    self.snapshot()
                    next_snap += int(self.o.interval * 1e9)
                    if next_snap < now:
                        next_snap = now + int(self.o.interval * 1e9)
            self.finalizing = True
            self.probes.drain_events()
            t_final = time.perf_counter()
            self.snapshot(final=True)
            self.final_snapshot_s = time.perf_counter() - t_final
            if t.child is not None:
                t.child.resume()
            if t.child is not None:
                self.target_exit = t.child.wait(timeout=0.2)
            self.bpf_stats = self.probes.program_stats()
            self.writer.write_meta(self._meta(True))
        except OutputError:
            raise
        finally:
            self.probes.close()
            if self.writer is not None:
                self.writer.close()
            release(t)
            for s, h in old_handlers.items():
                signal.signal(s, h)
        row = self.last_row
        lost = sum(v for k, v in row.items() if k.startswith("lost_"))
        return Summary(self.o.output, (time.monotonic_ns() - self.t0) / 1e9, self.seq, self.stop_reason or "",
                       row["live_bytes"], row["live_count"], len(self.prev_sites), lost,
                       self.writer.bytes_written if self.writer else 0)


def record(target: Target, opts: RecordOptions, progress=None) -> Summary:
    if opts.interval <= 0:
        raise UsageError("--interval must be > 0 seconds")
    if opts.duration is not None and opts.duration <= 0:
        raise UsageError("--duration must be > 0 seconds")
    try:
        prepare_output(opts.output, opts.force)
        return Recorder(target, opts, progress).run()
    except BaseException:
        if target.child is not None and target.child.poll() is None and target.release_fd >= 0:
            target.child.kill()  # never leave a launched child blocked before exec
        raise
    finally:
        if target.release_fd >= 0:
            os.close(target.release_fd)
            target.release_fd = -1


__all__ = ["AllocscopeError", "RecordOptions", "Recorder", "Summary", "Target", "record", "require_root",
           "target_from_command", "target_from_pgrep", "target_from_pid"]
