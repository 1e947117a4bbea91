"""tracer/unwind/ without BPF: CFI rows of compiled programs and system libraries, the cache,
LPM prefixes and slices."""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import support
from elftools.elf.elffile import ELFFile

from common.elf import segments, vaddr_to_offset
from tracer.bpf.symbols import symbol_offsets
from tracer.unwind import building as UB
from tracer.unwind import rows as UR
from tracer.unwind import unwinder as UW

SRC = r"""
#include <stdlib.h>
void *volatile sink;
__attribute__((noinline, noipa)) void *leaf(unsigned long n) { void *p = malloc(n); sink = p; return p; }
__attribute__((noinline, noipa)) void *mid(unsigned long n) { void *p = leaf(n); sink = p; return p; }
int main(void) { return mid(10) == 0; }
"""


def build(tmp: Path, name: str, *flags: str) -> Path:
    src = tmp / "u.c"
    src.write_text(SRC)
    # the rows below are those of functions without an endbr64 first (Ubuntu's gcc adds one by default)
    return support.build(tmp / name, src, flags=[*flags, "-fcf-protection=none"])


def table(path: Path | str) -> UR.TableInfo:
    with open(path, "rb") as f:
        return UR.build_table(ELFFile(f))


def row_at(rows: np.ndarray, off: int) -> tuple[int, int, int]:
    """(cfa_type, cfa_off, rbp_off) of the row covering file offset `off`."""
    i = int(np.searchsorted(rows["pc"], off, side="right")) - 1
    r = rows[i]
    return int(r["cfa_type"]), int(r["cfa_off"]), int(r["rbp_off"])


def test_rows_of_a_no_frame_pointer_build(tmp_path):
    exe = build(tmp_path, "nofp", "-O2", "-fomit-frame-pointer")
    info = table(exe)
    rows = info.rows
    assert info.sources == [".eh_frame"] and info.fdes >= 3
    assert np.all(np.diff(rows["pc"].astype(np.int64)) > 0), "sorted, one row per pc"
    offs = symbol_offsets(str(exe), ["leaf", "mid", "_start"]).offsets
    # first instruction: CFA = rsp + 8, rbp untouched; after `sub $8,%rsp`: rsp + 16
    assert row_at(rows, offs["mid"]) == (UR.CFA_RSP, 1, 0)
    assert row_at(rows, offs["mid"] + 4) == (UR.CFA_RSP, 2, 0)
    # _start: return address undefined, the end of the stack
    assert row_at(rows, offs["_start"] + 4)[0] == UR.CFA_STOP
    # consecutive rows never repeat a rule
    enc = list(zip(rows["cfa_type"].tolist(), rows["cfa_off"].tolist(), rows["rbp_off"].tolist()))
    assert all(a != b for a, b in zip(enc, enc[1:]))


def test_rows_of_a_frame_pointer_build(tmp_path):
    exe = build(tmp_path, "fp", "-O1", "-fno-omit-frame-pointer")
    rows = table(exe).rows
    off = symbol_offsets(str(exe), ["mid"]).offsets["mid"]
    # push %rbp; mov %rsp,%rbp: then CFA = rbp + 16, caller's rbp at CFA - 16
    assert row_at(rows, off) == (UR.CFA_RSP, 1, 0)
    assert row_at(rows, off + 1) == (UR.CFA_RSP, 2, -2)
    assert row_at(rows, off + 4) == (UR.CFA_RBP, 2, -2)


def test_gaps_between_functions_fall_back(tmp_path):
    """An FDE ends with a `none` row unless the next one starts there."""
    exe = build(tmp_path, "gaps", "-O2", "-fomit-frame-pointer")
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        di, _ = UR.frame_dwarfinfo(elf)
        segs = segments(elf)
        fdes = [e for e in di.EH_CFI_entries() if isinstance(e, UR.FDE)]
        starts = {vaddr_to_offset(segs, e.header["initial_location"], whole=True) for e in fdes}
        rows = UR.build_table(elf).rows
    pcs = dict(zip(rows["pc"].tolist(), rows["cfa_type"].tolist()))
    for e in fdes:
        end = vaddr_to_offset(segs, e.header["initial_location"] + e.header["address_range"], whole=True, end=True)
        if end not in starts:
            assert pcs.get(end) == UR.CFA_NONE, hex(end)


