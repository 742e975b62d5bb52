"""Lowering of structured control flow: for, if, while, and their terminators.

Every carried value becomes phi nodes: one per register for a tensor, one for a scalar,
one for the base address of a shared view (its addressing is static and must agree
between the initial and the yielded view). `yield` and `condition` lower to nothing by
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


def _flatten(lowered) -> list[ir.Value]:
    if isinstance(lowered, tuple):
        return list(lowered)
    if isinstance(lowered, SharedView):
        return [lowered.base]
    return [lowered]


def _rebuild(template, values) -> object:
    """`values` (an iterator) shaped like `template` (a lowered value)."""
    if isinstance(template, tuple):
        return tuple(next(values) for _ in template)
    if isinstance(template, SharedView):
        return SharedView(template.type, next(values), template.addressing, template.xor)
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


def _phis(ctx: Lowering, templates, incoming: list, block: ir.Block) -> tuple[list, list]:
    flat = [v for t in incoming for v in _flatten(t)]
    phis = []
    for value in flat:
        phi = ctx.builder.phi(value.type)
        phi.add_incoming(value, block)
        phis.append(phi)
    values = iter(phis)
    return phis, [_rebuild(t, values) for t in templates]


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
    entry = b.block
    header, body, exit_ = ctx.new_block("for_header"), ctx.new_block("for_body"), ctx.new_block("for_exit")
    b.branch(header)
    b.position_at_end(header)
    iv = b.phi(lower.type, name="iv")
    iv.add_incoming(lower, entry)
    phis, carried = _phis(ctx, inits, inits, entry)
    unsigned = not T.element_of(op.lower.type).is_signed
    keep_going = (b.icmp_unsigned if unsigned else b.icmp_signed)("<", iv, upper)
    b.cbranch(keep_going, body, exit_)

    b.position_at_end(body)
    ctx.define(op.body.args[0], iv)
    _define_all(ctx, op.body.args[1:], carried)
    ctx.lower_block(op.body)
    yielded = _yielded(ctx, op.body)
    _check_views(op, inits, yielded)
    latch = b.block
    iv.add_incoming(b.add(iv, step), latch)
    for phi, value in zip(phis, (v for y in yielded for v in _flatten(y))):
        phi.add_incoming(value, latch)
    b.branch(header)

    b.position_at_end(exit_)
    _define_all(ctx, op.results, carried)


@lowers(If)
def lower_if(ctx: Lowering, op: If) -> None:
    b = ctx.builder
    condition = ctx.scalar(op.condition)
    then_block, else_block, merge = ctx.new_block("then"), ctx.new_block("else"), ctx.new_block("endif")
    b.cbranch(condition, then_block, else_block)
    ends = []
    for block, region in ((then_block, op.then_body), (else_block, op.else_body)):
        b.position_at_end(block)
        ctx.lower_block(region)
        ends.append((b.block, _yielded(ctx, region) if op.results else []))
        b.branch(merge)
    b.position_at_end(merge)
    if not op.results:
        return
    (then_end, then_values), (else_end, else_values) = ends
    _check_views(op, then_values, else_values)
    phis = []
    for value, other in zip((v for t in then_values for v in _flatten(t)),
                            (v for t in else_values for v in _flatten(t))):
        phi = b.phi(value.type)
        phi.add_incoming(value, then_end)
        phi.add_incoming(other, else_end)
        phis.append(phi)
    values = iter(phis)
    _define_all(ctx, op.results, [_rebuild(t, values) for t in then_values])


@lowers(While)
def lower_while(ctx: Lowering, op: While) -> None:
    b = ctx.builder
    inits = [ctx.get(v) for v in op.inits]
    entry = b.block
    before, after, exit_ = ctx.new_block("while_before"), ctx.new_block("while_after"), ctx.new_block("while_exit")
    b.branch(before)
    b.position_at_end(before)
    phis, carried = _phis(ctx, inits, inits, entry)
    _define_all(ctx, op.before.args, carried)
    ctx.lower_block(op.before)
    condition_op = _terminator(op.before, Condition)
    if condition_op is None:
        raise CompilationError("a while's first region must end with `condition`", op.loc)
    forwarded = [ctx.get(v) for v in condition_op.values]
    b.cbranch(ctx.scalar(condition_op.condition), after, exit_)

    b.position_at_end(after)
    _define_all(ctx, op.after.args, forwarded)
    ctx.lower_block(op.after)
    yielded = _yielded(ctx, op.after)
    _check_views(op, inits, yielded)
    latch = b.block
    for phi, value in zip(phis, (v for y in yielded for v in _flatten(y))):
        phi.add_incoming(value, latch)
    b.branch(before)

    b.position_at_end(exit_)
    _define_all(ctx, op.results, forwarded)
