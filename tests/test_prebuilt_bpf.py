"""The probes built once (tracer/bpf/prebuilt.py, `make setup`): every option combination the CLI
accepts finds its program in the one store and every program it may load passes this kernel's
verifier, with no compile; a real recording from it counts a known target exactly.

Programs are relocated and loaded as a recording loads them (prebuilt.relocate, syscall.load_prog, the
attach type tracer.bpf.program.Program gives them); a program whose relocated instructions,
type and attach type another combination already loaded is not loaded twice (the verifier's
verdict depends on nothing else: the maps are the same kinds and sizes).
"""

from __future__ import annotations

import itertools
import os

import pytest
from support import IN_CI, cli, functions, report_json

from common.errors import AllocscopeError, UsageError
from tracer.base.options import RecordOptions
from tracer.bpf import prebuilt, syscall
from tracer.bpf.autoload import tail_programs
from tracer.bpf.cache import INSN
from tracer.bpf.program import Program
from tracer.bpf.source import links_choice, probe_config, session_choice
from tracer.record.validate import validate

pytestmark = pytest.mark.bpf

KPROBE, TRACEPOINT, PERF_EVENT, RAW_TRACEPOINT = 2, 5, 7, 17
SMALL = {"max_live": 1024, "max_stacks": 1024, "max_sites": 1024, "ring_pages": 16, "unwind_rows": 4096}
SESSION_PROGS = ("heap_session", "salloc_unwind", "salloc_keep")


def _store() -> dict:
    try:
        return prebuilt.load_store()
    except prebuilt.NotPrebuilt as e:
        if IN_CI:
            pytest.fail(f"CI=true but {e}", pytrace=False)
        pytest.skip(str(e))


def combinations():
    """Every combination of the options that choose programs or their constants, as the CLI
    accepts them (validate; --inject needs --pid): (options, launched)."""
    for mode, sample, inject, launched, unwind, uprobes, sessions, floor, rss in itertools.product(
        ("full", "residency"),
        (0, 524288),
        (False, True),
        (False, True),
        ("dwarf", "fp"),
        ("auto", "multi", "perf"),
        ("auto", "on", "off"),
        (False, True),
        (False, True),
    ):
        opts = RecordOptions(
            mode=mode,
            sample_bytes=sample,
            inject=inject,
            unwind=unwind,
            uprobes=uprobes,
            uprobe_sessions=sessions,
            probe_floor=floor,
            rss_tracepoint=rss,
            **SMALL,
        )
        try:
            validate(opts, output=False)
        except UsageError:
            continue
        if inject and launched:
            continue  # record -- CMD --inject: refused by the CLI (--pid only)
        yield opts, launched


def programs(p: Program, entry: dict, unwind: str) -> list[tuple[str, int, int]]:
    """(program, type, attach type) a recording with these options may load: the tracepoint
    programs, the syscall exits' tails, those Program verifies at start, and every uprobe program
    (heap, CUDA, --alloc-fn, markers) with the attach type Program.load gives it."""
    out = []
    for name in entry["funcs"]:
        if name.startswith("tracepoint__"):
            out.append((name, TRACEPOINT, -1))
        elif name.startswith("raw_tracepoint__"):
            out.append((name, RAW_TRACEPOINT, -1))
    tails = [(n.decode(), t) for n, t in tail_programs(p.bcc, entry["funcs"])]
    out += [(n, t, -1) for n, t in tails]
    for item in p.programs_needed(unwind):
        out.append((item[0].decode(), item[1], item[3] if len(item) > 3 else -1))
    if p.options.mode == "full":
        for name in entry["funcs"]:
            if name.startswith(("tracepoint__", "raw_tracepoint__", "fault_")) or name in dict(tails):
                continue
            if name in SESSION_PROGS and not p.session:
                continue
            out.append((name, KPROBE, p.attach_type(name.encode())))
    return sorted(set(out))


