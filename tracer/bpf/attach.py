"""The uprobes of a recording: on every allocator planned, the user's functions, --inject's markers
and the CUDA driver (tracer/bpf/attach_cuda.py), through uprobe_multi links where the kernel has
them (6.6+; one link per program, module and kind), uprobe sessions for sampled heap recordings
(6.13+), else one perf event each; and the report of what was probed and how (meta.json `probes`).
"""

from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass, field

from common.errors import AllocscopeError, PermissionProblem

from ..allocators.discovery import STANDARD
from ..allocators.purges import NOT_HOOKED, purge_plans
from ..base import layout as L
from .faults import FaultEvents
from .kernel_btf import optimizes_nop5_uprobes
from .objects import TRACE_UPROBE_SESSION, UPROBE_MULTI_RETURN, uprobe_multi_link
from .program import Program, sys_tracepoints

BPF_PROBE_ENTRY = 0
BPF_PROBE_RETURN = 1


def _arg(n: int | None) -> int:
    return 0xFF if n is None else n  # AS_ARG_NONE


def agent_thread_bits() -> int:
    from ..inject.agent import THREAD_BITS  # noqa: PLC0415

    return THREAD_BITS


def heap_cookie(program: str, source: int | None) -> int:
    """The cookie of a heap function's probed address on a link (heap_entry, heap_session):
    enum as_api (from its classic entry program's name: malloc_enter -> AS_API_MALLOC) | the
    allocator's source << 16 (None: the main heap)."""
    api = L.enum("AS_API_" + program.removesuffix("_enter").upper())
    return api | (L.enum("AS_SRC_HEAP") if source is None else source) << 16


@dataclass
class AttachReport:
    allocator: str = ""
    allocator_kind: str = ""
    attached: list[str] = field(default_factory=list)  # symbols probed
    aliases: dict[str, str] = field(default_factory=dict)  # symbol -> symbol sharing its address
    skipped: dict[str, str] = field(default_factory=dict)  # symbol -> reason
    tracepoints: list[str] = field(default_factory=list)
    raw_tracepoints: list[str] = field(default_factory=list)  # of those, attached raw (no record filled)
    placement: dict[str, str] = field(default_factory=dict)  # symbol -> where its entry probe sits
    cuda: dict = field(default_factory=dict)  # the CUDA driver's probes (tracer.allocators.cuda)
    allocators: list = field(default_factory=list)  # every allocator: allocators.discovery.Plan.as_dict
    custom: list = field(default_factory=list)  # --alloc-fn / --free-fn
    returns: str = "classic"  # how the heap functions' returns are probed: session (uprobe_multi) or classic
    returns_why: str = ""  # why classic return probes serve a sampled recording
    uprobes: str = "perf"  # how uprobes are attached: multi (uprobe_multi links) or perf (one perf event each)
    uprobes_why: str = ""  # why perf events
    heap: str = "probes"  # how heap calls reach the probes: probes (every call traps) or inject (markers)


