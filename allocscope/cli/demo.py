"""`allocscope demo`: the proving-daemon incident, found in about two minutes.

Builds demo/provingd, shows a few seconds of `allocscope top --batch` on the buggy daemon,
records it three times — the buggy daemon at two pw settings and the
fixed one at the larger — then prints the report of the buggy run at the larger setting (the
daemon exits and frees its partitions, so the report leads with the sites that held the peak:
synthesize_partition first) and the diff that points at the pile-up, writes the report page and
the diff page, and ends with the findings (reports/analysis/findings.py) of the three reports and the
diff: its conclusions are the tool's, not its own. Every file goes to one directory, named at
the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

from common.errors import AllocscopeError, OutputError

from .base import CONTEXT, Command

ROOT = Path(__file__).resolve().parents[2]  # the folder holding allocscope/ and demo/
DEMO_SRC = ROOT / "demo" / "provingd.c"
SYNTH_SITE = "synthesize_partition"
WAIT_SITE = "channel_push"  # where the bug's workers block, each holding its partition
PREVIEW_PARTITIONS = 25  # the `top --batch` preview: about 5 s of the buggy daemon...
PREVIEW_INTERVAL = 1.0  # ...a block a second


def build_daemon(out: Path) -> Path:
    if not DEMO_SRC.exists():
        raise AllocscopeError(f"demo source missing: {DEMO_SRC}")
    exe = out / "provingd"
    cmd = ["gcc", "-std=c11", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(exe), str(DEMO_SRC)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise AllocscopeError(f"cannot build the demo daemon: {p.stderr.strip().splitlines()[-1:]}")
    return exe


def record_run(exe: Path, out: Path, pw: int, bug: bool, partitions: int, say) -> Path:
    from tracer.base.options import RecordOptions  # noqa: PLC0415
    from tracer.process.target import target_from_command  # noqa: PLC0415
    from tracer.record import recorder as rec  # noqa: PLC0415

    name = f"{'bug' if bug else 'fixed'}-pw{pw}.allocscope"
    trace = out / name
    argv = [str(exe), "--pw", str(pw), "--partitions", str(partitions)] + (["--bug"] if bug else [])
    say(f"recording {' '.join(argv[1:])} -> {trace}")
    argv += ["--summary", str(summary_path(trace))]  # the daemon's own counters, for the answer
    opts = RecordOptions(
        output=str(trace), interval=0.5, labels={"pw": str(pw), "variant": "bug" if bug else "fixed"}, quiet=True
    )
    rec.validate(opts)
    target = target_from_command(argv)
    t0 = time.monotonic()
    s = rec.record(target, opts)
    say(f"  {s.intervals} intervals in {time.monotonic() - t0:.0f}s, lost {s.lost}")
    return trace


def summary_path(trace: Path) -> Path:
    return trace.with_suffix(".summary")


def daemon_counters(trace: Path) -> dict[str, int]:
    """The daemon's own peaks from its summary line (provingd --summary): peak_live (partitions),
    peak_waiting (finished partitions waiting for the channel); {} when it wrote none."""
    import re  # noqa: PLC0415

    try:
        line = summary_path(trace).read_text()
    except OSError:
        return {}
    out = {}
    for key, rx in (
        ("peak_live", r"peak live partitions (\d+)"),
        ("peak_waiting", r"peak waiting for the channel (\d+)"),
    ):
        m = re.search(rx, line)
        if m:
            out[key] = int(m[1])
    return out


def waiting_answer(trace, where: str, what: str, waits: dict | None = None) -> dict:
    """At the snapshot where the threads blocked in `where` held most (reports/analysis/waits.py,
    `location_peaks`): how many, the bytes they held and those allocated at `what`; the most
    threads blocked in `where` at any snapshot; the leading location of the overall peak.
    `waits`: the report's `waits` when it was built already (else computed here)."""
    from reports.analysis.stacks import symbolize_stacks  # noqa: PLC0415
    from reports.analysis.waits import held_while_waiting  # noqa: PLC0415

    w = waits if waits is not None else held_while_waiting(trace, symbolize_stacks(trace))
    pk = w.get("peak") or {}
    loc = next((d for d in w.get("location_peaks") or [] if d["function"] == where), None)  # at its own peak
    held = [h for h in (loc or {}).get("held") or [] if h["function"] == what]
    keys = {d["location"] for d in w.get("off_cpu") or [] if d["function"] == where} | (
        {loc["location"]} if loc else set()
    )
    most = max(
        (sum(v["threads"] for k, v in t["by_location"].items() if k in keys) for t in w.get("timeline") or []),
        default=0,
    )
    return {
        "threads": loc["threads"] if loc else 0,
        "held_bytes": loc["held_bytes"] if loc else 0,
        "what_bytes": sum(h["bytes"] for h in held),
        "what_blocks": sum(h["blocks"] for h in held),
        "elapsed_s": (loc or {}).get("elapsed_s"),
        "max_threads": most,
        "lead": (pk.get("by_location") or [{}])[0],
    }