def test_every_option_combination_loads_from_the_one_build():
    store = _store()
    import bcc  # BCC's program-type names, as Program uses them

    pid = os.getpid()
    maps: dict[str, dict[str, int]] = {}  # variant and attach mode -> its maps (name -> fd), made once
    loaded: dict[tuple, int] = {}
    combos = entries = 0
    used_variants = set()
    try:
        for opts, launched in combinations():
            try:
                multi, _ = links_choice(opts)
                session, _ = session_choice(opts)
            except AllocscopeError:
                continue  # the kernel lacks what the option insists on (not on this box's 6.18)
            combos += 1
            flags, consts = probe_config(opts, launched, opts.unwind, opts.rss_tracepoint, pid)
            entry = prebuilt.find(flags, consts, store)  # raises NotPrebuilt: a compile would be needed
            used_variants.add(entry["variant"])
            # a program array takes programs of the type and attach type of the first that uses it:
            # one set of maps per variant and way of attaching, as each recording has its own
            mkey = f"{entry['variant']} multi={multi} session={session}"
            if mkey not in maps:
                sizes = prebuilt.table_sizes(entry, flags)
                maps[mkey] = {row[0]: syscall.create_map(row, sizes[row[0]]) for row in entry["tables"]}
            fds = maps[mkey]
            p = Program.__new__(Program)  # its choices of programs, without loading anything
            p.options, p.multi, p.session, p.bcc = opts, multi, session, bcc
            for name, ptype, attach in programs(p, entry, opts.unwind):
                code = prebuilt.relocate(entry, name, consts, fds.__getitem__)
                for i in range(len(code) // 8):
                    imm = INSN.unpack_from(code, i * 8)[3]
                    assert not prebuilt.MARKER_BASE <= imm < prebuilt.MARKER_BASE + prebuilt.MARKER_SPAN, (name, i)
                # the verdict depends on the instructions, types and maps' kinds, not on fd numbers
                key = (entry["variant"], name, ptype, attach, prebuilt.relocate(entry, name, consts, lambda _t: 0))
                if key in loaded:
                    continue
                entries += 1
                loaded[key] = syscall.load_prog(name, code, ptype, entry["license"], attach)
    finally:
        for fd in loaded.values():
            os.close(fd)
        for fds in maps.values():
            for fd in fds.values():
                os.close(fd)
    # every combination came from the store's variants (4: DWARF or frame pointers, with or
    # without the rss_stat program), and each of them served some
    assert used_variants == set(store["variants"]), (used_variants, list(store["variants"]))
    assert combos >= 200, combos
    print(f"{combos} option combinations, {entries} distinct programs verified")


@pytest.mark.parametrize("extra", [[], ["--sample-bytes", "1"]], ids=["default", "sampled"])
def test_recording_from_the_store_needs_no_compiler(tmp_path, targets, extra):
    """Launch mode (AS_LAUNCHED set at load: nothing counts before the exec) of apis.c from the
    store, with an empty cache and BCC pointed at no kernel headers (a compile would fail):
    apis.c's leaks counted exactly (--sample-bytes 1: every block kept, weight = size)."""
    _store()
    env = dict(os.environ, ALLOCSCOPE_CACHE_DIR=str(tmp_path / "cache"), BCC_KERNEL_SOURCE=str(tmp_path / "none"))
    out = tmp_path / "run.allocscope"
    p = cli("record", "--verbose", *extra, "-o", str(out), "--", str(targets["apis"]), env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "(prebuilt, no compile)" in p.stderr, p.stderr[-3000:]
    assert "compile (BCC" not in p.stderr and "compiling the probes here" not in p.stderr
    rep = report_json(out)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    live: dict[str, list[int]] = {}
    for site in rep["sites"]:
        names = functions(site["frames"])
        if names:
            a = live.setdefault(names[0], [0, 0, 0])
            a[0] += site["live_bytes"]
            a[1] += site["live_count"]
            a[2] += site["alloc_count"]
    assert live["leak_malloc"] == [7 * 1013, 7, 7], live.get("leak_malloc")
    assert live["leak_calloc"] == [11 * 17 * 61, 11, 11], live.get("leak_calloc")
    assert live["pre_attach_alloc"][:2] == [0, 0] and live["pre_attach_alloc"][2] == 5  # after the exec: all seen


GATE_CHECK = r"""
import os, shutil, subprocess, sys, time
from tracer.watch.gate import ExecGate, wait_stopped
exe = os.path.join(sys.argv[1], "asgatecheck")
shutil.copy("/bin/sleep", exe)
gate = ExecGate(["asgatecheck"])
print("compiled:", gate.compiled_why)
p = subprocess.Popen([exe, "30"])
try:
    gate.poll(2000)
    held = gate.events.get(timeout=2)
    print("held:", held.pid == p.pid, wait_stopped(p.pid, 2.0), gate.holding() == [p.pid])
    gate.release(p.pid)
    time.sleep(0.2)
    with open(f"/proc/{p.pid}/stat") as f:
        print("after release:", f.read().split(") ")[1][0], gate.holding())
finally:
    gate.close()
    p.kill()
    p.wait()
"""


def test_watch_gate_from_the_store_needs_no_compiler(tmp_path):
    """The watch's exec gate (probes/watch.bpf.c) comes from the same store: loaded with BCC
    pointed at no kernel headers (a compile would fail), it stops an exec of a watched name
    before its first instruction and lets it go on release."""
    _store()
    import subprocess
    import sys

    env = dict(os.environ, BCC_KERNEL_SOURCE=str(tmp_path / "none"))
    p = subprocess.run(
        [sys.executable, "-c", GATE_CHECK, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(prebuilt.L.PROBES_DIR.parent),
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["compiled: None", "held: True True True", "after release: S []"], p.stdout
