"""Emulation rules for `reduce`, executed by its ReductionPlan in the GPU's order, and `warp_any`.

The same stages, accumulator types and scratch layout as the backend (backend/lower_reduce):

1. In-thread: result register k folds operand registers `register_groups[k]` in order.
2. Lanes: for each lane step (mask, register xor) in turn, result register k combines
   with result register k ^ (register xor) of lane ^ mask (butterfly).
3. Warps (when `warp_steps`): every thread writes its partials to the scratch at
   `scratch_offset`, laid out [warp][result register][lane] (argmax/argmin indices follow in
   a second i32 array); the CTA synchronises; each warp folds the partials of its group's
   warps in ascending warp order, read back from shared memory. When a warp step also moves
   lanes or registers (`not plan.warps_only`), each step is instead a butterfly through the
   scratch: write, synchronise, combine with the partner's slot, synchronise.

Accumulators: fp16/bf16 in fp32, integers narrower than 32 bits in i32/u32, cast to the
result element type at the end. argmax/argmin carry (value, index) pairs and keep the first
when it is strictly better or equal with a smaller index (so a NaN loses, as in the
backend's ordered compares).
"""

from __future__ import annotations

import numpy as np

from ...compiler import ir
from ...compiler.types import ScalarType, TensorType, element_of
from .dtypes import cast, element_bytes, finish, is_float
from .errors import EmulationError
from .registers import LANES, axis_coordinate, num_registers
from .rules import EMULATION_RULES as RULES

_I32 = ScalarType("i32")


def accumulator_type(element):
    """The type a reduction combines in (as backend/lower_reduce.accumulator_type)."""
    if element.is_float:
        return ScalarType("fp32") if element.bits < 32 else element
    if element.bits < 32:
        return ScalarType("i32" if element.is_signed else "u32")
    return element


def _combiner(kind: str, element):
    if kind == "sum":
        return lambda a, b: (finish(element, np.add(a[0], b[0])), None)
    if kind in ("max", "min"):
        if is_float(element):
            pick = np.fmax if kind == "max" else np.fmin
        else:
            pick = np.maximum if kind == "max" else np.minimum
        return lambda a, b: (pick(a[0], b[0]), None)
    better = np.greater if kind == "argmax" else np.less

    def combine(a, b):
        take_first = better(a[0], b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))
        return np.where(take_first, a[0], b[0]), np.where(take_first, a[1], b[1])
    return combine


def _take(pair, index):
    return pair[0][..., index], (None if pair[1] is None else pair[1][..., index])


def _warp_members(warp_masks, num_warps: int) -> np.ndarray:
    """(warps, group size): for each warp, the warps sharing its result elements, ascending."""
    span = [0]
    for mask in warp_masks:
        span += [s ^ mask for s in span]
    return np.sort(np.arange(num_warps)[:, None] ^ np.array(span)[None, :], axis=1)


def _across_warps(cta, op, acc, element, plan):
    """Stage 3: partials through the scratch, folded in warp-index order."""
    members = cta.memo(op, "members", lambda: _warp_members(plan.warp_masks, cta.num_warps))
    values, index = acc
    if op.scratch_offset is not None:
        values, index = _through_scratch(cta, op, values, index, element, members)
    else:
        values = values[members]          # (warp, member, lane, register)
        index = None if index is None else index[members]
    combine = _combiner(op.kind, element)
    out = (values[:, 0], None if index is None else index[:, 0])
    for j in range(1, members.shape[1]):
        out = combine(out, (values[:, j], None if index is None else index[:, j]))
    return out


def _slots(num_warps: int, lanes: int, results: int) -> np.ndarray:
    """(warp, lane, result register) -> slot in the [warp][result register][lane] scratch."""
    return ((np.arange(num_warps)[:, None, None] * results + np.arange(results)[None, None, :]) * lanes
            + np.arange(lanes)[None, :, None])


