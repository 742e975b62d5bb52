"""accelerate_dots: each `dot` becomes what a lowlevel author would write for it.

Where the tile fits Hopper's tensor cores (wgmma, PTX ISA 9.7.15) the dot becomes

    %a_smem = allocate_shared_memory         (before the outermost loop holding the dot)
    %b_smem = allocate_shared_memory
    ...
    shared_store %a_smem, %a                 (every iteration: the operands' new tiles)
    shared_store %b_smem, %b
    fence_async_shared                       (the generic-proxy stores, seen by wgmma)
    %d = warpgroup_mma %a_smem, %b_smem, %acc [is_async=True]
    %r = warpgroup_mma_wait [pending=0] %d

with these choices, made from the tile and num_warps alone:

- warps: Triton's rule for wgmma (warpsPerTileV3): a warpgroup's 4 warps stack along M,
  then more warps double along M while M has more than 16 rows per warp, else along N;
- instruction N: the widest (at most 256) that one warp column's share of N allows; K
  per instruction 32 bytes (k16 for 16-bit inputs, k32 for fp8, k8 for tf32);
- shared layouts: NVMMASharedLayout.get_default_for, the widest swizzle (128, 64 or 32
  bytes) a row of the tile allows. A loaded 16-bit tile is stored with the dim its load
  reads contiguously contiguous (a K-major B, an M-major A: wgmma reads either through
  its descriptor's major-ness); `tl.trans` of a loaded tile is stored as loaded and read
  through a `shared_permute` view; fp8 and tf32 operands are stored K-major, the only
  way wgmma reads them (the store then transposes a tile loaded otherwise; a B box
  [K, N] is read and written in 32-bit words, layouts/transpose_copy.py). A 16-bit
  tile computed in registers is stored with A K-major and B N-major;
- register A: a 16-bit A that is not a load (P of attention) is not staged: wgmma reads
  it from registers, in the A fragment of the accumulator, where propagate_layouts puts
  it (register-local from a wgmma accumulator whose warpgroups hold whole rows);
- operands defined outside every loop are stored once, before the kernel-level op that
  holds the dot, into one buffer that every later dot of the same tile reads; a tile
  defined in a loop is stored once in its block, where the later dots of that block that
  read it (or its `tl.trans`) in the same shared layout find it.

The accumulator gets the wgmma layout: converted into it before the wgmma, and out of it
after the wait (as `coalesce` anchors accesses), so `propagate_layouts` takes the
wgmma's result as an anchor and keeps a loop-carried accumulator in it. Barriers around
the shared stores, their offsets and the wgmma's descriptors are the lowlevel passes'.

A 16-bit tile too small for wgmma (fewer than 64 rows per warpgroup, fewer than 4 warps)
runs on mma.sync (`mma_v2`, m16n8k16, PTX ISA 9.7.14) from the same buffers, each warp on
its own rows and columns (Triton's warpsPerTileV2 arrangement); a plain barrier, which
insert_barriers places, orders the stores before it. What neither takes (exact fp32 with
input_precision="ieee", int8, tiles smaller than the warps) becomes tile ops: both
operands broadcast to [M, K, N], multiplied in the accumulation type and summed over K,
a few products per thread; larger tiles are refused with what to change.
input_precision="tf32x3" becomes three tf32 dots of the operands' split parts.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ...layouts import (DotOperandLayout, LayoutError, LinearLayout, LinearSharedLayout, NVMMADistributedLayout,
                       NVMMASharedLayout)
from ...layouts import rules as layout_rules
from ...layouts.transpose_copy import transpose_copy_layouts
from ..errors import CompilationError
from ..ir import (AllocateSharedMemory, Binary, Bitcast, Block, Broadcast, Cast, Constant, ConvertLayout, Dot,
                  ExpandDims, FenceAsyncShared, Kernel, Load, MmaV2, Op, Permute, Reduce, SharedLoad, SharedPermute,
                  SharedStore, Value, WarpgroupMma, WarpgroupMmaWait)
from ..mma import MmaError, plan_mma_v2
from ..types import ScalarType, SharedType, TensorType, fp32, i32
from .fold_dot_add import fold_dot_add
from .tma_operands import box_operand, tensor_descriptor_reads

NAME = "accelerate_dots"

WGMMA_INPUTS = ("fp16", "bf16", "fp8e4m3", "fp8e5m2", "fp32")
ROWS_PER_WARPGROUP = 64  # wgmma's m64
MAX_INSTR_N = 256
# The multiply-and-sum fallback holds M * N * K / threads products per thread at once.
MAX_PRODUCTS_PER_THREAD = 1024


@dataclasses.dataclass(frozen=True)
class WgmmaChoice:
    """How one dot runs on wgmma: the accumulator's layout and the operands' buffers."""

    warps_per_cta: tuple[int, int]
    instr_n: int
    instr_k: int
    acc_encoding: NVMMADistributedLayout
    a_shared: NVMMASharedLayout
    b_shared: NVMMASharedLayout


def wgmma_warps(m: int, num_warps: int) -> tuple[int, int]:
    """Triton's warpsPerTileV3: 4 warps along M, then double M while M has more than 16
    rows per warp, else N."""
    warps = [4, 1]
    while warps[0] * warps[1] < num_warps:
        if m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    return warps[0], warps[1]


def choose_wgmma(m: int, n: int, k: int, element: ScalarType, num_warps: int) -> tuple[Optional[WgmmaChoice], str]:
    """(the wgmma plan, "") for an [M, K] @ [K, N] tile of `element`, or (None, why not)."""
    if element.name not in WGMMA_INPUTS:
        return None, f"wgmma takes no {element} inputs"
    if num_warps % 4:
        return None, f"wgmma runs on whole warpgroups of 4 warps; the kernel has num_warps={num_warps}"
    warps = wgmma_warps(m, num_warps)
    if m % ROWS_PER_WARPGROUP or m < ROWS_PER_WARPGROUP * warps[0] // 4:
        return None, (f"wgmma computes {ROWS_PER_WARPGROUP} rows per warpgroup; M={m} leaves fewer to "
                      f"the {warps[0] // 4} warpgroup(s) stacked along M")
    instr_n = min(MAX_INSTR_N, n // warps[1])
    if instr_n < 8 or instr_n % 8 or n % (instr_n * warps[1]):
        return None, f"wgmma needs N a multiple of 8 per warp column; N={n} over {warps[1]} column(s)"
    instr_k = 256 // element.bits
    if k % instr_k:
        return None, f"wgmma steps K by {instr_k} for {element}; K={k}"
    acc = NVMMADistributedLayout((3, 0), warps, (16, instr_n, instr_k))
    a_shared = NVMMASharedLayout.get_default_for((m, k), element.bits)
    # wgmma reads 8- and 32-bit B K-major only (PTX ISA 9.7.15.5.1, "imm-trans" is for 16-bit types).
    b_shared = NVMMASharedLayout.get_default_for((k, n), element.bits, transposed=element.bits != 16)
    return WgmmaChoice(warps, instr_n, instr_k, acc, a_shared, b_shared), ""


@dataclasses.dataclass(frozen=True)
class MmaV2Choice:
    """How one dot runs on mma.sync: the accumulator's layout, the register layouts the
    shared operands are read in, and the operands' buffers."""

    acc_encoding: NVMMADistributedLayout
    a_layout: object  # LinearLayout of DotOperandLayout(0, acc, 2) at [M, K]
    b_layout: object
    a_shared: NVMMASharedLayout
    b_shared: NVMMASharedLayout