class Uprobes:
    """Attaches the uprobes of one loaded program (`program`) to its target; `report` says what."""

    def __init__(self, program: Program, faults: FaultEvents) -> None:
        self.program, self.faults = program, faults
        self.pid, self.options = program.pid, program.options
        self._links: list[int] = []  # uprobe_multi link fds: closing one detaches its probes at once
        self._queued: dict[tuple[str, str, int], dict[int, int]] = {}  # (program, path, kind) -> {offset: cookie}
        self.report = AttachReport(
            tracepoints=[
                f"{c}:{n}"
                for c, n in [
                    ("syscalls", f"sys_{d}_{s}")
                    for s in ("mmap", "munmap", "mremap", "brk", "madvise")
                    for d in ("enter", "exit")
                ]
                + [
                    ("task", "task_rename"),
                    ("task", "task_newtask"),
                    ("sched", "sched_process_exit"),
                    ("sched", "sched_process_exec"),
                    ("sched", "sched_switch"),
                    ("tlb", "tlb_flush"),
                ]
                + ([("kmem", "rss_stat")] if program.rss_tracepoint else [])
            ]
        )
        raw = {tp.decode() for tp in program.bpf.raw_tracepoint_fds}
        self.report.raw_tracepoints = [tp for tp in self.report.tracepoints if tp.split(":")[-1] in raw]
        self._addressed: list[tuple] = []  # (path, file offset, map, value): written once mapped
        self._xol = 0  # the start of the target's [uprobes] page written to xol_cfg

    @property
    def bpf(self):
        return self.program.bpf

    def add(self, fn_name: str, path: str, offset: int, kind: int, cookie: int = 0) -> None:
        """One uprobe: with links, queued for flush (one link per program, module and kind);
        else a perf event now."""
        if kind == BPF_PROBE_RETURN:
            self.program.load_classic()
        fn = self.program.load(fn_name.encode())
        if self.program.multi:
            self._queued.setdefault((fn_name, path, kind), {}).setdefault(offset, cookie)
            return
        prefix = b"r" if kind == BPF_PROBE_RETURN else b"p"
        ev = self.bpf._get_uprobe_evname(prefix, path.encode(), offset, self.pid)
        fd = self.program.lib.attach_uprobe(fn.fd, kind, ev, path.encode(), offset, self.pid, 0)
        if fd < 0:
            err = ct.get_errno()
            raise PermissionProblem(
                f"cannot attach a uprobe to {os.path.basename(path)}+{offset:#x} ({fn_name}): "
                f"{os.strerror(err) if err else 'unknown error'}"
            )
        self.bpf._add_uprobe_fd(ev, fd)

    def flush(self) -> dict[tuple[str, str, int, int], str]:
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
                        f"cannot attach a uprobe to {os.path.basename(path)}+{offs[0]:#x} ({prog}): {os.strerror(-fd)}"
                    )
        return failed

    def attach(
        self,
        plans: list,
        custom: list | None = None,
        sources: dict[str, int] | None = None,
        maps: list | None = None,
        agent=None,
    ) -> AttachReport:
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
            rep.allocator, rep.allocator_kind = primary.shown, primary.kind
        if self.options.mode == "residency":
            rep.skipped = dict.fromkeys(STANDARD, "residency mode: no allocator probes")
            rep.allocators = [
                dict(pl.as_dict([]), skipped={"*": "residency mode: no allocator probes"}) for pl in plans
            ]
            self.faults.attach()
            rep.tracepoints.append(
                f"perf:page-faults (software event, every {self.options.fault_sample}th, per thread, inherited"
                + (f", open {self.faults.duty:.0%} of each second)" if self.faults.duty < 1 else ")")
            )
            return rep
        if primary is not None:
            for sym in ("malloc", "free"):
                if sym not in primary.entries:
                    raise AllocscopeError(f"{primary.path} does not define {sym}; cannot trace it")
        if agent is not None:
            self._attach_markers(agent, custom or [], sources or {}, maps or [], plans)
            rep.allocators = [pl.as_dict([]) for pl in plans]
            rep.custom = [
                {"spec": loc.fn.spec, "module": loc.path, "source": loc.fn.source} for loc, _src, _off in custom or []
            ]
            return rep
        self._attach_plans(plans, custom or [], sources or {}, maps or [])
        if plans:
            first = plans[0]
            rep.attached = [pr.symbol for pr in first.probes]
            rep.aliases, rep.skipped = dict(first.aliases), dict(first.skipped)
            rep.placement = {pr.symbol: pr.reason for pr in first.probes if pr.moved}
        rep.allocators = [pl.as_dict() for pl in plans]
        rep.custom = [
            {"spec": loc.fn.spec, "module": loc.path, "source": loc.fn.source} for loc, _src, _off in custom or []
        ]
        return rep

    def _attach_markers(self, agent, custom: list, sources: dict[str, int], maps: list, plans: list) -> None:
        """--inject: entry probes on the agent's two markers (only sampled calls reach them), the
        agent's thread table for agent_api, and the user's functions and the allocators' purge
        calls (tracer/allocators/purges.py) as usual."""
        purges = purge_plans(plans)
        self._attach_plans(purges, custom, sources, maps)
        img = agent.agent
        nop5 = optimizes_nop5_uprobes()
        agent.marker_probe = "nop5" if nop5 else "push"
        self.add("mark_alloc", img.path, img.marker_offset("as_mark_alloc", nop5), BPF_PROBE_ENTRY)
        self.add("mark_free", img.path, img.marker_offset("as_mark_free", nop5), BPF_PROBE_ENTRY)
        failed = self.flush()
        if failed:
            raise PermissionProblem(next(iter(failed.values())))
        t = self.bpf[b"agent_cfg"]
        v = t.Leaf()
        v.threads, v.bits = agent.tables, agent_thread_bits()
        t[ct.c_int(0)] = v
        self._attach_sys_marker(agent)
        self.report.heap = "inject"
        self.report.attached = [h.spec.symbol for h in agent.hooks if not h.spec.sys_kind] + [
            pr.symbol for pl in purges for pr in pl.probes
        ]
        self.report.skipped = {k: v for k, v in agent.refused.items() if v != NOT_HOOKED}  # purges: probed

    def _attach_sys_marker(self, agent) -> None:
        """--inject: the mmap-family calls the agent hooked are reported through its as_mark_sys
        (probes/syscalls.bpf.c mark_sys) and switched over in `sys_hooked`; the others get their
        syscall tracepoints now. `sys_tracepoints_kept`: those."""
        from ..inject.agent import SYS_FAMILY  # noqa: PLC0415

        hooked = agent.sys_hooked
        if hooked:
            if self.program.unwind == "dwarf":
                tails = self.bpf[b"msys_tails"]
                for i, name in enumerate((b"msys_unwind", b"msys_keep")):
                    tails[ct.c_int(i)] = ct.c_int(self.program.load(name).fd)
            nop5 = agent.marker_probe == "nop5"  # as the other markers (_attach_markers)
            self.add("mark_sys", agent.agent.path, agent.agent.marker_offset("as_mark_sys", nop5), BPF_PROBE_ENTRY)
            failed = self.flush()
            if failed:
                raise PermissionProblem(next(iter(failed.values())))
            t = self.bpf[b"sys_hooked"]
            for kind in hooked:
                t[ct.c_int(SYS_FAMILY[kind][1])] = ct.c_uint32(1)
        kept = [tp for kind in SYS_FAMILY if kind not in hooked for tp in sys_tracepoints(kind)]
        self.program.sys_tracepoints_kept = kept
        for tp in self.program.sys_tracepoints_kept:
            if tp.encode() not in self.bpf.tracepoint_fds:
                fn = b"tracepoint__" + tp.encode().replace(b":", b"__")
                self.bpf.attach_tracepoint(tp=tp.encode(), fn_name=fn)
        self.program.sys_tracepoints_off()
        self.report.tracepoints = [
            tp for tp in self.report.tracepoints if not tp.startswith("syscalls:")
        ] + self.program.sys_tracepoints_kept

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
            fd = uprobe_multi_link(
                fd_prog, path, offsets, [probes[o] for o in offsets], self.pid, attach_type=TRACE_UPROBE_SESSION
            )
            if fd >= 0:
                self._links.append(fd)
                continue
            why = f"the kernel refused a uprobe session link on {os.path.basename(path)}: {os.strerror(-fd)}"
            if self._links or self.options.uprobe_sessions == "on":
                raise PermissionProblem(f"cannot attach uprobe sessions: {why}")
            self.program.session, self.program.session_why = False, why
            return False
        self.report.returns, self.report.returns_why = "session", ""
        return True

    def _attach_plans(self, plans: list, custom: list, sources: dict[str, int], maps: list) -> None:
        todo: list[tuple] = []  # (path, offset, entry program, returns, cookie)
        if self.program.session and self._attach_sessions(plans, sources):
            plans = []  # the heap functions are probed; the user's functions stay classic below
        elif self.options.sample_bytes > 0:
            self.report.returns, self.report.returns_why = "classic", self.program.session_why
        prog = self.program
        self.report.uprobes, self.report.uprobes_why = ("multi", "") if prog.multi else ("perf", prog.multi_why)
        for pl in plans:
            src = sources.get(pl.allocator.source)
            for pr in pl.probes:
                if self.program.multi:  # one entry program per module, the cookie says which call
                    todo.append((pr.path, pr.offset, "heap_entry", pr.returns, heap_cookie(pr.program, src)))
                    continue
                todo.append((pr.path, pr.offset, pr.program, pr.returns, 0))
                if src is not None:
                    self._addressed.append((pr.path, pr.offset, "probe_src", ct.c_uint32(src)))
        for loc, src, offset in custom:
            fn = loc.fn
            spec = L.Custom(
                source=src,
                size_arg=_arg(fn.size_arg),
                count_arg=_arg(fn.count_arg),
                out_arg=_arg(fn.out_arg),
                ptr_arg=_arg(fn.ptr_arg),
            )
            todo.append((loc.path, offset, "custom_free_enter" if fn.free else "custom_enter", not fn.free, 0))
            self._addressed.append((loc.path, offset, "custom_fns", spec))
        self.update_addresses(maps)
        for path, off, prog, returns, _cookie in todo:
            if returns:  # the same address as the entry probe: one trap for both
                self.add("custom_return" if prog == "custom_enter" else "alloc_return", path, off, BPF_PROBE_RETURN)
        for path, off, prog, _returns, cookie in todo:
            self.add(prog, path, off, BPF_PROBE_ENTRY, cookie)
        failed = self.flush()
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

    def close(self) -> None:
        """Close the uprobe_multi links. Idempotent."""
        links, self._links = self._links, []
        if links:  # every probe of a link at once (one unregistration wait), the links side by side
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            with ThreadPoolExecutor(max_workers=len(links)) as pool:
                list(pool.map(os.close, links))
