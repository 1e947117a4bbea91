"""Facts about the running kernel the probes need, read from its BTF (/sys/kernel/btf/vmlinux).

BCC compiles the probes against whatever kernel headers the box has (Debian's 6.1 headers under a
6.18 kernel here), so the probes never dereference kernel structs by the headers' layout. Where
they must read one — the target's anonymous RSS counter, mm->rss_stat[MM_ANONPAGES], at the
entry and exit of every release — the offsets come from the running kernel's own BTF, through
libbpf's BTF API (libbpf1, a dependency of BCC), and reach the program as -D flags.

Reading them walks the BTF through a few hundred ctypes calls (the enumerator lookup through every
type): ~30-60 ms alone, several times that while other threads of the tracer import modules (each
call gives the GIL away and waits to get it back). The answers change only with the kernel, so
they are kept per kernel and boot in `$ALLOCSCOPE_CACHE_DIR/kernel/` (`remember`): a warm start
reads one small JSON file and loads no BTF at all.
"""

from __future__ import annotations

import ctypes as ct
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from ..base.cachedir import cache_dir, enabled, read_private, write_private

BTF_KIND_PTR, BTF_KIND_ARRAY, BTF_KIND_STRUCT, BTF_KIND_UNION, BTF_KIND_ENUM = 2, 3, 4, 5, 6
BTF_KIND_TYPEDEF, BTF_KIND_FUNC, BTF_KIND_FUNC_PROTO = 8, 12, 13
VMLINUX = "/sys/kernel/btf/vmlinux"
FACTS_VERSION = 1  # bump when a fact's meaning or shape changes


@dataclass(frozen=True)
class RssOffsets:
    """Byte offsets: task_struct.mm, and the anonymous-pages count inside mm_struct (a
    percpu_counter's global `count` since 6.2, an atomic_long_t before)."""

    task_mm: int
    mm_anon: int

    def cflags(self) -> list[str]:
        return [f"-DAS_OFF_TASK_MM={self.task_mm}", f"-DAS_OFF_MM_ANON={self.mm_anon}"]


