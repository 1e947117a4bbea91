"""Whether --inject can work in a process, read only (`doctor --pid`, and before every --inject):
what would stop ptrace, and which entry points the hooks would take."""

from __future__ import annotations

import os
from pathlib import Path

from ..process import procfs
from .agent import InjectError, agent_path, read_agent
from .hooks import hook_specs, plan_hooks, sys_all_or_nothing, sys_lines, sys_specs
from .ptrace import Memory


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
    from ..allocators.discovery import find_allocators, plan_allocator  # noqa: PLC0415

    lines: list[str] = []
    why = ptrace_blocker(pid)
    if why:
        return False, [why]
    seccomp = _status(pid).get("Seccomp", "0")
    if seccomp == "2":
        lines.append(
            "the process runs under a seccomp filter: if it forbids mmap, pidfd_open or clone, "
            "--inject stops with the call refused (nothing left in the process)"
        )
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
