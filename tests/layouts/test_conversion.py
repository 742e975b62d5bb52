"""plan_conversion and the numpy executor: random layout pairs, named pairs, errors, speed."""

import os
import statistics
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from weft.layouts import (
    LayoutError,
    LinearLayout,
    NoOp,
    RegisterPermutation,
    SharedRoundTrip,
    WarpShuffle,
    collect,
    distribute,
    execute_plan,
    plan_conversion,
)
from weft.layouts.conversion import DEFAULT_MAX_SCRATCH_BYTES
from weft.layouts.standard import blocked, slice_layout, wgmma_accumulator, wgmma_operand_a

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
PROPERTY_EXAMPLES = 100_000 if DEEP else 1000


# ------------------------------------------------------------------- random layout pairs
def _layout(columns, register_bits, warp_bits, block_bits, shape):
    in_dims = [("register", 1 << register_bits), ("lane", 32), ("warp", 1 << warp_bits), ("block", 1 << block_bits)]
    out_dims = [(f"dim{i}", size) for i, size in enumerate(shape)]
    return LinearLayout.from_columns(columns, in_dims, out_dims)


@st.composite
def _thread_columns(draw, thread_bits, register_bits, warp_bits):
    """Columns (register, lane, warp bits) covering the low `thread_bits` tensor bits.

    Some input bits carry an invertible image of the tensor bits (units, sometimes XOR
    mixed like a swizzle); the others are zero (broadcast) or repeat a combination.
    """
    inputs = register_bits + 5 + warp_bits
    positions = draw(st.permutations(range(inputs)))[:thread_bits]
    images = [1 << b for b in draw(st.permutations(range(thread_bits)))]
    for i, j in draw(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 63)), max_size=3)):
        if thread_bits > 1 and i % thread_bits != j % thread_bits:
            images[i % thread_bits] ^= images[j % thread_bits]
    columns = []
    for position in range(inputs):
        if position in positions:
            columns.append(images[positions.index(position)])
        elif thread_bits and draw(st.booleans()):
            columns.append(draw(st.integers(1, (1 << thread_bits) - 1)))
        else:
            columns.append(0)
    return columns


@st.composite
def layout_pairs(draw):
    """(src, dst, shape): two distributed layouts of one tensor on the same threads."""
    total_bits = draw(st.one_of(st.integers(0, 10), st.integers(6, 10)))
    if draw(st.booleans()):
        first = draw(st.integers(0, total_bits))
        shape = (1 << first, 1 << (total_bits - first))
    else:
        shape = (1 << total_bits,)
    warp_bits = draw(st.integers(0, 2))
    # With two CTAs, the top tensor bit picks the CTA in both layouts (no cross-CTA moves).
    block_bits = 1 if total_bits and draw(st.integers(0, 5)) == 0 else 0
    thread_bits = total_bits - block_bits
    block_columns = [1 << thread_bits] if block_bits else []
    low = max(0, thread_bits - 5 - warp_bits)

    def draw_layout():
        register_bits = draw(st.integers(low, min(6, low + 2)))
        columns = draw(_thread_columns(thread_bits, register_bits, warp_bits))
        return register_bits, columns

    src_registers, src_columns = draw_layout()
    mode = draw(st.sampled_from(["independent", "same", "registers", "lanes", "within_warp", "across_warps"]))
    if mode == "independent":
        dst_registers, dst_columns = draw_layout()
    else:
        dst_registers, dst_columns = src_registers, list(src_columns)
        warp_local = src_registers + 5
        if mode == "registers":
            order = draw(st.permutations(range(src_registers)))
        elif mode == "lanes":
            order = list(range(src_registers)) + [src_registers + i for i in draw(st.permutations(range(5)))]
        elif mode == "within_warp":
            order = draw(st.permutations(range(warp_local)))
        elif mode == "across_warps":  # registers stay: they can become repetitions
            order = list(range(src_registers)) + [src_registers + i for i in draw(st.permutations(range(5 + warp_bits)))]
        else:
            order = range(0)
        for target, source in enumerate(order):
            dst_columns[target] = src_columns[source]
    src = _layout(src_columns + block_columns, src_registers, warp_bits, block_bits, shape)
    dst = _layout(dst_columns + block_columns, dst_registers, warp_bits, block_bits, shape)
    return src, dst, shape


