"""Load probes/allocscope.c with BCC, attach it to one process, read its maps.

With tracer/doctor.py (which only checks that bcc imports), the one module that imports bcc.
Everything it returns is plain Python or numpy, copied out of BCC's ctypes buffers at once (BCC
reuses them).
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from common.errors import AllocscopeError, PermissionProblem

from ..allocators.discovery import STANDARD
from ..base import layout as L
from ..base.options import RecordOptions
from ..unwind.tables import MODULE_SLOTS, UNWIND_STEPS
from . import bcc_lean as bcclight
from . import cache as bpfcache
from .kernel_btf import char_major, file_offsets, fsbase_offset, return_probe_offsets, rss_offsets
from .objects import TRACE_UPROBE_MULTI, TRACE_UPROBE_SESSION, UPROBE_MULTI_RETURN, prog_stats, uprobe_multi_link
from .symbols import symbol_offsets

BPF_PROBE_ENTRY = 0
BPF_PROBE_RETURN = 1


def _arg(n: int | None) -> int:
    return 0xFF if n is None else n  # AS_ARG_NONE


def probe_cflags(opts: RecordOptions, launched: bool, unwind: str, rss_tracepoint: bool) -> list[str]:
    """The compile-time parameters of probes/allocscope.c for a recording: every bound and mode
    comes from `opts` (tracer/base/options.py, the one place defaults live), the kernel-struct
    offsets from the running kernel's BTF (tracer/bpf/kernel_btf.py)."""
    flags = [f"-DAS_MAX_LIVE={opts.max_live}", f"-DAS_MAX_STACKS={opts.max_stacks}",
             f"-DAS_MAX_SITES={opts.max_sites}", f"-DAS_MAX_REGIONS={opts.max_regions}",
             f"-DAS_RING_PAGES={opts.ring_pages}", f"-DAS_PAGE_SIZE={os.sysconf('SC_PAGE_SIZE')}",
             f"-DAS_UVM_MAJOR={char_major('nvidia-uvm')}"]
    if launched:
        flags.append("-DAS_WAIT_EXEC=1")
    if opts.probe_floor:
        flags.append("-DAS_FLOOR=1")
    flags += ["-DAS_RSS_TRACEPOINT=1"] if rss_tracepoint else rss_offsets().cflags()
    try:
        flags += file_offsets().cflags()
    except (OSError, LookupError):
        pass  # mappings of shared memory and device files stay untracked
    if opts.sample_bytes > 0:  # with the uprobe-session programs (used where the kernel has them)
        flags += [f"-DAS_SAMPLE_BYTES={opts.sample_bytes}ULL", "-DAS_SESSION=1"]
    if opts.mode == "residency":
        flags += ["-DAS_FAULTS=1", f"-DAS_FAULT_SAMPLE={opts.fault_sample}"]
    # --inject: the agent's thread table says which mmap/brk an allocator makes (compiled in every
    # variant, idle without an agent: an --inject recording shares the program of a sampled one)
    flags += fsbase_offset()
    if unwind == "dwarf":
        flags += return_probe_offsets()
        flags += ["-DAS_UNWIND_DWARF=1", f"-DAS_UNWIND_ROWS={opts.unwind_rows}", f"-DAS_UNWIND_STEPS={UNWIND_STEPS}",
                  f"-DAS_UNWIND_MODULES={MODULE_SLOTS}"]
    return flags


def agent_thread_bits() -> int:
    from ..inject.injection import THREAD_BITS  # noqa: PLC0415

    return THREAD_BITS


def heap_cookie(program: str, source: int | None) -> int:
    """The cookie of a heap function's probed address on a link (heap_entry, heap_session):
    enum as_api (from its classic entry program's name: malloc_enter -> AS_API_MALLOC) | the
    allocator's source << 16 (None: the main heap)."""
    api = L.enum("AS_API_" + program.removesuffix("_enter").upper())
    return api | (L.enum("AS_SRC_HEAP") if source is None else source) << 16


def _kernel_below(release: str, version: tuple[int, int]) -> bool:
    m = re.match(r"(\d+)\.(\d+)", release)
    return bool(m) and (int(m.group(1)), int(m.group(2))) < version


def links_choice(opts: RecordOptions, release: str | None = None) -> tuple[bool, str]:
    """(attach the uprobes through uprobe_multi links, why not): kernel 6.6+."""
    if opts.uprobes == "perf":
        return False, "--uprobes perf"
    release = release or os.uname().release
    if _kernel_below(release, (6, 6)):
        why = f"kernel {release} has no uprobe_multi links (6.6+)"
        if opts.uprobes == "multi":
            raise AllocscopeError(f"--uprobes multi: {why}")
        return False, why
    return True, ""


def session_choice(opts: RecordOptions, release: str | None = None) -> tuple[bool, str]:
    """(use uprobe sessions, why not): only sampled recordings of the heap gain from them (an
    unsampled call skips its return trap); they need kernel 6.13+ and uprobe_multi links.
    Whether the kernel really takes them is known at the first link (Probes._attach_sessions)."""
    if opts.sample_bytes <= 0 or opts.mode != "full" or opts.probe_floor:
        return False, ""
    if opts.inject:
        return False, "--inject: the agent samples in the process (markers, classic probes)"
    if opts.uprobe_sessions == "off":
        return False, "--uprobe-sessions off"
    release = release or os.uname().release
    multi, why = links_choice(opts, release)
    if multi and _kernel_below(release, (6, 13)):
        why = f"kernel {release} has no uprobe sessions (6.13+)"
    if not multi or why:
        if opts.uprobe_sessions == "on":
            raise AllocscopeError(f"--uprobe-sessions on: {why}")
        return False, why
    return True, ""


def bpf_text() -> bytes:
    """probes/allocscope.c with its local includes other than allocscope.h inlined, recursively
    (each file once): BCC rewrites map calls (`map.lookup(...)`) only in the main file, and the
    parts of the program by concern (probes/heap.h, regions.h, ...; unwind_dwarf.h) have some."""
    seen: set[str] = set()

    def expand(path) -> str:
        def inline(m: re.Match) -> str:
            name = m.group(1)
            part = L.PROBES_DIR / name
            if name == L.HEADER.name or not part.is_file() or name in seen:
                return m.group(0)
            seen.add(name)
            return f"/* ---- {name} ---- */\n{expand(part)}\n/* ---- end of {name} ---- */"
        return re.sub(r'^#include "([\w.]+)"[ \t]*$', inline, path.read_text(), flags=re.M)

    return expand(L.SOURCE).encode()


