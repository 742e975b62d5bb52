"""Lowering of TMA copies (Gluon's `tma` module) and the bulk copy beside them.

The lowered descriptor value is the tensor map's generic address (an i64 or a pointer).
TMA moves whole boxes between global memory and a shared buffer laid out by the
descriptor's layout (a box wider than a swizzle row as several copies, one row-wide
column strip each, the tensor map encoding one strip); the hardware applies the swizzle
from address bits, so the buffer must start on the swizzle's period (its layout's XOR
pattern repeat, at least the 128 bytes the ISA asks for). Loads and stores are issued by
one thread (async_common.issuer).
"""

from __future__ import annotations

from llvmlite import ir

from ...layouts import LinearLayout
from ...layouts.rules import is_row_major
from ..errors import CompilationError
from ..ir import (AsyncBulkCopyGlobalToShared, Op, TmaAsyncCopyGlobalToShared, TmaAsyncCopySharedToGlobal, TmaAsyncReduceAdd,
                  TmaStoreWait)
from ..types import TensorDescriptorType
from . import llvm_types as T
from . import ptx_asm
from .async_common import as_i32, barrier_address, elected, issuer, shared_address
from .context import Lowering, lowers
from .indexing import addressing_of

TMA_MIN_ALIGN = 128  # bytes: cp.async.bulk.tensor's shared-memory operand


def swizzle_period_bytes(layout: LinearLayout, element_bytes: int) -> int:
    """Bytes after which a shared layout's XOR pattern repeats (at least 128): offset
    bits up to the highest one whose basis mixes coordinates (a swizzle) are covered."""
    mixed = 0
    for bit, basis in enumerate(layout.bases.get("offset", ())):
        nonzero = [c for c in basis if c]
        if len(nonzero) > 1 or any(c & (c - 1) for c in nonzero):
            mixed = bit + 1
    return max(TMA_MIN_ALIGN, (1 << mixed) * element_bytes)


def _descriptor(ctx: Lowering, op: Op) -> tuple[ir.Value, TensorDescriptorType]:
    type_ = op.descriptor.type
    if not isinstance(type_, TensorDescriptorType):
        raise CompilationError(f"`{op.NAME}` needs a tensor descriptor, found {type_}", op.loc)
    address = ctx.scalar(op.descriptor)
    if isinstance(address.type, ir.PointerType):
        address = ctx.builder.ptrtoint(address, T.I64)
    elif address.type != T.I64:
        raise CompilationError(f"internal: descriptor lowered to {address.type}, not an address", op.loc)
    if len(op.coords) != type_.rank:
        raise CompilationError(f"`{op.NAME}` has {len(op.coords)} coordinates for a rank-{type_.rank} "
                               "descriptor", op.loc)
    return address, type_


def _box_address(ctx: Lowering, op: Op, type_: TensorDescriptorType) -> ir.Value:
    """The buffer's shared address, after checking it holds one box as TMA writes it."""
    view = ctx.shared(op.buffer)
    buffer = view.type
    if buffer.shape != type_.block_shape or buffer.element != type_.element:
        raise CompilationError(
            f"`{op.NAME}`: the buffer is {buffer} but the descriptor's box is "
            f"{list(type_.block_shape)} of {type_.element}", op.loc,
            suggestion="allocate the buffer with the descriptor's block_shape and dtype")
    # Bases only: a window's addressing maps into its whole allocation's offset range.
    if view.addressing.bases != addressing_of(type_.layout).bases:
        raise CompilationError(
            f"`{op.NAME}`: the buffer's shared layout is not the descriptor's box layout; TMA "
            "writes a box in the descriptor's swizzle", op.loc,
            expected=str(type_.encoding or type_.layout), found=str(buffer.encoding or buffer.layout),
            suggestion="allocate the buffer with layout=desc.layout")
    bytes_ = T.memory_bytes(buffer.element)
    period = swizzle_period_bytes(type_.layout, bytes_)
    if (view.xor * bytes_) % period:
        raise CompilationError(
            f"`{op.NAME}`: the buffer view starts {view.xor * bytes_} bytes into its allocation, "
            f"not on a multiple of {period} bytes (the box layout's swizzle period)", op.loc,
            suggestion="slice the buffer at a multiple of the swizzle period, or copy whole buffers")
    return shared_address(ctx, view)


