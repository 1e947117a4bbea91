"""DWARF unwinding in BPF on release builds: C -O2 -fomit-frame-pointer, Rust -C opt-level=2,
C++ -O2 (tests/targets/nofp, tests/targets/rust, tests/targets/cxx). Every target waits for a
line on stdin before it allocates, so the tracer is attached first; frames and lines are checked
against markers in the sources ("L7", "R2", ...)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import (
    ROOT,
    RUSTC_ELSEWHERE,
    TARGETS_SRC,
    attached,
    build,
    cli,
    find_tool,
    functions,
    report_json,
    report_json_text,
    unavailable,
    wait_for,
)

pytestmark = pytest.mark.bpf

NOFP_CFLAGS = ["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-Wall"]


@pytest.fixture(scope="session")
def release_targets(tmp_path_factory) -> dict[str, Path]:
    """Release builds without frame pointers: nofp/*.c (gcc), cxx/*.cpp (g++), rust/*.rs (rustc,
    when installed)."""
    out = tmp_path_factory.mktemp("release-targets")
    built: dict[str, Path] = {}
    for src in sorted((TARGETS_SRC / "nofp").glob("*.c")):
        built[src.stem] = build(out / src.stem, src, "-ldl", flags=NOFP_CFLAGS)
    for src in sorted((TARGETS_SRC / "nofp" / "lib").glob("*.c")):
        built[f"lib{src.stem}"] = build(out / f"lib{src.stem}.so", src, flags=[*NOFP_CFLAGS, "-shared", "-fPIC"])
    deep = TARGETS_SRC / "nofp" / "deep.c"
    # CFI only in .debug_frame (no .eh_frame for the program's own code)
    built["deep_debugframe"] = build(
        out / "deep_debugframe", deep, flags=[*NOFP_CFLAGS, "-fno-asynchronous-unwind-tables"]
    )
    # no CFI at all for the program's code, frame pointers instead
    built["deep_nocfi"] = build(
        out / "deep_nocfi",
        deep,
        flags=["-O1", "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables", "-pthread"],
    )
    for src in sorted((TARGETS_SRC / "cxx").glob("*.cpp")):
        built[src.stem] = build(out / src.stem, src, flags=["-O2", "-g", "-pthread", "-Wall"], cc="g++")
    rustc = find_tool("rustc", *RUSTC_ELSEWHERE)
    if rustc:
        for src in sorted((TARGETS_SRC / "rust").glob("*.rs")):
            built[src.stem] = build(
                out / src.stem, src, flags=["-C", "opt-level=2", "-g", "--edition", "2021"], cc=rustc, cwd=out
            )
    return built


def marker_lines(src: Path) -> dict[str, int]:
    """'L7' -> line of the comment /* L7 */ or // L7 in src."""
    out = {}
    for i, line in enumerate(src.read_text().splitlines(), 1):
        for m in re.finditer(r"(?:/\*|//)\s*([A-Z]\d+)\b", line):
            out[m.group(1)] = i
    return out