def mma_v2_warps(m: int, n: int, num_warps: int) -> tuple[int, int]:
    """Triton's warpsPerTileV2: double the warps along M while M has more 16-row tiles per
    warp than N has 16-column ones, and M still has a tile for each; else along N."""
    warps = [1, 1]
    while warps[0] * warps[1] < num_warps:
        if m // 16 // warps[0] >= n // 16 // warps[1] and warps[0] < m // 16:
            warps[0] *= 2
        else:
            warps[1] *= 2
    return warps[0], warps[1]


def choose_mma_v2(m: int, n: int, k: int, element: ScalarType, num_warps: int) -> tuple[Optional[MmaV2Choice], str]:
    """(the mma.sync plan, "") for an [M, K] @ [K, N] tile of `element`, or (None, why not)."""
    if element.name not in ("fp16", "bf16"):
        return None, f"mma.sync takes fp16 or bf16 here, not {element}"
    warps = mma_v2_warps(m, n, num_warps)
    if m < 16 * warps[0] or n < 8 * warps[1]:
        return None, f"the {num_warps} warps have more m16n8 tiles to hold than [{m}, {n}] has"
    acc = NVMMADistributedLayout((2, 0), warps, (16, 8))
    try:
        a_layout = DotOperandLayout(0, acc, 2).to_linear((m, k))
        b_layout = DotOperandLayout(1, acc, 2).to_linear((k, n))
        plan_mma_v2(acc.to_linear((m, n)), a_layout, b_layout)
    except (MmaError, LayoutError) as error:
        return None, str(error)
    return MmaV2Choice(acc, a_layout, b_layout, NVMMASharedLayout.get_default_for((m, k), element.bits),
                       NVMMASharedLayout.get_default_for((k, n), element.bits)), ""