def _brute_conflicts(mapping, groups, vector, element_bits):
    """Extra wavefronts of one warp's first instruction, by enumerating byte addresses."""
    offset_of = {}
    for lane in range(mapping.in_dim_size("lane")):
        offset_of[lane] = [mapping(register=r, lane=lane)[0] for r in groups[0]]
    access_bytes = vector * element_bits // 8
    phases = max(1, access_bytes // 4)
    lanes_per_phase = 32 // phases
    extra = 0
    for phase in range(phases):
        banks = {}
        for lane in range(phase * lanes_per_phase, (phase + 1) * lanes_per_phase):
            for offset in offset_of.get(lane, []):
                for byte in range(offset * element_bits // 8, (offset + 1) * element_bits // 8):
                    banks.setdefault(byte // 4 % 32, set()).add(byte // 4)
        extra += max(len(words) for words in banks.values()) - 1
    return extra


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    pair=layout_pairs(),
    element_bits=st.sampled_from([8, 16, 32, 64]),
    max_scratch_bytes=st.sampled_from([DEFAULT_MAX_SCRATCH_BYTES, 64, 256, 1024]),
)
def test_executed_plan_puts_every_element_where_dst_says(pair, element_bits, max_scratch_bytes):
    src, dst, shape = pair
    plan = plan_conversion(src, dst, element_bits, max_scratch_bytes=max_scratch_bytes)
    tensor = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    out = execute_plan(plan, distribute(tensor, src), src, dst)
    np.testing.assert_array_equal(out, distribute(tensor, dst))
    event(plan.kind if not isinstance(plan, SharedRoundTrip) else f"shared, {plan.iterations} iteration(s)")
    if src == dst:
        assert isinstance(plan, NoOp)
    if isinstance(plan, SharedRoundTrip):
        for mapping, groups, vector, conflicts in (
            (plan.store_map, plan.store_groups, plan.store_vector, plan.store_conflicts),
            (plan.load_map, plan.load_groups, plan.load_vector, plan.load_conflicts),
        ):
            if groups[0]:
                assert _brute_conflicts(mapping, groups[0], vector, element_bits) == conflicts
            assert vector * element_bits <= 128


# ------------------------------------------------------------------------ named pairs
def _run(src, dst, element_bits, **options):
    plan = plan_conversion(src, dst, element_bits, **options)
    shape = tuple(src.out_dims[f"dim{i}"] for i in range(len(src.out_dims)))
    tensor = np.arange(int(np.prod(shape))).reshape(shape)
    np.testing.assert_array_equal(execute_plan(plan, distribute(tensor, src), src, dst), distribute(tensor, dst))
    return plan


def test_identical_layouts_are_a_no_op():
    layout = blocked([64, 64], [1, 4], [8, 4], [4, 1], [1, 0])
    assert isinstance(_run(layout, layout, 16), NoOp)


def test_no_op_ignores_a_missing_block_dim():
    layout = blocked([64, 64], [1, 4], [8, 4], [4, 1], [1, 0])
    without_block = LinearLayout({d: b for d, b in layout.bases.items() if d != "block"}, layout.out_dims)
    assert isinstance(_run(layout, without_block, 16), NoOp)


def test_register_reorder_is_a_register_permutation():
    src = blocked([64, 64], [2, 4], [8, 4], [4, 1], [1, 0])
    registers = src.bases["register"]
    dst = src.with_in_dim_bases("register", registers[::-1])
    plan = _run(src, dst, 16)
    assert isinstance(plan, RegisterPermutation)
    assert len(plan.source_register) == src.in_dim_size("register")


def test_wgmma_accumulator_feeds_register_a_without_moving_16_bit_data():
    accumulator = wgmma_accumulator([128, 64], [4, 1], 64)
    plan = _run(accumulator, wgmma_operand_a([128, 64], [4, 1], 16), 16)
    assert isinstance(plan, (NoOp, RegisterPermutation))


LANES_REVERSED = (
    LinearLayout({"register": [(1, 0)], "lane": [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16)]}, {"dim0": 2, "dim1": 32}),
    LinearLayout({"register": [(1, 0)], "lane": [(0, 16), (0, 8), (0, 4), (0, 2), (0, 1)]}, {"dim0": 2, "dim1": 32}),
)


def test_lane_permutation_inside_a_warp_is_a_warp_shuffle():
    src, dst = LANES_REVERSED
    plan = _run(src, dst, 32)
    assert isinstance(plan, WarpShuffle)
    assert len(plan.rounds) == 2  # one shfl per register
    packed = _run(src, dst, 16)  # both 16-bit registers travel in one 32-bit word
    assert isinstance(packed, WarpShuffle) and len(packed.rounds) == 1 and packed.rounds[0].slots == 2


def test_register_lane_transpose_uses_butterflies():
    src = LinearLayout({"register": [(0, 1), (0, 2)], "lane": [(1, 0), (2, 0), (0, 4), (0, 8), (0, 16)]}, {"dim0": 4, "dim1": 32})
    dst = LinearLayout({"register": [(1, 0), (2, 0)], "lane": [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16)]}, {"dim0": 4, "dim1": 32})
    plan = _run(src, dst, 32)
    assert isinstance(plan, WarpShuffle)
    assert sorted(r.lane_xor for r in plan.rounds) == [1, 2, 3]  # 3 of the 4 registers move
    assert sum(row.count(-1) for row in plan.local_register) == 3 * 32


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("direction", ["to_wgmma", "from_wgmma"])
def test_blocked_and_wgmma_accumulator_round_trip_without_conflicts(warps, direction):
    blocked_layout = blocked([128, 128], [1, 8], [4, 8], [warps, 1], [1, 0])
    accumulator = wgmma_accumulator([128, 128], [warps, 1], 128)
    src, dst = (blocked_layout, accumulator) if direction == "to_wgmma" else (accumulator, blocked_layout)
    plan = _run(src, dst, 16)
    assert isinstance(plan, SharedRoundTrip)
    assert (plan.store_conflicts, plan.load_conflicts) == (0, 0)
    assert max(plan.store_vector, plan.load_vector) * 16 == 128
    assert plan.iterations == 1 and plan.scratch_bytes == 128 * 128 * 2


