"""Where to put an entry uprobe so the kernel can emulate the probed instruction.

A uprobe replaces an instruction with int3; on the hit the kernel either emulates the original
instruction (branches, `push reg`, nops: ~1 µs here) or single-steps a copy of it out of line
(~5.5 µs). Two ways to reach an emulated instruction, both proved on the whole function's
disassembly (capstone), else the entry is kept:

- Straight-line prefix (`place_probe`): jemalloc's `malloc` begins `cmp $0x1000,%rdi; ja ...`,
  its `free` with ten `mov/shr/and/add/cmp` before a `jne`. When every instruction before an
  emulated one is plain arithmetic or a load that writes neither %rsp, nor memory, nor a register
  the probe reads, and no branch of the function lands in that stretch, probing the emulated
  instruction sees exactly the entry's arguments, stack pointer and return address at [%rsp] —
  so a return probe may sit there too (the kernel hijacks the return address it finds at
  [%rsp]). Every call passes there exactly once.
- Behind a NULL check (`place_entry`, entry-only `free`): glibc's `free` begins
  `test %rdi,%rdi; je ...; push %rbp`. Probing the push is equivalent for every non-NULL
  pointer (free(NULL) does nothing) as long as no other path of the function reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone
from capstone import x86_const as X

_md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_md.detail = True


@dataclass(frozen=True)
class Placement:
    offset: int  # file offset to probe
    moved: bool  # not the function's first instruction
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


# Instructions a straight-line prefix may hold: they read registers or memory and write one
# register (or only flags). Anything else (stores, stack ops, string ops, calls) ends the search.
_PLAIN = {
    X.X86_INS_ENDBR64,
    X.X86_INS_MOV,
    X.X86_INS_MOVABS,
    X.X86_INS_MOVZX,
    X.X86_INS_MOVSX,
    X.X86_INS_MOVSXD,
    X.X86_INS_LEA,
    X.X86_INS_CMP,
    X.X86_INS_TEST,
    X.X86_INS_AND,
    X.X86_INS_OR,
    X.X86_INS_XOR,
    X.X86_INS_ADD,
    X.X86_INS_SUB,
    X.X86_INS_SHR,
    X.X86_INS_SHL,
    X.X86_INS_SAR,
    X.X86_INS_NOT,
    X.X86_INS_NEG,
    X.X86_INS_INC,
    X.X86_INS_DEC,
    X.X86_INS_IMUL,
}
# Full registers and their parts: a write to %edi writes %rdi.
_PARTS = {
    X.X86_REG_RDI: (X.X86_REG_RDI, X.X86_REG_EDI, X.X86_REG_DI, X.X86_REG_DIL),
    X.X86_REG_RSI: (X.X86_REG_RSI, X.X86_REG_ESI, X.X86_REG_SI, X.X86_REG_SIL),
    X.X86_REG_RDX: (X.X86_REG_RDX, X.X86_REG_EDX, X.X86_REG_DX, X.X86_REG_DL, X.X86_REG_DH),
    X.X86_REG_RCX: (X.X86_REG_RCX, X.X86_REG_ECX, X.X86_REG_CX, X.X86_REG_CL, X.X86_REG_CH),
    X.X86_REG_RSP: (X.X86_REG_RSP, X.X86_REG_ESP, X.X86_REG_SP, X.X86_REG_SPL),
    X.X86_REG_R8: (X.X86_REG_R8, X.X86_REG_R8D, X.X86_REG_R8W, X.X86_REG_R8B),
    X.X86_REG_R9: (X.X86_REG_R9, X.X86_REG_R9D, X.X86_REG_R9W, X.X86_REG_R9B),
}
_MAX_PREFIX = 16

# Argument registers each entry probe of probes/allocscope.c reads (besides %rsp).
REG_DI, REG_SI, REG_DX, REG_CX = X.X86_REG_RDI, X.X86_REG_RSI, X.X86_REG_RDX, X.X86_REG_RCX
ARG_REGS = (REG_DI, REG_SI, REG_DX, REG_CX, X.X86_REG_R8, X.X86_REG_R9)  # arg0..arg5, System V
_DI, _SI, _DX = REG_DI, REG_SI, REG_DX
ENTRY_READS: dict[str, tuple[int, ...]] = {
    "malloc": (_DI,),
    "calloc": (_DI, _SI),
    "realloc": (_DI, _SI),
    "reallocarray": (_DI, _SI, _DX),
    "posix_memalign": (_DI, _DX),
    "aligned_alloc": (_SI,),
    "memalign": (_SI,),
    "valloc": (_DI,),
    "pvalloc": (_DI,),
    "malloc_trim": (_DI,),
    "free": (_DI,),
}


def _plain(insn, keep: set[int]) -> bool:
    """Writes no memory, no stack pointer and no register of `keep` (full registers)."""
    if insn.id not in _PLAIN or insn.prefix[0] != 0:  # lock/rep prefixes
        return False
    if any(o.type == X.X86_OP_MEM and (o.access & capstone.CS_AC_WRITE) for o in insn.operands):
        return False
    _, written = insn.regs_access()
    banned = {p for r in keep | {X.X86_REG_RSP} for p in _PARTS.get(r, (r,))}
    return not (set(written) & banned)


def _branch_targets(insns) -> set[int]:
    out = set()
    for i in insns:
        if (
            (i.group(capstone.CS_GRP_JUMP) or i.group(capstone.CS_GRP_CALL))
            and i.operands
            and i.operands[0].type == X.X86_OP_IMM
        ):
            out.add(int(i.operands[0].imm))
    return out


def _disassemble(path: str, offset: int, length: int):
    """The function's instructions, or the Placement at its entry when there is no choice to make
    (unreadable, undecodable, or its first instruction is emulated already)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            code = f.read(length)
    except OSError as e:
        return Placement(offset, False, f"entry (cannot read code: {e.strerror})")
    insns = list(_md.disasm(code, offset))
    if not insns:
        return Placement(offset, False, "entry (cannot disassemble)")
    if emulated(insns[0]):
        return Placement(offset, False, f"entry ({insns[0].mnemonic}: emulated)")
    return insns


