"""Lowering of structured control flow: for, if, while, and their terminators.

Every carried value becomes phi nodes: one per register for a tensor (16-bit registers
two to a phi, as a <2 x T> vector: one 32-bit register in PTX, where a phi per 16-bit
value makes ptxas take packed pairs apart and put them back together with a PRMT per
half on every trip), one for a scalar, one for the base address of a shared view (its
addressing is static and must agree between the initial and the yielded view). `yield` and `condition` lower to nothing by
themselves; the op owning the region reads the terminator's values.

`for` runs `iv = lower; iv < upper; iv += step` (signed compare; unsigned for u32/u64
induction variables): the step must be positive, as in Triton's `range`.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import Block, Condition, For, If, While, Yield
from . import llvm_types as T
from .context import Lowering, SharedView, lowers


def _paired(registers: tuple) -> bool:
    """Whether a tensor's registers travel two to a phi: 16-bit floats or integers."""
    if not registers or len(registers) % 2:
        return False
    first = registers[0].type
    sixteen = first in (T.F16, T.BF16) or (isinstance(first, ir.IntType) and first.width == 16)
    return sixteen and all(r.type == first for r in registers)


def flatten_lowered(lowered, builder: ir.IRBuilder | None = None) -> list[ir.Value]:
    """The phi operands of a lowered value; with a builder, 16-bit registers are packed
    in pairs there."""
    if isinstance(lowered, tuple):
        if builder is None or not _paired(lowered):
            return list(lowered)
        pair_type = ir.VectorType(lowered[0].type, 2)
        pairs = []
        for i in range(0, len(lowered), 2):
            pair = builder.insert_element(ir.Constant(pair_type, ir.Undefined), lowered[i],
                                          ir.Constant(T.I32, 0))
            pair = builder.insert_element(pair, lowered[i + 1], ir.Constant(T.I32, 1))
            pairs.append(builder.bitcast(pair, T.I32))
        return pairs
    if isinstance(lowered, SharedView):
        return [lowered.base]
    return [lowered]