class Tee:
    """Writes to stdout and keeps what it wrote."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text
        sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


def top_preview(exe: Path, pw: int, partitions: int, say) -> str:
    """A few seconds of `allocscope top --batch` on the buggy daemon, launched, proving
    `partitions` partitions and exiting: what a person watching it live sees. Returns the text."""
    from tracer.base.options import RecordOptions  # noqa: PLC0415
    from tracer.process.target import target_from_command  # noqa: PLC0415
    from tracer.record.signals import StopRequest  # noqa: PLC0415

    from .observers import record_batch  # noqa: PLC0415

    argv = [str(exe), "--pw", str(pw), "--partitions", str(partitions), "--bug"]
    say(
        f"watching it live first: allocscope top --batch --interval {PREVIEW_INTERVAL:g} --top 4 -- provingd "
        f"{' '.join(argv[1:])}"
    )
    out, stop = Tee(), StopRequest(quiet=True).install()
    try:
        record_batch(
            target_from_command(argv),
            RecordOptions(interval=PREVIEW_INTERVAL, quiet=True),
            stop,
            out,
            None,
            "live",
            4,
            None,
        )
    finally:
        stop.restore()
    return out.text


def site_peak(report: dict, function: str) -> int:
    """The peak live bytes of the report's locations in `function`."""
    return int(sum(r["peak_live_bytes"] for r in report["locations"] if r["function"] == function))


def findings_lines(findings: list[dict], indent: str = "  ") -> list[str]:
    """The findings (reports/analysis/findings.py) as the demo prints them: numbered, with their table."""
    return [f"{indent}{i}. {f['text']}  [{f['table']}]" for i, f in enumerate(findings, 1)]


