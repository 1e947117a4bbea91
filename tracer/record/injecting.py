"""--inject in a recording (`rec`: the Recorder): the agent into the target before the probes attach,
the hooks taken back at the end (tracer/inject/)."""

from __future__ import annotations

import ctypes as ct

from common.errors import TargetError


def inject_agent(rec, sources: dict[str, int]):
    """--inject: the agent into the target, its hooks on every allocator entry that takes one
    safely, sampling still off (on once the markers' probes are attached)."""
    from ..bpf.attach import heap_cookie  # noqa: PLC0415
    from ..inject.hooks import hook_specs  # noqa: PLC0415
    from ..inject.injection import inject  # noqa: PLC0415

    cookies = {
        (pl.allocator.path, pr.symbol): heap_cookie(pr.program, sources.get(pl.allocator.source))
        for pl in rec.plans
        for pr in pl.probes
    }
    specs, skipped = hook_specs(rec.plans, cookies)
    quiet = rec.probes.bpf[b"quiet_tid"]

    def hush(tid: int) -> None:  # the thread running our system calls: not the program's mmaps
        quiet[ct.c_int(0)] = ct.c_uint32(tid)

    inj = inject(rec.target.pid, specs, skipped, rec.opts.sample_bytes, hush)
    hooked = {h.spec.symbol for h in inj.hooks}
    if not any(s in hooked for s in ("malloc", "free")) and rec.plans and rec.plans[0].allocator.prefix == "":
        inj.detach()
        raise TargetError(
            "--inject: malloc and free cannot be hooked safely here: "
            + "; ".join(f"{k}: {v}" for k, v in inj.refused.items() if k in ("malloc", "free"))
        )
    if inj.refused:
        rec.progress("--inject: not hooked: " + "; ".join(f"{k} ({v})" for k, v in list(inj.refused.items())[:6]))
    return inj


def uninject(rec) -> None:
    """The hooks out of the target (idempotent); a failure is said, never raised from here."""
    if rec.injection is None or rec.injection.detached:
        return
    try:
        how = rec.injection.detach()
    except Exception as e:  # noqa: BLE001 - the recording is kept; the watchdog still unhooks
        rec.progress(f"--inject: could not take the hooks back ({e}); the agent's watchdog will when allocscope exits")
        return
    if how == "watchdog":
        rec.progress("--inject: the agent's watchdog had already put the entries back")
