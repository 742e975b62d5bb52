"""Warp-level MMA from lowlevel kernels (Gluon's `mma_v2`): mma.sync, one warp at a time.

    acc = ll.mma_v2(a, b, acc)   # a @ b + acc, one warp at a time

`mma_v2` runs mma.sync.m16n8k16 in each warp on its own registers: `acc` fp32 in
NVMMADistributedLayout([2, 0], warps, [16, 8]), `a` [M, K] and `b` [K, N] (fp16 or bf16)
in DotOperandLayout(0 / 1, <acc's layout>, 2), or shared buffers, read as each instruction
needs them: by ldmatrix where K is contiguous (`a` row-major, `b` the permuted view of
an [N, K] tile), else by 16-bit pairs. No thread outside the warp takes part, so it may
run in a branch taken warp by warp (`if ll.warp_any(...)`); shared operands that TMA
overwrites next need `fence_async_shared()` after it, before their release.
"""

from __future__ import annotations

from typing import Any

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.mma import MmaError, plan_mma_v2
from ..compiler.types import bf16, fp16, fp32
from . import semantic as sem
from .layouts import DotOperandLayout, NVMMADistributedLayout
from .shared import SharedMemoryDescriptor

__all__ = ["mma_v2"]


@builtin
def mma_v2(a: Any, b: Any, acc: Any):
    """`a @ b + acc` by mma.sync.aligned.m16n8k16, each warp on its own rows of a and
    columns of b. `a` and `b` are register tensors in DotOperandLayout(0 / 1, <acc's
    layout>, 2), or shared buffers: those are read fragment by fragment (ldmatrix where
    K is contiguous), as each instruction needs them, so that only a few instructions'
    operands are held at a time."""
    bld = sem.builder()
    if not sem.is_tensor(acc) or len(acc.type.shape) != 2:
        raise bld.error(f"mma_v2 acc must be a 2-D register tensor, found {sem.describe(acc)}")
    encoding = acc.type.encoding
    if not isinstance(encoding, NVMMADistributedLayout) or encoding.version[0] != 2 or acc.type.element != fp32:
        raise bld.error(f"mma_v2 acc must be an fp32 tensor in NVMMADistributedLayout(version=[2, 0], ...), "
                        f"found {sem.describe(acc)}",
                        suggestion="make it with ll.zeros([M, N], ll.float32, "
                                   "ll.NVMMADistributedLayout([2, 0], [num_warps, 1], [16, 8]))")
    a_type, b_type = a.type.element, b.type.element
    if a_type not in (fp16, bf16) or a_type != b_type:
        raise bld.error(f"mma_v2 takes two fp16 or two bf16 operands, found a {a_type} and b {b_type}")
    layouts = []
    for index, name, x in ((0, "a", a), (1, "b", b)):
        operand = DotOperandLayout(index, encoding, 2)
        if isinstance(x, SharedMemoryDescriptor):
            if len(x.shape) != 2:
                raise bld.error(f"mma_v2 {name} must be a 2-D shared buffer, found {x.type}",
                                suggestion="pick one stage with .index(i)")
            layouts.append(operand.to_linear(x.shape))
            continue
        if not sem.is_tensor(x) or len(x.type.shape) != 2:
            raise bld.error(f"mma_v2 {name} must be a 2-D register tensor or shared buffer, found "
                            f"{sem.describe(x)}")
        enc = x.type.encoding
        if not isinstance(enc, DotOperandLayout) or enc.operand_index != index or enc.parent != encoding \
                or enc.k_width != 2:
            raise bld.error(f"mma_v2 {name} must be in DotOperandLayout({index}, <acc layout>, 2), found "
                            f"{sem.describe(x)}",
                            suggestion=f"load it with smem.load(ll.DotOperandLayout({index}, acc_layout, 2)), "
                                       f"ll.convert_layout it, or pass the shared buffer itself")
        layouts.append(x.type.layout)
    try:
        plan_mma_v2(acc.type.layout, *layouts)
    except MmaError as error:
        raise bld.error(f"mma_v2: {error}", suggestion=error.suggestion) from None
    shared = [isinstance(x, SharedMemoryDescriptor) for x in (a, b)]
    result = bld.create(ir.MmaV2, acc.type, a=a.handle, b=b.handle, acc=acc.handle,
                        a_layout=layouts[0] if shared[0] else None, b_layout=layouts[1] if shared[1] else None)
    return bld.wrap(result)