class Target:
    def __init__(self, exe: Path, *args: str) -> None:
        self.p = subprocess.Popen(
            [str(exe), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def expect(self, prefix: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r, _, _ = select.select([self.p.stdout], [], [], 0.2)
            if r:
                line = self.p.stdout.readline()
                if line.startswith(prefix):
                    return
                if not line and self.p.poll() is not None:
                    break
        raise AssertionError(f"target did not print {prefix!r} (rc={self.p.poll()}): {self.p.stderr.read()}")

    def go(self) -> None:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def exit(self) -> None:
        self.p.stdin.close()
        self.p.wait(30)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


@pytest.fixture
def run_target(tmp_path, tracers):
    started: list[Target] = []

    def run(
        exe: Path, name: str, *record_args: str, stop: str = "sigint", target_args: tuple[str, ...] = ()
    ) -> tuple[Path, Target]:
        """Attach to `exe` (waiting for its go line), let it work, then stop the recording:
        stop="sigint" (target left running) or "exit" (the target exits, ending it)."""
        tgt = Target(exe, "--wait-stdin", *target_args)
        started.append(tgt)
        tgt.expect("ready")
        out = tmp_path / f"{name}.allocscope"
        tr = tracers("record", "--pid", str(tgt.p.pid), "-o", str(out), "--interval", "0.5", *record_args)
        wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
        assert tr.poll() is None, tr.stderr.read()
        tgt.go()
        tgt.expect("done")
        time.sleep(0.6)
        if stop == "exit":
            tgt.exit()
        else:
            tr.send_signal(signal.SIGINT)
        assert tr.wait(120) == 0, tr.stderr.read()
        return out, tgt

    yield run
    for t in started:
        t.kill()


def site_with(rep: dict, function: str) -> dict:
    found = [s for s in rep["sites"] if s["frames"] and s["frames"][0]["function"] == function]
    assert found, f"no site starting at {function}; sites: {[functions(s['frames'])[:3] for s in rep['sites']]}"
    return found[0]


def assert_thread_bottom(frames: list[dict]) -> None:
    """The stack reaches the start of its thread."""
    assert functions(frames)[-2:] == ["start_thread", "clone3"], functions(frames)


def test_c_nofp_ten_frames(release_targets, run_target):
    src = TARGETS_SRC / "nofp" / "deep.c"
    mark = marker_lines(src)
    out, tgt = run_target(release_targets["deep"], "deep")
    rep = report_json(out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["unwind"]["mode"] == "dwarf", meta["unwind"]
    assert rep["totals"]["lost_events"] == 0, rep["totals"]

    # 10 noinline calls deep, in order, each with its call line
    s = site_with(rep, "level10")
    fr = s["frames"]
    assert functions(fr)[:11] == [f"level{i}" for i in range(10, 0, -1)] + ["deep_main"], functions(fr)
    for i, f in zip(range(10, 0, -1), fr):
        assert f["file"].endswith("deep.c") and f["line"] == mark[f"L{i}"], (i, f)
    assert fr[10]["line"] == mark["T0"]
    assert_thread_bottom(fr)
    assert (s["live_bytes"], s["live_count"]) == (3 * 4321, 3)
    assert [t["name"] for t in s["threads"]] == ["deep"]

    # syscall path: frame 0 is inside libc's mmap wrapper, unwound by its own row
    m = site_with(rep, "map_level3")
    assert functions(m["frames"])[:4] == ["map_level3", "map_level2", "map_level1", "deep_main"]
    assert [f["line"] for f in m["frames"][:4]] == [mark["M3"], mark["M2"], mark["M1"], mark["T1"]]
    assert "mmap" in m["full_frames"][0]["function"] and m["live_bytes"] == 7 * 4096
    assert_thread_bottom(m["frames"])

    c = site_with(rep, "calloc_level2")
    assert functions(c["frames"])[:3] == ["calloc_level2", "calloc_level1", "deep_main"]
    assert c["live_bytes"] == 1001 * 3

    # a signal frame on the stack: through __restore_rt back into the interrupted code
    h = site_with(rep, "on_usr2")
    hn = functions(h["frames"])
    assert hn[0] == "on_usr2" and h["frames"][0]["line"] == mark["S0"]
    i = hn.index("signal_level2")
    assert "raise" in hn[1:i], hn
    assert hn[i : i + 3] == ["signal_level2", "signal_level1", "deep_main"], hn
    assert_thread_bottom(h["frames"])

    # the same stacks once the target has exited
    tgt.exit()
    again = report_json(out)
    assert [(functions(x["frames"]), x["live_bytes"]) for x in again["sites"]] == [
        (functions(x["frames"]), x["live_bytes"]) for x in rep["sites"]
    ]


def test_c_nofp_frame_pointer_mode_is_short(release_targets, run_target):
    """--unwind fp keeps the old walk: without frame pointers the chain is lost."""
    out, _ = run_target(release_targets["deep"], "deep-fp", "--unwind", "fp")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["unwind"]["mode"] == "fp"
    rep = report_json(out)
    s = site_with(rep, "level10")
    assert "level1" not in functions(s["full_frames"]), functions(s["full_frames"])


def test_c_nofp_stacks_after_target_exit(release_targets, run_target):
    """Recording ended by the target's exit; reported after it is gone."""
    out, tgt = run_target(release_targets["deep"], "deep-exit", stop="exit")
    assert tgt.p.poll() is not None
    rep = report_json(out)
    assert rep["recording"]["end_reason"] == "target exited"
    fr = site_with(rep, "level10")["frames"]
    assert functions(fr)[:10] == [f"level{i}" for i in range(10, 0, -1)]
    assert_thread_bottom(fr)


def test_rust_release_chain(release_targets, run_target):
    if "vecchain" not in release_targets:
        unavailable(
            "rustc is not installed (looked in PATH, ~/.cargo/bin, /usr/local/cargo/bin): Rust target not built"
        )
    mark = marker_lines(TARGETS_SRC / "rust" / "vecchain.rs")
    out, _ = run_target(release_targets["vecchain"], "rust")
    rep = report_json(out)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    s = site_with(rep, "vecchain::rust_inner")
    fr = s["frames"]
    assert functions(fr)[:4] == [
        "vecchain::rust_inner",
        "vecchain::rust_middle",
        "vecchain::rust_outer",
        "vecchain::main::{{closure}}",
    ], functions(fr)
    assert [f["line"] for f in fr[:4]] == [mark["R3"], mark["R2"], mark["R1"], mark["R0"]]
    assert all(f["file"].endswith("vecchain.rs") for f in fr[:4])
    assert_thread_bottom(fr)
    full = functions(s["full_frames"])
    inner = full.index("vecchain::rust_inner")
    shims = full[:inner]
    assert shims and any(n.startswith("alloc::raw_vec::") for n in shims), full
    assert all(n.startswith(("alloc::", "<alloc::")) for n in shims), shims
    assert not any(re.search(r"_ZN|_R[0-9A-Z]|::h[0-9a-f]{16}", n) for n in full), full  # demangled
    threads = {t["name"]: t["live_bytes"] for t in s["threads"]}
    assert threads == {"vec-maker-1": 5 * 1001 * 8, "vec-maker-2": 5 * 2001 * 8}, threads
    assert (s["live_bytes"], s["live_count"]) == (5 * 1001 * 8 + 5 * 2001 * 8, 10)


def test_cxx_release_chain(release_targets, run_target):
    mark = marker_lines(TARGETS_SRC / "cxx" / "vecs.cpp")
    out, _ = run_target(release_targets["vecs"], "cxx")
    rep = report_json(out)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    chain = ["shop::cxx_inner(int)", "shop::Maker::middle(int)", "cxx_outer(int)", "worker(void*)"]
    sites = [s for s in rep["sites"] if functions(s["frames"])[:4] == chain]
    by_line = {s["frames"][0]["line"]: s for s in sites}
    # new std::vector<int>(n, 7): its buffer and the vector object, each from cxx_inner line X3
    v = by_line[mark["X3"]]
    assert v["live_bytes"] == 4 * 24 + (300 + 301 + 302 + 303) * 4, v["live_bytes"]
    full = functions(v["full_frames"])
    assert full[0] == "operator new(unsigned long)", full
    assert any(n.startswith("std::") for n in full[: full.index(chain[0])]), full
    # push_back growth: the surviving buffer
    g = by_line[mark["X4"]]
    assert g["live_count"] == 1 and any("push_back" in n for n in functions(g["full_frames"]))
    for s in (v, g):
        assert [f["line"] for f in s["frames"][1:4]] == [mark["X2"], mark["X1"], mark["X0"]]
        assert_thread_bottom(s["frames"])
    w = [s for s in rep["sites"] if functions(s["frames"])[:3] == chain[1:] and s["frames"][0]["line"] == mark["X5"]]
    assert w and w[0]["live_bytes"] == 4 * 37 * 8 and w[0]["threads"][0]["name"] == "cxx-worker"


def test_unwind_maps_match_bcc():
    """urows/umaps as BCC derives them from allocscope.h agree with tracer/unwind/unwinder.py."""
    import ctypes as ct

    from tracer.base.options import RecordOptions
    from tracer.bpf.probes import Probes
    from tracer.unwind import unwinder as UW

    p = Probes(
        os.getpid(), RecordOptions(max_live=1024, max_stacks=1024, max_sites=1024, ring_pages=16, unwind_rows=4096)
    )
    try:
        assert p.unwind == "dwarf", p.unwind_error
        for name, (key, val) in UW.MAP_LAYOUTS.items():
            t = p.bpf[name.encode()]
            assert ct.sizeof(t.Key) == ct.sizeof(key) and ct.sizeof(t.Leaf) == ct.sizeof(val), name
    finally:
        p.close()


def test_launch_mode_holds_the_loader(release_targets, tmp_path):
    """-- CMD: libraries are mapped by ld.so after exec; the probes hold it at each code mapping
    until their rows are mapped, so even the first allocations have complete stacks."""
    out = tmp_path / "launch.allocscope"
    p = cli("record", "-q", "-o", str(out), "--", str(release_targets["deep"]), "--exit", check=True, timeout=180)
    assert "(target exited with code 0)" in p.stderr and p.stdout == "done\n"  # the program's stdout alone (issue 53)
    rep = report_json(out)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    fr = site_with(rep, "level10")["frames"]
    assert functions(fr)[:10] == [f"level{i}" for i in range(10, 0, -1)]
    assert_thread_bottom(fr)
    main_sites = [s for s in rep["sites"] if "main" in functions(s["frames"])]
    assert main_sites and all(functions(s["frames"])[-1] == "_start" for s in main_sites), [
        functions(s["frames"]) for s in main_sites
    ]


def test_embedded_symbols_when_binary_is_gone(release_targets, run_target, tmp_path):
    """--embed-symbols: the trace names the frames of a binary deleted before the report."""
    exe = tmp_path / "deep-gone"
    shutil.copy(release_targets["deep"], exe)
    out, tgt = run_target(exe, "embedded", "--embed-symbols")
    tgt.exit()
    assert list((out / "parts").glob("symbols-*.parquet"))
    exe.unlink()
    rep = report_json(out)
    fr = site_with(rep, "level10")["frames"]
    assert functions(fr)[:11] == [f"level{i}" for i in range(10, 0, -1)] + ["deep_main"]
    assert fr[0]["line"] is None  # names only: lines need the file (or its debug file)
    assert_thread_bottom(fr)


def test_a_binary_deleted_while_it_runs_is_named_without_embed_symbols(release_targets, tmp_path, tracers):
    """A daemon whose binary was deleted or replaced since it started (a package upgrade): the
    trace carries that module's symbols, read through /proc/PID/map_files while it runs, so its
    frames are named (they were 'deep-upgraded+0x1234 (no symbol)', even with --embed-symbols);
    the modules still on disk are not embedded."""
    exe = tmp_path / "deep-upgraded"
    shutil.copy(release_targets["deep"], exe)
    tgt = Target(exe, "--wait-stdin")
    try:
        tgt.expect("ready")
        exe.unlink()  # the running binary is gone from the disk
        out = tmp_path / "gone.allocscope"
        tr = tracers("record", "--pid", str(tgt.p.pid), "-o", str(out), "--interval", "0.5")
        wait_for(lambda: attached(out) or tr.poll() is not None, timeout=120, what="probes attached")
        tgt.go()
        tgt.expect("done")
        time.sleep(0.6)
        tr.send_signal(signal.SIGINT)
        assert tr.wait(120) == 0, tr.stderr.read()
    finally:
        tgt.kill()
    rep = report_json(out)
    fr = site_with(rep, "level10")["frames"]
    assert functions(fr)[:11] == [f"level{i}" for i in range(10, 0, -1)] + ["deep_main"]
    assert fr[0]["module"] == str(exe)
    embedded = pa.concat_tables([pq.read_table(p) for p in (out / "parts").glob("symbols-*.parquet")])
    assert set(embedded.column("module").to_pylist()) == {str(exe)}  # libc is on disk: read there


def test_falls_back_to_frame_pointers_when_the_unwinder_cannot_load():
    """A DWARF program the kernel refuses (here: a row array too big to allocate) still traces,
    with frame pointers, and says why."""
    from tracer.base.options import RecordOptions
    from tracer.bpf.probes import Probes

    p = Probes(
        os.getpid(),
        RecordOptions(max_live=1024, max_stacks=1024, max_sites=1024, ring_pages=16, unwind_rows=(1 << 32) - 1),
    )
    try:
        assert p.unwind == "fp" and p.unwind_error
        assert p.unwinder() is None
    finally:
        p.close()


def test_debug_frame_only(release_targets, run_target):
    """Code whose CFI is only in .debug_frame (-fno-asynchronous-unwind-tables -g)."""
    out, _ = run_target(release_targets["deep_debugframe"], "debugframe")
    rep = report_json(out)
    fr = site_with(rep, "level10")["frames"]
    assert functions(fr)[:11] == [f"level{i}" for i in range(10, 0, -1)] + ["deep_main"], functions(fr)
    assert_thread_bottom(fr)
    assert rep["totals"]["lost_events"] == 0, rep["totals"]


def test_no_cfi_falls_back_to_frame_pointers_and_marks_frames(release_targets, run_target):
    """No CFI for the program's code (built with frame pointers): frame-pointer steps there,
    marked syscall = 2 in the stacks table; libc's rows take over again below."""
    import pandas as pd

    out, _ = run_target(release_targets["deep_nocfi"], "nocfi")
    rep = report_json(out)
    fr = site_with(rep, "level10")["frames"]
    assert functions(fr)[:11] == [f"level{i}" for i in range(10, 0, -1)] + ["deep_main"], functions(fr)
    assert_thread_bottom(fr)
    st = pd.concat(pd.read_parquet(p) for p in (out / "parts").glob("stacks-*.parquet"))
    sid = [s for s, g in st.groupby("stack_id") if len(g) == len(fr)]
    g = st[st["stack_id"] == sid[0]].sort_values("idx")
    marks = g["syscall"].tolist()
    # frames 1..12 (level9 .. start_thread) were found by frame-pointer steps; clone3 by start_thread's rows
    assert marks[0] == 0 and marks[1:12] == [2] * 11 and marks[-1] == 0, marks


def test_deeper_than_64_frames_is_counted_truncated(release_targets, run_target):
    out, _ = run_target(release_targets["deep"], "recurse", target_args=("--recurse", "90"))
    rep = report_json(out)
    assert rep["totals"]["losses"].get("lost_stack_truncated") == 1, rep["totals"]
    s = site_with(rep, "recurse")
    assert len(s["full_frames"]) == 64 and s["live_bytes"] == 777
    assert any("lost_stack_truncated" in a for a in rep["advice"]), rep["advice"]
    # a stack kept to its innermost 64 frames loses no event and no byte: said, never as a loss
    assert rep["totals"]["lost_events"] == 0, rep["totals"]
    assert not [f for f in rep["findings"] if f["kind"] == "losses"], rep["findings"]


DL_CHAIN = ["dl_level4", "dl_level3", "dl_level2", "dl_level1", "dl_entry", "call_lib", "main"]


def test_dlopen_in_pid_mode(release_targets, run_target):
    """A library dlopen'ed while recording gets its rows when its code is mapped (the tracer sees
    the PROT_EXEC mmap); here the program lets 300 ms pass before calling into it."""
    out, _ = run_target(
        release_targets["dlmain"], "dlopen", target_args=("--settle", "300", str(release_targets["libdlchain"]))
    )
    rep = report_json(out)
    fr = site_with(rep, "dl_level4")["frames"]
    assert functions(fr)[:7] == DL_CHAIN, functions(fr)
    assert functions(fr)[-1] == "_start"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["unwind"]["modules"] >= 4 and not meta["unwind"]["failed"], meta["unwind"]


def test_dlopen_in_launch_mode_without_delay(release_targets, tmp_path):
    """-- CMD: the probes hold the main thread at the library's code mapping until its rows are
    in, so a call right after dlopen already unwinds through it."""
    out = tmp_path / "dl-launch.allocscope"
    cli(
        "record",
        "-q",
        "-o",
        str(out),
        "--",
        str(release_targets["dlmain"]),
        "--exit",
        str(release_targets["libdlchain"]),
        check=True,
        timeout=180,
    )
    rep = report_json(out)
    fr = site_with(rep, "dl_level4")["frames"]
    assert functions(fr)[:7] == DL_CHAIN, functions(fr)
    assert functions(fr)[-1] == "_start"


def big_library(out: Path, functions: int = 4000) -> Path:
    """A large shared library (-O2, no frame pointers): big_entry -> big_mid -> big_leaf ->
    malloc in C, and `functions` more in assembly, each with its own CFI (pushes and pops of two
    registers; what makes its table big: ~140 KiB of .eh_frame, 16 000 rows). Assembled, not
    compiled: gcc takes ~5 ms a C function."""
    src = out.with_suffix(".c")
    src.write_text(
        "\n".join(
            [
                "#include <stdlib.h>",
                "#include <stdint.h>",
                "#define NI __attribute__((noinline, noipa))",
                "static void *kept[4096]; static unsigned nkept; uintptr_t mix;",
                "NI void *big_leaf(size_t size) { void *p = malloc(size); "
                "kept[nkept++ & 4095] = p; mix ^= 1; return p; }",
                "NI void *big_mid(int k, size_t size) { void *p = big_leaf(size); mix += (uintptr_t)k; return p; }",
                "NI void big_entry(int k, size_t size) { void *p = big_mid(k, size); mix ^= (uintptr_t)p; }",
            ]
        )
        + "\n"
    )
    fill = out.with_name(out.stem + "_fill.S")
    body = []
    for i in range(functions):
        body += [
            f".globl big_fill_{i}",
            f".type big_fill_{i},@function",
            f"big_fill_{i}:",
            ".cfi_startproc",
            "push %rbx",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_offset %rbx, -16",
            "push %r12",
            ".cfi_adjust_cfa_offset 8",
            ".cfi_offset %r12, -24",
            f"lea {i}(%rdi), %rax",
            "pop %r12",
            ".cfi_adjust_cfa_offset -8",
            ".cfi_restore %r12",
            "pop %rbx",
            ".cfi_adjust_cfa_offset -8",
            ".cfi_restore %rbx",
            "ret",
            ".cfi_endproc",
            f".size big_fill_{i}, .-big_fill_{i}",
        ]
    fill.write_text("\n".join([".text", *body, '.section .note.GNU-stack,"",@progbits']) + "\n")
    return build(out, src, fill, flags=["-O2", "-g0", "-fomit-frame-pointer", "-shared", "-fPIC"])


def test_lazy_tables_cold_cache(release_targets, tmp_path):
    """`record --pid` with an empty unwind cache: the probes attach without building the tables of
    a large library on the allocation path; the stacks that reach it before its table is built
    end there, are counted (exactly: N1) and said; once it is built (in the pool, because stacks
    crossed it) the stacks go through it to main. Modules no stack crossed are never built."""
    from elftools.elf.elffile import ELFFile

    from tracer.base.cachedir import cache_dir
    from tracer.unwind import building as UB

    lib = big_library(tmp_path / "libbig.so")
    with open(lib, "rb") as f:  # pending whatever the decoder (never built at once)
        assert UB.cfi_bytes(ELFFile(f)) > max(UB.INLINE_CFI_BYTES, UB.NATIVE_INLINE_CFI_BYTES)
    cache = tmp_path / "cache"
    (cache / "unwind").mkdir(parents=True)
    bpf = cache_dir("bpf")  # the probes' compile cache stays warm: only the unwind tables are cold
    bpf.mkdir(parents=True, exist_ok=True)
    (cache / "bpf").symlink_to(bpf)
    n1, n2 = 7, 5
    tgt = Target(release_targets["lazy"], str(lib), str(n1), str(n2))
    out = tmp_path / "lazy.allocscope"
    env = dict(os.environ, ALLOCSCOPE_CACHE_DIR=str(cache))
    tr = subprocess.Popen(
        [sys.executable, "-m", "allocscope", "record", "--pid", str(tgt.p.pid), "-o", str(out), "--interval", "0.5"],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(tr.stderr.readline, "")), daemon=True)
    try:
        tgt.expect("ready")
        t0 = time.monotonic()
        reader.start()
        wait_for(
            lambda: any("recording pid" in x for x in lines) or tr.poll() is not None,
            timeout=60,
            what="probes attached",
        )
        live_s = time.monotonic() - t0
        assert tr.poll() is None, "".join(lines)
        tgt.go()
        tgt.expect("phase1")
        # libc.so.6 too: the wait that follows "phase1" (in read, from main) is cut short there
        wait_for(
            lambda: all(any(f"unwind table for {m}" in x for x in lines) for m in ("libbig.so", "libc.so.6")),
            timeout=120,
            what="libbig.so's and libc's tables built",
        )
        tgt.go()
        tgt.expect("done")
        time.sleep(0.6)
        tr.send_signal(signal.SIGINT)
        assert tr.wait(120) == 0, "".join(lines)
    finally:
        tgt.kill()
        if tr.poll() is None:
            tr.kill()
    reader.join(10)
    built = next(x for x in lines if "unwind table for libbig.so" in x)
    assert re.search(
        r"unwind table for libbig\.so: \d+ rows in [\d.]+ s; stacks through it complete from "
        r"\+[\d.]+ s",
        built,
    ), built

    meta = json.loads((out / "meta.json").read_text())
    unw = meta["unwind"]
    assert unw["lazy"] and unw["mode"] == "dwarf", unw
    pend = {os.path.basename(p["module"]): p for p in unw["pending"]}
    big = pend["libbig.so"]
    assert big["stacks"] == n1 and big["built_s"] is not None and big["rows"] > 16000 and not big["error"], big
    assert big["first_s"] <= big["last_s"] < big["built_s"], big
    assert "libbig.so" in unw["built"] and unw["never_crossed"] >= 0
    # the tables of what no stack crossed were not built (only cached, tiny or crossed modules are in the cache)
    built_keys = {p.name for p in (cache / "unwind").iterdir()}
    assert len(built_keys) == len(unw["built"]), (built_keys, unw["built"])
    # the probes went live before the table (truncated stacks prove it) and without waiting for it
    assert live_s < 30, live_s

    rep, report_text = report_json_text(out)  # `report --format json`, and its text
    losses = rep["totals"]["losses"]
    assert losses.get("lost_stack_pending") == sum(p["stacks"] for p in unw["pending"]), (losses, unw["pending"])
    early = [s for s in rep["sites"] if s["live_bytes"] == n1 * 4321]
    assert len(early) == 1 and early[0]["live_count"] == n1, [
        (functions(s["frames"]), s["live_bytes"]) for s in rep["sites"]
    ]
    assert functions(early[0]["full_frames"]) == ["big_leaf"], early[0]["full_frames"]
    late = [s for s in rep["sites"] if s["live_bytes"] == n2 * 1234]
    assert len(late) == 1 and late[0]["live_count"] == n2
    fr = functions(late[0]["full_frames"])
    assert fr[:5] == ["big_leaf", "big_mid", "big_entry", "rounds", "main"], fr
    assert late[0]["frames"][3]["line"] == marker_lines(TARGETS_SRC / "nofp" / "lazy.c")["Z1"]
    note = f"{n1} stacks cut short in libbig.so until +{big['built_s']:.1f} s while its unwind table was built"
    assert any(a.startswith(note) for a in rep["advice"]), rep["advice"]
    assert [p["stacks"] for p in rep["recording"]["unwind_pending"] if p["module"].endswith("libbig.so")] == [n1], rep[
        "recording"
    ]["unwind_pending"]
    # the wait after "phase1" was cut short at libc; the one after "done" (the same place, still
    # blocked at the end) was unwound again, complete: a stack cut short is not kept in the wait memo
    from common.tracefile.reader import load_trace
    from reports.analysis.stacks import symbolize_stacks

    trace = load_trace(str(out))
    stacks = symbolize_stacks(trace)
    waited = [[f.function for f in stacks[int(sid)]] for sid in set(trace.waits["stack_id"].tolist())]
    blocked = [[f.function for f in stacks[int(sid)]] for sid in set(trace.blocked["stack_id"].tolist())]
    assert ["read"] in waited and any(w[0] == "read" and "main" in w for w in blocked), (waited, blocked)
    text = report_text  # what `allocscope report OUT` prints
    assert note in text, text
    html = cli("report", str(out), "--format", "html", check=True).stdout
    assert note in html
