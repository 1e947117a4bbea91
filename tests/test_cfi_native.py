"""tracer/unwind/native.py + tracer/unwind/cfi/cfi.c without BPF: the C decoder's unwind rows are pyelftools'
`build_table` rows byte for byte (system libraries, .debug_frame-only and compressed builds, a
lazy PLT, every CFA opcode in tests/targets/cfi_ops.S), what pyelftools cannot read comes out
right, and malformed files give an error, never a crash."""

from __future__ import annotations

import glob
import pickle
import random
import shutil
import struct
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import support
from elftools.elf.elffile import ELFFile

from tracer.bpf.symbols import symbol_offsets
from tracer.unwind import building as UB
from tracer.unwind import native as C
from tracer.unwind import rows as UR

TARGETS = Path(__file__).resolve().parent / "targets"
OPS = TARGETS / "cfi_ops.S"


def system_file(name: str) -> str:
    hits = sorted(glob.glob(f"/lib/x86_64-linux-gnu/{name}") + glob.glob(f"/usr/lib/x86_64-linux-gnu/{name}"))
    assert hits, name
    return hits[0]


def python_table(path: Path | str) -> UR.TableInfo:
    with open(path, "rb") as f:
        return UR.build_table(ELFFile(f))


def native(path: Path | str) -> UR.TableInfo:
    info = C.native_table(str(path))
    assert info is not None, "the native decoder is built by make setup"
    return info


def assert_same(path: Path | str) -> UR.TableInfo:
    a, b = native(path), python_table(path)
    assert a.rows.dtype == b.rows.dtype == UR.ROW
    assert a.rows.tobytes() == b.rows.tobytes(), f"{path}: {len(a.rows)} vs {len(b.rows)} rows"
    assert (a.fdes, a.sources, a.kinds) == (b.fdes, b.sources, b.kinds)
    return a


def ops(tmp: Path, name: str, *flags: str) -> Path:
    return support.build(tmp / name, OPS, flags=["-shared", "-nostdlib", *flags])


def rows_of(info: UR.TableInfo) -> list[tuple[int, str, int, int]]:
    return [(int(r["pc"]), UR.CFA_NAMES[int(r["cfa_type"])], int(r["cfa_off"]), int(r["rbp_off"])) for r in info.rows]


def rule_at(info: UR.TableInfo, off: int) -> tuple[str, int, int]:
    """(type, cfa_off, rbp_off) of the row covering file offset `off`."""
    r = info.rows[int(np.searchsorted(info.rows["pc"], off, side="right")) - 1]
    return UR.CFA_NAMES[int(r["cfa_type"])], int(r["cfa_off"]), int(r["rbp_off"])


def test_system_libraries_match_pyelftools():
    libc = assert_same(system_file("libc.so.6"))
    assert libc.kinds["signal"] == 1 and libc.kinds["plt"] >= 1 and libc.kinds["stop"] >= 1
    assert assert_same(system_file("libstdc++.so.6")).fdes > 4000  # LSDA, GNU_args_size
    assert assert_same("/lib64/ld-linux-x86-64.so.2").kinds["signal"] == 1


def test_builds_match_pyelftools(tmp_path):
    src = tmp_path / "a.c"
    src.write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n"
        "__attribute__((noinline)) int f(int n) { volatile char b[n]; b[0] = 1; return b[0] + n; }\n"
        'int main(int argc, char **argv) { printf("%d\\n", f(argc)); return 0; }\n'
    )
    nounwind = ["-O2", "-g", "-fno-asynchronous-unwind-tables"]
    df = support.build(tmp_path / "df", src, flags=nounwind)
    dfz = support.build(tmp_path / "dfz", src, flags=[*nounwind, "-gz=zlib"])
    lazy = support.build(tmp_path / "lazy", src, flags=["-O2", "-Wl,-z,lazy"])
    recurse = support.build(tmp_path / "recurse", TARGETS / "recurse.c", flags=["-O2", "-fomit-frame-pointer"])
    # main from .debug_frame (the crt files bring .eh_frame): rsp-based rows there
    info = assert_same(df)
    assert info.sources == [".eh_frame", ".debug_frame"]
    main = symbol_offsets(str(df), ["main"]).offsets["main"]
    assert rule_at(info, main) == ("rsp", 1, 0)
    with open(dfz, "rb") as f:
        assert ELFFile(f).get_section_by_name(".debug_frame")["sh_flags"] & 0x800  # SHF_COMPRESSED
    assert assert_same(dfz).rows.tobytes() == info.rows.tobytes()
    assert assert_same(lazy).kinds["plt"] >= 1
    assert_same(recurse)


def test_every_opcode_matches_pyelftools(tmp_path):
    eh = assert_same(ops(tmp_path, "eh.so"))
    for v in (1, 3, 4):  # .debug_frame CIE versions
        df = assert_same(ops(tmp_path, f"df{v}.so", "-DDEBUG_FRAME", f"-Wa,--gdwarf-cie-version={v}"))
        assert df.sources == [".debug_frame"] and df.fdes == 4
    both = assert_same(ops(tmp_path, "both.so", "-DBOTH", "-Wa,--gdwarf-cie-version=4"))
    assert both.fdes == 4 and both.sources == [".eh_frame", ".debug_frame"]  # the copies in .debug_frame dropped
    assert eh.kinds == {"none": 3, "rsp": 11, "rbp": 4, "plt": 1, "signal": 1, "stop": 1, "unsupported": 3}
    a = symbol_offsets(str(tmp_path / "eh.so"), ["fn_a"]).offsets["fn_a"]
    got = rows_of(eh)[:13]
    want = [
        (0, "rsp", 1, 0),
        (1, "rsp", 2, -2),
        (4, "rbp", 2, -2),
        (7, "rbp", 2, 0),
        (8, "rsp", 2, -2),
        (9, "rbp", 4, -2),
        (10, "rbp", 4, 3),
        (13, "rsp", 3, 3),
        (313, "rsp", 4, 3),
        (70313, "rsp", 5, 3),
        (70314, "plt", 11, 0),
        (70315, "unsupported", 0, 0),
        (70320, "rsp", 1, -1),
    ]
    assert got == [(a + d, k, o, r) for d, k, o, r in want]


