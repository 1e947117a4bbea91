"""--inject's agent (tracer/inject/agent/agent.c): its file, built and read, and the layout the
tracer and the agent share (struct as_config, agent.h: a ctypes mirror)."""

from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass
from pathlib import Path

from common.errors import AllocscopeError
from common.pages import PAGE, page_up

from ..base.cachedir import cache_dir
from ..base.cc import CompileError, compile_c

AGENT_DIR = Path(__file__).resolve().parent / "agent"
AGENT_SOURCES = (AGENT_DIR / "agent.c", AGENT_DIR / "agent.h")
AGENT_NAME = "allocscope-agent.so"
# The markers the hooks call on a sampled call (agent.c "Markers"): their code, nopl 0(%rax,%rax,1);
# push %rbp; pop %rbp; ret. The probe sits on the nop (offset 0) or on the push.
MARKERS = ("as_mark_alloc", "as_mark_free", "as_mark_sys")
MARKER_CODE = bytes.fromhex("0f1f440000555dc3")
MARKER_PUSH_AT = 5
# How agent.c's code is compiled (bench/agent_free.py compiles it into its harness with these).
AGENT_CODE_CFLAGS = [
    "-O2",
    "-fPIC",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-omit-frame-pointer",
    "-fcf-protection=none",
    "-fvisibility=hidden",
    "-mgeneral-regs-only",
    "-mcx16",
    "-fasynchronous-unwind-tables",
    "-fno-jump-tables",
    "-Wall",
    "-Wextra",
    "-Werror",
]
AGENT_CFLAGS = [
    *AGENT_CODE_CFLAGS,
    "-shared",
    "-nostdlib",
    "-Wl,-z,norelro",
    "-Wl,-z,noexecstack",
    "-Wl,--build-id=none",
    "-Wl,-z,max-page-size=4096",
]
# The hook of each kind of entry point, by its BPF entry program (tracer/allocators/discovery.py).
HOOKS = {
    "malloc_enter": "as_h_malloc",
    "valloc_enter": "as_h_malloc",
    "pvalloc_enter": "as_h_malloc",
    "calloc_enter": "as_h_calloc",
    "realloc_enter": "as_h_realloc",
    "reallocarray_enter": "as_h_reallocarray",
    "posix_memalign_enter": "as_h_posix_memalign",
    "aligned_alloc_enter": "as_h_aligned",
    "memalign_enter": "as_h_aligned",
    "free_enter": "as_h_free",
}
# Entry points that may throw (operator new): an exception cannot unwind through a hook the C++
# runtime has no unwind tables for, so these stay unhooked (their calls are not sampled).
THROWING = {"tc_new", "tc_newarray", "mi_new"}
# The mmap family (agent.c "the mmap family"): the names each call goes by, its system call number.
# sbrk is glibc's __sbrk, which calls brk (__brk) for its every change of the break: hooked there.
SYS_FAMILY = {
    "mmap": (("mmap", "mmap64", "__mmap", "__mmap64"), 9),
    "munmap": (("munmap", "__munmap"), 11),
    "mremap": (("mremap", "__mremap"), 25),
    "madvise": (("madvise", "__madvise"), 28),
    "brk": (("brk", "__brk"), 12),
}
SYS_KINDS = list(SYS_FAMILY)  # enum as_sys_kind's order
SYS_DEFS = 4  # definitions of one call hooked at most (AS_SYS_DEFS)

AS_MAGIC, AS_VERSION, AS_MAX_HOOKS = 0x31746E6567617361, 6, 96
STATE_LOADING, STATE_HOOKED, STATE_DETACHING, STATE_UNHOOKED = 0, 1, 2, 3
WD_NONE, WD_RUNNING, WD_EXITED = 0, 1, 2
THREAD_BITS, SET_BITS = 14, 17  # 16384 threads (1 MiB), 131072 buckets of 8 (8 MiB + 128 KiB)
THREAD_SLOT = 64  # struct as_thread
FILTER_BITS = 14  # 16 KiB of page counts in front of the set's (agent.c "the filter")
# the tables: thread states | set | its counts | the filter (then the watchdog's stack)
TABLES_BYTES = (THREAD_SLOT << THREAD_BITS) + (64 << SET_BITS) + (1 << SET_BITS) + (1 << FILTER_BITS)
WATCHDOG_POLL_MS = 100
WATCHDOG_STACK = 64 << 10
# the tables mapping: the tables, the watchdog's stack, then the fork guard's page (agent.c ours())
GUARD_OFFSET = page_up(TABLES_BYTES) + WATCHDOG_STACK
TABLES_SPAN = GUARD_OFFSET + PAGE

SYS = {
    "mmap": 9,
    "mprotect": 10,
    "madvise": 28,
    "munmap": 11,
    "rt_sigprocmask": 14,
    "close": 3,
    "openat": 257,
    "pidfd_open": 434,
}
PROT_R, PROT_W, PROT_X = 1, 2, 4
MAP_PRIVATE, MAP_FIXED, MAP_ANON, MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x02, 0x10, 0x20, 0x4000, 0x100000
MADV_WIPEONFORK = 18  # the fork guard's page (agent.c ours())
CLONE_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000  # VM FS FILES SIGHAND THREAD SYSVSEM


class InjectError(AllocscopeError):
    """--inject cannot be used on this process (one line: why); nothing was left in it."""


u64, u32, s32 = ct.c_uint64, ct.c_uint32, ct.c_int32


