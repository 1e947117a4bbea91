#!/usr/bin/env python3
"""What `allocscope watch` with its defaults costs, by paired blocks (issue 50).

Whole-run trials on this 2-core VM spread by tens of per cent (2.0-4.2 s untraced for the same
work), so no figure of a few per cent can come out of them, interleaved or not. Here two copies of
the workload run side by side as long-lived processes: A (a binary of its own name, the only one
`allocscope watch --pgrep` matches) and B (a copy under another name and inode, never traced). The
controller gives them the SAME block of work in turn, one working at a time, in ABBA order, so the
box's drift hits the two halves of each adjacent pair alike. Cost = median over the pairs of
(A block / B block), with a bootstrap interval and min-max; the same for the CPU of the work.

  control  no watch at all: A and B both untraced. Its ratio must be ~1.00x; its spread is what
           the method can resolve on this box. Run first.
  watch    `allocscope watch --pgrep '^PATH_OF_A( |$)'` with its defaults, attached and idle before
           the first measured block; then the same with B traced and A not (--no-swap: not). The
           geometric mean of the two phases' medians cancels a difference between the copies
           (the controls show one of ~1.5 % on brief), printed with its interval and whether
           <= 1.02x is met, not met, or not resolved.

Biases, printed with the figures: programs the watch attaches box-wide (syscall tracepoints,
sched_switch, tlb_flush, sched_process_*, task_newtask) run for B's work too, returning at once for
another process — their runs and run time (kernel.bpf_stats_enabled) are summed per arm, the B
arm's share is time the untraced blocks carried; page-fault perf events that exist anywhere put
every fault of the box through the software-event lookup, A's and B's alike; the watch's own CPU
lands in whichever arm runs while it works, so it is printed apart, as a share of one core.

Workloads: brief (bench/brief_shape.c --blocks: 2 threads each mallocing 40 MiB buffers glibc maps,
every page touched, 2 kept; a block = --block-iters iterations per thread), redis (two
redis-server on 127.0.0.1, B a copied binary; a block = one redis-benchmark run against one of
them) and demo (demo/provingd.c unpaced, both running for good but SIGSTOPped except in their
block of --demo-window s; its work counted in page faults).

    sudo .venv/bin/python bench/paired.py [--workload brief|redis|demo|all] [--pairs 60]
        [--quick] [--watch-args '--wait-min 0'] [--no-swap] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (
    REDIS_LOAD,
    TrialError,
    children_of,
    first_interval,
    free_port,
    read_line,
    redis_server_cmd,
    sched_cpu,
    stop_process,
    wait_redis,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tracer.bpf.objects import PROG_GET_FD_BY_ID, IdAttr, bpf, fdinfo_texts, obj_info, prog_stats, tracer_objects  # noqa: E402

OUT: list[str] = []
Z = [0, 0, 0]  # a program's [run_time_ns, run_cnt, programs] where it did not run


def say(line: str = "") -> None:
    print(line, flush=True)
    OUT.append(line)


def set_nice(value: int):
    return lambda: os.setpriority(os.PRIO_PROCESS, 0, value)


def proc_minflt(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


# ---------------------------------------------------------------------------------------------
# the two copies of a workload


class Arm:
    """One long-lived copy: block() runs one block of work, returns (wall s, CPU s, faults, real wall s);
    the first two are the compared figures (the demo's: per million faults), the last the block's length."""

    pid = 0

    def block(self) -> tuple[float, float, int, float]: ...

    def stop(self) -> None: ...


class BriefArm(Arm):
    def __init__(self, exe: Path, args: argparse.Namespace) -> None:
        self.p = subprocess.Popen(
            [str(exe), "--blocks", "--iters", str(args.block_iters), "--threads", str(args.threads), "--mib", "40"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=set_nice(args.nice),
        )
        self.pid = int(read_line(self.p, "ready", timeout=30).split()[1])

    def block(self) -> tuple[float, float, int, float]:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        _, wall, cpu, faults = read_line(self.p, "block", timeout=120).split()
        return float(wall), float(cpu), int(faults), float(wall)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class RedisArm(Arm):
    def __init__(self, exe: Path, tmp: Path, args: argparse.Namespace) -> None:
        self.port = free_port()
        d = tmp / f"redis-{self.port}"
        d.mkdir()
        self.srv = subprocess.Popen(
            redis_server_cmd(str(exe), self.port, "--bind", "127.0.0.1", "--dir", str(d)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=set_nice(args.nice),
        )
        wait_redis(self.srv, self.port)
        self.pid, self.args = self.srv.pid, args

    def block(self) -> tuple[float, float, int, float]:
        a = self.args
        cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(self.port), "-t", a.redis_tests]
        cmd += ["-n", str(a.redis_requests), "-P", "1", *REDIS_LOAD, "--csv"]
        c0, f0 = sched_cpu(self.pid) or 0.0, proc_minflt(self.pid)
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, preexec_fn=set_nice(a.nice))
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise TrialError(f"redis-benchmark failed: {p.stderr.strip()[-120:]}")
        return wall, (sched_cpu(self.pid) or 0.0) - c0, proc_minflt(self.pid) - f0, wall

    def stop(self) -> None:
        stop_process(self.srv, signal.SIGTERM, 30)


def all_stopped(pid: int) -> bool:
    """Every thread of pid in state T (a group stop has taken effect)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for t in tids:
        try:
            state = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


class DemoArm(Arm):
    """The demo daemon unpaced (--synth-ms 0 --gpu-ms 0), running for good but held stopped
    (SIGSTOP) except during its block: SIGCONT, --demo-window s, SIGSTOP. Its work in the block is
    counted by its page faults (every partition touches each of its pages once): the block's
    "wall" is seconds per million faults, its "CPU" CPU seconds per million faults."""

    def __init__(self, exe: Path, args: argparse.Namespace) -> None:
        cmd = [str(exe), "--partitions", "1000000000", *shlex.split(args.demo_args)]
        self.p = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=set_nice(args.nice)
        )
        self.pid, self.window = self.p.pid, args.demo_window
        time.sleep(0.3)
        self.pause()
        if self.p.poll() is not None:
            raise TrialError(f"provingd exited ({self.p.returncode})")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        end = time.monotonic() + 5
        while not all_stopped(self.pid) and time.monotonic() < end:
            time.sleep(0.001)

    def block(self) -> tuple[float, float, int, float]:
        c0, f0 = sched_cpu(self.pid) or 0.0, proc_minflt(self.pid)
        t0 = time.monotonic()
        os.kill(self.pid, signal.SIGCONT)
        time.sleep(self.window)
        self.pause()
        wall = time.monotonic() - t0
        faults = proc_minflt(self.pid) - f0
        if faults <= 0:
            raise TrialError("provingd did no work in a block")
        return wall / faults * 1e6, ((sched_cpu(self.pid) or 0.0) - c0) / faults * 1e6, faults, wall

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


