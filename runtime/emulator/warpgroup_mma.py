"""Emulation rules: wgmma (warpgroup_mma) and its wait; mma.sync is in mma_v2.py.

`a @ b + acc` is computed in float64 from the operands' decoded values (bf16, fp16 and
the fp8 formats decode exactly; fp32 is read as tf32, its low mantissa bits dropped) and
rounded once to the accumulator's type; the GPU's
tensor cores accumulate in fp32 with their own (truncating) additions, so results agree
to fp32 accumulation error, not bit for bit.

Shared operands are read the way the hardware reads them: the op's plan (recorded by
the plan_data_movement pass, compiler/warpgroup_mma_plan.py) holds the matrix descriptors the
backend emits for the view (swizzle mode, K- or MN-major, LBO and SBO, one start address
per instruction tile: 64 rows of A, the accumulator's instruction N of B, 32 bytes of K)
less the view's base address, which is added here, and `decode` gives the absolute
shared byte addresses each descriptor reads (the swizzle XORs absolute address bits). A
view no descriptor can express fails the pass; a base not aligned for its swizzle is an
error here as in the backend. A
register A operand is collected from its DotOperandLayout registers (every copy of an
element must agree). The result lands in the accumulator's layout.

The async protocol: an async wgmma's shared reads stay in flight (overwriting those
bytes is a race) and its result is an `InFlight` value until a warpgroup_mma_wait
retires its group; a synchronous wgmma waits for every group of its partition. Shared
operands must be ordered after their writers and, when written by ordinary stores,
fenced (fence_async_shared) before the barrier that published them.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

import numpy as np

from ...compiler import ir
from ...compiler.warpgroup_mma_descriptors import OperandPlan, WgmmaError, check_alignment, decode
from .async_common import async_state, byte_rows, partition_warps, predicate
from .dtypes import element_bytes, finish
from .errors import EmulationError
from .interpreter import InFlight, SharedRef
from .registers import registers_to_tensor, tensor_to_registers
from .rules import EMULATION_RULES as RULES


@dataclass(eq=False)
class DotGroup:
    """One async wgmma (a wgmma.commit_group of one op): its in-flight shared reads."""

    op: ir.Op
    reads: tuple
    retired: bool = False


def _retire(cta, group: DotGroup) -> None:
    for record in group.reads:
        cta.shared.ordering.retire(record)
    group.retired = True


def _retire_all_but(cta, pending: int) -> None:
    groups = async_state(cta).dot_groups
    while len(groups) > pending:
        _retire(cta, groups.pop(0))


_MAX_ALIGNMENT = 1024  # the largest swizzle repeat (8 rows of 128 bytes)


def _descriptor_addresses(ref: SharedRef, plan: OperandPlan, mn_dim: int) -> np.ndarray:
    """Byte addresses the op's planned descriptors read for every element of the view, in
    the view's shape; `mn_dim` is the view's M (A) or N (B) dim. The plan is the static
    part of each descriptor; the view's offset is the run-time start."""
    alignment = min(ref.offset & -ref.offset, _MAX_ALIGNMENT) if ref.offset else _MAX_ALIGNMENT
    check_alignment(plan, alignment)
    shape = ref.type.shape
    size_mn, size_k = shape[mn_dim], shape[1 - mn_dim]
    tile_mn, tile_k = plan.tile_mn, plan.tile_k
    out = np.empty((size_mn, size_k), np.int64)
    for m0 in range(0, size_mn, tile_mn):
        for k0 in range(0, size_k, tile_k):
            descriptor = plan.descriptor(ref.offset + plan.start_offset(m0, k0))
            out[m0:m0 + tile_mn, k0:k0 + tile_k] = decode(descriptor.value, plan.major, plan.element_bits,
                                                          tile_mn, tile_k)
    return out if mn_dim == 0 else out.T


