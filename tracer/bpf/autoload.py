"""What bcc.BPF's autoload does at the end of a compile, for a module whose programs come as
instructions instead (the prebuilt store, tracer/bpf/prebuilt.py; the cache of programs compiled
on this box, tracer/bpf/program.py cached_bpf): the tracepoint programs and the programs they
tail-call verified (in parallel, with those the recording is known to need), the tail-call tables
filled, the tracepoints attached. Also used after a plain BCC compile (fill_sys_tails)."""

from __future__ import annotations

import ctypes as ct
from collections.abc import Sequence

SYS_TP_PREFIX = b"tracepoint__syscalls__"
SYS_TAILS = (b"sys_unwind", b"sys_keep")  # probes/syscalls.bpf.c: the stack of an mmap or brk exit (DWARF)
WAIT_TAILS = (b"wait_unwind", b"wait_keep")  # probes/waits.bpf.c: the stack of a wait (DWARF, raw sched_switch)


def tail_programs(bcc, funcs) -> list[tuple[bytes, int]]:
    """(program, type) of the tail-called programs `funcs` (names) has: loaded, and their tables
    filled, before the tracepoints attach (fill_sys_tails)."""
    names = {f.decode() if isinstance(f, bytes) else f for f in funcs}
    out = [(n, bcc.BPF.TRACEPOINT) for n in SYS_TAILS if n.decode() in names]
    return out + [(n, bcc.BPF.RAW_TRACEPOINT) for n in WAIT_TAILS if n.decode() in names]


def fill_sys_tails(bcc, bpf) -> None:
    """The programs the mmap and brk exits (syscalls.h sys_handoff) and the raw sched_switch
    (waits.h wait_began) hand a stack to unwind over to."""
    for table_name, names, ptype in (
        (b"sys_tails", SYS_TAILS, bcc.BPF.TRACEPOINT),
        (b"wait_tails", WAIT_TAILS, bcc.BPF.RAW_TRACEPOINT),
    ):
        try:
            table = bpf[table_name]
        except KeyError:
            continue  # --unwind fp (or the classic sched_switch): the programs take the stack themselves
        for i, name in enumerate(names):
            table[ct.c_int(i)] = ct.c_int(bpf.load_func(name, ptype).fd)


def verify_and_attach(bcc, bpf, funcs: dict, preload: Sequence[tuple] = (), skip_sys: bool = False, workers: int = 2):
    """`bpf` (a bcc.BPF whose load_func loads the instructions `funcs`: name -> {"code": ...})
    made ready as BCC's autoload makes a compiled one: its tracepoint programs, their tails and
    the programs of `preload` that `funcs` has verified `workers` at a time, the largest first
    (the verifier runs in the loading thread with the GIL released; a failure here is left for
    the load that needs the program, which raises there); the tail tables filled; the tracepoints
    attached, but under `skip_sys` (--inject) not the mmap family's (attached later, only for the
    calls the agent could not hook)."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    tps = [n.encode() for n in funcs if n.startswith("tracepoint__")]
    raws = [n.encode() for n in funcs if n.startswith("raw_tracepoint__")]
    todo = [(b, bcc.BPF.TRACEPOINT) for b in tps] + [(b, bcc.BPF.RAW_TRACEPOINT) for b in raws]
    todo += tail_programs(bcc, funcs)
    todo += [item for item in preload if item[0].decode() in funcs]
    todo.sort(key=lambda item: -len(funcs[item[0].decode()]["code"]))

    def try_load(item) -> None:
        try:
            bpf.load_func(*item)
        except Exception:  # noqa: BLE001
            pass

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(try_load, todo))
    fill_sys_tails(bcc, bpf)
    for b in tps:
        if skip_sys and b.startswith(SYS_TP_PREFIX):
            continue
        bpf.attach_tracepoint(tp=b[len(b"tracepoint__") :].replace(b"__", b":"), fn_name=b)
    for b in raws:
        bpf.attach_raw_tracepoint(tp=b[len(b"raw_tracepoint__") :], fn_name=b)