def test_large_fp32_tile_iterates_to_stay_in_the_scratch_budget():
    src = wgmma_accumulator([128, 256], [8, 1], 256)
    dst = blocked([128, 256], [1, 4], [4, 8], [8, 1], [1, 0])
    plan = _run(src, dst, 32)
    assert isinstance(plan, SharedRoundTrip)
    assert plan.scratch_bytes <= DEFAULT_MAX_SCRATCH_BYTES and plan.iterations == 4
    assert (plan.store_conflicts, plan.load_conflicts) == (0, 0)
    small = _run(src, dst, 32, max_scratch_bytes=8 * 1024)
    assert small.scratch_bytes == 8 * 1024 and small.iterations == 16


def test_dst_broadcast_across_warps_and_lanes():
    src = blocked([64], [1], [32], [4], [0])
    dst = slice_layout(wgmma_accumulator([64, 64], [4, 1], 64), 1)  # rows, lanes % 4 repeat
    assert isinstance(_run(src, dst, 32), SharedRoundTrip)
    assert isinstance(_run(dst, src, 32), SharedRoundTrip)


def test_src_broadcast_to_every_thread_needs_only_local_copies():
    # Every thread of src holds all 16 elements; dst spreads them over lanes and warps.
    src = LinearLayout({"register": [(1,), (2,), (4,), (8,)], "lane": [(0,)] * 5, "warp": [(0,), (0,)]}, {"dim0": 16})
    dst = LinearLayout({"register": [], "lane": [(1,), (2,), (4,), (0,), (0,)], "warp": [(8,), (0,)]}, {"dim0": 16})
    plan = _run(src, dst, 32)
    assert isinstance(plan, WarpShuffle) and plan.rounds == ()
    assert plan.warp_register_xor == (8, 0)


