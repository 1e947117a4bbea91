"""The BPF program of one recording, built and loaded: compiled by BCC (or its instructions taken
from the cache of compiled programs, tracer/bpf/cache.py), its maps created, the programs the
recording needs verified, the tracepoint programs attached. The one place besides
tracer/doctor.py that imports bcc (uprobes: tracer/bpf/attach.py; the maps: tracer/bpf/map_reads.py).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from common.errors import PermissionProblem

from ..base import layout as L
from ..base.cachedir import enabled
from ..base.options import RecordOptions
from . import bcc_lean as bcclight
from . import cache as bpfcache
from . import prebuilt
from .autoload import fill_sys_tails, verify_and_attach
from .kernel_btf import rss_offsets
from .objects import TRACE_UPROBE_MULTI, TRACE_UPROBE_SESSION
from .source import bpf_text, const_flags, links_choice, probe_config, session_choice


def _import_bcc():
    try:
        import bcc  # noqa: PLC0415  (heavy; imported only when recording)
    except ImportError as e:
        raise PermissionProblem(
            "cannot import BCC's Python bindings (Debian package python3-bpfcc); "
            f"run 'make setup' or 'apt-get install python3-bpfcc' ({e})"
        ) from None
    return bcc


class Libbcc:
    """libbcc entry points declared with their real signatures. python3-bpfcc 0.26 declares
    bpf_attach_uprobe with one argument too few, so ref_ctr_offset is stack garbage and the
    kernel then refuses other tools' uprobes on the same function. We pass 0."""

    def __init__(self) -> None:
        lib = ct.CDLL("libbcc.so.0", use_errno=True)
        self.attach_uprobe = lib["bpf_attach_uprobe"]  # a fresh function object, not BCC's
        self.attach_uprobe.restype = ct.c_int
        self.attach_uprobe.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_uint64, ct.c_int, ct.c_uint32]
        self.update_batch = lib["bpf_update_batch"]
        self.update_batch.restype = ct.c_int
        self.update_batch.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.POINTER(ct.c_uint32)]
        self.lookup_batch = lib["bpf_lookup_batch"]
        self.lookup_batch.restype = ct.c_int
        self.lookup_batch.argtypes = [
            ct.c_int,
            ct.c_void_p,
            ct.c_void_p,
            ct.c_void_p,
            ct.c_void_p,
            ct.POINTER(ct.c_uint32),
        ]


def _bcc_version(bcc) -> str:
    lib = getattr(bpfcache.libbcc(), "_name", "")
    try:
        st = os.stat(os.path.realpath(lib)) if lib else None
    except OSError:
        st = None
    return f"{getattr(bcc, '__version__', '?')} {os.path.realpath(lib) if lib else ''} {st.st_size if st else ''}"


def cached_bpf(
    bcc,
    entry: dict,
    pid: int,
    maps_text: bytes,
    cflags: list[str],
    preload: Sequence[tuple] = (),
    skip_sys: bool = False,
):
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
            fd = lib.as_bcc_func_load(
                self.module,
                prog_type,
                func_name,
                buf,
                len(code),
                entry["license"].encode(),
                entry["kern_version"],
                log_level,
                None,
                0,
                device,
                attach_type,
            )
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
    # the programs known to be needed verified two at a time, the tracepoints attached
    verify_and_attach(bcc, bpf, entry["funcs"], preload, skip_sys, workers=2)
    return bpf


def sys_tracepoints(kind: str) -> list[str]:
    """The tracepoints of one mmap-family call (tracer/inject/agent.py SYS_FAMILY kind)."""
    return [f"syscalls:sys_{d}_{kind}" for d in ("enter", "exit")]


def detach_all(bcc, bpf) -> None:
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
    for (ev, _fd), res in zip(ups, closed[: len(ups)], strict=True):
        if res >= 0:
            lib.bpf_detach_uprobe(ev)  # the tracefs event, if libbcc made one (not with the uprobe PMU)
            bpf._del_uprobe_fd(ev)
    for (tp, _fd), res in zip(tps, closed[len(ups) :], strict=True):
        if res >= 0:
            cat, name = tp.split(b":")
            lib.bpf_detach_tracepoint(cat, name)
            del bpf.tracepoint_fds[tp]