@dataclass
class AttachReport:
    allocator: str = ""
    allocator_kind: str = ""
    attached: list[str] = field(default_factory=list)            # symbols probed
    aliases: dict[str, str] = field(default_factory=dict)         # symbol -> symbol sharing its address
    skipped: dict[str, str] = field(default_factory=dict)         # symbol -> reason
    tracepoints: list[str] = field(default_factory=list)
    placement: dict[str, str] = field(default_factory=dict)       # symbol -> where its entry probe sits
    cuda: dict = field(default_factory=dict)                       # the CUDA driver's probes (tracer.allocators.cuda)
    allocators: list = field(default_factory=list)                 # every allocator: allocators.discovery.Plan.as_dict
    custom: list = field(default_factory=list)                     # --alloc-fn / --free-fn
    returns: str = "classic"  # how the heap functions' returns are probed: session (uprobe_multi) or classic
    returns_why: str = ""     # why classic return probes serve a sampled recording
    uprobes: str = "perf"     # how uprobes are attached: multi (uprobe_multi links) or perf (one perf event each)
    uprobes_why: str = ""     # why perf events
    heap: str = "probes"      # how heap calls reach the probes: probes (every call traps) or inject (markers)


def _import_bcc():
    try:
        import bcc  # noqa: PLC0415  (heavy; imported only when recording)
    except ImportError as e:
        raise PermissionProblem(
            "cannot import BCC's Python bindings (Debian package python3-bpfcc); "
            f"run 'make setup' or 'apt-get install python3-bpfcc' ({e})") from None
    return bcc


class _Libbcc:
    """libbcc entry points declared with their real signatures. python3-bpfcc 0.26 declares
    bpf_attach_uprobe with one argument too few, so ref_ctr_offset is stack garbage and the
    kernel then refuses other tools' uprobes on the same function. We pass 0."""

    def __init__(self) -> None:
        lib = ct.CDLL("libbcc.so.0", use_errno=True)
        self.attach_uprobe = lib["bpf_attach_uprobe"]  # a fresh function object, not BCC's
        self.attach_uprobe.restype = ct.c_int
        self.attach_uprobe.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p,
                                       ct.c_uint64, ct.c_int, ct.c_uint32]
        self.update_batch = lib["bpf_update_batch"]
        self.update_batch.restype = ct.c_int
        self.update_batch.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.POINTER(ct.c_uint32)]
        self.lookup_batch = lib["bpf_lookup_batch"]
        self.lookup_batch.restype = ct.c_int
        self.lookup_batch.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p,
                                      ct.c_void_p, ct.POINTER(ct.c_uint32)]


def _bcc_version(bcc) -> str:
    lib = getattr(bpfcache.libbcc(), "_name", "")
    try:
        st = os.stat(os.path.realpath(lib)) if lib else None
    except OSError:
        st = None
    return f"{getattr(bcc, '__version__', '?')} {os.path.realpath(lib) if lib else ''} {st.st_size if st else ''}"


def _cached_bpf(bcc, entry: dict, pid: int, maps_text: bytes, cflags: list[str],
                preload: list[tuple[bytes, int]] = (), skip_sys: bool = False):
    """A BCC module whose tables come from compiling `maps_text` (declarations only) and whose
    programs are the cached instructions (tracer/bpf/cache.py), relocated to its map fds and
    `pid`, loaded as BCC's load_func loads, tracepoint programs attached as BCC's autoload does."""
    lib = bpfcache.libbcc()

    class CachedBPF(bcc.BPF):
        def _trace_autoload(self) -> None:
            pass  # the maps-only module has no programs of its own: see below

        def load_func(self, func_name, prog_type, device=None, attach_type=-1):
            func_name = func_name.encode() if isinstance(func_name, str) else func_name
            if func_name in self.funcs:
                return self.funcs[func_name]
            if func_name.decode() not in entry["funcs"]:
                raise Exception(f"Unknown program {func_name}")

            def table_fd(name: str) -> int:
                return lib.as_bpf_table_fd(self.module, name.encode())

            code = bpfcache.relocate(entry, func_name.decode(), pid, table_fd)
            buf = ct.create_string_buffer(code, len(code))
            log_level = 2 if self.debug & bcc.DEBUG_BPF_REGISTER_STATE else 1 if self.debug & bcc.DEBUG_BPF else 0
            fd = lib.as_bcc_func_load(self.module, prog_type, func_name, buf, len(code),
                                   entry["license"].encode(), entry["kern_version"], log_level, None, 0,
                                   device, attach_type)
            if fd < 0:
                err = ct.get_errno()
                if err == errno.EPERM:
                    raise Exception("Need super-user privileges to run")
                raise Exception(f"Failed to load BPF program {func_name}: {os.strerror(err)}")
            fn = bcc.BPF.Function(self, func_name, fd)
            self.funcs[func_name] = fn
            return fn

    with bcclight.light(bcc):
        bpf = CachedBPF(text=maps_text, cflags=cflags)
    tps = [name.encode() for name in entry["funcs"] if name.startswith("tracepoint__")]
    # The verifier runs in the loading thread, and libbcc's call releases the GIL: the programs
    # known to be needed are verified two at a time. A failure here is left for the load that
    # needs the program (it raises there, as it would have without this).
    sys = [(n, bcc.BPF.TRACEPOINT) for n in SYS_TAILS if n.decode() in entry["funcs"]]
    todo = [(b, bcc.BPF.TRACEPOINT) for b in tps] + sys
    todo += [item for item in preload if item[0].decode() in entry["funcs"]]

    def try_load(item) -> None:
        try:
            bpf.load_func(*item)
        except Exception:  # noqa: BLE001
            pass

    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(try_load, todo))
    fill_sys_tails(bcc, bpf)
    for b in tps:
        if skip_sys and b.startswith(SYS_TP_PREFIX):
            continue  # --inject: attached later, only for the mmap-family calls the agent could not hook
        bpf.attach_tracepoint(tp=b[len(b"tracepoint__"):].replace(b"__", b":"), fn_name=b)
    return bpf


SYS_TP_PREFIX = b"tracepoint__syscalls__"


def sys_tracepoints(kind: str) -> list[str]:
    """The tracepoints of one mmap-family call (tracer/inject/injection.py SYS_FAMILY kind)."""
    return [f"syscalls:sys_{d}_{kind}" for d in ("enter", "exit")]


SYS_TAILS = (b"sys_unwind", b"sys_keep")  # probes/syscalls.h: the stack of an mmap or brk exit (DWARF)


def fill_sys_tails(bcc, bpf) -> None:
    """The programs the mmap and brk exits hand their stack over to (syscalls.h sys_handoff)."""
    try:
        table = bpf[b"sys_tails"]
    except KeyError:
        return  # --unwind fp: the exits take the stack themselves
    for i, name in enumerate(SYS_TAILS):
        table[ct.c_int(i)] = ct.c_int(bpf.load_func(name, bcc.BPF.TRACEPOINT).fd)


