"""Lowering of warpgroup MMA (wgmma) and its wait.

A `warpgroup_mma` becomes, for the warpgroup(s) running it:

    wgmma.fence                      (accumulators and register A pass through it)
    for each K step, for each m64nN tile of the accumulator:
        wgmma.mma_async              (accumulator registers in/out, tied)
    wgmma.commit_group
    wgmma.wait_group 0               (only when not is_async; accumulators pass through)

Everything the instructions need is the op's plan, recorded by the plan_data_movement
pass (compiler/warpgroup_mma_plan.py, pure Python, tested on the CPU): which accumulator register
is each instruction's d_i, which register-A registers pack into its a0..a3, and the
static part of the shared-memory descriptors, whose decode was checked against the
buffers' own addressing for every tile. What is left here is the run-time part: the
views' base addresses (their alignment checked against the plan's swizzle) and the
warpgroup's rows (A) and columns (B), which the accumulator layout's warp bases give.
"""

from __future__ import annotations

import math
import weakref

from llvmlite import ir

from ..errors import CompilationError
from ..ir import (AllocateSharedMemory, For, Kernel, SharedIndex, SharedPermute, SharedReinterpret, SharedSlice, Value,
                  WarpSpecialize, WarpgroupMma, WarpgroupMmaWait, Yield, is_tensor)
from ..types import SharedType
from ..warpgroup_mma_descriptors import CHUNK_BYTES, FIELD_LIMIT, AccumulatorPlan, OperandPlan, WgmmaError, check_alignment
from ..warpgroup_mma_plan import DotPlan, operand_error
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, SharedView, lowers
from .indexing import xor_of_bits
from .lower_kernel import SHARED_ALIGN
from .warp_ops import from_bits, is_half, pack_word, to_bits


# ------------------------------------------------------------------- pass-through
def _passing(b: ir.IRBuilder, value: ir.Value) -> tuple[ir.Value, str]:
    """A register as an inline-asm operand: (value in an asm-friendly type, letter)."""
    if value.type == T.F32:
        return value, "f"
    if value.type == T.F64:
        return value, "d"
    bits = to_bits(b, value)
    width = bits.type.width
    if width < 16:
        return b.zext(bits, T.I16), "h"
    return bits, {16: "h", 32: "r", 64: "l"}[width]


def _restore(b: ir.IRBuilder, passed: ir.Value, like: ir.Value) -> ir.Value:
    """Inverse of `_passing`."""
    if passed.type == like.type:
        return passed
    if isinstance(like.type, ir.IntType) and like.type.width <= 8:
        passed = b.trunc(passed, T.I8)
    return from_bits(b, passed, like.type)



def pass_through(ctx: Lowering, asm_of_letters, values: list[ir.Value]) -> list[ir.Value]:
    """Run an asm (built from the operand letters) that the values pass through.

    Neighbouring 16-bit floats travel packed in one 32-bit register: an fp16 accumulator's
    pairs (d_2j, d_2j+1) were unpacked from one such register, so LLVM folds the repack
    away and nothing reads the halves before the asm.
    """
    b = ctx.builder
    groups: list[list[ir.Value]] = []
    i = 0
    while i < len(values):
        if i + 1 < len(values) and is_half(values[i]) and values[i + 1].type == values[i].type:
            groups.append(values[i:i + 2])
            i += 2
        else:
            groups.append([values[i]])
            i += 1
    operands = []
    for group in groups:
        if len(group) == 2:
            vector = ir.Constant(ir.VectorType(group[0].type, 2), None)
            for j, value in enumerate(group):
                vector = b.insert_element(vector, value, ir.Constant(T.I32, j))
            operands.append((b.bitcast(vector, T.I32), "r"))
        else:
            operands.append(_passing(b, group[0]))
    outs = ctx.inline_asm(asm_of_letters([letter for _, letter in operands]), [v for v, _ in operands],
                [v.type for v, _ in operands])
    result = []
    for out, group in zip(outs, groups):
        if len(group) == 2:
            result.extend(_unpack_half(b, out, group[0].type))
        else:
            result.append(_restore(b, out, group[0]))
    return result


# ----------------------------------------------------------------- alignment of views
_ALIGNMENTS: "weakref.WeakKeyDictionary[Lowering, dict]" = weakref.WeakKeyDictionary()


def _lowbit(value: int) -> int:
    return value & -value if value else SHARED_ALIGN


def _size_alignment(value: Value) -> int:
    """What the allocator guarantees a buffer of this size (roots are aligned to their
    size rounded up to a power of two, at most 1024; stages are whole sub-buffers)."""
    size = value.type.num_bytes
    return min(SHARED_ALIGN, 1 << (size.bit_length() - 1)) if size else 16