def _error(dot: Dot, why: str, num_warps: int) -> CompilationError:
    (m, k), n = dot.a.type.shape, dot.b.type.shape[1]
    element = dot.a.type.element
    if dot.input_precision == "ieee":
        suggestion = "use input_precision='tf32' (the default), or smaller tiles"
    elif element.bits == 8 and element.is_int:
        suggestion = "int8 dots run only on tiles up to this size for now; use smaller tiles or fp16 inputs"
    else:
        suggestion = (f"use BLOCK_M >= {ROWS_PER_WARPGROUP * max(1, num_warps // 4)} with num_warps a multiple "
                      f"of 4, fewer warps, or smaller tiles")
    threads = 32 * num_warps
    return CompilationError(
        f"dot [{m}, {k}] @ [{k}, {n}] of {element} with num_warps={num_warps} cannot run on the tensor "
        f"cores ({why}), and it is too large for the FMA fallback ({m * n * k // threads} products per "
        f"thread; at most {MAX_PRODUCTS_PER_THREAD})", dot.loc, suggestion=suggestion)


class DotAcceleration:
    """The rewrite of one kernel: dots replaced, their buffers collected for hoisting."""

    def __init__(self, num_warps: int, definitions: dict[Value, Op], top_level: set[Value],
                 box_reads: Optional[dict] = None):
        self.num_warps = num_warps
        self.definitions = definitions  # the op defining each value, over the whole kernel
        self.top_level = top_level      # values defined outside every region (stored once, before it)
        self.box_reads = box_reads or {}  # tiles TMA brought into shared memory (tma_operands.py)
        self.folded: set[Value] = set()  # transposes read through permuted views instead
        self.stored_once: dict[tuple[Value, NVMMASharedLayout], Value] = {}  # buffers of top-level tiles
        self.stored_here: dict[tuple[Value, NVMMASharedLayout], Value] = {}  # tiles stored in this block

    def block(self, block: Block, hoisted: list[Op]) -> Block:
        enclosing, self.stored_here = self.stored_here, {}
        ops: list[Op] = []
        for op in block.ops:
            op = op.map_regions(lambda region: self.block(region, hoisted))
            ops.extend(self.dot(op, hoisted) if isinstance(op, Dot) else (op,))
        self.stored_here = enclosing
        return Block(block.args, tuple(ops))

    def dot(self, dot: Dot, hoisted: list[Op]) -> list[Op]:
        (m, k), n = dot.a.type.shape, dot.b.type.shape[1]
        element = dot.a.type.element
        choice, why = None, "input_precision='ieee' asks for exact fp32 products"
        if dot.input_precision == "tf32x3":
            return self.tf32x3(dot, hoisted)
        if dot.input_precision != "ieee":
            choice, why = choose_wgmma(m, n, k, element, self.num_warps)
        if choice is not None:
            return self.wgmma(dot, choice, hoisted)
        if dot.input_precision != "ieee" and dot.result.type.element == fp32:
            small, small_why = choose_mma_v2(m, n, k, element, self.num_warps)
            if small is not None:
                return self.mma_v2(dot, small, hoisted)
            why += f"; {small_why}"
        if m * n * k > MAX_PRODUCTS_PER_THREAD * 32 * self.num_warps:
            raise _error(dot, why, self.num_warps)
        return multiply_and_sum(dot)

    def wgmma(self, dot: Dot, choice: WgmmaChoice, hoisted: list[Op]) -> list[Op]:
        ops: list[Op] = []
        a = box_operand(dot, 0, choice.a_shared, self.box_reads, ops, wgmma=True)
        if a is None:
            a_source = operand_source(dot.a, 0, self.definitions)
            if dot.a.type.element.bits == 16 and not a_source.loaded:
                # A computed in registers (P of attention) stays there: propagate_layouts places it
                # in the wgmma A fragment, register-local from a 16-bit tile in a wgmma accumulator.
                a = dot.a
            else:
                a = self.stage(dot, a_source, "a_smem", hoisted, ops)
        b = box_operand(dot, 1, choice.b_shared, self.box_reads, ops, wgmma=True)
        if b is None and dot.b in self.box_reads and self.box_reads[dot.b][1] is None:
            b = self.transpose_box(dot, choice.b_shared, hoisted, ops)
        if b is None:
            b = self.stage(dot, operand_source(dot.b, 1, self.definitions), "b_smem", hoisted, ops)
        ops.append(FenceAsyncShared(loc=dot.loc))  # the stores were generic-proxy writes
        anchored, placed = anchor_accumulator(dot, choice.acc_encoding, ops)
        product = Value(placed, dot.result.hint)
        ops.append(WarpgroupMma(result=product, a=a, b=b, acc=anchored, is_async=True, loc=dot.loc))
        waited = Value(placed, dot.result.hint)
        ops.append(WarpgroupMmaWait(results=(waited,), deps=(product,), pending=0, loc=dot.loc))
        ops.append(ConvertLayout(result=dot.result, operand=waited, loc=dot.loc))
        return ops

    def transpose_box(self, dot: Dot, shared: NVMMASharedLayout, hoisted: list[Op], ops: list[Op]) -> Optional[Value]:
        """An 8- or 32-bit B box [K, N] (wgmma reads such B K-major only) copied into a
        K-major buffer: read in v x v blocks a thread holds, its registers renamed, written
        (layouts/transpose_copy.py picks lanes free of bank conflicts both ways); None when
        the tile is too small for that. pipeline_tma_loops still rings the box (a staged
        operand)."""
        box = self.box_reads[dot.b][0]
        shape, element = dot.b.type.shape, dot.b.type.element
        target = shared.to_linear(shape)
        layouts = transpose_copy_layouts(box.type.layout, target, shape, element.bits, self.num_warps)
        if layouts is None:
            return None
        buffer = Value(SharedType(shape, element, target, shared), "b_smem")
        hoisted.append(AllocateSharedMemory(result=buffer, loc=dot.loc))
        read, written = Value(TensorType(shape, element, layouts[0])), Value(TensorType(shape, element, layouts[1]))
        ops.extend((SharedLoad(result=read, buffer=box, loc=dot.loc),
                    ConvertLayout(result=written, operand=read, loc=dot.loc),  # registers renamed
                    SharedStore(buffer=buffer, value=written, loc=dot.loc)))
        return buffer

    def stage(self, dot: Dot, source: "OperandSource", name: str, hoisted: list[Op], ops: list[Op]) -> Value:
        """The operand's wgmma view: `source.value` stored to a buffer in the layout it was
        loaded in where wgmma reads that (16-bit types), else K-major; the store runs once
        before the loops when the value is defined outside them; a folded transpose is a
        permuted view of the buffer (a transposed descriptor, no data moved)."""
        value = source.value
        shape, element = value.type.shape, value.type.element
        if element.bits == 16 and source.contiguous_dim is not None:
            dim0_contiguous = source.contiguous_dim == 0
        else:
            # wgmma reads 8- and 32-bit operands K-major only (PTX ISA 9.7.15.5.1: "imm-trans"
            # is for 16-bit types); 16-bit tiles computed in registers keep A K-major, B N-major.
            dim0_contiguous = element.bits != 16 and source.k_dim == 0
        shared = NVMMASharedLayout.get_default_for(shape, element.bits, transposed=dim0_contiguous)
        buffer = self.stored_once.get((value, shared)) or self.stored_here.get((value, shared))
        if buffer is None:
            buffer = Value(SharedType(shape, element, shared.to_linear(shape), shared), name)
            hoisted.append(AllocateSharedMemory(result=buffer, loc=dot.loc))
            store = SharedStore(buffer=buffer, value=value, loc=dot.loc)
            if value in self.top_level:
                # Written once, before the loops: later dots of the same tile read it too (Q of
                # attention's two causal loops), so the tile need not stay in registers.
                hoisted.append(store)
                self.stored_once[(value, shared)] = buffer
            else:
                # Stored once per iteration: a later dot of the same block reads this buffer
                # too (a tile and its tl.trans, as attention's backward reads Q^T and Q), so
                # the loop's load feeds one store, which pipeline_dot_loops can make a copy.
                ops.append(store)
                self.stored_here[(value, shared)] = buffer
        if not source.permuted:
            return buffer
        self.folded.add(dot.a if name == "a_smem" else dot.b)
        view = Value(transposed_view_type(buffer.type, shared), name)
        ops.append(SharedPermute(result=view, buffer=buffer, order=(1, 0), loc=dot.loc))
        return view

    def tf32x3(self, dot: Dot, hoisted: list[Op]) -> list[Op]:
        """Triton's tf32x3: each fp32 operand split into a tf32 head and the tf32 of what
        the head leaves, and three tf32 dots summed, smallest terms first (the product of
        the two remainders is below fp32's resolution)."""
        ops: list[Op] = []
        a_head, a_rest = tf32_split(dot.a, dot.loc, ops)
        b_head, b_rest = tf32_split(dot.b, dot.loc, ops)
        acc = dot.acc
        for index, (a, b) in enumerate(((a_rest, b_head), (a_head, b_rest), (a_head, b_head))):
            result = dot.result if index == 2 else Value(dot.result.type)
            ops.extend(self.dot(Dot(result=result, a=a, b=b, acc=acc, input_precision="tf32", loc=dot.loc), hoisted))
            acc = result
        return ops

    def mma_v2(self, dot: Dot, choice: MmaV2Choice, hoisted: list[Op]) -> list[Op]:
        ops: list[Op] = []
        buffers = stage_operands(dot, choice.a_shared, choice.b_shared, hoisted, ops, self.box_reads)
        anchored, placed = anchor_accumulator(dot, choice.acc_encoding, ops)
        product = Value(placed, dot.result.hint)
        ops.append(MmaV2(result=product, a=buffers[0], b=buffers[1], acc=anchored, a_layout=choice.a_layout,
                         b_layout=choice.b_layout, loc=dot.loc))
        ops.append(ConvertLayout(result=dot.result, operand=product, loc=dot.loc))
        return ops


