"""Lowering of Hopper's async machinery: mbarriers, TMA copies and cp.async.

"One thread issues" ops (mbarrier init/expect/arrive/invalidate, TMA load/store) are
predicated on thread 0 of the partition running them (of the CTA outside
warp_specialize), and on the op's `pred` when it has one; the other threads skip them.
An arrive first syncs the threads that run it (the partition's named barrier, bar.sync 0
outside warp_specialize, bar.warp.sync for one warp), so their earlier work is ordered
before the single arrival; a per-warp arrive syncs each warp alone (bar.warp.sync) and
its lane 0 arrives. A wait is executed by every thread.

TMA descriptors: the lowered descriptor value is the tensor map's generic address (an
i64 or a pointer). TMA moves whole boxes between global memory and a shared buffer laid
out by the descriptor's layout (a box wider than a swizzle row as several copies, one
row-wide column strip each, the tensor map encoding one strip); the hardware applies the swizzle from address bits, so
the buffer must start on the swizzle's period (its layout's XOR pattern repeat, at least
the 128 bytes the ISA asks for).

cp.async: each thread copies the elements it owns of the pointer tensor into the same
coordinates of the buffer, `vector` elements (the global side proven by
vectorize_memory) at a time when they are also consecutive and aligned in shared memory,
as 4-, 8- or 16-byte copies; a masked-off copy reads 0 bytes and zero-fills. Accesses
narrower than 4 bytes (cp.async's minimum) fall back to a plain load and shared store,
which have landed before any later wait_group returns, as the copy would have.
"""

from __future__ import annotations

from llvmlite import ir

from ...layouts import LinearLayout
from ...layouts.banks import vector_width_of
from ...layouts.rules import is_row_major
from ..errors import CompilationError
from ..ir import (AsyncBulkCopyGlobalToShared, AsyncCopyCommitGroup, AsyncCopyGlobalToShared, AsyncCopyWaitGroup,
                  ClusterBarrier, MBarrierArrive, MBarrierExpect, MBarrierInit, MBarrierInvalidate, MBarrierWait, Op,
                  TmaAsyncCopyGlobalToShared, TmaAsyncCopySharedToGlobal, TmaAsyncReduceAdd, TmaStoreWait, Value)
from ..types import TensorDescriptorType
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, SharedView, lowers
from .indexing import addressing_of, duplicate_registers, element_pointer, offset_map, owner_predicate

TMA_MIN_ALIGN = 128  # bytes: cp.async.bulk.tensor's shared-memory operand
MAX_COPY_BYTES = 16


# --------------------------------------------------------------------- helpers
def _elected(ctx: Lowering) -> ir.Value:
    """i1: this thread is thread 0 of the partition (of the CTA outside partitions)."""
    return ctx.cached("thread0", lambda b: b.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.I32, 0)))


def _lane_zero(ctx: Lowering) -> ir.Value:
    """i1: this thread is lane 0 of its warp. A per-warp arrive runs after bar.warp.sync
    over the whole warp, so lane 0 is there to arrive for it: elect.sync would pick the
    same lane, at an instruction per arrive (five a key step in the attention kernel),
    where this predicate is computed once."""
    return ctx.cached("lane0", lambda b: b.icmp_unsigned("==", ctx.hardware_index("lane"), ir.Constant(T.I32, 0)))


def _issuer(ctx: Lowering, pred, thread: ir.Value | None = None) -> ir.Value:
    """i1: `thread` (thread 0 of the partition: `_elected`) where the op's `pred` holds."""
    thread = _elected(ctx) if thread is None else thread
    return thread if pred is None else ctx.builder.and_(thread, ctx.scalar(pred))


def _shared_address(ctx: Lowering, view: SharedView) -> ir.Value:
    """32-bit shared address of the view's element at coordinates 0."""
    b = ctx.builder
    pointer = view.base
    if view.xor:
        pointer = b.gep(pointer, [ir.Constant(T.I32, view.xor)], source_etype=T.memory_type(view.type.element))
    return b.ptrtoint(pointer, T.I32)


def _barrier_address(ctx: Lowering, value: Value) -> ir.Value:
    return _shared_address(ctx, ctx.shared(value))


def _i32(ctx: Lowering, value: ir.Value) -> ir.Value:
    width = value.type.width
    if width == 32:
        return value
    return ctx.builder.trunc(value, T.I32) if width > 32 else ctx.builder.zext(value, T.I32)


def _running_warps(ctx: Lowering) -> int:
    if ctx.partition is not None:
        return ctx.partition.num_warps
    if ctx.barrier_threads is not None:
        return ctx.barrier_threads // 32
    return ctx.kernel.total_warps


# --------------------------------------------------------------------- mbarrier
@lowers(MBarrierInit)
def lower_mbarrier_init(ctx: Lowering, op: MBarrierInit) -> None:
    ctx.inline_asm(ptx_asm.mbarrier_init(op.count), [_barrier_address(ctx, op.barrier), _elected(ctx)])


