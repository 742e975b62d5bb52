"""Lowering of warpgroup MMA (wgmma), its wait, the async-proxy fence and permuted views.

A `warpgroup_dot` becomes, for the warpgroup(s) running it:

    wgmma.fence                      (accumulators and register A pass through it)
    for each K step, for each m64nN tile of the accumulator:
        wgmma.mma_async              (accumulator registers in/out, tied)
    wgmma.commit_group
    wgmma.wait_group 0               (only when not is_async; accumulators pass through)

Everything the instructions need is computed from layouts by `compiler.wgmma` (pure
Python, tested on the CPU): which accumulator register is each instruction's d_i, which
register-A registers pack into its a0..a3, and the shared-memory descriptors, whose
decode is checked against the buffers' own addressing for every tile before any code is
emitted. Warpgroups differ only in the start addresses of their descriptors: the
accumulator layout's warp bases say which rows (A) and columns (B) each one owns.
"""

from __future__ import annotations

import math
import weakref
from typing import Optional

from llvmlite import ir

from ...layouts import LinearLayout, NVMMADistributedLayout
from ..errors import CompilationError
from ..ir import (AllocShared, FenceAsyncShared, For, Kernel, SharedIndex, SharedPermute, SharedReinterpret, SharedSlice,
                  Value, WarpGroupDot, WarpGroupDotWait, WarpSpecialize, Yield, is_shared, is_tensor)
from ..types import SharedType, TensorType
from ..wgmma import (CHUNK_BYTES, FIELD_LIMIT, AccumulatorPlan, OperandPlan, OperandView, WgmmaError, check_types,
                     instruction_k, plan_accumulator, plan_operand, plan_register_a)
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, SharedView, lowers
from .indexing import xor_of_bits
from .lower_kernel import SHARED_ALIGN
from .warp_ops import from_bits, is_half, pack_word, to_bits


# ----------------------------------------------------------------- permute and fence
@lowers(SharedPermute)
def lower_shared_permute(ctx: Lowering, op: SharedPermute) -> None:
    """Result dim i is buffer dim order[i]: the same memory, addressing with dims renamed."""
    parent = ctx.shared(op.buffer)
    bases = parent.addressing.bases
    rank = len(bases)
    if sorted(op.order) != list(range(rank)):
        raise CompilationError(f"shared_permute order {list(op.order)} is not a permutation of "
                               f"{list(range(rank))}", op.loc)
    addressing = LinearLayout({f"dim{i}": bases[f"dim{d}"] for i, d in enumerate(op.order)},
                              parent.addressing.out_dims)
    ctx.define(op.result, SharedView(op.result.type, parent.base, addressing, parent.xor, parent.align))


@lowers(FenceAsyncShared)
def lower_fence_async_shared(ctx: Lowering, op: FenceAsyncShared) -> None:
    ctx.inline_asm(ptx_asm.fence_proxy_async_shared(), [])


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
        if isinstance(op, AllocShared) and op.offset is not None:
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
        self.dynamic = xor_of_bits(b, ctx.hardware_index("warp"), warp_components)
        self.dynamic_bits = 0
        for c in warp_components:
            self.dynamic_bits |= c
        start = self.address if self.dynamic is None else b.add(self.address, self.dynamic)
        self.base = self._encode(start)

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
            return self.base if not static else b.add(self.base, ir.Constant(T.I64, static >> 4))
        offset = b.xor(self.dynamic, ir.Constant(T.I32, static))
        return self._encode(b.add(self.address, offset))


def _warp_components(acc: AccumulatorPlan, plan: OperandPlan, axis: int) -> list[int]:
    """Per warp-index bit, the unswizzled byte offset it adds to the operand's start: 0 for
    the 4 warps of a warpgroup, then the warpgroup origins' rows (A) or columns (B)."""
    components = [0, 0]
    for origin in acc.warpgroup_origins:
        components.append(plan.linear_offset(origin[axis], 0))
    return components


