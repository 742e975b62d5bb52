"""issue_dot_ahead: a pipelined loop of two chained dots issues block j's first dot and
block j - 1's second together, so the softmax of block j runs while the tensor cores
compute P V of block j - 1 (FA3's overlap of softmax and wgmma within one warpgroup).

pipeline_dot_loops leaves attention's body (pipeline_chained_dots) as

    async_copy_wait_group S-2                   (iteration j's K and V landed)
    s = warpgroup_mma q, k[slot]
    s, acc = warpgroup_mma_wait 0 s, acc        (retires P V of j - 1 too)
    ... softmax(s) -> p, alpha ...              (the tensor cores idle)
    acc' = warpgroup_mma fp16(p), v[slot], acc * alpha   (yielded in flight)
    refill slot (j - 1) % S, commit

The P V dot's operands (fp16(p) and acc * alpha: the ops only they need, `Split.operand_ops`)
are computed right after that dot's wait and carried to the next iteration, which issues
the dot beside its own Q K^T:

    if lower < upper: block 0 (its S waited at once), then its P V operands
    for j in lower + step ..:                   (carried: P and acc * alpha of block j - 1)
        async_copy_wait_group S-2
        s = warpgroup_mma q, k[slot]            (block j)
        acc = warpgroup_mma p_prev, v[(slot + S - 1) % S], acc_prev   (block j - 1)
        s = warpgroup_mma_wait 1 s              (S of j; P V of j - 1 runs on)
        ... softmax(s) -> p, alpha ...          (while P V of j - 1 runs)
        acc, p_prev = warpgroup_mma_wait 0 acc, p_prev
        p_next, acc_next = fp16(p), acc * alpha
        refill slot (j - 1) % S, commit         (P V of j - 1, its last reader, retired)
    if lower < upper: P V of the last block, waited

The same rewrite takes TMA rings (pipeline_tma_loops: the descriptor source), in one
partition or in a warp-specialized consumer partition (pipeline_tma_warp_specialize).
There the body starts with the wait on the slot's full barrier (block j's K and V
landed) and ends with the release of the slot block j - 1 read: every warp's arrival on
its empty barrier, then, in one partition, the elected thread's wait for the arrivals
and the refill by TMA (the producer partition refills a split's ring). P V of j - 1
reads V from that slot, so its wait goes right before the release, as before the
cp.async refill: no TMA write lands on V while the dot reads it. Block 0's peeled part
releases nothing (the arrival is predicated off at the loop's lower bound) and, in one
partition, fills the ring's last slot as iteration 0 did; the full barrier of block j is
waited before the pair's issue. ping-pong (pingpong_warpgroups) then makes the pair one
turn.

This is the order of the lowlevel kernel's steps (kernels/attention/steps.py): between a
wgmma's issue and its wait no other instruction writes registers a wgmma reads (the
rescale and P's conversion come after the wait; P passes through the wait, so the next
softmax cannot reuse its registers), and nothing is in flight across the back edge, so
ptxas keeps the wgmmas asynchronous. The copies keep pipeline_dot_loops' counts: S - 1
groups before the loop, one an iteration (block 0's in the peeled part). P V of j - 1
reads V's slot (j - 1) % S, which the refill of the same iteration overwrites only after
that dot's wait. A TMA ring of 2 slots works the same way (each slot goes back once its
last reader retired, whoever refills it), though no copy then runs while both slots are
held: on an H200 the split's 128 x 128 tiles at head_dim 128 ran 0.81x the same split
without dot_ahead (0.88x causal), whose consumers release each slot before the softmax. Applied to loops whose tiles fit the registers (`fits_registers`) when
the launch option `dot_ahead=True` (`Kernel.dot_ahead`) asks for it, and off otherwise.
ptxas places a wgmma wait by its own heuristics, as early as the registers allow: left
alone it puts P V's wait right after S's, above the softmax, and nothing overlaps. An
anchor instruction right before the wait (WarpgroupMmaWait.anchor: a volatile shared load
unless the option names another) keeps it below the exponentials.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..errors import warn_at
from ..ir import (AsyncCopyWaitGroup, Binary, Block, Compare, Constant, ConvertLayout, For, If, Kernel,
                  MBarrierArrive, MBarrierExpect, MBarrierWait, Op, SharedIndex, TmaAsyncCopyGlobalToShared, Value,
                  WarpgroupMma, WarpgroupMmaWait, WarpSpecialize, Yield)
from ..types import TensorType, i1, i32

NAME = "issue_dot_ahead"

# Registers a thread may give S, the accumulator and the carried P (two fp16 a register):
# while P V of block j - 1 runs, S and P of block j live beside the accumulator and P of
# block j - 1. ptxas assembles benchmarks/highlevel_attention.py's configs at or below this
# without spills (128 x 128 tiles at 8 warps, head_dim 64: 64 + 32 + 32) and spills the
# causal kernel above it (128 x 64 at 4 warps, head_dim 64, or 128 x 128 at 8, head_dim
# 128: 64 + 64 + 32).
REGISTER_BUDGET = 128
# The same in the consumer partition of a split, whose warps setmaxnreg raises to 232
# registers (pipeline_tma_warp_specialize.consumer_registers) and which computes no copy
# coordinates: ptxas assembles 128 x 128 tiles at head_dim 128 there (64 + 64 + 32)
# without spills, and the causal kernel (two such loops) with a few spilled words.
SPLIT_REGISTER_BUDGET = 160

# The instruction before P V's wait in the loop (WarpgroupMmaWait.anchor): without one,
# ptxas hoists the wait above the softmax's exponentials, to right after S's wait.
DEFAULT_ANCHOR = "volatile"


@dataclasses.dataclass(frozen=True)
class Split:
    """A loop body's parts: `second`, the P V dot (issued one iteration late);
    `operand_ops`, the ops only its `a` and `acc` operands need (computed after its wait,
    for the next iteration), among them `acc_wait` (pipeline_chained_dots' wait of the
    carried accumulator and the conversions around it: dropped, the accumulator arrives
    waited); `out_ops`, the ops after the dot up to the accumulator the body yields at
    `acc_index`; `first` and `first_wait`, the Q K^T dot and its wait(0); `view`, the V
    ring view the dot reads at the body's `slot` argument over `stages` slots; `anchor`,
    the instruction before P V's wait in the loop (WarpgroupMmaWait.anchor)."""

    second: WarpgroupMma
    operand_ops: tuple[Op, ...]
    acc_wait: tuple[ConvertLayout, WarpgroupMmaWait, ConvertLayout]
    out_ops: tuple[Op, ...]
    acc_index: int
    first: WarpgroupMma
    first_wait: WarpgroupMmaWait
    view: SharedIndex
    stages: int
    anchor: str = DEFAULT_ANCHOR


