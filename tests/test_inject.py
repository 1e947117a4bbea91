"""--inject's machinery without a target: the agent's file, the displaced-instruction proofs and
their relocation, the restore word, the stub placement, and the CLI's refusals."""

from __future__ import annotations

import ctypes as ct
import struct
import subprocess
from pathlib import Path

import pytest
from support import TARGETS_SRC, build, cli, one_line_error

from reports.analysis.stacks import AGENT_MODULE
from tracer.inject import agent, loading, patching
from tracer.inject.patching import PatchRefused
from tracer.process.procfs import Mapping


def test_agent_is_freestanding():
    path = agent.agent_path()
    img = agent.read_agent(path)  # no .bss, every symbol the tracer needs, as_cfg's size
    assert img.symbols["as_cfg"][1] == ct.sizeof(agent.AsConfig)
    rel = subprocess.run(["readelf", "-rW", path], capture_output=True, text=True, check=True).stdout
    assert "There are no relocations in this file." in rel, rel  # the loader applies none
    undef = subprocess.run(["nm", "-u", path], capture_output=True, text=True, check=True).stdout
    assert undef.strip() == "", undef  # no libc, nothing to resolve
    with open(path, "rb") as f:
        for marker in ("as_mark_alloc", "as_mark_free", "as_mark_sys"):
            # nopl 0(%rax,%rax,1) (a probe on it becomes a call on 6.18), then push %rbp (emulated)
            f.seek(img.marker_offset(marker, nop5=True))
            assert f.read(6) == bytes.fromhex("0f1f44000055"), marker
            f.seek(img.marker_offset(marker, nop5=False))
            assert f.read(3) == bytes.fromhex("555dc3"), marker


def test_reports_know_the_agents_file():
    # reports fold the agent's frames by its file name (they never import the tracer)
    assert AGENT_MODULE == agent.AGENT_NAME == Path(agent.agent_path()).name


def test_agent_set_is_exact(tmp_path):
    """The free check (the filter of page counts, then the set's counts) finds every sampled
    block and reports no other; the fork guard tells the process from its child without a system
    call: tests/targets/agent/agent_set.c, the agent's hooks called directly."""
    exe = build(
        tmp_path / "agent_set", TARGETS_SRC / "agent" / "agent_set.c", flags=["-O2", "-mcx16", f"-I{agent.AGENT_DIR}"]
    )
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    phases = [
        dict(kv.split("=") for kv in line.split()[1:]) for line in r.stdout.splitlines() if line.startswith("phase")
    ]
    assert r.returncode == 0 and len(phases) == 2, r.stdout + r.stderr
    # the fork guard: a process marks its samples by its guard page (its pid is set wrong), a fork's child none
    assert lines["fork"].split()[1:] == [
        "parent_sampled=1000",
        "parent_foreign=0",
        "child_sampled=0",
        "child_foreign=1000",
    ]
    saturated, real = phases
    # every block sampled, 256 page counts: all stuck at 255, and still every free found
    assert saturated["sampled"] == saturated["freed"] == "600000" and saturated["stuck"] == "256"
    assert 100000 < int(real["sampled"]) == int(real["freed"]) < 200000
    for p in phases:
        assert p["wrong"] == p["left"] == p["counts"] == p["odd"] == p["set_full"] == "0", p


def test_glibc_free_prologue_is_relocated():
    # test %rdi,%rdi; je +0x10; push %rbp  (glibc's free)
    code = bytes.fromhex("4885ff7410554889e5")
    d = patching.displaced(code, 0x1000, 0)
    assert d.length == 5 and d.text == "test; je"
    out = patching.relocate(code[:5], 0x1000, 0x2000)
    # the je (rel8) becomes je rel32 aimed at the same target, 0x1015
    assert out[:3] == code[:3] and out[3:5] == b"\x0f\x84"
    assert 0x2003 + 6 + struct.unpack("<i", out[5:9])[0] == 0x1015


def test_rip_relative_operand_reaimed():
    code = bytes.fromhex("488b0510000000") + bytes.fromhex("c3")  # mov 0x10(%rip),%rax; ret
    d = patching.displaced(code, 0x5000, 0)
    assert d.length == 7
    out = patching.relocate(code[:7], 0x5000, 0x9000)
    assert 0x9000 + 7 + struct.unpack("<i", out[3:7])[0] == 0x5000 + 7 + 0x10


@pytest.mark.parametrize(
    "code, why",
    [
        ("cc4889e5c3", "int3"),  # another tool's breakpoint at the entry
        ("31c0c3", "ret"),  # xor %eax,%eax; ret: shorter than the jump
        ("e3054889e5", "jrcxz"),
    ],
)
def test_unmovable_entries_refused(code, why):
    with pytest.raises(PatchRefused, match=why):
        patching.displaced(bytes.fromhex(code) + b"\x90" * 8, 0x1000, 0)


def test_branch_into_the_displaced_bytes_refused():
    # push %rbp; mov %rsp,%rbp; ... jmp back to entry+1 (inside the 5 displaced bytes)
    body = bytes.fromhex("554889e54889f8") + bytes.fromhex("ebf8")
    with pytest.raises(PatchRefused, match="lands inside"):
        patching.displaced(body, 0x1000, len(body), body)


def test_restore_word_alignment():
    assert patching.restore_words(0x1000, b"") == (0x1000, False)
    assert patching.restore_words(0x1003, b"") == (0x1000, False)
    assert patching.restore_words(0x100A, b"") == (0x1008, False)
    assert patching.restore_words(0x1005, b"") == (0x1000, True)  # one 16-byte compare-and-swap
    with pytest.raises(PatchRefused, match="aligned"):
        patching.restore_words(0x100D, b"")  # straddles 16 bytes


def test_stubs_go_below_the_module():
    maps = [
        Mapping(0x555500000000, 0x555500010000, "r-xp", 0, 7, "/bin/x"),
        Mapping(0x555500010000, 0x555500020000, "rw-p", 0, 0, "[heap]"),
    ]
    at = loading.near_gap(maps, 0x555500000000, 0x555500010000, 4096, [])
    assert at + 4096 <= 0x555500000000 - 4096 and 0x555500000000 - at < 1 << 30


def test_cli_refuses_inject_on_a_launched_command(tmp_path):
    one_line_error(
        cli("record", "--inject", "-o", str(tmp_path / "t.allocscope"), "--", "/bin/true"),
        "--inject hooks a running process",
        code=2,
    )


def test_cli_refuses_inject_in_residency_mode(tmp_path):
    one_line_error(
        cli("record", "--pid", "1", "--inject", "--mode", "residency", "-o", str(tmp_path / "t.allocscope")),
        "--inject samples heap calls",
        code=2,
    )