@lowers(MBarrierExpect)
def lower_mbarrier_expect(ctx: Lowering, op: MBarrierExpect) -> None:
    operands = [_barrier_address(ctx, op.barrier), _issuer(ctx, op.pred)]
    if isinstance(op.nbytes, int):
        ctx.inline_asm(ptx_asm.mbarrier_expect(op.nbytes), operands)
    else:
        ctx.inline_asm(ptx_asm.mbarrier_expect(None), operands + [_i32(ctx, ctx.scalar(op.nbytes))])


@lowers(MBarrierArrive)
def lower_mbarrier_arrive(ctx: Lowering, op: MBarrierArrive) -> None:
    address = _barrier_address(ctx, op.barrier)
    if op.per_warp or op.per_thread:
        if ctx.partition is None and ctx.kernel.total_warps > ctx.kernel.num_warps:
            which = "per-warp" if op.per_warp else "per-thread"
            raise CompilationError(
                f"a {which} mbarrier arrive outside warp_specialize, in a kernel with worker warps: "
                "those warps run this code too and would arrive as well", op.loc,
                suggestion="arrive per warp or per thread inside a partition, or arrive once")
        if op.per_warp:
            _warp_sync(ctx)
            pred = _issuer(ctx, op.pred, _lane_zero(ctx))
        else:
            pred = ir.Constant(T.I1, 1) if op.pred is None else ctx.scalar(op.pred)
    else:
        if _running_warps(ctx) > 1:
            ctx.barrier()
        else:
            _warp_sync(ctx)
        pred = _issuer(ctx, op.pred)
    count, counted = op.count, []  # a run-time count is the asm's last operand
    if not isinstance(count, int):
        count, counted = None, [_i32(ctx, ctx.scalar(op.count))]
    if op.cta is not None:  # on the barrier at the same offset in the CTA of cluster rank `cta`
        rank = _i32(ctx, ctx.scalar(op.cta))
        ctx.inline_asm(ptx_asm.mbarrier_arrive_remote(count, op.scope), [address, pred, rank] + counted)
    else:
        ctx.inline_asm(ptx_asm.mbarrier_arrive(count), [address, pred] + counted)


@lowers(ClusterBarrier)
def lower_cluster_barrier(ctx: Lowering, op: ClusterBarrier) -> None:
    if ctx.partition is not None:
        raise CompilationError(
            "cluster_barrier inside a warp_specialize partition: every thread of the CTA must "
            "reach it together", op.loc, suggestion="call ll.cluster_barrier() before or after warp_specialize")
    ctx.inline_asm(ptx_asm.cluster_barrier(), [])


def _warp_sync(ctx: Lowering) -> None:
    ctx.intrinsic("llvm.nvvm.bar.warp.sync", ir.VoidType(), [ir.Constant(T.I32, -1)])


@lowers(MBarrierWait)
def lower_mbarrier_wait(ctx: Lowering, op: MBarrierWait) -> None:
    parity = ctx.builder.and_(_i32(ctx, ctx.scalar(op.phase)), ir.Constant(T.I32, 1))
    ctx.inline_asm(ptx_asm.mbarrier_wait(), [_barrier_address(ctx, op.barrier), parity])


@lowers(MBarrierInvalidate)
def lower_mbarrier_invalidate(ctx: Lowering, op: MBarrierInvalidate) -> None:
    ctx.inline_asm(ptx_asm.mbarrier_invalidate(), [_barrier_address(ctx, op.barrier), _elected(ctx)])


# --------------------------------------------------------------------- TMA
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
    return _shared_address(ctx, view)


def _coordinates(ctx: Lowering, op: Op) -> list[ir.Value]:
    """PTX's order: innermost dim first (the IR lists them outermost first)."""
    return [_i32(ctx, ctx.scalar(c)) for c in reversed(op.coords)]


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
    barrier = _barrier_address(ctx, op.barrier)
    coords = _coordinates(ctx, op)
    issuer = _issuer(ctx, op.pred)
    mask = [] if op.multicast is None else [ctx.builder.trunc(_i32(ctx, ctx.scalar(op.multicast)), T.I16)]
    for address, strip in _strips(ctx, type_, destination, coords):
        ctx.inline_asm(ptx_asm.tma_load(type_.rank, op.multicast is not None),
                       [address, descriptor, barrier, *strip, issuer, *mask])


@lowers(AsyncBulkCopyGlobalToShared)
def lower_async_bulk_copy_global_to_shared(ctx: Lowering, op: AsyncBulkCopyGlobalToShared) -> None:
    view = ctx.shared(op.buffer)
    if not is_row_major(view.addressing, view.type.shape):
        raise CompilationError(f"`{op.NAME}`: the buffer is not laid out plainly row-major, as a "
                               "bulk copy writes it", op.loc, found=str(view.type.encoding or view.type.layout))
    if (view.xor * T.memory_bytes(view.type.element)) % 16:
        raise CompilationError(f"`{op.NAME}`: the buffer view does not start on 16 bytes", op.loc)
    source = ctx.builder.ptrtoint(ctx.scalar(op.pointer), T.I64)
    ctx.inline_asm(ptx_asm.bulk_load(), [_shared_address(ctx, view), source, _i32(ctx, ctx.scalar(op.nbytes)),
                                         _barrier_address(ctx, op.barrier), _issuer(ctx, op.pred)])


