"""Lowering of tensor maps a kernel writes itself (TensormapReplace, TensormapFence).

A map is made in a 128-byte global slot from a template map the host encoded (element
type, box, swizzle): one thread copies the template into the slot, replaces its global
address, dims and strides (tensormap.replace), and releases it to the tensormap proxy;
after a barrier every thread acquires the slot before its TMA copies read it (PTX ISA,
tensormap.replace and fence.proxy.tensormap::generic). The descriptor value is the slot's
address, as a descriptor parameter's is the parameter's.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..hardware import TENSOR_MAP_BYTES
from ..ir import TensormapFence, TensormapReplace
from ..types import TensorDescriptorType
from . import llvm_types as T
from . import ptx_asm
from .async_common import elected
from .context import Lowering, lowers

TENSOR_MAP_WORDS = TENSOR_MAP_BYTES // 8  # copied as 64-bit words


def _address(ctx: Lowering, value) -> ir.Value:
    lowered = ctx.scalar(value)
    return ctx.builder.ptrtoint(lowered, T.I64) if isinstance(lowered.type, ir.PointerType) else lowered


@lowers(TensormapReplace)
def lower_tensormap_replace(ctx: Lowering, op: TensormapReplace) -> None:
    type_ = op.result.type
    if not isinstance(type_, TensorDescriptorType) or len(op.shape) != type_.rank or len(op.strides) != type_.rank:
        raise CompilationError(f"`{op.NAME}`: needs a descriptor result and one dim and stride per dim of the "
                               f"box, found {type_}, {len(op.shape)} dims, {len(op.strides)} strides", op.loc)
    b = ctx.builder
    slot, template = _address(ctx, op.slot), _address(ctx, op.template)
    writer = elected(ctx)
    with b.if_then(writer):
        source = b.inttoptr(template, T.GENERIC_PTR)
        target = b.inttoptr(slot, T.GENERIC_PTR)
        for word in range(TENSOR_MAP_WORDS):
            index = [ir.Constant(T.I32, word)]
            value = b.load(b.gep(source, index, source_etype=T.I64), typ=T.I64)
            b.store(value, b.gep(target, index, source_etype=T.I64))
    ctx.inline_asm(ptx_asm.tensormap_replace("global_address"), [slot, _address(ctx, op.address), writer])
    element_bytes = T.memory_bytes(type_.element)
    innermost_first = list(reversed(range(type_.rank)))
    for ordinal, dim in enumerate(innermost_first):
        extent = ctx.scalar(op.shape[dim])
        extent = b.trunc(extent, T.I32) if extent.type.width > 32 else b.zext(extent, T.I32) \
            if extent.type.width < 32 else extent
        ctx.inline_asm(ptx_asm.tensormap_replace("global_dim", ordinal), [slot, extent, writer])
    for ordinal, dim in enumerate(innermost_first[1:]):
        stride = ctx.scalar(op.strides[dim])
        stride = b.sext(stride, T.I64) if stride.type.width < 64 else stride
        stride_bytes = b.mul(stride, ir.Constant(T.I64, element_bytes))
        ctx.inline_asm(ptx_asm.tensormap_replace("global_stride", ordinal), [slot, stride_bytes, writer])
    ctx.define(op.result, slot)


@lowers(TensormapFence)
def lower_tensormap_fence(ctx: Lowering, op: TensormapFence) -> None:
    ctx.inline_asm(ptx_asm.tensormap_release(), [elected(ctx)])
    ctx.barrier()
    ctx.inline_asm(ptx_asm.tensormap_acquire(), [_address(ctx, op.descriptor)])
