"""drop_unused_atomic_results: an atomic whose old value nothing reads returns none.

`ll.atomic_add(counter, 1)` as a statement still defines a value. Without it the atomic
needs no broadcast of old values (no scratch, no barrier), and the backend may issue PTX
`red`, which returns nothing. Runs before allocation, which reserves scratch only for
atomics that keep their result.
"""

from __future__ import annotations

import dataclasses

from ..ir import ATOMICS, Kernel, Op
from .rewrite import rewrite_kernel

NAME = "drop_unused_atomic_results"


def drop_unused_atomic_results(kernel: Kernel) -> Kernel:
    used = {value for op in kernel.walk() for value in op.uses()}

    def rule(op: Op) -> Op:
        if isinstance(op, ATOMICS) and op.result is not None and op.result not in used:
            return dataclasses.replace(op, result=None)
        return op

    return rewrite_kernel(kernel, rule)
