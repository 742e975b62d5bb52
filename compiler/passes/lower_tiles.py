"""lower_tiles: the end of inference; the kernel enters the `layout` stage.

After `propagate_layouts` every tensor should have a linear layout. This pass checks
that none is missing (an inference bug is reported at the op's source line, never as a
crash in a later pass), gives every tensor type a layout description when it has none
(a LinearDistributedLayout of its linear layout, so messages and dumps can name it),
drops conversions between equal layouts, and marks the kernel `layout`: from here the
lowlevel passes and the backend run unchanged.
"""

from __future__ import annotations

import dataclasses

from ...layouts import LinearDistributedLayout
from ..errors import CompilationError
from ..ir import Block, ConvertLayout, Kernel, Op, Value
from ..types import TensorType

NAME = "lower_tiles"


def lower_tiles(kernel: Kernel) -> Kernel:
    """The `layout`-stage kernel of a `tile` kernel whose tensors all have layouts."""
    renamed: dict[Value, Value] = {}

    def described(value: Value, op: Op) -> Value:
        if not isinstance(value.type, TensorType):
            return value
        if value.type.layout is None:
            raise CompilationError(
                f"internal: no layout was inferred for a {value.type} ({op.NAME}); "
                f"please report this kernel", op.loc)
        if value.type.encoding is not None:
            return value
        encoding = LinearDistributedLayout.from_linear(value.type.layout)
        renamed[value] = Value(value.type.with_layout(value.type.layout, encoding), value.hint)
        return renamed[value]

    def lower(block: Block, owner: Op) -> Block:
        args = tuple(described(a, owner) for a in block.args)
        ops = []
        for op in block.ops:
            changes = {}
            for f in dataclasses.fields(op):
                item = getattr(op, f.name)
                if isinstance(item, Block):
                    changes[f.name] = lower(item, op)
                elif isinstance(item, tuple) and item and all(isinstance(b, Block) for b in item):
                    changes[f.name] = tuple(lower(b, op) for b in item)  # worker partitions
                elif isinstance(item, Value):
                    changes[f.name] = renamed.get(item, item)
                elif isinstance(item, tuple) and item and all(isinstance(v, Value) for v in item):
                    changes[f.name] = tuple(renamed.get(v, v) for v in item)
            if isinstance(op, ConvertLayout) and changes["operand"].type.layout == op.result.type.layout:
                described(op.result, op)
                renamed[op.result] = changes["operand"]  # nothing moves
                continue
            op = dataclasses.replace(op, **changes)
            results = {r: described(r, op) for r in op.defines()}
            if "result" in changes:
                op = dataclasses.replace(op, result=results[op.result])
            elif "results" in changes:
                op = dataclasses.replace(op, results=tuple(results[r] for r in op.results))
            ops.append(op)
        return Block(args, tuple(ops))

    params = tuple(described(p, Op()) for p in kernel.params)
    return kernel.with_body(lower(kernel.body, Op()), params=params, stage="layout")