class Program:
    """probes/allocscope.c compiled and loaded for one target process (`bpf`: the BCC module),
    with the DWARF unwinder when the verifier takes it (`unwind`), else frame pointers."""

    def __init__(self, pid: int, options: RecordOptions, launched: bool = False) -> None:
        self.pid = pid
        self.options = options
        self.multi, self.multi_why = links_choice(self.options)
        self.session, self.session_why = session_choice(self.options)
        self.classic_loaded = False  # alloc_return and `tails` (classic return probes) loaded
        self.fault_prog: Any = None  # residency mode: fault_sample, loaded (a BCC function)
        self.unwind = self.options.unwind  # "fp" when the verifier refused the DWARF unwinder
        self.unwind_error = ""  # why DWARF unwinding fell back to frame pointers, if it did
        t0 = time.perf_counter()
        self.rss_tracepoint = self.options.rss_tracepoint
        if not self.rss_tracepoint:
            try:
                rss_offsets()
            except (OSError, LookupError):
                self.rss_tracepoint = True  # this kernel's BTF does not say where the counter is
        self.timings: dict[str, float] = {"kernel BTF (offsets)": time.perf_counter() - t0}  # name -> s (--verbose)
        t = time.perf_counter()
        bcc = _import_bcc()
        self.timings["import bcc"] = time.perf_counter() - t
        self.bcc = bcc
        self.lib = Libbcc()
        self.bpf_cache = ""  # how the programs were obtained: prebuilt, hit, miss (compiled, cached), off, uncached
        self.prebuilt_why = ""  # why the prebuilt programs (tracer/bpf/prebuilt.py) did not serve, if not
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
        self.sys_tracepoints_kept: list[str] = []  # --inject: the mmap family's tracepoints still attached
        if self.options.inject:  # the mmap family's tracepoints: only for the calls the agent cannot hook
            self.sys_tracepoints_off()

    def _compile(self, launched: bool, unwind: str):
        """The BCC module of probes/allocscope.c for this recording: from the programs built once
        (tracer/bpf/prebuilt.py) when they serve this kernel and these options, else from the
        cache of programs compiled on this box (tracer/bpf/cache.py), else compiled by clang (and
        cached). Either way the maps are created here and the tracepoint programs attached."""
        bcc = self.bcc
        t = time.perf_counter()
        flags, consts = probe_config(self.options, launched, unwind, self.rss_tracepoint, self.pid)
        self.timings["the program's parameters (kernel BTF)"] = time.perf_counter() - t
        t = time.perf_counter()
        if os.environ.get("ALLOCSCOPE_PREBUILT") != "0":
            try:
                pre = prebuilt.find(flags, consts)
                bpf = prebuilt.load(bcc, pre, flags, consts, self.programs_needed(unwind), skip_sys=self.options.inject)
                self.bpf_cache = "prebuilt"
                self.timings["maps + programs + tracepoints (prebuilt, no compile)"] = time.perf_counter() - t
                return bpf
            except prebuilt.NotPrebuilt as e:
                self.prebuilt_why = str(e)
            except Exception as e:  # noqa: BLE001 (a map the kernel refused: compiled as before)
                self.prebuilt_why = f"prebuilt programs not loaded: {e}"
            if self.options.verbose:
                print(f"allocscope: start-up: compiling the probes here: {self.prebuilt_why}", file=sys.stderr)
        else:
            self.prebuilt_why = "ALLOCSCOPE_PREBUILT=0"
        text = bpf_text()

        def cflags(tgid: int) -> list[str]:
            return [
                f"-I{L.PROBES_DIR}",
                f"-DAS_MAX_DEPTH={L.MAX_DEPTH}",
                "-Wno-macro-redefined",
                *flags,
                *const_flags({**consts, "AS_TGID": tgid}),
            ]

        def compile_whole(cache: str, step: str, t: float):
            """The program compiled here, for this pid (no cache entry used); its time under `step`."""
            self.bpf_cache = cache
            with bcclight.light(bcc):
                bpf = bcc.BPF(text=text, cflags=cflags(self.pid))
            fill_sys_tails(bcc, bpf)
            self.timings[step] = time.perf_counter() - t
            return bpf

        t = time.perf_counter()
        if not enabled():
            return compile_whole("off", "compile (BCC, clang)", t)
        key = bpfcache.cache_key(text, cflags(bpfcache.TGID_SENTINEL), _bcc_version(bcc))
        entry = bpfcache.load(key)
        if entry is None:
            entry = self._compile_entry(text, cflags(bpfcache.TGID_SENTINEL))
            self.timings["compile (BCC, clang)"] = time.perf_counter() - t
            t = time.perf_counter()
            if entry is None:
                return compile_whole("uncached", "compile again (not cacheable)", t)
            self.bpf_cache = "miss"
        else:
            self.bpf_cache = "hit"
        try:
            bpf = cached_bpf(
                bcc,
                entry,
                self.pid,
                bpfcache.maps_only(text),
                cflags(self.pid),
                self.programs_needed(unwind),
                skip_sys=self.options.inject,
            )
        except Exception:  # noqa: BLE001 (BCC's bare Exception): compiled as without the cache
            bpf = None
        if bpf is None or not bpfcache.same_tables(bpfcache.table_signature(bpf.module), entry["tables"]):
            if bpf is not None:
                bpf.cleanup()  # the maps-only source declares other maps: never trust the entry
            return compile_whole("uncached", "compile (tables differ from the cache's)", t)
        if self.bpf_cache == "miss":
            bpfcache.save(key, entry)
        self.timings[f"maps + tracepoints (cache {self.bpf_cache})"] = time.perf_counter() - t
        return bpf

    def _compile_entry(self, text: bytes, cflags: list[str]) -> dict | None:
        """Compile with the sentinel pid, without loading anything, and take the cache entry."""
        bcc = self.bcc

        class Compiled(bcc.BPF):  # type: ignore[name-defined]  # BCC's, imported at run time
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

    def programs_needed(self, unwind: str) -> list[tuple]:
        """(program, type) that _load_allocator_programs loads, to verify them in parallel."""
        if self.options.mode == "residency":
            names = [b"fault_sample"] + ([b"fault_unwind", b"fault_keep"] if unwind == "dwarf" else [])
            return [(n, self.bcc.BPF.PERF_EVENT) for n in names]
        if self.session:
            names = [b"heap_session"] + ([b"salloc_unwind", b"salloc_keep"] if unwind == "dwarf" else [])
        else:
            names = [b"alloc_return"] + ([b"alloc_unwind", b"alloc_keep"] if unwind == "dwarf" else [])
            if self.options.inject:
                names += [b"mark_alloc", b"mark_free", b"mark_sys"]
                names += [b"msys_unwind", b"msys_keep"] if unwind == "dwarf" else []
            elif self.multi:
                names += [b"heap_entry"]
        return [(n, self.bcc.BPF.KPROBE, None, self.attach_type(n)) for n in names]

    def attach_type(self, name: bytes) -> int:
        """expected_attach_type of a uprobe program: a program array takes programs of one type,
        so every program a link runs (and every one they tail-call) is loaded as the links'."""
        if name in (b"heap_session", b"salloc_unwind", b"salloc_keep"):
            return TRACE_UPROBE_SESSION
        return TRACE_UPROBE_MULTI if self.multi else -1

    def load(self, name: bytes):
        return self.bpf.load_func(name, self.bcc.BPF.KPROBE, attach_type=self.attach_type(name))

    def _load_allocator_programs(self) -> None:
        """Verify the allocator programs now (the verifier is what may refuse the DWARF unwinder)
        and, with the stack cache, fill the tail-call table alloc_return jumps through on a miss:
        [0] alloc_unwind, [1] alloc_keep. Residency mode attaches no allocator probe; its fault
        program jumps through `ftails` likewise: [0] fault_unwind, [1] fault_keep."""
        if self.options.mode == "residency":
            pe = self.bcc.BPF.PERF_EVENT
            self.fault_prog = self.bpf.load_func(b"fault_sample", pe)
            if self.unwind == "dwarf":
                tails = self.bpf[b"ftails"]
                for i, name in enumerate((b"fault_unwind", b"fault_keep")):
                    tails[ct.c_int(i)] = ct.c_int(self.bpf.load_func(name, pe).fd)
            return
        kprobe = self.bcc.BPF.KPROBE
        self.classic_loaded = False
        if self.session:  # the classic programs wait until a classic return probe needs them
            self.load(b"heap_session")
            if self.unwind == "dwarf":
                tails = self.bpf[b"stails"]
                for i, name in enumerate((b"salloc_unwind", b"salloc_keep")):
                    tails[ct.c_int(i)] = ct.c_int(self.load(name).fd)
            return
        del kprobe
        self.load_classic()

    def load_classic(self) -> None:
        """alloc_return and, with the stack cache, the tail-call table every classic return
        program (alloc_return, cu_return, custom_return) jumps through on a miss."""
        if self.classic_loaded:
            return
        self.load(b"alloc_return")
        if self.unwind == "dwarf":
            tails = self.bpf[b"tails"]
            for i, name in enumerate((b"alloc_unwind", b"alloc_keep")):
                tails[ct.c_int(i)] = ct.c_int(self.load(name).fd)
        self.classic_loaded = True

    def sys_tracepoints_off(self) -> None:
        """Detach the syscall tracepoints of the mmap family not kept (BCC attaches them all when it
        compiles; the cached programs are attached without them under --inject), their closes
        overlapped (each waits for an RCU grace period)."""
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        kept = {tp.encode() for tp in self.sys_tracepoints_kept}
        off = [tp for tp in list(self.bpf.tracepoint_fds) if tp.startswith(b"syscalls:") and tp not in kept]
        if off:
            lib = self.bcc.libbcc.lib
            fds = [self.bpf.tracepoint_fds[tp] for tp in off]
            with ThreadPoolExecutor(max_workers=len(off)) as pool:
                list(pool.map(lib.bpf_close_perf_event_fd, fds))
            for tp in off:
                cat, name = tp.split(b":")
                lib.bpf_detach_tracepoint(cat, name)
                del self.bpf.tracepoint_fds[tp]

    def close(self) -> None:
        """Detach every tracepoint and uprobe perf event and free the maps. Idempotent."""
        bpf, self.bpf = getattr(self, "bpf", None), None
        if bpf is not None:
            detach_all(self.bcc, bpf)
            bpf.cleanup()
