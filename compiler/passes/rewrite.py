"""Rebuilding blocks: passes return new ops, and this walks nested regions for them."""

from __future__ import annotations

from typing import Callable, Iterable, Union

from ..ir import Block, Kernel, Op

# A rule gets an op whose nested blocks were already rewritten, and returns the ops that
# replace it (a single op, or a sequence, possibly empty).
Rule = Callable[[Op], Union[Op, Iterable[Op]]]


def rewrite_block(block: Block, rule: Rule) -> Block:
    ops = []
    for op in block.ops:
        op = op.map_regions(lambda region: rewrite_block(region, rule))
        replaced = rule(op)
        if isinstance(replaced, Op):
            ops.append(replaced)
        else:
            ops.extend(replaced)
    return Block(block.args, tuple(ops))


def rewrite_kernel(kernel: Kernel, rule: Rule, **changes) -> Kernel:
    return kernel.with_body(rewrite_block(kernel.body, rule), **changes)