# ---------------------------------------------------------------------------------------------
# the watch: its process tree's CPU and its BPF programs' runs


def tree(pid: int) -> list[int]:
    todo, out = [pid], []
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p) or [])
    return out


def tree_cpu(pid: int | None) -> float:
    return sum(sched_cpu(p) or 0.0 for p in tree(pid)) if pid else 0.0


RAW_TP: dict[int, str] = {}  # prog id -> "raw_tp:TRACEPOINT" (the kernel's names stop at 15 characters)


def raw_tp_names(pid: int) -> dict[int, str]:
    """prog id -> raw_tp:NAME for the raw-tracepoint links process pid holds (their fdinfo)."""
    out: dict[int, str] = {}
    for text in fdinfo_texts(pid):
        if "tp_name:" in text and "prog_id:" in text:
            f = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            out[int(f["prog_id"])] = "raw_tp:" + f["tp_name"].strip()
    return out


def bpf_snapshot(pid: int | None) -> dict[int, tuple[str, int, int]]:
    """prog id -> (name, run_time_ns, run_cnt) of every BPF program the watch's processes hold."""
    if not pid:
        return {}
    ids: set[int] = set()
    for p in tree(pid):
        ids |= tracer_objects(p)["progs"]
        RAW_TP.update(raw_tp_names(p))
    out = {}
    for i in ids:
        fd = bpf(PROG_GET_FD_BY_ID, IdAttr(id=i))
        if fd < 0:
            continue
        try:
            raw, st = obj_info(fd), prog_stats(fd)
        finally:
            os.close(fd)
        if raw is not None and st is not None:
            out[i] = (RAW_TP.get(i) or raw[64:80].split(b"\0")[0].decode() or f"id{i}", st[0], st[1])
    return out