def stage_operands(dot: Dot, a_shared: NVMMASharedLayout, b_shared: NVMMASharedLayout, hoisted: list[Op],
                   ops: list[Op], box_reads: Optional[dict] = None, wgmma: bool = False) -> list[Value]:
    """One buffer per operand (its allocation hoisted), and the operand stored into it;
    an operand TMA brought in a layout the instruction reads is read where it landed
    (tma_operands.py)."""
    buffers = []
    for index, (operand, shared, name) in enumerate(((dot.a, a_shared, "a_smem"), (dot.b, b_shared, "b_smem"))):
        shape, element = operand.type.shape, operand.type.element
        box = box_operand(dot, index, shared, box_reads or {}, ops, wgmma)
        if box is not None:
            buffers.append(box)
            continue
        buffer = Value(SharedType(shape, element, shared.to_linear(shape), shared), name)
        hoisted.append(AllocateSharedMemory(result=buffer, loc=dot.loc))
        ops.append(SharedStore(buffer=buffer, value=operand, loc=dot.loc))
        buffers.append(buffer)
    return buffers


@dataclasses.dataclass(frozen=True)
class OperandSource:
    """What a wgmma operand is staged from: `value`, the tile stored to shared memory (the
    operand itself, or the tile it is the transpose of: `permuted`), whether it is a global
    load (`loaded`, through layout conversions), the dim of `value` that load reads
    contiguously (None when unknown), and the dim of `value` that is the dot's K."""

    value: Value
    permuted: bool
    loaded: bool
    contiguous_dim: Optional[int]
    k_dim: int


