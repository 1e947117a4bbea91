#!/usr/bin/env python3
"""The agent's unsampled free check (issue 33): plain vs hooked, the agent before vs after a change.

bench/agent_free.c calls glibc's malloc/free directly (plain) or through the hooks of two
versions of tracer/inject/agent/agent.c linked into one program (bench/agent_harness.c; `before`: the
agent at --before, a git revision; `after`: the working tree's), with no tracer: the tables are
mapped and the configuration filled the way tracer/inject/loading.py does it, the sampled calls reach
empty markers (no uprobe: the in-process cost only). One process runs the three modes, a pool
each (no block crosses versions), in turns of --ops ops, so the machine's noise hits them alike.
Patterns:

  churn        a pool of --pool live blocks of mixed sizes, a random one freed and replaced per
               op (the free order unrelated to the allocation order): ns per op (free + malloc)
  churn+work   the same, and the program's own work between ops (--work-lines random lines of a
               --work-kib buffer read per op), which competes with the hooks' tables for L1/L2
  pair         malloc(32) + free in a tight loop (bench/pair.c's): the tables stay cached

Then the false positives of each version's free check against the live sampled blocks: at
sample sizes that leave about 100, 1k, 10k and 100k of them among the pool's blocks, how many
of the pool's live (unsampled, nearly all) blocks pass the first level of the check, and both.

    .venv/bin/python bench/agent_free.py [--before REV] [--rounds 5] [--pool 1000000] [--out FILE]
(no root needed)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from benchlib import perf_by_symbol, write_lines  # noqa: E402

from tracer.inject.agent import AGENT_CODE_CFLAGS  # noqa: E402

CFLAGS = [*AGENT_CODE_CFLAGS, "-c"]  # the tracer's own flags for agent.c
MODES = ("plain", "before", "after")


def build(rev: str, d: Path) -> Path:
    """agent_free with the agent at `rev` (b_*) and the working tree's (a_*)."""
    old = d / "before"
    old.mkdir(parents=True, exist_ok=True)
    for f in ("agent.c", "agent.h"):
        # the agent's folder moved with the tracer's sub-packages (issue 31): older revisions have it here
        src = b""
        for where in ("tracer/inject/agent", "tracer/agent"):
            r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{where}/{f}"], capture_output=True)
            if r.returncode == 0:
                src = r.stdout
                break
        (old / f).write_bytes(src)
    objs = []
    for prefix, inc in (("b_", old), ("a_", ROOT / "tracer" / "inject" / "agent")):
        o = d / f"{prefix}agent.o"
        subprocess.run(["gcc", *CFLAGS, f"-I{inc}", str(HERE / "agent_harness.c"), "-o", str(o)], check=True)
        subprocess.run(["objcopy", f"--prefix-symbols={prefix}", str(o)], check=True)
        objs.append(str(o))
    exe = d / "agent_free"
    subprocess.run(["gcc", "-O2", "-Wall", str(HERE / "agent_free.c"), *objs, "-o", str(exe)], check=True)
    return exe


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def trial(exe: Path, args: list[str]) -> tuple[dict[str, list[float]], dict[str, dict[str, int]]]:
    """One process: (ns per op of each batch, by mode; each hooked mode's levels line)."""
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True).stdout
    ns: dict[str, list[float]] = {}
    levels: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "ns":
            ns.setdefault(w[1], []).append(float(w[3]))
        elif w[0] == "levels":
            levels[w[1]] = {k: int(v) for k, v in zip(w[2::2], w[3::2], strict=True)}
    return ns, levels