def _walk_alignments(kernel: Kernel, loop_args: dict[Value, int]) -> dict[Value, int]:
    known: dict[Value, int] = {}
    for op in kernel.walk():
        if isinstance(op, AllocateSharedMemory) and op.offset is not None:
            known[op.result] = min(SHARED_ALIGN, _lowbit(op.offset))
        elif isinstance(op, SharedIndex) and op.buffer in known:
            parent = op.buffer.type
            known[op.result] = min(known[op.buffer], _lowbit(parent.num_bytes // parent.shape[0]))
        elif isinstance(op, (SharedSlice, SharedPermute, SharedReinterpret)) and op.buffer in known:
            known[op.result] = known[op.buffer]
        elif isinstance(op, WarpSpecialize):
            for block in (op.default, *op.workers):
                for arg, capture in zip(block.args, op.captures):
                    if capture in known:
                        known[arg] = known[capture]
        elif isinstance(op, For):
            for arg, result, init in zip(op.body.args[1:], op.results, op.inits):
                if init in known:
                    known[arg] = known[result] = min(known[init], loop_args.get(arg, SHARED_ALIGN))
    return known


def _known_alignments(kernel: Kernel) -> dict[Value, int]:
    """Bytes each shared value's base address is known to be a multiple of.

    Roots are allocated at `offset` in the 1024-byte-aligned shared array; `index` moves
    by whole sub-buffers; slices and permutes keep the base (their offset is an xor); a
    buffer carried by a loop is as aligned as the least aligned of its init and the value
    the body yields (a second walk applies that).
    """
    known = _walk_alignments(kernel, {})
    loop_args = {}
    for op in kernel.walk():
        if isinstance(op, For) and op.body.ops and isinstance(op.body.ops[-1], Yield):
            for arg, value in zip(op.body.args[1:], op.body.ops[-1].values):
                if arg in known:
                    loop_args[arg] = known.get(value, _size_alignment(value))
    return _walk_alignments(kernel, loop_args) if loop_args else known


def view_alignment(ctx: Lowering, value: Value) -> int:
    """Known alignment of a shared value's base; for a value the walk cannot trace, what
    the allocator guarantees a buffer of its size."""
    if ctx not in _ALIGNMENTS:
        _ALIGNMENTS[ctx] = _known_alignments(ctx.kernel)
    known = _ALIGNMENTS[ctx].get(value)
    return known if known is not None else _size_alignment(value)


# ---------------------------------------------------------------------- descriptors
class _Descriptors:
    """Descriptors of one shared operand: base address, plus the warpgroup's rows or
    columns (run time), plus each tile's static unswizzled offset."""

    def __init__(self, ctx: Lowering, view: SharedView, plan: OperandPlan, warp_components: list[int]):
        b = ctx.builder
        self.ctx, self.plan = ctx, plan
        self.address = b.ptrtoint(view.base, T.I32)
        self.constant = ir.Constant(T.I64, plan.constant_bits)
        self.dynamic = xor_of_bits(b, _descriptor_warp(ctx) if any(warp_components) else None, warp_components)
        self.dynamic_bits = 0
        for c in warp_components:
            self.dynamic_bits |= c
        start = self.address if self.dynamic is None else b.add(self.address, self.dynamic)
        self.base = self._encode(start)
        # Steps from a base built at the wgmma from the shfl'd warp index stay adds (see
        # `at`). Others are left to LLVM: a fixed buffer's computed once, before loops, and
        # a ring slot's as ors (as adds they pushed the tutorial backward, at 255 registers,
        # into a spill).
        self.add_steps = ctx.kernel.language == "highlevel" and self.dynamic is not None

    def _encode(self, start: ir.Value) -> ir.Value:
        # The start-address field holds bits 4-17 of the CTA's shared offset. The address
        # itself can have higher bits: in a cluster launch a CTA's shared::cta window sits
        # at its rank << 24 (rank 1's buffers start at 0x1000400), and unmasked, that bit
        # would land in the leading-byte-offset field and misplace every operand tile past
        # the first swizzle atom.
        b = self.ctx.builder
        field = b.and_(start, ir.Constant(T.I32, FIELD_LIMIT - CHUNK_BYTES))
        return b.or_(self.constant, b.zext(b.lshr(field, ir.Constant(T.I32, 4)), T.I64))

    def at(self, mn: int, k: int) -> ir.Value:
        static = self.plan.start_offset(mn, k)
        b = self.ctx.builder
        if not static & self.dynamic_bits:
            # Disjoint bits: the xor is a sum, and the masked start >> 4 fits the 14-bit field
            # with room to spare (a CTA's shared offsets stay below 2^18), so the constant is added.
            if not static:
                return self.base
            if self.add_steps:  # kept one 64-bit add, as Triton's are (ptx_asm.wgmma_descriptor_step)
                text, constraints = ptx_asm.wgmma_descriptor_step(static >> 4)
                return b.asm(ir.FunctionType(T.I64, [T.I64]), text, constraints, [self.base], side_effect=False)
            return b.add(self.base, ir.Constant(T.I64, static >> 4))
        offset = b.xor(self.dynamic, ir.Constant(T.I32, static))
        return self._encode(b.add(self.address, offset))


def _descriptor_warp(ctx: Lowering) -> ir.Value:
    """The warp index a descriptor's rows or columns come from. In highlevel kernels, lane
    0's by a shfl at the wgmma: ptxas then knows it (and the descriptors made from it) to
    be warp-uniform and builds them in uniform registers, and LLVM, which may not move the
    shfl, leaves them in the loop; hoisted, they would be held in vector registers and
    moved to uniform ones (R2UR) before every wgmma, as Triton's descriptors are not.
    The lowlevel kernels keep the index read once (their PTX is tuned as it is)."""
    warp = ctx.hardware_index("warp")
    if ctx.kernel.language != "highlevel":
        return warp
    return ctx.intrinsic("llvm.nvvm.shfl.sync.idx.i32", T.I32,
                         [ir.Constant(T.I32, -1), warp, ir.Constant(T.I32, 0), ir.Constant(T.I32, 0x1F)])


def _warp_components(acc: AccumulatorPlan, plan: OperandPlan, axis: int) -> list[int]:
    """Per warp-index bit, the unswizzled byte offset it adds to the operand's start: 0 for
    the 4 warps of a warpgroup, then the warpgroup origins' rows (A) or columns (B)."""
    components = [0, 0]
    for origin in acc.warpgroup_origins:
        components.append(plan.linear_offset(origin[axis], 0))
    return components


# ------------------------------------------------------------------------- the dot
def _check_alignments(ctx: Lowering, op: WarpgroupMma, plan: DotPlan) -> None:
    """The one run-time part of a descriptor is its view's base: allocation says how
    aligned it is known to be, and the swizzle pattern must start there."""
    for value, operand, name in ((op.a, plan.a, "a"), (op.b, plan.b, "b")):
        if operand is None:
            continue
        try:
            check_alignment(operand, view_alignment(ctx, value))
        except WgmmaError as error:
            raise operand_error(op, value, name, error) from None


def _unpack_half(b: ir.IRBuilder, word: ir.Value, element: ir.Type) -> list[ir.Value]:
    pair = b.bitcast(word, ir.VectorType(element, 2))
    return [b.extract_element(pair, ir.Constant(T.I32, i)) for i in range(2)]


def _is_false(value: ir.Value) -> bool:
    return isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) and value.constant in (0, False)


def _is_positive_zero(value: ir.Value) -> bool:
    return (isinstance(value, ir.Constant) and isinstance(value.constant, float) and value.constant == 0.0
            and math.copysign(1.0, value.constant) > 0)


def starts_from_zero(ctx: Lowering, op: WarpgroupMma, registers) -> bool:
    """Whether the first K step can run with scale-d = 0 (D = A*B): `use_acc` is the
    constant false, or the accumulator is the constant +0.0 (A*B + 0 = A*B whatever
    use_acc is). The accumulator's incoming values are then never read, so they need not
    be materialised."""
    if op.use_acc is not None and _is_false(ctx.scalar(op.use_acc)):
        return True
    return all(_is_positive_zero(r) for r in registers)


@lowers(WarpgroupMma)
def lower_warpgroup_mma(ctx: Lowering, op: WarpgroupMma) -> None:
    plan: DotPlan = op.recorded_plan()
    _check_alignments(ctx, op, plan)
    b = ctx.builder
    acc = plan.acc
    registers = list(ctx.registers(op.acc, T.register_count(op.acc.type)))
    half = plan.types[2] == "f16"
    from_zero = starts_from_zero(ctx, op, registers)
    # Accumulator words per tile: f32 registers, or f16 pairs packed in 32 bits; undef
    # when the first step ignores them (scale-d = 0), so no zeros are moved into place.
    if from_zero:
        undef = ir.Constant(T.I32 if half else T.F32, ir.Undefined)
        words = [[undef] * (len(t) // 2 if half else len(t)) for t in acc.registers]
    elif half:
        vector = ir.VectorType(T.F16, 2)
        words = [[b.bitcast(b.insert_element(b.insert_element(ir.Constant(vector, None), registers[t[2 * j]],
                                                              ir.Constant(T.I32, 0)),
                                             registers[t[2 * j + 1]], ir.Constant(T.I32, 1)), T.I32)
                  for j in range(len(t) // 2)] for t in acc.registers]
    else:
        words = [[registers[r] for r in t] for t in acc.registers]
    a_words: dict = {}
    if plan.a_registers is not None:
        a_values = ctx.registers(op.a, T.register_count(op.a.type))
        for key, groups in plan.a_registers:
            a_words[key] = [pack_word(b, [a_values[r] for r in group], plan.bits) for group in groups]
    # wgmma.fence, with every register the instructions read passing through it (undef
    # accumulators are not read).
    fenced_words = [] if from_zero else words
    flat = [w for tile in fenced_words for w in tile] + [w for key in sorted(a_words) for w in a_words[key]]
    fenced = pass_through(ctx, ptx_asm.wgmma_fence_operands, flat)
    cursor = 0
    for tile in fenced_words:
        tile[:] = fenced[cursor:cursor + len(tile)]
        cursor += len(tile)
    for key in sorted(a_words):
        a_words[key] = fenced[cursor:cursor + 4]
        cursor += 4
    descriptors_b = _Descriptors(ctx, ctx.shared(op.b), plan.b, _warp_components(acc, plan.b, 1))
    descriptors_a = None
    if plan.a is not None:
        descriptors_a = _Descriptors(ctx, ctx.shared(op.a), plan.a, _warp_components(acc, plan.a, 0))
    # scale-d of the first step is the constant 0 exactly when the accumulators are undef.
    if from_zero:
        use_acc = ir.Constant(T.I32, 0)
    elif op.use_acc is None:
        use_acc = ir.Constant(T.I32, 1)
    else:
        use_acc = b.zext(ctx.scalar(op.use_acc), T.I32)
    dtype, atype, btype = plan.types[2], plan.types[0], plan.types[1]
    letter = "r" if half else "f"
    word_type = T.I32 if half else T.F32
    trans_a = plan.a.transposed if plan.a is not None else 0
    asm = ptx_asm.wgmma_mma_async(acc.n, plan.k, dtype, atype, btype, len(words[0]), letter,
                              plan.a is None, trans_a, plan.b.transposed)
    for step in range(plan.steps):
        k0 = step * plan.k
        scale = use_acc if step == 0 else ir.Constant(T.I32, 1)
        for tile, (m0, n0) in zip(words, acc.tiles):
            a_operands = a_words[(m0, step)] if descriptors_a is None else [descriptors_a.at(m0, k0)]
            outs = ctx.inline_asm(asm, [*tile, *a_operands, descriptors_b.at(n0, k0), scale], [word_type] * len(tile))
            tile[:] = outs
    ctx.inline_asm(ptx_asm.wgmma_commit_group(), [])
    if not op.is_async:
        flat = pass_through(ctx, lambda letters: ptx_asm.wgmma_wait_group(0, letters), [w for t in words for w in t])
        cursor = 0
        for tile in words:
            tile[:] = flat[cursor:cursor + len(tile)]
            cursor += len(tile)
    result: list = [None] * len(registers)
    for tile, tile_words in zip(acc.registers, words):
        if half:
            for j, word in enumerate(tile_words):
                result[tile[2 * j]], result[tile[2 * j + 1]] = _unpack_half(b, word, T.F16)
        else:
            for r, word in zip(tile, tile_words):
                result[r] = word
    ctx.define(op.result, tuple(result))


@lowers(WarpgroupMmaWait)
def lower_warpgroup_mma_wait(ctx: Lowering, op: WarpgroupMmaWait) -> None:
    """wgmma.wait_group `pending`; each tensor dep's registers pass through the wait, so
    reads of the results cannot move above it. Shared deps are returned as they are."""
    if len(op.results) != len(op.deps):
        raise CompilationError("warpgroup_mma_wait: one result per dep", op.loc)
    values: list[ir.Value] = []
    for dep in op.deps:
        if is_tensor(dep):
            values.extend(ctx.registers(dep, T.register_count(dep.type)))
    passed = pass_through(ctx, lambda letters: ptx_asm.wgmma_wait_group(op.pending, letters, op.anchor), values)
    cursor = 0
    for dep, result in zip(op.deps, op.results):
        if is_tensor(dep):
            count = T.register_count(dep.type)
            ctx.define(result, tuple(passed[cursor:cursor + count]))
            cursor += count
        elif isinstance(dep.type, SharedType):
            ctx.define(result, ctx.shared(dep))
        else:
            ctx.define(result, ctx.get(dep))
