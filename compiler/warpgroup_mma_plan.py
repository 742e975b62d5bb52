"""The plan of one warpgroup_mma: everything its instructions need that the IR fixes.

Recorded on the op by the plan_data_movement pass and only read after it: the backend
emits it, the emulator reads shared operands through it. The plan holds the PTX types,
the instruction's K and the number of K steps, the accumulator's m64nN tiling
(`AccumulatorPlan`), register A's packing or shared A's descriptor plan, and B's
descriptor plan. A descriptor plan is the static part of every descriptor (swizzle,
major-ness, LBO/SBO, the unswizzled offset of each tile and warpgroup): what is left
to run time is the view's base address, whose alignment is checked where it is known
(`check_alignment`: the backend from allocation, the emulator from the address itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..layouts import NVMMADistributedLayout
from .errors import CompilationError
from .ir import Value, WarpgroupMma, is_shared, is_tensor
from .types import TensorType
from .warpgroup_mma_descriptors import (AccumulatorPlan, OperandPlan, OperandView, WgmmaError, check_types, instruction_k,
                    plan_accumulator, plan_operand, plan_register_a)

M_PER_A_TILE = 64  # rows of A one instruction reads


@dataclass(frozen=True)
class DotPlan:
    """How one warpgroup_mma runs (module docstring).

    `types`: the PTX (atype, btype, dtype); `a`: shared A's descriptor plan, or None with
    `a_registers` ((tile row origin, k step), its 4 words of register indices) for register A.
    """

    types: tuple[str, str, str]
    bits: int
    k: int
    steps: int
    acc: AccumulatorPlan
    a: Optional[OperandPlan]
    a_registers: Optional[tuple[tuple[tuple[int, int], tuple[tuple[int, ...], ...]], ...]]
    b: OperandPlan


def describe(type_) -> str:
    return str(type_.encoding) if type_.encoding is not None else "a linear layout"


def operand_error(op: WarpgroupMma, value: Value, name: str, error: WgmmaError) -> CompilationError:
    """The error of a shared operand wgmma cannot read, naming the operand and its layout."""
    bits = value.type.element.bits
    suggestion = error.suggestion or (f"allocate it with NVMMASharedLayout.get_default_for("
                                      f"{list(value.type.shape)}, {bits}), the layout TMA writes")
    return CompilationError(f"warpgroup_mma: operand {name} ({value.type} in "
                            f"{describe(value.type)}): {error}", op.loc, suggestion=suggestion)


def _check_shapes(op: WarpgroupMma) -> None:
    a, b, acc, result = op.a.type, op.b.type, op.acc.type, op.result.type
    for name, t in (("a", a), ("b", b), ("acc", acc)):
        if len(t.shape) != 2:
            raise CompilationError(f"warpgroup_mma: {name} must be 2-D, found shape {list(t.shape)}", op.loc)
    if not isinstance(acc, TensorType) or acc.layout is None:
        raise CompilationError("warpgroup_mma: the accumulator must be a tensor with a layout", op.loc)
    if result.shape != acc.shape or result.element != acc.element or result.layout != acc.layout:
        raise CompilationError("warpgroup_mma: the result must have the accumulator's type", op.loc,
                               expected=str(acc), found=str(result))
    (m, k), (k2, n), (m2, n2) = a.shape, b.shape, acc.shape
    if k != k2 or m != m2 or n != n2:
        raise CompilationError(
            "warpgroup_mma: shapes do not chain: a is [M, K], b is [K, N], acc is [M, N]", op.loc,
            expected=f"a [{m2}, K], b [K, {n2}]", found=f"a {list(a.shape)}, b {list(b.shape)}, acc {list(acc.shape)}")
    encoding = acc.encoding
    if encoding is not None and not (isinstance(encoding, NVMMADistributedLayout) and encoding.version[0] == 3):
        raise CompilationError(
            f"warpgroup_mma: the accumulator is in {encoding}; wgmma writes an NVMMADistributedLayout "
            "with version [3, 0]", op.loc,
            suggestion="use NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * g, 1], instr_shape=[16, N, K])")


# The addressing and xor of a shared value (passes.shared_views), or a CompilationError.
ViewOf = Callable[[WarpgroupMma, Value, str], tuple]


def plan_warpgroup_mma(op: WarpgroupMma, view_of: ViewOf) -> DotPlan:
    """The op's plan, every tile's descriptors proved against the operands' addressing;
    CompilationError at the op's line when wgmma cannot run it."""
    _check_shapes(op)
    a, b, acc = op.a.type, op.b.type, op.acc.type
    try:
        types = check_types(a.element.name, b.element.name, acc.element.name)
    except WgmmaError as error:
        raise CompilationError(f"warpgroup_mma: {error}", op.loc, suggestion=error.suggestion) from None
    bits = a.element.bits
    k = instruction_k(bits)
    m, k_total = a.shape
    if k_total % k:
        raise CompilationError(
            f"warpgroup_mma: K = {k_total} is not a multiple of the instruction's k = {k} "
            f"({a.element} reads 32 bytes of K per instruction)", op.loc)
    steps = k_total // k
    try:
        acc_plan = plan_accumulator(acc.layout, acc.shape)
    except WgmmaError as error:
        raise CompilationError(f"warpgroup_mma: {error}", op.loc,
                               found=f"accumulator in {describe(acc)}", suggestion=error.suggestion) from None
    groups = range(acc_plan.num_warpgroups)
    rows = sorted({m0 for m0, _ in acc_plan.tiles})
    cols = sorted({n0 for _, n0 in acc_plan.tiles})
    ks = [s * k for s in range(steps)]
    a_plan, a_registers = None, None
    if is_shared(op.a):
        origins = {(acc_plan.warpgroup_origin(g)[0] ^ m0, k0) for g in groups for m0 in rows for k0 in ks}
        a_plan = _operand(op, view_of, op.a, 0, M_PER_A_TILE, k, origins, "a")
    elif is_tensor(op.a) and op.a.type.layout is not None:
        try:
            a_registers = tuple(sorted(plan_register_a(op.a.type.layout, bits, acc_plan, k_total).items()))
        except WgmmaError as error:
            raise CompilationError(f"warpgroup_mma: {error}", op.loc, found=f"a in {describe(op.a.type)}",
                                   suggestion=error.suggestion) from None
    else:
        raise CompilationError("warpgroup_mma: a must be a shared buffer or a tensor with a layout", op.loc)
    if not is_shared(op.b):
        raise CompilationError("warpgroup_mma: b must be a shared-memory buffer (wgmma reads B from shared "
                               "memory only)", op.loc)
    origins = {(acc_plan.warpgroup_origin(g)[1] ^ n0, k0) for g in groups for n0 in cols for k0 in ks}
    b_plan = _operand(op, view_of, op.b, 1, acc_plan.n, k, origins, "b")
    return DotPlan(types, bits, k, steps, acc_plan, a_plan, a_registers, b_plan)


def _operand(op, view_of: ViewOf, value: Value, mn_dim: int, tile_mn: int, tile_k: int, origins,
             name: str) -> OperandPlan:
    addressing, xor = view_of(op, value, name)
    operand = OperandView.from_addressing(addressing, xor, value.type.element.bits, mn_dim)
    try:
        # Any base alignment: the base is the run-time part, checked where it is known.
        return plan_operand(operand, tile_mn, tile_k, sorted(origins), base_alignment=1 << 30)
    except WgmmaError as error:
        raise operand_error(op, value, name, error) from None
