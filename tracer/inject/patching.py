"""The machine code of --inject's hooks (tracer/inject/): which entry instructions a 5-byte jump
displaces, the trampoline that replays them, and the stub that enters a hook.

An entry may be patched when its first instructions (at least 5 bytes) can run elsewhere: no
relative branch, call or return among them, RIP-relative operands re-aimed from the trampoline,
no int3 (another tool's breakpoint), and no branch of the function landing inside them (capstone,
over the whole function). The patched bytes must also lie in one aligned 8- or 16-byte word, so
that the agent's watchdog can put them back with a single compare-and-swap.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import capstone
from capstone import x86_const as X

_md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_md.detail = True

JMP_LEN = 5  # e9 rel32
SLOT_LEN = 16  # struct as_slot
STUB_LEN = 24  # movabs $slot, %rcx; jmp *0(%rip); .quad hook
ABS_JMP_LEN = 14  # jmp *0(%rip); .quad target
ENTRY_SPAN = 128  # bytes per hooked function in a stub page


class PatchRefused(Exception):
    """Why an entry cannot be patched (one line)."""


@dataclass
class Displaced:
    length: int  # bytes of whole instructions covering the jump
    text: str  # what they are, for the record


def displaced(code: bytes, addr: int, func_size: int, func_code: bytes | None = None) -> Displaced:
    """The instructions at `addr` a jump displaces, proved movable (else PatchRefused)."""
    n = 0
    names = []
    for insn in _md.disasm(code, addr):
        if insn.id in (X.X86_INS_INT3, X.X86_INS_INT, X.X86_INS_UD2):
            raise PatchRefused(f"{insn.mnemonic} at entry+{insn.address - addr} (another tool's breakpoint?)")
        if (
            insn.group(capstone.CS_GRP_RET)
            or insn.group(capstone.CS_GRP_INT)
            or insn.id in (X.X86_INS_LOOP, X.X86_INS_LOOPE, X.X86_INS_LOOPNE, X.X86_INS_JRCXZ, X.X86_INS_JECXZ)
            or (_branch(insn) and not _relative(insn) and not _rip_mem(insn))
        ):
            raise PatchRefused(f"a {insn.mnemonic} within the first {JMP_LEN} bytes")
        if any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP and op.mem.index != 0 for op in insn.operands):
            raise PatchRefused("an indexed RIP-relative operand")
        names.append(insn.mnemonic)
        n += insn.size
        if n >= JMP_LEN:
            break
    if n < JMP_LEN:
        raise PatchRefused(f"the function is shorter than {JMP_LEN} bytes of decodable code")
    if func_code is not None:
        for insn in _md.disasm(func_code, addr):
            if (
                (insn.group(capstone.CS_GRP_JUMP) or insn.group(capstone.CS_GRP_CALL))
                and insn.operands
                and insn.operands[0].type == X.X86_OP_IMM
                and addr < insn.operands[0].imm < addr + n
            ):
                raise PatchRefused(f"a branch at entry+{insn.address - addr} lands inside the first {n} bytes")
    return Displaced(n, "; ".join(names))


def _branch(insn) -> bool:
    return insn.group(capstone.CS_GRP_JUMP) or insn.group(capstone.CS_GRP_CALL)


def _relative(insn) -> bool:
    return _branch(insn) and bool(insn.operands) and insn.operands[0].type == X.X86_OP_IMM


def _rip_mem(insn) -> bool:
    return any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP for op in insn.operands)


def _rel32(at: int, size: int, target: int) -> bytes:
    rel = target - (at + size)
    if not -(1 << 31) <= rel < (1 << 31):
        raise PatchRefused("a branch target out of reach of the trampoline")
    return struct.pack("<i", rel)


def relocate(code: bytes, src: int, dst: int) -> bytes:
    """Instructions `code` (decoded at `src`) re-encoded to run at `dst`: RIP-relative
    displacements re-aimed, relative branches widened to rel32 and re-aimed (glibc's free begins
    `test %rdi,%rdi; je ...`). PatchRefused when a target is out of a 32-bit reach."""
    out = bytearray()
    done = 0
    for insn in _md.disasm(code, src):
        done += insn.size
        b = bytearray(insn.bytes)
        at = dst + len(out)
        if _relative(insn):
            target = insn.operands[0].imm
            op = insn.bytes[0]
            if op in (0xE8, 0xE9):  # call/jmp rel32
                out += bytes([op]) + _rel32(at, 5, target)
            elif op == 0xEB:  # jmp rel8
                out += b"\xe9" + _rel32(at, 5, target)
            elif 0x70 <= op <= 0x7F:  # jcc rel8 -> jcc rel32
                out += bytes([0x0F, 0x80 | (op & 0x0F)]) + _rel32(at, 6, target)
            elif op == 0x0F and 0x80 <= insn.bytes[1] <= 0x8F:
                out += bytes(insn.bytes[:2]) + _rel32(at, 6, target)
            else:
                raise PatchRefused(f"{insn.mnemonic}: a branch encoding the trampoline cannot re-aim")
            continue
        if _rip_mem(insn):
            if insn.disp_size != 4:
                raise PatchRefused(f"{insn.mnemonic}: a {insn.disp_size}-byte RIP displacement")
            disp = struct.unpack_from("<i", b, insn.disp_offset)[0]
            target = insn.address + insn.size + disp
            new = target - (at + insn.size)
            if not -(1 << 31) <= new < (1 << 31):
                raise PatchRefused("a RIP-relative operand out of reach of the trampoline")
            struct.pack_into("<i", b, insn.disp_offset, new)
        out += b
    if done != len(code):
        raise PatchRefused("the displaced bytes do not decode as whole instructions")
    return bytes(out)


def abs_jump(target: int) -> bytes:
    return b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", target)


def stub(slot_addr: int, hook_addr: int) -> bytes:
    """movabs $slot, %rcx; jmp *hook: every hooked function takes at most three arguments, so
    %rcx (the fourth) is free at its entry and carries the slot to the hook."""
    return b"\x48\xb9" + struct.pack("<Q", slot_addr) + abs_jump(hook_addr)


def rel_jump(at: int, target: int) -> bytes:
    rel = target - (at + JMP_LEN)
    if not -(1 << 31) <= rel < (1 << 31):
        raise PatchRefused("the stub page is out of a jump's reach")
    return b"\xe9" + struct.pack("<i", rel)


def restore_words(addr: int, orig: bytes) -> tuple[int, bool]:
    """The aligned word (8 bytes, else 16) holding [addr, addr + 5): (its address, wide).
    PatchRefused when the jump straddles a 16-byte boundary."""
    if (addr & 7) + JMP_LEN <= 8:
        return addr & ~7, False
    if (addr & 15) + JMP_LEN <= 16:
        return addr & ~15, True
    raise PatchRefused("the entry is not aligned so that its jump can be taken back atomically")