def _readers(ops) -> dict:
    """Value -> the ops of `ops` reading it (an op with regions reads what they read)."""
    found: dict = {}
    for op in ops:
        for inner in [op] + [x for block in op.nested_blocks() for x in block.walk()]:
            for value in inner.uses():
                found.setdefault(value, []).append(op)
    return found


def _producers(ops) -> dict:
    return {value: op for op in ops for value in op.defines()}


def plan_split(loop: For) -> Optional[Split]:
    """The Split of a loop pipeline_dot_loops left with two async dots over its rings (3 or
    more slots of cp.async copies, any TMA ring), the second accumulating into a carried value read only after the first's
    wait, its result yielded in flight; or None."""
    body = loop.body
    ops, yield_ = body.ops, body.ops[-1]
    nested = [inner for op in ops for region in op.nested_blocks() for inner in region.walk()]
    if any(isinstance(op, (WarpgroupMma, WarpgroupMmaWait, AsyncCopyWaitGroup)) for op in nested):
        return None
    dots = [op for op in ops if isinstance(op, WarpgroupMma)]
    if len(dots) != 2 or not all(dot.is_async for dot in dots):
        return None
    first, second = dots
    first_wait = ops[ops.index(first) + 1]
    if not (isinstance(first_wait, WarpgroupMmaWait) and first_wait.deps == (first.result,)
            and first_wait.pending == 0):
        return None
    readers, producers = _readers(ops), _producers(ops)
    position = {id(op): index for index, op in enumerate(ops)}
    out_ops, value = [], second.result
    while len(readers.get(value, [])) == 1 and isinstance(readers[value][0], ConvertLayout):
        out_ops.append(readers[value][0])
        value = readers[value][0].result
    if readers.get(value) != [yield_] or list(yield_.values).count(value) != 1:
        return None
    acc_index = yield_.values.index(value)
    acc_arg = body.args[1 + acc_index]
    if [reader for reader in readers.get(acc_arg, [])] and any(position[id(r)] > position[id(second)]
                                                               for r in readers[acc_arg]):
        return None
    view = producers.get(second.b)
    if not (isinstance(view, SharedIndex) and view.index in body.args[1:] and readers[view.result] == [second]):
        return None
    # The ops only the dot's a and acc need: from them back, each op all of whose readers are
    # such ops or the dot.
    needed: dict[int, Op] = {}
    pending = [v for v in (second.a, second.acc) if v in producers]
    while pending:
        op = producers[pending.pop()]
        if id(op) in needed or isinstance(op, (WarpgroupMma, SharedIndex)) or op.nested_blocks():
            continue
        if isinstance(op, WarpgroupMmaWait) and not any(
                isinstance(producers.get(dep), ConvertLayout) and producers[dep].operand is acc_arg for dep in op.deps):
            continue  # Q K^T's wait stays where it is
        users = [reader for v in op.defines() for reader in readers.get(v, [])]
        if not all(user is second or id(user) in needed for user in users):
            continue
        needed[id(op)] = op
        pending.extend(v for v in op.uses() if v in producers)
    operand_ops = tuple(op for op in ops if id(op) in needed)
    if any(v is acc_arg for op in ops if id(op) not in needed and op is not yield_ for v in op.uses()):
        return None  # the accumulator read outside the dot's operands
    waits = [op for op in operand_ops if isinstance(op, WarpgroupMmaWait)]
    if len(waits) != 1 or waits[0].pending != 0 or len(waits[0].deps) != 1:
        return None
    into, back = producers.get(waits[0].deps[0]), readers.get(waits[0].results[0], [])
    if not (isinstance(into, ConvertLayout) and into.operand is acc_arg and len(back) == 1
            and isinstance(back[0], ConvertLayout)):
        return None  # not pipeline_chained_dots' accumulator wait
    stages = view.buffer.type.shape[0]
    if not (stages >= 3 and _copy_ring(ops, stages) or _tma_ring(ops, view, first, second, producers)):
        return None
    return Split(second, operand_ops, (into, waits[0], back[0]), tuple(out_ops), acc_index, first, first_wait,
                 view, stages)


