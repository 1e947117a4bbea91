"""--alloc-fn / --free-fn: the grammar (one-line errors before anything is attached), and
`record --dry-run` / `doctor --pid`: every allocator found and where each probe would sit,
without root or BPF."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import CFLAGS_FP, build, cli, one_line_error

from common.errors import UsageError
from tracer.allocators.custom import CustomFn, parse
from tracer.bpf.symbols import symbol_offsets

HERE = Path(__file__).resolve().parent / "targets" / "allocators"


def test_specs_parse():
    assert parse("pool_get:size=arg1", False) == CustomFn("pool_get:size=arg1", "pool_get", "", False, size_arg=1)
    f = parse("pool_get_out@libpool.so:size=arg2,out=arg1", False)
    assert (f.symbol, f.module, f.size_arg, f.out_arg, f.count_arg) == ("pool_get_out", "libpool.so", 2, 1, None)
    f = parse("arr_new:count=arg0,size=arg1", False)
    assert (f.count_arg, f.size_arg, f.source) == (0, 1, "custom:arr_new")
    assert parse("pool_put:ptr=arg1", True).ptr_arg == 1


@pytest.mark.parametrize(
    "spec,free,needle",
    [
        ("pool_get", False, "expected SYMBOL[@MODULE]:size=argN"),
        ("pool_get:", False, "is not one of size=argN, count=argN, out=argN"),
        ("pool_get:size=1", False, "is not one of"),
        ("pool_get:size=arg9", False, "arg9 is not a register argument (arg0..arg5)"),
        ("pool_get:count=arg1", False, "no size=argN"),
        ("pool_get:size=arg1,size=arg2", False, "size given twice"),
        ("pool_get:size=arg1,out=arg1", False, "one argument cannot be two things"),
        ("pool_get@:size=arg1", False, "expected"),
        ("pool_put:size=arg1", True, "is not one of ptr=argN"),
        ("pool_put", True, "expected SYMBOL[@MODULE]:ptr=argN"),
    ],
)
def test_bad_specs(spec, free, needle):
    with pytest.raises(UsageError) as e:
        parse(spec, free)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_specs_on_the_command_line(tmp_path):
    out = str(tmp_path / "t.allocscope")
    one_line_error(cli("record", "--pid", "1", "-o", out, "--alloc-fn", "pool_get:size=argx"), "--alloc-fn", code=2)
    one_line_error(cli("record", "--pid", "1", "-o", out, "--free-fn", "pool_put"), "--free-fn", code=2)
    one_line_error(
        cli("record", "--pid", "1", "-o", out, "--alloc-fn", "f:size=arg0", "--alloc-fn", "f:size=arg1"),
        "more than once",
        code=2,
    )


def test_dry_run_lists_every_allocator_and_probe(tmp_path):
    build(tmp_path / "libplain.so", HERE / "plain.c", flags=["-shared", "-fPIC", *CFLAGS_FP])
    exe = build(tmp_path / "rjem", HERE / "rjem.c", f"-L{tmp_path}", "-lplain", f"-Wl,-rpath,{tmp_path}")
    pool = build(tmp_path / "pool", HERE / "pool.c")
    p = cli("record", "--dry-run", "--", str(exe), check=True)
    text = p.stdout
    assert "nothing attached" in text
    assert "allocator glibc in " in text and "(serves malloc; sites' source: heap)" in text
    assert f"allocator jemalloc:_rjem_ in {exe} (beside it; sites' source: heap:jemalloc:_rjem_)" in text
    for sym in ("_rjem_malloc", "_rjem_mallocx", "_rjem_rallocx", "_rjem_sdallocx", "_rjem_dallocx"):
        assert f"\n  {sym} " in text, sym
    libc = next(
        p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6") if Path(p).exists()
    )
    offs = symbol_offsets(libc, ["memalign", "aligned_alloc"]).offsets
    if offs.get("memalign") == offs.get("aligned_alloc"):  # glibc 2.36; 2.38+ checks aligned_alloc's alignment
        assert "memalign                     same address as aligned_alloc: probed once" in text
    else:
        assert "\n  memalign " in text and "\n  aligned_alloc " in text and "same address as aligned_alloc" not in text
    assert "no CUDA driver (libcuda.so.1) mapped" in text
    p = cli(
        "record",
        "--dry-run",
        "--alloc-fn",
        "pool_get:size=arg1",
        "--free-fn",
        "pool_put:ptr=arg1",
        "--",
        str(pool),
        check=True,
    )
    assert f"your function pool_get in {pool}+0x" in p.stdout and "source custom:pool_get" in p.stdout
    one_line_error(
        cli("record", "--dry-run", "--alloc-fn", "no_such_fn:size=arg0", "--", str(pool)),
        "no function 'no_such_fn'",
        code=3,
    )
    one_line_error(
        cli("record", "--dry-run", "--alloc-fn", "pool_get@libnope.so:size=arg0", "--", str(pool)),
        "maps no module 'libnope.so'",
        code=3,
    )
