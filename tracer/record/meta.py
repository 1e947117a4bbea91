"""meta.json of a recording: the target, the host, what was probed and how, the limits, the mode,
the unwinder's and the peaks' figures; at the end how it ended (common/tracefile/format.py)."""

from __future__ import annotations

import os
import platform
import time

from common.elf import build_id
from common.tracefile import format as F
from common.version import tool_version

from ..base import layout as L
from ..process import procfs


def trace_meta(rec, complete: bool) -> dict:
    """meta.json of the recording `rec` (a Recorder): written at the start, complete at the end."""
    t, o, rep = rec.target, rec.opts, rec.attach_report
    reader = rec.snapshots.site_reader  # tracer/record/sitechanges.py: how the sites were read
    unwind = {"mode": rec.probes.unwind if rec.probes is not None else o.unwind, "requested": o.unwind}
    if rec.probes is not None and rec.probes.unwind_error:
        unwind["fallback_reason"] = rec.probes.unwind_error
    if rec.unwinder is not None:
        unwind.update(rec.unwinder.meta())
    meta = {
        "format": F.FORMAT,
        "version": F.VERSION,
        "complete": complete,
        "tool": {"name": "allocscope", "version": tool_version()},
        "created": rec.wall0,
        "clock": {"monotonic_ns": rec.t0_ns, "wall_s": rec.wall0},
        "interval_s": o.interval,
        "labels": o.labels,
        "target": {
            "pid": t.pid,
            "comm": t.comm,
            "exe": t.exe,
            "exe_build_id": build_id(t.exe),
            "launched": t.child is not None,
            **({"argv": t.argv or procfs.cmdline(t.pid)} if o.keep_cmdline else {}),
        },
        "host": {"kernel": platform.release(), "hostname": platform.node(), "page_size": os.sysconf("SC_PAGE_SIZE")},
        "probes": {
            "allocator": rep.allocator,
            "allocator_kind": rep.allocator_kind,
            "attached": rep.attached,
            "aliases": rep.aliases,
            "skipped": rep.skipped,
            "tracepoints": rep.tracepoints,
            "raw_tracepoints": rep.raw_tracepoints,
            "placement": rep.placement,
            "cuda": rep.cuda,
            "allocators": rep.allocators,
            "custom": rep.custom,
            "returns": rep.returns,
            "returns_why": rep.returns_why,
            "uprobes": rep.uprobes,
            "uprobes_why": rep.uprobes_why,
            "heap": rep.heap,
            # the kernel's OOM killer's marks (tracer/bpf/oom.py): how they are watched, or why not
            "oom": {"tracepoint": "oom:mark_victim", "watched": rec.ooms.victims is not None, "how": rec.ooms.how},
            **(
                {"inject": rec.injection.report(getattr(rec.probes, "sys_tracepoints_kept", []))}
                if rec.injection is not None
                else {}
            ),
        },
        "sources": {str(k): v for k, v in rec.source_names.items() if k >= L.enum("AS_SRC_DYNAMIC")},
        "limits": {
            "max_live": o.max_live,
            "max_stacks": o.max_stacks,
            "max_sites": o.max_sites,
            "max_regions": o.max_regions,
        },
        "mode": o.mode,
        "sampling": {
            "sample_bytes": o.sample_bytes,
            "fault_sample": o.fault_sample if o.mode == "residency" else 0,
            "fault_duty": o.fault_duty if o.mode == "residency" else 0,  # share of each second the events are open
        },
        "unwind": unwind,
        "python_frames": o.python_frames,  # --no-python-frames: the walk off (docs/python.md)
        "waits": {"wait_min_ns": rec.snapshots.waits.wait_min_ns},
        **({"peaks": rec.peaks.meta()} if rec.peaks is not None else {}),
        **({"census": rec.snapshots.census_info} if rec.snapshots.census_info else {}),
        **({"kept": rec.kept} if rec.kept else {}),
        **({"triggers": rec.triggers} if rec.triggers else {}),
        # the target's forked children, not traced (tracer/record/children.py)
        **({"children": rec.children.meta()} if getattr(rec, "children", None) is not None else {}),
        # the CPython whose frames are in the stacks (tracer/runtimes/python.py, docs/python.md)
        **({"python": rec.python.meta()} if getattr(rec, "python", None) is not None and rec.python.meta() else {}),
        "interval_reads": {"site_changes": reader.capacity if reader.enabled else 0, **reader.stats.as_dict()},
    }
    if complete:
        meta.update(
            {
                "end_reason": rec.end_reason,
                "end": rec.end,
                "intervals": rec.seq,
                "duration_s": (time.monotonic_ns() - rec.t0_ns) / 1e9,
                "target_exit": rec.target_exit,
                "exec_seen": rec.exec_seen,
                "final_snapshot_s": round(rec.final_snapshot_s, 3),
            }
        )
        if rec.bpf_stats:
            meta["bpf_stats"] = rec.bpf_stats  # with sysctl kernel.bpf_stats_enabled=1
    return meta
