"""Entry-probe placement: behind a NULL check only when provably equivalent."""
from __future__ import annotations

import subprocess

import pytest

from tracer.elfinfo import symbol_offsets
from tracer.placement import place_entry

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
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("placement")
    (d / "f.s").write_text(ASM)
    so = d / "libf.so"
    subprocess.run(["gcc", "-shared", "-o", str(so), str(d / "f.s")], check=True)
    names = ["f_null_check", "f_loop_back", "f_other_reg", "f_push", "f_mov"]
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


def test_glibc_free_moves_malloc_stays():
    import os
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6")
                if os.path.exists(p))
    s = symbol_offsets(libc, ["free", "malloc"])
    free = place_entry(libc, s.offsets["free"], s.sizes["free"])
    malloc = place_entry(libc, s.offsets["malloc"], s.sizes["malloc"])
    assert not malloc.moved and "emulated" in malloc.reason
    # Debian 12's glibc 2.36: free = test %rdi,%rdi; je; push %rbp
    assert free.moved and free.offset > s.offsets["free"]
