"""Options shared by several commands (record and top; report, diff and top): declared once
here. Defaults come from tracer.base.options.DEFAULTS, the one place they are written. No heavy
imports: `--help` stays instant."""

from __future__ import annotations

import math

import click

from tracer.base.options import DEFAULTS

FOLD_HELP = (
    "Also fold these functions out of sites, like the built-in wrappers (zmalloc*, "
    "PyObject_Malloc, g_malloc*, CRYPTO_malloc, xmalloc...): the site starts at the frame "
    "that called them. FUNC is an exact function name, or a glob when it holds * ? or [...] "
    "(e.g. 'pool_*'); C++ names include their parameters ('Pool::get*'). Repeatable; commas "
    "inside <> () [] belong to the name."
)


BY_HELP = (
    "What a row is: location = the place in the code that asked for memory (the innermost frame "
    "after folding wrappers: function, file:line), every stack that reaches it summed under it; "
    "function = the lines of one function merged; stack = one row per distinct call stack (the "
    "per-stack view: how the place was reached)."
)


def by_option(f):
    """--by location|function|stack: what a row of a people-facing table is."""
    return click.option(
        "--by",
        "by",
        type=click.Choice(["location", "function", "stack"]),
        default="location",
        show_default=True,
        help=BY_HELP,
    )(f)


def fold_option(f):
    """--fold FUNC[,FUNC] (repeatable): the raw values, for reports.analysis.parse_fold."""
    return click.option("--fold", "fold", multiple=True, metavar="FUNC[,FUNC]", help=FOLD_HELP)(f)


def target_options(f):
    """--pid / --pgrep / -- CMD: which process (resolved by tracer.process.target)."""
    for opt in reversed(
        [
            click.option("--pid", "-p", type=int, help="Attach to this running process."),
            click.option(
                "--pgrep",
                "pattern",
                metavar="PATTERN",
                help="Attach to the one process whose full command line matches PATTERN (regex, like pgrep -f).",
            ),
            click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD [ARGS...]]"),
        ]
    ):
        f = opt(f)
    return f


class Seconds(click.ParamType):
    """A number of seconds >= 0, finite (click's FloatRange takes nan and inf)."""

    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            secs = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(secs) or secs < 0:
            self.fail(f"{value!r} is not a number of seconds >= 0", param, ctx)
        return secs


SECONDS = Seconds()


def grace_option(f):
    """--grace SECONDS: how long a launched program still running when the recording stops has
    between SIGTERM and SIGKILL (tracer/process/launch.py)."""
    from tracer.process.launch import GRACE_S  # noqa: PLC0415 (light: no third-party import)

    return click.option(
        "--grace",
        type=SECONDS,
        default=GRACE_S,
        show_default=True,
        metavar="SECONDS",
        help="-- CMD: a program still running when the recording stops (--duration, Ctrl-C, SIGTERM) gets "
        "SIGTERM (its process group, unless at a terminal), then SIGKILL after this many seconds if it "
        "is still running, said on stderr. allocscope exits with the program's status.",
    )(f)


def trace_options(f):
    """Where and how a recording writes its trace: -o (optional here; `record` requires it),
    --label, --force, --keep-cmdline, --embed-symbols."""
    for opt in reversed(
        [
            click.option(
                "-o",
                "--output",
                "output",
                required=False,
                metavar="TRACE",
                help="Trace directory to write (an existing trace there is kept as TRACE.old).",
            ),
            click.option(
                "--label",
                "labels",
                multiple=True,
                metavar="KEY=VALUE",
                help="Tag the trace (e.g. --label pw=12); shown in reports, used by diff. Repeatable.",
            ),
            click.option("--force", is_flag=True, help="Replace TRACE even when it is not an allocscope trace."),
            click.option(
                "--keep-cmdline", is_flag=True, help="Store the target's command line (off: it may hold secrets)."
            ),
            click.option(
                "--embed-symbols",
                is_flag=True,
                help="Store the symbol tables of the modules on the stacks in the trace, so it can be "
                "symbolized on a machine without these binaries.",
            ),
        ]
    ):
        f = opt(f)
    return f


