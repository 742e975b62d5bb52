"""Lowering of the warp-level MMA (MmaV2): one mma.sync.aligned.m16n8k16 per
instruction of compiler/mma.py's plan, each warp on its own registers.

The accumulator's registers chain through the K steps as the asm's tied operands; A's
and B's 16-bit pairs pack into 32-bit words (a pair converted together is one register
already, and LLVM folds the repack away). A shared operand is read where an instruction
first needs it, each thread getting the elements its register layout (`a_layout`,
`b_layout`) gives it: by one ldmatrix where the words are 8 x 8 matrices of 16-byte rows
(compiler/mma.py; an A fragment's four words, or the B words of two instructions in a
row), else word by word.

The asm is marked side-effecting so that LLVM keeps it where the kernel put it: inside a
branch taken warp by warp, never hoisted. So are the shared operands' addresses: their
thread parts are computed where the MmaV2 is, from a read of %tid.x LLVM may not hoist
(Lowering.recompute_scope), rather than once per kernel or loop iteration. A MmaV2 in a
rare branch (flash attention's overflow path) then holds no registers outside it: with
the addresses hoisted, its 16 words spilled around the key loop.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import MmaV2, is_shared
from ..mma import MmaError, ldmatrix_addresses, plan_mma_v2
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, lowers
from .indexing import element_pointer
from .lower_shared import SharedAccess
from .warp_ops import pack_word

INPUT_TYPES = {"bf16": "bf16", "fp16": "f16"}


class _Words:
    """An operand's 32-bit words (pairs of 16-bit elements), each built once: from its
    registers, or loaded from its shared view on first use."""

    def __init__(self, ctx: Lowering, value, layout):
        self.ctx, self.words = ctx, {}
        if is_shared(value):
            self.access, self.registers = SharedAccess(ctx, ctx.shared(value), layout), None
        else:
            self.access, self.registers = None, ctx.registers(value, T.register_count(value.type))

    def fetch(self, pairs: tuple[tuple[int, int], ...], ahead: tuple[tuple[int, int], ...] = ()) -> list[ir.Value]:
        """One instruction's words, those not built yet by one ldmatrix where it can
        (with the next instruction's, `ahead`, where one ldmatrix.x4 takes both)."""
        missing = tuple(pair for pair in pairs if pair not in self.words)
        if missing and len(missing) == 2 and all(pair not in self.words for pair in ahead) and self.loads(missing + ahead):
            return [self.words[pair] for pair in pairs]
        self.loads(missing)
        for pair in missing:
            if pair not in self.words:
                self.words[pair] = self._build(pair)
        return [self.words[pair] for pair in pairs]

    def loads(self, missing: tuple[tuple[int, int], ...]) -> bool:
        """Build `missing` by one ldmatrix; False where it cannot load them."""
        if missing and self.access is not None:
            view = self.access.view
            addresses = ldmatrix_addresses(self.access.offsets, missing, view.xor, view.align, self.access.bytes)
            if addresses is not None:
                b = self.ctx.builder
                pointer = element_pointer(self.ctx, view.base, self.access.memory, addresses, missing[0][0], view.xor)
                address = b.ptrtoint(pointer, T.I32)
                loaded = self.ctx.inline_asm(ptx_asm.ldmatrix(len(missing)), [address], [T.I32] * len(missing))
                self.words.update(zip(missing, loaded))
                return True
        return False

    def _build(self, pair: tuple[int, int]) -> ir.Value:
        b = self.ctx.builder
        if self.access is None:
            return pack_word(b, [self.registers[r] for r in pair], 16)
        access = self.access
        first, second = pair
        if second == first + 1 and first % 2 == 0 and access.vector >= 2:
            vector = ir.VectorType(access.memory, 2)
            return b.bitcast(b.load(access.pointer(first), typ=vector, align=2 * access.bytes), T.I32)
        values = [b.load(access.pointer(r), typ=access.memory, align=access.bytes) for r in pair]
        return pack_word(b, values, 16)


@lowers(MmaV2)
def lower_mma_v2(ctx: Lowering, op: MmaV2) -> None:
    a_layout = op.a_layout if is_shared(op.a) else op.a.type.layout
    b_layout = op.b_layout if is_shared(op.b) else op.b.type.layout
    try:
        plan = plan_mma_v2(op.acc.type.layout, a_layout, b_layout)
    except MmaError as error:
        raise CompilationError(f"mma_v2: {error}", op.loc, suggestion=error.suggestion) from None
    input_type = INPUT_TYPES.get(op.a.type.element.name)
    if input_type is None or op.b.type.element != op.a.type.element:
        raise CompilationError(f"mma_v2: operands must be two fp16 or two bf16 tensors, found "
                               f"{op.a.type.element} and {op.b.type.element}", op.loc)
    acc = list(ctx.registers(op.acc, T.register_count(op.acc.type)))
    asm = ptx_asm.mma_sync_m16n8k16(input_type)
    with ctx.recompute_scope(ctx.builder):  # thread parts of addresses computed here
        a_words, b_words = _Words(ctx, op.a, a_layout), _Words(ctx, op.b, b_layout)
        for i, instr in enumerate(plan):
            ahead = plan[i + 1] if i + 1 < len(plan) else None
            operands = [acc[r] for r in instr.c] + a_words.fetch(instr.a)
            operands += b_words.fetch(instr.b, ahead.b if ahead is not None and ahead.b != instr.b else ())
            for r, out in zip(instr.c, ctx.inline_asm(asm, operands, [T.F32] * 4)):
                acc[r] = out
    ctx.define(op.result, tuple(acc))
