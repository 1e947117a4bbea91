"""Soak of `allocscope watch`: a busy daemon restarted every few minutes, watched for a long time.

    sudo .venv/bin/python bench/watch_soak.py                         # 30 minutes
    sudo .venv/bin/python bench/watch_soak.py --minutes 5 --life 60 --out OUT.md

The daemon is the demo's provingd (8 MiB partitions, five a second through its GPU thread, the
pile-up bug on: its memory climbs), started like systemd would (Restart=always, 1 s between):
each incarnation lives --life seconds, then every other one is SIGKILLed and the others get
SIGTERM. `allocscope watch` (its default mode) follows it with --keep and --max-traces small
enough that both act within the run. Every --sample seconds, from outside the watcher: its RSS
and CPU time, the traces directory's bytes and files. At the end: every incarnation has a
complete trace whose end is named (killed or exited), lost events per trace, the disk a day of
this would take (the bytes written per hour of recording, bounded by --keep and --max-traces),
and whether the watcher's RSS stayed flat (its last third against its first third after warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_daemon(out: Path) -> Path:
    exe = out / "provingd"
    subprocess.run(
        ["gcc", "-std=c11", "-O2", "-g", "-pthread", "-o", str(exe), str(ROOT / "demo" / "provingd.c")], check=True
    )
    return exe


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pid: int) -> float:
    """The watcher's and its children's CPU (user + system), in seconds."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def disk(path: Path) -> tuple[int, int]:
    total = files = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
                files += 1
            except OSError:
                pass
    return total, files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--life", type=float, default=180, help="seconds each incarnation lives")
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--keep", default="5m")
    ap.add_argument("--max-traces", type=int, default=6)
    ap.add_argument("--out", help="write the results as markdown here")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="watch-soak-"))
    exe = build_daemon(work)
    traces = work / "traces"
    argv = [str(exe), "--bug", "--pw", "2", "--workers", "8", "--partitions", "1000000"]
    watch = subprocess.Popen(
        [sys.executable, "-m", "allocscope", "watch", "--pgrep", f"^{exe} --bug", "-o", str(traces),
         "--keep", args.keep, "--max-traces", str(args.max_traces)],
        cwd=str(ROOT), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []

    def pump() -> None:
        assert watch.stderr is not None
        for line in watch.stderr:
            lines.append(line)

    import threading

    threading.Thread(target=pump, daemon=True).start()
    while not any("watching" in x for x in lines):
        if watch.poll() is not None:
            print("".join(lines))
            return 1
        time.sleep(0.2)
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    samples, incarnations = [], []
    daemon = None
    born = 0.0
    n = 0
    next_sample = t0
    print(f"{'t_s':>6} {'watch_rss_MiB':>13} {'cpu_s':>7} {'disk_MiB':>9} {'files':>6} {'incarnations':>12}")
    while time.monotonic() < end:
        now = time.monotonic()
        if daemon is None or daemon.poll() is not None:
            if daemon is not None:
                daemon.wait()
            time.sleep(1.0)  # RestartSec=1
            daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            born = time.monotonic()
            incarnations.append({"pid": daemon.pid, "started_s": born - t0})
            n += 1
        elif now - born >= args.life:
            sig = signal.SIGKILL if n % 2 else signal.SIGTERM
            incarnations[-1]["signal"] = sig.name
            daemon.send_signal(sig)
        if now >= next_sample:
            next_sample += args.sample
            d, f = disk(traces)
            s = {
                "t_s": round(now - t0, 1),
                "rss_kb": status_kb(watch.pid, "VmRSS"),
                "cpu_s": cpu_s(watch.pid),
                "disk_bytes": d,
                "files": f,
                "incarnations": n,
            }
            samples.append(s)
            print(
                f"{s['t_s']:>6.0f} {s['rss_kb'] / 1024:>13.1f} {s['cpu_s']:>7.1f} {d / 2**20:>9.1f} {f:>6} {n:>12}",
                flush=True,
            )
        time.sleep(0.2)
    if daemon is not None and daemon.poll() is None:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        incarnations[-1]["signal"] = "SIGKILL"
    time.sleep(3)
    watch.send_signal(signal.SIGINT)
    rc = watch.wait(120)
    time.sleep(0.5)
    wall = time.monotonic() - t0
    # every incarnation: its trace (those rotated out excepted), complete, its end named, its losses
    kept = {}
    for t in traces.glob("*.allocscope"):
        m = json.loads((t / "meta.json").read_text())
        kept[m["target"]["pid"]] = (t, m)
    said = "".join(lines)
    rows = []
    for inc in incarnations:
        pid = inc["pid"]
        traced = f"recording pid {pid} " in said
        ended = next((x for x in lines if f"pid {pid} " in x and "wrote" in x), "")
        row = {**inc, "traced": traced, "end_said": ended.split(":", 2)[1].strip() if ended else ""}
        if pid in kept:
            t, m = kept[pid]
            rep = json.loads(
                subprocess.run(
                    [sys.executable, "-m", "allocscope", "report", str(t), "--format", "json"],
                    cwd=str(ROOT), capture_output=True, text=True, check=True,
                ).stdout
            )  # fmt: skip
            row.update(
                complete=m.get("complete"),
                reason=(m.get("end") or {}).get("reason"),
                lost=rep["totals"]["lost_events"],
                intervals=rep["totals"]["intervals"],
                dropped=(m.get("kept") or {}).get("dropped_intervals", 0),
                bytes=disk(t)[0],
                duration_s=m.get("duration_s"),
            )
        rows.append(row)
    warm = [s for s in samples if s["t_s"] >= 60] or samples
    third = max(1, len(warm) // 3)
    rss_first = sum(s["rss_kb"] for s in warm[:third]) / third
    rss_last = sum(s["rss_kb"] for s in warm[-third:]) / third
    rec_s = sum(r.get("duration_s") or 0 for r in rows if "bytes" in r)
    rec_bytes = sum(r.get("bytes") or 0 for r in rows if "bytes" in r)
    per_hour = rec_bytes / rec_s * 3600 if rec_s else 0
    summary = {
        "minutes": round(wall / 60, 1),
        "watch_exit": rc,
        "incarnations": len(incarnations),
        "traced": sum(r["traced"] for r in rows),
        "traces_kept": len(kept),
        "lost_total": sum(r.get("lost") or 0 for r in rows),
        "rss_first_third_mib": round(rss_first / 1024, 1),
        "rss_last_third_mib": round(rss_last / 1024, 1),
        "rss_max_mib": round(max(s["rss_kb"] for s in samples) / 1024, 1),
        "disk_max_mib": round(max(s["disk_bytes"] for s in samples) / 2**20, 1),
        "files_max": max(s["files"] for s in samples),
        "trace_bytes_per_recorded_hour_mib": round(per_hour / 2**20, 1),
        "watch_cpu_percent": round(100 * samples[-1]["cpu_s"] / wall, 2) if samples else 0,
        "traceback": "Traceback" in said,
    }
    print(json.dumps(summary, indent=1))
    for r in rows:
        print(r)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "incarnations": rows, "samples": samples}, indent=1))
    if args.out:
        md = [
            f"# watch soak, {time.strftime('%Y-%m-%d')}: {summary['minutes']} min, {len(incarnations)} incarnations",
            "",
            "`"
            + " ".join(["bench/watch_soak.py", *sys.argv[1:]])
            + "`, "
            + os.uname().release
            + f", {os.cpu_count()} cores",
            "",
            "| measure | value |",
            "|---|---|",
            *[f"| {k} | {v} |" for k, v in summary.items()],
            "",
            "| pid | started_s | signal | traced | reason | complete | intervals | dropped | lost | MiB |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *[
                f"| {r['pid']} | {r['started_s']:.0f} | {r.get('signal', '-')} | {r['traced']} "
                f"| {r.get('reason', '(rotated out)')} | {r.get('complete', '-')} | {r.get('intervals', '-')} "
                f"| {r.get('dropped', '-')} | {r.get('lost', '-')} "
                f"| {(r.get('bytes') or 0) / 2**20:.1f} |"
                for r in rows
            ],
            "",
            "Samples (t_s, watcher RSS MiB, CPU s, traces MiB, files):",
            "",
            "```",
            *[
                f"{s['t_s']:>6.0f} {s['rss_kb'] / 1024:>7.1f} {s['cpu_s']:>7.1f} "
                f"{s['disk_bytes'] / 2**20:>7.1f} {s['files']:>6}"
                for s in samples
            ],
            "```",
        ]
        Path(args.out).write_text("\n".join(md) + "\n")
    return 0 if rc == 0 and summary["traced"] == len(incarnations) and not summary["traceback"] else 1


if __name__ == "__main__":
    sys.exit(main())