def bpf_delta(a: dict, b: dict, acc: dict[str, list[int]]) -> None:
    """Add b - a, by program name, into acc (name -> [run_time_ns, run_cnt, programs of that name])."""
    for i, (name, ns, cnt) in b.items():
        _, ns0, cnt0 = a.get(i, (name, 0, 0))
        s = acc.setdefault(name, [0, 0, 0])
        s[0] += ns - ns0
        s[1] += cnt - cnt0
        s[2] = max(s[2], len([1 for v in b.values() if v[0] == name]))


class Watch:
    def __init__(self, pattern: str, out: Path, extra: list[str], nice: int, allocscope: str = "") -> None:
        exe = ROOT / ".venv" / "bin" / "allocscope"
        run = [allocscope] if allocscope else [str(exe)] if exe.exists() else [sys.executable, "-m", "allocscope"]
        self.cmd = [*run, "watch", "-q", "--pgrep", pattern, "-o", str(out), *extra]
        self.out = out
        self.p = subprocess.Popen(
            self.cmd, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=set_nice(nice),
        )  # fmt: skip
        t0 = time.monotonic()
        while not first_interval(out):
            if self.p.poll() is not None or time.monotonic() - t0 > 300:
                stop_process(self.p)
                err = (self.p.stderr.read() or "").strip().splitlines()
                raise TrialError(f"watch did not attach: {err[-1] if err else self.p.returncode}")
            time.sleep(0.05)
        self.attach_s = time.monotonic() - t0
        # settled: under 5 % of a CPU over 0.5 s (at most 20 s)
        end, last = time.monotonic() + 20, tree_cpu(self.p.pid)
        while time.monotonic() < end:
            time.sleep(0.5)
            now = tree_cpu(self.p.pid)
            if now - last < 0.025:
                break
            last = now
        self.settle_s = time.monotonic() - t0 - self.attach_s

    def stop(self) -> list[str]:
        stop_process(self.p)
        return sorted(d.name for d in self.out.glob("*.allocscope"))


# ---------------------------------------------------------------------------------------------
# one paired run


def trimmed_mean(xs: list[float], cut: float = 0.1) -> float:
    """Mean of xs without the lowest and highest `cut` share."""
    xs = sorted(xs)
    k = int(len(xs) * cut)
    return statistics.fmean(xs[k : len(xs) - k] if len(xs) > 2 * k else xs)


def bootstrap(xs: list[float], stat, n: int = 2000) -> tuple[float, float]:
    """95 % percentile interval of stat over n resamples of xs (fixed seed)."""
    rng = random.Random(50)
    vals = sorted(stat(rng.choices(xs, k=len(xs))) for _ in range(n))
    return vals[int(0.025 * n)], vals[int(0.975 * n) - 1]


def both_ways(r1: list[float], r2: list[float], n: int = 2000) -> tuple[float, float, float]:
    """sqrt(median r1 * median r2) and its 95 % bootstrap interval (each list resampled on its own)."""
    rng = random.Random(50)

    def g(a: list[float], b: list[float]) -> float:
        return (statistics.median(a) * statistics.median(b)) ** 0.5

    vals = sorted(g(rng.choices(r1, k=len(r1)), rng.choices(r2, k=len(r2))) for _ in range(n))
    return g(r1, r2), vals[int(0.025 * n)], vals[int(0.975 * n) - 1]


