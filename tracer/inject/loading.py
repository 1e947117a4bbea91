"""--inject's loading phase: with every thread stopped, one of them runs system calls on our
behalf (mmap of the agent's file, its tables, a stub page near each allocator module, pidfd_open of
the tracer, clone of the watchdog thread), the hooks are written, and no thread is left inside the
bytes they displace. Nothing half-done stays when a step fails."""

from __future__ import annotations

import ctypes as ct
import os
import struct
import time

from common.pages import PAGE, page_down, page_up

from ..process import procfs
from . import patching
from .agent import (
    AS_MAGIC,
    AS_MAX_HOOKS,
    AS_VERSION,
    CLONE_FLAGS,
    FILTER_BITS,
    GUARD_OFFSET,
    MADV_WIPEONFORK,
    MAP_ANON,
    MAP_FIXED,
    MAP_FIXED_NOREPLACE,
    MAP_NORESERVE,
    MAP_PRIVATE,
    PROT_R,
    PROT_W,
    PROT_X,
    SET_BITS,
    STATE_DETACHING,
    STATE_HOOKED,
    SYS_KINDS,
    TABLES_SPAN,
    THREAD_BITS,
    THREAD_SLOT,
    WATCHDOG_POLL_MS,
    WD_NONE,
    AsConfig,
    InjectError,
)
from .hooks import Hook, plan_hooks, sys_all_or_nothing
from .ptrace import Memory, PtraceError, Stopped


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
                cand = page_down(g1 - size)
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


def _word(b: bytes | bytearray, at: int = 0) -> int:
    return struct.unpack_from("<Q", b, at)[0]


def _prot(perms: str) -> int:
    return (PROT_R if "r" in perms else 0) | (PROT_W if "w" in perms else 0) | (PROT_X if "x" in perms else 0)