def _copy_ring(ops, stages: int) -> bool:
    """Whether the body waits for its cp.async groups as pipeline_dot_loops rings them."""
    waits = [op for op in ops if isinstance(op, AsyncCopyWaitGroup)]
    return len(waits) == 1 and waits[0].pending == stages - 2


def _tma_ring(ops, view: SharedIndex, first: WarpgroupMma, second: WarpgroupMma, producers: dict) -> bool:
    """Whether the body reads a TMA ring as pipeline_tma_loops (or a warp-specialized
    consumer) leaves it: one wait for the slot's full barrier, at the slot V is read from,
    before the first dot; the slot releases (empty-barrier arrivals), and in one partition
    the refills, only after the second dot, where the rewrite puts P V's wait before them."""
    if any(isinstance(op, AsyncCopyWaitGroup) for op in ops):
        return False
    full = [op for op in ops if isinstance(op, MBarrierWait) and not op.elected]
    if len(full) != 1 or ops.index(full[0]) > ops.index(first):
        return False
    bar = producers.get(full[0].barrier)
    if not (isinstance(bar, SharedIndex) and bar.index is view.index):
        return False
    ring_ops = (MBarrierArrive, MBarrierExpect, TmaAsyncCopyGlobalToShared)
    after = ops.index(second)
    return all(ops.index(op) > after for op in ops
               if isinstance(op, ring_ops) or isinstance(op, MBarrierWait) and op.elected)


def fits_registers(split: Split, num_warps: int, budget: int = REGISTER_BUDGET) -> bool:
    """Whether S, the accumulator and P take at most `budget` registers a thread."""
    return tile_registers(split, num_warps) <= budget


def tile_registers(split: Split, num_warps: int) -> int:
    """The registers a thread gives S, the accumulator and the carried P."""
    threads = 32 * num_warps

    def registers(type_) -> int:
        count = 1
        for size in type_.shape:
            count *= size
        return count * type_.element.bits // 32 // threads

    p = split.second.a.type
    return (registers(split.first.result.type) + registers(split.second.result.type)
            + (registers(p) if isinstance(p, TensorType) else 0))


def clone_op(op: Op, mapping: dict) -> Op:
    """`op` with fresh results (recorded in `mapping`), reading `mapping`'s values in place
    of its keys, its regions cloned alike."""
    changes = {}
    for field in dataclasses.fields(op):
        item = getattr(op, field.name)
        if field.name == "result" and isinstance(item, Value):
            changes["result"] = mapping[item] = Value(item.type, item.hint)
        elif field.name == "results":
            fresh = tuple(Value(value.type, value.hint) for value in item)
            mapping.update(zip(item, fresh))
            changes["results"] = fresh
        elif isinstance(item, Value):
            changes[field.name] = mapping.get(item, item)
        elif isinstance(item, Block):
            changes[field.name] = clone_block(item, mapping)
        elif isinstance(item, tuple) and item and all(isinstance(v, Value) for v in item):
            changes[field.name] = tuple(mapping.get(v, v) for v in item)
    return dataclasses.replace(op, **changes)