def ratio_line(label: str, a: list[float], b: list[float]) -> str:
    """Median and 10 %-trimmed mean of the pair ratios, each with its 95 % bootstrap interval."""
    rs = [x / y for x, y in zip(a, b, strict=True) if y > 0]
    if not rs:
        return f"  {label:14s} no pairs"
    lo, hi = bootstrap(rs, statistics.median)
    tlo, thi = bootstrap(rs, trimmed_mean)
    return (
        f"  {label:9s} median {statistics.median(rs):.4f}x [{lo:.4f}-{hi:.4f}], trimmed mean "
        f"{trimmed_mean(rs):.4f}x [{tlo:.4f}-{thi:.4f}]; min-max {min(rs):.3f}-{max(rs):.3f}; "
        f"sum A / sum B {sum(a) / sum(b):.4f}x; {len(rs)} pairs"
    )


def args_watch(r: dict) -> list[str]:
    return r.get("watch_args") or []


def fault_sample_of(extra: list[str]) -> int:
    """The watch's --fault-sample N (its default 16) from its extra arguments."""
    for i, a in enumerate(extra):
        if a == "--fault-sample" and i + 1 < len(extra):
            return int(extra[i + 1])
        if a.startswith("--fault-sample="):
            return int(a.split("=", 1)[1])
    return 16


def paired_run(name: str, arms: dict[str, Arm], args: argparse.Namespace, watch: Watch | None) -> dict:
    """ABBA blocks: A B, B A, A B, ... Returns the blocks and the per-arm watch costs."""
    wpid = watch.p.pid if watch else None
    for _ in range(args.warmup):  # page cache, allocator, the watch's first intervals
        arms["A"].block()
        arms["B"].block()
    blocks: dict[str, list[tuple[float, float, int, float]]] = {"A": [], "B": []}
    bpf_acc: dict[str, dict[str, list[int]]] = {"A": {}, "B": {}}
    wcpu = {"A": 0.0, "B": 0.0}
    sampled: list[int] = []  # fault_sample runs in each A block (0: the fault events were closed throughout)
    gaps = 0.0  # watch CPU between blocks (the controller's own reads)
    t_start, c_start = time.monotonic(), tree_cpu(wpid)
    snap, cpu = bpf_snapshot(wpid), c_start
    for i in range(args.pairs):
        order = "AB" if i % 2 == 0 else "BA"
        for arm in order:
            c0 = tree_cpu(wpid)
            gaps += c0 - cpu
            s0 = bpf_snapshot(wpid) if wpid else snap
            blocks[arm].append(arms[arm].block())
            cpu = tree_cpu(wpid)
            wcpu[arm] += cpu - c0
            if wpid:
                s1 = bpf_snapshot(wpid)
                bpf_delta(s0, s1, bpf_acc[arm])
                if arm == "A":
                    fs = {"fault_sample": [0, 0, 0]}
                    bpf_delta(s0, s1, fs)
                    sampled.append(fs["fault_sample"][1])
        if args.verbose:
            a, b = blocks["A"][-1], blocks["B"][-1]
            print(f"  {name} pair {i + 1:3d} {order}: A {a[0]:.3f} s  B {b[0]:.3f} s  {a[0] / b[0]:.3f}x", flush=True)
    elapsed = time.monotonic() - t_start
    return {
        "blocks": blocks,
        "bpf": bpf_acc,
        "wcpu": wcpu,
        "gaps": gaps,
        "elapsed": elapsed,
        "wtotal": tree_cpu(wpid) - c_start,
        "sampled": sampled,
        "watch_args": shlex.split(args.watch_args),
        "ratios": (
            [a[0] / b[0] for a, b in zip(blocks["A"], blocks["B"], strict=True)],
            [a[1] / b[1] for a, b in zip(blocks["A"], blocks["B"], strict=True)],
        ),
    }


