"""The cache of compiled BPF programs (tracer/bpf/cache.py), without BPF: the declarations-only
source, the relocation of map fds and of the pid, the key, what is trusted."""

from __future__ import annotations

import base64
import os
import re

from tracer.base import layout as L
from tracer.bpf import cache as C
from tracer.bpf import source as probe

SRC = b"""#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "allocscope.h"
struct point { int x, y; };
BPF_HASH(live, u64, struct point, 16);
static __always_inline int helper(int a) { if (a) { return 1; } return "}"[0]; }
#ifdef AS_X
BPF_TASK_STORAGE(state, struct point);
int probe_one(struct pt_regs *ctx) /* { */ { return helper(1); }
#else
int probe_one(struct pt_regs *ctx) { return 0; }
#endif
TRACEPOINT_PROBE(sched, sched_process_exit) { return '{'; }
static const int table[2] = {1, 2};
"""


def test_maps_only_keeps_declarations_and_drops_bodies():
    out = C.maps_only(SRC).decode()
    assert "BPF_HASH(live, u64, struct point, 16);" in out
    assert "struct point { int x, y; };" in out
    assert "static const int table[2] = {1, 2};" in out
    assert "#ifdef AS_X" in out and "#else" in out and "#endif" in out
    assert "helper" not in out and "probe_one" not in out and "TRACEPOINT_PROBE" not in out
    assert "#include <linux/sched.h>" not in out and "struct task_struct;" in out
    # the task storage gets a user right after it, inside the same #if branch
    line = next(ln for ln in out.splitlines() if "BPF_TASK_STORAGE(state" in ln)
    assert "as_maps_only_state" in line and "state.task_storage_get(" in line
    assert out.index("#ifdef AS_X") < out.index("as_maps_only_state") < out.index("#else")


def test_maps_only_of_the_real_program_keeps_every_map():
    text = probe.bpf_text()
    out = C.maps_only(text).decode()
    maps = [ln.split("/*")[0].strip() for ln in text.decode().splitlines() if ln.startswith("BPF_")]
    assert maps and all(m in out for m in maps)
    assert "TRACEPOINT_PROBE" not in out and "int alloc_return" not in out


def _insn(code, regs, off, imm) -> bytes:
    return C.INSN.pack(code, regs, off, imm)


def test_relocate_rewrites_map_fds_and_the_pid():
    code = (
        _insn(C.BPF_LD_IMM64, 0x11, 0, 7)
        + _insn(0, 0, 0, 0)  # r1 = map fd 7 (ld_imm64)
        + _insn(0x55, 0x01, 3, C.TGID_SENTINEL)  # if r1 != AS_TGID goto +3
        + _insn(0x95, 0, 0, 0)
    )  # exit
    entry = {"funcs": {"f": {"code": base64.b64encode(code).decode(), "maps": [[0, "live"]], "tgid": [2]}}}
    out = C.relocate(entry, "f", 4242, {"live": 99}.__getitem__)
    assert C.INSN.unpack_from(out, 0) == (C.BPF_LD_IMM64, 0x11, 0, 99)
    assert C.INSN.unpack_from(out, 16) == (0x55, 0x01, 3, 4242)
    assert out[8:16] == code[8:16] and out[24:] == code[24:]


def test_sentinel_is_no_pid():
    assert C.TGID_SENTINEL > 4194304  # PID_MAX_LIMIT
    assert C.TGID_SENTINEL < 2**31  # fits an instruction's signed immediate


def test_key_changes_with_every_input():
    base = C.cache_key(b"text", ["-DA=1"], "bcc 1")
    assert base == C.cache_key(b"text", ["-DA=1"], "bcc 1")
    assert (
        len(
            {
                base,
                C.cache_key(b"text2", ["-DA=1"], "bcc 1"),
                C.cache_key(b"text", ["-DA=2"], "bcc 1"),
                C.cache_key(b"text", ["-DA=1"], "bcc 2"),
            }
        )
        == 4
    )


def test_map_sizes_share_one_entry():
    """The size-only parameters do not change the key (one compile serves every --max-live...),
    anything else does; and probes/ uses them only in map declarations, so the instructions cannot
    depend on them."""
    a = C.cache_key(b"text", ["-DAS_MAX_LIVE=1024", "-DAS_RING_PAGES=16", "-DAS_TGID=5"], "bcc 1")
    assert a == C.cache_key(b"text", ["-DAS_MAX_LIVE=8388608", "-DAS_RING_PAGES=1024", "-DAS_TGID=5"], "bcc 1")
    assert a != C.cache_key(b"text", ["-DAS_MAX_LIVE=1024", "-DAS_RING_PAGES=16", "-DAS_TGID=6"], "bcc 1")
    assert C.same_tables([["live", 1, 8, 40, 1024, 1, "k", "v"]], [["live", 1, 8, 40, 1 << 20, 1, "k", "v"]])
    assert not C.same_tables([["live", 1, 8, 40, 1024, 1, "k", "v"]], [["live", 1, 8, 48, 1024, 1, "k", "v"]])
    decl = re.compile(r"^\s*(BPF_[A-Z_]+\(.*\);|#(ifndef|define|error|if|endif)\b.*|\s*\*.*|/\*.*)$")
    for path in sorted(L.PROBES_DIR.glob("*.[ch]")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(name in line for name in C.SIZE_ONLY) and not decl.match(line) and "#error" not in line:
                raise AssertionError(f"{path.name}:{n} uses a size-only parameter outside a map declaration: {line}")


def test_untrusted_entries_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path))
    entry = {"format": C.CACHE_FORMAT, "funcs": {}, "tables": []}
    C.save("k", entry)
    assert C.load("k") == entry
    path = tmp_path / "bpf" / "k.json"
    assert path.stat().st_mode & 0o777 == 0o600
    os.chmod(path, 0o666)  # writable by anyone: never loaded into the kernel
    assert C.load("k") is None
    os.chmod(path, 0o600)
    os.chmod(path.parent, 0o777)
    assert C.load("k") is None
