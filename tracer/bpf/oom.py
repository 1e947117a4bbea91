"""The OOM killer's victims as the kernel marks them (probes/oom.bpf.c on oom:mark_victim), beside a
recording: whether the target's SIGKILL was an OOM kill, from the kernel's own mark rather than a
cgroup's counters, and the target's memory at that moment (dmesg's "Killed process" figures).

Loaded from the prebuilt store (no compile, milliseconds); where the store cannot serve this
kernel's tracepoint format, compiled here by BCC; where neither can be done, not watched: the
recording tells an OOM kill from the memory cgroups' counters alone (tracer/process/ending.py).
The recorder loads it in a thread of its own from its start (tracer/record/recorder.py): from the
store it is attached long before the probes go live; a compile waits until they are, so that it
never delays them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..base.layout import PROBES_DIR
from . import bcc_lean, prebuilt

KB = 1024
TRACEPOINT = "oom:mark_victim"


@dataclass
class OomVictims:
    """The loaded program (`bpf`) and what it holds since `since_ns` (CLOCK_MONOTONIC)."""

    bpf: object
    how: str  # "prebuilt", or "compiled here (why the store could not serve)"
    memory: bool  # the tracepoint gives the victim's memory (a newer kernel's format)
    since_ns: int  # CLOCK_MONOTONIC before the load: older marks are of other processes
    attached_ns: int  # CLOCK_MONOTONIC once attached: watched from then on

    def victim(self, pids: Iterable[int], t0_ns: int) -> dict | None:
        """The mark of one of `pids` (the target's pid and its threads': the kernel may name a
        thread) since the program was loaded, as `recording.end.oom.victim`: its pid, `time`
        (seconds after `t0_ns`, when the probes went live) and, where the kernel gives them, its
        memory at the kill in bytes; None when the OOM killer chose none of them."""
        want = set(pids)
        table = self.bpf["oom_victims"]  # type: ignore[index]
        found = None
        for k, v in table.items():
            pid = int(k.value)
            if pid in want and v.ts_ns >= self.since_ns and (found is None or v.ts_ns > found[1].ts_ns):
                found = (pid, v)
        if found is None:
            return None
        pid, v = found
        out: dict = {"pid": pid, "time": round((int(v.ts_ns) - t0_ns) / 1e9, 3)}
        if self.memory:
            out |= {
                "anon_rss_bytes": int(v.anon_rss_kb) * KB,
                "file_rss_bytes": int(v.file_rss_kb) * KB,
                "shmem_rss_bytes": int(v.shmem_rss_kb) * KB,
                "total_vm_bytes": int(v.total_vm_kb) * KB,
                "pgtables_bytes": int(v.pgtables_kb) * KB,
                "oom_score_adj": int(v.oom_score_adj),
                "uid": int(v.uid),
            }
        return out

    def close(self) -> None:
        self.bpf.cleanup()  # type: ignore[attr-defined]


def memory_fields() -> bool | None:
    """Whether this kernel's oom:mark_victim carries the victim's memory (None: no such tracepoint
    in tracefs)."""
    fields = prebuilt.tracepoint_fields("oom", "mark_victim")
    return None if fields is None else "anon_rss" in fields


def open_victims(may_compile: Callable[[], bool] = lambda: True) -> tuple[OomVictims | None, str]:
    """The OOM victims' program loaded and attached: (it, how), or (None, why not). Never raises:
    without it an OOM kill is still told by the cgroups' counters. A compile waits for
    `may_compile` (the recorder's probes are compiled by BCC too: never two at once)."""
    since = time.monotonic_ns()
    memory = memory_fields()
    if memory is None:
        return None, f"no {TRACEPOINT} tracepoint in tracefs"
    try:
        import bcc  # noqa: PLC0415
    except ImportError as e:
        return None, f"BCC's Python module is missing ({e})"
    try:
        try:
            bpf = prebuilt.load_apart(bcc, "oom", "OOM victims' program")
            how = "prebuilt"
        except prebuilt.NotPrebuilt as e:
            if not may_compile():
                return None, f"{TRACEPOINT} not watched: the recording ended first"
            with bcc_lean.BUILDING:  # never beside another build (watch: several recordings at once)
                bpf = bcc.BPF(text=(PROBES_DIR / "oom.bpf.c").read_text(), cflags=["-DAS_OOM_RSS"] if memory else [])
            how = f"compiled here ({e})"
    except Exception as e:  # noqa: BLE001 - BCC raises plain Exception on a failed compile or load
        return None, f"{TRACEPOINT} not watched: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}"
    return OomVictims(bpf, how, memory, since, time.monotonic_ns()), how