@lowers(TmaAsyncCopySharedToGlobal)
def lower_tma_async_copy_shared_to_global(ctx: Lowering, op: TmaAsyncCopySharedToGlobal) -> None:
    descriptor, type_ = _descriptor(ctx, op)
    strips = _strips(ctx, type_, _box_address(ctx, op, type_), _coordinates(ctx, op))
    for j, (source, coords) in enumerate(strips):  # one bulk group for the box: store_wait counts boxes
        ctx.inline_asm(ptx_asm.tma_store(type_.rank, commit=j == len(strips) - 1),
                       [descriptor, source, *coords, _elected(ctx)])


# --------------------------------------------------------------------- TMA reduce-add
@lowers(TmaAsyncReduceAdd)
def lower_tma_async_reduce_add(ctx: Lowering, op: TmaAsyncReduceAdd) -> None:
    """As a TMA store, with cp.reduce.async.bulk.tensor's add: one bulk group a box."""
    descriptor, type_ = _descriptor(ctx, op)
    strips = _strips(ctx, type_, _box_address(ctx, op, type_), _coordinates(ctx, op))
    for j, (source, coords) in enumerate(strips):
        ctx.inline_asm(ptx_asm.tma_reduce_add(type_.rank, commit=j == len(strips) - 1),
                       [descriptor, source, *coords, _elected(ctx)])


@lowers(TmaStoreWait)
def lower_tma_store_wait(ctx: Lowering, op: TmaStoreWait) -> None:
    ctx.inline_asm(ptx_asm.tma_store_wait(op.pending), [])


# --------------------------------------------------------------------- cp.async
def async_copy_width(op: AsyncCopyGlobalToShared, offsets: LinearLayout, xor: int, element_bytes: int) -> int:
    """Elements per copy: what vectorize_memory proved for the global side, within what
    is consecutive and aligned in shared memory, at most 16 bytes."""
    width = min(max(op.vector, 1), vector_width_of(offsets, 8 * element_bytes), MAX_COPY_BYTES // element_bytes)
    while width > 1 and xor % width:
        width //= 2
    return width


@lowers(AsyncCopyGlobalToShared)
def lower_async_copy_global_to_shared(ctx: Lowering, op: AsyncCopyGlobalToShared) -> None:
    b = ctx.builder
    view = ctx.shared(op.buffer)
    element = view.type.element
    element_bytes = T.memory_bytes(element)
    layout = op.pointer.type.layout
    count = T.register_count(op.pointer.type)
    offsets = offset_map(layout, view.addressing)
    width = min(async_copy_width(op, offsets, view.xor, element_bytes), count)
    nbytes = width * element_bytes
    pointers = ctx.registers(op.pointer, count)
    masks = ctx.registers(op.mask, count) if op.mask is not None else None
    owner = owner_predicate(ctx, layout)
    duplicates = duplicate_registers(layout)
    memory = T.memory_type(element)
    for start in range(0, count, width):
        if start & duplicates:
            continue
        destination = element_pointer(ctx, view.base, memory, offsets, start, view.xor)
        mask = masks[start] if masks is not None else None
        if nbytes < 4:
            _copy_through_registers(ctx, pointers[start:start + width], mask, owner, destination, element)
            continue
        size = ir.Constant(T.I32, nbytes)
        if mask is not None:
            size = b.select(mask, size, ir.Constant(T.I32, 0))
        args = [b.ptrtoint(destination, T.I32), pointers[start], size]
        if owner is not None:
            args.append(owner)
        ctx.inline_asm(ptx_asm.async_copy(nbytes, owner is not None), args)


def _copy_through_registers(ctx: Lowering, pointers, mask, owner, destination, element) -> None:
    """Elements narrower than cp.async's 4 bytes: a predicated load, then a shared store."""
    from .lower_memory import load_group  # the masked global load of lower_memory

    b = ctx.builder
    memory = T.memory_type(element)
    values = load_group(ctx, pointers[0], mask, element, len(pointers))
    if len(values) == 1:
        data = values[0]
    else:
        data = ir.Constant(ir.VectorType(memory, len(values)), None)
        for i, value in enumerate(values):
            data = b.insert_element(data, value, ir.Constant(T.I32, i))
    align = len(values) * T.memory_bytes(element)
    if owner is None:
        b.store(data, destination, align=align)
        return
    with b.if_then(owner):
        b.store(data, destination, align=align)


@lowers(AsyncCopyCommitGroup)
def lower_async_copy_commit_group(ctx: Lowering, op: AsyncCopyCommitGroup) -> None:
    ctx.inline_asm(ptx_asm.async_commit_group(), [])


@lowers(AsyncCopyWaitGroup)
def lower_async_copy_wait_group(ctx: Lowering, op: AsyncCopyWaitGroup) -> None:
    ctx.inline_asm(ptx_asm.async_wait_group(op.pending), [])
