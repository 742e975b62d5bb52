"""Lowering of warp_specialize: partitions of the CTA's warps running different blocks.

The CTA launches `kernel.total_warps` = num_warps + the workers' warps. Where the op
sits, the threads branch on their (warp-uniform) warp index into one block per
partition: the default partition on warps [0, num_warps), worker i on the next
`worker_num_warps[i]`; warps no partition of this op uses go straight to the join.
Each block is lowered in a `partition_scope`: thread and warp indices relative to the
partition's first warp, `Barrier` (and the barriers inside reductions and conversions)
as the partition's named barrier `bar.sync id, 32 * warps` (ids from 1, one per
partition), prologue values in the partition's entry block. A replicated worker is one
block run by all its copies: indices relative to the copy's first warp, its copy index
from the warp index, and one named barrier per copy (the id a register). The block args
are the captures. All partitions meet at a bar.sync 0 over the whole CTA; the default
partition's yield gives the op's results.

Outside partitions, the extra warps run the kernel's code as copies of the first
num_warps warps (warp index modulo num_warps; "one thread issues" ops still elect CTA
thread 0 alone), so every value captured before the op is in their registers. A
captured tensor reaches a worker intact only where a worker warp's copy holds what the
worker's layout expects (checked). After the last warp_specialize at the top level of
the kernel the extra warps exit, so code after it (and the results, which only the
default partition computes) runs on num_warps warps, and CTA barriers from there on
count 32 * num_warps threads. Results of any other warp_specialize are refused.

Register budgets (setmaxnreg, per warpgroup): with any budget, the kernel gets an entry
cap `.maxnreg` = 65536 / threads (at most 255; at most the launch option maxnreg, which
leaves room for more CTAs on an SM) rounded down to a multiple of 8; each
budgeted partition sets its budget first thing (dec below the cap, inc above) and sets
the cap back before the join (idle partitions, which only fill a warpgroup, after the
join's barrier, or never where their warps leave), so code after the op runs with the cap again. Budgets must
be multiples of 8 in [24, 256], the same for every warp of a warpgroup (partitions of
fewer than 4 warps share one, and idle partitions fill the last: lowlevel's
warp_specialize arranges both), and the partitions together may not hold more registers
than the CTA got at launch (cap * threads).
"""

from __future__ import annotations

from typing import Optional

from llvmlite import ir

from ..errors import CompilationError
from ..hardware import MAX_REGISTERS, REGISTER_FILE, WARPS_PER_WARPGROUP
from ..ir import Kernel, ReplicaIndex, WarpgroupTurn, WarpSpecialize, Yield
from ..types import TensorType
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, Partition, lowers
from .lower_control import flatten_lowered, rebuild_lowered



