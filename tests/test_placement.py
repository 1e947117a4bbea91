"""Entry-probe placement: behind a NULL check only when provably equivalent."""

from __future__ import annotations

import pytest
from support import build, need

from tracer.allocators.placement import ENTRY_READS, place_entry, place_probe
from tracer.bpf.symbols import symbol_offsets

ASM = r"""
    .text
    .globl f_null_check
    .type f_null_check, @function
f_null_check:
    test %rdi, %rdi
    je 1f
    push %rbp
    mov %rdi, %rax
    pop %rbp
1:  ret
    .size f_null_check, .-f_null_check

    .globl f_loop_back
    .type f_loop_back, @function
f_loop_back:
    test %rdi, %rdi
    je 2f
3:  push %rbp
    pop %rbp
    dec %rdi
    jnz 3b
2:  ret
    .size f_loop_back, .-f_loop_back

    .globl f_other_reg
    .type f_other_reg, @function
f_other_reg:
    test %rsi, %rsi
    je 4f
    push %rbp
    pop %rbp
4:  ret
    .size f_other_reg, .-f_other_reg

    .globl f_cet_push
    .type f_cet_push, @function
f_cet_push:
    endbr64
    push %rbp
    pop %rbp
    ret
    .size f_cet_push, .-f_cet_push

    .globl f_cet_null
    .type f_cet_null, @function
f_cet_null:
    endbr64
    test %rdi, %rdi
    je 5f
    push %rbp
    pop %rbp
5:  ret
    .size f_cet_null, .-f_cet_null

    .globl f_cet_mov
    .type f_cet_mov, @function
f_cet_mov:
    endbr64
    mov %rdi, %rax
    ret
    .size f_cet_mov, .-f_cet_mov

    .globl f_push
    .type f_push, @function
f_push:
    push %rbp
    pop %rbp
    ret
    .size f_push, .-f_push

    .globl f_mov
    .type f_mov, @function
f_mov:
    mov %rdi, %rax
    ret
    .size f_mov, .-f_mov

    .globl f_prefix
    .type f_prefix, @function
f_prefix:
    cmp $0x1000, %rdi
    mov %rdi, %rax
    shr $4, %rax
    ja 5f
    push %rbx
    pop %rbx
5:  ret
    .size f_prefix, .-f_prefix

    .globl f_prefix_writes_arg
    .type f_prefix_writes_arg, @function
f_prefix_writes_arg:
    mov %rdi, %rax
    xor %edi, %edi
    ja 6f
6:  ret
    .size f_prefix_writes_arg, .-f_prefix_writes_arg

    .globl f_prefix_moves_sp
    .type f_prefix_moves_sp, @function
f_prefix_moves_sp:
    sub $8, %rsp
    ja 7f
7:  add $8, %rsp
    ret
    .size f_prefix_moves_sp, .-f_prefix_moves_sp

    .globl f_prefix_stores
    .type f_prefix_stores, @function
f_prefix_stores:
    mov %rdi, (%rax)
    ja 8f
8:  ret
    .size f_prefix_stores, .-f_prefix_stores

    .globl f_prefix_reentered
    .type f_prefix_reentered, @function
f_prefix_reentered:
    mov %rdi, %rax
9:  cmp $1, %rax
    ja 10f
    dec %rax
    jmp 9b
10: ret
    .size f_prefix_reentered, .-f_prefix_reentered
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("placement")
    (d / "f.s").write_text(ASM)
    so = d / "libf.so"
    build(so, d / "f.s", flags=["-shared"])
    names = [
        "f_null_check",
        "f_loop_back",
        "f_other_reg",
        "f_push",
        "f_mov",
        "f_prefix",
        "f_prefix_writes_arg",
        "f_prefix_moves_sp",
        "f_prefix_stores",
        "f_prefix_reentered",
        "f_cet_push",
        "f_cet_null",
        "f_cet_mov",
    ]
    s = symbol_offsets(str(so), names)
    return str(so), s


def test_moves_behind_null_check(lib):
    path, s = lib
    p = place_entry(path, s.offsets["f_null_check"], s.sizes["f_null_check"])
    assert p.moved and p.offset == s.offsets["f_null_check"] + 3 + 2  # test (3 bytes) + je rel8 (2)
    assert "push rbp" in p.reason


def test_stays_when_a_branch_reaches_the_candidate(lib):
    path, s = lib
    p = place_entry(path, s.offsets["f_loop_back"], s.sizes["f_loop_back"])
    assert not p.moved and p.offset == s.offsets["f_loop_back"] and "single-stepped" in p.reason


def test_stays_when_the_check_is_not_on_the_argument(lib):
    path, s = lib
    assert not place_entry(path, s.offsets["f_other_reg"], s.sizes["f_other_reg"]).moved


def test_emulated_entry_stays(lib):
    path, s = lib
    p = place_entry(path, s.offsets["f_push"], s.sizes["f_push"])
    assert not p.moved and "emulated" in p.reason
    p = place_entry(path, s.offsets["f_mov"], s.sizes["f_mov"])
    assert not p.moved and "single-stepped" in p.reason


def test_cet_endbr64_is_skipped(lib):
    """A CET build's endbr64 changes nothing a probe reads: an emulated instruction right behind it,
    or a NULL check behind it, is where the probe goes; a single-stepped one keeps the entry."""
    path, s = lib
    p = place_entry(path, s.offsets["f_cet_push"], s.sizes["f_cet_push"])
    assert p.moved and p.offset == s.offsets["f_cet_push"] + 4 and p.reason.startswith("after endbr64 (+4: push")
    p = place_entry(path, s.offsets["f_cet_null"], s.sizes["f_cet_null"])
    assert p.moved and p.offset == s.offsets["f_cet_null"] + 4 + 3 + 2 and "after the NULL check" in p.reason
    p = place_entry(path, s.offsets["f_cet_mov"], s.sizes["f_cet_mov"])
    assert not p.moved and p.reason == "entry (endbr64: single-stepped)"


def test_glibc_free_moves_malloc_stays():
    import os

    libc = next(
        p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6") if os.path.exists(p)
    )
    s = symbol_offsets(libc, ["free", "malloc"])
    free = place_entry(libc, s.offsets["free"], s.sizes["free"])
    malloc = place_entry(libc, s.offsets["malloc"], s.sizes["malloc"])
    # Debian 12's glibc 2.36: malloc = push %r12 (emulated: stays); free = test %rdi,%rdi; je;
    # push %rbp (moves behind the NULL check). A CET build (Ubuntu 24.04's glibc 2.39) puts
    # endbr64 first: the probe goes behind it when an emulated instruction follows.
    assert "emulated" in malloc.reason, malloc
    assert malloc.moved == malloc.reason.startswith("after endbr64"), malloc
    assert free.moved and free.offset > s.offsets["free"], free


def test_prefix_moves_to_first_emulated_instruction(lib):
    path, s = lib
    p = place_probe(path, s.offsets["f_prefix"], s.sizes["f_prefix"], ENTRY_READS["malloc"])
    # cmp $imm32,%rdi (7 bytes) + mov (3) + shr (4): the `ja` follows; the push behind it is later
    assert p.moved and p.offset == s.offsets["f_prefix"] + 14 and p.reason.startswith("+14: ja")


@pytest.mark.parametrize("fn", ["f_prefix_writes_arg", "f_prefix_moves_sp", "f_prefix_stores", "f_prefix_reentered"])
def test_prefix_stays_when_not_provably_equivalent(lib, fn):
    """The argument register rewritten, the stack pointer moved, memory written, or a branch back
    into the prefix (the probe would fire twice): the entry stays."""
    path, s = lib
    p = place_probe(path, s.offsets[fn], s.sizes[fn], ENTRY_READS["malloc"])
    assert not p.moved and p.offset == s.offsets[fn], (fn, p)


def test_prefix_checks_every_register_the_probe_reads(lib):
    """`xor %edi,%edi` is harmless to a probe that reads only %rsi (aligned_alloc's size)."""
    path, s = lib
    p = place_probe(
        path, s.offsets["f_prefix_writes_arg"], s.sizes["f_prefix_writes_arg"], ENTRY_READS["aligned_alloc"]
    )
    assert p.moved and p.reason.startswith("+5: ja"), p


def test_jemalloc_malloc_and_free_move():
    lib = need(["/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"], "libjemalloc.so.2 (libjemalloc2)")
    s = symbol_offsets(lib, ["malloc", "free"])
    for fn in ("malloc", "free"):
        p = place_probe(lib, s.offsets[fn], s.sizes[fn], ENTRY_READS[fn])
        assert p.moved and "emulated" in p.reason, (fn, p)