def test_duplicated_registers_are_loaded_once_and_copied():
    src = blocked([32, 32], [1, 1], [8, 4], [4, 1], [1, 0])
    dst = blocked([32, 32], [1, 1], [4, 8], [4, 1], [0, 1])
    dst = dst.with_in_dim_bases("register", list(dst.bases["register"]) + [dst.bases["register"][0]])
    plan = _run(src, dst, 16)
    assert plan.register_copies and all(j >= dst.in_dim_size("register") // 2 for j, _ in plan.register_copies)


def test_plans_are_hashable_plain_data():
    src, dst = LANES_REVERSED
    plans = [plan_conversion(src, dst, 32), plan_conversion(blocked([64, 64], [1, 8], [4, 8], [4, 1], [1, 0]),
                                                           wgmma_accumulator([64, 64], [4, 1], 64), 16)]
    for plan in plans:
        hash(plan)
        for value in vars(plan).values():
            assert not isinstance(value, (list, dict, np.ndarray))


# -------------------------------------------------------------------------- errors
def test_different_shapes_name_both_layouts():
    src = blocked([64, 64], [1, 4], [8, 4], [4, 1], [1, 0])
    dst = blocked([64, 32], [1, 4], [8, 4], [4, 1], [1, 0])
    with pytest.raises(LayoutError, match=r"src .*'dim1': 64.*dst .*'dim1': 32"):
        plan_conversion(src, dst, 16)


def test_different_out_dim_names_name_both_layouts():
    src = LinearLayout({"lane": [(1,), (2,), (4,), (8,), (16,)]}, {"dim0": 32})
    dst = LinearLayout({"lane": [(1,), (2,), (4,), (8,), (16,)]}, {"x": 32})
    with pytest.raises(LayoutError, match=r"'dim0'.*'x'"):
        plan_conversion(src, dst, 16)


def test_different_warp_counts_are_refused():
    with pytest.raises(LayoutError, match="warp size 4 vs 8"):
        plan_conversion(blocked([64, 64], [1, 4], [8, 4], [4, 1], [1, 0]), blocked([64, 64], [1, 4], [8, 4], [8, 1], [1, 0]), 16)


def test_src_missing_elements_is_refused():
    src = LinearLayout({"lane": [(1,), (2,), (4,), (8,), (0,)]}, {"dim0": 32})
    dst = LinearLayout({"lane": [(1,), (2,), (4,), (8,), (16,)]}, {"dim0": 32})
    with pytest.raises(LayoutError, match="src does not hold every element"):
        plan_conversion(src, dst, 16)


def test_moving_data_between_ctas_is_refused():
    lanes = [(1,), (2,), (4,), (8,), (16,)]
    src = LinearLayout({"register": [(32,)], "lane": lanes, "block": [(64,)]}, {"dim0": 128})
    dst = LinearLayout({"register": [(64,)], "lane": lanes, "block": [(32,)]}, {"dim0": 128})
    with pytest.raises(LayoutError, match="between CTAs"):
        plan_conversion(src, dst, 16)


def test_unknown_in_dims_and_bad_element_bits_are_refused():
    shared = LinearLayout({"offset": [(1,), (2,)]}, {"dim0": 4})
    with pytest.raises(LayoutError, match="offset"):
        plan_conversion(shared, shared, 16)
    with pytest.raises(LayoutError, match="element_bits"):
        plan_conversion(*LANES_REVERSED, 12)


# ------------------------------------------------------------------------- executor
def test_collect_inverts_distribute_and_checks_copies():
    layout = slice_layout(wgmma_accumulator([64, 64], [4, 1], 64), 1)
    tensor = np.arange(64) * 3
    regs = distribute(tensor, layout)
    assert regs.shape == (1, 4, 32, 2)
    np.testing.assert_array_equal(collect(regs, layout), tensor)
    regs[0, 0, 1, 0] += 1  # lane 1 holds a copy of lane 0's element
    with pytest.raises(LayoutError, match="disagree"):
        collect(regs, layout)


def test_executor_catches_a_dishonest_plan():
    src, dst = LANES_REVERSED
    plan = plan_conversion(src, dst, 32)
    broken = WarpShuffle(plan.element_bits, plan.local_register, plan.rounds[:1])
    with pytest.raises(LayoutError, match="unwritten"):
        execute_plan(broken, distribute(np.arange(64).reshape(2, 32), src), src, dst)


# ---------------------------------------------------------------------------- speed
@pytest.mark.parametrize("element_bits", [16, 32])
def test_planning_a_128x256_tile_with_8_warps_is_fast(element_bits):
    src = blocked([128, 256], [1, 8], [4, 8], [8, 1], [1, 0])
    dst = wgmma_accumulator([128, 256], [8, 1], 256)
    plan_conversion(dst, src, element_bits)  # warm up imports and caches
    times = []
    for _ in range(7):
        # CPU time of this process: other jobs on a shared machine do not count.
        start = time.process_time()
        plan_conversion(dst, src, element_bits)
        times.append(time.process_time() - start)
    # The minimum is the cost itself; the median would also count other load on the machine.
    assert min(times) < 0.010, f"planning took {sorted(times)} s"