def launch_register_cap(threads: int) -> int:
    """The registers each of a CTA's `threads` gets at launch (`.maxnreg`, a multiple of
    8): setmaxnreg only moves registers between warpgroups within threads * this."""
    return min(MAX_REGISTERS, REGISTER_FILE // threads) // 8 * 8


def entry_register_cap(kernel: Kernel) -> Optional[int]:
    """The `.maxnreg` a kernel needs for its setmaxnreg budgets (None: it sets none),
    after checking every warp_specialize's budgets (CompilationError at the op)."""
    ops = [op for op in kernel.walk() if isinstance(op, WarpSpecialize)]
    if not any(any(op.worker_num_regs) or op.default_num_regs for op in ops):
        return None
    cap = launch_register_cap(32 * kernel.total_warps)
    if kernel.max_registers is not None:
        cap = min(cap, kernel.max_registers // 8 * 8)
    for op in ops:
        _check_budgets(op, kernel.num_warps, cap)
    return cap


def _partition_warps(op: WarpSpecialize, num_warps: int) -> list[tuple[int, int]]:
    """(first warp, warp count) of the default partition, then of each worker (all its
    copies, when replicated)."""
    spans, first = [], 0
    for warps, copies in zip((num_warps,) + tuple(op.worker_num_warps), (1,) + op.replicas()):
        spans.append((first, warps * copies))
        first += warps * copies
    return spans


def _check_budgets(op: WarpSpecialize, num_warps: int, cap: int) -> None:
    budgets = (op.default_num_regs,) + tuple(op.worker_num_regs)
    if len(op.worker_num_regs) != len(op.workers) or len(op.worker_num_warps) != len(op.workers):
        raise CompilationError("warp_specialize needs one warp count and one register budget per worker", op.loc)
    if len(op.replicas()) != len(op.workers):
        raise CompilationError("warp_specialize needs one copy count per worker", op.loc)
    if not any(budgets):
        return
    bad = [b for b in budgets if b and (b % 8 or not 24 <= b <= 256)]
    if bad:
        raise CompilationError(
            f"register budgets must be multiples of 8 in [24, 256] (setmaxnreg), found {bad}", op.loc,
            suggestion="round the budget to a multiple of 8, or give 0 for no change")
    spans = _partition_warps(op, num_warps)
    per_warp = [budget for (_, warps), budget in zip(spans, budgets) for _ in range(warps)]
    for first in range(0, len(per_warp), WARPS_PER_WARPGROUP):
        group = per_warp[first:first + WARPS_PER_WARPGROUP]
        if len(set(group)) > 1 or (len(group) < WARPS_PER_WARPGROUP and any(group)):
            raise CompilationError(
                "register budgets (setmaxnreg) apply per warpgroup: all 4 warps of one execute the "
                f"same setmaxnreg, but warps {first}..{first + WARPS_PER_WARPGROUP - 1} have budgets "
                f"{group} (partitions on {[warps for _, warps in spans]} warps)", op.loc,
                suggestion="give partitions that share a warpgroup one budget and fill the last "
                           "warpgroup (lowlevel warp_specialize does both)")
    held = sum(32 * warps * (budget or cap) for (_, warps), budget in zip(spans, budgets))
    available = 32 * sum(warps for _, warps in spans) * cap
    if held > available:
        raise CompilationError(
            f"the partitions' register budgets hold {held} registers, but the CTA gets {available} "
            f"at launch ({cap} per thread, the cap for {32 * sum(w for _, w in spans)} threads)", op.loc,
            expected=f"sum of budget * 32 * warps <= {available}",
            found=f"budgets {list(budgets)} (0: the cap) on {[w for _, w in spans]} warps",
            suggestion="lower the budgets (e.g. 24 or 40 for a producer warpgroup, the rest for consumers), "
                       "or raise the launch option maxnreg")


def _warp_part(layout, warp: int) -> tuple:
    """The coordinates the warp bits of `warp` contribute in `layout`."""
    value = [0] * len(layout.out_dims)
    for bit, basis in enumerate(layout.bases.get("warp", ())):
        if warp >> bit & 1:
            value = [v ^ c for v, c in zip(value, basis)]
    return tuple(value)


def _check_captures(op: WarpSpecialize, partition: Partition, block, num_warps: int) -> None:
    """A worker warp holds a captured tensor as warp `w % num_warps` computed it; the
    worker reads it as its relative warp: they must be the same elements."""
    for capture, arg in zip(op.captures, block.args):
        if not isinstance(capture.type, TensorType):
            continue
        layout = capture.type.layout
        warps = partition.num_warps
        same = arg.type == capture.type and all(
            _warp_part(layout, (partition.first_warp + w) % num_warps) == _warp_part(layout, w % warps)
            for w in range(warps * partition.replicas))
        if not same:
            raise CompilationError(
                f"worker {partition.index - 1} of this warp_specialize cannot receive the tensor "
                f"`{capture.hint or capture.id}`: its warps {partition.first_warp}.."
                f"{partition.first_warp + partition.num_warps - 1} hold other elements of it than the "
                "worker's layout gives them", op.loc,
                suggestion="pass shared memory or scalars to workers and build tensors inside them, "
                           "or make the tensor's layout broadcast over warps")


def _set_registers(builder: ir.IRBuilder, count: int, increase: bool) -> None:
    text, constraints = ptx_asm.set_max_registers(count, increase)
    builder.asm(ir.FunctionType(ir.VoidType(), []), text, constraints, [], side_effect=True)


def _is_idle(block) -> bool:
    """A worker with nothing to do: one that only fills its warpgroup for a register budget."""
    return all(isinstance(o, Yield) for o in block.ops)


def _reset_idle_warps(ctx: Lowering, warp: ir.Value, idle: list[tuple[int, int, int]], cap: int) -> None:
    """Idle warps hold their warpgroup's low budget until every partition is done (past the
    join's barrier): taking the cap back at once could starve a partition still raising its
    own budget, which waits on registers the idle warps would hold."""
    b = ctx.builder
    reset, after = ctx.new_block("ws_idle_reset"), ctx.new_block("ws_after_reset")
    first, end, budget = idle[0][0], idle[-1][1], idle[0][2]  # the last warpgroup's, one budget
    inside = b.and_(b.icmp_unsigned(">=", warp, ir.Constant(T.I32, first)),
                    b.icmp_unsigned("<", warp, ir.Constant(T.I32, end)))
    b.cbranch(inside, reset, after)
    b.position_at_end(reset)
    _set_registers(b, cap, budget < cap)
    b.branch(after)
    b.position_at_end(after)


def _is_last_top_level(kernel: Kernel, op: WarpSpecialize) -> bool:
    """The op sits in the kernel's body (not in a loop or branch) and no other follows."""
    ops = kernel.body.ops
    index = next((i for i, o in enumerate(ops) if o is op), None)
    if index is None:
        return False
    for later in ops[index + 1:]:
        if isinstance(later, WarpSpecialize) or any(
                isinstance(o, WarpSpecialize) for region in later.nested_blocks() for o in region.walk()):
            return False
    return True


@lowers(WarpSpecialize)
def lower_warp_specialize(ctx: Lowering, op: WarpSpecialize) -> None:
    kernel = ctx.kernel
    if ctx.partition is not None:
        raise CompilationError("warp_specialize inside a warp_specialize partition is not supported", op.loc)
    if ctx.barrier_threads is not None:
        raise CompilationError("a warp_specialize after the last top-level one: its worker warps have "
                               "exited", op.loc)
    last = _is_last_top_level(kernel, op)
    if op.results and not last:
        raise CompilationError(
            "only the last warp_specialize at the top level of a kernel may return values (its worker "
            "warps leave after it; elsewhere they would go on with values they do not have)", op.loc,
            suggestion="store the values to memory in the default partition instead")
    cap = entry_register_cap(kernel)
    b = ctx.builder
    warp = ctx.uniform_warp()
    captured = [ctx.get(v) for v in op.captures]
    blocks = (op.default,) + tuple(op.workers)
    budgets = (op.default_num_regs,) + tuple(op.worker_num_regs)
    join = ctx.new_block("ws_join")
    ends, results, idle = [], [], []
    copies = (1,) + op.replicas()
    barrier_ids = [1 + sum(copies[:index]) for index in range(len(copies))]  # a copy's own
    for index, ((first, warps), block, budget) in enumerate(
            zip(_partition_warps(op, kernel.num_warps), blocks, budgets)):
        partition = Partition(index, first, warps // copies[index], id(op), copies[index],
                              barrier_ids[index])
        if index:
            _check_captures(op, partition, block, kernel.num_warps)
        entry = ctx.new_block(f"ws_partition{index}_entry")
        body = ctx.new_block(f"ws_partition{index}")
        following = ctx.new_block("ws_dispatch")
        b.cbranch(b.icmp_unsigned("<", warp, ir.Constant(T.I32, first + warps)), entry, following)
        prologue = ir.IRBuilder(entry)
        if budget and cap is not None and budget != cap:
            _set_registers(prologue, budget, budget > cap)
        prologue.branch(body)
        prologue.position_before(entry.terminator)
        b.position_at_end(body)
        with ctx.partition_scope(partition, prologue):
            for arg, value in zip(block.args, captured):
                ctx.define(arg, value)
            ctx.lower_block(block)
            if index == 0 and op.results:
                terminator = block.ops[-1] if block.ops else None
                if not isinstance(terminator, Yield) or len(terminator.values) != len(op.results):
                    raise CompilationError("the default partition must end with a yield of the op's results",
                                           op.loc)
                results = [ctx.get(v) for v in terminator.values]
        resets = budget and cap is not None and budget != cap
        if resets and index and _is_idle(block):
            idle.append((first, first + warps, budget))  # takes the cap back after the join's barrier
        elif resets:
            _set_registers(b, cap, budget < cap)
        ends.append(b.block)
        b.branch(join)
        b.position_at_end(following)
    b.branch(join)  # warps this op gives no partition (another one has more workers)
    unused = b.block
    b.position_at_end(join)
    if op.results:
        phis = []
        for value in (v for r in results for v in flatten_lowered(r)):
            phi = b.phi(value.type)
            phi.add_incoming(value, ends[0])
            for end in ends[1:] + [unused]:
                phi.add_incoming(ir.Constant(value.type, ir.Undefined), end)
            phis.append(phi)
        values = iter(phis)
        for result, template in zip(op.results, results):
            ctx.define(result, rebuild_lowered(template, values))
    ctx.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", ir.VoidType(), [ir.Constant(T.I32, 0)])
    if idle and not last:
        _reset_idle_warps(ctx, warp, idle, cap)
    if last:
        leave, stay = ctx.new_block("ws_extra_warps_exit"), ctx.new_block("ws_after")
        b.cbranch(b.icmp_unsigned(">=", warp, ir.Constant(T.I32, kernel.num_warps)), leave, stay)
        b.position_at_end(leave)
        b.ret_void()
        b.position_at_end(stay)
        ctx.barrier_threads = 32 * kernel.num_warps


@lowers(ReplicaIndex)
def lower_replica_index(ctx: Lowering, op: ReplicaIndex) -> None:
    ctx.define(op.result, ctx.replica_index())


@lowers(WarpgroupTurn)
def lower_warpgroup_turn(ctx: Lowering, op: WarpgroupTurn) -> None:
    """Named barriers op.barrier + g, over both warpgroups' threads: a take is the
    warpgroup's bar.sync on its own, a pass its bar.arrive on the other's, the open
    warpgroup 1's bar.arrive on warpgroup 0's."""
    partition = ctx.partition
    if partition is None or partition.num_warps != 2 * WARPS_PER_WARPGROUP or partition.replicas > 1:
        raise CompilationError("warpgroup_turn needs a warp_specialize partition of two warpgroups", op.loc,
                               suggestion="take turns only in a partition of 8 warps")
    if op.barrier <= partition.barrier_id:
        raise CompilationError(f"warpgroup_turn's named barrier {op.barrier} is a partition's", op.loc)
    b = ctx.builder
    group = b.lshr(ctx.thread_id, ir.Constant(T.I32, (32 * WARPS_PER_WARPGROUP).bit_length() - 1))
    threads = ir.Constant(T.I32, 32 * partition.num_warps)
    if op.action == "take":
        own = b.add(ir.Constant(T.I32, op.barrier), group)
        ctx.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.count", ir.VoidType(), [own, threads])
    elif op.action == "pass":  # warpgroup 0 to 1's barrier, 1 to 0's
        ctx.inline_asm(ptx_asm.named_barrier_arrive_by_group((op.barrier + 1, op.barrier), 32 * partition.num_warps),
                       [group])
    else:  # open: warpgroup 1 (given 1) to 0's barrier, warpgroup 0 (given 2) nowhere
        ctx.inline_asm(ptx_asm.named_barrier_arrive_by_group((op.barrier, op.barrier), 32 * partition.num_warps),
                       [b.sub(ir.Constant(T.I32, 2), group)])
