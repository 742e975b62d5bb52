"""Lowering of atomics: one PTX atom (or red) per element and program, old values to
every thread holding the element (the rules are compiler/atomics.py's).

1. Issue: the replica of each element with every free index bit clear issues it: a
   scalar on the partition's thread 0; a tensor's register r (free register bits clear)
   where the thread's free lane and warp bits are clear, and, outside partitions of a
   kernel with worker warps, only on the first num_warps warps (the others copy the code).
   The mask predicates the instruction too; a thread that does not issue gets 0.
2. Without a result (drop_unused_atomic_results), nothing more: `red` when PTX has one
   for the op and sem (relaxed, release), else `atom` with the old value dropped.
3. Old values: with `scratch_offset`, the issuing threads store each element's old value
   at its row-major slot of the scratch (masked-off ones store their 0 too), the
   partition meets at its barrier, and every thread loads the slots of the elements it
   holds; insert_barriers protects the scratch before its next write. Without scratch
   (no thread holds another's elements), repeated registers copy their owner register.
"""

from __future__ import annotations

from llvmlite import ir

from .. import atomics
from ..errors import CompilationError
from ..ir import AtomicCAS, AtomicRMW
from ..types import TensorType
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, lowers
from .indexing import element_pointer, owner_predicate
from .warp_ops import from_bits, to_bits

_REDUCTIONS = ("add", "max", "min", "and", "or", "xor")  # the ops PTX `red` has
_RED_SEMANTICS = ("relaxed", "release")


def _and(b: ir.IRBuilder, x, y):
    if x is None:
        return y
    return x if y is None else b.and_(x, y)


def _issuing_thread(ctx: Lowering, type_):
    """i1 true in threads that issue for the elements they own (None: every thread)."""
    if not isinstance(type_, TensorType):
        return ctx.cached("thread0", lambda p: p.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.I32, 0)))
    layout = type_.layout
    if layout.bases.get("block"):
        raise CompilationError("atomics on tensors spread over the CTAs of a cluster are not supported",
                               suggestion="use a layout without block bases")
    masks = atomics.replica_masks(layout, ctx.num_warps)
    owner = owner_predicate(ctx, layout)  # the layout's free lane and warp bits clear
    missing = {dim: masks[dim] & ~layout.free_variable_masks().get(dim, 0) for dim in ("lane", "warp")}
    for dim, mask in missing.items():  # lanes and warps beyond the layout's bases
        if mask:
            clear = ctx.cached(("clear", dim, mask), lambda p, dim=dim, mask=mask: p.icmp_unsigned(
                "==", p.and_(ctx.hardware_index(dim), ir.Constant(T.I32, mask)), ir.Constant(T.I32, 0)))
            owner = _and(ctx.builder, owner, clear)
    if ctx.partition is None and ctx.kernel.total_warps > ctx.kernel.num_warps:
        first_copy = ctx.cached("first_copy", lambda p: p.icmp_unsigned(
            "<", ctx.special_register("tid.x"), ir.Constant(T.I32, 32 * ctx.kernel.num_warps)))
        owner = _and(ctx.builder, owner, first_copy)
    return owner


def _issue(ctx: Lowering, op, kind: str, element, pointer, value, compare, predicate, returns: bool):
    """One atom/red where `predicate` holds; the old value (0 elsewhere) when `returns`."""
    b = ctx.builder
    ptx_type = ptx_asm.atomic_type(kind, element.name)
    value_bits = to_bits(b, value)
    if predicate is None:
        predicate = ir.Constant(T.I1, 1)
    if not returns and kind in _REDUCTIONS and op.sem in _RED_SEMANTICS:
        text, constraints = ptx_asm.global_reduction(kind, ptx_type, op.sem, op.scope)
        function_type = ir.FunctionType(ir.VoidType(), [T.GLOBAL_PTR, value_bits.type, T.I1])
        b.asm(function_type, text, constraints, [pointer, value_bits, predicate], side_effect=True)
        return None
    text, constraints = ptx_asm.global_atomic(kind, ptx_type, op.sem, op.scope)
    operands = [pointer] + ([to_bits(b, compare)] if compare is not None else []) + [value_bits, predicate]
    function_type = ir.FunctionType(value_bits.type, [o.type for o in operands])
    old = b.asm(function_type, text, constraints, operands, side_effect=True)
    return from_bits(b, old, value.type) if returns else None


def _through_scratch(ctx: Lowering, op, issuer, old: list, issued: list) -> list:
    """Issuing threads store the old values at their elements' slots; after the barrier,
    every thread loads the slots of the elements it holds."""
    b = ctx.builder
    if op.scratch_offset is None:
        raise CompilationError("an atomic whose old values other threads hold has no scratch offset",
                               op.loc, suggestion="run allocate_shared_memory before the backend")
    base = ctx.shared_pointer(op.scratch_offset)
    memory = old[issued[0]].type
    if not isinstance(op.result.type, TensorType):
        with b.if_then(issuer):
            b.store(old[0], base)
        ctx.barrier()
        return [b.load(base, typ=memory)]
    offsets = atomics.flat_offsets(op.result.type.layout)
    if issuer is None:
        issuer = ir.Constant(T.I1, 1)
    with b.if_then(issuer):
        for register in issued:
            b.store(old[register], element_pointer(ctx, base, memory, offsets, register))
    ctx.barrier()
    return [b.load(element_pointer(ctx, base, memory, offsets, register), typ=memory)
            for register in range(len(old))]


@lowers(AtomicRMW, AtomicCAS)
def lower_atomic(ctx: Lowering, op) -> None:
    kind = atomics.kind_of(op)
    element = atomics.element_of(op)
    if element.name not in atomics.ELEMENT_TYPES[kind]:
        raise CompilationError(f"atomic_{kind} does not support {element} elements", op.loc)
    type_ = op.pointer.type
    count = T.register_count(type_) if isinstance(type_, TensorType) else 1
    pointers = ctx.registers(op.pointer, count)
    values = ctx.registers(op.value, count)
    compares = ctx.registers(op.compare, count) if isinstance(op, AtomicCAS) else (None,) * count
    masks = ctx.registers(op.mask, count) if op.mask is not None else (None,) * count
    issuer = _issuing_thread(ctx, type_)
    owners = atomics.owner_registers(type_.layout) if isinstance(type_, TensorType) else (0,)
    issued = [r for r in range(count) if owners[r] == r]
    returns = op.result is not None
    old = [None] * count
    for register in issued:
        predicate = _and(ctx.builder, issuer, masks[register])
        old[register] = _issue(ctx, op, kind, element, pointers[register], values[register],
                               compares[register], predicate, returns)
    if not returns:
        return
    if atomics.needs_scratch(op, ctx.num_warps) or op.scratch_offset is not None:
        old = _through_scratch(ctx, op, issuer, old, issued)
    else:
        old = [old[owners[r]] for r in range(count)]
    ctx.define(op.result, tuple(old) if isinstance(op.result.type, TensorType) else old[0])