def report(name: str, r: dict, watch: Watch | None) -> None:
    A, B = r["blocks"]["A"], r["blocks"]["B"]
    say(f"{name}: {len(A)} pairs in {r['elapsed']:.0f} s")
    say(
        f"  blocks: A wall median {statistics.median(x[0] for x in A):.3f} s (min-max {min(x[0] for x in A):.3f}-"
        f"{max(x[0] for x in A):.3f}), B {statistics.median(x[0] for x in B):.3f} s ({min(x[0] for x in B):.3f}-"
        f"{max(x[0] for x in B):.3f}); faults a block A {statistics.median(x[2] for x in A):,.0f}, "
        f"B {statistics.median(x[2] for x in B):,.0f}"
    )
    say(ratio_line("wall", [x[0] for x in A], [x[0] for x in B]))
    say(ratio_line("CPU", [x[1] for x in A], [x[1] for x in B]))
    if watch is None:
        return
    wall_a, wall_b = sum(x[3] for x in A), sum(x[3] for x in B)
    say(
        f"  watch CPU: {r['wtotal']:.3f} s over {r['elapsed']:.0f} s = "
        f"{r['wtotal'] / r['elapsed'] * 100:.2f} % of one core; "
        f"during A blocks {r['wcpu']['A']:.3f} s ({r['wcpu']['A'] / wall_a * 100:.2f} % of a core), during B blocks "
        f"{r['wcpu']['B']:.3f} s ({r['wcpu']['B'] / wall_b * 100:.2f} %), between blocks {r['gaps']:.3f} s"
    )
    smp = r.get("sampled") or []
    if len(smp) == len(A) and any(smp) and not all(smp) and statistics.median(x[2] for x in A) > 10000:
        on = [i for i, k in enumerate(smp) if k]
        off = [i for i, k in enumerate(smp) if not k]
        for label, idx in (("events on", on), ("all closed", off)):
            say(ratio_line(label, [A[i][0] for i in idx], [B[i][0] for i in idx]) + " (wall; A blocks whose fault "
                "events were open at some point / closed throughout)")  # fmt: skip
    acc = r["bpf"]
    fs = acc["A"].get("fault_sample", Z)[1]
    if fs and sum(x[2] for x in A):
        every = fault_sample_of(args_watch(r))
        say(
            f"  fault events: fault_sample ran {fs:,} times in the A blocks: open for ~"
            f"{fs * every / sum(x[2] for x in A) * 100:.1f} % of their {sum(x[2] for x in A):,} faults (runs x "
            f"{every} / faults; the duty cycle's share, 10 % expected; the cost of a phase follows it)"
        )
    names = sorted(set(acc["A"]) | set(acc["B"]), key=lambda n: -(acc["A"].get(n, Z)[0] + acc["B"].get(n, Z)[0]))
    if not any(v[1] for arm in acc.values() for v in arm.values()):
        say("  BPF: no run counts (kernel.bpf_stats_enabled off?)")
        return
    say("  BPF programs of the watch (kernel.bpf_stats_enabled), summed over each arm's blocks:")
    say(f"    {'program (kernel name)':22s} {'runs A':>10s} {'ms A':>8s} {'runs B':>10s} {'ms B':>8s} {'ns/run':>7s}")
    tot = {"A": 0, "B": 0}
    for n in names:
        a, b = acc["A"].get(n, Z), acc["B"].get(n, Z)
        if not (a[1] or b[1]):
            continue
        tot["A"] += a[0]
        tot["B"] += b[0]
        per = (a[0] + b[0]) / max(a[1] + b[1], 1)
        label = f"{n} x{max(a[2], b[2])}"
        say(f"    {label:22s} {a[1]:10,d} {a[0] / 1e6:8.2f} {b[1]:10,d} {b[0] / 1e6:8.2f} {per:7,.0f}")
    say(
        f"    total: A blocks {tot['A'] / 1e6:.1f} ms ({tot['A'] / 1e9 / wall_a * 100:.3f} % of their wall), "
        f"B blocks {tot['B'] / 1e6:.1f} ms ({tot['B'] / 1e9 / wall_b * 100:.3f} % of their wall): the B arm's "
        "share of the box-wide programs (the untraced copy's runs, and the rest of the box's in those blocks) "
        "makes the ratio low by up to that much"
    )


# ---------------------------------------------------------------------------------------------


