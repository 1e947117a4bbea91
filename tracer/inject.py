"""--inject: allocscope's sampler inside the target, so that only sampled allocator calls trap.

What it does to the process (README "--inject"): every thread is stopped with ptrace for a few
milliseconds; one of them runs system calls on our behalf (mmap of the agent's file, its tables,
a stub page near each allocator module, pidfd_open of the tracer, clone of the watchdog thread);
each allocator entry point found (tracer/allocators.py) gets a 5-byte jump to a stub that enters
the agent's hook (tracer/patching.py: only when the displaced instructions are provably movable
and no thread is inside them); the threads go on. Only sampled calls reach the markers, whose
uprobes feed the usual BPF path (stacks, sites, threads, the trace).

Taking it back (`Injection.detach`): the threads are stopped again, every entry's bytes are
written back as they were, the watchdog is told to exit. If the tracer dies instead, the
watchdog (polling the tracer's pidfd) puts the entry words back itself. The agent's pages stay
mapped, inert: a thread may still be returning through a hook or a trampoline.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import AllocscopeError

from . import patching, procfs
from .agentrss import tables_resident
from .cbuild import CompileError, compile_c
from .patching import PatchRefused
from .ptrace import Memory, PtraceError, Stopped
from .purgeprobes import NOT_HOOKED

AGENT_DIR = Path(__file__).resolve().parent / "agent"
AGENT_SOURCES = (AGENT_DIR / "agent.c", AGENT_DIR / "agent.h")
AGENT_NAME = "allocscope-agent.so"
AGENT_CFLAGS = ["-O2", "-fPIC", "-shared", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-stack-protector",
                "-fno-omit-frame-pointer", "-fcf-protection=none", "-fvisibility=hidden", "-mgeneral-regs-only",
                "-mcx16", "-fasynchronous-unwind-tables", "-fno-jump-tables", "-Wall", "-Wextra", "-Werror",
                "-Wl,-z,norelro", "-Wl,-z,noexecstack", "-Wl,--build-id=none", "-Wl,-z,max-page-size=4096"]

# The hook of each kind of entry point, by its BPF entry program (tracer/allocators.py).
HOOKS = {"malloc_enter": "as_h_malloc", "valloc_enter": "as_h_malloc", "pvalloc_enter": "as_h_malloc",
         "calloc_enter": "as_h_calloc", "realloc_enter": "as_h_realloc",
         "reallocarray_enter": "as_h_reallocarray", "posix_memalign_enter": "as_h_posix_memalign",
         "aligned_alloc_enter": "as_h_aligned", "memalign_enter": "as_h_aligned", "free_enter": "as_h_free"}
# Entry points that may throw (operator new): an exception cannot unwind through a hook the C++
# runtime has no unwind tables for, so these stay unhooked (their calls are not sampled).
THROWING = {"tc_new", "tc_newarray", "mi_new"}
# The mmap family (agent.c "the mmap family"): the names each call goes by, its system call number.
# sbrk is glibc's __sbrk, which calls brk (__brk) for its every change of the break: hooked there.
SYS_FAMILY = {"mmap": (("mmap", "mmap64", "__mmap", "__mmap64"), 9), "munmap": (("munmap", "__munmap"), 11),
              "mremap": (("mremap", "__mremap"), 25), "madvise": (("madvise", "__madvise"), 28),
              "brk": (("brk", "__brk"), 12)}
SYS_KINDS = list(SYS_FAMILY)        # enum as_sys_kind's order
SYS_DEFS = 4                        # definitions of one call hooked at most (AS_SYS_DEFS)

AS_MAGIC, AS_VERSION, AS_MAX_HOOKS = 0x31746E6567617361, 5, 96
STATE_LOADING, STATE_HOOKED, STATE_DETACHING, STATE_UNHOOKED = 0, 1, 2, 3
WD_NONE, WD_RUNNING, WD_EXITED = 0, 1, 2
THREAD_BITS, SET_BITS = 14, 17      # 16384 threads (1 MiB), 131072 buckets of 8 (8 MiB + 128 KiB)
THREAD_SLOT = 64                    # struct as_thread
FILTER_BITS = 14                    # 16 KiB of page counts in front of the set's (agent.c "the filter")
# the tables: thread states | set | its counts | the filter (then the watchdog's stack)
TABLES_BYTES = (THREAD_SLOT << THREAD_BITS) + (64 << SET_BITS) + (1 << SET_BITS) + (1 << FILTER_BITS)
WATCHDOG_POLL_MS = 100
WATCHDOG_STACK = 64 << 10

SYS = {"mmap": 9, "mprotect": 10, "munmap": 11, "rt_sigprocmask": 14, "close": 3, "openat": 257,
       "pidfd_open": 434}
PROT_R, PROT_W, PROT_X = 1, 2, 4
MAP_PRIVATE, MAP_FIXED, MAP_ANON, MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x02, 0x10, 0x20, 0x4000, 0x100000
CLONE_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000  # VM FS FILES SIGHAND THREAD SYSVSEM
PAGE = 4096


class InjectError(AllocscopeError):
    """--inject cannot be used on this process (one line: why); nothing was left in it."""


u64, u32, s32 = ct.c_uint64, ct.c_uint32, ct.c_int32


class AsRestore(ct.Structure):
    _fields_ = [("word_addr", u64), ("orig_word", u64), ("patched_word", u64), ("orig_hi", u64),
                ("patched_hi", u64), ("page", u64), ("page_len", u64), ("prot", u32), ("wide", u32),
                ("done", u32), ("pad", u32)]


class AsConfig(ct.Structure):
    """struct as_config (tracer/agent/agent.h)"""
    _fields_ = [("magic", u64), ("version", u32), ("size", u32), ("enabled", u32), ("state", u32),
                ("watchdog", u32), ("pid", u32), ("pidfd", s32), ("poll_ms", u32), ("sample_bytes", u64),
                ("threads", u64), ("set", u64), ("spill", u64), ("thread_bits", u32), ("set_bits", u32),
                ("nhooks", u32), ("filter_bits", u32), ("filter", u64), ("hooks", AsRestore * AS_MAX_HOOKS),
                ("sampled", u64),
                ("freed", u64), ("set_full", u64), ("thread_overflow", u64), ("foreign", u64),
                ("sys_orig", (u64 * SYS_DEFS) * len(SYS_KINDS)), ("sys_marks", u64)]


def _page_down(x: int) -> int:
    return x & ~(PAGE - 1)


def _page_up(x: int) -> int:
    return (x + PAGE - 1) & ~(PAGE - 1)


# --- the agent's file ------------------------------------------------------------------------

def build_agent(out: Path, cc: str | None = None) -> Path:
    """Compile tracer/agent/agent.c into `out` (freestanding: no libc, no relocations)."""
    try:
        return compile_c(AGENT_SOURCES[0], out, AGENT_CFLAGS, cc)
    except CompileError as e:
        if str(e) == "no C compiler":
            raise InjectError("--inject needs the agent built (make setup) or a C compiler to build it") from None
        raise InjectError(f"building the agent failed: {e}") from None


def agent_path() -> str:
    """The agent's file: tracer/agent/allocscope-agent.so (built by `make setup`), rebuilt when
    its sources are newer and the directory is writable, else one in the cache directory."""
    newest = max(p.stat().st_mtime for p in AGENT_SOURCES)
    here = AGENT_DIR / AGENT_NAME
    if here.exists() and here.stat().st_mtime >= newest:
        return str(here)
    if os.access(AGENT_DIR, os.W_OK):
        return str(build_agent(here))
    from .bpfcache import cache_dir  # noqa: PLC0415

    cached = Path(cache_dir()) / AGENT_NAME
    if cached.exists() and cached.stat().st_mtime >= newest:
        return str(cached)
    return str(build_agent(cached))


@dataclass
class AgentImage:
    path: str
    loads: list[tuple[int, int, int, int, int]]  # (vaddr, memsz, filesz, offset, prot)
    symbols: dict[str, tuple[int, int]]           # name -> (vaddr, size)

    @property
    def span(self) -> int:
        return _page_up(max(v + m for v, m, _f, _o, _p in self.loads))

    def file_offset(self, name: str) -> int:
        va = self.symbols[name][0]
        for v, _m, f, off, _p in self.loads:
            if v <= va < v + f:
                return va - v + off
        raise KeyError(name)


def read_agent(path: str) -> AgentImage:
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415

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
        if symtab is None or not loads:
            raise InjectError(f"{path}: not the allocscope agent (no symbols)")
        symbols = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols() if s.name}
    need = {"as_cfg", "as_mark_alloc", "as_mark_free", "as_mark_sys", "as_clone_entry", *HOOKS.values(),
            *(f"as_hs_{k}_{i}" for k in SYS_KINDS for i in range(SYS_DEFS))}
    if not need <= symbols.keys():
        raise InjectError(f"{path}: not the allocscope agent (missing {sorted(need - symbols.keys())[0]})")
    if symbols["as_cfg"][1] != ct.sizeof(AsConfig):
        raise InjectError(f"{path}: agent of another version (as_cfg is {symbols['as_cfg'][1]} bytes, "
                          f"expected {ct.sizeof(AsConfig)})")
    return AgentImage(path, loads, symbols)


# --- what to hook ------------------------------------------------------------------------------

@dataclass
class HookSpec:
    """One allocator entry point to hook (from the allocator plans)."""
    symbol: str
    path: str
    offset: int       # file offset of the function
    size: int         # st_size (0: unknown)
    program: str      # its BPF entry program: the hook's kind (the mmap family: sys:KIND:DEFINITION)
    cookie: int       # enum as_api | source << 16
    source: str

    @property
    def sys_kind(self) -> str:
        """mmap, munmap, mremap, madvise, brk: a hook of the mmap family ('' for an allocator's)."""
        return self.program.split(":")[1] if self.program.startswith("sys:") else ""

    @property
    def hook_symbol(self) -> str:
        if self.sys_kind:
            return f"as_hs_{self.sys_kind}_{self.program.split(':')[2]}"
        return HOOKS[self.program]


def hook_specs(plans: list, cookies: dict[tuple[str, str], int]) -> tuple[list[HookSpec], dict[str, str]]:
    """The entry points of `plans` to hook, and {symbol: why not} for the others. `cookies`:
    (module, symbol) -> cookie."""
    specs, skipped = [], {}
    for pl in plans:
        a = pl.allocator
        for pr in pl.probes:
            sym = pr.symbol
            base = sym[len(a.prefix):] if a.prefix and sym.startswith(a.prefix) else sym
            if pr.program not in HOOKS:
                skipped[sym] = NOT_HOOKED  # tracer/purgeprobes.py: probed as without --inject
            elif base in THROWING:
                skipped[sym] = "may throw (operator new): exceptions cannot unwind through a hook"
            else:
                specs.append(HookSpec(sym, a.path, a.offsets[sym], a.sizes.get(sym, 0), pr.program,
                                      cookies[(a.path, sym)], a.source))
    return specs, skipped


def sys_specs(maps: list[procfs.Mapping], exe: str, paths: list[str]) -> tuple[list[HookSpec], dict[str, str]]:
    """The mmap family's entry points to hook: their definitions in libc, in the executable (a
    static libc) and in `paths` (the allocators' modules: one that brings its own mmap, as
    gperftools' tcmalloc does), one spec per (module, address); and {name: why not} for a call
    with more definitions than the agent has hooks for (it keeps its tracepoint)."""
    from .allocators import code_files, file_id, module_symbols  # noqa: PLC0415

    exe_id = file_id(exe) if exe else None
    want = {file_id(p) for p in paths} - {None}
    mods = [p for p in code_files(maps)
            if os.path.basename(p).startswith(("libc.so", "libc-")) or file_id(p) == exe_id or file_id(p) in want]
    specs: list[HookSpec] = []
    skipped: dict[str, str] = {}
    for kind, (names, _nr) in SYS_FAMILY.items():
        defs: list[tuple[str, str, int, int]] = []
        for path in mods:
            syms = module_symbols(path)
            if syms is None:
                continue
            seen: set[int] = set()
            for n in names:
                if n in syms.functions and syms.functions[n][0] not in seen:
                    seen.add(syms.functions[n][0])
                    defs.append((n, path, *syms.functions[n]))
        if len(defs) > SYS_DEFS:
            skipped[kind] = f"{len(defs)} definitions (the agent hooks {SYS_DEFS}): keeps its tracepoint"
            continue
        for i, (n, path, off, size) in enumerate(defs):
            specs.append(HookSpec(n, path, off, size, f"sys:{kind}:{i}", 0, "mmap"))
    return specs, skipped


def sys_all_or_nothing(hooks: list, refused: dict[str, str], specs: list[HookSpec]) -> list:
    """A call of the mmap family is hooked in every definition found or in none (then it keeps
    its tracepoint, and no call of it is counted twice): `hooks` without the kinds that lost one,
    each said in `refused`."""
    lost = {sp.sys_kind for sp in specs if sp.sys_kind and sp.symbol in refused}
    for sp in specs:
        if sp.sys_kind in lost and sp.symbol not in refused:
            refused[sp.symbol] = f"another definition of {sp.sys_kind} cannot be hooked: keeps its tracepoint"
    return [h for h in hooks if h.spec.sys_kind not in lost]


@dataclass
class Hook:
    spec: HookSpec
    addr: int              # the function's address in the target
    length: int            # displaced bytes
    orig: bytes            # the first 16 bytes as they were
    jump: bytes            # the 5 bytes written
    word: int = 0          # aligned restore word
    wide: bool = False
    slot: int = 0
    tramp: int = 0         # the trampoline: the real function for the hook


def _runtime_address(maps: list[procfs.Mapping], path: str, offset: int) -> tuple[int, procfs.Mapping] | None:
    from .allocators import file_id  # noqa: PLC0415

    fid = file_id(path)
    for m in maps:
        if m.is_file and "x" in m.perms and m.offset <= offset < m.offset + (m.end - m.start) and \
                (m.path == path or (fid is not None and file_id(m.path) == fid)):
            return m.start + offset - m.offset, m
    return None


def _file_bytes(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def plan_hooks(mem: Memory, maps: list[procfs.Mapping], specs: list[HookSpec]) -> tuple[list[Hook], dict[str, str]]:
    """Each entry point proved patchable, on the bytes in the process (which must still be the
    file's: a difference is another tool's breakpoint or patch), and {symbol: why not}."""
    hooks, refused = [], {}
    seen: set[int] = set()
    for sp in specs:
        at = _runtime_address(maps, sp.path, sp.offset)
        if at is None:
            refused[sp.symbol] = "its module is not mapped executable"
            continue
        addr, _m = at
        if addr in seen:
            continue
        try:
            live = mem.read(addr, 16)
            if live != _file_bytes(sp.path, sp.offset, 16):
                raise PatchRefused("its bytes differ from the file's (another tool's breakpoint or patch)")
            fsize = sp.size if 0 < sp.size <= 1 << 16 else 0
            body = _file_bytes(sp.path, sp.offset, fsize) if fsize else None
            d = patching.displaced(live, addr, fsize, body)
            word, wide = patching.restore_words(addr, live)
        except (PatchRefused, OSError) as e:
            refused[sp.symbol] = str(e)
            continue
        seen.add(addr)
        hooks.append(Hook(sp, addr, d.length, live, b"", word, wide))
    return hooks, refused


# --- injection ---------------------------------------------------------------------------------

def ptrace_blocker(pid: int) -> str:
    """Why ptrace cannot attach to `pid` ('' when it can, as far as can be told without trying)."""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = "0"
    if scope == "3":
        return "kernel.yama.ptrace_scope is 3: no process may be ptrace-attached"
    tracer = _status(pid).get("TracerPid", "0")
    if tracer not in ("0", ""):
        return f"already traced by pid {tracer} (a debugger or another --inject)"
    return ""


def can_inject(pid: int, exe: str) -> tuple[bool, list[str]]:
    """`doctor --pid`: whether --inject can work in `pid`, and the lines saying why (each entry
    point the hooks would take, or why not) — read only, nothing enters the process."""
    from .allocators import find_allocators, plan_allocator  # noqa: PLC0415

    lines: list[str] = []
    why = ptrace_blocker(pid)
    if why:
        return False, [why]
    seccomp = _status(pid).get("Seccomp", "0")
    if seccomp == "2":
        lines.append("the process runs under a seccomp filter: if it forbids mmap, pidfd_open or clone, "
                     "--inject stops with the call refused (nothing left in the process)")
    try:
        read_agent(agent_path())
    except InjectError as e:
        return False, [str(e)]
    maps = procfs.read_maps(pid)
    plans = [plan_allocator(a) for a in find_allocators(exe, maps)]
    specs, skipped = hook_specs(plans, {(pl.allocator.path, pr.symbol): 0 for pl in plans for pr in pl.probes})
    try:
        mem = Memory(pid, write=False)
    except OSError as e:
        return False, [f"cannot read /proc/{pid}/mem: {e.strerror}"]
    sspecs, sskipped = sys_specs(maps, exe, [pl.allocator.path for pl in plans])
    try:
        hooks, refused = plan_hooks(mem, maps, specs)
        shooks, srefused = plan_hooks(mem, maps, sspecs)
    finally:
        mem.close()
    shooks = sys_all_or_nothing(shooks, srefused, sspecs)
    refused.update(skipped)
    by_module: dict[str, list[str]] = {}
    for h in hooks:
        by_module.setdefault(os.path.basename(h.spec.path), []).append(h.spec.symbol)
    for mod, syms in by_module.items():
        lines.append(f"hooks in {mod}: {', '.join(syms)}")
    for sym, reason in refused.items():
        lines.append(f"not hooked: {sym} ({reason})")
    lines += sys_lines(shooks, {**srefused, **sskipped})
    names = {h.spec.symbol for h in hooks}
    ok = bool(hooks) and (any(n in names for n in ("malloc", "free")) or not plans or plans[0].allocator.prefix != "")
    if not ok:
        lines.insert(0, "malloc/free cannot be hooked safely here")
    return ok, lines


def sys_lines(hooks: list[Hook], refused: dict[str, str]) -> list[str]:
    """What `doctor --pid` says of the mmap family under --inject: where each call is hooked, and
    which keep their syscall tracepoints (and so the tax on every system call of the machine)."""
    by_kind: dict[str, list[str]] = {}
    for h in hooks:
        by_kind.setdefault(h.spec.sys_kind, []).append(f"{h.spec.symbol}@{os.path.basename(h.spec.path)}")
    lines = ["mmap family hooked: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in by_kind.items())] if by_kind else []
    kept = [k for k in SYS_KINDS if k not in by_kind]
    for sym, reason in refused.items():
        lines.append(f"mmap family not hooked: {sym} ({reason})")
    if kept:
        lines.append("keep their syscall tracepoints under --inject (every system call on the machine pays "
                     f"its slow path while recording): {', '.join(kept)}")
    else:
        lines.append("no syscall tracepoint under --inject; not seen then: system calls made without these "
                     "functions (ld.so mapping libraries, syscall(2), inline system calls)")
    return lines


def _status(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def _find_syscall_insn(mem: Memory, maps: list[procfs.Mapping]) -> int:
    """An address holding `syscall` (0f 05) in the process' code: libc's first."""
    cands = [m for m in maps if m.is_file and "x" in m.perms]
    cands.sort(key=lambda m: "libc" not in os.path.basename(m.path))
    for m in cands[:8]:
        try:
            data = mem.read(m.start, min(m.end - m.start, 4 << 20))
        except OSError:
            continue
        i = data.find(b"\x0f\x05")
        if i >= 0:
            return m.start + i
    raise InjectError("no syscall instruction found in the process' code")


def near_gap(maps: list[procfs.Mapping], lo: int, hi: int, size: int, taken: list[tuple[int, int]]) -> int:
    """A free, page-aligned address range of `size` within 1 GiB of [lo, hi): below the module
    first (above an executable lies its brk heap's room to grow)."""
    spans = sorted([(m.start, m.end) for m in maps] + taken)
    reach = 1 << 30
    below, above = [], []
    prev_end = 0x10000
    for s, e in spans + [(0x7FFFFFFFF000, 0x7FFFFFFFF000)]:
        if s - prev_end >= size + 2 * PAGE:
            g0, g1 = prev_end + PAGE, s - PAGE
            if g1 <= lo:
                cand = _page_down(g1 - size)
                if lo - cand < reach and cand >= g0:
                    below.append(cand)
            elif g0 >= hi:
                cand = g0 + (1 << 28 if g0 - hi < (1 << 28) else 0)  # leave a brk heap room
                if cand + size <= g1 and cand + size - lo < reach:
                    above.append(cand)
        prev_end = max(prev_end, e)
    if below:
        return max(below)
    if above:
        return min(above)
    raise InjectError("no free address range within reach of the allocator's code for the hook stubs")


@dataclass
class Injection:
    """The agent in one process: hooks placed (`load`), sampling switched on (`enable`), and
    everything taken back (`detach`)."""
    pid: int
    sample_bytes: int
    agent: AgentImage
    hooks: list[Hook] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    base: int = 0
    tables: int = 0
    pidfd: int = -1
    watchdog_tid: int = 0
    syscall_insn: int = 0
    stopped_ms: list[float] = field(default_factory=list)
    detached: str = ""     # how it ended: "restored", "watchdog", "exec", "exited"
    counters: dict[str, int] = field(default_factory=dict)
    _specs: list[HookSpec] = field(default_factory=list)
    _sys_specs: list[HookSpec] = field(default_factory=list)
    _planned: list[Hook] = field(default_factory=list)
    quiet: object = None   # quiet(tid): the probes ignore tid's system calls (0: none)
    _hooks_planned: tuple = ((), {})
    _syscall_insn: int = 0

    @property
    def cfg_addr(self) -> int:
        return self.base + self.agent.symbols["as_cfg"][0]

    def sym(self, name: str) -> int:
        return self.base + self.agent.symbols[name][0]

    # -- in a stopped process --

    def _sys(self, st: Stopped, tid: int, name: str, *args: int) -> int:
        r = st.regs[tid].copy()
        r.rax = SYS[name]
        for reg, v in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(r, reg, v & ((1 << 64) - 1))
        r.rip = self.syscall_insn
        out = st.run_until_trap(tid, r, step=True)
        v = out.rax
        return v - (1 << 64) if v >= 1 << 63 else v

    def _mmap(self, st, tid, addr, length, prot, flags, fd=-1, off=0) -> int:
        got = self._sys(st, tid, "mmap", addr, length, prot, flags, fd, off)
        if -4096 < got < 0:
            raise InjectError(f"mmap in the target failed: {os.strerror(-got)}")
        if not flags & MAP_FIXED:
            self._mapped.append((got, length))
        return got

    def load(self, tracer_pid: int) -> None:
        """Stop the process, map the agent, place the hooks (sampling off), start the watchdog."""
        maps = procfs.read_maps(self.pid)
        mem = Memory(self.pid)
        try:
            # the proofs before the stop (capstone over whole functions: tens of ms on redis);
            # under the stop each entry's bytes are read again and must not have changed
            hooks, refused = plan_hooks(mem, maps, self._specs)
            shooks, srefused = plan_hooks(mem, maps, self._sys_specs)
            self._hooks_planned = (hooks + sys_all_or_nothing(shooks, srefused, self._sys_specs),
                                   {**refused, **srefused})
            self._syscall_insn = _find_syscall_insn(mem, maps)
            with Stopped(self.pid) as st:
                t0 = time.perf_counter()
                self._load(st, mem, maps, tracer_pid)
                self.stopped_ms.append(1000 * (time.perf_counter() - t0 + st.t_stop))
        except PtraceError as e:
            raise InjectError(f"cannot stop pid {self.pid} with ptrace: {e.strerror}") from None
        finally:
            mem.close()

    def _load(self, st: Stopped, mem: Memory, maps, tracer_pid: int) -> None:
        tid = self.pid if self.pid in st.tids else st.tids[0]
        self.quiet(tid)
        try:
            self._load_as(st, mem, maps, tracer_pid, tid)
        finally:
            self.quiet(0)

    def _load_as(self, st: Stopped, mem: Memory, maps, tracer_pid: int, tid: int) -> None:
        self._mapped: list[tuple[int, int]] = []
        try:
            self._load_in(st, mem, maps, tracer_pid, tid)
        except BaseException:
            # nothing half-done stays: the jumps written so far go back, then (no watchdog running
            # from them) the mappings are unmapped; a started watchdog is told to exit and keeps
            # its stack
            for h in self._planned:
                if h.jump:
                    try:
                        if mem.read(h.addr, patching.JMP_LEN) == h.jump:
                            mem.write(h.addr, h.orig[:patching.JMP_LEN])
                    except OSError:
                        pass
            self.hooks = []
            try:
                if self.watchdog_tid:
                    self._set(mem, "state", STATE_DETACHING)
                else:
                    for addr, length in self._mapped:
                        self._sys(st, tid, "munmap", addr, length)
            except (OSError, PtraceError):
                pass
            raise

    def _load_in(self, st: Stopped, mem: Memory, maps, tracer_pid: int, tid: int) -> None:
        self.syscall_insn = self._syscall_insn
        hooks, refused = self._hooks_planned
        for h in list(hooks):
            if mem.read(h.addr, len(h.orig)) != h.orig:
                refused[h.spec.symbol] = "its bytes changed while the process was being stopped"
                hooks.remove(h)
        hooks = [h for h in hooks if not h.spec.sys_kind] + \
            sys_all_or_nothing([h for h in hooks if h.spec.sys_kind], refused, self._sys_specs)
        self.refused.update(refused)
        if not any(not h.spec.sys_kind for h in hooks):
            raise InjectError("no allocator entry can be hooked safely: "
                              + (next(iter(refused.items()))[1] if refused else "none found"))
        if len(hooks) > AS_MAX_HOOKS:
            raise InjectError(f"{len(hooks)} entry points: the agent holds {AS_MAX_HOOKS}")
        # 1. the agent's file, mapped as ld.so would (no relocations: none to apply)
        scratch = self._mmap(st, tid, 0, PAGE, PROT_R | PROT_W, MAP_PRIVATE | MAP_ANON)
        try:
            mem.write(scratch, self.agent.path.encode() + b"\0")
            fd = self._sys(st, tid, "openat", -100 & ((1 << 64) - 1), scratch, os.O_RDONLY | os.O_CLOEXEC)
            if fd < 0:
                raise InjectError(f"the target cannot open {self.agent.path}: {os.strerror(-fd)}")
            try:
                base = self._mmap(st, tid, 0, self.agent.span, 0, MAP_PRIVATE | MAP_ANON)
                for v, _mz, fz, off, prot in self.agent.loads:
                    at = base + _page_down(v)
                    got = self._mmap(st, tid, at, _page_up(v + fz) - _page_down(v), prot,
                                     MAP_PRIVATE | MAP_FIXED, fd, _page_down(off))
                    if got != at:
                        raise InjectError("the agent's segments did not map where asked")
                self.base = base
            finally:
                self._sys(st, tid, "close", fd)
            # 2. tables (thread states, sampled-pointer set, its counts, the filter) and the watchdog's stack
            tsize = TABLES_BYTES
            self.tables = self._mmap(st, tid, 0, _page_up(tsize) + WATCHDOG_STACK, PROT_R | PROT_W,
                                     MAP_PRIVATE | MAP_ANON | MAP_NORESERVE)
            # 3. a stub page near each module: slot, stub and trampoline per hooked function
            self._place_stubs(st, mem, tid, maps, hooks)
            # 4. the configuration
            cfg = AsConfig.from_buffer_copy(mem.read(self.cfg_addr, ct.sizeof(AsConfig)))
            if cfg.magic != AS_MAGIC or cfg.version != AS_VERSION:
                raise InjectError("the mapped agent does not carry its configuration block")
            cfg.enabled, cfg.state, cfg.watchdog, cfg.pid = 0, STATE_HOOKED, WD_NONE, self.pid
            cfg.poll_ms, cfg.sample_bytes = WATCHDOG_POLL_MS, self.sample_bytes
            cfg.threads, cfg.thread_bits, cfg.set_bits = self.tables, THREAD_BITS, SET_BITS
            cfg.set = self.tables + (THREAD_SLOT << THREAD_BITS)
            cfg.spill = cfg.set + (64 << SET_BITS)
            cfg.filter, cfg.filter_bits = cfg.spill + (1 << SET_BITS), FILTER_BITS
            cfg.nhooks = len(hooks)
            perms = {m.start: m for m in maps}
            for i, h in enumerate(hooks):
                r = cfg.hooks[i]
                n = 16 if h.wide else 8
                orig = mem.read(h.word, n)
                patched = bytearray(orig)
                patched[h.addr - h.word:h.addr - h.word + patching.JMP_LEN] = h.jump
                r.word_addr, r.wide = h.word, int(h.wide)
                r.orig_word, r.patched_word = _word(orig), _word(patched)
                if h.wide:
                    r.orig_hi, r.patched_hi = _word(orig, 8), _word(patched, 8)
                r.page, r.page_len = _page_down(h.word), PAGE
                m = next((m for m in perms.values() if m.start <= h.word < m.end), None)
                r.prot = _prot(m.perms if m else "r-x")
                if h.spec.sys_kind:
                    _k, kind, i = h.spec.program.split(":")
                    cfg.sys_orig[SYS_KINDS.index(kind)][int(i)] = h.tramp
            # 5. the watchdog: the tracer's pidfd, a thread on its own stack, every signal blocked
            pidfd = self._sys(st, tid, "pidfd_open", tracer_pid, 0)
            if pidfd < 0:
                raise InjectError(f"pidfd_open in the target failed: {os.strerror(-pidfd)} (kernel 5.3+)")
            self.pidfd = cfg.pidfd = pidfd
            mem.write(self.cfg_addr, bytes(cfg))
            mem.write(scratch + 256, b"\xff" * 8)
            self._sys(st, tid, "rt_sigprocmask", 0, scratch + 256, scratch + 264, 8)
            r = st.regs[tid].copy()
            r.rip, r.rdi = self.sym("as_clone_entry"), CLONE_FLAGS
            r.rsi = self.tables + _page_up(tsize) + WATCHDOG_STACK - 64
            out = st.run_until_trap(tid, r, step=False)
            self._sys(st, tid, "rt_sigprocmask", 2, scratch + 264, 0, 8)
            child = out.rax - (1 << 64) if out.rax >= 1 << 63 else out.rax
            if child <= 0:
                self._set(mem, "state", STATE_DETACHING)
                raise InjectError(f"clone of the watchdog thread failed: {os.strerror(-child) if child else '?'}")
            self.watchdog_tid = child
            # 6. the jumps, once no thread is inside the bytes they replace
            for _try in range(20):
                inside = [t for t, rg in st.regs.items() for h in hooks if h.addr < rg.rip < h.addr + h.length]
                if not inside:
                    break
                self._step_out(st, inside)
            else:
                self._set(mem, "state", STATE_DETACHING)
                raise InjectError("a thread stays inside an allocator entry's first bytes")
            for h in hooks:
                mem.write(h.addr, h.jump)
            self.hooks = hooks
        finally:
            if scratch > 0:
                self._sys(st, tid, "munmap", scratch, PAGE)

    def _step_out(self, st: Stopped, tids: list[int]) -> None:
        """Single-step threads caught inside displaced bytes until they are past them."""
        for t in tids:
            for _ in range(8):
                r = st.run_until_trap(t, st.getregs(t), step=True)
                r.orig_rax = st.regs[t].orig_rax
                st.regs[t] = r
                if not any(h.addr < r.rip < h.addr + h.length for h in self._planned):
                    break

    def _place_stubs(self, st: Stopped, mem: Memory, tid: int, maps, hooks: list[Hook]) -> None:
        self._planned = hooks
        by_module: dict[str, list[Hook]] = {}
        for h in hooks:
            by_module.setdefault(h.spec.path, []).append(h)
        taken: list[tuple[int, int]] = []
        maps = procfs.read_maps(self.pid)  # with the agent and its tables (mapped just now)
        for path, hs in by_module.items():
            mods = [m for m in maps if m.path == path] or \
                   [m for m in maps if m.start <= hs[0].addr < m.end]
            lo, hi = min(m.start for m in mods), max(m.end for m in mods)
            size = _page_up(len(hs) * patching.ENTRY_SPAN)
            want = near_gap(maps, lo, hi, size, taken)
            got = self._mmap(st, tid, want, size, PROT_R | PROT_X, MAP_PRIVATE | MAP_ANON | MAP_FIXED_NOREPLACE)
            if got != want:
                self._sys(st, tid, "munmap", got, size)
                raise InjectError("the kernel placed the hook stubs out of a jump's reach")
            taken.append((got, got + size))
            page = bytearray(b"\xcc" * size)
            for i, h in enumerate(hs):
                at = got + i * patching.ENTRY_SPAN
                slot, stub, tramp = at, at + patching.SLOT_LEN, at + patching.SLOT_LEN + patching.STUB_LEN
                code = patching.relocate(h.orig[:h.length], h.addr, tramp)
                code += patching.rel_jump(tramp + len(code), h.addr + h.length)  # the page is within reach
                hook = self.sym(h.spec.hook_symbol)
                # the mmap family's calls take up to 6 arguments: no register carries the slot;
                # each definition has a hook of its own, which finds its trampoline in as_cfg
                enter = patching.abs_jump(hook).ljust(patching.STUB_LEN, b"\xcc") if h.spec.sys_kind \
                    else patching.stub(slot, hook)
                blob = struct.pack("<QQ", tramp, h.spec.cookie) + enter + code
                h.tramp = tramp
                page[i * patching.ENTRY_SPAN:i * patching.ENTRY_SPAN + len(blob)] = blob
                h.slot = slot
                h.jump = patching.rel_jump(h.addr, stub)
            mem.write(got, bytes(page))

    def _set(self, mem: Memory, name: str, value: int) -> None:
        off = getattr(AsConfig, name).offset
        mem.write(self.cfg_addr + off, struct.pack("<I", value))

    # -- while it runs --

    def enable(self, on: bool = True) -> None:
        """Sampling on (after the markers' uprobes are attached) or off (before the last snapshot)."""
        if not self.hooks or self.detached:
            return
        try:
            mem = Memory(self.pid)
        except OSError:
            return
        try:
            self._set(mem, "enabled", int(on))
        except OSError:
            pass
        finally:
            mem.close()

    def read_config(self) -> AsConfig | None:
        try:
            mem = Memory(self.pid)
        except OSError:
            return None
        try:
            return AsConfig.from_buffer_copy(mem.read(self.cfg_addr, ct.sizeof(AsConfig)))
        except (OSError, ValueError):
            return None
        finally:
            mem.close()

    def _agent_mapped(self) -> bool:
        for m in procfs.read_maps(self.pid):
            if m.start == self.base and m.is_file and os.path.basename(m.path) == os.path.basename(self.agent.path):
                return True
        return False

    def detach(self) -> str:
        """Every entry put back byte for byte (threads stopped), the watchdog told to exit.
        Returns how it ended; idempotent."""
        if self.detached or not self.hooks:
            return self.detached
        if not os.path.exists(f"/proc/{self.pid}"):
            self.detached = "exited"
            return self.detached
        if not self._agent_mapped():
            self.detached = "exec"   # a new image: the hooks went with the old one
            return self.detached
        cfg = self.read_config()
        if cfg is not None:
            self.counters = {k: getattr(cfg, k) for k in ("sampled", "freed", "set_full", "thread_overflow", "foreign",
                                                          "sys_marks")}
        mem = Memory(self.pid)
        try:
            with Stopped(self.pid) as st:
                t0 = time.perf_counter()
                self._set(mem, "enabled", 0)
                state = AsConfig.from_buffer_copy(mem.read(self.cfg_addr, ct.sizeof(AsConfig))).state
                for h in self.hooks:
                    cur = mem.read(h.addr, patching.JMP_LEN)
                    if cur == h.jump:
                        mem.write(h.addr, h.orig[:patching.JMP_LEN])
                self._set(mem, "state", STATE_DETACHING)
                if self.pidfd >= 0 and self._pidfd_is_ours():
                    tid = self.pid if self.pid in st.tids else st.tids[0]
                    self._sys(st, tid, "close", self.pidfd)
                    self.pidfd = -1
                self.stopped_ms.append(1000 * (time.perf_counter() - t0 + st.t_stop))
            self.detached = "watchdog" if state == STATE_UNHOOKED else "restored"
        except PtraceError as e:
            if not os.path.exists(f"/proc/{self.pid}"):
                self.detached = "exited"
                return self.detached
            raise InjectError(f"cannot stop pid {self.pid} to take the hooks back: {e.strerror}") from None
        finally:
            mem.close()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and self.watchdog_tid and \
                os.path.exists(f"/proc/{self.pid}/task/{self.watchdog_tid}"):
            time.sleep(0.01)
        return self.detached

    def _pidfd_is_ours(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/fdinfo/{self.pidfd}") as f:
                return any(line.split() == ["Pid:", str(os.getpid())] for line in f)
        except OSError:
            return False

    @property
    def sys_hooked(self) -> dict[str, list[str]]:
        """The mmap family's calls hooked: kind -> [symbol@module]"""
        out: dict[str, list[str]] = {}
        for h in self.hooks:
            if h.spec.sys_kind:
                out.setdefault(h.spec.sys_kind, []).append(f"{h.spec.symbol}@{h.spec.path}")
        return out

    def report(self, tracepoints: list[str] | None = None) -> dict:
        """recording.probes.inject; `tracepoints`: the syscall tracepoints this recording kept (the
        mmap-family calls not hooked)"""
        return {"agent": self.agent.path, "base": self.base,
                "hooked": [{"symbol": h.spec.symbol, "module": h.spec.path, "source": h.spec.source,
                            "displaced": h.length} for h in self.hooks if not h.spec.sys_kind],
                "mmap_family": {"hooked": self.sys_hooked,
                                "not_seen": "system calls made without these functions (ld.so mapping "
                                            "libraries, syscall(2), inline system calls)"},
                "tracepoints": list(tracepoints or []),
                "skipped": dict(self.refused), "stopped_ms": [round(x, 2) for x in self.stopped_ms],
                "watchdog_tid": self.watchdog_tid, "detached": self.detached, "counters": dict(self.counters),
                "tables_resident_bytes": tables_resident(self.pid, self.tables)}


def _word(b: bytes, at: int = 0) -> int:
    return struct.unpack_from("<Q", b, at)[0]


def _prot(perms: str) -> int:
    return (PROT_R if "r" in perms else 0) | (PROT_W if "w" in perms else 0) | (PROT_X if "x" in perms else 0)


def inject(pid: int, specs: list[HookSpec], skipped: dict[str, str], sample_bytes: int, quiet=None) -> Injection:
    """The agent loaded into `pid` with its hooks in place, sampling off (enable() after the
    markers' probes are attached). InjectError (nothing left in the process) when it cannot."""
    why = ptrace_blocker(pid)
    if why:
        raise InjectError(f"--inject: {why}")
    img = read_agent(agent_path())
    inj = Injection(pid, sample_bytes, img)
    inj._specs = specs
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    inj._sys_specs, sys_skipped = sys_specs(procfs.read_maps(pid), exe, sorted({sp.path for sp in specs}))
    skipped = {**skipped, **sys_skipped}
    inj.refused.update(skipped)
    inj.quiet = quiet or (lambda tid: None)
    inj.load(os.getpid())
    return inj


def errno_name(e: int) -> str:
    return errno.errorcode.get(e, str(e))
