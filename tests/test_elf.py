"""common/elf.py against binutils' view of a small program, and tracer/record/embed_symbols.py's symbols parts.
No root."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from elftools.common.exceptions import ELFError
from support import build, need_tool

from common import elf as E
from common.tracefile.format import SYMBOLS_SCHEMA
from tracer.record.embed_symbols import SymbolEmbedder

SRC = r"""
#include <stdlib.h>
void *volatile sink;
__attribute__((noinline)) void *grow(unsigned long n) { return sink = malloc(n); }
static __attribute__((noinline)) void *hidden(unsigned long n) { return grow(n + 1); }
int main(void) { return hidden(3) == 0; }
"""


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> Path:
    for tool in ("gcc", "nm", "readelf"):
        need_tool(tool)
    d = tmp_path_factory.mktemp("elf")
    (d / "p.c").write_text(SRC)
    return build(d / "p", d / "p.c", flags=["-O1", "-g", "-fPIE", "-pie", "-Wl,--build-id"])


def nm(path: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return {m.group(3): int(m.group(1), 16) for m in re.finditer(r"^([0-9a-f]+) ([tTwW]) (\w+)$", out, re.MULTILINE)}


def test_build_id_and_segments(prog):
    readelf = subprocess.run(["readelf", "-n", str(prog)], capture_output=True, text=True, check=True).stdout
    want = re.search(r"Build ID: ([0-9a-f]+)", readelf).group(1)
    assert E.build_id(str(prog)) == want
    with E.OpenedElf.open(str(prog)) as f:
        assert E.elf_build_id(f.elf) == want
        segs = E.segments(f.elf)
        for name, vaddr in nm(prog).items():
            off = E.vaddr_to_offset(segs, vaddr)
            assert off is not None and E.offset_to_vaddr(segs, off) == vaddr, name
        last = max(segs, key=lambda s: s.vaddr)
        past = last.vaddr + last.memsz
        assert E.vaddr_to_offset(segs, past, whole=True) is None
        assert E.vaddr_to_offset(segs, past, whole=True, end=True) == past - last.vaddr + last.offset


def test_functions_and_symbol_table(prog):
    addrs = nm(prog)
    with E.OpenedElf.open(str(prog)) as f:
        segs = E.segments(f.elf)
        found = E.defined_functions(f.elf, ["grow", "main", "hidden", "malloc"])
        assert not E.is_static(f.elf)
        table = E.SymbolTable.build(E.read_symbols(f.elf, ".symtab"))
    assert set(found) == {"grow", "main", "hidden"}  # malloc is only referenced
    for name, (off, size) in found.items():
        assert off == E.vaddr_to_offset(segs, addrs[name]) and size > 0, name
        assert table.lookup(addrs[name]) == name and table.lookup(addrs[name] + size - 1) == name
    by_name = {name: (off, size) for off, size, name in E.module_symbols(str(prog))}
    assert {n: by_name[n] for n in found} == found
    assert E.module_symbols(str(prog), "00" * 20) == []  # another build than the traced one


def test_bad_files(tmp_path):
    text = tmp_path / "notelf"
    text.write_text("hello")
    assert E.open_elf(str(text)) is None and E.open_elf(str(tmp_path / "missing")) is None
    assert E.build_id(str(text)) == "" and E.module_symbols(str(text)) == []
    with pytest.raises(ELFError):
        E.OpenedElf.open(str(text))


def test_embedder_writes_each_module_once(prog):
    emb = SymbolEmbedder(debug_dirs=())
    bid = E.build_id(str(prog))
    cols = {
        "module": [str(prog), str(prog), "[vdso]", ""],
        "build_id": [bid, bid, "", ""],
        "offset": [0x1000, 0x1010, -1, 5],
    }
    part = emb.part(7, cols)
    assert part.schema == SYMBOLS_SCHEMA and part.num_rows > 0
    rows = part.to_pylist()
    assert {r["seq"] for r in rows} == {7} and {(r["module"], r["build_id"]) for r in rows} == {(str(prog), bid)}
    assert "grow" in {r["name"] for r in rows}
    assert emb.part(8, cols).num_rows == 0  # embedded already
    assert emb.embedded == {(str(prog), bid)}


def test_build_id_is_the_gnu_note_not_a_systemtap_one(tmp_path):
    """PyTorch's libc10_cuda.so has a .note.stapsdt section (owner "stapsdt", type 3 like
    NT_GNU_BUILD_ID) before its .note.gnu.build-id: the build ID is the GNU one, read the same by
    the tracer (struct reader) and the reports (pyelftools) — on the GPU box they disagreed and
    the report refused to symbolize the library."""
    import struct

    from elftools.elf.elffile import ELFFile

    need_tool("objcopy")
    src = tmp_path / "n.c"
    src.write_text("int f(int x) { return x + 1; }\n")
    plain = build(tmp_path / "plain.so", src, flags=["-O2", "-shared", "-fPIC", "-Wl,--build-id=none"])

    def note(owner: bytes, ntype: int, desc: bytes) -> bytes:
        name = owner + b"\0"
        return (
            struct.pack("<III", len(name), len(desc), ntype)
            + name.ljust(-(-len(name) // 4) * 4, b"\0")
            + desc.ljust(-(-len(desc) // 4) * 4, b"\0")
        )

    bid = "29dec3cf84422903fd1ea8ba24fa01f7c3de4214"
    (tmp_path / "stap.bin").write_bytes(note(b"stapsdt", 3, bytes(range(40))))
    (tmp_path / "gnu.bin").write_bytes(note(b"GNU", 3, bytes.fromhex(bid)))
    lib, mid = tmp_path / "libn.so", tmp_path / "mid.so"
    subprocess.run(
        ["objcopy", f"--add-section=.note.stapsdt={tmp_path / 'stap.bin'}", str(plain), str(mid)], check=True
    )
    subprocess.run(
        ["objcopy", f"--add-section=.note.gnu.build-id={tmp_path / 'gnu.bin'}", str(mid), str(lib)], check=True
    )
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        notes = [s.name for s in elf.iter_sections() if s["sh_type"] == "SHT_NOTE"]
        assert notes.index(".note.stapsdt") < notes.index(".note.gnu.build-id"), notes
        assert E.elf_build_id(elf) == bid
    E.build_id.cache_clear()
    assert E.build_id(str(lib)) == bid