def probe_options(f=None, *, interval: float = DEFAULTS.interval):
    """How to probe: the options of a recording the probes are built from (RecordOptions).
    `@probe_options`, or `@probe_options(interval=...)` for a command whose snapshot period
    defaults to something else (`top`)."""
    if f is None:
        return lambda g: probe_options(g, interval=interval)
    for opt in reversed(
        [
            click.option(
                "--interval",
                type=float,
                default=interval,
                show_default=True,
                metavar="SECONDS",
                help="Snapshot period: RSS, live bytes, per-site and per-thread counters.",
            ),
            click.option(
                "--max-live",
                type=int,
                default=DEFAULTS.max_live,
                show_default=True,
                help="Outstanding allocations tracked in the kernel; beyond it allocations are counted as lost.",
            ),
            click.option(
                "--unwind",
                type=click.Choice(["dwarf", "fp"]),
                default=DEFAULTS.unwind,
                show_default=True,
                help="How stacks are walked: dwarf unwinds with the modules' .eh_frame/.debug_frame in "
                "the kernel (complete stacks without frame pointers; tables cached per build ID); fp "
                "follows frame pointers only (cheaper, short stacks on release builds).",
            ),
            click.option(
                "--mode",
                type=click.Choice(["full", "residency"]),
                default=DEFAULTS.mode,
                show_default=True,
                help="full: every allocator call (exact bytes per site and thread). residency: no "
                "allocator probes at all — the mmap family plus sampled first-touch page faults, "
                "for daemons whose memory is huge buffers; near-zero cost, but no frees of heap "
                "blocks, no per-block sizes.",
            ),
            click.option(
                "--sample-bytes",
                type=click.IntRange(min=0),
                default=DEFAULTS.sample_bytes,
                metavar="N",
                help="Sample allocations in proportion to size, one per N bytes on average (like "
                "jemalloc/tcmalloc heap profiles); reports show estimates with error bars. 0: off.",
            ),
            click.option(
                "--uprobes",
                type=click.Choice(["auto", "multi", "perf"]),
                default=DEFAULTS.uprobes,
                show_default=True,
                help="How the allocator probes are attached: multi: uprobe_multi links (kernel 6.6+), one per "
                "module, detached at once (a perf event per probe waits ~0.1 s each at exit); perf: a "
                "perf event per probe (older kernels); auto: multi where the kernel has it.",
            ),
            click.option(
                "--uprobe-sessions",
                type=click.Choice(["auto", "on", "off"]),
                default=DEFAULTS.uprobe_sessions,
                show_default=True,
                help="With --sample-bytes: probe the heap functions through uprobe sessions (kernel "
                "6.13+), so an unsampled call takes no return trap — one trap instead of two. "
                "auto: where the kernel has them, else classic return probes; on: fail without "
                "them; off: classic return probes.",
            ),
            click.option(
                "--inject",
                is_flag=True,
                help="Sample inside the process: stop its threads for a few ms with ptrace, map "
                "allocscope's agent into it and hook its allocator entry points, so that only "
                "sampled calls (one per --sample-bytes, default 512 KiB) trap; the hooks come out "
                "again at the end, or by themselves within ~1 s if allocscope dies. For "
                "heap-heavy daemons; --pid only. Without it nothing enters the process. README: "
                "--inject (what it does, its cost, its risks).",
            ),
            click.option(
                "--fault-sample",
                type=click.IntRange(min=1),
                default=DEFAULTS.fault_sample,
                show_default=True,
                metavar="N",
                help="Residency mode: sample one user page fault in N.",
            ),
            click.option(
                "--fault-duty",
                type=click.FloatRange(min=0.01, max=1.0),
                default=DEFAULTS.fault_duty,
                show_default=True,
                metavar="F",
                help="Residency mode: the page-fault events are open this share of each second "
                "(random phase), each sample standing for N/F pages; 1: always open (costs a "
                "fault-bound daemon ~4 %, docs/probe-cost.md).",
            ),
            click.option(
                "--wait-min",
                "wait_min_ms",
                type=click.FloatRange(min=0),
                default=DEFAULTS.wait_min_ms,
                show_default=True,
                metavar="MS",
                help="Off-CPU waits of the target's threads (sched_switch) at least this many ms long "
                "are kept by user stack and thread, so reports can show who holds memory while "
                'blocked ("Held while waiting"); shorter ones are only counted. 0: waits are '
                "not traced.",
            ),
            click.option(
                "--python-frames/--no-python-frames",
                "python_frames",
                default=DEFAULTS.python_frames,
                show_default=True,
                help="Walk CPython's interpreter frames (3.11-3.13) in the probe at each allocation of a "
                "Python thread, so the report names Python lines (docs/python.md). --no-python-frames: "
                "native frames only, without the walk's ~160 ns a frame; `report --no-python` instead "
                "keeps the frames and ranks by native place.",
            ),
            click.option(
                "--alloc-fn",
                "alloc_fns",
                multiple=True,
                metavar="SPEC",
                help="Also probe your own allocation function (a pool, a slab cache). SPEC is "
                "SYMBOL[@MODULE]:size=argN (returns the pointer, like malloc), "
                "SYMBOL[@MODULE]:size=argN,out=argM (stores it at *argM, returns 0 on success, "
                "like posix_memalign) or SYMBOL[@MODULE]:count=argN,size=argM (calloc-like); arg0 "
                "is the first argument. Its sites' source is custom:SYMBOL, kept out of the "
                "heap/mmap totals. Repeatable.",
            ),
            click.option(
                "--free-fn",
                "free_fns",
                multiple=True,
                metavar="SPEC",
                help="Your own free function: SYMBOL[@MODULE]:ptr=argN. Repeatable.",
            ),
            click.option(
                "--verbose",
                is_flag=True,
                help="Print each start-up phase (imports, symbol scans, compiling the probes, unwind "
                "tables, attaching) and how long it took.",
            ),
            click.option(
                "--probe-floor",
                is_flag=True,
                hidden=True,
                help="Benchmarks: attach every probe, but every program returns at once (the trap floor).",
            ),
            click.option(
                "--rss-tracepoint",
                is_flag=True,
                hidden=True,
                help="Benchmarks: keep the RSS counter with the kmem:rss_stat tracepoint instead of reading it.",
            ),
            click.option(
                "--site-changes",
                type=click.IntRange(min=0),
                default=DEFAULTS.site_changes,
                hidden=True,
                help="Tests and benchmarks: changed sites named per interval before a whole-map read "
                "(tracer/record/sitechanges.py); 0: the whole map every interval.",
            ),
        ]
    ):
        f = opt(f)
    return f