def run_demo(out: Path, pw_a: int, pw_b: int, partitions: int, partition_mb: int = 8) -> dict:
    from reports.analysis import build_report  # noqa: PLC0415
    from reports.analysis.diff import diff_document, summarize  # noqa: PLC0415
    from reports.render.diff_text import diff_to_text  # noqa: PLC0415
    from reports.render.html import to_html  # noqa: PLC0415
    from reports.render.html_diff import to_diff_html  # noqa: PLC0415
    from reports.render.text import to_text  # noqa: PLC0415
    from reports.trace import load_trace  # noqa: PLC0415
    from tracer.doctor import require_root  # noqa: PLC0415

    def say(msg: str) -> None:
        click.echo(f"demo: {msg}", err=True)

    require_root("demo")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".allocscope-demo-write-test"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise OutputError(f"cannot write into --out {out}: {e.strerror or e}") from None
    exe = build_daemon(out)
    say(f"built {exe}")
    top_text = top_preview(exe, pw_b, PREVIEW_PARTITIONS, say)
    bug_a = record_run(exe, out, pw_a, True, partitions, say)
    bug_b = record_run(exe, out, pw_b, True, partitions, say)
    fixed_b = record_run(exe, out, pw_b, False, partitions, say)

    ta, tb, tf = (load_trace(str(p)) for p in (bug_a, bug_b, fixed_b))
    side_a, side_b = summarize(ta), summarize(tb)
    reps = {"bug_a": build_report(ta), "bug_b": build_report(tb), "fixed_b": build_report(tf)}
    rep_b = reps["bug_b"]
    diff = diff_document(side_a, side_b, per="pw")
    report_text = to_text(rep_b, top=6)
    click.echo(report_text)
    click.echo(diff_to_text(diff, top=6))
    html_path = out / f"bug-pw{pw_b}.html"
    html_path.write_text(to_html(tb, rep_b, diff))
    diff_path = out / f"diff-pw{pw_a}-pw{pw_b}.html"
    diff_path.write_text(to_diff_html(ta, tb, diff, stacks_a=side_a.stacks, stacks_b=side_b.stacks))
    # The conclusions, as the reports and the diff state them (reports/analysis/findings.py).
    runs = {
        "bug_a": (f"bug pw={pw_a}", bug_a),
        "bug_b": (f"bug pw={pw_b}", bug_b),
        "fixed_b": (f"fixed pw={pw_b}", fixed_b),
    }
    for key, rep in reps.items():
        name, path = runs[key]
        click.echo(f"demo: findings of the report of {name} (allocscope report {path.name}):")
        click.echo("\n".join(findings_lines(rep["findings"])))
    click.echo(f"demo: findings of the diff (allocscope diff {bug_a.name} {bug_b.name} --per pw):")
    click.echo("\n".join(findings_lines(diff["findings"])))
    peaks = {k: site_peak(rep, SYNTH_SITE) for k, rep in reps.items()}
    wait_bug = waiting_answer(tb, WAIT_SITE, SYNTH_SITE, rep_b["waits"])  # for the tests' cross-checks
    wait_fixed = waiting_answer(tf, WAIT_SITE, SYNTH_SITE, reps["fixed_b"]["waits"])
    own = daemon_counters(bug_b)
    if "peak_waiting" in own:
        click.echo(
            f"demo: the daemon's own count of finished partitions waiting for the channel, bug pw={pw_b}: "
            f"at most {own['peak_waiting']}"
        )
    click.echo(
        f"demo: files in {out}: {bug_a.name}, {bug_b.name}, {fixed_b.name}; the report page {html_path.name}, "
        f"the diff page {diff_path.name}"
    )
    click.echo(f"demo: try  allocscope diff {bug_a} {bug_b} --per pw --format html -o diff.html")
    return {
        "traces": [bug_a, bug_b, fixed_b],
        "html": html_path,
        "diff_html": diff_path,
        "diff": diff,
        "peaks": peaks,
        "reports": reps,
        "waits": {"bug": wait_bug, "fixed": wait_fixed, "daemon_bug": own, "daemon_fixed": daemon_counters(fixed_b)},
        "report": rep_b,
        "report_text": report_text,
        "top_text": top_text,
    }


@click.command(cls=Command, context_settings=CONTEXT)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="demo-out",
    show_default=True,
    help="Directory for the daemon, the traces, the report page and the diff page.",
)
@click.option("--pw-a", type=click.IntRange(1, 12), default=2, show_default=True, help="Smaller pw setting.")
@click.option("--pw-b", type=click.IntRange(1, 12), default=3, show_default=True, help="Larger pw setting.")
@click.option(
    "--partitions",
    type=click.IntRange(10, 1000),
    default=50,
    show_default=True,
    help="Partitions each run proves (about 0.2 s each).",
)
def demo(out, pw_a, pw_b, partitions):
    """Reproduce and find the proving-daemon pile-up (root; about two minutes).

    The bundled daemon (demo/provingd.c) has partition workers that synthesize 8 MiB
    partitions under a semaphore of --pw permits and hand them to one "gpu" thread through a
    single-slot channel; with --bug the permit is released before the hand-off, so finished
    partitions pile up. The demo records the buggy daemon at pw-a and pw-b and the fixed one
    at pw-b, then shows the report and the diff that puts synthesize_partition first, writes
    the report page and the diff page, and ends with the findings of the reports and the diff.
    """
    if pw_a >= pw_b:
        raise click.UsageError("--pw-a must be smaller than --pw-b")
    run_demo(Path(out).resolve(), pw_a, pw_b, partitions)