def clone_block(block: Block, mapping: dict) -> Block:
    args = tuple(Value(arg.type, arg.hint) for arg in block.args)
    mapping.update(zip(block.args, args))
    return Block(args, tuple(clone_op(op, mapping) for op in block.ops))


class Emitter:
    def __init__(self, loc):
        self.ops: list[Op] = []
        self.loc = loc

    def emit(self, op_class, type_, hint: str = "", **fields) -> Value:
        value = Value(type_, hint)
        self.ops.append(op_class(result=value, loc=self.loc, **fields))
        return value


def issue_second(split: Split, slot: Value, operands: tuple[Value, Value], out: Emitter) -> Value:
    """The P V dot of the block before the one at `slot`, from its carried operands
    (a, acc); returns its result, in flight."""
    stages = split.stages
    back = out.emit(Constant, i32, value=stages - 1)
    count = out.emit(Constant, i32, value=stages)
    previous = out.emit(Binary, i32, "slot", kind="mod", lhs=out.emit(Binary, i32, kind="add", lhs=slot, rhs=back),
                        rhs=count)
    view = out.emit(SharedIndex, split.view.result.type, split.view.result.hint, buffer=split.view.buffer,
                    index=previous)
    result = Value(split.second.result.type, split.second.result.hint)
    out.ops.append(dataclasses.replace(split.second, result=result, a=operands[0], b=view, acc=operands[1]))
    return result


def wait_second(split: Split, in_flight: Value, a: Value, out: Emitter, anchor: str = "") -> Value:
    """The P V dot's result waited (P, from registers, passing through the same wait so
    that its registers are not reused before the dot has read them: merge_wgmma_waits
    makes the two waits one), after the instruction `anchor` names (WarpgroupMmaWait:
    it keeps ptxas from hoisting the wait above the softmax), converted as the body
    converted it; returns the value the body yields as the accumulator."""
    loc = split.second.loc
    waited = Value(in_flight.type, in_flight.hint)
    out.ops.append(WarpgroupMmaWait(results=(waited,), deps=(in_flight,), pending=0, anchor=anchor, loc=loc))
    if isinstance(a.type, TensorType):
        out.ops.append(WarpgroupMmaWait(results=(Value(a.type, a.hint),), deps=(a,), pending=0, loc=loc))
    mapping = {split.second.result: waited}
    for op in split.out_ops:
        out.ops.append(clone_op(op, mapping))
    return mapping.get(split.out_ops[-1].result, waited) if split.out_ops else waited


def next_operands(split: Split, accumulator: Value, mapping: dict, out: Emitter) -> tuple[Value, Value]:
    """The P V dot's operands (a, acc) for the accumulator `accumulator` (waited), from
    the body's values in `mapping`: its operand ops again, the accumulator's wait dropped."""
    into, _, back = split.acc_wait
    mapping[back.result] = accumulator
    for op in split.operand_ops:
        if not any(op is dropped for dropped in split.acc_wait):
            out.ops.append(clone_op(op, mapping))
    return mapping.get(split.second.a, split.second.a), mapping.get(split.second.acc, split.second.acc)


def _zero(value_type, loc) -> Constant:
    zero = 0.0 if value_type.element.name.startswith(("fp", "bf")) else 0
    return Constant(result=Value(value_type), value=zero, loc=loc)