class KernelBtf:
    """The few calls of libbpf's BTF API used here; types are read as libbpf lays them out
    (struct btf_type: name_off, info, size/type; then the kind's members)."""

    def __init__(self) -> None:
        lib = ct.CDLL("libbpf.so.1")
        lib.btf__load_vmlinux_btf.restype = ct.c_void_p
        lib.btf__free.argtypes = [ct.c_void_p]
        lib.btf__find_by_name_kind.argtypes = [ct.c_void_p, ct.c_char_p, ct.c_uint32]
        lib.btf__find_by_name_kind.restype = ct.c_int32
        lib.btf__type_by_id.argtypes = [ct.c_void_p, ct.c_uint32]
        lib.btf__type_by_id.restype = ct.c_void_p
        lib.btf__name_by_offset.argtypes = [ct.c_void_p, ct.c_uint32]
        lib.btf__name_by_offset.restype = ct.c_char_p
        lib.btf__resolve_type.argtypes = [ct.c_void_p, ct.c_uint32]
        lib.btf__resolve_type.restype = ct.c_int32
        lib.btf__resolve_size.argtypes = [ct.c_void_p, ct.c_uint32]
        lib.btf__resolve_size.restype = ct.c_int64
        lib.btf__type_cnt.argtypes = [ct.c_void_p]
        lib.btf__type_cnt.restype = ct.c_uint32
        self.lib = lib
        self.btf = lib.btf__load_vmlinux_btf()
        if not self.btf:
            raise OSError("no kernel BTF (/sys/kernel/btf/vmlinux)")

    def close(self) -> None:
        self.lib.btf__free(self.btf)

    def find(self, name: str, kind: int) -> int:
        tid = self.lib.btf__find_by_name_kind(self.btf, name.encode(), kind)
        if tid <= 0:
            raise LookupError(name)
        return tid

    def _type(self, tid: int) -> tuple[int, str, int, int, int, int]:
        p = self.lib.btf__type_by_id(self.btf, tid)
        if not p:
            raise LookupError(f"BTF type {tid}")
        name_off, info, size_or_type = (ct.c_uint32 * 3).from_address(p)
        name = (self.lib.btf__name_by_offset(self.btf, name_off) or b"").decode()
        return p, name, (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size_or_type

    def resolve(self, tid: int) -> int:
        """Through typedefs and qualifiers."""
        return self.lib.btf__resolve_type(self.btf, tid)

    def kind_name(self, tid: int) -> tuple[int, str]:
        _p, name, kind, *_ = self._type(self.resolve(tid))
        return kind, name

    def size(self, tid: int) -> int:
        return self.lib.btf__resolve_size(self.btf, tid)

    def member(self, struct_tid: int, field: str) -> tuple[int, int]:
        """(byte offset, type id) of `field`, looked for through anonymous members too."""
        p, _name, kind, vlen, kflag, _ = self._type(struct_tid)
        if kind not in (BTF_KIND_STRUCT, BTF_KIND_UNION):
            raise LookupError(f"BTF type {struct_tid} is not a struct")
        arr = (ct.c_uint32 * (3 * vlen)).from_address(p + 12)
        for i in range(vlen):
            name_off, ty, off = arr[3 * i : 3 * i + 3]
            bits = off & 0xFFFFFF if kflag else off
            name = (self.lib.btf__name_by_offset(self.btf, name_off) or b"").decode()
            if name == field:
                return bits // 8, ty
            if not name:
                try:
                    inner, ity = self.member(self.resolve(ty), field)
                    return bits // 8 + inner, ity
                except LookupError:
                    continue
        raise LookupError(field)

    def array(self, tid: int) -> tuple[int, int]:
        """(element type id, number of elements) of an array type."""
        p, _name, kind, *_ = self._type(self.resolve(tid))
        if kind != BTF_KIND_ARRAY:
            raise LookupError(f"BTF type {tid} is not an array")
        elem, _index, nelems = (ct.c_uint32 * 3).from_address(p + 12)
        return elem, nelems

    def proto_params(self, typedef: str) -> int:
        """The number of parameters of the function-pointer typedef `typedef` (a raw tracepoint's
        btf_trace_<event>: its first is the context, the rest the tracepoint's arguments)."""
        tid = self.resolve(self.find(typedef, BTF_KIND_TYPEDEF))
        _p, _name, kind, _vlen, _kflag, target = self._type(tid)
        if kind == BTF_KIND_PTR:
            tid = target
        _p, _name, kind, vlen, *_ = self._type(tid)
        if kind != BTF_KIND_FUNC_PROTO:
            raise LookupError(f"{typedef} is not a function pointer")
        return vlen

    def enumerator(self, value_name: str) -> int:
        """The value of an enumerator, whatever (possibly anonymous) enum declares it."""
        want = value_name.encode()
        for tid in range(1, self.lib.btf__type_cnt(self.btf)):
            p, _name, kind, vlen, *_ = self._type(tid)
            if kind != BTF_KIND_ENUM:
                continue
            vals = (ct.c_uint32 * (2 * vlen)).from_address(p + 12)
            for i in range(vlen):
                if self.lib.btf__name_by_offset(self.btf, vals[2 * i]) == want:
                    return ct.c_int32(vals[2 * i + 1]).value
        raise LookupError(value_name)


_shared: KernelBtf | None = None  # the load kept open by one_load(), made at its first use
_sharing = False


@contextmanager
def one_load() -> Iterator[None]:
    """Within it, the lookups below share one load of the kernel's BTF (~11 ms each, ~6 MiB
    while open) instead of loading it each — made only if a lookup is not kept already (a warm
    start loads none); closed at the end."""
    global _shared, _sharing
    if _sharing:
        yield
        return
    _sharing = True
    try:
        yield
    finally:
        _sharing = False
        if _shared is not None:
            _shared.close()
            _shared = None


def _load() -> KernelBtf:
    global _shared
    if not _sharing:
        return KernelBtf()
    if _shared is None:
        _shared = KernelBtf()  # an OSError here: each lookup fails as it would alone
    return _shared


def _done(btf: KernelBtf) -> None:
    if btf is not _shared:
        btf.close()


def kernel_key() -> str | None:
    """This kernel and boot: release, build string, the BTF's size and time, the boot id (a new
    boot reads the facts again). None without BTF (nothing is kept then)."""
    try:
        st = os.stat(VMLINUX)
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    u = os.uname()
    ident = f"{FACTS_VERSION}|{u.release}|{u.version}|{st.st_size}|{st.st_mtime_ns}|{boot}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


_facts: dict[str, Any] | None = None  # the kept facts of this kernel, read once


def remember(name: str, compute):
    """compute() once per kernel and boot, kept on disk with the other facts (JSON values; a
    LookupError, the BTF lacking it, is kept too and raised again)."""
    global _facts
    key = kernel_key() if enabled() else None
    if _facts is None:
        stored = read_private(cache_dir("kernel") / f"{key}.json") if key else None
        _facts = stored if isinstance(stored, dict) else {}
    if name in _facts:
        v = _facts[name]
        if isinstance(v, dict) and "error" in v:
            raise LookupError(v["error"])
        return v
    try:
        v = compute()
    except LookupError as e:  # this kernel's BTF lacks it (an OSError, no BTF read, is not kept)
        if key is not None:
            _facts[name] = {"error": str(e)}
            write_private(cache_dir("kernel"), f"{key}.json", json.dumps(_facts))
        raise
    if key is not None:
        _facts[name] = v
        write_private(cache_dir("kernel"), f"{key}.json", json.dumps(_facts))
    return v


def forget() -> None:
    """Drop what this process keeps of the facts (the file stays): the next lookup reads the
    kept file again, or the BTF (tests, and a process that outlives a kernel's facts file)."""
    global _facts
    _facts = None
    for lookup in (rss_offsets, file_offsets, optimizes_nop5_uprobes, switch_offsets):
        lookup.cache_clear()


@lru_cache(maxsize=1)
def rss_offsets() -> RssOffsets:
    """Where the probes read the current task's anonymous RSS (pages). Raises OSError or
    LookupError when this kernel's BTF does not describe it (the probes then fall back to the
    kmem:rss_stat tracepoint)."""
    return RssOffsets(**remember("rss", lambda: asdict(_read_rss_offsets())))


def _read_rss_offsets() -> RssOffsets:
    btf = _load()
    try:
        task = btf.find("task_struct", BTF_KIND_STRUCT)
        task_mm, _ = btf.member(task, "mm")
        mm = btf.find("mm_struct", BTF_KIND_STRUCT)
        rss_off, rss_ty = btf.member(mm, "rss_stat")
        anon = btf.enumerator("MM_ANONPAGES")
        kind, name = btf.kind_name(rss_ty)
        if kind == BTF_KIND_ARRAY:  # 6.2+: struct percpu_counter rss_stat[NR_MM_COUNTERS]
            elem, n = btf.array(rss_ty)
            if anon >= n:
                raise LookupError("MM_ANONPAGES")
            count_off, _ = btf.member(btf.resolve(elem), "count")
            return RssOffsets(task_mm, rss_off + anon * btf.size(elem) + count_off)
        if kind == BTF_KIND_STRUCT and name == "mm_rss_stat":  # before 6.2: atomic_long_t count[]
            count_off, count_ty = btf.member(btf.resolve(rss_ty), "count")
            elem, _n = btf.array(count_ty)
            return RssOffsets(task_mm, rss_off + count_off + anon * btf.size(elem))
        raise LookupError(f"mm_struct.rss_stat of an unknown type ({name or kind})")
    finally:
        _done(btf)


@dataclass(frozen=True)
class FileOffsets:
    """Byte offsets along task->files->fdt->fd[n]->f_inode->{i_mode, i_rdev, i_sb->s_magic}: what
    the probes read to tell a shared-memory or device mapping from a regular file's."""

    task_files: int
    files_fdt: int
    fdt_fd: int
    fdt_max_fds: int
    file_inode: int
    inode_mode: int
    inode_rdev: int
    inode_sb: int
    sb_magic: int

    def cflags(self) -> list[str]:
        return [
            f"-DAS_OFF_TASK_FILES={self.task_files}",
            f"-DAS_OFF_FILES_FDT={self.files_fdt}",
            f"-DAS_OFF_FDT_FD={self.fdt_fd}",
            f"-DAS_OFF_FDT_MAX_FDS={self.fdt_max_fds}",
            f"-DAS_OFF_FILE_INODE={self.file_inode}",
            f"-DAS_OFF_INODE_MODE={self.inode_mode}",
            f"-DAS_OFF_INODE_RDEV={self.inode_rdev}",
            f"-DAS_OFF_INODE_SB={self.inode_sb}",
            f"-DAS_OFF_SB_MAGIC={self.sb_magic}",
        ]


@lru_cache(maxsize=1)
def file_offsets() -> FileOffsets:
    """Raises OSError or LookupError when the kernel's BTF lacks one (file mappings then stay
    untracked, as before)."""
    return FileOffsets(**remember("files", lambda: asdict(_read_file_offsets())))


def _read_file_offsets() -> FileOffsets:
    btf = _load()
    try:

        def off(struct: str, field: str) -> int:
            return btf.member(btf.find(struct, BTF_KIND_STRUCT), field)[0]

        return FileOffsets(
            off("task_struct", "files"),
            off("files_struct", "fdt"),
            off("fdtable", "fd"),
            off("fdtable", "max_fds"),
            off("file", "f_inode"),
            off("inode", "i_mode"),
            off("inode", "i_rdev"),
            off("inode", "i_sb"),
            off("super_block", "s_magic"),
        )
    finally:
        _done(btf)


def _btf_flags(name: str, flags) -> list[str]:
    """flags(off) with off(struct, field) the byte offset of a kernel struct member from the
    running kernel's BTF (kept as `name`); [] when the BTF or a member is missing."""
    try:
        return list(remember(name, lambda: _read_btf_flags(flags)))
    except (OSError, LookupError):
        return []


def _read_btf_flags(flags) -> list[str]:
    """flags(off) from the BTF; raises OSError or LookupError when it or a member is missing."""
    btf = _load()
    try:

        def off(struct: str, field: str) -> int:
            return btf.member(btf.find(struct, BTF_KIND_STRUCT), field)[0]

        return flags(off)
    finally:
        _done(btf)


def return_probe_offsets() -> list[str]:
    """-D flags for reading a pending return probe's real return address (probes/unwind_dwarf.h
    real_return): task_struct.utask, uprobe_task.return_instances, return_instance.{stack,
    orig_ret_vaddr, next}. [] when the BTF lacks one (the trampoline then stays a frame)."""
    return _btf_flags(
        "return_probe",
        lambda off: [
            f"-DAS_OFF_TASK_UTASK={off('task_struct', 'utask')}",
            f"-DAS_OFF_UTASK_RI={off('uprobe_task', 'return_instances')}",
            f"-DAS_OFF_RI_STACK={off('return_instance', 'stack')}",
            f"-DAS_OFF_RI_ORIG={off('return_instance', 'orig_ret_vaddr')}",
            f"-DAS_OFF_RI_NEXT={off('return_instance', 'next')}",
        ],
    )


def fsbase_offset() -> list[str]:
    """-D flag for reading a task's thread pointer (task_struct.thread.fsbase; probes/regions.h
    agent_api, --inject). [] when the BTF lacks it (injected hooks then do not mark their mmaps)."""
    return _btf_flags(
        "fsbase", lambda off: [f"-DAS_OFF_TASK_FSBASE={off('task_struct', 'thread') + off('thread_struct', 'fsbase')}"]
    )


@lru_cache(maxsize=1)
def optimizes_nop5_uprobes() -> bool:
    """True when a uprobe on a 5-byte nop becomes a call, not a breakpoint trap: x86-64 kernels
    since 6.18 rewrite the nop into a call to a trampoline that makes the uprobe system call
    (arch_uprobe_optimize); a hit costs 35–55 % less (bench/marker_trap.py). --inject's markers
    start with one (tracer/inject/agent.py marker_offset). ALLOCSCOPE_UPROBE_NOP5=0 turns it off
    (the markers' probes then sit on their push %rbp, as on older kernels)."""
    if os.environ.get("ALLOCSCOPE_UPROBE_NOP5") == "0":
        return False
    try:
        return bool(remember("nop5", _read_nop5))
    except OSError:
        return False


def _read_nop5() -> bool:
    btf = _load()
    try:
        btf.find("arch_uprobe_optimize", BTF_KIND_FUNC)
        return True
    except LookupError:
        return False
    finally:
        _done(btf)


@lru_cache(maxsize=1)
def switch_offsets() -> tuple[str, ...]:
    """-D flags for the raw sched_switch program (probes/waits.bpf.c): task_struct.pid and .tgid
    (the incoming task is looked at only when it is the target's), and where the outgoing task's
    state is: the raw tracepoint's fourth argument (bool preempt, prev, next, unsigned int
    prev_state; 5.18+), else task_struct.__state (AS_OFF_TASK_STATE). () when the BTF lacks one:
    the classic sched:sched_switch tracepoint serves instead."""
    try:
        return tuple(remember("switch", _read_switch_offsets))
    except OSError:
        return ()


def _read_switch_offsets() -> list[str]:
    btf = _load()
    try:
        task = btf.find("task_struct", BTF_KIND_STRUCT)
        flags = [f"-DAS_OFF_TASK_PID={btf.member(task, 'pid')[0]}", f"-DAS_OFF_TASK_TGID={btf.member(task, 'tgid')[0]}"]
        try:
            if btf.proto_params("btf_trace_sched_switch") >= 5:
                return [*flags, "-DAS_SWITCH_STATE_ARG=1"]
        except LookupError:
            pass
        for field in ("__state", "state"):
            try:
                return [*flags, f"-DAS_OFF_TASK_STATE={btf.member(task, field)[0]}"]
            except LookupError:
                continue
        return []
    except LookupError:
        return []
    finally:
        _done(btf)


def char_major(name: str, devices: str = "/proc/devices") -> int:
    """The major number of a character device driver by name (/proc/devices), 0 when absent:
    nvidia-uvm's is dynamic."""
    try:
        with open(devices) as f:
            in_char = False
            for line in f:
                if line.startswith("Character devices"):
                    in_char = True
                elif line.startswith("Block devices"):
                    in_char = False
                elif in_char:
                    parts = line.split()
                    if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
                        return int(parts[0])
    except OSError:
        pass
    return 0