def source_option(f):
    """--source SRC[,SRC] (repeatable): the raw values, for reports.analysis.parse_sources."""
    return click.option(
        "--source",
        "sources",
        multiple=True,
        metavar="SRC[,SRC]",
        help="Only the sites of these sources: heap (the allocator serving malloc), "
        "heap:KIND[:PREFIX] (another allocator, e.g. heap:jemalloc:_rjem_), mmap, brk, "
        "shmem, cuda-pinned, cuda-managed, cuda-device, device, custom:SYMBOL (--alloc-fn); "
        "globs allowed ('heap*', 'custom:*'). Totals stay the whole process's. "
        "Repeatable.",
    )(f)


def metrics_options(f):
    """--metrics HOST:PORT and --metrics-top K: the recording's figures for Prometheus
    (reports/live/prometheus.py, docs/fleet.md)."""
    for opt in reversed(
        [
            click.option(
                "--metrics",
                "metrics",
                metavar="HOST:PORT",
                help="Serve the recording's figures to Prometheus on http://HOST:PORT/metrics (RSS, live "
                "bytes by source and allocator, the top locations, held while waiting, losses, how "
                "the target ended); every series carries the --label pairs. Use 127.0.0.1 unless "
                "the scraper is elsewhere. docs/fleet.md.",
            ),
            click.option(
                "--metrics-top",
                "metrics_top",
                type=click.IntRange(min=1, max=1000),
                default=10,
                show_default=True,
                metavar="K",
                help="With --metrics: series for the K locations with most live bytes and the K waits "
                "holding most (the label set stays bounded).",
            ),
        ]
    ):
        f = opt(f)
    return f