class AsRestore(ct.Structure):
    _fields_ = [
        ("word_addr", u64),
        ("orig_word", u64),
        ("patched_word", u64),
        ("orig_hi", u64),
        ("patched_hi", u64),
        ("page", u64),
        ("page_len", u64),
        ("prot", u32),
        ("wide", u32),
        ("done", u32),
        ("pad", u32),
    ]


class AsConfig(ct.Structure):
    """struct as_config (tracer/inject/agent/agent.h)"""

    _fields_ = [
        ("magic", u64),
        ("version", u32),
        ("size", u32),
        ("enabled", u32),
        ("state", u32),
        ("watchdog", u32),
        ("pid", u32),
        ("pidfd", s32),
        ("poll_ms", u32),
        ("sample_bytes", u64),
        ("threads", u64),
        ("set", u64),
        ("spill", u64),
        ("thread_bits", u32),
        ("set_bits", u32),
        ("nhooks", u32),
        ("filter_bits", u32),
        ("filter", u64),
        ("hooks", AsRestore * AS_MAX_HOOKS),
        ("sampled", u64),
        ("freed", u64),
        ("set_full", u64),
        ("thread_overflow", u64),
        ("foreign", u64),
        ("sys_orig", (u64 * SYS_DEFS) * len(SYS_KINDS)),
        ("sys_marks", u64),
        ("guard", u64),
    ]


# --- the agent's file ------------------------------------------------------------------------


def build_agent(out: Path, cc: str | None = None) -> Path:
    """Compile tracer/inject/agent/agent.c into `out` (freestanding: no libc, no relocations)."""
    try:
        return compile_c(AGENT_SOURCES[0], out, AGENT_CFLAGS, cc)
    except CompileError as e:
        if str(e) == "no C compiler":
            raise InjectError("--inject needs the agent built (make setup) or a C compiler to build it") from None
        raise InjectError(f"building the agent failed: {e}") from None


def agent_path() -> str:
    """The agent's file: tracer/inject/agent/allocscope-agent.so (built by `make setup`), rebuilt when
    its sources are newer and the directory is writable, else one in the cache directory."""
    newest = max(p.stat().st_mtime for p in AGENT_SOURCES)
    here = AGENT_DIR / AGENT_NAME
    if here.exists() and here.stat().st_mtime >= newest:
        return str(here)
    if os.access(AGENT_DIR, os.W_OK):
        return str(build_agent(here))

    cached = cache_dir("bpf") / AGENT_NAME
    if cached.exists() and cached.stat().st_mtime >= newest:
        return str(cached)
    return str(build_agent(cached))


@dataclass
class AgentImage:
    path: str
    loads: list[tuple[int, int, int, int, int]]  # (vaddr, memsz, filesz, offset, prot)
    symbols: dict[str, tuple[int, int]]  # name -> (vaddr, size)

    @property
    def span(self) -> int:
        return page_up(max(v + m for v, m, _f, _o, _p in self.loads))

    def marker_offset(self, name: str, nop5: bool) -> int:
        """Where a marker's uprobe goes in the file: on its 5-byte nop where the kernel optimizes
        such a probe (kernel_btf.optimizes_nop5_uprobes), else on its push %rbp (agent.c "Markers")."""
        return self.file_offset(name) + (0 if nop5 else MARKER_PUSH_AT)

    def file_offset(self, name: str) -> int:
        va = self.symbols[name][0]
        for v, _m, f, off, _p in self.loads:
            if v <= va < v + f:
                return va - v + off
        raise KeyError(name)


def read_agent(path: str) -> AgentImage:
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415
    from elftools.elf.sections import SymbolTableSection  # noqa: PLC0415

    with open(path, "rb") as f:
        elf = ELFFile(f)
        loads = []
        for seg in elf.iter_segments():
            if seg["p_type"] != "PT_LOAD":
                continue
            fl = seg["p_flags"]
            prot = (PROT_R if fl & 4 else 0) | (PROT_W if fl & 2 else 0) | (PROT_X if fl & 1 else 0)
            if seg["p_memsz"] != seg["p_filesz"]:
                raise InjectError(f"{path}: a segment with .bss (the loader maps file bytes only)")
            loads.append((seg["p_vaddr"], seg["p_memsz"], seg["p_filesz"], seg["p_offset"], prot))
        symtab = elf.get_section_by_name(".symtab")
        if not isinstance(symtab, SymbolTableSection) or not loads:
            raise InjectError(f"{path}: not the allocscope agent (no symbols)")
        symbols = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols() if s.name}
    need = {
        "as_cfg",
        *MARKERS,
        "as_clone_entry",
        *HOOKS.values(),
        *(f"as_hs_{k}_{i}" for k in SYS_KINDS for i in range(SYS_DEFS)),
    }
    if not need <= symbols.keys():
        raise InjectError(f"{path}: not the allocscope agent (missing {sorted(need - symbols.keys())[0]})")
    img = AgentImage(path, loads, symbols)
    with open(path, "rb") as f:
        for name in MARKERS:
            f.seek(img.file_offset(name))
            if f.read(len(MARKER_CODE)) != MARKER_CODE:
                raise InjectError(f"{path}: agent of another version ({name} is not nop5; push %rbp; pop %rbp; ret)")
    if symbols["as_cfg"][1] != ct.sizeof(AsConfig):
        raise InjectError(
            f"{path}: agent of another version (as_cfg is {symbols['as_cfg'][1]} bytes, expected {ct.sizeof(AsConfig)})"
        )
    return img
