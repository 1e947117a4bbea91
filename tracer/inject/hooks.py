"""What --inject hooks: the entry points of each allocator (and the mmap family's functions) the
agent takes over, each proved movable on the code (tracer/inject/patching.py) and found in the
running process."""

from __future__ import annotations

import os
from dataclasses import dataclass

from common.allocators.glibc import GLIBC

from ..allocators.purges import NOT_HOOKED
from ..process import procfs
from . import patching
from .agent import HOOKS, SYS_DEFS, SYS_FAMILY, SYS_KINDS, THROWING
from .patching import PatchRefused
from .ptrace import Memory


@dataclass
class HookSpec:
    """One allocator entry point to hook (from the allocator plans)."""

    symbol: str
    path: str
    offset: int  # file offset of the function
    size: int  # st_size (0: unknown)
    program: str  # its BPF entry program: the hook's kind (the mmap family: sys:KIND:DEFINITION)
    cookie: int  # enum as_api | source << 16
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
            base = sym[len(a.prefix) :] if a.prefix and sym.startswith(a.prefix) else sym
            if pr.program not in HOOKS:
                skipped[sym] = NOT_HOOKED  # tracer/allocators/purges.py: probed as without --inject
            elif base in THROWING:
                skipped[sym] = "may throw (operator new): exceptions cannot unwind through a hook"
            else:
                specs.append(
                    HookSpec(
                        sym, a.path, a.offsets[sym], a.sizes.get(sym, 0), pr.program, cookies[(a.path, sym)], a.source
                    )
                )
    return specs, skipped


def sys_specs(maps: list[procfs.Mapping], exe: str, paths: list[str]) -> tuple[list[HookSpec], dict[str, str]]:
    """The mmap family's entry points to hook: their definitions in libc, in the executable (a
    static libc) and in `paths` (the allocators' modules: one that brings its own mmap, as
    gperftools' tcmalloc does), one spec per (module, address); and {name: why not} for a call
    with more definitions than the agent has hooks for (it keeps its tracepoint)."""
    from ..allocators.discovery import code_files, file_id, module_symbols  # noqa: PLC0415

    exe_id = file_id(exe) if exe else None
    want = {file_id(p) for p in paths} - {None}
    mods = [
        p
        for p in code_files(maps)
        if os.path.basename(p).startswith(GLIBC.libraries) or file_id(p) == exe_id or file_id(p) in want
    ]
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
    addr: int  # the function's address in the target
    length: int  # displaced bytes
    orig: bytes  # the first 16 bytes as they were
    jump: bytes  # the 5 bytes written
    word: int = 0  # aligned restore word
    wide: bool = False
    slot: int = 0
    tramp: int = 0  # the trampoline: the real function for the hook


def _runtime_address(maps: list[procfs.Mapping], path: str, offset: int) -> tuple[int, procfs.Mapping] | None:
    from ..allocators.discovery import file_id  # noqa: PLC0415

    fid = file_id(path)
    for m in maps:
        if (
            m.is_file
            and "x" in m.perms
            and m.offset <= offset < m.offset + (m.end - m.start)
            and (m.path == path or (fid is not None and file_id(m.path) == fid))
        ):
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
        lines.append(
            "keep their syscall tracepoints under --inject (every system call on the machine pays "
            f"its slow path while recording): {', '.join(kept)}"
        )
    else:
        lines.append(
            "no syscall tracepoint under --inject; not seen then: system calls made without these "
            "functions (ld.so mapping libraries, syscall(2), inline system calls)"
        )
    return lines
