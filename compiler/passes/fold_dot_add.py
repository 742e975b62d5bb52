"""`acc += tl.dot(a, b)` as `acc = tl.dot(a, b, acc)` (run by accelerate_dots first).

The sum of a dot without accumulator and another tile of its type is the dot accumulating
into that tile. Left as written, the dot's product and `acc` are two full accumulator tiles
live at once, each as large as all the registers a 128 x 128 fp32 tile per warpgroup leaves:
the tutorials' grouped GEMM (`accumulator += tl.dot(a, b)`) spilled a thousand registers.
Folded, the wgmma accumulates in place. Integer sums are exact either way; float sums are
reassociated (acc + (a0 b0 + ...) becomes (acc + a0 b0) + ...), as Triton folds them too.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..ir import Binary, Block, Dot, Kernel, Op
from .rewrite import rewrite_kernel

NAME = "fold_dot_add"


def fold_dot_add(kernel: Kernel) -> Kernel:
    """Every `add` of a dot without accumulator (read by nothing else) and a tile of the
    dot's type, made the dot accumulating into that tile."""
    readers = Counter(value for op in kernel.walk() for value in op.uses())
    home = blocks_of(kernel.body, {})
    dots = {op.result: op for op in kernel.walk()
            if isinstance(op, Dot) and op.acc is None and readers[op.result] == 1}
    folded: dict = {}  # the add's result -> the dot replacing it

    def rule(op: Op):
        if isinstance(op, Binary) and op.kind == "add":
            for product, other in ((op.rhs, op.lhs), (op.lhs, op.rhs)):
                dot = dots.get(product)
                if dot is not None and other.type == product.type and other is not product \
                        and home[id(dot)] == home[id(op)]:  # never moves a dot into a loop
                    folded[id(dot)] = dataclasses.replace(dot, acc=other, result=op.result)
                    return []
        return op

    # The add comes after its dot: find the folds first, then put each dot where its add was
    # (its operands and accumulator are all defined by then).
    rewrite_kernel(kernel, rule)
    if not folded:
        return kernel
    adds = {dot.result: dot for dot in folded.values()}

    def place(op: Op):
        if isinstance(op, Dot) and id(op) in folded:
            return []
        if isinstance(op, Binary) and op.result in adds:
            return adds[op.result]
        return op

    return rewrite_kernel(kernel, place)


def blocks_of(block: Block, found: dict) -> dict:
    """Each op's block (by id), nested regions included."""
    for op in block.ops:
        found[id(op)] = id(block)
        for region in op.nested_blocks():
            blocks_of(region, found)
    return found
