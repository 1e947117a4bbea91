"""The summary of bench/watch_soak_gpu.sh (issue 50's soak): every trace reported, matched with the
incarnations the restart loop started, and the watcher's memory and disk over the soak.

    python3 bench/watch_soak_summary.py --allocscope A --work WORK --out OUT --limit BYTES --cgroup CG

WORK: the soak's work folder (traces/); OUT: where loop.log, samples.tsv and watch.log are, and
where summary.md and reports.json (one line of figures per trace) go. Plain python3 (no pandas):
the GPU box's own interpreter runs it. Exit status 0 when every check holds, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MIB = 1 << 20
GIB = 1 << 30


def size(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.1f} MiB"


def loop_log(path: Path) -> dict[int, dict]:
    """Incarnation number -> {pid, start, end, status} from the restart loop's log."""
    incs: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if f[:1] == ["start"]:
            incs[int(f[1])] = {"n": int(f[1]), "pid": int(f[3]), "start": float(f[4])}
        elif f[:1] == ["end"] and int(f[1]) in incs:
            incs[int(f[1])].update(status=int(f[3]), end=float(f[4]))
    return incs


def samples(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    head = lines[0].split("\t")
    return [dict(zip(head, (float(x or 0) for x in ln.split("\t")))) for ln in lines[1:] if ln.strip()]


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def report(allocscope: str, trace: Path) -> dict:
    """The figures of one trace's `report --format json` that the soak checks."""
    r = subprocess.run([allocscope, "report", str(trace), "--format", "json"], capture_output=True, text=True)
    row: dict = {"trace": trace.name, "bytes": dir_bytes(trace)}
    if r.returncode != 0:
        return row | {"error": (r.stderr.strip().splitlines() or ["?"])[-1], "rc": r.returncode}
    j = json.loads(r.stdout)
    end = j["recording"].get("end") or {}
    oom = end.get("oom") or {}
    tot = j["totals"]
    loc = (j.get("locations") or [{}])[0]
    frames = loc.get("frames") or [{}]
    f0 = frames[0]
    where = f0.get("function") or "?"
    if f0.get("file"):
        where += f" {os.path.basename(str(f0['file']))}:{f0.get('line')}"
    return row | {
        "pid": j["target"]["pid"],
        "complete": j["recording"].get("complete"),
        "reason": end.get("reason") or j["recording"].get("end_reason"),
        "signal": end.get("signal"),
        "scope": oom.get("scope"),
        "cgroup": oom.get("cgroup"),
        "limit_bytes": oom.get("limit_bytes"),
        "told_by": oom.get("told_by"),
        "victim": oom.get("victim"),
        "lost_events": tot.get("lost_events"),
        "losses": tot.get("losses"),
        "peak_live_bytes": tot.get("peak_live_bytes"),
        "hwm_bytes": tot.get("hwm_bytes"),
        "peak_rss_bytes": tot.get("peak_rss_bytes"),
        "duration_s": tot.get("duration_s"),
        "intervals": tot.get("intervals"),
        "top_location": where,
        "top_peak_bytes": loc.get("peak_live_bytes"),
        "finding1": (j.get("findings") or [{}])[0].get("text"),
        "invariants": j["recording"].get("invariants"),
        "integrity": (j.get("integrity") or {}).get("status"),
    }


def flat(values: list[float]) -> tuple[bool, str]:
    """RSS flat: the last third's maximum within 10 % (+16 MiB) of the first third's, past the first
    sample (start-up)."""
    v = values[1:] if len(values) > 3 else values
    k = max(1, len(v) // 3)
    first, last = max(v[:k]), max(v[-k:])
    ok = last <= first * 1.10 + 16 * 1024
    return ok, f"first third max {first / 1024:.1f} MiB, last third max {last / 1024:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocscope", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--limit", required=True, type=int)
    ap.add_argument("--cgroup", required=True)
    ap.add_argument("--minutes", default="?")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    a = ap.parse_args()

    incs = loop_log(a.out / "loop.log")
    smp = samples(a.out / "samples.tsv")
    wlog = (a.out / "watch.log").read_text(errors="replace")
    wrote = re.findall(r"pid (\d+) ([^\n]*?): wrote (\S+)", wlog)
    traces = sorted(p for p in (a.work / "traces").glob("*.allocscope") if p.is_dir())
    with ThreadPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(lambda t: report(a.allocscope, t), traces))
    by_pid = {r["pid"]: r for r in rows if "pid" in r}
    with open(a.out / "reports.json", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    cg_name = os.path.basename(a.cgroup)
    last_n = max(incs) if incs else 0
    bad: list[str] = []
    table = [
        "| # | pid | lived | status | end | scope | cgroup | limit | told by | lost | peak live | RSS hwm "
        "| top location (its peak) | trace |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sorted(incs):
        i = incs[n]
        r = by_pid.get(i["pid"])
        lived = f"{i['end'] - i['start']:.0f} s" if "end" in i else "-"
        status = str(i.get("status", "-"))
        if r is None:
            pruned = any(int(p) == i["pid"] for p, _, _ in wrote)
            table.append(
                f"| {n} | {i['pid']} | {lived} | {status} | " + ("(pruned)" if pruned else "**no trace**") + " |"
            )
            if not pruned:
                bad.append(f"incarnation {n} (pid {i['pid']}) has no trace")
            continue
        if "error" in r:
            table.append(f"| {n} | {i['pid']} | {lived} | {status} | report failed: {r['error']} |")
            bad.append(f"incarnation {n}: report failed ({r['error']})")
            continue
        cg_ok = str(r["cgroup"] or "").endswith(cg_name)
        table.append(
            f"| {n} | {i['pid']} | {lived} | {status} | {r['reason']} | {r['scope'] or '-'} | "
            f"{r['cgroup'] or '-'} | {size(r['limit_bytes'])} | {r['told_by'] or '-'} | {r['lost_events']} | "
            f"{size(r['peak_live_bytes'])} | {size(r['hwm_bytes'])} | {r['top_location']} "
            f"({size(r['top_peak_bytes'])}) | {size(r['bytes'])} |"
        )
        if r["lost_events"] != 0:
            bad.append(f"incarnation {n}: lost_events {r['lost_events']} {r['losses']}")
        if n == last_n and r["reason"] == "killed":
            continue  # SIGKILLed by the soak's end
        if r["reason"] != "oom_killed" or r["scope"] != "cgroup" or not cg_ok or r["limit_bytes"] != a.limit:
            bad.append(
                f"incarnation {n}: end {r['reason']} scope {r['scope']} cgroup {r['cgroup']} limit "
                f"{r['limit_bytes']} (expected oom_killed, cgroup .../{cg_name}, {a.limit})"
            )
    strays = [r for r in rows if r.get("pid") not in {i["pid"] for i in incs.values()}]
    for r in strays:
        bad.append(f"trace {r['trace']} matches no incarnation the loop started")

    ooms = [r for r in rows if r.get("reason") == "oom_killed"]
    above = [r for r in rows if (r.get("peak_live_bytes") or 0) > (r.get("hwm_bytes") or 1 << 62)]
    lost = sum(r.get("lost_events") or 0 for r in rows)
    wrss = [s["watcher_rss_kb"] for s in smp]
    rss_ok, rss_words = flat(wrss) if wrss else (False, "no samples")
    if not rss_ok:
        bad.append(f"the watcher's RSS grew: {rss_words}")
    tbytes = [r["bytes"] for r in rows if "bytes" in r]
    lives = [i["end"] - i["start"] for n, i in incs.items() if "end" in i and n != last_n]
    disk_end = smp[-1]["traces_bytes"] if smp else 0
    every = int(smp[1]["t_s"] - smp[0]["t_s"]) if len(smp) > 1 else "?"
    lines = [
        f"# Watch soak: provingd --bug OOM-killed by a memory cgroup, restarted ({a.minutes} min)",
        "",
        "```",
        (a.out / "box.txt").read_text().rstrip(),
        "```",
        "",
        f"- Incarnations started: **{len(incs)}**; traces written (watch.log): **{len(wrote)}**; on disk at "
        f"the end: {len(traces)}; OOM-killed by the cgroup's limit: **{len(ooms)}**"
        + (f"; lifetimes {min(lives):.0f}-{max(lives):.0f} s (mean {sum(lives) / len(lives):.0f} s)" if lives else ""),
        f"- Lost events, all traces: **{lost}**",
        f"- The watcher's RSS (it and its children, every {every} s): "
        f"first {wrss[0] / 1024:.1f} MiB, last {wrss[-1] / 1024:.1f} MiB, max {max(wrss) / 1024:.1f} MiB; "
        f"{'flat' if rss_ok else 'NOT flat'} ({rss_words}); its CPU {smp[-1]['watcher_cpu_s']:.1f} s over "
        f"{smp[-1]['t_s']:.0f} s"
        if wrss
        else "- no samples",
        f"- Disk: the traces directory {size(disk_end)} at the end ({int(smp[-1]['traces_files']) if smp else 0} "
        f"files); per trace {size(min(tbytes))}-{size(max(tbytes))} (mean {size(sum(tbytes) / len(tbytes))})"
        if tbytes
        else "- Disk: no traces",
        f"- The cgroup's usage, the most sampled: {size(max(s['cgroup_bytes'] for s in smp))} (limit {size(a.limit)})"
        if smp
        else "",
        "",
        "**Checks: " + ("all hold**" if not bad else "FAILED**"),
        "",
        *[f"- {b}" for b in bad],
        "",
        f"Also: the peak live bytes above the RSS high-water mark in {len(above)} of {len(rows)} traces "
        "(issue 50: the default's figures never above the RSS high-water)"
        + (f", by up to {size(max(r['peak_live_bytes'] - r['hwm_bytes'] for r in above))}" if above else "")
        + ".",
        "",
        "## Per incarnation",
        "",
        *table,
        "",
        "Status: the restart loop's `$?` (137 = SIGKILL). The last incarnation is SIGKILLed by the soak's "
        "end (its trace ends `killed`).",
        "",
        "## Finding 1 of each trace",
        "",
        *[f"- pid {r.get('pid')}: {r.get('finding1')}" for r in rows],
        "",
        "## Samples (every row of samples.tsv)",
        "",
        "| t s | watcher RSS MiB | watcher CPU s | traces MiB | files | traces | daemon RSS GiB | cgroup GiB "
        "| incarnations |",
        "|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {s['t_s']:.0f} | {s['watcher_rss_kb'] / 1024:.1f} | {s['watcher_cpu_s']:.1f} | "
            f"{s['traces_bytes'] / MIB:.2f} | {s['traces_files']:.0f} | {s['traces']:.0f} | "
            f"{s['daemon_rss_kb'] / MIB:.2f} | {s['cgroup_bytes'] / GIB:.2f} | {s['incarnations']:.0f} |"
            for s in smp
        ],
        "",
    ]
    text = "\n".join(lines)
    (a.out / "summary.md").write_text(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