def rewrite(loop: For, split: Split) -> list[Op]:
    """The ops in place of `loop` (see the module docstring). The loop's results keep
    their values (the accumulator's is the last block's P V, waited), so the ops after
    the loop read them as before."""
    body, loc = loop.body, loop.loc
    yield_ = body.ops[-1]
    acc_arg = body.args[1 + split.acc_index]
    late = {id(op) for op in split.operand_ops + split.out_ops} | {id(split.second)}
    early = [op for op in body.ops[:-1] if id(op) not in late]
    operand_types = (split.second.a.type, split.second.acc.type)
    out = Emitter(loc)
    exists = out.emit(Compare, i1, predicate="lt", lhs=loop.lower, rhs=loop.upper)

    # Block 0 where the loop has one: its early part, then its P V operands.
    peeled = {body.args[0]: loop.lower, **dict(zip(body.args[1:], loop.inits))}
    then = Emitter(loc)
    then.ops = [clone_op(op, peeled) for op in early]
    operands = next_operands(split, loop.inits[split.acc_index], peeled, then)
    kept = [peeled.get(v, v) for v in yield_.values]
    kept[split.acc_index] = loop.inits[split.acc_index]
    zeros = [_zero(type_, loc) for type_ in operand_types]
    after_block_0 = tuple(Value(v.type, v.hint) for v in kept) + tuple(Value(t) for t in operand_types)
    out.ops.append(If(results=after_block_0, condition=exists,
                      then_body=Block((), tuple(then.ops) + (Yield(values=tuple(kept) + operands, loc=loc),)),
                      else_body=Block((), tuple(zeros) + (Yield(values=tuple(loop.inits) + tuple(
                          zero.result for zero in zeros), loc=loc),)), loc=loc))

    # Blocks 1 ..: Q K^T of block j and P V of block j - 1 issued together; P V's wait and
    # the next operands right before the first op that followed the dot in the body (the
    # refill of the slot it read).
    carried = tuple(Value(t) for t in operand_types)
    after_second = {id(op) for op in body.ops[body.ops.index(split.second) + 1:]}
    new_body = Emitter(loc)
    mapping: dict = {}
    in_flight = next_carried = None
    for op in early:
        if next_carried is None and id(op) in after_second:
            accumulator = wait_second(split, in_flight, carried[0], new_body, split.anchor)
            next_carried = next_operands(split, accumulator, mapping, new_body)
        new_body.ops.append(dataclasses.replace(op, pending=1) if op is split.first_wait else op)
        if op is split.first:
            in_flight = issue_second(split, split.view.index, carried, new_body)
    if next_carried is None:
        accumulator = wait_second(split, in_flight, carried[0], new_body, split.anchor)
        next_carried = next_operands(split, accumulator, mapping, new_body)
    values = list(yield_.values)
    values[split.acc_index] = acc_arg  # P V's operands carry the accumulator
    new_body.ops.append(Yield(values=tuple(values) + next_carried, loc=yield_.loc))
    results = list(loop.results)
    results[split.acc_index] = Value(acc_arg.type, acc_arg.hint)
    results += [Value(t) for t in operand_types]
    lower = out.emit(Binary, i32, kind="add", lhs=loop.lower, rhs=loop.step)
    out.ops.append(dataclasses.replace(loop, lower=lower, inits=after_block_0, results=tuple(results),
                                       body=Block(body.args + carried, tuple(new_body.ops))))

    # The last block's P V, where there was a block.
    last = Emitter(loc)
    slot = results[body.args.index(split.view.index) - 1]
    in_flight = issue_second(split, slot, tuple(results[-2:]), last)
    accumulator = wait_second(split, in_flight, results[-2], last)
    out.ops.append(If(results=(loop.results[split.acc_index],), condition=exists,
                      then_body=Block((), tuple(last.ops) + (Yield(values=(accumulator,), loc=loc),)),
                      else_body=Block((), (Yield(values=(loop.inits[split.acc_index],), loc=loc),)), loc=loc))
    return out.ops


def issue_dot_ahead(kernel: Kernel) -> Kernel:
    """With the launch option `dot_ahead=True` (or an anchor's name: "none" for none), every
    loop plan_split matches whose tiles fit the registers rewritten (see the module
    docstring)."""
    if kernel.dot_ahead in (None, False):
        return kernel
    anchor = {True: DEFAULT_ANCHOR, "none": ""}.get(kernel.dot_ahead, kernel.dot_ahead)
    changed = []

    def block(region: Block, budget: int = REGISTER_BUDGET) -> Block:
        ops: list[Op] = []
        for op in region.ops:
            inner = SPLIT_REGISTER_BUDGET if isinstance(op, WarpSpecialize) else budget
            op = op.map_regions(lambda nested: block(nested, inner))
            split = plan_split(op) if isinstance(op, For) else None
            if split is None or not fits_registers(split, kernel.num_warps, budget):
                if split is not None:
                    warn_at(op.loc, f"dot_ahead is not applied to this loop: S, the accumulator and P would take "
                            f"{tile_registers(split, kernel.num_warps)} registers a thread while block j - 1's "
                            f"P V runs, over the {budget} that keep it from spilling",
                            "use a smaller BLOCK_N or BLOCK_M, more warps, or launch without dot_ahead")
                ops.append(op)
                continue
            ops.extend(rewrite(op, dataclasses.replace(split, anchor=anchor)))
            changed.append(op)
        return Block(region.args, tuple(ops))

    body = block(kernel.body)
    return kernel.with_body(body) if changed else kernel
