"""Hopper's warpgroup MMA (wgmma) from lowlevel kernels (Gluon's names): `warpgroup_mma`
and `warpgroup_mma_wait`; `mma_v2` (mma.sync, one warp at a time) is in mma_v2.py.

    acc = ll.warpgroup_mma(a_smem, b_smem, acc, is_async=True)   # a @ b + acc, in flight
    acc = ll.warpgroup_mma_wait(num_outstanding=1, deps=[acc])   # <= 1 group still running

`a` is a shared [M, K] buffer or a register tensor in a DotOperandLayout(0, acc layout,
k_width); `b` a shared [K, N] buffer (`smem.permute((1, 0))` of a K-major [N, K] tile for
the transposed operand); `acc` an fp32 tensor in NVMMADistributedLayout(version=[3, 0]).
Its `warps_per_cta` place the warpgroups: [4 * g, 1] stacks them along M (64 rows each),
[4, 2] puts two side by side along N, so at M = 64 each warpgroup computes its own half
of the columns, reading B from that half's start (warps past the tile repeat the work of
the first, as a layout's broadcast warps do).
Shared operands written by ordinary stores need `fence_async_shared()` (shared.py) before
the wgmma.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.warpgroup_mma_descriptors import WgmmaError, plan_accumulator
from ..compiler.types import bf16, fp16, fp32, fp8e4m3, fp8e5m2
from . import semantic as sem
from .tensor import Tensor
from .layouts import DotOperandLayout, NVMMADistributedLayout
from .shared import SharedMemoryDescriptor

__all__ = ["warpgroup_mma", "warpgroup_mma_wait"]

_INPUTS = (fp16, bf16, fp8e4m3, fp8e5m2)


def _check_accumulator(acc: Any) -> NVMMADistributedLayout:
    b = sem.builder()
    if not sem.is_tensor(acc) or len(acc.type.shape) != 2:
        raise b.error(f"warpgroup_mma acc must be a 2-D tensor, found {sem.describe(acc)}")
    encoding = acc.type.encoding
    if not isinstance(encoding, NVMMADistributedLayout) or encoding.version[0] != 3:
        raise b.error(f"warpgroup_mma acc must be in NVMMADistributedLayout(version=[3, 0], ...), "
                      f"found {sem.describe(acc)}",
                      suggestion="make it with ll.zeros([M, N], ll.float32, "
                                 "ll.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, N, 16]))")
    if encoding.num_warps % 4:
        raise b.error(f"warpgroup_mma runs on whole warpgroups; the acc layout spans "
                      f"{encoding.num_warps} warps", suggestion="use 4, 8, ... warps")
    if acc.type.element not in (fp32, fp16):
        raise b.error(f"warpgroup_mma accumulates in fp32 (or fp16), found {acc.type.element}")
    return encoding


def _contiguous_dim(layout) -> int:
    """The dim that offset 1 steps along (the operand's contiguous dim)."""
    names = [f"dim{i}" for i in range(len(layout.out_dims))]
    first = layout.transpose_outs(names).bases["offset"][0]
    return next(d for d, v in enumerate(first) if v)


def _operand_shape(x: Any, name: str) -> tuple[int, ...]:
    b = sem.builder()
    if isinstance(x, SharedMemoryDescriptor):
        if len(x.shape) != 2:
            raise b.error(f"warpgroup_mma {name} must be a 2-D shared buffer, found {x.type}",
                          suggestion="pick one stage with .index(i)")
        return x.shape
    if name == "a" and sem.is_tensor(x):
        return x.type.shape
    raise b.error(f"warpgroup_mma {name} must be a shared-memory buffer"
                  f"{' or a register tensor in a DotOperandLayout' if name == 'a' else ''}, "
                  f"found {sem.describe(x)}")


@builtin
def warpgroup_mma(a: Any, b: Any, acc: Any, *, use_acc: Any = True, is_async: bool = False):
    """`a @ b + acc` (just `a @ b` where use_acc is false) on the tensor cores."""
    bld = sem.builder()
    encoding = _check_accumulator(acc)
    (m, k), (k2, n) = _operand_shape(a, "a"), _operand_shape(b, "b")
    if (m, n) != acc.type.shape or k != k2:
        raise bld.error(f"warpgroup_mma shapes do not chain: a {[m, k]} @ b {[k2, n]} into acc "
                        f"{list(acc.type.shape)}", expected="a [M, K], b [K, N], acc [M, N]")
    a_type, b_type = a.type.element, b.type.element
    if a_type not in _INPUTS or a_type != b_type:
        raise bld.error(f"warpgroup_mma takes two fp16, bf16 or fp8 operands of one type, "
                        f"found a {a_type} and b {b_type}")
    if acc.type.element == fp16 and a_type != fp16:
        raise bld.error(f"an fp16 accumulator needs fp16 operands, found {a_type}")
    if m % 64:
        raise bld.error(f"warpgroup_mma M = {m} must be a multiple of 64 (the rows of one "
                        f"warpgroup's m64 instruction)")
    try:
        plan_accumulator(acc.type.layout, acc.type.shape)
    except WgmmaError as error:
        raise bld.error(f"warpgroup_mma acc {sem.describe(acc)}: {error}",
                        suggestion=error.suggestion) from None
    instr_k = 256 // a_type.bits
    if k % instr_k:
        raise bld.error(f"warpgroup_mma K = {k} must be a multiple of {instr_k} for {a_type}")
    if n % 8 or encoding.instr_shape[1] % 8 or not 8 <= encoding.instr_shape[1] <= 256:
        raise bld.error(f"warpgroup_mma N = {n} (instr N {encoding.instr_shape[1]}) must be a "
                        f"multiple of 8, instr N at most 256")
    if sem.is_tensor(a):
        a_enc = a.type.encoding
        if not isinstance(a_enc, DotOperandLayout) or a_enc.operand_index != 0 \
                or a_enc.parent != encoding:
            raise bld.error(f"a register operand a must be in DotOperandLayout(0, <acc layout>, "
                            f"k_width={32 // a_type.bits}), found {sem.describe(a)}")
    for name, x, k_dim in (("a", a, 1), ("b", b, 0)):
        if isinstance(x, SharedMemoryDescriptor) and a_type.bits == 8 and \
                _contiguous_dim(x.handle.type.layout) != k_dim:
            raise bld.error(f"fp8 operand {name} must be K-major (K contiguous in shared "
                            f"memory): wgmma cannot transpose 8-bit operands",
                            suggestion="keep B as an [N, K] tile and pass b_smem.permute((1, 0))"
                            if name == "b" else "load A as an [M, K] tile with K contiguous")
    if use_acc is True:
        flag = None
    else:
        flag = sem.predicate(use_acc, "warpgroup_mma use_acc")
    if not isinstance(is_async, bool):
        raise bld.error(f"warpgroup_mma is_async must be a compile-time bool, found {is_async!r}")
    result = bld.create(ir.WarpgroupMma, acc.type, a=a.handle, b=b.handle, acc=acc.handle,
                        use_acc=flag, is_async=is_async)
    return bld.wrap(result)


# Gluon keeps an in-flight accumulator in a type of its own; here warpgroup_mma's result is
# an ordinary tensor that only warpgroup_mma_wait makes safe to read, so the name is the
# tensor class (for annotations and isinstance) and warpgroup_mma_init returns its argument.
warpgroup_mma_accumulator = Tensor


@builtin
def warpgroup_mma_init(value: Any):
    """An accumulator to start a chain of async warpgroup_mma calls with (the tensor itself)."""
    if not sem.is_tensor(value):
        raise sem.builder().error(f"warpgroup_mma_init takes a tensor, found {sem.describe(value)}")
    return value


@builtin
def warpgroup_mma_wait(num_outstanding: int = 0, deps: Sequence[Any] = ()):
    """Wait until at most `num_outstanding` async wgmma groups are in flight; returns the
    `deps` (one value, or a tuple for several), now safe to read."""
    b = sem.builder()
    if isinstance(num_outstanding, bool) or not isinstance(num_outstanding, int) \
            or not 0 <= num_outstanding <= 7:
        raise b.error(f"warpgroup_mma_wait num_outstanding must be a compile-time int in "
                      f"[0, 7], found {num_outstanding!r}")
    if sem.is_value(deps):
        deps = [deps]
    deps = list(deps)
    for d in deps:
        if not sem.is_tensor(d):
            raise b.error(f"warpgroup_mma_wait deps must be tensors (accumulators), found {sem.describe(d)}")
    results = tuple(ir.Value(d.type, d.handle.hint) for d in deps)
    b.emit(ir.WarpgroupMmaWait(results=results, deps=tuple(d.handle for d in deps),
                               pending=num_outstanding, loc=b.loc))
    wrapped = tuple(b.wrap(r) for r in results)
    return wrapped[0] if len(wrapped) == 1 else wrapped