def place_entry(path: str, offset: int, size: int, arg_reg: int = X.X86_REG_RDI) -> Placement:
    """Probe offset for an entry-only probe of the function at file `offset` (`size` bytes)."""
    insns = _disassemble(path, offset, max(size, 16) if size else 64)
    if isinstance(insns, Placement):
        return insns
    # A CET build (Ubuntu's glibc) starts every function with endbr64, which changes nothing the
    # probe reads: what follows it is the entry as far as the probe is concerned.
    skip = 1 if insns[0].id == X.X86_INS_ENDBR64 else 0
    body = insns[skip:]
    targets = _branch_targets(insns) if size else set()
    if skip and body and size and emulated(body[0]) and body[0].address not in targets:
        return Placement(
            body[0].address,
            True,
            f"after endbr64 (+{body[0].address - offset}: {body[0].mnemonic} {body[0].op_str}, emulated)",
        )
    if len(body) >= 3 and size:
        t, j, nxt = body[0], body[1], body[2]
        is_null_check = (
            t.id == X.X86_INS_TEST
            and len(t.operands) == 2
            and all(o.type == X.X86_OP_REG and o.reg == arg_reg for o in t.operands)
            and j.id == X.X86_INS_JE
        )
        if is_null_check and emulated(nxt) and nxt.address not in targets and not (skip and t.address in targets):
            return Placement(
                nxt.address,
                True,
                f"after the NULL check (+{nxt.address - offset}: {nxt.mnemonic} {nxt.op_str}, emulated)",
            )
    return Placement(offset, False, f"entry ({insns[0].mnemonic}: single-stepped)")


def place_probe(path: str, offset: int, size: int, reads: tuple[int, ...]) -> Placement:
    """Probe offset for the function at file `offset` (`size` bytes) whose entry (and return)
    probes read the argument registers `reads` and %rsp: the first emulated instruction behind a
    straight-line prefix that leaves them (and memory) untouched; else the entry."""
    insns = _disassemble(path, offset, size if size else 64)
    if isinstance(insns, Placement):
        return insns
    if not size:  # without the function's extent no branch into the prefix can be ruled out
        return Placement(offset, False, f"entry ({insns[0].mnemonic}: single-stepped)")
    targets = _branch_targets(insns)
    keep = set(reads)
    for k, insn in enumerate(insns[:_MAX_PREFIX]):
        if k > 0 and insn.address in targets:
            break
        if k > 0 and emulated(insn):
            return Placement(
                insn.address,
                True,
                f"+{insn.address - offset}: {insn.mnemonic} {insn.op_str} (emulated), behind {k} plain instruction(s)",
            )
        if not _plain(insn, keep):
            break
    return Placement(offset, False, f"entry ({insns[0].mnemonic}: single-stepped)")
