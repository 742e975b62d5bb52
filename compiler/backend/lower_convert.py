"""Lowering of convert_layout from the plan recorded by the plan_data_movement pass.

The plan (weft.layouts.plans) is data the CPU emulator executes too, so the GPU code does
exactly what the tests checked:
- NoOp: the same registers;
- RegisterPermutation: dst register j = src register source_register[j];
- WarpShuffle: per-lane local copies, then shfl.sync.idx rounds (butterflies when the
  round has a lane XOR), packing sub-32-bit elements of several slots into one word;
- SharedRoundTrip: per iteration, st.shared the src registers through `store_map`,
  bar.sync, ld.shared the dst registers through `load_map`; iterations are separated by a
  bar.sync. 16-bit loads of one word each go four words an ldmatrix.x4 where the scratch
  holds them as 8 x 8 matrices of 16-byte rows (the epilogue of a 16-bit wgmma result:
  a quarter of the load instructions, the same wavefronts). The barrier before the first store and after the last load are the
  insert_barriers pass's job (it sees the scratch as written, synced, then read-pending).
Finally every plan's `register_copies` fill the registers the dst layout duplicates.
"""

from __future__ import annotations

import itertools

from llvmlite import ir

from ...layouts.plans import NoOp, RegisterPermutation, SharedRoundTrip, WarpShuffle
from ..errors import CompilationError
from ..ir import ConvertLayout
from ..mma import ldmatrix_addresses
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, lowers
from .indexing import element_pointer
from .lower_shared import barrier
from .warp_ops import affine_lane_function, from_bits, lane_in, pick_by_lane_and_warp, shuffle, to_bits


@lowers(ConvertLayout)
def lower_convert_layout(ctx: Lowering, op: ConvertLayout) -> None:
    plan = op.plan
    if plan is None:
        raise CompilationError("convert_layout has no plan", op.loc,
                               suggestion="run the plan_data_movement pass before the backend")
    source = ctx.registers(op.operand)
    count = T.register_count(op.result.type)
    if isinstance(plan, NoOp):
        result = list(source)
    elif isinstance(plan, RegisterPermutation):
        result = [source[r] for r in plan.source_register]
    elif isinstance(plan, WarpShuffle):
        result = _warp_shuffle(ctx, plan, source, count)
    elif isinstance(plan, SharedRoundTrip):
        if op.scratch_offset is None:
            raise CompilationError("convert_layout through shared memory has no scratch offset", op.loc,
                                   suggestion="run allocate_shared_memory before the backend")
        result = _shared_round_trip(ctx, plan, source, count, op.scratch_offset, T.value_type(op.result.type))
    else:
        raise CompilationError(f"the backend does not know conversion plans of kind {type(plan).__name__}", op.loc)
    for register, original in getattr(plan, "register_copies", ()):
        result[register] = result[original]
    if len(result) != count or any(v is None for v in result):
        raise CompilationError(f"internal: the conversion plan left registers of {op.result!r} unfilled", op.loc)
    ctx.define(op.result, tuple(result))


def _warp_shuffle(ctx: Lowering, plan: WarpShuffle, source, count: int) -> list:
    b = ctx.builder
    if plan.block_register_xor and any(plan.block_register_xor):
        raise CompilationError("conversions that depend on the cluster rank are not supported")
    lanes = len(plan.local_register)
    if lanes != 32:
        raise CompilationError(f"internal: a warp shuffle plan for {lanes} lanes (expected 32)")
    warp_xor = plan.warp_register_xor
    result = [None] * count
    for register in range(count):
        column = [row[register] for row in plan.local_register]
        result[register] = pick_by_lane_and_warp(ctx, column, source, warp_xor)
    element_type = source[0].type
    bits = plan.element_bits
    for round_ in plan.rounds:
        words = []
        for sends in round_.send_register:
            value = pick_by_lane_and_warp(ctx, sends, source, warp_xor)
            if value is None:
                value = ir.Constant(element_type, None)
            words.append(to_bits(b, value))
        if len(words) == 1:
            packed = words[0]
        else:  # several sub-32-bit elements in one word, slot s at bits [s*bits, (s+1)*bits)
            packed = ir.Constant(T.I32, 0)
            for slot, word in enumerate(words):
                widened = b.zext(word, T.I32)
                if slot:
                    widened = b.shl(widened, ir.Constant(T.I32, slot * bits))
                packed = b.or_(packed, widened)
        if round_.lane_xor is not None:
            moved = shuffle(ctx, packed, ir.Constant(T.I32, round_.lane_xor), "bfly")
        else:
            moved = shuffle(ctx, packed, affine_lane_function(ctx, round_.source_lane), "idx")
        for slot, receives in enumerate(round_.receive_register):
            if len(words) == 1:
                received = from_bits(b, moved, element_type)
            else:
                part = b.lshr(moved, ir.Constant(T.I32, slot * bits)) if slot else moved
                received = from_bits(b, b.trunc(part, ir.IntType(max(bits, 8))), element_type)
            _receive(ctx, result, receives, received)
    return result


