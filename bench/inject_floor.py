#!/usr/bin/env python3
"""`--inject` at the in-process floor (issue #33): interleaved, pinned, per-round ratios.

    sudo .venv/bin/python bench/inject_floor.py ALLOCSCOPE OUT.md [--bins BINS] [--rounds 5]
    python3 bench/inject_floor.py --build-bins BINS          # here: gcc + cargo, for another box

ALLOCSCOPE: the allocscope to run (.venv/bin/allocscope here, BUNDLE/bin/allocscope on another
box). OUT.md: where the markdown results go. BINS: `syscalls` (bench/syscalls.c), `switch`
(bench/switch.c), `pair` (bench/pair.c) and `rustd` (tests/targets/rustd, its `--serve` mode), built by --build-bins
(default: built into the work directory when gcc and cargo are here). --redis-dir: the folder of
redis-server and redis-benchmark, put on their LD_LIBRARY_PATH (default: where PATH has them).

Round by round (ABAB.., the order rotated each round), a fresh server per trial:
  untraced, heaptrack (`heaptrack -p`, gdb injection; skipped when heaptrack is missing),
  inject (`record --inject`, its default sampling), sampled (`--sample-bytes 65536`, out of
  process), residency (`--mode residency`), on
  redis    redis-server (one CPU) loaded by redis-benchmark -t set,get,lpush (its own CPUs);
  rustd    `rustd --serve T`: T worker threads (allocator calls ~3 % of their time), its own
           request counter read by SIGUSR1 over a fixed window.
The server, the load generator and the tracer are pinned to disjoint CPUs where the box has
enough (taskset; the table says what shares a CPU). Each trial warms up (redis: a first
benchmark pass; rustd: 1 s) after the tracer has attached and gone idle, then measures: the
throughput, the server's CPU per request (all its threads, /proc/PID/task/*/schedstat: utime +
stime to the ns) and the tracer's CPU per snapshot interval. Per mode: the median and the
min-max over rounds of its ratio to the untraced trial of the SAME round.

Then: the estimates against the targets' own counters (redis INFO used_memory grown since the
attach vs the recording's live bytes; rustd's cache bytes vs the `cache_entry` site), the
syscall tax on an unrelated process (a getppid() loop on its own CPU; untraced / an injected
recording / residency mode (syscall tracepoints: the positive control) of a serving rustd), the
plain vs hooked malloc+free pair (one process, before/during/after an injected recording, with
the default sampling and with sampling off in effect), and a SIGKILL of allocscope during an
injected recording of each daemon (every code byte back, checked against a snapshot of the
modules' text taken before the attach; the daemon still serving). Needs root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import (
    REDIS_LOAD,
    TracerMonitor,
    TrialError,
    finish_results,
    free_port,
    read_line,
    redis_server_cmd,
    sched_cpu,
    settle,
    stop_process,
    wait_redis,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES: dict[str, list[str] | None] = {
    "untraced": None,
    "heaptrack": None,
    "inject": ["--inject"],
    "sampled": ["--sample-bytes", "65536"],
    "residency": ["--mode", "residency"],
}
ESTIMATED = ("inject", "sampled")  # the modes whose live-byte estimates are checked
NO_SAMPLING = str(1 << 40)  # --sample-bytes: a 32-byte block is kept once in 3e10 calls


# ---------------------------------------------------------------------------------------------
# CPUs


def cpu_order() -> tuple[list[int], int]:
    """The CPUs we may run on, one per physical core first (the first sibling of each), then the
    other siblings; and how many physical cores there are."""
    firsts, rest, seen = [], [], set()
    for c in sorted(os.sched_getaffinity(0)):
        try:
            base = f"/sys/devices/system/cpu/cpu{c}/topology"
            key = (Path(base, "physical_package_id").read_text().strip(), Path(base, "core_id").read_text().strip())
        except OSError:
            key = ("?", str(c))
        (rest if key in seen else firsts).append(c)
        seen.add(key)
    return firsts + rest, len(firsts)


def physical_cpus() -> list[int]:
    order, n = cpu_order()
    return order[:n]


class Layout:
    """Which CPUs the server, the load generator, the tracer and the unrelated process get."""

    def __init__(self, rustd_threads: int | None) -> None:
        order, cores = cpu_order()
        n = len(order)
        self.shared = ""
        if n >= 8:  # leave CPU 0 to the box (interrupts, this script)
            free = [c for c in order if c != 0]
            self.redis, self.client, self.tracer, self.other = [free[0]], free[1:3], free[3:5], [free[5]]
            rest = free[6:]
            self.rustd_threads = rustd_threads or min(8, len(rest))
            self.rustd = rest[: self.rustd_threads]
            if cores < 6 + 1 + min(len(self.rustd), self.rustd_threads):
                self.shared = (
                    f"{cores} physical cores for {n} CPUs: rustd's workers (and, past the first "
                    f"{cores - 1}, the roles above) run on hyperthread siblings of one another"
                )
        elif n >= 4:
            self.redis, self.client, self.tracer, self.other = [order[1]], [order[2]], [order[3]], [order[0]]
            self.rustd = [order[1], order[2]]
            self.rustd_threads = rustd_threads or 4
            self.shared = (
                f"rustd's workers on CPUs {order[1]},{order[2]}; the unrelated process and this script "
                f"share CPU {order[0]}"
            )
        else:
            last, first = order[-1], order[0]
            self.redis, self.rustd = [last], [last]
            self.client = self.tracer = self.other = [first]
            self.rustd_threads = rustd_threads or 4
            self.shared = (
                f"only {n} CPU(s): the server (redis, or rustd's {self.rustd_threads} workers) on CPU "
                f"{last}; the load generator, the tracer, the unrelated process and this script share "
                f"CPU {first}"
            )

    def describe(self) -> str:
        def f(c: list[int]) -> str:
            return ",".join(map(str, c))

        return (
            f"redis-server on CPU {f(self.redis)}, redis-benchmark on {f(self.client)}, the tracer on "
            f"{f(self.tracer)}, rustd ({self.rustd_threads} workers) on {f(self.rustd)}, the unrelated "
            f"process on {f(self.other)}" + (f"; {self.shared}" if self.shared else "")
        )


def pinned(cpus: list[int], argv: list[str]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus)), *argv]


# ---------------------------------------------------------------------------------------------
# tracers


def tree_cpu(mon: TracerMonitor | None) -> float:
    return mon.cpu_total() if mon else 0.0


class Tracer:
    """allocscope record or heaptrack -p attached to a pid, pinned to the tracer CPUs."""

    def __init__(self, bench: Bench, mode: str, pid: int, name: str) -> None:
        self.mode, self.pid, self.trace = mode, pid, None
        self.log: list[str] = []
        if mode == "heaptrack":
            self.proc = subprocess.Popen(
                pinned(bench.cpus.tracer, ["heaptrack", "-o", str(bench.work / name), "-p", str(pid)]),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            self.mon = TracerMonitor(self.proc.pid, {pid})
            try:
                read_line(self.proc, "injection finished", timeout=180, keep=self.log)
            except TrialError:
                self.kill()
                raise TrialError("heaptrack -p failed: " + (self.log[-1][:100] if self.log else "no output")) from None
            threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        else:
            self.trace = bench.work / f"{name}.allocscope"
            exe, args = bench.exe, MODES[mode] or []
            if args and args[0].startswith("@"):  # --define NAME='@EXE ARGS': another allocscope
                exe, args = args[0][1:], args[1:]
            self.proc = subprocess.Popen(
                pinned(
                    bench.cpus.tracer,
                    [exe, "record", "-q", "--pid", str(pid), "-o", str(self.trace), "--force", *args],
                ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            self.mon = TracerMonitor(self.proc.pid, {pid})
            end = time.monotonic() + 300
            while not (self.trace / "parts" / "intervals-000001.parquet").exists():
                if self.proc.poll() is not None or time.monotonic() > end:
                    self.kill()
                    err = self.proc.stderr.read().strip().splitlines()
                    raise TrialError(f"allocscope did not attach: {err[-1] if err else self.proc.returncode}")
                time.sleep(0.05)
        settle(self.mon)

    def cpu(self) -> float:
        return tree_cpu(self.mon)

    def finish(self) -> dict:
        """Stop allocscope (SIGINT) and return its recording's inject meta; heaptrack stops
        when its target exits (Bench.stop_server), so nothing here."""
        if self.mode == "heaptrack":
            return {}
        stop_process(self.proc)
        self.mon.stop()
        if self.proc.returncode != 0:
            raise TrialError(f"allocscope exited {self.proc.returncode}: {self.proc.stderr.read().strip()[-200:]}")
        try:
            meta = json.loads((self.trace / "meta.json").read_text())
        except (OSError, ValueError):
            return {}
        inj = (meta.get("probes") or {}).get("inject") or {}
        return {k: inj[k] for k in ("detached", "stopped_ms", "tracepoints") if k in inj} | (
            {"hooked": len(inj["hooked"]), "sampled": inj.get("counters", {}).get("sampled")} if inj else {}
        )

    def after_target_exit(self) -> None:
        if self.mode == "heaptrack":
            try:
                self.proc.wait(180)  # heaptrack_interpret finishes once the target is gone
            except subprocess.TimeoutExpired:
                self.kill()
            self.mon.stop()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL) if self.mode == "heaptrack" else self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.mon.stop()


# ---------------------------------------------------------------------------------------------
# the two daemons


def end_trial(tr: Tracer | None, srv: subprocess.Popen) -> None:
    """A trial's cleanup, whatever happened: the tracer (if any) and the target killed."""
    if tr is not None:
        tr.kill()
    stop_process(srv, signal.SIGKILL, 30)