def make_copies(workload: str, tmp: Path, bins: str = "") -> tuple[Path, Path]:
    """Two binaries of the workload, distinct files: A (watched) and B (never); from `bins`
    (brief_shape, provingd built elsewhere: a box with no compiler) when given."""
    if bins and workload in ("brief", "demo"):
        src = Path(bins) / ("brief_shape" if workload == "brief" else "provingd")
        if not src.is_file():
            raise SystemExit(f"{src}: not found (build it: sh bench/default_cost_gpu.sh --build-bins {bins})")
        names = ("bs_watched", "bs_plain") if workload == "brief" else ("provingd_watched", "provingd_plain")
    elif workload == "brief":
        src = tmp / "brief_shape"
        cmd = ["gcc", "-O2", "-g", "-pthread", "-fno-omit-frame-pointer", "-o", str(src), str(HERE / "brief_shape.c")]
        subprocess.run(cmd, check=True)
        names = ("bs_watched", "bs_plain")
    elif workload == "demo":
        from allocscope.cli.demo import build_daemon

        src = build_daemon(tmp)
        names = ("provingd_watched", "provingd_plain")
    else:
        exe = shutil.which("redis-server")
        if not exe or not shutil.which("redis-benchmark"):
            raise SystemExit("redis-server / redis-benchmark not found: apt-get install redis-server redis-tools")
        src = Path(os.path.realpath(exe))
        names = ("redis_watched", "redis_plain")
    out = []
    for n in names:
        shutil.copy2(src, tmp / n)
        out.append(tmp / n)
    return out[0], out[1]