# ------------------------------------------------------------------------- the dot
def _fail(op, error: WgmmaError) -> CompilationError:
    return CompilationError(f"warpgroup_mma: {error}", op.loc, suggestion=error.suggestion)


def _describe(type_) -> str:
    return str(type_.encoding) if type_.encoding is not None else "a linear layout"


def _check_shapes(op: WarpGroupDot) -> None:
    a, b, acc, result = op.a.type, op.b.type, op.acc.type, op.result.type
    for name, t in (("a", a), ("b", b), ("acc", acc)):
        if len(t.shape) != 2:
            raise CompilationError(f"warpgroup_mma: {name} must be 2-D, found shape {list(t.shape)}", op.loc)
    if not isinstance(acc, TensorType) or acc.layout is None:
        raise CompilationError("warpgroup_mma: the accumulator must be a tensor with a layout", op.loc)
    if result.shape != acc.shape or result.element != acc.element or result.layout != acc.layout:
        raise CompilationError("warpgroup_mma: the result must have the accumulator's type", op.loc,
                               expected=str(acc), found=str(result))
    (m, k), (k2, n), (m2, n2) = a.shape, b.shape, acc.shape
    if k != k2 or m != m2 or n != n2:
        raise CompilationError(
            "warpgroup_mma: shapes do not chain: a is [M, K], b is [K, N], acc is [M, N]", op.loc,
            expected=f"a [{m2}, K], b [K, {n2}]", found=f"a {list(a.shape)}, b {list(b.shape)}, acc {list(acc.shape)}")
    encoding = acc.encoding
    if encoding is not None and not (isinstance(encoding, NVMMADistributedLayout) and encoding.version[0] == 3):
        raise CompilationError(
            f"warpgroup_mma: the accumulator is in {encoding}; wgmma writes an NVMMADistributedLayout "
            "with version [3, 0]", op.loc,
            suggestion="use NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * g, 1], instr_shape=[16, N, K])")


class _DotPlan:
    """Everything the emission needs, computed and checked before any code is emitted."""

    def __init__(self, ctx: Lowering, op: WarpGroupDot):
        _check_shapes(op)
        a, b, acc = op.a.type, op.b.type, op.acc.type
        try:
            self.types = check_types(a.element.name, b.element.name, acc.element.name)
        except WgmmaError as error:
            raise _fail(op, error) from None
        self.bits = a.element.bits
        self.k = instruction_k(self.bits)
        m, k_total = a.shape
        if k_total % self.k:
            raise CompilationError(
                f"warpgroup_mma: K = {k_total} is not a multiple of the instruction's k = {self.k} "
                f"({a.element} reads 32 bytes of K per instruction)", op.loc)
        self.steps = k_total // self.k
        try:
            self.acc = plan_accumulator(acc.layout, acc.shape)
        except WgmmaError as error:
            raise CompilationError(f"warpgroup_mma: {error}", op.loc,
                                   found=f"accumulator in {_describe(acc)}", suggestion=error.suggestion) from None
        groups = range(self.acc.num_warpgroups)
        rows = sorted({m0 for m0, _ in self.acc.tiles})
        cols = sorted({n0 for _, n0 in self.acc.tiles})
        ks = [s * self.k for s in range(self.steps)]
        self.a_plan: Optional[OperandPlan] = None
        self.a_registers = None
        if is_shared(op.a):
            origins = {(self.acc.warpgroup_origin(g)[0] ^ m0, k0) for g in groups for m0 in rows for k0 in ks}
            self.a_plan = self._operand(ctx, op, op.a, 0, 64, origins, "a")
        elif is_tensor(op.a) and op.a.type.layout is not None:
            try:
                self.a_registers = plan_register_a(op.a.type.layout, self.bits, self.acc, k_total)
            except WgmmaError as error:
                raise CompilationError(f"warpgroup_mma: {error}", op.loc, found=f"a in {_describe(op.a.type)}",
                                       suggestion=error.suggestion) from None
        else:
            raise CompilationError("warpgroup_mma: a must be a shared buffer or a tensor with a layout", op.loc)
        if not is_shared(op.b):
            raise CompilationError("warpgroup_mma: b must be a shared-memory buffer (wgmma reads B from shared "
                                   "memory only)", op.loc)
        origins = {(self.acc.warpgroup_origin(g)[1] ^ n0, k0) for g in groups for n0 in cols for k0 in ks}
        self.b_plan = self._operand(ctx, op, op.b, 1, self.acc.n, origins, "b")

    def _operand(self, ctx, op, value: Value, mn_dim: int, tile_mn: int, origins, name: str) -> OperandPlan:
        view = ctx.shared(value)
        operand = OperandView.from_addressing(view.addressing, view.xor, value.type.element.bits, mn_dim)
        try:
            return plan_operand(operand, tile_mn, self.k, sorted(origins), base_alignment=view_alignment(ctx, value))
        except WgmmaError as error:
            bits = value.type.element.bits
            suggestion = error.suggestion or (f"allocate it with NVMMASharedLayout.get_default_for("
                                              f"{list(value.type.shape)}, {bits}), the layout TMA writes")
            raise CompilationError(f"warpgroup_mma: operand {name} ({value.type} in "
                                   f"{_describe(value.type)}): {error}", op.loc, suggestion=suggestion) from None