def _loaded_layout(value: Value, definitions: dict[Value, Op]) -> Optional[LinearLayout]:
    """The register layout of the global load `value` is (through layout conversions), or
    None when `value` is computed."""
    op = definitions.get(value)
    while isinstance(op, ConvertLayout):
        op = definitions.get(op.operand)
    if isinstance(op, Load) and op.result.type.layout is not None:
        return op.result.type.layout
    return None


def fastest_dim(layout: LinearLayout) -> Optional[int]:
    """The dim a thread's consecutive registers (else a warp's consecutive lanes) step along."""
    names = [f"dim{i}" for i in range(len(layout.out_dims))]
    ordered = layout.transpose_outs(names)
    for in_dim in ("register", "lane"):
        for basis in ordered.bases.get(in_dim, ()):
            if any(basis):
                return next(d for d, v in enumerate(basis) if v)
    return None


def operand_source(operand: Value, index: int, definitions: dict[Value, Op]) -> OperandSource:
    """The OperandSource of operand `index` (0: A [M, K], 1: B [K, N]): `tl.trans` of a
    loaded tile is folded (the tile is stored as loaded and read transposed)."""
    k_dim = 1 - index
    op = definitions.get(operand)
    if isinstance(op, Permute) and op.order == (1, 0):
        layout = _loaded_layout(op.operand, definitions)
        if layout is not None:
            return OperandSource(op.operand, True, True, fastest_dim(layout), 1 - k_dim)
    layout = _loaded_layout(operand, definitions)
    return OperandSource(operand, False, layout is not None, None if layout is None else fastest_dim(layout), k_dim)


