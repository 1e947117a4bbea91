"""Where to put an entry uprobe so the kernel can emulate the probed instruction.

A uprobe replaces an instruction with int3; on the hit the kernel either emulates the original
instruction (branches, `push reg`, nops: ~1 µs here) or single-steps a copy of it out of line
(~5.5 µs). glibc's `free` begins with `test %rdi,%rdi; je ...` — single-stepped. Behind that
NULL check sits `push %rbp`. Probing there is equivalent for every non-NULL pointer (free(NULL)
does nothing) as long as no other path of the function reaches that instruction; we prove that
by disassembling the whole function (capstone) and checking every branch target. Otherwise the
entry is kept. Only for entry-only probes that read nothing but the first argument register.
"""
from __future__ import annotations

from dataclasses import dataclass

import capstone
from capstone import x86_const as X

_md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_md.detail = True


@dataclass(frozen=True)
class Placement:
    offset: int     # file offset to probe
    moved: bool     # not the function's first instruction
    reason: str


def emulated(insn) -> bool:
    """Instructions the x86 uprobe code emulates instead of single-stepping: nops, `push reg`,
    and relative jumps/calls (conditional or not)."""
    if insn.id == X.X86_INS_NOP:
        return True
    if insn.id == X.X86_INS_PUSH:
        return len(insn.operands) == 1 and insn.operands[0].type == X.X86_OP_REG
    if insn.group(capstone.CS_GRP_JUMP) or insn.group(capstone.CS_GRP_CALL):
        return bool(insn.operands) and insn.operands[0].type == X.X86_OP_IMM
    return False


def _branch_targets(insns) -> set[int]:
    out = set()
    for i in insns:
        if (i.group(capstone.CS_GRP_JUMP) or i.group(capstone.CS_GRP_CALL)) and i.operands and \
                i.operands[0].type == X.X86_OP_IMM:
            out.add(int(i.operands[0].imm))
    return out


def place_entry(path: str, offset: int, size: int, arg_reg: int = X.X86_REG_RDI) -> Placement:
    """Probe offset for an entry-only probe of the function at file `offset` (`size` bytes)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            code = f.read(max(size, 16) if size else 64)
    except OSError as e:
        return Placement(offset, False, f"entry (cannot read code: {e.strerror})")
    insns = list(_md.disasm(code, offset))
    if not insns:
        return Placement(offset, False, "entry (cannot disassemble)")
    if emulated(insns[0]):
        return Placement(offset, False, f"entry ({insns[0].mnemonic}: emulated)")
    if len(insns) >= 3 and size:
        t, j, nxt = insns[0], insns[1], insns[2]
        is_null_check = (t.id == X.X86_INS_TEST and len(t.operands) == 2 and
                         all(o.type == X.X86_OP_REG and o.reg == arg_reg for o in t.operands) and
                         j.id == X.X86_INS_JE)
        if is_null_check and emulated(nxt) and nxt.address not in _branch_targets(insns):
            return Placement(nxt.address, True, f"after the NULL check (+{nxt.address - offset}: "
                                                f"{nxt.mnemonic} {nxt.op_str}, emulated)")
    return Placement(offset, False, f"entry ({insns[0].mnemonic}: single-stepped)")