def _detach_all(bcc, bpf) -> None:
    """Close every uprobe and tracepoint perf event of `bpf` at once, then let BCC forget them.
    Each close waits in the kernel for the probe to be unregistered (an RCU grace period:
    ~0.1 s per uprobe, ~0.08 s per tracepoint here), and BCC's cleanup closes them one by one —
    3 s at the end of every recording. Closed from one thread each, the waits overlap."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    lib = bcc.libbcc.lib
    ups, tps = list(bpf.uprobe_fds.items()), list(bpf.tracepoint_fds.items())
    if not ups and not tps:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(ups) + len(tps))) as pool:
        closed = list(pool.map(lib.bpf_close_perf_event_fd, [fd for _, fd in ups + tps]))
    for (ev, _fd), res in zip(ups, closed[:len(ups)], strict=True):
        if res >= 0:
            lib.bpf_detach_uprobe(ev)  # the tracefs event, if libbcc made one (not with the uprobe PMU)
            bpf._del_uprobe_fd(ev)
    for (tp, _fd), res in zip(tps, closed[len(ups):], strict=True):
        if res >= 0:
            cat, name = tp.split(b":")
            lib.bpf_detach_tracepoint(cat, name)
            del bpf.tracepoint_fds[tp]


class Probes:
    """The BPF program for one target process."""

    def __init__(self, pid: int, options: RecordOptions | None = None, launched: bool = False) -> None:
        self.pid = pid
        self.options = options or RecordOptions()
        self.mode = self.options.mode
        self.multi, self.multi_why = links_choice(self.options)
        self.session, self.session_why = session_choice(self.options)
        self._links: list[int] = []  # uprobe_multi link fds: closing one detaches its probes at once
        self._queued: dict[tuple[str, str, int], dict[int, int]] = {}  # (program, path, kind) -> {offset: cookie}
        self._classic_loaded = False  # alloc_return and `tails` (classic return probes) loaded
        self.unwind = self.options.unwind  # "fp" when the verifier refused the DWARF unwinder
        self.unwind_error = ""  # why DWARF unwinding fell back to frame pointers, if it did
        self.rss_tracepoint = self.options.rss_tracepoint
        if not self.rss_tracepoint:
            try:
                rss_offsets()
            except (OSError, LookupError):
                self.rss_tracepoint = True  # this kernel's BTF does not say where the counter is
        self.timings: dict[str, float] = {}  # start-up phases: name -> seconds (Recorder --verbose)
        t = time.perf_counter()
        bcc = _import_bcc()
        self.timings["import bcc"] = time.perf_counter() - t
        self._bcc = bcc
        self._lib = _Libbcc()
        self.bpf_cache = ""  # how the programs were obtained: hit, miss (compiled, cached), off, uncached
        try:
            self.bpf = self._compile(launched, self.unwind)
            t = time.perf_counter()
            self._load_allocator_programs()
            self.timings["load (verifier)"] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 (BCC raises bare Exception for compile/load failures)
            if self.unwind != "dwarf":
                raise PermissionProblem(f"cannot load the BPF program: {e}; run 'allocscope doctor'") from None
            # The DWARF unwinder is the largest part for the verifier: keep tracing without it.
            self.unwind_error = str(e).splitlines()[0] if str(e) else "BPF load failed"
            self.unwind = "fp"
            try:
                self._close_bpf()
                self.bpf = self._compile(launched, "fp")
                self._load_allocator_programs()
            except Exception as e2:  # noqa: BLE001
                raise PermissionProblem(f"cannot load the BPF program: {e2}; run 'allocscope doctor'") from None
        self.report = AttachReport(tracepoints=[
            f"{c}:{n}" for c, n in [("syscalls", f"sys_{d}_{s}") for s in
                                    ("mmap", "munmap", "mremap", "brk", "madvise") for d in ("enter", "exit")]
            + [("task", "task_rename"), ("sched", "sched_process_exit"), ("sched", "sched_process_exec"),
               ("sched", "sched_switch"), ("tlb", "tlb_flush")]
            + ([("kmem", "rss_stat")] if self.rss_tracepoint else [])])
        if self.options.inject:  # the mmap family's tracepoints: only for the calls the agent cannot hook
            self._sys_tracepoints_off()
        self._events_cb = None
        self._fault_fds: dict[int, int] = {}  # tid -> perf event fd (residency mode)
        self._addressed: list[tuple] = []  # (path, file offset, map, value): written once mapped
        self._xol = 0  # the start of the target's [uprobes] page written to xol_cfg

    def _compile(self, launched: bool, unwind: str):
        """The BCC module of probes/allocscope.c for this recording, its programs from the cache of
        compiled programs when it has them (tracer/bpf/cache.py), else compiled by clang (and
        cached). Either way the maps are created here and the tracepoint programs attached."""
        bcc = self._bcc
        text = bpf_text()
        flags = probe_cflags(self.options, launched, unwind, self.rss_tracepoint)

        def cflags(tgid: int) -> list[str]:
            return [f"-I{L.PROBES_DIR}", f"-DAS_TGID={tgid}", f"-DAS_MAX_DEPTH={L.MAX_DEPTH}",
                    "-Wno-macro-redefined", *flags]

        t = time.perf_counter()
        if not bpfcache.enabled():
            self.bpf_cache = "off"
            with bcclight.light(bcc):
                bpf = bcc.BPF(text=text, cflags=cflags(self.pid))
            fill_sys_tails(bcc, bpf)
            self.timings["compile (BCC, clang)"] = time.perf_counter() - t
            return bpf
        key = bpfcache.cache_key(text, cflags(bpfcache.TGID_SENTINEL), _bcc_version(bcc))
        entry = bpfcache.load(key)
        if entry is None:
            entry = self._compile_entry(text, cflags(bpfcache.TGID_SENTINEL))
            self.timings["compile (BCC, clang)"] = time.perf_counter() - t
            t = time.perf_counter()
            if entry is None:
                self.bpf_cache = "uncached"
                with bcclight.light(bcc):
                    bpf = bcc.BPF(text=text, cflags=cflags(self.pid))
                fill_sys_tails(bcc, bpf)
                self.timings["compile again (not cacheable)"] = time.perf_counter() - t
                return bpf
            self.bpf_cache = "miss"
        else:
            self.bpf_cache = "hit"
        try:
            bpf = _cached_bpf(bcc, entry, self.pid, bpfcache.maps_only(text), cflags(self.pid),
                              self._programs_needed(unwind), skip_sys=self.options.inject)
        except Exception:  # noqa: BLE001 (BCC's bare Exception): compiled as without the cache
            bpf = None
        if bpf is None or not bpfcache.same_tables(bpfcache.table_signature(bpf.module), entry["tables"]):
            if bpf is not None:
                bpf.cleanup()  # the maps-only source declares other maps: never trust the entry
            self.bpf_cache = "uncached"
            with bcclight.light(bcc):
                bpf = bcc.BPF(text=text, cflags=cflags(self.pid))
            fill_sys_tails(bcc, bpf)
            self.timings["compile (tables differ from the cache's)"] = time.perf_counter() - t
            return bpf
        if self.bpf_cache == "miss":
            bpfcache.save(key, entry)
        self.timings[f"maps + tracepoints (cache {self.bpf_cache})"] = time.perf_counter() - t
        return bpf

    def _compile_entry(self, text: bytes, cflags: list[str]) -> dict | None:
        """Compile with the sentinel pid, without loading anything, and take the cache entry."""
        bcc = self._bcc

        class Compiled(bcc.BPF):
            def _trace_autoload(self) -> None:
                pass  # nothing is loaded from this module: its pid is the sentinel

        with bcclight.light(bcc):
            mod = Compiled(text=text, cflags=cflags)
        try:
            return bpfcache.extract(mod.module)
        finally:
            mod.cleanup()

    def _close_bpf(self) -> None:
        bpf, self.bpf = getattr(self, "bpf", None), None
        if bpf is not None:
            bpf.cleanup()

    def _programs_needed(self, unwind: str) -> list[tuple[bytes, int]]:
        """(program, type) that _load_allocator_programs loads, to verify them in parallel."""
        if self.options.mode == "residency":
            names = [b"fault_sample"] + ([b"fault_unwind", b"fault_keep"] if unwind == "dwarf" else [])
            return [(n, self._bcc.BPF.PERF_EVENT) for n in names]
        if self.session:
            names = [b"heap_session"] + ([b"salloc_unwind", b"salloc_keep"] if unwind == "dwarf" else [])
        else:
            names = [b"alloc_return"] + ([b"alloc_unwind", b"alloc_keep"] if unwind == "dwarf" else [])
            if self.options.inject:
                names += [b"mark_alloc", b"mark_free", b"mark_sys"]
                names += [b"msys_unwind", b"msys_keep"] if unwind == "dwarf" else []
            elif self.multi:
                names += [b"heap_entry"]
        return [(n, self._bcc.BPF.KPROBE, None, self._attach_type(n)) for n in names]

    def _attach_type(self, name: bytes) -> int:
        """expected_attach_type of a uprobe program: a program array takes programs of one type,
        so every program a link runs (and every one they tail-call) is loaded as the links'."""
        if name in (b"heap_session", b"salloc_unwind", b"salloc_keep"):
            return TRACE_UPROBE_SESSION
        return TRACE_UPROBE_MULTI if self.multi else -1

    def _load(self, name: bytes):
        return self.bpf.load_func(name, self._bcc.BPF.KPROBE, attach_type=self._attach_type(name))

    def _load_allocator_programs(self) -> None:
        """Verify the allocator programs now (the verifier is what may refuse the DWARF unwinder)
        and, with the stack cache, fill the tail-call table alloc_return jumps through on a miss:
        [0] alloc_unwind, [1] alloc_keep. Residency mode attaches no allocator probe; its fault
        program jumps through `ftails` likewise: [0] fault_unwind, [1] fault_keep."""
        if self.options.mode == "residency":
            pe = self._bcc.BPF.PERF_EVENT
            self._fault_prog = self.bpf.load_func(b"fault_sample", pe)
            if self.unwind == "dwarf":
                tails = self.bpf[b"ftails"]
                for i, name in enumerate((b"fault_unwind", b"fault_keep")):
                    tails[ct.c_int(i)] = ct.c_int(self.bpf.load_func(name, pe).fd)
            return
        kprobe = self._bcc.BPF.KPROBE
        self._classic_loaded = False
        if self.session:  # the classic programs wait until a classic return probe needs them
            self._load(b"heap_session")
            if self.unwind == "dwarf":
                tails = self.bpf[b"stails"]
                for i, name in enumerate((b"salloc_unwind", b"salloc_keep")):
                    tails[ct.c_int(i)] = ct.c_int(self._load(name).fd)
            return
        del kprobe
        self._load_classic()

    def _load_classic(self) -> None:
        """alloc_return and, with the stack cache, the tail-call table every classic return
        program (alloc_return, cu_return, custom_return) jumps through on a miss."""
        if self._classic_loaded:
            return
        self._load(b"alloc_return")
        if self.unwind == "dwarf":
            tails = self.bpf[b"tails"]
            for i, name in enumerate((b"alloc_unwind", b"alloc_keep")):
                tails[ct.c_int(i)] = ct.c_int(self._load(name).fd)
        self._classic_loaded = True

    # --- attach -------------------------------------------------------------------------

    def _attach(self, fn_name: str, path: str, offset: int, kind: int, cookie: int = 0) -> None:
        """One uprobe: with links, queued for _flush (one link per program, module and kind);
        else a perf event now."""
        if kind == BPF_PROBE_RETURN:
            self._load_classic()
        fn = self._load(fn_name.encode())
        if self.multi:
            self._queued.setdefault((fn_name, path, kind), {}).setdefault(offset, cookie)
            return
        prefix = b"r" if kind == BPF_PROBE_RETURN else b"p"
        ev = self.bpf._get_uprobe_evname(prefix, path.encode(), offset, self.pid)
        fd = self._lib.attach_uprobe(fn.fd, kind, ev, path.encode(), offset, self.pid, 0)
        if fd < 0:
            err = ct.get_errno()
            raise PermissionProblem(
                f"cannot attach a uprobe to {os.path.basename(path)}+{offset:#x} ({fn_name}): "
                f"{os.strerror(err) if err else 'unknown error'}")
        self.bpf._add_uprobe_fd(ev, fd)

    def _flush(self) -> dict[tuple[str, str, int, int], str]:
        """The queued uprobes as links, return links first (see attach). A link the kernel
        refuses is tried again one offset at a time; returns {(program, path, offset, kind):
        why} for the probes that still could not be attached."""
        failed: dict[tuple[str, str, int, int], str] = {}
        queued, self._queued = self._queued, {}
        for (prog, path, kind), probes in sorted(queued.items(), key=lambda kv: kv[0][2] != BPF_PROBE_RETURN):
            fd_prog = self.bpf.funcs[prog.encode()].fd
            flags = UPROBE_MULTI_RETURN if kind == BPF_PROBE_RETURN else 0
            offsets = sorted(probes)
            groups = [offsets]
            while groups:
                offs = groups.pop()
                fd = uprobe_multi_link(fd_prog, path, offs, [probes[o] for o in offs], self.pid, flags=flags)
                if fd >= 0:
                    self._links.append(fd)
                elif len(offs) > 1:
                    groups += [[o] for o in offs]
                else:
                    failed[(prog, path, offs[0], kind)] = (
                        f"cannot attach a uprobe to {os.path.basename(path)}+{offs[0]:#x} ({prog}): {os.strerror(-fd)}")
        return failed

    def attach(self, plans: list, custom: list | None = None, sources: dict[str, int] | None = None,
               maps: list | None = None, agent=None) -> AttachReport:
        """Probes on every allocator planned (tracer.allocators.discovery.plan_allocator; the one serving
        malloc first) and on the user's functions (tracer.allocators.custom.Located). Return probes
        first, entries second: a call that enters between the two gets no entry state, rather
        than an entry state whose return is never seen. `sources`: source name -> id for the
        allocators other than the main heap and the user's functions. `agent` (--inject: a
        tracer.inject.injection.Injection, hooks placed): the markers are probed instead of the heap
        functions."""
        rep = self.report
        primary = plans[0].allocator if plans else None
        if primary is not None:
            rep.allocator, rep.allocator_kind = primary.path, primary.kind
        if self.options.mode == "residency":
            rep.skipped = dict.fromkeys(STANDARD, "residency mode: no allocator probes")
            rep.allocators = [dict(pl.as_dict([]), skipped={"*": "residency mode: no allocator probes"})
                              for pl in plans]
            self.attach_faults()
            rep.tracepoints.append(f"perf:page-faults (software event, every {self.options.fault_sample}th, "
                                   "per thread, inherited)")
            return rep
        if primary is not None:
            for sym in ("malloc", "free"):
                if sym not in primary.entries:
                    raise AllocscopeError(f"{primary.path} does not define {sym}; cannot trace it")
        if agent is not None:
            self._attach_markers(agent, custom or [], sources or {}, maps or [])
            rep.allocators = [pl.as_dict([]) for pl in plans]
            rep.custom = [{"spec": loc.fn.spec, "module": loc.path, "source": loc.fn.source}
                          for loc, _src, _off in custom or []]
            return rep
        self._attach_plans(plans, custom or [], sources or {}, maps or [])
        if plans:
            first = plans[0]
            rep.attached = [pr.symbol for pr in first.probes]
            rep.aliases, rep.skipped = dict(first.aliases), dict(first.skipped)
            rep.placement = {pr.symbol: pr.reason for pr in first.probes if pr.moved}
        rep.allocators = [pl.as_dict() for pl in plans]
        rep.custom = [{"spec": loc.fn.spec, "module": loc.path, "source": loc.fn.source}
                      for loc, _src, _off in custom or []]
        return rep

    def _attach_markers(self, agent, custom: list, sources: dict[str, int], maps: list) -> None:
        """--inject: entry probes on the agent's two markers (only sampled calls reach them), the
        agent's thread table for agent_api, and the user's functions as usual."""
        self._attach_plans([], custom, sources, maps)
        img = agent.agent
        self._attach("mark_alloc", img.path, img.file_offset("as_mark_alloc"), BPF_PROBE_ENTRY)
        self._attach("mark_free", img.path, img.file_offset("as_mark_free"), BPF_PROBE_ENTRY)
        failed = self._flush()
        if failed:
            raise PermissionProblem(next(iter(failed.values())))
        t = self.bpf[b"agent_cfg"]
        v = t.Leaf()
        v.threads, v.bits = agent.tables, agent_thread_bits()
        t[ct.c_int(0)] = v
        self._attach_sys_marker(agent)
        self.report.heap = "inject"
        self.report.attached = [h.spec.symbol for h in agent.hooks if not h.spec.sys_kind]
        self.report.skipped = dict(agent.refused)

    def _attach_sys_marker(self, agent) -> None:
        """--inject: the mmap-family calls the agent hooked are reported through its as_mark_sys
        (probes/syscalls.h mark_sys) and switched over in `sys_hooked`; the others get their
        syscall tracepoints now. `sys_tracepoints_kept`: those."""
        from ..inject.injection import SYS_FAMILY  # noqa: PLC0415

        hooked = agent.sys_hooked
        if hooked:
            if self.unwind == "dwarf":
                tails = self.bpf[b"msys_tails"]
                for i, name in enumerate((b"msys_unwind", b"msys_keep")):
                    tails[ct.c_int(i)] = ct.c_int(self._load(name).fd)
            self._attach("mark_sys", agent.agent.path, agent.agent.file_offset("as_mark_sys"), BPF_PROBE_ENTRY)
            failed = self._flush()
            if failed:
                raise PermissionProblem(next(iter(failed.values())))
            t = self.bpf[b"sys_hooked"]
            for kind in hooked:
                t[ct.c_int(SYS_FAMILY[kind][1])] = ct.c_uint32(1)
        self.sys_tracepoints_kept = [tp for kind in SYS_FAMILY if kind not in hooked for tp in sys_tracepoints(kind)]
        for tp in self.sys_tracepoints_kept:
            if tp.encode() not in self.bpf.tracepoint_fds:
                fn = b"tracepoint__" + tp.encode().replace(b":", b"__")
                self.bpf.attach_tracepoint(tp=tp.encode(), fn_name=fn)
        self._sys_tracepoints_off()
        self.report.tracepoints = [tp for tp in self.report.tracepoints if not tp.startswith("syscalls:")] + \
            self.sys_tracepoints_kept

    def _sys_tracepoints_off(self) -> None:
        """Detach the syscall tracepoints of the mmap family not kept (BCC attaches them all when it
        compiles; the cached programs are attached without them under --inject), their closes
        overlapped (each waits for an RCU grace period)."""
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        kept = {tp.encode() for tp in getattr(self, "sys_tracepoints_kept", [])}
        off = [tp for tp in list(self.bpf.tracepoint_fds) if tp.startswith(b"syscalls:") and tp not in kept]
        if off:
            lib = self._bcc.libbcc.lib
            fds = [self.bpf.tracepoint_fds[tp] for tp in off]
            with ThreadPoolExecutor(max_workers=len(off)) as pool:
                list(pool.map(lib.bpf_close_perf_event_fd, fds))
            for tp in off:
                cat, name = tp.split(b":")
                lib.bpf_detach_tracepoint(cat, name)
                del self.bpf.tracepoint_fds[tp]

    def attach_more(self, plans: list, sources: dict[str, int], maps: list) -> None:
        """Allocators found after the attach (a library dlopen'd since)."""
        self._attach_plans(plans, [], sources, maps)
        self.report.allocators += [pl.as_dict() for pl in plans]

    def _attach_sessions(self, plans: list, sources: dict[str, int]) -> bool:
        """The heap functions of `plans` through uprobe sessions: one uprobe_multi link per
        module, heap_session at every probed offset, the cookie saying which call it is (enum
        as_api | source << 16). False (nothing attached) when the kernel refuses the first link
        and --uprobe-sessions is auto: the classic probes serve instead, and the report says why."""
        by_path: dict[str, dict[int, int]] = {}
        for pl in plans:
            src = sources.get(pl.allocator.source)
            for pr in pl.probes:
                by_path.setdefault(pr.path, {}).setdefault(pr.offset, heap_cookie(pr.program, src))
        fd_prog = self.bpf.funcs[b"heap_session"].fd
        for path, probes in by_path.items():
            offsets = sorted(probes)
            fd = uprobe_multi_link(fd_prog, path, offsets, [probes[o] for o in offsets], self.pid,
                                   attach_type=TRACE_UPROBE_SESSION)
            if fd >= 0:
                self._links.append(fd)
                continue
            why = f"the kernel refused a uprobe session link on {os.path.basename(path)}: {os.strerror(-fd)}"
            if self._links or self.options.uprobe_sessions == "on":
                raise PermissionProblem(f"cannot attach uprobe sessions: {why}")
            self.session, self.session_why = False, why
            return False
        self.report.returns, self.report.returns_why = "session", ""
        return True

    def _attach_plans(self, plans: list, custom: list, sources: dict[str, int], maps: list) -> None:
        todo: list[tuple] = []  # (path, offset, entry program, returns, cookie)
        if self.session and self._attach_sessions(plans, sources):
            plans = []  # the heap functions are probed; the user's functions stay classic below
        elif self.options.sample_bytes > 0:
            self.report.returns, self.report.returns_why = "classic", self.session_why
        self.report.uprobes, self.report.uprobes_why = ("multi", "") if self.multi else ("perf", self.multi_why)
        for pl in plans:
            src = sources.get(pl.allocator.source)
            for pr in pl.probes:
                if self.multi:  # one entry program per module, the cookie says which call
                    todo.append((pr.path, pr.offset, "heap_entry", pr.returns, heap_cookie(pr.program, src)))
                    continue
                todo.append((pr.path, pr.offset, pr.program, pr.returns, 0))
                if src is not None:
                    self._addressed.append((pr.path, pr.offset, "probe_src", ct.c_uint32(src)))
        for loc, src, offset in custom:
            fn = loc.fn
            spec = L.Custom(source=src, size_arg=_arg(fn.size_arg), count_arg=_arg(fn.count_arg),
                            out_arg=_arg(fn.out_arg), ptr_arg=_arg(fn.ptr_arg))
            todo.append((loc.path, offset, "custom_free_enter" if fn.free else "custom_enter", not fn.free, 0))
            self._addressed.append((loc.path, offset, "custom_fns", spec))
        self.update_addresses(maps)
        for path, off, prog, returns, _cookie in todo:
            if returns:  # the same address as the entry probe: one trap for both
                self._attach("custom_return" if prog == "custom_enter" else "alloc_return", path, off,
                             BPF_PROBE_RETURN)
        for path, off, prog, _returns, cookie in todo:
            self._attach(prog, path, off, BPF_PROBE_ENTRY, cookie)
        failed = self._flush()
        if failed:
            raise PermissionProblem(next(iter(failed.values())))

    def update_addresses(self, maps: list) -> None:
        """Write the entries keyed by probed address (probe_src, custom_fns) whose module is
        mapped now: address = mapping start + file offset - mapping offset. Called at the attach
        and whenever the maps change (launch mode: the libraries are mapped later)."""
        xol = next((m for m in maps if m.path == "[uprobes]"), None)
        if xol is not None and xol.start != self._xol:  # the trampoline page (regions.h, is_trampoline)
            t = self.bpf[b"xol_cfg"]
            t[ct.c_int(0)], t[ct.c_int(1)] = ct.c_uint64(xol.start), ct.c_uint64(xol.end)
            self._xol = xol.start
        for i, (path, off, table, value) in enumerate(self._addressed):
            if value is None:
                continue
            for m in maps:
                if m.path == path and "x" in m.perms and m.offset <= off < m.offset + (m.end - m.start):
                    if table == "probe_src":  # entries look their source up from now on
                        self.bpf[b"src_cfg"][ct.c_int(0)] = ct.c_uint32(1)
                    t = self.bpf[table.encode()]
                    t[t.Key(m.start + off - m.offset)] = value
                    self._addressed[i] = (path, off, table, None)  # done
                    break

    def attach_cuda(self, path: str) -> dict:
        """Entry and return probes on the CUDA driver's allocation calls in `path`
        (libcuda.so.1; tracer/allocators/cuda.py), placed as the allocator's are. A call the library lacks,
        or one whose probe the kernel refuses, is skipped and said; the recording goes on."""
        from ..allocators.cuda import CUDA_FUNCS, CudaReport  # noqa: PLC0415
        from ..allocators.placement import place_probe  # noqa: PLC0415

        rep = CudaReport(module=path, attached=[], skipped={}, placement={})
        if self.options.mode == "residency":
            rep.skipped = dict.fromkeys(CUDA_FUNCS, "residency mode: no API probes")
            self.report.cuda = rep.as_dict()
            return self.report.cuda
        so = symbol_offsets(path, list(CUDA_FUNCS))
        plan: list[tuple[str, str, int]] = []
        by_offset: dict[int, str] = {}
        for sym, (prog, reads) in CUDA_FUNCS.items():
            off = so.offsets.get(sym)
            if off is None:
                rep.skipped[sym] = f"not defined by {os.path.basename(path)}"
                continue
            if off in by_offset:
                rep.skipped[sym] = f"same address as {by_offset[off]}: probed once"
                continue
            by_offset[off] = sym
            pl = place_probe(path, off, so.sizes.get(sym, 0), reads)
            if pl.moved:
                rep.placement[sym] = pl.reason
            plan.append((sym, prog, pl.offset))
        returns = []
        for sym, _prog, off in plan:  # returns first, as for the allocator
            try:
                self._attach("cu_return", path, off, BPF_PROBE_RETURN)
                returns.append((sym, _prog, off))
            except PermissionProblem as e:
                rep.skipped[sym] = str(e)
        failed = self._flush()
        kept = []
        for r in returns:
            why = failed.get(("cu_return", path, r[2], BPF_PROBE_RETURN))
            if why:
                rep.skipped[r[0]] = why
            else:
                kept.append(r)
        returns = kept
        for sym, prog, off in returns:
            try:
                self._attach(prog, path, off, BPF_PROBE_ENTRY)
            except PermissionProblem as e:
                rep.skipped[sym] = str(e)
        failed = self._flush()
        for sym, prog, off in returns:
            if sym in rep.skipped:
                continue
            if (prog, path, off, BPF_PROBE_ENTRY) in failed:
                rep.skipped[sym] = failed[(prog, path, off, BPF_PROBE_ENTRY)]
            else:
                rep.attached.append(sym)
        self.report.cuda = rep.as_dict()
        return self.report.cuda

    def unwinder(self, progress=None, lazy: bool = True):
        """The manager of the DWARF unwind maps (tracer.unwind.tables.Unwinder); None with frame pointers.
        `lazy`: modules without cached rows are built once stacks cross them (--pid)."""
        if self.unwind != "dwarf":
            return None
        from ..unwind.tables import Unwinder  # noqa: PLC0415
        return Unwinder(self.bpf, self.pid, self.options.unwind_rows, progress,
                        update_batch=self._lib.update_batch, lazy=lazy)

    def attach_faults(self) -> None:
        """Residency mode: a page-fault software perf event on every thread of the target, one
        sample per `fault_sample` faults, inherited by the threads (and children) it creates
        later, each sample running fault_sample. Unsampled faults cost the kernel a counter
        increment, no BPF. Threads created while attaching are caught by listing again."""
        from bcc.libbcc import lib  # noqa: PLC0415
        from bcc.perf import Perf  # noqa: PLC0415

        attr = Perf.perf_event_attr()
        attr.type = 1     # PERF_TYPE_SOFTWARE
        attr.config = 2   # PERF_COUNT_SW_PAGE_FAULTS
        attr.size = ct.sizeof(attr)
        attr.sample_period = self.options.fault_sample
        attr.inherit = 1
        fd_prog = self._fault_prog.fd
        for _ in range(100):
            try:
                tids = {int(t) for t in os.listdir(f"/proc/{self.pid}/task")}
            except OSError:
                tids = set()
            new = tids - set(self._fault_fds)
            if not new:
                break
            for tid in sorted(new):
                fd = lib.bpf_attach_perf_event_raw(fd_prog, ct.byref(attr), tid, -1, -1, 0)
                if fd < 0:
                    if not os.path.exists(f"/proc/{self.pid}/task/{tid}"):
                        self._fault_fds[tid] = -1  # exited meanwhile
                        continue
                    raise PermissionProblem(f"cannot open a page-fault perf event on thread {tid}; "
                                            "run 'allocscope doctor'")
                self._fault_fds[tid] = fd

    def fault_count(self) -> int:
        """User page faults of the target since the attach (its perf events' counts, threads
        created later included), exact: the probes only see one in `fault_sample`."""
        total = 0
        for fd in self._fault_fds.values():
            if fd < 0:
                continue
            try:
                total += int.from_bytes(os.read(fd, 8), "little")
            except OSError:
                continue
        return total

    def program_stats(self) -> dict[str, dict[str, int]]:
        """BPF run time and runs per program of ours ({} unless the kernel keeps them:
        sysctl kernel.bpf_stats_enabled=1), from bpf(BPF_OBJ_GET_INFO_BY_FD)."""
        try:
            with open("/proc/sys/kernel/bpf_stats_enabled") as f:
                if f.read().strip() != "1":
                    return {}
        except OSError:
            return {}
        out = {}
        for name, fn in getattr(self.bpf, "funcs", {}).items():
            info = prog_stats(fn.fd)
            if info and info[1]:
                out[name.decode() if isinstance(name, bytes) else str(name)] = {
                    "run_time_ns": info[0], "run_cnt": info[1]}
        return out

    def close(self) -> None:
        """Detach every probe and free the maps. Idempotent."""
        for fd in self._fault_fds.values():
            if fd >= 0:
                os.close(fd)
        self._fault_fds = {}
        links, self._links = getattr(self, "_links", []), []
        if links:  # every probe of a link at once (one unregistration wait), the links side by side
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            with ThreadPoolExecutor(max_workers=len(links)) as pool:
                list(pool.map(os.close, links))
        bpf, self.bpf = getattr(self, "bpf", None), None
        if bpf is not None:
            _detach_all(self._bcc, bpf)
            bpf.cleanup()

    # --- events ---------------------------------------------------------------------------

    def open_events(self, callback) -> None:
        """callback(Event copy) for every ring event, called from poll_events()."""
        def _cb(_ctx, data, _size):
            ev = L.Event()
            ct.memmove(ct.byref(ev), data, ct.sizeof(L.Event))
            callback(ev)
            return 0
        self._events_cb = _cb
        self.bpf[b"events"].open_ring_buffer(_cb)

    def poll_events(self, timeout_ms: int) -> None:
        self.bpf.ring_buffer_poll(timeout_ms)

    def drain_events(self) -> None:
        self.bpf.ring_buffer_consume()

    # --- map reads ---------------------------------------------------------------------------

    def iter_batches(self, name: str, key_type, val_type, chunk: int = 1 << 18, prefetch: bool = False):
        """Every entry of a hash map, read with BPF_MAP_LOOKUP_BATCH straight into preallocated
        numpy structured arrays of `chunk` entries (one syscall per chunk, not per key). Yields
        (keys, values) views of those buffers, valid until the next item is asked for: a caller
        copies what it keeps. With `prefetch`, a thread reads the next chunks (into two more
        buffers) while the caller works on this one: the kernel's copy-out (~0.4 µs an entry)
        and the caller's encoding overlap. Memory: 1 (3 with prefetch) x chunk x (key + value
        size), whatever the map holds."""
        table = self.bpf[name.encode()]
        kd, vd = np.dtype(key_type), np.dtype(val_type)
        fd = table.map_fd
        lookup = self._lib.lookup_batch

        def chunks(get_buf, stop=lambda: False):
            """(buffer pair, n) per chunk; get_buf() hands out a free pair."""
            in_batch, out_batch = ct.c_uint64(0), ct.c_uint64(0)
            first = True
            bufs = get_buf()
            while not stop():
                kbuf, vbuf = bufs
                cnt = ct.c_uint32(len(kbuf))
                res = lookup(fd, None if first else ct.byref(in_batch), ct.byref(out_batch),
                             kbuf.ctypes.data, vbuf.ctypes.data, ct.byref(cnt))
                err = ct.get_errno()
                n = cnt.value
                if res != 0 and err == errno.ENOSPC and n == 0:
                    # one bucket holds more entries than the buffer: a larger one, same position
                    bufs = (np.empty(len(kbuf) * 4, dtype=kd), np.empty(len(vbuf) * 4, dtype=vd))
                    continue
                if res != 0 and err != errno.ENOENT:
                    raise AllocscopeError(f"reading BPF map {name}: {os.strerror(err)}")
                if n:
                    yield bufs, n
                    if res == 0:
                        bufs = get_buf()
                if res != 0:
                    return
                first = False
                in_batch.value = out_batch.value

        def new_pair():
            return np.empty(chunk, dtype=kd), np.empty(chunk, dtype=vd)

        if not prefetch:
            pair = new_pair()
            for (k, v), n in chunks(lambda: pair):
                yield k[:n], v[:n]
            return

        free: queue.Queue = queue.Queue()
        for _ in range(3):
            free.put(new_pair())
        full: queue.Queue = queue.Queue()
        stop = threading.Event()

        def get_buf():
            while not stop.is_set():
                try:
                    return free.get(timeout=0.1)
                except queue.Empty:
                    continue
            return new_pair()  # stopping: never used

        def reader():
            try:
                for item in chunks(get_buf, stop.is_set):
                    full.put(item)
                full.put(None)
            except BaseException as e:  # noqa: BLE001 (handed to the consumer)
                full.put(e)

        th = threading.Thread(target=reader, name=f"read-{name}", daemon=True)
        th.start()
        try:
            while True:
                item = full.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                (k, v), n = item
                yield k[:n], v[:n]
                free.put((k, v))
        finally:
            stop.set()
            th.join()

    def _read_batch(self, name: str, key_type, val_type, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
        """All entries of a hash map as two numpy structured arrays (see iter_batches)."""
        keys_out, vals_out = [], []
        for k, v in self.iter_batches(name, key_type, val_type, chunk):
            keys_out.append(k.copy())
            vals_out.append(v.copy())
        if not keys_out:
            return np.empty(0, dtype=np.dtype(key_type)), np.empty(0, dtype=np.dtype(val_type))
        return np.concatenate(keys_out), np.concatenate(vals_out)

    def read_sites(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("sites", L.SiteKey, L.Site)

    def read_live(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("live", ct.c_uint64, L.Live)

    def read_dev_live(self) -> tuple[np.ndarray, np.ndarray]:
        """GPU allocations and pinned registrations outstanding: (DevKey, Live) arrays."""
        return self._read_batch("dev_live", L.DevKey, L.Live)

    def iter_live(self, chunk: int = 1 << 16):
        """The live map in chunks of at most `chunk` blocks (views, see iter_batches): the
        final snapshot streams them to the trace without holding the whole map."""
        return self.iter_batches("live", ct.c_uint64, L.Live, chunk, prefetch=True)

    def read_fault_sites(self) -> tuple[np.ndarray, np.ndarray]:
        """Residency mode: sampled first touches per (stack, thread), as `sites`."""
        if self.options.mode != "residency":
            return np.empty(0, dtype=np.dtype(L.SiteKey)), np.empty(0, dtype=np.dtype(L.Site))
        return self._read_batch("fault_sites", L.SiteKey, L.Site)

    def read_flows(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("flows", L.FlowKey, L.Flow)

    def read_stacks(self, ids) -> dict[int, tuple[int, int, list[int]]]:
        """stack id -> (flags, extra, ips) for the ids given (missing ids are left out)."""
        table = self.bpf[b"stacks"]
        out = {}
        for sid in ids:
            try:
                st = table[table.Key(sid)]
            except KeyError:
                continue
            ips = []
            for i in range(min(st.depth, L.MAX_DEPTH)):
                ip = int(st.ips[i])
                if ip == 0:  # end of the frame chain
                    break
                ips.append(ip)
            out[int(sid)] = (int(st.flags), int(st.extra), ips)
        return out

    def read_counters(self) -> dict[str, int]:
        table = self.bpf[b"counters"]
        names = L.counter_names()
        out = {}
        for idx, name in names.items():
            out[name] = int(sum(table[table.Key(idx)]))
        return out

    def seed(self, mem: dict[str, int], brk: int | None) -> None:
        """What the probes cannot know from the attach on: the break (/proc/PID/maps' [heap]
        end), and with the rss_stat tracepoint the RSS counters (bytes) it keeps current."""
        if brk:
            t = self.bpf[b"brk_state"]
            t[t.Key(0)] = t.Leaf(brk)
        t = self.bpf[b"wait_cfg"]  # waits are traced from here on (0: not at all)
        wait_min = max(0, round(self.options.wait_min_ms * 1e6))
        t[t.Key(0)] = t.Leaf(wait_min)
        if not wait_min:  # not traced: no program on every context switch of the machine
            try:
                self.bpf.detach_tracepoint(tp=b"sched:sched_switch")
                self.report.tracepoints = [x for x in self.report.tracepoints if x != "sched:sched_switch"]
            except Exception:  # noqa: BLE001 (BCC's bare Exception): it stays, returning at once
                pass
        if self.rss_tracepoint:
            t = self.bpf[b"rss"]
            for idx, key in ((0, "rss_file_bytes"), (1, "rss_anon_bytes"), (3, "rss_shmem_bytes")):
                if key in mem:
                    t[t.Key(idx)] = t.Leaf(mem[key])

    def read_totals(self) -> tuple[int, ...]:
        """From the kernel, exact: (live bytes, peak live bytes) of allocator-API memory;
        (bytes, count) of the regions the kernel side holds; CUDA host memory (pinned, managed)
        live; GPU memory live and its peak."""
        t = self.bpf[b"totals"]
        return tuple(int(t[t.Key(i)].value) for i in range(7))

    def set_peak_wake(self, threshold: int) -> None:
        """The live total past which the kernel side wakes the tracer for a peak snapshot
        (totals[7]; accounting.h peak_watch, tracer/record/peaks.py); 0: off."""
        t = self.bpf[b"totals"]
        t[t.Key(7)] = t.Leaf(threshold)

    def read_regions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every region the kernel side holds: (starts, Region values)."""
        return self._read_batch("regions", ct.c_uint64, L.Region)

    def read_untracked(self) -> dict[int, int]:
        """The mappings the kernel side knows to be untracked: start -> end."""
        keys, vals = self._read_batch("untracked", ct.c_uint64, ct.c_uint64)
        return dict(zip(keys.tolist(), vals.tolist()))

    def forget_untracked(self, start: int) -> None:
        t = self.bpf[b"untracked"]
        try:
            del t[t.Key(start)]
        except KeyError:
            pass

    def take_region(self, start: int) -> bool:
        """Delete the region at `start` from the kernel side (the tracer takes it over); False
        when it is no longer there (the probes freed or moved it meanwhile)."""
        t = self.bpf[b"regions"]
        try:
            del t[t.Key(start)]
        except KeyError:
            return False
        return True

    def set_site_ext(self, sid: int, tid: int, source: int, freed: int) -> None:
        """Bytes of a region site the tracer freed itself (see site_ext in probes/allocscope.c)."""
        t = self.bpf[b"site_ext"]
        k = t.Key()
        k.stack_id, k.tid, k.source = sid, tid, source
        t[k] = t.Leaf(freed)

    def read_releases(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("releases", L.ReleaseKey, L.Release)

    def read_waits(self) -> tuple[np.ndarray, np.ndarray]:
        """Waits at least --wait-min long, summed per (stack, thread): (WaitKey, Wait) arrays."""
        return self._read_batch("waits", L.WaitKey, L.Wait)

    def read_tlb(self) -> dict[str, int]:
        """TLB flushes on the target's threads, summed over CPUs: tlb_<reason>_flushes, _pages,
        _full (tlb:tlb_flush; reasons: layout.TLB_REASONS)."""
        table = self.bpf[b"tlb_flushes"]
        out = {}
        for i, name in enumerate(L.TLB_REASONS):
            vals = table[table.Key(i)]
            for f in ("flushes", "pages", "full"):
                out[f"tlb_{name}_{f}"] = int(sum(getattr(v, f) for v in vals))
        return out

    def read_offcpu(self) -> tuple[np.ndarray, np.ndarray]:
        """The target's threads blocked now: (tids, Offcpu values: since when, at which stack)."""
        return self._read_batch("offcpu", ct.c_uint32, L.Offcpu)

    def target_gone(self) -> bool:
        """The probes saw the target exec another program or its last thread exit: from then on
        nothing of its pid is counted, and /proc/PID describes something else."""
        t = self.bpf[b"gone"]
        return bool(t[t.Key(0)].value)
