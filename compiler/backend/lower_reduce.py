"""Lowering of `reduce` along one axis, in the three stages of `layout_rules.plan_reduction`
(and of `warp_any`, a vote over the warp, and `barrier_any`, one over a barrier's threads: at
the end).

1. In-thread: the operand registers of `register_groups[k]` fold into result register k as
   a balanced pairwise tree (`fold_tree`), so a row of n registers costs ceil(log2 n)
   dependent combines instead of n - 1 (5 instead of 31 for a 64 x 128 wgmma accumulator
   reduced along its rows). The tree is fixed by the register order, so results are
   deterministic; a float sum is associated differently from a left-to-right fold.
2. Lanes: for each lane step (m, x) of `lane_steps`, result register k of every lane
   combines with result register k ^ x of lane ^ m (shfl.sync.bfly of register k ^ x: each
   lane sends what its partner needs). The combine functions are commutative, so both
   partners end bitwise equal.
3. Warps (only when `warp_steps` is not empty): each thread writes its results to the
   scratch at `scratch_offset`, laid out [warp][result register][lane]; bar.sync; then
   every thread reads the values of the warps of its group (its warp XOR every element of
   span(warp_masks)) and folds them in ascending warp order, starting from the lowest, so
   all warps of a group produce bitwise identical results. For argmax/argmin the indices
   follow the values in a second array after them. The barrier that protects the scratch
   before its next write is placed by insert_barriers (it sees the scratch as read-pending).
   When a warp step also moves lanes or registers (`not plan.warps_only`), each step is a
   butterfly through the scratch instead: write, bar.sync, combine with the partner's slot
   (warp ^ mask, lane ^ lane xor, register ^ register xor), and a bar.sync before the next
   step's write.

Accumulators: fp16/bf16 accumulate in fp32, integers narrower than 32 bits in i32 (the
sizes `passes.shared_accesses.scratch_bytes_of` reserves); the result is cast to the result
element type at the end. argmax/argmin keep (value, index) pairs; ties go to the smaller
index, so the combine is commutative; the index is the coordinate along `axis`.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import BarrierAny, Reduce, WarpAny
from ...layouts.rules import ReductionPlan
from ..types import ScalarType, TensorType, fp32, i32, u32
from . import llvm_types as T
from .context import Lowering, lowers
from .indexing import coordinate
from .lower_cast import convert
from .lower_shared import barrier
from .warp_ops import shuffle_xor


def accumulator_type(element: ScalarType) -> ScalarType:
    if element.is_float:
        return fp32 if element.bits < 32 else element
    if element.bits < 32:
        return i32 if element.is_signed else u32
    return element


def fold_tree(values: list, combine):
    """combine over `values` as a balanced binary tree: depth ceil(log2 n) for n values.

    The left half (the first n // 2 values) and the right half fold separately, then
    combine (left, right), so operands keep their order: for argmax/argmin the combine
    breaks ties by index and any tree gives the same winner.
    """
    if len(values) == 1:
        return values[0]
    half = len(values) // 2
    return combine(fold_tree(values[:half], combine), fold_tree(values[half:], combine))


class _Combiner:
    """combine(a, b) for one reduction kind; values are (value,) or (value, index)."""

    def __init__(self, ctx: Lowering, kind: str, element: ScalarType):
        self.ctx, self.kind, self.element = ctx, kind, element
        self.with_index = kind in ("argmax", "argmin")

    def _minmax(self, name: str, x, y):
        suffix = f"f{self.element.bits}" if self.element.is_float else f"i{self.element.bits}"
        if not self.element.is_float:
            name = ("s" if self.element.is_signed else "u") + name
        else:
            name = name + "num"
        return self.ctx.intrinsic(f"llvm.{name}.{suffix}", x.type, [x, y])

    def _better(self, x, y):
        """i1: x beats y strictly (greater for argmax, smaller for argmin)."""
        b = self.ctx.builder
        symbol = ">" if self.kind == "argmax" else "<"
        if self.element.is_float:
            return b.fcmp_ordered(symbol, x, y)
        if self.element.is_signed:
            return b.icmp_signed(symbol, x, y)
        return b.icmp_unsigned(symbol, x, y)

    def __call__(self, a: tuple, c: tuple) -> tuple:
        b = self.ctx.builder
        x, y = a[0], c[0]
        if self.kind == "sum":
            return (b.fadd(x, y, flags=("contract",)) if self.element.is_float else b.add(x, y),)
        if self.kind in ("max", "min"):
            return (self._minmax(self.kind, x, y),)
        equal = b.fcmp_ordered("==", x, y) if self.element.is_float else b.icmp_unsigned("==", x, y)
        take_first = b.or_(self._better(x, y), b.and_(equal, b.icmp_signed("<", a[1], c[1])))
        return (b.select(take_first, x, y), b.select(take_first, a[1], c[1]))


def _scratch(ctx: Lowering, plan: ReductionPlan, op: Reduce, accumulators: list, combine):
    """The scratch arrays (values, then indices for argmax/argmin) and slot(warp, lane,
    result register), the index in the [warp][result register][lane] layout."""
    b = ctx.builder
    if op.scratch_offset is None:
        raise CompilationError("a reduction across warps has no scratch offset", op.loc,
                               suggestion="run allocate_shared_memory before the backend")
    results = len(plan.register_groups)
    value_bytes = max(T.memory_bytes(combine.element), 4)
    arrays = [ctx.shared_pointer(op.scratch_offset)]
    if len(accumulators[0]) == 2:
        arrays.append(ctx.shared_pointer(op.scratch_offset + ctx.num_warps * 32 * results * value_bytes))

    def slot(warp_index, lane_index, result):
        row = b.add(b.mul(warp_index, ir.Constant(T.I32, results)), ir.Constant(T.I32, result))
        return b.add(b.mul(row, ir.Constant(T.I32, 32)), lane_index)

    return arrays, slot


def _write_scratch(ctx: Lowering, arrays, slot, accumulators: list) -> None:
    b = ctx.builder
    lane, warp = ctx.hardware_index("lane"), ctx.hardware_index("warp")
    for k, accumulator in enumerate(accumulators):
        index = slot(warp, lane, k)
        for array, value in zip(arrays, accumulator):
            b.store(value, b.gep(array, [index], source_etype=value.type))
    barrier(ctx)


def _read_scratch(ctx: Lowering, arrays, index, like: tuple) -> tuple:
    b = ctx.builder
    return tuple(b.load(b.gep(array, [index], source_etype=v.type), typ=v.type) for array, v in zip(arrays, like))


def _shared_butterflies(ctx: Lowering, plan: ReductionPlan, op: Reduce, accumulators: list, combine) -> list:
    """Warp steps that also move lanes or registers: one butterfly through scratch each."""
    b = ctx.builder
    arrays, slot = _scratch(ctx, plan, op, accumulators, combine)
    lane, warp = ctx.hardware_index("lane"), ctx.hardware_index("warp")
    for step, (warp_mask, lane_xor, register_xor) in enumerate(plan.warp_steps):
        if step:
            barrier(ctx)  # this step overwrites the slots the last one read
        _write_scratch(ctx, arrays, slot, accumulators)
        partner_warp = b.xor(warp, ir.Constant(T.I32, warp_mask))
        partner_lane = b.xor(lane, ir.Constant(T.I32, lane_xor)) if lane_xor else lane
        accumulators = [combine(acc, _read_scratch(ctx, arrays, slot(partner_warp, partner_lane, k ^ register_xor), acc))
                        for k, acc in enumerate(accumulators)]
    return accumulators


def _shared_stage(ctx: Lowering, plan: ReductionPlan, op: Reduce, accumulators: list, combine) -> list:
    """Combine across warps through scratch (see the module docstring for the layout)."""
    b = ctx.builder
    arrays, slot = _scratch(ctx, plan, op, accumulators, combine)
    lane = ctx.hardware_index("lane")
    _write_scratch(ctx, arrays, slot, accumulators)

    rows = _reduced_echelon(plan.warp_masks)
    first = _group_leader(ctx, rows)
    partners = []
    for combo in range(1 << len(rows)):
        offset = 0
        for bit, row in enumerate(rows):
            if combo >> bit & 1:
                offset ^= row
        partners.append(first if not offset else b.xor(first, ir.Constant(T.I32, offset)))
    combined = []
    for k, accumulator in enumerate(accumulators):
        total = None
        for partner in partners:
            value = _read_scratch(ctx, arrays, slot(partner, lane, k), accumulator)
            total = value if total is None else combine(total, value)
        combined.append(total)
    return combined


def _reduced_echelon(masks) -> list[int]:
    """A reduced row-echelon basis of span(masks), sorted by leading bit.

    No row has a bit at another row's leading bit, so enumerating the combinations in
    binary order (lowest row = lowest bit of the counter) visits a group's warps in
    ascending order when started from the group's lowest warp.
    """
    rows: dict[int, int] = {}
    for mask in masks:
        for lead, row in rows.items():
            if mask >> lead & 1:
                mask ^= row
        if mask:
            lead = mask.bit_length() - 1
            for other, row in list(rows.items()):
                if row >> lead & 1:
                    rows[other] = row ^ mask
            rows[lead] = mask
    return [rows[lead] for lead in sorted(rows)]


def _group_leader(ctx: Lowering, rows) -> ir.Value:
    """The lowest warp of this warp's group: clear each row's leading bit with that row."""

    def make(builder: ir.IRBuilder) -> ir.Value:
        leader = ctx.hardware_index("warp")
        for row in rows:
            top = row.bit_length() - 1
            bit = builder.and_(builder.lshr(leader, ir.Constant(T.I32, top)), ir.Constant(T.I32, 1))
            leader = builder.xor(leader, builder.mul(bit, ir.Constant(T.I32, row)))
        return leader

    return ctx.cached(("warp_group_leader", tuple(rows)), make)


@lowers(Reduce)
def lower_reduce(ctx: Lowering, op: Reduce) -> None:
    layout = op.operand.type.layout
    plan = op.recorded_plan()
    source_element = T.element_of(op.operand.type)
    if op.kind not in ("sum", "max", "min", "argmax", "argmin"):
        raise CompilationError(f"unknown reduction `{op.kind}`", op.loc)
    unsupported = not isinstance(source_element, ScalarType) or T.is_fp8(source_element)
    if unsupported or (source_element.is_bool and op.kind == "sum"):
        raise CompilationError(f"cannot reduce {source_element} with `{op.kind}`", op.loc,
                               suggestion="cast the operand to fp32 or i32 first")
    element = accumulator_type(source_element)
    combine = _Combiner(ctx, op.kind, element)
    registers = ctx.registers(op.operand)
    axis_name = f"dim{op.axis}"
    values = []
    for register, value in enumerate(registers):
        value = convert(ctx, value, source_element, element)
        if combine.with_index:
            values.append((value, coordinate(ctx, layout, axis_name, register)))
        else:
            values.append((value,))

    accumulators = []
    for group in plan.register_groups:
        accumulators.append(fold_tree([values[register] for register in group], combine))
    for mask, register_xor in plan.lane_steps:
        accumulators = [combine(acc, tuple(shuffle_xor(ctx, v, mask) for v in accumulators[k ^ register_xor]))
                        for k, acc in enumerate(accumulators)]
    if plan.warp_steps and not plan.warps_only:
        accumulators = _shared_butterflies(ctx, plan, op, accumulators, combine)
    elif plan.warp_steps:
        accumulators = _shared_stage(ctx, plan, op, accumulators, combine)

    target = T.element_of(op.result.type)
    if combine.with_index:
        final = [convert(ctx, acc[1], i32, target) for acc in accumulators]
    else:
        final = [convert(ctx, acc[0], element, target) for acc in accumulators]
    if isinstance(op.result.type, TensorType):
        ctx.define(op.result, tuple(final))
    else:
        ctx.define(op.result, final[0])


def _thread_any(ctx: Lowering, value) -> ir.Value:
    """Whether any register the thread holds of a boolean tensor (or its scalar) is true."""
    registers = value if isinstance(value, tuple) else (value,)
    mine = registers[0]
    for register in registers[1:]:
        mine = ctx.builder.or_(mine, register)
    return mine


@lowers(WarpAny)
def lower_warp_any(ctx: Lowering, op: WarpAny) -> None:
    """The thread's registers OR-ed, then vote.sync.any over the whole warp (PTX ISA,
    vote.sync: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-vote-sync);
    every register of the result holds the warp's answer."""
    registers = ctx.get(op.operand)
    answer = ctx.intrinsic("llvm.nvvm.vote.any.sync", T.I1, [ir.Constant(T.I32, -1), _thread_any(ctx, registers)])
    ctx.define(op.result, (answer,) * len(registers))


@lowers(BarrierAny)
def lower_barrier_any(ctx: Lowering, op: BarrierAny) -> None:
    """The thread's registers of the mask OR-ed, then the barrier ORs them over its threads."""
    ctx.define(op.result, ctx.barrier(any_of=_thread_any(ctx, ctx.get(op.operand))))