def _coordinates(ctx: Lowering, op: Op) -> list[ir.Value]:
    """PTX's order: innermost dim first (the IR lists them outermost first)."""
    return [as_i32(ctx, ctx.scalar(c)) for c in reversed(op.coords)]


def _strips(ctx: Lowering, type_: TensorDescriptorType, address: ir.Value, coords: list):
    """(shared address, coordinates innermost first) of each copy of the box at `address`
    and `coords`: one, or for a box wider than a swizzle row one per row-wide column strip,
    `strip_bytes` apart in shared memory and one strip's width apart along the inner dim."""
    if type_.copies == 1:
        return [(address, coords)]
    b, width = ctx.builder, type_.copy_box[-1]
    return [(b.add(address, ir.Constant(T.I32, j * type_.strip_bytes)),
             [b.add(coords[0], ir.Constant(T.I32, j * width)), *coords[1:]]) for j in range(type_.copies)]


@lowers(TmaAsyncCopyGlobalToShared)
def lower_tma_async_copy_global_to_shared(ctx: Lowering, op: TmaAsyncCopyGlobalToShared) -> None:
    descriptor, type_ = _descriptor(ctx, op)
    destination = _box_address(ctx, op, type_)
    barrier = barrier_address(ctx, op.barrier)
    coords = _coordinates(ctx, op)
    issuing = issuer(ctx, op.pred)
    mask = [] if op.multicast is None else [ctx.builder.trunc(as_i32(ctx, ctx.scalar(op.multicast)), T.I16)]
    for address, strip in _strips(ctx, type_, destination, coords):
        ctx.inline_asm(ptx_asm.tma_load(type_.rank, op.multicast is not None),
                       [address, descriptor, barrier, *strip, issuing, *mask])


@lowers(AsyncBulkCopyGlobalToShared)
def lower_async_bulk_copy_global_to_shared(ctx: Lowering, op: AsyncBulkCopyGlobalToShared) -> None:
    view = ctx.shared(op.buffer)
    if not is_row_major(view.addressing, view.type.shape):
        raise CompilationError(f"`{op.NAME}`: the buffer is not laid out plainly row-major, as a "
                               "bulk copy writes it", op.loc, found=str(view.type.encoding or view.type.layout))
    if (view.xor * T.memory_bytes(view.type.element)) % 16:
        raise CompilationError(f"`{op.NAME}`: the buffer view does not start on 16 bytes", op.loc)
    source = ctx.builder.ptrtoint(ctx.scalar(op.pointer), T.I64)
    ctx.inline_asm(ptx_asm.bulk_load(), [shared_address(ctx, view), source, as_i32(ctx, ctx.scalar(op.nbytes)),
                                         barrier_address(ctx, op.barrier), issuer(ctx, op.pred)])


def _box_from_shared(ctx: Lowering, op: Op, instruction) -> None:
    """A shared box sent to global memory strip by strip (`instruction`: ptx_asm.tma_store
    or tma_reduce_add), in one bulk group for the box: store_wait counts boxes."""
    descriptor, type_ = _descriptor(ctx, op)
    strips = _strips(ctx, type_, _box_address(ctx, op, type_), _coordinates(ctx, op))
    for j, (source, coords) in enumerate(strips):
        ctx.inline_asm(instruction(type_.rank, commit=j == len(strips) - 1),
                       [descriptor, source, *coords, elected(ctx)])


@lowers(TmaAsyncCopySharedToGlobal)
def lower_tma_async_copy_shared_to_global(ctx: Lowering, op: TmaAsyncCopySharedToGlobal) -> None:
    _box_from_shared(ctx, op, ptx_asm.tma_store)


@lowers(TmaAsyncReduceAdd)
def lower_tma_async_reduce_add(ctx: Lowering, op: TmaAsyncReduceAdd) -> None:
    """As a TMA store, with cp.reduce.async.bulk.tensor's add."""
    _box_from_shared(ctx, op, ptx_asm.tma_reduce_add)


@lowers(TmaStoreWait)
def lower_tma_store_wait(ctx: Lowering, op: TmaStoreWait) -> None:
    ctx.inline_asm(ptx_asm.tma_store_wait(op.pending), [])