def rebuild_lowered(template, values, builder: ir.IRBuilder | None = None) -> object:
    """`values` (an iterator of phis) shaped like `template` (a lowered value); with a
    builder, the pairs `flatten_lowered` packed are unpacked there."""
    if isinstance(template, tuple):
        if builder is None or not _paired(template):
            return tuple(next(values) for _ in template)
        registers = []
        for _ in range(len(template) // 2):
            pair = builder.bitcast(next(values), ir.VectorType(template[0].type, 2))
            registers += [builder.extract_element(pair, ir.Constant(T.I32, i)) for i in (0, 1)]
        return tuple(registers)
    if isinstance(template, SharedView):
        return SharedView(template.type, next(values), template.addressing, template.xor, template.align)
    return next(values)


def _check_views(op, templates, others) -> None:
    for template, other in zip(templates, others):
        if isinstance(template, SharedView) and (
                not isinstance(other, SharedView) or other.addressing != template.addressing
                or other.xor != template.xor):
            raise CompilationError(
                "a shared view carried through a region must keep its layout and window", op.loc)


def _terminator(block: Block, kind):
    last = block.ops[-1] if block.ops else None
    return last if isinstance(last, kind) else None


def _yielded(ctx: Lowering, block: Block) -> list:
    terminator = _terminator(block, (Yield, Condition))
    return [ctx.get(v) for v in terminator.values] if terminator is not None else []


def _phis(ctx: Lowering, templates, flat: list, block: ir.Block) -> tuple[list, list]:
    """Phis over `flat` (the flattened values coming from `block`), and the carried values
    rebuilt from them, shaped like `templates`."""
    phis = []
    for value in flat:
        phi = ctx.builder.phi(value.type)
        phi.add_incoming(value, block)
        phis.append(phi)
    values = iter(phis)
    return phis, [rebuild_lowered(t, values, ctx.builder) for t in templates]


def _flatten_all(builder: ir.IRBuilder, lowered: list) -> list[ir.Value]:
    return [v for t in lowered for v in flatten_lowered(t, builder)]


def _define_all(ctx: Lowering, names, lowered) -> None:
    for value, item in zip(names, lowered):
        ctx.define(value, item)


@lowers(Yield, Condition)
def lower_terminator(ctx: Lowering, op) -> None:
    """Nothing to emit: the region's owner reads the values (see the module docstring)."""


@lowers(For)
def lower_for(ctx: Lowering, op: For) -> None:
    b = ctx.builder
    lower, upper, step = ctx.scalar(op.lower), ctx.scalar(op.upper), ctx.scalar(op.step)
    if upper.type != lower.type or step.type != lower.type:
        raise CompilationError("for bounds and step must have one integer type", op.loc)
    inits = [ctx.get(v) for v in op.inits]
    flat_inits = _flatten_all(b, inits)
    entry = b.block
    header, body, exit_ = ctx.new_block("for_header"), ctx.new_block("for_body"), ctx.new_block("for_exit")
    b.branch(header)
    b.position_at_end(header)
    iv = b.phi(lower.type, name="iv")
    iv.add_incoming(lower, entry)
    phis, carried = _phis(ctx, inits, flat_inits, entry)
    unsigned = not T.element_of(op.lower.type).is_signed
    keep_going = (b.icmp_unsigned if unsigned else b.icmp_signed)("<", iv, upper)
    b.cbranch(keep_going, body, exit_)

    b.position_at_end(body)
    ctx.define(op.body.args[0], iv)
    _define_all(ctx, op.body.args[1:], carried)
    _lower_body(ctx, op.body, op.rematerialize, "for_body_rest")
    yielded = _yielded(ctx, op.body)
    _check_views(op, inits, yielded)
    flat_yielded = _flatten_all(b, yielded)
    latch = b.block
    iv.add_incoming(b.add(iv, step), latch)
    for phi, value in zip(phis, flat_yielded):
        phi.add_incoming(value, latch)
    b.branch(header)

    b.position_at_end(exit_)
    _define_all(ctx, op.results, carried)


def _lower_body(ctx: Lowering, body, rematerialize: bool, rest_name: str) -> None:
    """A loop body at the builder's position. `rematerialize` (a persistent kernel's tile
    loop, say; `ll.range(..., rematerialize=True)`, `ll.condition(...)`): thread-position
    values are recomputed in a prologue of each iteration (Lowering.recompute_scope)
    rather than held in registers across the body's inner loops."""
    if not rematerialize:
        ctx.lower_block(body)
        return
    b = ctx.builder
    entry, rest = b.block, ctx.new_block(rest_name)
    prologue = ir.IRBuilder(entry)
    prologue.branch(rest)
    prologue.position_before(entry.terminator)
    b.position_at_end(rest)
    with ctx.recompute_scope(prologue):
        ctx.lower_block(body)


@lowers(If)
def lower_if(ctx: Lowering, op: If) -> None:
    b = ctx.builder
    # Per warp: the condition is a WarpAny result, every register holding the warp's answer.
    condition = ctx.get(op.condition)[0] if op.per_warp else ctx.scalar(op.condition)
    then_block, else_block, merge = ctx.new_block("then"), ctx.new_block("else"), ctx.new_block("endif")
    b.cbranch(condition, then_block, else_block)
    ends = []
    for block, region in ((then_block, op.then_body), (else_block, op.else_body)):
        b.position_at_end(block)
        ctx.lower_block(region)
        values = _yielded(ctx, region) if op.results else []
        ends.append((b.block, values, _flatten_all(b, values)))
        b.branch(merge)
    b.position_at_end(merge)
    if not op.results:
        return
    (then_end, then_values, then_flat), (else_end, else_values, else_flat) = ends
    _check_views(op, then_values, else_values)
    phis = []
    for value, other in zip(then_flat, else_flat):
        phi = b.phi(value.type)
        phi.add_incoming(value, then_end)
        phi.add_incoming(other, else_end)
        phis.append(phi)
    values = iter(phis)
    _define_all(ctx, op.results, [rebuild_lowered(t, values, b) for t in then_values])


@lowers(While)
def lower_while(ctx: Lowering, op: While) -> None:
    b = ctx.builder
    inits = [ctx.get(v) for v in op.inits]
    flat_inits = _flatten_all(b, inits)
    entry = b.block
    before, after, exit_ = ctx.new_block("while_before"), ctx.new_block("while_after"), ctx.new_block("while_exit")
    b.branch(before)
    b.position_at_end(before)
    phis, carried = _phis(ctx, inits, flat_inits, entry)
    _define_all(ctx, op.before.args, carried)
    ctx.lower_block(op.before)
    condition_op = _terminator(op.before, Condition)
    if condition_op is None:
        raise CompilationError("a while's first region must end with `condition`", op.loc)
    forwarded = [ctx.get(v) for v in condition_op.values]
    b.cbranch(ctx.scalar(condition_op.condition), after, exit_)

    b.position_at_end(after)
    _define_all(ctx, op.after.args, forwarded)
    _lower_body(ctx, op.after, op.rematerialize, "while_after_rest")
    yielded = _yielded(ctx, op.after)
    _check_views(op, inits, yielded)
    flat_yielded = _flatten_all(b, yielded)
    latch = b.block
    for phi, value in zip(phis, flat_yielded):
        phi.add_incoming(value, latch)
    b.branch(before)

    b.position_at_end(exit_)
    _define_all(ctx, op.results, forwarded)