def _shared_operand(cta, op, ref: SharedRef, name: str):
    """(values as float64 in the view's shape, in-flight read record)."""
    plan = op.plan.a if name == "a" else op.plan.b
    mn_dim = 0 if name == "a" else 1
    # Descriptors hold the offset in the CTA's own shared memory (its window of a cluster's;
    # the backend masks the rank bits off the address), and read from there.
    base = cta.shared_base
    local = dataclasses.replace(ref, offset=ref.offset - base)
    try:
        addresses = cta.memo(op, ("descriptors", name, ref.offset),
                             lambda: _descriptor_addresses(local, plan, mn_dim) + base)
    except WgmmaError as error:
        raise EmulationError(f"wgmma operand {name} ({ref.type}): {error}", op.loc) from None
    element = ref.type.element
    record = cta.shared.ordering.async_read(
        byte_rows(addresses, element_bytes(element)), partition_warps(cta), op,
        f"wgmma (operand {name})", "warpgroup_mma_wait")
    values = cta.shared.read(addresses, element, op, lambda position: f"wgmma operand {name}",
                             track=False)
    if element.name == "fp32":
        values = as_tf32(values)
    return np.asarray(values, dtype=np.float64), record


def as_tf32(values) -> np.ndarray:
    """fp32 values as wgmma's .tf32 inputs read them: the low 13 mantissa bits ignored
    (PTX ISA 9.7.15.5, "wgmma.mma_async": fp32 operands in .tf32 format)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def _accumulator(cta, op: ir.WarpgroupMma):
    acc = cta.peek(op.acc)
    if type(acc) is InFlight:
        # Chaining into the next wgmma, as the hardware allows, in flight or retired (a wait,
        # its result used or not, retires the groups it leaves; the next wgmma's fence
        # orders this one's read of the registers after that wait).
        if not acc.group.retired and acc.group not in async_state(cta).dot_groups:
            raise acc.error()
        acc = acc.registers
    return acc


@RULES.register(ir.WarpgroupMma)
def warpgroup_mma(cta, op: ir.WarpgroupMma) -> None:
    if cta.num_warps % 4 or cta.warp_base % 4:
        raise EmulationError(f"wgmma runs on whole warpgroups (4 warps starting at a multiple of "
                             f"4); this partition has warps {cta.warp_base}.."
                             f"{cta.warp_base + cta.num_warps - 1}", op.loc)
    if op.plan is None:
        raise EmulationError("warpgroup_mma has no plan: run the plan_data_movement pass first", op.loc)
    layout = cta.layout(op.result.type)
    acc = _accumulator(cta, op)
    use_acc = predicate(cta, op.use_acc, op)
    reads = []
    if isinstance(op.a.type, ir.SharedType):
        a, record = _shared_operand(cta, op, cta[op.a], "a")
        reads.append(record)
    else:
        a = registers_to_tensor(cta[op.a], cta.layout(op.a.type)).astype(np.float64)
    if not isinstance(op.b.type, ir.SharedType):
        raise EmulationError("wgmma reads B from shared memory", op.loc)
    b, record = _shared_operand(cta, op, cta[op.b], "b")
    reads.append(record)
    out = a @ b
    if use_acc:
        out = out + registers_to_tensor(acc, cta.layout(op.acc.type)).astype(np.float64)
    registers = finish(op.result.type.element,
                       tensor_to_registers(out, layout, cta.num_warps))
    group = DotGroup(op, tuple(reads))
    async_state(cta).dot_groups.append(group)
    if op.is_async:
        cta.bind(op.result, InFlight(registers, op, group))
    else:
        _retire_all_but(cta, 0)  # wgmma.wait_group 0 right after it
        cta.bind(op.result, registers)


@RULES.register(ir.WarpgroupMmaWait)
def warpgroup_mma_wait(cta, op: ir.WarpgroupMmaWait) -> None:
    _retire_all_but(cta, op.pending)
    for result, dep in zip(op.results, op.deps):
        x = cta.peek(dep)
        if type(x) is InFlight and x.group.retired:
            x = x.registers
        cta.bind(result, x)