def run_workload(workload: str, tmp: Path, args: argparse.Namespace) -> None:
    a_exe, b_exe = make_copies(workload, tmp, args.bins)
    say(
        f"== {workload}: A = {a_exe.name} (inode {a_exe.stat().st_ino}), B = {b_exe.name} (inode {b_exe.stat().st_ino})"
    )
    if workload == "brief":
        say(
            f"   block: {args.threads} threads x {args.block_iters} iterations of a 40 MiB malloc (mmapped), every "
            f"page touched, 2 kept ({args.threads * args.block_iters * 10240:,} first-touch faults); wall and CPU "
            "from the process"
        )
    elif workload == "demo":
        say(
            f"   block: provingd {args.demo_args} let run {args.demo_window} s (SIGCONT .. SIGSTOP, stopped between "
            "blocks); 'wall' = seconds per million page faults of its work, 'CPU' = its CPU seconds per million"
        )
    else:
        say(
            f"   block: redis-benchmark -t {args.redis_tests} -n {args.redis_requests} -P 1 {' '.join(REDIS_LOAD)}; "
            "wall from the controller, CPU = the server's (schedstat)"
        )
    arms: dict[str, Arm] = {}
    watch = None
    try:
        for k, exe in (("A", a_exe), ("B", b_exe)):
            if workload == "brief":
                arms[k] = BriefArm(exe, args)
            elif workload == "demo":
                arms[k] = DemoArm(exe, args)
            else:
                arms[k] = RedisArm(exe, tmp, args)
        if not args.no_control:
            report(f"{workload} control (no watch: A and B untraced)", paired_run("control", arms, args, None), None)
        extra = shlex.split(args.watch_args)
        label = args.watch_args or "(defaults)"
        meds: list[tuple[list[float], list[float]]] = []
        phases = [("A", "B")] if args.no_swap else [("A", "B"), ("B", "A")]
        for traced, plain in phases:
            exe = a_exe if traced == "A" else b_exe
            pattern = "^" + re.escape(str(exe)) + "( |$)"
            if isinstance(arms[traced], DemoArm):  # the watch attaches to a process that runs, not a stopped one
                os.kill(arms[traced].pid, signal.SIGCONT)
            try:
                watch = Watch(pattern, tmp / f"watch-{workload}-{traced}", extra, args.nice, args.allocscope)
            finally:
                if isinstance(arms[traced], DemoArm):
                    arms[traced].pause()
            say(
                f"{workload} watch on {exe.name}: {' '.join(shlex.quote(c) for c in watch.cmd[1:])}"
                f" (attached in {watch.attach_s:.1f} s, idle {watch.settle_s:.1f} s later)"
            )
            pair = {"A": arms[traced], "B": arms[plain]}
            r = paired_run("watch", pair, args, watch)
            traces = watch.stop()
            report(f"{workload} watch {label}, traced = {exe.name} (A in the lines below)", r, watch)
            pa, pb = pair["A"].pid, pair["B"].pid
            na, nb = len([t for t in traces if f"-{pa}-" in t]), len([t for t in traces if f"-{pb}-" in t])
            say(f"  traces written: {len(traces)}, of the traced (pid {pa}): {na}; of the other (pid {pb}): {nb}")
            meds.append(r["ratios"])
            watch = None
        if len(meds) == 2:
            say(
                f"{workload} watch {label}, both ways: the geometric mean of the two phases' medians (each copy traced "
                "once: a difference between the copies cancels) [95 % bootstrap interval, each phase resampled]"
            )
            for k, what in ((0, "wall"), (1, "CPU")):
                g, lo, hi = both_ways(meds[0][k], meds[1][k])
                verdict = (
                    "MET" if hi <= 1.02 else ("NOT MET" if lo > 1.02 else "not resolved (the interval spans 1.02)")
                )
                say(f"  {what:4s} {g:.4f}x [{lo:.4f}-{hi:.4f}]  <= 1.02x: {verdict}")
    finally:
        if watch is not None:
            watch.stop()
        for a in arms.values():
            a.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["brief", "redis", "demo", "all"], default="brief")
    ap.add_argument("--pairs", type=int, default=60, help="blocks per arm (A B or B A each)")
    ap.add_argument("--quick", action="store_true", help="16 pairs, 1 warm-up: a trial of the method")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured blocks per arm before each run")
    ap.add_argument("--block-iters", type=int, default=16, help="brief: iterations per thread in a block")
    ap.add_argument("--threads", type=int, default=2, help="brief: threads")
    ap.add_argument("--redis-requests", type=int, default=10000, help="redis: -n per test in a block")
    ap.add_argument("--redis-tests", default="set,get,lpush,lpop", help="redis: -t")
    ap.add_argument("--demo-args", default="--synth-ms 0 --gpu-ms 0 --pw 3", help="demo: provingd flags")
    ap.add_argument("--demo-window", type=float, default=0.75, help="demo: seconds the daemon runs in a block")
    ap.add_argument("--watch-args", default="", help="watch arguments beyond its defaults, e.g. '--wait-min 0'")
    ap.add_argument(
        "--no-swap", action="store_true", help="trace only the first copy (default: a second phase traces the other)"
    )
    ap.add_argument("--no-control", action="store_true", help="skip the control run (no watch)")
    ap.add_argument("--nice", type=int, default=-15, help="niceness of the copies, the watch and this script")
    ap.add_argument(
        "--no-bpf-stats",
        action="store_true",
        help="leave kernel.bpf_stats_enabled alone (its clock reads cost the A arm)",
    )
    ap.add_argument("--allocscope", default="", help="allocscope to run (default .venv; or a bundle bin)")
    ap.add_argument("--bins", default="", help="prebuilt brief_shape and provingd (default: built here with gcc)")
    ap.add_argument("--note", default="", help="a line for the header (e.g. 'taken while other work ran')")
    ap.add_argument("--out", help="also write the printed lines to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per pair")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/paired.py: run as root (it attaches BPF probes)")
    if args.quick:
        args.pairs, args.warmup = 16, 1
    os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: the copies and the watch stopped, the sysctl restored
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats.read_text().strip()
    if not args.no_bpf_stats:
        stats.write_text("1")
    load = os.getloadavg()
    say(
        f"bench/paired.py {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.uname().nodename}, kernel {os.uname().release}, "
        f"{os.cpu_count()} CPUs, loadavg {load[0]:.2f} {load[1]:.2f} at the start, nice {args.nice}"
        + (f"; {args.note}" if args.note else "")
    )
    say(f"command: {' '.join(shlex.quote(a) for a in sys.argv)}")
    say(
        "A = the watched copy, B = the never-traced copy; ratio = A block / the adjacent B block (ABBA order); "
        "median and 10 %-trimmed mean over the pairs, [95 % bootstrap interval]"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="allocscope-paired-") as td:
            for w in ["brief", "redis", "demo"] if args.workload == "all" else [args.workload]:
                try:
                    run_workload(w, Path(td), args)
                except TrialError as e:
                    say(f"{w}: FAILED: {e}")
    finally:
        stats.write_text(was)
        if args.out:
            Path(args.out).write_text("\n".join(OUT) + "\n")


if __name__ == "__main__":
    main()
