"""The options of a recording: one dataclass, the one place their defaults are written.

The CLI's `record` and `top` options take their defaults from `DEFAULTS`, and the probes'
compile-time parameters (-DAS_MAX_LIVE=... for probes/allocscope.c, which has no defaults of its
own for them) are derived from it in tracer/bpf/source.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecordOptions:
    output: str = ""  # trace directory; '' writes nothing (`allocscope top` without -o)
    duration: float | None = None  # seconds; None: until a signal or the target's exit
    interval: float = 1.0  # seconds between snapshots
    first_snapshot_s: float | None = None  # the first one this soon after the attach (None: one interval); `top`: 0.2
    labels: dict[str, str] = field(default_factory=dict)
    force: bool = False  # replace an output path that is not an allocscope trace
    keep_cmdline: bool = False  # store the target's command line (it may hold secrets)
    quiet: bool = False
    verbose: bool = False  # print the start-up phases (imports, compile, unwind tables, attach) and their times
    mode: str = "full"  # full: allocator probes; residency: mmap family + sampled faults
    sample_bytes: int = 0  # >0: byte-weighted sampling of allocations, one per N bytes
    fault_sample: int = 16  # residency mode: one user page fault in N is sampled
    fault_duty: float = 0.1  # residency mode: share of each second the page-fault events are open (issue 50)
    uprobes: str = "auto"  # auto/multi/perf: uprobe_multi links (6.6+) or a perf event per probe
    uprobe_sessions: str = "auto"  # sampled: auto/on/off; unsampled calls skip the return trap
    inject: bool = False  # --inject: the in-process sampler (tracer/inject/) decides, only sampled calls trap
    wait_min_ms: float = 1.0  # off-CPU waits at least this long are kept by stack (0: waits not traced)
    python_frames: bool = True  # CPython's frames walked in the probe (tracer/runtimes/python.py, docs/python.md)
    unwind: str = "dwarf"  # dwarf: CFI rows unwound in BPF (tracer/unwind/); fp: frame pointers
    embed_symbols: bool = False  # the symbol tables of the modules on the stacks (tracer/record/embed_symbols.py)
    alloc_fns: list[str] = field(default_factory=list)  # --alloc-fn specs (tracer/allocators/custom.py)
    free_fns: list[str] = field(default_factory=list)  # --free-fn specs
    # kernel map bounds (what the probes can hold; beyond them losses are counted)
    max_live: int = 1 << 20  # outstanding allocations
    max_stacks: int = 1 << 16  # distinct stacks
    max_sites: int = 1 << 18  # distinct (stack, thread, source)
    max_regions: int = 1 << 16  # mmap-family allocations accounted in the kernel
    ring_pages: int = 1024  # ring buffer for the events that reach the tracer (4 MiB)
    unwind_rows: int = 1 << 23  # capacity of the CFI row array (8 bytes a row: 64 MiB; a PyTorch
    #                               process's crossed modules need ~4.2 M, libtorch_cpu alone 2.7 M)
    residency_budget_pages: int = 1 << 18  # pagemap pages read per interval (1 GiB of heap)
    census_budget_s: float = 2.0  # glibc census (tracer/allocators/census.py) at the attach and at the end; 0: none
    # benchmarks only (hidden flags)
    probe_floor: bool = False  # every probe attached, every program returning at once
    rss_tracepoint: bool = False  # RSS kept by a kmem:rss_stat program instead of read when needed
    site_changes: int = 1 << 16  # changed site keys named per interval (probes/changes.h); 0: whole-map reads


def fault_weight(fault_sample: int, fault_duty: float) -> int:
    """Residency mode: the pages one sampled fault stands for (AS_FAULT_SAMPLE): one fault in
    `fault_sample` is sampled while the events are open, and they are open `fault_duty` of the time."""
    return max(1, round(fault_sample / min(1.0, max(fault_duty, 1e-3))))


DEFAULTS = RecordOptions()
INJECT_SAMPLE_BYTES = 512 << 10  # --inject without --sample-bytes samples one per 512 KiB
TOP_INTERVAL = 2.0  # `allocscope top` refreshes every 2 s unless --interval says otherwise