def _butterflies_through_scratch(cta, op, acc, element, plan):
    """Stage 3 for warp steps that also move lanes or registers: one butterfly per step."""
    values, index = acc
    num_warps, lanes, results = values.shape
    slots = _slots(num_warps, lanes, results)
    combine = _combiner(op.kind, element)
    for step, (warp_mask, lane_xor, register_xor) in enumerate(plan.warp_steps):
        move = np.ix_(np.arange(num_warps) ^ warp_mask, np.arange(lanes) ^ lane_xor,
                      np.arange(results) ^ register_xor)
        if op.scratch_offset is None:  # not allocated yet: exchange without the scratch
            other = (values[move], None if index is None else index[move])
        else:
            if step:
                cta.shared.barrier()  # this step overwrites the slots the last one read
            other = _exchange(cta, op, values, index, element, slots, slots[move])
        values, index = combine((values, index), other)
    return values, index


def _exchange(cta, op, values, index, element, slots, gathered):
    """Write every thread's partials to its slots, synchronise, read the `gathered` slots."""
    size = element_bytes(element)  # accumulators are at least 32 bits wide
    base = cta.shared_base + op.scratch_offset  # in the CTA's window of a cluster's shared memory
    index_base = base + values.size * size
    describe = cta.describe(op.result.type)
    cta.shared.write(base + slots * size, values, element, op, describe)
    if index is not None:
        cta.shared.write(index_base + slots * 4, index, _I32, op, describe)
    cta.shared.barrier()
    values = cta.shared.read(base + gathered * size, element, op, describe)
    if index is not None:
        index = cta.shared.read(index_base + gathered * 4, _I32, op, describe)
    return values, index


def _through_scratch(cta, op, values, index, element, members):
    slots = _slots(*values.shape)
    gathered = slots[members]  # (warp, member, lane, register): leading axis = reader
    return _exchange(cta, op, values, index, element, slots, gathered)


@RULES.register(ir.Reduce)
def reduce(cta, op: ir.Reduce) -> None:
    source_type, result_type = op.operand.type, op.result.type
    layout = cta.layout(source_type)
    plan = op.recorded_plan()
    scalar_result = not isinstance(result_type, TensorType)
    if not scalar_result and num_registers(cta.layout(result_type)) != len(plan.register_groups):
        raise EmulationError(
            f"reduce result layout has {num_registers(result_type.layout)} registers; the "
            f"reduction plan gives {len(plan.register_groups)}", op.loc)
    x = cta[op.operand]
    if op.kind not in ("sum", "max", "min", "argmax", "argmin"):
        raise EmulationError(f"unknown reduction kind {op.kind!r}", op.loc)
    source = element_of(source_type)
    element = accumulator_type(source)
    pair = (cast(x, source, element), None)
    if op.kind in ("argmax", "argmin"):
        pair = (pair[0], cta.memo(op, "positions", lambda: axis_coordinate(
            layout, cta.num_warps, op.axis).astype(np.int32)))
    combine = _combiner(op.kind, element)
    groups = cta.memo(op, "groups", lambda: np.array(plan.register_groups, dtype=np.int64))
    acc = _take(pair, groups[:, 0])
    for j in range(1, groups.shape[1]):
        acc = combine(acc, _take(pair, groups[:, j]))
    lanes, results = np.arange(LANES), np.arange(len(plan.register_groups))
    for mask, register_xor in plan.lane_steps:
        move = np.ix_(lanes ^ mask, results ^ register_xor)
        partner = (acc[0][:, move[0], move[1]], None if acc[1] is None else acc[1][:, move[0], move[1]])
        acc = combine(acc, partner)
    if plan.warp_steps and not plan.warps_only:
        acc = _butterflies_through_scratch(cta, op, acc, element, plan)
    elif plan.warp_steps:
        acc = _across_warps(cta, op, acc, element, plan)
    if op.kind in ("argmax", "argmin"):
        value = cast(acc[1], _I32, element_of(result_type))
    else:
        value = cast(acc[0], element, element_of(result_type))
    # Reducing a 1-D tensor gives a scalar: after the plan every thread holds it.
    cta.bind(op.result, value[0, 0, 0] if scalar_result else value)


@RULES.register(ir.WarpAny)
def warp_any(cta, op: ir.WarpAny) -> None:
    """Every element a warp holds: whether any element that warp holds of the operand is true."""
    x = np.asarray(cta[op.operand], dtype=bool)
    cta.bind(op.result, np.broadcast_to(x.any(axis=(1, 2), keepdims=True), x.shape).copy())
