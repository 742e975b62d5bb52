"""The IR verifier: run between passes in tests and under WEFT_VERIFY / WEFT_DEBUG.

It checks what every later stage assumes: values are defined before use and in scope, and
each op keeps its own rules (`Op.verify`, on the op classes in compiler/ir: elementwise ops
agree on shape and layout, shape ops carry the layout their rule gives, region yields match
the values they feed, per-warp branches hold in-warp ops only, recorded plans fit their op),
and `tile`-only ops (dot) appear only in `tile`-stage kernels.
A failure is a compiler bug (or a hand-built IR mistake), reported with the op's location.
"""

from __future__ import annotations

from .ir import Block, Kernel, VerificationError

__all__ = ["VerificationError", "verify"]


def _verify_block(block: Block, scope: set, stage: str) -> None:
    scope = set(scope) | set(block.args)
    for op in block.ops:
        if op.TILE_ONLY and stage != "tile":
            raise op.invalid(f"a `tile`-stage op in a `{stage}`-stage kernel; the highlevel passes "
                             f"replace it first")
        for value in op.uses():
            if value not in scope:
                raise op.invalid(f"uses {value!r} before it is defined (or outside its scope)")
        op.verify()
        for region in op.nested_blocks():
            _verify_block(region, scope, stage)
        scope.update(op.defines())


def verify(kernel: Kernel) -> Kernel:
    """Raise VerificationError on the first problem; return the kernel unchanged."""
    _verify_block(kernel.body, set(kernel.params), kernel.stage)
    return kernel