def redis_cmd(port: int, cmd: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(cmd.encode() + b"\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if data.startswith(b"$"):
                n = int(data[1 : data.index(b"\r\n")])
                if len(data) >= data.index(b"\r\n") + 2 + n + 2:
                    break
            elif data.endswith(b"\r\n"):
                break
        return data


def used_memory(port: int) -> int:
    for line in redis_cmd(port, "INFO memory").decode().splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    raise TrialError("INFO memory: no used_memory")


class Redis:
    name = "redis"

    def __init__(self, b: Bench, requests: int) -> None:
        self.b, self.requests = b, requests
        self.env = {**os.environ, "LD_LIBRARY_PATH": b.redis_dir}
        self.tests = "set,get,lpush"

    def header(self) -> str:
        return (
            f"redis-server (one CPU) loaded by redis-benchmark -t {self.tests} -n {self.requests} -c 50 -r 100000 "
            f"-d 64 (a first pass of n/4 as the warm-up); requests/s over the three tests"
        )

    def start(self) -> tuple[subprocess.Popen, int]:
        port = free_port()
        d = self.b.work / f"redis-{port}"
        d.mkdir(exist_ok=True)
        srv = subprocess.Popen(
            pinned(
                self.b.cpus.redis,
                redis_server_cmd(
                    os.path.join(self.b.redis_dir, "redis-server"), port, "--bind", "127.0.0.1", "--dir", str(d)
                ),
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        wait_redis(srv, port)
        return srv, port

    def load(self, port: int, n: int) -> dict[str, float]:
        p = subprocess.run(
            pinned(
                self.b.cpus.client,
                [
                    os.path.join(self.b.redis_dir, "redis-benchmark"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-t",
                    self.tests,
                    "-n",
                    str(n),
                    *REDIS_LOAD,
                    "--csv",
                ],
            ),
            capture_output=True,
            text=True,
            env=self.env,
            timeout=1800,
            check=False,
        )
        rps = {}
        for line in p.stdout.splitlines()[1:]:
            f = [x.strip('"') for x in line.split(",")]
            try:
                rps[f[0]] = float(f[1])
            except (IndexError, ValueError):
                pass
        if p.returncode != 0 or len(rps) != 3:
            raise TrialError(f"redis-benchmark failed: {(p.stderr.strip() or p.stdout.strip())[-120:]}")
        return rps

    def trial(self, mode: str, r: int) -> dict:
        srv, port = self.start()
        tr = None
        try:
            if mode != "untraced":
                tr = Tracer(self.b, mode, srv.pid, f"redis-{mode}-{r}")
            used0 = used_memory(port)
            self.load(port, max(1000, self.requests // 4))  # warm-up: the key space filled
            c0, t0, tc0 = sched_cpu(srv.pid), time.monotonic(), tr.cpu() if tr else 0.0
            rps = self.load(port, self.requests)
            c1, t1, tc1 = sched_cpu(srv.pid), time.monotonic(), tr.cpu() if tr else 0.0
            n = self.requests * len(rps)
            res = {
                "metric": n / sum(self.requests / v for v in rps.values()),
                "per_test": rps,
                "cpu_us": 1e6 * (c1 - c0) / n,
                "tracer_ms_per_s": 1000 * (tc1 - tc0) / (t1 - t0),
            }
            if mode in ESTIMATED:
                res["truth"] = used_memory(port) - used0
            self.b.finish_trace(res, tr, mode, None)
            stop_process(srv, signal.SIGTERM, 60)
            if tr is not None:
                tr.after_target_exit()
            return res
        finally:
            end_trial(tr, srv)


class Rustd:
    name = "rustd"

    def __init__(self, b: Bench, seconds: float) -> None:
        self.b, self.seconds = b, seconds

    def header(self) -> str:
        return (
            f"rustd --serve {self.b.cpus.rustd_threads} (tests/targets/rustd: jemalloc linked in as _rjem_*, "
            f"allocator ~3 % of its CPU), 1 s warm-up, requests/s from its own counter over {self.seconds:g} s"
        )

    def start(self) -> tuple[subprocess.Popen, int]:
        p = subprocess.Popen(
            pinned(self.b.cpus.rustd, [str(self.b.bins / "rustd"), "--serve", str(self.b.cpus.rustd_threads)]),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        read_line(p, "ready", timeout=30)
        return p, p.pid

    @staticmethod
    def stats(p: subprocess.Popen) -> dict:
        p.send_signal(signal.SIGUSR1)
        return json.loads(read_line(p, "stats", timeout=30).split(" ", 1)[1])

    def trial(self, mode: str, r: int) -> dict:
        srv, pid = self.start()
        tr = None
        try:
            if mode != "untraced":
                tr = Tracer(self.b, mode, pid, f"rustd-{mode}-{r}")
            time.sleep(1.0)  # warm-up (and every cache slot filled: 2048 a thread)
            s0, c0, t0, tc0 = self.stats(srv), sched_cpu(pid), time.monotonic(), tr.cpu() if tr else 0.0
            time.sleep(self.seconds)
            s1, c1, t1, tc1 = self.stats(srv), sched_cpu(pid), time.monotonic(), tr.cpu() if tr else 0.0
            n = s1["requests"] - s0["requests"]
            res = {
                "metric": n / (t1 - t0),
                "cpu_us": 1e6 * (c1 - c0) / n,
                "tracer_ms_per_s": 1000 * (tc1 - tc0) / (t1 - t0),
            }
            if mode in ESTIMATED:
                res["truth"] = s1["cache_bytes"]
            self.b.finish_trace(res, tr, mode, "cache_entry")
            stop_process(srv, signal.SIGTERM, 60)
            if srv.returncode != 0:
                raise TrialError(f"rustd exited {srv.returncode}")
            if tr is not None:
                tr.after_target_exit()
            return res
        finally:
            end_trial(tr, srv)


# ---------------------------------------------------------------------------------------------
# code bytes (the SIGKILL check)


def text_snapshot(pid: int) -> dict[tuple, str]:
    """sha1 of every executable file mapping of pid, by address range (the allocators' and the
    mmap family's entry points lie in them; the agent's own mappings come later and are not in
    a snapshot taken before the attach)."""
    out = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            f = line.split()
            if len(f) >= 6 and "x" in f[1] and f[5].startswith("/"):
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                out[(lo, hi, f[5])] = ""
    return code_hashes(pid, out)


def code_hashes(pid: int, ranges: dict[tuple, str]) -> dict[tuple, str]:
    """The same ranges read again: a patch makes the kernel split the mapping (the page made
    writable, copied on write), so the ranges are read as addresses, not as today's mappings."""
    out = {}
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for k in ranges:
            mem.seek(k[0])
            out[k] = hashlib.sha1(mem.read(k[1] - k[0])).hexdigest()
    return out


def changed(pid: int, before: dict[tuple, str]) -> list[str]:
    now = code_hashes(pid, before)
    return [os.path.basename(k[2]) for k, v in before.items() if now.get(k) != v]


def thread_names(pid: int) -> set[str]:
    out = set()
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add(Path(f"/proc/{pid}/task/{t}/comm").read_text().strip())
        except OSError:
            pass
    return out


# ---------------------------------------------------------------------------------------------
# the bench


class Bench:
    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.exe, self.work, self.estimates = a.allocscope, work, not a.no_estimates
        self.cpus = Layout(a.rustd_threads)
        self.bins = Path(a.bins) if a.bins else work / "bins"
        if not a.bins:
            build_bins(self.bins)
        self.redis_dir = a.redis_dir or os.path.dirname(shutil.which("redis-server") or "/usr/bin/redis-server")
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def finish_trace(self, res: dict, tr: Tracer | None, mode: str, function: str | None) -> None:
        """A traced trial's tracer stopped: its meta (and, where estimated, the estimate) into `res`."""
        if tr is not None:
            res["meta"] = tr.finish()
            if mode in ESTIMATED and self.estimates:
                res["estimate"] = self.estimate(tr.trace, function)

    def estimate(self, trace: Path, function: str | None) -> dict:
        p = subprocess.run(
            [self.exe, "report", str(trace), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:120]}
        rep = json.loads(p.stdout)
        if function is None:
            t = rep["totals"]
            err = t.get("live_bytes_error") or sum(x.get("live_bytes_error", 0) ** 2 for x in rep["locations"]) ** 0.5
            return {"live": t["live_bytes"], "err": err}
        locs = [x for x in rep["locations"] if x["function"].split("(")[0].endswith(function)]
        return {
            "live": sum(x["live_bytes"] for x in locs),
            "err": sum(x.get("live_bytes_error", 0) ** 2 for x in locs) ** 0.5,
            "sites": len(locs),
        }


def build_bins(d: Path) -> None:
    """syscalls, switch and pair with gcc, rustd (tests/targets/rustd, a release build over
    Debian's crates: its .cargo/config.toml) with cargo, into d."""
    d.mkdir(parents=True, exist_ok=True)
    for name, flags in (("syscalls", []), ("pair", []), ("switch", ["-pthread"])):
        subprocess.run(["gcc", "-O2", *flags, "-o", str(d / name), str(HERE / f"{name}.c")], check=True)
    cargo = os.environ.get("RUSTD_CARGO") or shutil.which("cargo") or "/usr/bin/cargo"
    env = {k: v for k, v in os.environ.items() if k != "RUSTFLAGS"}  # Cargo.toml's profile is the build
    env["CARGO_TARGET_DIR"] = str(d / "rustd-build")
    if "RUSTC" not in env and Path(cargo).with_name("rustc").exists():
        env["RUSTC"] = str(Path(cargo).with_name("rustc"))  # the rustc beside that cargo
    p = subprocess.run(
        [cargo, "build", "--release", "--offline", "--quiet"],
        cwd=ROOT / "tests" / "targets" / "rustd",
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if p.returncode != 0:
        raise SystemExit(f"bench/inject_floor.py: building rustd failed: {p.stderr.strip()[-300:]}")
    shutil.copy2(d / "rustd-build" / "release" / "rustd", d / "rustd")


def spread(vals: list[float]) -> str:
    """Median (min–max) of ratios, in %."""
    if not vals:
        return "-"
    return f"{statistics.median(vals) * 100:.1f} % ({min(vals) * 100:.1f}–{max(vals) * 100:.1f})"


def interleaved(b: Bench, wl, modes: list[str], rounds: int) -> dict:
    res: dict[str, list] = {m: [] for m in modes}
    errors: dict[str, list[str]] = {m: [] for m in modes}
    try:
        wl.trial("untraced", -1)  # one unmeasured trial: caches, frequency
    except TrialError as e:
        b.say(f"{wl.name}: the warm-up trial failed: {e}")
    for r in range(rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        row = {}
        for m in order:
            try:
                row[m] = wl.trial(m, r)
            except TrialError as e:
                errors[m].append(str(e))
                print(f"  {wl.name} round {r + 1} {m}: failed: {e}", flush=True)
                continue
            d = row[m]
            print(
                f"  {wl.name} round {r + 1} {m:10s} {d['metric']:12,.0f}/s  cpu {d['cpu_us']:.2f} us/req  "
                f"tracer {d['tracer_ms_per_s']:.1f} ms/s {d.get('meta') or ''}",
                flush=True,
            )
        base = row.get("untraced")
        for m, d in row.items():
            if base:
                d["kept"] = d["metric"] / base["metric"]
                d["cpu_ratio"] = d["cpu_us"] / base["cpu_us"]
                if "per_test" in d:
                    d["test_kept"] = {k: v / base["per_test"][k] for k, v in d["per_test"].items()}
            res[m].append(d)
    b.say(
        f"\n### {wl.name}\n\n{wl.header()}. {rounds} rounds; each figure: the median over rounds of "
        "the ratio to the untraced trial of the same round (min–max).\n"
    )
    tests = ["SET", "GET", "LPUSH"] if wl.name == "redis" else []
    b.say(
        "| mode | req/s (median) | throughput kept | server CPU per request (µs) | CPU/request vs untraced | "
        "tracer CPU (ms per 1 s interval) | " + "".join(f"{t} kept | " for t in tests) + "rounds |"
    )
    b.say("|---" * (7 + len(tests)) + "|")
    for m in modes:
        ts = res[m]
        if not ts:
            b.say(f"| {m} | n/a: {errors[m][-1] if errors[m] else 'not run'} |" + " |" * (5 + len(tests)))
            continue
        kept = [t["kept"] for t in ts if "kept" in t]
        cr = [t["cpu_ratio"] for t in ts if "cpu_ratio" in t]
        cols = "".join(f"{spread([t['test_kept'][k] for t in ts if 'test_kept' in t])} | " for k in tests)
        b.say(
            f"| {m} | {statistics.median(t['metric'] for t in ts):,.0f} | {spread(kept)} | "
            f"{statistics.median(t['cpu_us'] for t in ts):.2f} | {spread(cr)} | "
            f"{statistics.median(t['tracer_ms_per_s'] for t in ts):.1f} | {cols}{len(ts)}/{rounds}"
            + (f" ({len(errors[m])} failed: {errors[m][-1][:80]})" if errors[m] else "")
            + " |"
        )
    if wl.name == "rustd" and "heaptrack" in modes:
        b.say(
            "\n(heaptrack -p hooks the PLT/GOT of malloc & co.: rustd's jemalloc is linked in and called "
            "directly as _rjem_*, so heaptrack sees none of its allocations; its row is the cost of being "
            "attached, not of tracing.)"
        )
    return res


def estimates_section(b: Bench, results: dict[str, dict]) -> list[bool]:
    b.say("\n### Estimates against the targets' own counters\n")
    b.say(
        "redis: INFO used_memory grown from the attach to the end (jemalloc size classes: the estimate is of "
        "requested bytes, so ~0.8–1.0x) vs the recording's live bytes (report --format json: totals.live_bytes, "
        "± totals.live_bytes_error, the 95 % bound); rustd: its cache bytes (every block from `cache_entry`) vs "
        "that site's live_bytes ± live_bytes_error. Within: the test suite's criterion (1.7x the 95 % bound; "
        "redis 0.8–1.02x used_memory ± that).\n"
    )
    b.say("| target | mode | round | truth (B) | estimate (B) | ± 95 % (B) | estimate / truth | within |")
    b.say("|---|---|---|---|---|---|---|---|")
    oks = []
    for wl, res in results.items():
        for m in ESTIMATED:
            for r, t in enumerate(res.get(m, [])):
                e = t.get("estimate")
                if not e:
                    continue
                if "error" in e:
                    b.say(f"| {wl} | {m} | {r + 1} | {t['truth']:,} | report failed: {e['error']} | | | |")
                    continue
                truth, live, err = t["truth"], e["live"], e["err"]
                ok = (
                    (0.80 * truth - 1.7 * err <= live <= 1.02 * truth + 1.7 * err)
                    if wl == "redis"
                    else abs(live - truth) <= 1.7 * err
                )
                oks.append(ok)
                b.say(
                    f"| {wl} | {m} | {r + 1} | {truth:,} | {live:,} | {err:,.0f} | "
                    f"{live / truth if truth else float('nan'):.3f} | {'yes' if ok else 'NO'} |"
                )
    return oks


def switch_ns(b: Bench, n: int) -> float:
    """ns a hand-off of bench/switch.c (two threads on one CPU: every hand-off is a context switch)."""
    p = subprocess.Popen(pinned(b.cpus.other, [str(b.bins / "switch"), str(n)]), stdout=subprocess.PIPE, text=True)
    try:
        read_line(p, "ready", timeout=30)
        p.send_signal(signal.SIGUSR1)
        f = read_line(p, "elapsed", timeout=120).split()
        return 1e9 * float(f[1]) / float(f[3])
    finally:
        stop_process(p, signal.SIGKILL, 30)


def syscall_tax(b: Bench, rounds: int, calls: int, best: int) -> list[str]:
    prog = b.bins / "syscalls"
    cfgs = {"untraced": None, "inject": ["--inject"], "residency (control)": ["--mode", "residency"]}
    res: dict[str, list[float]] = {c: [] for c in cfgs}
    sw: dict[str, list[float]] = {c: [] for c in cfgs}
    for r in range(rounds):
        order = list(cfgs)[r % 3 :] + list(cfgs)[: r % 3]
        for c in order:
            srv = subprocess.Popen(
                pinned(b.cpus.rustd, [str(b.bins / "rustd"), "--serve", "1"]),
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            tr = None
            try:
                read_line(srv, "ready", timeout=30)
                if cfgs[c] is not None:
                    MODES["_tax"] = cfgs[c]
                    tr = Tracer(b, "_tax", srv.pid, f"tax-{r}")
                res[c].append(
                    min(
                        float(
                            subprocess.run(
                                pinned(b.cpus.other, [str(prog), str(calls)]),
                                capture_output=True,
                                text=True,
                                check=True,
                            ).stdout.split()[1]
                        )
                        for _ in range(best)
                    )
                )
                sw[c].append(min(switch_ns(b, calls // 10) for _ in range(3)))
                if tr is not None:
                    tr.finish()
                    tr = None
            except TrialError as e:
                print(f"  syscall tax round {r + 1} {c}: failed: {e}", flush=True)
            finally:
                end_trial(tr, srv)
            print(
                f"  tax round {r + 1} {c}: getppid {res[c][-1] if res[c] else '-'} ns, "
                f"hand-off {sw[c][-1] if sw[c] else '-'} ns",
                flush=True,
            )
    b.say(
        f"\n### Syscall and context-switch tax on an unrelated process\n\nOn CPU "
        f"{','.join(map(str, b.cpus.other))}: a getppid() loop ({calls:,} calls, the fastest of {best} loops a "
        f"trial) and bench/switch.c (two threads handing a token over, {calls // 10:,} hand-offs, each a "
        f"context switch; the fastest of 3), while `rustd --serve 1` runs untraced / under an injected "
        f"recording / under residency mode (which attaches the syscall tracepoints: the control that shows "
        f"the measurement can see a tax); {rounds} interleaved rounds.\n"
    )
    b.say("| configuration | getppid ns (median, min–max) | added ns | hand-off ns (median, min–max) | added ns |")
    b.say("|---|---|---|---|---|")
    out = []
    for c in cfgs:
        v, w = res[c], sw[c]
        if not v:
            b.say(f"| {c} | n/a | | | |")
            continue
        d1 = statistics.median(x - y for x, y in zip(v, res["untraced"]))
        d2 = statistics.median(x - y for x, y in zip(w, sw["untraced"])) if w and sw["untraced"] else float("nan")
        b.say(
            f"| {c} | {statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f}) | {d1:+.1f} | "
            f"{statistics.median(w):.0f} ({min(w):.0f}–{max(w):.0f}) | {d2:+.0f} |"
        )
        out.append(f"{c}: getppid {d1:+.1f} ns, hand-off {d2:+.0f} ns")
    base, sbase = res["untraced"], sw["untraced"]
    noise = (
        f"getppid {max(base) - min(base):.1f} ns, hand-off {max(sbase) - min(sbase):.0f} ns"
        if len(base) > 1 and len(sbase) > 1
        else "one round: unknown"
    )
    b.say(f"\nUntraced spread over rounds (the noise): {noise}.")
    return [*out, f"untraced spread {noise}"]


def pair_cost(b: Bench, cycles: int, batches: int) -> dict[str, float]:
    """One process: plain batches, then hooked (default sampling / sampling off in effect),
    then plain again, ...; medians of the batches of each phase."""
    p = subprocess.Popen(
        pinned(b.cpus.redis, [str(b.bins / "pair")]), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    phases: dict[str, list[float]] = {"plain": [], "inject": [], "inject-unsampled": []}
    try:
        read_line(p, "ready", timeout=30)

        def take(n: int) -> list[float]:
            read_line(p, "ns", timeout=60)  # a batch that may have straddled the change
            return [float(read_line(p, "ns", timeout=60).split()[1]) for _ in range(n)]

        for c in range(cycles):
            for ph in ["inject", "inject-unsampled"] if c % 2 == 0 else ["inject-unsampled", "inject"]:
                phases["plain"].append(statistics.median(take(batches)))
                MODES["_pair"] = ["--inject"] + (["--sample-bytes", NO_SAMPLING] if ph == "inject-unsampled" else [])
                tr = Tracer(b, "_pair", p.pid, f"pair-{c}-{ph}")
                try:
                    phases[ph].append(statistics.median(take(batches)))
                finally:
                    tr.finish()
        phases["plain"].append(statistics.median(take(batches)))
    finally:
        stop_process(p, signal.SIGKILL, 30)
    med = {k: statistics.median(v) for k, v in phases.items() if v}
    b.say(
        f"\n### malloc(32)+free pair, plain vs hooked\n\nbench/pair.c (glibc malloc), one process on CPU "
        f"{','.join(map(str, b.cpus.redis))}: {batches} batches of 2,000,000 pairs per phase, plain and hooked "
        f"alternately ({cycles} cycles); per phase the median batch, then the median over phases.\n"
    )
    b.say("| phase | ns a pair (median; phases min–max) | over plain |")
    b.say("|---|---|---|")
    for k, v in phases.items():
        if v:
            b.say(f"| {k} | {med[k]:.2f} ({min(v):.2f}–{max(v):.2f}) | {med[k] - med['plain']:+.2f} |")
    return med


def sigkill_check(b: Bench, wl) -> str:
    srv, _ = wl.start()
    pid = srv.pid
    tr = None
    try:
        before = text_snapshot(pid)
        tr = Tracer(b, "inject", pid, f"kill-{wl.name}")
        hooked = sorted(set(changed(pid, before)))
        wd = "allocscope-wd" in thread_names(pid)
        time.sleep(0.5)
        t0 = time.monotonic()
        tr.proc.kill()
        left = hooked
        while left and time.monotonic() - t0 < 10:
            time.sleep(0.02)
            left = changed(pid, before)
        took = time.monotonic() - t0
        tr.proc.wait()
        tr.mon.stop()
        tr = None
        while "allocscope-wd" in thread_names(pid) and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        if wl.name == "redis":
            wl.load(wl_port(srv), 2000)
            serving = redis_cmd(wl_port(srv), "PING").startswith(b"+PONG")
        else:
            s0 = Rustd.stats(srv)
            time.sleep(0.5)
            serving = Rustd.stats(srv)["requests"] > s0["requests"]
        stop_process(srv, signal.SIGTERM, 60)
        rc = srv.returncode
        return (
            f"{wl.name}: patched while recording: {', '.join(hooked) or 'NOTHING'} (watchdog thread "
            f"{'up' if wd else 'MISSING'}); allocscope SIGKILLed: every code byte back after {took:.2f} s"
            f"{'' if not left else ' — NOT restored: ' + ', '.join(left)}; serving afterwards: "
            f"{'yes' if serving else 'NO'}; exit {rc} on SIGTERM"
        )
    except (TrialError, OSError, subprocess.CalledProcessError) as e:
        return f"{wl.name}: SIGKILL check failed: {e}"
    finally:
        end_trial(tr, srv)


def wl_port(srv: subprocess.Popen) -> int:
    argv = list(srv.args)
    return int(argv[argv.index("--port") + 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("allocscope", nargs="?")
    ap.add_argument("out", nargs="?", help="markdown results file")
    ap.add_argument("--build-bins", metavar="DIR", help="only build syscalls, pair and rustd into DIR, then exit")
    ap.add_argument("--bins", help="syscalls, pair, rustd built elsewhere (--build-bins)")
    ap.add_argument("--redis-dir", help="redis-server, redis-benchmark and the libraries they need")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100000, help="redis-benchmark -n per test")
    ap.add_argument("--seconds", type=float, default=5.0, help="rustd's measured window")
    ap.add_argument("--rustd-threads", type=int, help="default: 8 on >= 8 CPUs (or fewer), else 4")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="an ad-hoc allocscope mode: NAME records with the `record` arguments ARGS, e.g. "
        "inject-nowait='--inject --wait-min 0' (repeatable; add NAME to --modes); ARGS starting "
        "with @EXE: that allocscope instead (an A/B of two checkouts)",
    )
    ap.add_argument("--workloads", default="redis,rustd")
    ap.add_argument("--tax-rounds", type=int, default=5)
    ap.add_argument("--tax-calls", type=int, default=1000000)
    ap.add_argument("--pair-cycles", type=int, default=2, help="plain/hooked cycles (each hooks twice)")
    ap.add_argument("--pair-batches", type=int, default=15)
    ap.add_argument("--skip", default="", help="comma-separated: tax, pair, kill, estimates")
    ap.add_argument("--no-estimates", action="store_true", help="no `allocscope report` of the recordings")
    ap.add_argument("--workdir", help="keep the traces here (default: a temporary directory, removed)")
    a = ap.parse_args()
    if a.build_bins:
        build_bins(Path(a.build_bins))
        print(f"built {', '.join(sorted(os.listdir(a.build_bins)))} in {a.build_bins}")
        return
    if not a.allocscope or not a.out:
        ap.error("ALLOCSCOPE and OUT.md are needed (or --build-bins DIR)")
    if os.geteuid() != 0:
        sys.exit("bench/inject_floor.py: run as root (it attaches BPF probes and injects)")
    for d in a.define:
        name, _, extra = d.partition("=")
        MODES[name.strip()] = extra.split()
    skip = set(filter(None, a.skip.split(",")))
    a.no_estimates = a.no_estimates or "estimates" in skip
    modes = [m for m in a.modes.split(",") if m in MODES]
    if "untraced" not in modes:
        modes.insert(0, "untraced")
    heaptrack_note = ""
    if "heaptrack" in modes and not shutil.which("heaptrack"):
        modes.remove("heaptrack")
        heaptrack_note = "heaptrack: not installed on this box, not run."
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="inject-floor-"))
    work.mkdir(parents=True, exist_ok=True)
    b = Bench(a, work)
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    started = time.strftime("%Y-%m-%d %H:%M")
    b.say(f"## `--inject` at the in-process floor — {started}\n")
    b.say(f"Command: `{' '.join(sys.argv)}`\n")
    b.say(
        f"Machine: {os.cpu_count()} CPUs ({len(physical_cpus())} physical cores usable), kernel "
        f"{platform.release()}, load average at the start {' '.join(load0)}. CPUs: {b.cpus.describe()}."
    )
    if heaptrack_note:
        b.say(heaptrack_note)
    results: dict[str, dict] = {}
    summary = []
    try:
        wls = {"redis": Redis(b, a.requests), "rustd": Rustd(b, a.seconds)}
        for name in a.workloads.split(","):
            results[name] = interleaved(b, wls[name], modes, a.rounds)
        oks = estimates_section(b, results) if not a.no_estimates else []
        tax = syscall_tax(b, a.tax_rounds, a.tax_calls, 5) if "tax" not in skip else []
        pair = pair_cost(b, a.pair_cycles, a.pair_batches) if "pair" not in skip else {}
        kills = [sigkill_check(b, wls[n]) for n in a.workloads.split(",")] if "kill" not in skip else []
        if kills:
            b.say("\n### SIGKILL of allocscope during an injected recording\n")
            for k in kills:
                b.say(f"* {k}")
        b.say("\n### Issue #33's goals, from this run\n")
        for name, res in results.items():
            kept = [t["kept"] for t in res.get("inject", []) if "kept" in t]
            cpu = [t["cpu_ratio"] for t in res.get("inject", []) if "cpu_ratio" in t]
            if kept:
                k = statistics.median(kept)
                b.say(
                    f"* {name}: `--inject` keeps {k * 100:.1f} % of the throughput (goal >= 98 %: "
                    f"{'met' if k >= 0.98 else 'NOT met'}); its CPU per request {statistics.median(cpu) * 100:.1f} % "
                    "of untraced"
                )
                summary.append(f"{name} inject {k * 100:.1f} %")
        if pair:
            d = pair.get("inject-unsampled", float("nan")) - pair["plain"]
            b.say(
                f"* the unsampled hooked pair: {d:+.2f} ns over the plain pair (goal <= 10 ns: "
                f"{'met' if d <= 10 else 'NOT met'}); with the default sampling "
                f"{pair.get('inject', float('nan')) - pair['plain']:+.2f} ns"
            )
        if tax:
            b.say(f"* syscall tax on an unrelated process: {'; '.join(tax)}")
        if oks:
            b.say(f"* estimates within their error bars: {sum(oks)}/{len(oks)}")
        load1 = Path("/proc/loadavg").read_text().split()[:3]
        b.say(f"\nLoad average at the end: {' '.join(load1)}.")
    finally:
        finish_results(a.out, b.lines, work, bool(a.workdir))


if __name__ == "__main__":
    main()
