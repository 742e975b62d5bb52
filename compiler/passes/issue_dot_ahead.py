"""issue_dot_ahead: a pipelined loop of two dots issues its first dot one iteration ahead,
so the tensor cores compute the next block's S = Q K^T while this block's softmax runs
(FA3's overlap of softmax and wgmma within one warpgroup).

pipeline_dot_loops leaves attention's body (pipeline_chained_dots) as

    async_copy_wait_group S-2                 (iteration i's K and V landed)
    s = warpgroup_mma q, k[slot]
    s, acc = warpgroup_mma_wait 0 s, acc      (retires P V of i - 1 too)
    ... softmax(s), acc * alpha ...           (the tensor cores idle)
    acc' = warpgroup_mma p, v[slot], acc      (yielded in flight)
    refill slot (i - 1) % S, commit

and this pass makes it

    (before the loop)
    async_copy_wait_group S-2                 (iteration 0's copies landed)
    s_0 = warpgroup_mma q, k[0]               (in flight into the loop)
    for i ... (s_i carried in flight):
        async_copy_wait_group S-3             (iteration i + 1's copies landed too)
        s_next = warpgroup_mma q, k[(slot + 1) % S]
        s_i, acc = warpgroup_mma_wait 1 s_i, acc   (all but s_next: S_i and P V of i - 1)
        ... softmax(s_i), acc * alpha ...     (while s_next runs)
        acc' = warpgroup_mma p, v[slot], acc
        refill slot (i - 1) % S, commit
        yield ..., s_next
    warpgroup_mma_wait 0 s                    (the last s_next, issued for no iteration)

Groups retire in issue order, so wait(1) leaves exactly the S issued in this iteration in
flight. The refill of slot (i - 1) % S still follows the wait that retired its last
readers (S_{i-1} and P V of i - 1); s_next reads slot (i + 1) % S and P V of i reads
i % S, both other slots when S >= 3. The last iteration's (and an empty loop's
prologue's) S reads a slot no copy filled for it: its result is never read, and the wait
after the loop retires it before anything after the loop reuses shared memory. The rewrite runs
only under the launch option `dot_ahead=True`: the S carried in flight must move from
s_next's registers to s_i's at the back edge, a read of an in-flight accumulator that
makes ptxas serialize every wgmma of the kernel (its C7515 advisory), and two S tiles must
fit the registers (`fits_registers`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import (AsyncCopyWaitGroup, Binary, Block, Constant, FenceAsyncShared, For, Kernel, Op, SharedIndex, Value,
                  WarpgroupMma, WarpgroupMmaWait)
from ..types import TensorType, i32
from .pipeline_dot_loops import Definitions, _slice, clone

NAME = "issue_dot_ahead"

# fp32 accumulator registers a thread may hold for two S tiles and the output tile: ptxas
# assembles benchmarks/highlevel_attention.py's configs without spills with the rewrite,
# the largest at this (128 x 64 tiles at 4 warps with head_dim 64, 128 x 128 at 8 warps
# with head_dim 128); past it the tiles alone leave too few of a thread's 255 registers.
ACCUMULATOR_REGISTER_BUDGET = 192


@dataclasses.dataclass(frozen=True)
class AheadPlan:
    """What the rewrite of one loop needs: the first dot `first` (reading ring view
    `view` of `ring` at the body's slot argument `slot`), its wait `wait`, the waits
    between it and the next dot (`later_waits`), the ring's wait_group `copies_wait`,
    and the body ops computing the dot's other operands (`operand_ops`)."""

    first: WarpgroupMma
    wait: WarpgroupMmaWait
    later_waits: tuple[WarpgroupMmaWait, ...]
    copies_wait: AsyncCopyWaitGroup
    view: SharedIndex
    stages: int
    operand_ops: tuple[Op, ...]


def plan_ahead(loop: For, outer: dict) -> Optional[AheadPlan]:
    """The AheadPlan of a loop pipeline_dot_loops left with two dots, the last in flight
    across the back edge over rings of 3 or more stages, or None."""
    body = loop.body
    ops = body.ops
    nested = [inner for op in ops for region in op.nested_blocks() for inner in region.walk()]
    if any(isinstance(op, (WarpgroupMma, WarpgroupMmaWait, AsyncCopyWaitGroup)) for op in nested):
        return None  # a dot or a wait inside a region: not counted here
    dots = [index for index, op in enumerate(ops) if isinstance(op, WarpgroupMma)]
    copies_waits = [op for op in ops if isinstance(op, AsyncCopyWaitGroup)]
    if len(dots) != 2 or len(copies_waits) != 1 or ops.index(copies_waits[0]) > dots[0]:
        return None
    first, second = ops[dots[0]], ops[dots[1]]
    wait = ops[dots[0] + 1]
    if not (first.is_async and second.is_async and isinstance(wait, WarpgroupMmaWait) and wait.pending == 0
            and wait.deps == (first.result,)):
        return None
    if any(first.result in op.uses() for op in ops if op is not wait):
        return None
    if any(isinstance(op, WarpgroupMmaWait) for op in ops[dots[1]:]):
        return None  # the last dot waited in the body: not the chained schedule
    later_waits = tuple(op for op in ops[dots[0] + 2:dots[1]] if isinstance(op, WarpgroupMmaWait))
    defs = Definitions(body, outer)
    view = defs.get(first.b)
    if not (isinstance(view, SharedIndex) and view.index in body.args[1:] and view.buffer not in body.args):
        return None
    stages = view.buffer.type.shape[0]
    if stages < 3 or copies_waits[0].pending != stages - 2:
        return None
    operand_ops = []
    for operand in (first.a, first.acc, first.use_acc):
        if operand is None:
            continue
        found = _slice(operand, defs, ())
        if found is None:
            return None  # computed from carried values: not known an iteration ahead
        operand_ops.extend(op for op in found if op not in operand_ops)
    return AheadPlan(first, wait, later_waits, copies_waits[0], view, stages, tuple(operand_ops))


def fits_registers(plan: AheadPlan, loop: For, num_warps: int) -> bool:
    """Whether two S tiles and the carried accumulators fit ACCUMULATOR_REGISTER_BUDGET
    fp32 registers a thread."""
    carried = [arg.type for arg in loop.body.args[1:] if isinstance(arg.type, TensorType) and len(arg.type.shape) == 2]
    elements = 2 * _elements(plan.first.result.type) + sum(_elements(type_) for type_ in carried)
    return elements // (32 * num_warps) <= ACCUMULATOR_REGISTER_BUDGET


def _elements(type_: TensorType) -> int:
    count = 1
    for size in type_.shape:
        count *= size
    return count


def _emit(ops: list[Op], op_class, type_, hint: str = "", **fields) -> Value:
    value = Value(type_, hint)
    ops.append(op_class(result=value, loc=fields.pop("loc"), **fields))
    return value


def rewrite(loop: For, plan: AheadPlan) -> list[Op]:
    """The ops in place of `loop`: the prologue's first dot, the loop, and the wait of
    the last S the loop leaves in flight."""
    first, loc = plan.first, plan.first.loc
    prologue: list[Op] = [AsyncCopyWaitGroup(pending=plan.stages - 2, loc=loc)]
    zero = _emit(prologue, Constant, i32, value=0, loc=loc)
    view = _emit(prologue, SharedIndex, plan.view.result.type, plan.view.result.hint, buffer=plan.view.buffer,
                 index=zero, loc=loc)
    prologue.append(FenceAsyncShared(loc=loc))
    mapping: dict[Value, Value] = {}
    prologue.extend(clone(plan.operand_ops, mapping))
    s_first = Value(first.result.type, first.result.hint)
    prologue.append(dataclasses.replace(first, result=s_first, b=view, a=mapping.get(first.a, first.a),
                                        acc=mapping.get(first.acc, first.acc),
                                        use_acc=mapping.get(first.use_acc, first.use_acc)))

    body = loop.body
    s_current = Value(first.result.type, first.result.hint)
    ops: list[Op] = []
    for op in body.ops:
        if op is plan.copies_wait:
            op = dataclasses.replace(op, pending=plan.stages - 3)
        elif op is first:
            one = _emit(ops, Constant, i32, value=1, loc=loc)
            stages = _emit(ops, Constant, i32, value=plan.stages, loc=loc)
            ahead = _emit(ops, Binary, i32, kind="add", lhs=plan.view.index, rhs=one, loc=loc)
            next_slot = _emit(ops, Binary, i32, "slot", kind="mod", lhs=ahead, rhs=stages, loc=loc)
            next_view = _emit(ops, SharedIndex, plan.view.result.type, plan.view.result.hint,
                              buffer=plan.view.buffer, index=next_slot, loc=loc)
            op = dataclasses.replace(op, b=next_view)
        elif op is plan.wait:
            op = dataclasses.replace(op, deps=(s_current,), pending=1)
        elif any(op is wait for wait in plan.later_waits):
            op = dataclasses.replace(op, pending=1)
        elif op is body.ops[-1]:
            op = dataclasses.replace(op, values=op.values + (first.result,))
        ops.append(op)
    s_last = Value(first.result.type, first.result.hint)
    new_loop = dataclasses.replace(loop, inits=loop.inits + (s_first,), results=loop.results + (s_last,),
                                   body=Block(body.args + (s_current,), tuple(ops)))
    retired = Value(first.result.type, first.result.hint)
    return prologue + [new_loop, WarpgroupMmaWait(results=(retired,), deps=(s_last,), pending=0, loc=loc)]


def issue_dot_ahead(kernel: Kernel) -> Kernel:
    """Every loop of plan_ahead's form rewritten (see the module docstring) where the
    launch option `dot_ahead=True` asks for it and registers allow."""
    if not kernel.dot_ahead:
        return kernel
    outer: dict = {}
    for op in kernel.walk():
        for value in op.defines():
            outer[value] = op
    changed = []

    def block(region: Block) -> Block:
        ops: list[Op] = []
        for op in region.ops:
            op = op.map_regions(block)
            plan = plan_ahead(op, outer) if isinstance(op, For) else None
            if plan is not None and fits_registers(plan, op, kernel.num_warps):
                ops.extend(rewrite(op, plan))
                changed.append(op)
                continue
            ops.append(op)
        return Block(region.args, tuple(ops))

    body = block(kernel.body)
    return kernel.with_body(body) if changed else kernel