def transposed_view_type(buffer: SharedType, shared: NVMMASharedLayout) -> SharedType:
    """The type of `buffer` seen with its two dims swapped (as lowlevel's `permute((1, 0))`)."""
    layout = layout_rules.permute_layout(buffer.layout.transpose_outs(["dim0", "dim1"]), (1, 0))
    shape = buffer.shape[::-1]
    flipped = NVMMASharedLayout(shared.swizzle_byte_width, shared.element_bitwidth, 2, not shared.transposed)
    encoding = flipped if flipped.to_linear(shape) == layout else LinearSharedLayout.from_linear(layout)
    return SharedType(shape, buffer.element, layout, encoding)


def anchor_accumulator(dot: Dot, encoding: NVMMADistributedLayout, ops: list[Op]) -> tuple[Value, TensorType]:
    """The accumulator (zeros when the dot has none) converted into the instruction's
    layout, and that type: propagate_layouts takes it as an anchor."""
    out = dot.result.type
    acc = dot.acc
    if acc is None:
        acc = Value(out)
        ops.append(Constant(result=acc, value=0.0 if out.element.is_float else 0, loc=dot.loc))
    placed = out.with_layout(encoding.to_linear(out.shape), encoding)
    anchored = Value(placed)
    ops.append(ConvertLayout(result=anchored, operand=acc, loc=dot.loc))
    return anchored, placed


# fp32 bits that tf32 keeps: sign, exponent and the top 10 mantissa bits (as an i32).
TF32_BITS = -(1 << 13)