def _receive(ctx: Lowering, result: list, receives, received) -> None:
    """Lanes whose receive entry is j take `received` into register j."""
    lanes_of: dict[int, int] = {}
    for lane, register in enumerate(receives):
        if register >= 0:
            lanes_of[register] = lanes_of.get(register, 0) | 1 << lane
    for register, lanes in lanes_of.items():
        previous = result[register]
        condition = lane_in(ctx, lanes)
        if previous is None or condition is None:
            result[register] = received
        else:
            result[register] = ctx.builder.select(condition, received, previous)


def _shared_round_trip(ctx: Lowering, plan: SharedRoundTrip, source, count: int, scratch_offset: int,
                       element_type: ir.Type) -> list:
    b = ctx.builder
    bits = plan.element_bits
    word = ir.IntType(bits)
    base = ctx.shared_pointer(scratch_offset)
    result = [None] * count

    def address(mapping, register: int) -> ir.Value:
        return element_pointer(ctx, base, word, mapping, register)

    for iteration in range(plan.iterations):
        if iteration:
            barrier(ctx)  # the previous iteration's loads are done before stores reuse it
        for group in plan.store_groups[iteration]:
            data = [to_bits(b, source[r]) for r in group]
            b.store(_vector(b, data, word), address(plan.store_map, group[0]), align=len(group) * bits // 8)
        barrier(ctx)
        groups = plan.load_groups[iteration]
        matrices = _ldmatrix_quads(plan, groups) if bits == 16 and plan.load_vector == 2 else None
        for words, addresses in matrices or ():
            pointer = element_pointer(ctx, base, word, addresses, words[0][0])
            loaded = ctx.inline_asm(ptx_asm.ldmatrix(len(words)), [b.ptrtoint(pointer, T.I32)], [T.I32] * len(words))
            for w, pair in enumerate(words):
                halves = b.bitcast(loaded[w], ir.VectorType(word, 2))
                for i, register in enumerate(pair):
                    result[register] = from_bits(b, b.extract_element(halves, ir.Constant(T.I32, i)), element_type)
        for group in () if matrices else groups:
            width = len(group)
            loaded = b.load(address(plan.load_map, group[0]), typ=word if width == 1 else ir.VectorType(word, width),
                            align=width * bits // 8)
            for i, register in enumerate(group):
                item = loaded if width == 1 else b.extract_element(loaded, ir.Constant(T.I32, i))
                result[register] = from_bits(b, item, element_type)
    return result


def _ldmatrix_quads(plan: SharedRoundTrip, words) -> list | None:
    """One iteration's loaded words (register pairs) as groups of four with the row
    addresses of the ldmatrix.x4 that loads each (mma.ldmatrix_addresses), every word in
    one group; None where two register bits do not step between the words of each group."""
    offsets = plan.load_map.sublayout(plan.load_map.in_dim_names, ["offset"])
    firsts = {pair[0]: tuple(pair) for pair in words}
    bits = [1 << i for i in range(max(firsts).bit_length())]
    for step0, step1 in itertools.combinations(bits, 2):
        quads = []
        for first in sorted(firsts):
            if first & (step0 | step1):
                continue
            members = [first, first ^ step0, first ^ step1, first ^ step0 ^ step1]
            if any(m not in firsts for m in members):
                break
            quad = tuple(firsts[m] for m in members)
            addresses = ldmatrix_addresses(offsets, quad)
            if addresses is None:
                break
            quads.append((quad, addresses))
        else:
            if 4 * len(quads) == len(firsts):
                return quads
    return None


def _vector(b: ir.IRBuilder, items, word: ir.Type) -> ir.Value:
    if len(items) == 1:
        return items[0]
    vector = ir.Constant(ir.VectorType(word, len(items)), None)
    for i, item in enumerate(items):
        vector = b.insert_element(vector, item, ir.Constant(T.I32, i))
    return vector