def _unpack_half(b: ir.IRBuilder, word: ir.Value, element: ir.Type) -> list[ir.Value]:
    pair = b.bitcast(word, ir.VectorType(element, 2))
    return [b.extract_element(pair, ir.Constant(T.I32, i)) for i in range(2)]


def _is_false(value: ir.Value) -> bool:
    return isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) and value.constant in (0, False)


def _is_positive_zero(value: ir.Value) -> bool:
    return (isinstance(value, ir.Constant) and isinstance(value.constant, float) and value.constant == 0.0
            and math.copysign(1.0, value.constant) > 0)


def starts_from_zero(ctx: Lowering, op: WarpGroupDot, registers) -> bool:
    """Whether the first K step can run with scale-d = 0 (D = A*B): `use_acc` is the
    constant false, or the accumulator is the constant +0.0 (A*B + 0 = A*B whatever
    use_acc is). The accumulator's incoming values are then never read, so they need not
    be materialised."""
    if op.use_acc is not None and _is_false(ctx.scalar(op.use_acc)):
        return True
    return all(_is_positive_zero(r) for r in registers)


@lowers(WarpGroupDot)
def lower_warpgroup_dot(ctx: Lowering, op: WarpGroupDot) -> None:
    plan = _DotPlan(ctx, op)
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
        for key, groups in plan.a_registers.items():
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
    descriptors_b = _Descriptors(ctx, ctx.shared(op.b), plan.b_plan, _warp_components(acc, plan.b_plan, 1))
    descriptors_a = None
    if plan.a_plan is not None:
        descriptors_a = _Descriptors(ctx, ctx.shared(op.a), plan.a_plan, _warp_components(acc, plan.a_plan, 0))
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
    trans_a = plan.a_plan.transposed if plan.a_plan is not None else 0
    asm = ptx_asm.wgmma_mma_async(acc.n, plan.k, dtype, atype, btype, len(words[0]), letter,
                              plan.a_plan is None, trans_a, plan.b_plan.transposed)
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


@lowers(WarpGroupDotWait)
def lower_warpgroup_dot_wait(ctx: Lowering, op: WarpGroupDotWait) -> None:
    """wgmma.wait_group `pending`; each tensor dep's registers pass through the wait, so
    reads of the results cannot move above it. Shared deps are returned as they are."""
    if len(op.results) != len(op.deps):
        raise CompilationError("warpgroup_mma_wait: one result per dep", op.loc)
    values: list[ir.Value] = []
    for dep in op.deps:
        if is_tensor(dep):
            values.extend(ctx.registers(dep, T.register_count(dep.type)))
    passed = pass_through(ctx, lambda letters: ptx_asm.wgmma_wait_group(op.pending, letters), values)
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