def test_what_pyelftools_cannot_read(tmp_path):
    """A signal frame in .debug_frame (augmentation "S"), GNU_negative_offset_extended, and an
    unknown opcode (only that FDE is dropped)."""
    for flags in ([], ["-DDEBUG_FRAME"]):
        lib = ops(tmp_path, "x.so", "-DEXTRA", *flags)
        with pytest.raises((ValueError, AssertionError)):
            python_table(lib)  # pyelftools 0.33 gives up on the whole file
        info = native(lib)
        offs = symbol_offsets(str(lib), ["fn_negoff", "fn_unknown", "fn_last", "fn_sig"]).offsets
        n, u = offs["fn_negoff"], offs["fn_unknown"]
        assert [rule_at(info, n + d) for d in range(4)] == [("rsp", 1, 0), ("rsp", 2, 2), ("rsp", 2, 2), ("rsp", 1, 2)]
        assert [rule_at(info, u + d) for d in range(3)] == [("none", 0, 0)] * 3  # fn_negoff's end sentinel
        if flags:
            assert rule_at(info, offs["fn_sig"]) == ("signal", 0, 0)
        assert info.fdes == 6  # of 7


def test_load_rows_and_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    lib = ops(tmp_path, "eh.so")
    want = native(lib).rows
    _, rows, cached = UB.load_rows(str(lib), use_cache=False)
    assert not cached and rows.tobytes() == want.tobytes()
    assert C.build_rows(str(lib)).tobytes() == want.tobytes()
    monkeypatch.setenv("ALLOCSCOPE_CFI", "python")
    assert C.native_table(str(lib)) is None
    assert C.build_rows(str(lib)).tobytes() == want.tobytes()


def test_parallel_builds(tmp_path):
    """A process pool (build_rows pickles) and threads (the C call releases the GIL and keeps
    no state) give each module its own rows."""
    assert pickle.loads(pickle.dumps(C.build_rows)) is C.build_rows
    libs = [str(ops(tmp_path, "eh.so")), "/lib64/ld-linux-x86-64.so.2", system_file("libc.so.6")]
    want = [native(p).rows.tobytes() for p in libs]
    with ProcessPoolExecutor(2) as pool:
        assert [g.tobytes() for g in pool.map(C.build_rows, libs)] == want
    with ThreadPoolExecutor(4) as pool:
        assert [g.tobytes() for g in pool.map(C.build_rows, libs * 4)] == want * 4


def test_malformed_files_give_an_error(tmp_path):
    libc = Path(system_file("libc.so.6")).read_bytes()
    cases = {
        "empty": b"",
        "garbage": random.Random(1).randbytes(4096),
        "header only": libc[:64],
        "truncated": libc[: len(libc) * 2 // 3],  # the section headers are past the end
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(C.CfiError):
            native(p)
    with pytest.raises(C.CfiError):
        native(tmp_path)  # a directory
    # .eh_frame whose first entry's length runs past the section: pyelftools refuses it too
    with open(system_file("libc.so.6"), "rb") as f:
        off = ELFFile(f).get_section_by_name(".eh_frame")["sh_offset"]
    bad = bytearray(libc)
    bad[off : off + 4] = struct.pack("<I", 0xFFFFFFF0 - 1)
    (tmp_path / "badlen").write_bytes(bad)
    with pytest.raises(C.CfiError, match="runs past"):
        native(tmp_path / "badlen")


def test_flipped_bytes_never_crash(tmp_path):
    """Random bytes of .eh_frame and .debug_frame changed: rows or an error, every time."""
    lib = ops(tmp_path, "both.so", "-DBOTH")
    data = lib.read_bytes()
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        spans = [(s["sh_offset"], s["sh_size"]) for s in elf.iter_sections() if s.name in (".eh_frame", ".debug_frame")]
    rnd = random.Random(7)
    outcomes = {"rows": 0, "error": 0}
    for i in range(300):
        buf = bytearray(data)
        for _ in range(rnd.randrange(1, 6)):
            off, size = rnd.choice(spans)
            buf[off + rnd.randrange(size)] = rnd.randrange(256)
        p = tmp_path / f"f{i % 2}"
        p.write_bytes(buf)
        try:
            info = native(p)
        except C.CfiError:
            outcomes["error"] += 1
            continue
        outcomes["rows"] += 1
        pcs = info.rows["pc"].astype(np.int64)
        assert np.all(np.diff(pcs) > 0) and pcs.max(initial=0) < len(data) + 0x100000
    assert outcomes["rows"] > 100 and outcomes["error"] > 0, outcomes


def test_the_library_builds_from_source(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc
    out = C.build_library(tmp_path / "cfi.so", cc)
    assert out.stat().st_size > 0