def test_system_libraries():
    """glibc and libstdc++: every FDE decodes (DW_CFA_GNU_args_size included), PLT and the signal
    trampoline are recognized, clone3 ends the stack."""
    import glob

    libc = sorted(glob.glob("/lib/x86_64-linux-gnu/libc.so.6") + glob.glob("/usr/lib/x86_64-linux-gnu/libc.so.6"))[0]
    info = table(libc)
    assert info.kinds.get("signal") == 1 and info.kinds.get("plt", 0) >= 1 and info.kinds.get("stop", 0) >= 1
    assert 15_000 < len(info.rows) < 80_000
    assert info.kinds.get("unsupported", 0) < 20
    cxx = glob.glob("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    if cxx:
        with open(cxx[0], "rb") as f:
            elf = ELFFile(f)
            di, _ = UR.frame_dwarfinfo(elf)
            n = sum(isinstance(e, UR.FDE) for e in di.EH_CFI_entries())
            assert UR.build_table(elf).fdes == n


def test_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    exe = build(tmp_path, "cached", "-O2", "-Wl,--build-id")
    key, rows, cached = UB.load_rows(str(exe))
    assert not cached and len(key) == 40
    assert (tmp_path / "cache" / "unwind" / f"v{UR.CACHE_VERSION}-{key}.npy").exists()
    key2, rows2, cached2 = UB.load_rows(str(exe))
    assert cached2 and key2 == key and np.array_equal(rows, rows2) and rows2.dtype == UR.ROW


@pytest.mark.parametrize("seed", range(5))
def test_prefixes_cover_exactly(seed):
    rnd = random.Random(seed)
    for _ in range(200):
        lo = rnd.randrange(0, 1 << 47) & ~0xFFF if rnd.random() < 0.5 else rnd.randrange(0, 1 << 47)
        hi = lo + rnd.randrange(1, 1 << rnd.randrange(1, 34))
        covered = lo
        n = 0
        for addr, plen in UB.prefixes(lo, hi):
            size = 1 << (64 - plen)
            assert addr == covered and addr % size == 0
            covered += size
            n += 1
        assert covered == hi and n <= 2 * 64


def test_big_modules_are_split(monkeypatch):
    monkeypatch.setattr(UW, "MAX_SLICE", 4)
    rows = np.zeros(10, dtype=UR.ROW)
    rows["pc"] = np.arange(10) * 16
    sl = UW.slices_of(10, rows, 100)
    assert sl == [(0, 64, 100, 4), (64, 128, 104, 4), (128, 1 << 32, 108, 2)]


def test_row_layout_matches_header(tmp_path):
    """The numpy row and the ctypes classes agree with allocscope.h (what BPF reads)."""
    import ctypes as ct

    lines = [
        'printf("%zu %zu %zu %zu %zu\\n", sizeof(struct as_urow), offsetof(struct as_urow, cfa_off),'
        " offsetof(struct as_urow, cfa_type), offsetof(struct as_urow, rbp_off), sizeof(struct as_umap_key));",
        'printf("%zu %zu %zu %zu\\n", sizeof(struct as_umap), offsetof(struct as_umap, count),'
        " offsetof(struct as_umap, module), offsetof(struct as_umap, flags));",
        'printf("%zu %zu %u\\n", sizeof(struct as_upending), offsetof(struct as_upending, last_ns), AS_UMAP_PENDING);',
    ]
    out = support.run_c_with_header(tmp_path, lines).split()
    assert [int(x) for x in out] == [
        UR.ROW.itemsize,
        UR.ROW.fields["cfa_off"][1],
        UR.ROW.fields["cfa_type"][1],
        UR.ROW.fields["rbp_off"][1],
        ct.sizeof(UW.UmapKey),
        ct.sizeof(UW.Umap),
        UW.Umap.count.offset,
        UW.Umap.module.offset,
        UW.Umap.flags.offset,
        ct.sizeof(UW.Upending),
        UW.Upending.last_ns.offset,
        UW.UMAP_PENDING,
    ]


def test_pprof_keeps_addresses_of_inlined_frames():
    """symbolize_stacks expands inlined frames; pprof maps each back to its captured address."""
    import types

    import pandas as pd

    from reports.analysis import FrameInfo
    from reports.render.pprof import captured_frames

    st = pd.DataFrame(
        {"stack_id": [7, 7], "idx": [0, 1], "ip": [0x1010, 0x2020], "offset": [0x10, 0x20], "build_id": ["ab", "ab"]}
    )
    frames = (
        FrameInfo("Vec::with_capacity", "/m", "a.rs", 3, inlined=True),
        FrameInfo("inner", "/m", "a.rs", 9),
        FrameInfo("outer", "/m", "a.rs", 20),
    )
    got = captured_frames(types.SimpleNamespace(stacks=st), {7: frames})[7]
    assert [(f.info.function, f.ip) for f in got] == [
        ("Vec::with_capacity", 0x1010),
        ("inner", 0x1010),
        ("outer", 0x2020),
    ]
    assert FrameInfo("inner", "/m", "a.rs", 9, inlined=True) == frames[1]  # not part of equality


class FakeTable:
    """A BCC table stand-in: ctypes keys and values in a dict (what Unwinder reads and writes)."""

    def __init__(self, key, leaf) -> None:
        self.Key, self.Leaf, self.map_fd, self.d = key, leaf, -1, {}

    def __getitem__(self, k):
        return self.d[bytes(k)]

    def __setitem__(self, k, v) -> None:
        self.d[bytes(k)] = self.Leaf.from_buffer_copy(bytes(v))

    def __delitem__(self, k) -> None:
        del self.d[bytes(k)]


def fake_bpf() -> dict:
    import ctypes as ct

    return {
        b"urows": FakeTable(ct.c_uint32, UW.Urow),
        b"umaps": FakeTable(UW.UmapKey, UW.Umap),
        b"ugen": FakeTable(ct.c_uint32, ct.c_uint64),
        b"upending": FakeTable(ct.c_uint32, UW.Upending),
    }


def test_pending_module_is_built_once_stacks_cross_it(tmp_path, monkeypatch):
    """Unwinder without BPF: a module whose rows are not cached is registered pending (its whole
    mapping, flag and slot, no rows); a tiny one is built at once; tick() builds the pending one
    only once `upending` counts stacks there — in the pool — then points its entries at its rows,
    bumps ugen, says so, and meta() tells the stacks, when, and the build."""
    import ctypes as ct

    from tracer.process.procfs import Mapping

    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(UB, "build_costs", lambda: (4096, 32 << 10, 256))
    small = build(tmp_path, "small", "-O2")
    src = tmp_path / "big.c"
    src.write_text(
        "\n".join(
            f"int f{i}(int *a, int n) {{ int s = {i}; for (int j = 0; j < n; j++) "
            f"s += a[j] * {i % 7 + 2}{f' ^ f{i - 1}(a + 1, n - 1)' if i else ''}; return s; }}"
            for i in range(300)
        )
    )
    big = support.build(tmp_path / "libbig.so", src, flags=["-O2", "-shared", "-fPIC"])
    with open(big, "rb") as f:
        assert UB.cfi_bytes(ELFFile(f)) > 4096
    bpf, said = fake_bpf(), []
    unw = UW.Unwinder(bpf, 0, 1 << 20, said.append, workers=1)
    maps = [
        Mapping(0x400000, 0x401000, "r-xp", 0x1000, 11, str(small)),
        Mapping(0x7F0000001000, 0x7F0000003000, "r-xp", 0x1000, 12, str(big)),
    ]
    try:
        unw.update(maps)
        lpm = bpf[b"umaps"].d
        vals = {(v.flags, v.count, v.module) for v in lpm.values()}
        slot = unw.pending[next(iter(unw.pending))].module.slot
        assert (UW.UMAP_PENDING, 0, slot) in vals and slot == 1, vals
        assert any(v.flags == 0 and v.count > 0 for v in lpm.values())  # the small program's rows, at once
        assert [os.path.basename(m.path) for m in unw.modules.values() if m.pending] == ["libbig.so"]
        gen = unw.gen
        for _ in range(3):  # no stack crossed it: nothing is built
            assert not unw.tick(force=True)
        assert all(p.future is None for p in unw.pending.values()) and unw.gen == gen
        bpf[b"upending"][ct.c_uint32(slot)] = UW.Upending(3, 5_000_000_000, 6_000_000_000)
        unw.t0_ns = 4_000_000_000
        deadline = time.monotonic() + 60
        while not unw.tick(force=True):
            assert time.monotonic() < deadline, "not built"
            time.sleep(0.05)
        assert unw.gen == gen + 1 and not any(m.pending for m in unw.modules.values())
        assert all(v.flags == 0 and v.count > 0 for v in bpf[b"umaps"].d.values())
        built = [x for x in said if x.startswith("unwind table for libbig")]
        assert len(built) == 1 and re.fullmatch(
            r"unwind table for libbig\.so: \d+ rows in [\d.]+ s; "
            r"stacks through it complete from \+[\d.]+ s",
            built[0],
        ), said
        p = unw.meta()["pending"][0]
        assert (p["stacks"], p["first_s"], p["last_s"]) == (3, 1.0, 2.0) and p["rows"] > 300, p
        key, rows, cached = UB.load_rows(str(big))  # what the worker built is in the cache
        assert cached and len(rows) == p["rows"]
    finally:
        unw.close()


def test_pending_notes_say_how_many_where_until_when():
    from reports.analysis.totals import pending_notes

    assert pending_notes(
        [
            {"module": "/x/libbig.so", "stacks": 7, "built_s": 1.44, "build_s": 1.07, "rows": 50769},
            {"module": "/x/libtorch_cuda.so", "stacks": 1, "built_s": None, "last_s": 12.3, "error": ""},
            {"module": "/x/libodd.so", "stacks": 2, "built_s": None, "error": "ELFError: bad"},
        ]
    ) == [
        "7 stacks cut short in libbig.so until +1.4 s while its unwind table was built (50769 rows in 1.1 s)",
        "1 stack cut short in libtorch_cuda.so (last at +12.3 s): its unwind table was still being built when "
        "the recording ended",
        "2 stacks cut short in libodd.so: its unwind table could not be built (ELFError: bad); frame-pointer "
        "steps there since",
    ]


def test_doctor_warm_builds_every_table_of_a_process(tmp_path):
    """`doctor --pid PID --warm`: every executable file of the process into the unwind cache (a
    line a module, a summary); again: nothing left to build. Without --pid: a one-line error."""
    p = subprocess.Popen(["sleep", "60"])
    env = dict(os.environ, ALLOCSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    try:
        pid = p.pid  # sleep: itself, libc, ld.so
        support.wait_for(lambda: "libc" in Path(f"/proc/{pid}/maps").read_text(), what="sleep mapped libc")
        res = support.cli("doctor", "--pid", str(pid), "--warm", env=env, check=True)
        n = len(
            [
                ln
                for ln in Path(f"/proc/{pid}/maps").read_text().splitlines()
                if "x" in ln.split()[1] and len(ln.split()) >= 6 and ln.split()[5].startswith("/")
            ]
        )
        files = list((tmp_path / "cache" / "unwind").glob("v*.npy"))
        assert len(files) == n >= 3, (files, res.stderr)
        assert re.search(rf"unwind tables of pid {pid}: {n} built, 0 cached already, 0 failed", res.stderr), res.stderr
        again = support.cli("doctor", "--pid", str(pid), "--warm", env=env, check=True)
        assert f"0 built, {n} cached already, 0 failed" in again.stderr, again.stderr
    finally:
        p.kill()
        p.wait()
    support.one_line_error(support.cli("doctor", "--warm"), "--warm needs --pid", code=2)


def test_build_all_in_the_pool(tmp_path, monkeypatch):
    """build_all (doctor --warm, launch mode's preload): every uncached file built in the pool,
    one line each; a file that is not ELF says why; one already cached is not built again."""
    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(UB, "build_costs", lambda: (4096, 0, 256))  # no in-process shortcut
    a, b = build(tmp_path, "a", "-O2"), build(tmp_path, "b", "-O1")
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not an ELF file")
    said: list[str] = []
    pool = UB.BuildPool(2)
    try:
        res = UB.build_all([str(a), str(b), str(bad)], pool, said.append)
    finally:
        pool.close()
    assert isinstance(res[str(bad)], str) and res[str(bad)].startswith("unreadable: ")
    for exe in (a, b):
        key, rows, secs = res[str(exe)]
        assert np.array_equal(rows, UB.load_rows(str(exe))[1]) and UB.peek(str(exe))[1] is not None
    assert sorted(s.split(":")[0] for s in said) == ["unwind table for a", "unwind table for b"], said
    assert UB.build_all([str(a)], UB.BuildPool(1), said.append) == {}  # cached: nothing to build


def test_cached_modules_past_half_the_table_wait_for_a_stack(tmp_path, monkeypatch):
    """A warm cache (doctor --warm) does not fill the row table at attach: cached modules are
    loaded while they fit in half of it, the rest wait like unbuilt ones (on the GPU box a
    PyTorch process's cached tables passed the 2 Mi-row table and libtorch_cpu was refused)."""
    from tracer.process.procfs import Mapping

    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(UB, "build_costs", lambda: (4096, 32 << 10, 256))
    libs = ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"]
    rows = [len(UB.load_rows(p)[1]) for p in libs]  # both cached now
    bpf = fake_bpf()
    unw = UW.Unwinder(bpf, 0, 2 * rows[0] + 10, lambda _m: None, workers=1)  # libc fits in half, libstdc++ not
    try:
        unw.update(
            [
                Mapping(0x7F0000000000, 0x7F0000001000, "r-xp", 0, 11, libs[0]),
                Mapping(0x7F1000000000, 0x7F1000001000, "r-xp", 0, 12, libs[1]),
            ]
        )
        loaded = {os.path.basename(m.path): (m.pending, m.count) for m in unw.modules.values()}
        assert loaded == {"libc.so.6": (False, rows[0]), "libstdc++.so.6": (True, 0)}, loaded
        assert not unw.failed and unw.next_row == rows[0]
    finally:
        unw.close()