def tf32_split(x: Value, loc, ops: list[Op]) -> tuple[Value, Value]:
    """(head, rest): x's tf32 part (its low 13 mantissa bits cleared) and x - head, both
    fp32 tiles; head + rest == x exactly."""
    words = TensorType(x.type.shape, i32)
    bits, mask, head_bits = Value(words), Value(words), Value(words)
    head, rest = Value(x.type), Value(x.type)
    ops.extend((Bitcast(result=bits, operand=x, loc=loc), Constant(result=mask, value=TF32_BITS, loc=loc),
                Binary(result=head_bits, kind="and", lhs=bits, rhs=mask, loc=loc),
                Bitcast(result=head, operand=head_bits, loc=loc),
                Binary(result=rest, kind="sub", lhs=x, rhs=head, loc=loc)))
    return head, rest


def multiply_and_sum(dot: Dot) -> list[Op]:
    """The dot as tile ops: a[:, :, None] * b[None, :, :] summed over K, in fp32 (int32
    for integer tiles), then added to acc and converted to the result's type."""
    loc = dot.loc
    (m, k), n = dot.a.type.shape, dot.b.type.shape[1]
    out = dot.result.type.element
    accumulate = i32 if out.is_int else fp32
    ops: list[Op] = []

    def emit(op_class, type_: TensorType, **fields) -> Value:
        value = Value(type_)
        ops.append(op_class(result=value, loc=loc, **fields))
        return value

    cube = []
    for operand, axis in ((dot.a, 2), (dot.b, 0)):
        shape = operand.type.shape[:axis] + (1,) + operand.type.shape[axis:]
        expanded = emit(ExpandDims, TensorType(shape, operand.type.element), operand=operand, axis=axis)
        spread = emit(Broadcast, TensorType((m, k, n), operand.type.element), operand=expanded)
        if operand.type.element != accumulate:
            spread = emit(Cast, TensorType((m, k, n), accumulate), operand=spread)
        cube.append(spread)
    products = emit(Binary, TensorType((m, k, n), accumulate), kind="mul", lhs=cube[0], rhs=cube[1])
    total = emit(Reduce, TensorType((m, n), accumulate), operand=products, axis=1, kind="sum")
    if dot.acc is not None:
        acc = dot.acc
        if acc.type.element != accumulate:
            acc = emit(Cast, TensorType((m, n), accumulate), operand=acc)
        total = emit(Binary, TensorType((m, n), accumulate), kind="add", lhs=total, rhs=acc)
    if accumulate != out:
        ops.append(Cast(result=dot.result, operand=total, loc=loc))
    else:
        ops[-1] = dataclasses.replace(ops[-1], result=dot.result)
    return ops


def accelerate_dots(kernel: Kernel) -> Kernel:
    """Every `dot` of a `tile` kernel replaced (see the module docstring); the shared
    buffers of the dots inside a loop are allocated before the kernel-level op holding it."""
    kernel = fold_dot_add(kernel)  # `acc += tl.dot(a, b)`: the wgmma accumulates into acc
    definitions = {value: op for op in kernel.walk() for value in op.defines()}
    top_level = set(kernel.body.args) | {value for op in kernel.body.ops for value in op.defines()}
    acceleration = DotAcceleration(kernel.num_warps, definitions, top_level, tensor_descriptor_reads(kernel))
    ops: list[Op] = []
    for op in kernel.body.ops:
        hoisted: list[Op] = []
        op = op.map_regions(lambda region: acceleration.block(region, hoisted))
        replaced = acceleration.dot(op, hoisted) if isinstance(op, Dot) else [op]
        ops.extend(hoisted)
        ops.extend(replaced)
    body = Block(kernel.body.args, tuple(ops))
    used = {value for op in body.walk() for value in op.uses()}
    return kernel.with_body(drop_transposes(body, acceleration.folded - used))


def drop_transposes(block: Block, unused: set[Value]) -> Block:
    """`block` without the transposes in `unused` (folded into views, read by nothing else),
    so that the pipelining pass sees each loaded tile read by its store alone."""
    ops = tuple(op.map_regions(lambda region: drop_transposes(region, unused)) for op in block.ops
                if not (isinstance(op, Permute) and op.result in unused))
    return Block(block.args, ops)
