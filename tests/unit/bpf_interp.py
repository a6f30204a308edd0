"""A tiny eBPF interpreter for exactly the instructions the device filter generator emits (tests only).

It executes decoded bytes, not the generator's Insn objects, so the encoding is tested too; any other opcode,
a jump out of the program, or a read outside the 12-byte context is an error, as the verifier would refuse it.
"""
from __future__ import annotations

import struct

from runtime.cgroups import bpf_devices as bd

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def run(program: bytes, dev_type: int, access: int, major: int, minor: int, max_steps: int = 10_000) -> int:
    assert len(program) % 8 == 0, "instructions are 8 bytes"
    insns = [struct.unpack_from("<BBhi", program, i) for i in range(0, len(program), 8)]
    ctx = struct.pack("<III", (access << 16) | dev_type, major, minor)
    regs = [0] * 11
    regs[1] = None  # the context pointer: only usable as a load base
    pc = 0
    for _ in range(max_steps):
        code, regbyte, off, imm = insns[pc]
        dst, src = regbyte & 0xF, regbyte >> 4
        pc += 1
        if code == bd.LDX_MEM_W:
            assert src == 1 and regs[1] is None, "loads only from the context"
            assert 0 <= off and off + 4 <= len(ctx) and off % 4 == 0, f"context read at {off}"
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif code == bd.ALU32_AND_K:
            regs[dst] = (regs[dst] & imm) & _U32
        elif code == bd.ALU32_RSH_K:
            regs[dst] = (regs[dst] & _U32) >> imm
        elif code == bd.ALU32_MOV_K:
            regs[dst] = imm & _U32
        elif code == bd.ALU32_MOV_X:
            assert regs[src] is not None
            regs[dst] = regs[src] & _U32
        elif code in (bd.JMP_JEQ_K, bd.JMP_JNE_K):
            a, b = regs[dst] & _U64, imm & _U64   # 64-bit compare against the sign-extended immediate
            if (a == b) == (code == bd.JMP_JEQ_K):
                pc += off
            assert 0 <= pc < len(insns), "jump out of the program"
        elif code == bd.EXIT:
            assert regs[0] in (0, 1), "a device program returns 0 or 1"
            return regs[0]
        else:
            raise AssertionError(f"opcode {code:#x} is not one the generator may emit")
        assert pc < len(insns), "fell off the end of the program"
    raise AssertionError("program did not terminate")