def attributed(exe: Path, args: list[str], calls: dict[str, int], freq: int, td: Path) -> dict[str, float]:
    """perf record of one process: CPU ns per call of each hook (its samples / freq / its calls),
    by symbol (b_as_h_free, a_as_h_free, ...; free_sampled, the out-of-line path, with its free)."""
    data = td / "perf.data"
    subprocess.run(
        ["perf", "record", "-q", "-F", str(freq), "-o", str(data), "--", str(exe), *args],
        check=True,
        capture_output=True,
    )
    rep = perf_by_symbol(data)
    samples: dict[str, int] = {}
    for line in rep.splitlines():
        w = line.split()
        if len(w) >= 4 and w[2] == "[.]":
            samples[w[3]] = int(w[1])
    out = {}
    for v in ("b_", "a_"):
        for hook, n in calls.items():
            s = samples.get(f"{v}as_h_{hook}", 0) + (samples.get(f"{v}free_sampled", 0) if hook == "free" else 0)
            out[f"{v}{hook}"] = s / freq * 1e9 / n
            out[f"{v}{hook}_samples"] = s
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default="HEAD", help="git revision of the agent to compare against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pool", type=int, default=1000000)
    ap.add_argument("--ops", type=int, default=100000, help="ops a batch (a mode's turn)")
    ap.add_argument("--batches", type=int, default=30, help="turns of each mode a process")
    ap.add_argument("--work-kib", type=int, default=4096)
    ap.add_argument("--work-lines", type=int, default=4)
    ap.add_argument("--skip-fp", action="store_true", help="no false-positive sweep")
    ap.add_argument("--perf-freq", type=int, default=4999, help="perf record's frequency (0: no attribution)")
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args()
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    with tempfile.TemporaryDirectory() as td:
        exe = build(a.before, Path(td))
        base = ["--pool", str(a.pool), "--ops", str(a.ops), "--batches", str(a.batches)]
        patterns = {
            "churn": ["--pattern", "churn", *base],
            "churn+work": [
                "--pattern",
                "churn",
                *base,
                "--work-kib",
                str(a.work_kib),
                "--work-lines",
                str(a.work_lines),
            ],
            "pair": ["--pattern", "pair", "--ops", "2000000", "--batches", str(max(3, a.batches // 3))],
        }
        say(f"Command: `bench/agent_free.py {' '.join(sys.argv[1:])}`\n")
        say(
            f"Machine: {os.cpu_count()} CPUs, load average at the start {load()}. "
            f"before: the agent at {a.before}; after: the working tree's.\n"
        )
        res: dict[tuple[str, str], list[float]] = {}
        t0 = time.monotonic()
        for _r in range(a.rounds):
            for pat, args in patterns.items():
                ns, _lv = trial(exe, ["--mode", "all", *args])
                for m in MODES:
                    res.setdefault((pat, m), []).extend(ns[m])
        say(
            f"### ns per op: {a.rounds} process(es) a pattern, each running the three modes (a pool each) in "
            f"turns of {a.ops:,} ops x {a.batches}; the median batch (min–max)\n"
        )
        say(
            f"churn: pool of {a.pool:,} live blocks a mode, one op = free a random one + malloc its replacement; "
            f"churn+work: and {a.work_lines} random lines of a {a.work_kib} KiB buffer read per op; "
            "pair: malloc(32) + free (batches of 2,000,000). Default sampling (512 KiB). The hooks are called "
            "through one more direct call than in a patched process (no stub's jump).\n"
        )
        say(
            "| pattern | plain | hooked, before | hooked, after | before over plain | after over plain | "
            "after − before (paired by turn: median) |"
        )
        say("|---|---|---|---|---|---|---|")
        for pat in patterns:
            med = {m: statistics.median(res[(pat, m)]) for m in MODES}
            rng = {m: f"{min(res[(pat, m)]):.1f}–{max(res[(pat, m)]):.1f}" for m in MODES}
            paired = statistics.median(x - y for x, y in zip(res[(pat, "after")], res[(pat, "before")], strict=True))
            say(
                f"| {pat} | {med['plain']:.2f} ({rng['plain']}) | {med['before']:.2f} ({rng['before']}) | "
                f"{med['after']:.2f} ({rng['after']}) | {med['before'] - med['plain']:+.2f} | "
                f"{med['after'] - med['plain']:+.2f} | {paired:+.2f} |"
            )
        if a.perf_freq:
            say("\n### CPU ns per hooked call, attributed by perf (one process a pattern, the three modes in turns)\n")
            say(
                f"perf record -F {a.perf_freq} (cpu-clock) of the process; a hook's samples / frequency / its calls "
                f"(per mode: {2 * a.pool + a.batches * a.ops:,} frees, {3 * a.pool + a.batches * a.ops:,} mallocs, "
                "filling and warm-up included; pair: one of each a pair); free: as_h_free with its out-of-line "
                "path (free_sampled). "
                "The same process, so the same noise, for both versions.\n"
            )
            say(
                "| pattern | free hook, before | free hook, after | malloc hook, before | malloc hook, after | "
                "samples (free b / a) |"
            )
            say("|---|---|---|---|---|---|")
            churned = {"free": 2 * a.pool + a.batches * a.ops, "malloc": 3 * a.pool + a.batches * a.ops}
            paired = {"free": 2000000 * max(3, a.batches // 3), "malloc": 2000000 * max(3, a.batches // 3)}
            for pat in patterns:
                at = attributed(
                    exe, ["--mode", "all", *patterns[pat]], paired if pat == "pair" else churned, a.perf_freq, Path(td)
                )
                say(
                    f"| {pat} | {at['b_free']:.2f} | {at['a_free']:.2f} | {at['b_malloc']:.2f} | "
                    f"{at['a_malloc']:.2f} | {at['b_free_samples']} / {at['a_free_samples']} |"
                )
        if not a.skip_fp:
            say("\n### False positives of the free check vs live sampled blocks\n")
            say(
                f"The pool ({a.pool:,} live blocks, ~450 B mean) after the churn; a block 'passes' a level when "
                "the check reads non-zero there (a sampled block passes both by construction). "
                "before: one level (the bucket's count, hashed pointer); after: the filter (page counts), "
                "then the bucket's count. ns per op: churn, one trial each.\n"
            )
            say(
                "| --sample-bytes | live sampled (before / after) | before: pass | after: pass the filter | "
                "after: pass both | ns/op before | ns/op after |"
            )
            say("|---|---|---|---|---|---|---|")
            for sb in (4 << 20, 512 << 10, 48 << 10, 4096):
                args = ["--pattern", "churn", *base, "--batches", "2", "--sample-bytes", str(sb)]
                nb, lv = trial(exe, ["--mode", "before", *args])
                na, lva = trial(exe, ["--mode", "after", *args])
                lb, la = lv["before"], lva["after"]
                pool = max(1, lb["pool"])
                say(
                    f"| {sb:,} | {lb['live_sampled']:,} / {la['live_sampled']:,} | {lb['first'] / pool:.2%} | "
                    f"{la['first'] / pool:.2%} | {la['both'] / pool:.2%} | {statistics.median(nb['before']):.1f} | "
                    f"{statistics.median(na['after']):.1f} |"
                )
        say(f"\nLoad average at the end: {load()}; {time.monotonic() - t0:.0f} s.")
    write_lines(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