class AgentLoader:
    """Loads the agent into one Injection's process (`Injection.load`)."""

    def __init__(self, inj) -> None:
        self.inj = inj
        self._planned: list[Hook] = []
        self._hooks_planned: tuple = ((), {})
        self._syscall_insn = 0
        self._mapped: list[tuple[int, int]] = []

    def _mmap(self, st, tid, addr, length, prot, flags, fd=-1, off=0) -> int:
        got = self.inj.syscall(st, tid, "mmap", addr, length, prot, flags, fd, off)
        if -4096 < got < 0:
            raise InjectError(f"mmap in the target failed: {os.strerror(-got)}")
        if not flags & MAP_FIXED:
            self._mapped.append((got, length))
        return got

    def load(self, tracer_pid: int) -> None:
        """Stop the process, map the agent, place the hooks (sampling off), start the watchdog."""
        maps = procfs.read_maps(self.inj.pid)
        mem = Memory(self.inj.pid)
        try:
            # the proofs before the stop (capstone over whole functions: tens of ms on redis);
            # under the stop each entry's bytes are read again and must not have changed
            hooks, refused = plan_hooks(mem, maps, self.inj.specs)
            shooks, srefused = plan_hooks(mem, maps, self.inj.sys_hook_specs)
            self._hooks_planned = (
                hooks + sys_all_or_nothing(shooks, srefused, self.inj.sys_hook_specs),
                {**refused, **srefused},
            )
            self._syscall_insn = _find_syscall_insn(mem, maps)
            with Stopped(self.inj.pid) as st:
                t0 = time.perf_counter()
                self._load(st, mem, maps, tracer_pid)
                self.inj.stopped_ms.append(1000 * (time.perf_counter() - t0 + st.t_stop))
        except PtraceError as e:
            raise InjectError(f"cannot stop pid {self.inj.pid} with ptrace: {e.strerror}") from None
        finally:
            mem.close()

    def _load(self, st: Stopped, mem: Memory, maps, tracer_pid: int) -> None:
        tid = self.inj.pid if self.inj.pid in st.tids else st.tids[0]
        self.inj.quiet(tid)
        try:
            self._load_as(st, mem, maps, tracer_pid, tid)
        finally:
            self.inj.quiet(0)

    def _load_as(self, st: Stopped, mem: Memory, maps, tracer_pid: int, tid: int) -> None:
        self._mapped = []
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
                            mem.write(h.addr, h.orig[: patching.JMP_LEN])
                    except OSError:
                        pass
            self.inj.hooks = []
            try:
                if self.inj.watchdog_tid:
                    self.inj.set_field(mem, "state", STATE_DETACHING)
                else:
                    for addr, length in self._mapped:
                        self.inj.syscall(st, tid, "munmap", addr, length)
            except (OSError, PtraceError):
                pass
            raise

    def _load_in(self, st: Stopped, mem: Memory, maps, tracer_pid: int, tid: int) -> None:
        self.inj.syscall_insn = self._syscall_insn
        hooks, refused = self._hooks_planned
        for h in list(hooks):
            if mem.read(h.addr, len(h.orig)) != h.orig:
                refused[h.spec.symbol] = "its bytes changed while the process was being stopped"
                hooks.remove(h)
        hooks = [h for h in hooks if not h.spec.sys_kind] + sys_all_or_nothing(
            [h for h in hooks if h.spec.sys_kind], refused, self.inj.sys_hook_specs
        )
        self.inj.refused.update(refused)
        if not any(not h.spec.sys_kind for h in hooks):
            raise InjectError(
                "no allocator entry can be hooked safely: "
                + (next(iter(refused.items()))[1] if refused else "none found")
            )
        if len(hooks) > AS_MAX_HOOKS:
            raise InjectError(f"{len(hooks)} entry points: the agent holds {AS_MAX_HOOKS}")
        # 1. the agent's file, mapped as ld.so would (no relocations: none to apply)
        scratch = self._mmap(st, tid, 0, PAGE, PROT_R | PROT_W, MAP_PRIVATE | MAP_ANON)
        try:
            mem.write(scratch, self.inj.agent.path.encode() + b"\0")
            fd = self.inj.syscall(st, tid, "openat", -100 & ((1 << 64) - 1), scratch, os.O_RDONLY | os.O_CLOEXEC)
            if fd < 0:
                raise InjectError(f"the target cannot open {self.inj.agent.path}: {os.strerror(-fd)}")
            try:
                base = self._mmap(st, tid, 0, self.inj.agent.span, 0, MAP_PRIVATE | MAP_ANON)
                for v, _mz, fz, off, prot in self.inj.agent.loads:
                    at = base + page_down(v)
                    got = self._mmap(
                        st, tid, at, page_up(v + fz) - page_down(v), prot, MAP_PRIVATE | MAP_FIXED, fd, page_down(off)
                    )
                    if got != at:
                        raise InjectError("the agent's segments did not map where asked")
                self.inj.base = base
            finally:
                self.inj.syscall(st, tid, "close", fd)
            # 2. tables (thread states, sampled-pointer set, its counts, the filter), the watchdog's
            # stack, and the fork guard's page (agent.c ours(): wiped in a fork's child)
            self.inj.tables = self._mmap(
                st, tid, 0, TABLES_SPAN, PROT_R | PROT_W, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE
            )
            guard = self.inj.tables + GUARD_OFFSET
            if self.inj.syscall(st, tid, "madvise", guard, PAGE, MADV_WIPEONFORK) == 0:
                mem.write(guard, struct.pack("<Q", 1))
            else:
                guard = 0  # a kernel before 4.14: the hooks ask getpid
            # 3. a stub page near each module: slot, stub and trampoline per hooked function
            self._place_stubs(st, mem, tid, maps, hooks)
            # 4. the configuration
            cfg = AsConfig.from_buffer_copy(mem.read(self.inj.cfg_addr, ct.sizeof(AsConfig)))
            if cfg.magic != AS_MAGIC or cfg.version != AS_VERSION:
                raise InjectError("the mapped agent does not carry its configuration block")
            cfg.enabled, cfg.state, cfg.watchdog, cfg.pid = 0, STATE_HOOKED, WD_NONE, self.inj.pid
            cfg.poll_ms, cfg.sample_bytes = WATCHDOG_POLL_MS, self.inj.sample_bytes
            cfg.threads, cfg.thread_bits, cfg.set_bits = self.inj.tables, THREAD_BITS, SET_BITS
            cfg.set = self.inj.tables + (THREAD_SLOT << THREAD_BITS)
            cfg.spill = cfg.set + (64 << SET_BITS)
            cfg.filter, cfg.filter_bits = cfg.spill + (1 << SET_BITS), FILTER_BITS
            cfg.nhooks, cfg.guard = len(hooks), guard
            perms = {m.start: m for m in maps}
            for i, h in enumerate(hooks):
                r = cfg.hooks[i]
                n = 16 if h.wide else 8
                orig = mem.read(h.word, n)
                patched = bytearray(orig)
                patched[h.addr - h.word : h.addr - h.word + patching.JMP_LEN] = h.jump
                r.word_addr, r.wide = h.word, int(h.wide)
                r.orig_word, r.patched_word = _word(orig), _word(patched)
                if h.wide:
                    r.orig_hi, r.patched_hi = _word(orig, 8), _word(patched, 8)
                r.page, r.page_len = page_down(h.word), PAGE
                m = next((m for m in perms.values() if m.start <= h.word < m.end), None)
                r.prot = _prot(m.perms if m else "r-x")
                if h.spec.sys_kind:
                    _k, kind, i = h.spec.program.split(":")
                    cfg.sys_orig[SYS_KINDS.index(kind)][int(i)] = h.tramp
            # 5. the watchdog: the tracer's pidfd, a thread on its own stack, every signal blocked
            pidfd = self.inj.syscall(st, tid, "pidfd_open", tracer_pid, 0)
            if pidfd < 0:
                raise InjectError(f"pidfd_open in the target failed: {os.strerror(-pidfd)} (kernel 5.3+)")
            self.inj.pidfd = cfg.pidfd = pidfd
            mem.write(self.inj.cfg_addr, bytes(cfg))
            mem.write(scratch + 256, b"\xff" * 8)
            self.inj.syscall(st, tid, "rt_sigprocmask", 0, scratch + 256, scratch + 264, 8)
            r = st.regs[tid].copy()
            r.rip, r.rdi = self.inj.sym("as_clone_entry"), CLONE_FLAGS
            r.rsi = self.inj.tables + GUARD_OFFSET - 64  # the top of the watchdog's stack
            out = st.run_until_trap(tid, r, step=False)
            self.inj.syscall(st, tid, "rt_sigprocmask", 2, scratch + 264, 0, 8)
            child = out.rax - (1 << 64) if out.rax >= 1 << 63 else out.rax
            if child <= 0:
                self.inj.set_field(mem, "state", STATE_DETACHING)
                raise InjectError(f"clone of the watchdog thread failed: {os.strerror(-child) if child else '?'}")
            self.inj.watchdog_tid = child
            # 6. the jumps, once no thread is inside the bytes they replace
            for _try in range(20):
                inside = [t for t, rg in st.regs.items() for h in hooks if h.addr < rg.rip < h.addr + h.length]
                if not inside:
                    break
                self._step_out(st, inside)
            else:
                self.inj.set_field(mem, "state", STATE_DETACHING)
                raise InjectError("a thread stays inside an allocator entry's first bytes")
            for h in hooks:
                mem.write(h.addr, h.jump)
            self.inj.hooks = hooks
        finally:
            if scratch > 0:
                self.inj.syscall(st, tid, "munmap", scratch, PAGE)

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
        maps = procfs.read_maps(self.inj.pid)  # with the agent and its tables (mapped just now)
        for path, hs in by_module.items():
            mods = [m for m in maps if m.path == path] or [m for m in maps if m.start <= hs[0].addr < m.end]
            lo, hi = min(m.start for m in mods), max(m.end for m in mods)
            size = page_up(len(hs) * patching.ENTRY_SPAN)
            want = near_gap(maps, lo, hi, size, taken)
            got = self._mmap(st, tid, want, size, PROT_R | PROT_X, MAP_PRIVATE | MAP_ANON | MAP_FIXED_NOREPLACE)
            if got != want:
                self.inj.syscall(st, tid, "munmap", got, size)
                raise InjectError("the kernel placed the hook stubs out of a jump's reach")
            taken.append((got, got + size))
            page = bytearray(b"\xcc" * size)
            for i, h in enumerate(hs):
                at = got + i * patching.ENTRY_SPAN
                slot, stub, tramp = at, at + patching.SLOT_LEN, at + patching.SLOT_LEN + patching.STUB_LEN
                code = patching.relocate(h.orig[: h.length], h.addr, tramp)
                code += patching.rel_jump(tramp + len(code), h.addr + h.length)  # the page is within reach
                hook = self.inj.sym(h.spec.hook_symbol)
                # the mmap family's calls take up to 6 arguments: no register carries the slot;
                # each definition has a hook of its own, which finds its trampoline in as_cfg
                enter = (
                    patching.abs_jump(hook).ljust(patching.STUB_LEN, b"\xcc")
                    if h.spec.sys_kind
                    else patching.stub(slot, hook)
                )
                blob = struct.pack("<QQ", tramp, h.spec.cookie) + enter + code
                h.tramp = tramp
                page[i * patching.ENTRY_SPAN : i * patching.ENTRY_SPAN + len(blob)] = blob
                h.slot = slot
                h.jump = patching.rel_jump(h.addr, stub)
            mem.write(got, bytes(page))
