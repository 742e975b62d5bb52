"""Swizzle search: the scratch layout of a shared-memory round trip between two layouts.

The scratch layout S maps scratch offsets (in elements) to tensor coordinates. Choosing S is
choosing which tensor direction each offset bit walks, in three groups (low to high):

- vector bits: directions both layouts hold in registers, so one st/ld.shared moves several
  elements per thread (up to 128 bits). One side may take extra vector bits that the other
  side holds in lanes: those lanes then read adjacent words, which costs no wavefronts.
- bank bits: the rest of one 128-byte line (32 banks x 4 bytes).
- segment bits: which line. Two lanes of one access conflict exactly when they differ by a
  segment direction (module `banks`). So segment directions must avoid the span X_s of the
  store's vector + lanes and the span X_d of the load's. No space is the union of two
  proper subspaces, so a direction outside both always exists while both are proper: with
  a outside X_s and b outside X_d, one of a, b, a ^ b is outside both (this is the
  "optimal swizzling" of the linear-layouts paper, Triton's GenericSwizzling.cpp). A
  32-bit (or wider) access touches one line's worth of data per phase, so dim X <= the
  line bits and the segment bits always fit: both sides come out conflict-free unless a
  side accesses less than 32 bits per lane.

When the whole tile exceeds the scratch budget, directions that *both* layouts hold in
registers become `repetition` bits: iteration i stores and loads only the registers whose
repetition coordinate is i, with a barrier in between. Several vector choices are tried;
the cheapest in wavefronts (then instructions) wins.
"""

from __future__ import annotations

from typing import NamedTuple

from .banks import MAX_ACCESS_BITS, access_phases, extra_wavefronts
from .errors import LayoutError
from .gf2 import XorBasis
from .linear_layout import LinearLayout
from .plans import IN_DIMS, SharedRoundTrip, linear_table, register_copies, unique_register_bits
from .subspaces import independent, intersection, outside_both

LINE_BYTES = 128  # one wavefront: 32 banks x 4 bytes
# One bar.sync in the issue-slot units of conversion.py. A heuristic: beyond its issue slot
# a barrier exposes the store -> load latency and stalls every warp of the CTA.
BARRIER_COST = 8.0


class _Candidate(NamedTuple):
    key: tuple
    offsets: list  # flat tensor direction of each offset bit
    repetitions: list
    store_vector: int
    load_vector: int
    store_conflicts: int
    load_conflicts: int


class _Pair:
    """Facts about (src, dst) that every candidate scratch layout needs, computed once."""

    def __init__(self, src: LinearLayout, dst: LinearLayout, element_bits: int, max_scratch_bytes: int):
        self.src, self.dst, self.element_bits = src, dst, element_bits
        self.src_columns = {d: src.columns([d]) for d in IN_DIMS}
        self.dst_columns = {d: dst.columns([d]) for d in IN_DIMS}
        thread_space = XorBasis(src.columns(IN_DIMS[:3]))
        self.thread_rank = thread_space.rank
        s, d = self.src_columns, self.dst_columns
        lanes_warps = _nonzero(s["lane"] + s["warp"] + d["lane"] + d["warp"])
        # Directions a CTA id adds inside the tile (src blocks that repeat thread directions,
        # dst blocks that differ from src's) must not be repetition bits: every CTA runs the
        # same iteration tables.
        block_shifts = s["block"] + [a ^ b for a, b in zip(s["block"], d["block"])]
        self.lanes_warps = lanes_warps + [v for v in block_shifts if v and thread_space.contains(v)]
        self.common = common_registers(s["register"], d["register"])
        self.budget = max(1, max_scratch_bytes * 8 // element_bits)
        self.repetitions_needed = max(0, self.thread_rank - _log2(self.budget))
        self.unique_src_bits = unique_register_bits(src)
        self.unique_dst_bits = unique_register_bits(dst)


def _log2(value: int) -> int:
    return value.bit_length() - 1


def _nonzero(vectors) -> list[int]:
    return [v for v in vectors if v]


def _extend(base: list[int], pool, limit: int) -> list[int]:
    result, basis = list(base), XorBasis(base)
    for vector in pool:
        if len(result) >= limit:
            break
        if basis.add(vector):
            result.append(vector)
    return result


def _solve_all(solver: XorBasis, columns) -> list[int]:
    """Each column as a combination of the solver's columns (a scratch position)."""
    solutions = [solver.solve(c) for c in columns]
    if any(x is None for x in solutions):
        raise LayoutError("internal: the scratch layout misses an element of the tile")
    return solutions


def _prefix_in(vectors: list[int], span: XorBasis) -> int:
    count = 0
    while count < len(vectors) and span.contains(vectors[count]):
        count += 1
    return count


def common_registers(src_registers, dst_registers) -> list[int]:
    """A basis of span(src registers) ∩ span(dst registers), src register images first."""
    target, chosen = XorBasis(dst_registers), XorBasis()
    result = [v for v in src_registers if v and target.contains(v) and chosen.add(v)]
    result += [v for v in intersection(src_registers, dst_registers) if chosen.add(v)]
    return result


def vector_candidates(pair: _Pair) -> list[list[int]]:
    """Vector-bit choices to try: shared register directions (all, or leaving the last ones
    free for repetitions, or one word's worth), and each side widened with its registers
    that the other side holds in lanes."""
    limit = _log2(MAX_ACCESS_BITS // pair.element_bits)
    word = _log2(32 // pair.element_bits) if pair.element_bits < 32 else 0
    common = pair.common
    left = common[: max(0, len(common) - pair.repetitions_needed)]
    candidates = []
    for base in (common[:limit], left[:limit], common[: min(limit, word)]):
        candidates.append(base)
        for mine, theirs in ((pair.src_columns, pair.dst_columns), (pair.dst_columns, pair.src_columns)):
            their_lanes = XorBasis(theirs["lane"])
            in_their_lanes = [v for v in mine["register"] if v and their_lanes.contains(v)]
            candidates.append(_extend(base, in_their_lanes, limit))
            filled = _extend(base, _nonzero(mine["register"]), word)
            candidates.append(_extend(filled, in_their_lanes, limit))
    unique = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def plan_shared_round_trip(
    src: LinearLayout, dst: LinearLayout, element_bits: int, max_scratch_bytes: int
) -> SharedRoundTrip:
    """The SharedRoundTrip of the cheapest scratch layout found (normalized layouts in)."""
    pair = _Pair(src, dst, element_bits, max_scratch_bytes)
    best = min((_build(pair, vector) for vector in vector_candidates(pair)), key=lambda c: c.key)
    return _with_tables(pair, best)


def _build(pair: _Pair, vector: list[int]) -> _Candidate:
    bits, s, d = pair.element_bits, pair.src_columns, pair.dst_columns
    # Repetitions: shared register directions outside the lanes, warps and vector bits.
    spanned, repetitions = XorBasis(vector + pair.lanes_warps), []
    for v in reversed(pair.common):
        if len(repetitions) < pair.repetitions_needed and spanned.add(v):
            repetitions.append(v)
    # The window: directions one iteration's buffer spans (vector, lanes, warps, registers).
    window = independent(vector + pair.lanes_warps)
    grow = XorBasis(window + repetitions)
    window += [v for v in s["register"] + d["register"] if grow.add(v)]
    if len(window) + len(repetitions) != pair.thread_rank:
        raise LayoutError(
            f"internal: scratch directions do not cover the tile ({len(window)} + {len(repetitions)} "
            f"!= {pair.thread_rank}); src out-dims {pair.src.out_dims}"
        )
    unique_src, unique_dst = 1 << len(pair.unique_src_bits), 1 << len(pair.unique_dst_bits)
    store_bits = _prefix_in(vector, XorBasis(s["register"]))
    load_bits = _prefix_in(vector, XorBasis(d["register"]))
    offsets = _offset_directions(
        window, vector, s, d, bits,
        store_weight=(unique_src >> store_bits) * access_phases(1 << store_bits, bits),
        load_weight=(unique_dst >> load_bits) * access_phases(1 << load_bits, bits),
        store_bits=store_bits, load_bits=load_bits,
    )
    solver = XorBasis(offsets + repetitions + s["block"])
    offset_mask = (1 << len(offsets)) - 1
    store_vector, store_conflicts = _access(
        {dim: [x & offset_mask for x in _solve_all(solver, s[dim])] for dim in IN_DIMS[1:]}, store_bits, bits
    )
    load_vector, load_conflicts = _access(
        {dim: [x & offset_mask for x in _solve_all(solver, d[dim])] for dim in IN_DIMS[1:]}, load_bits, bits
    )
    store_instructions = unique_src // store_vector
    load_instructions = unique_dst // load_vector
    iterations = 1 << len(repetitions)
    cost = (
        store_instructions * (access_phases(store_vector, bits) + store_conflicts)
        + load_instructions * (access_phases(load_vector, bits) + load_conflicts)
        + BARRIER_COST * (2 * iterations - 1)
    )
    key = (1 << len(window) > pair.budget, cost, store_instructions + load_instructions, iterations)
    return _Candidate(key, offsets, repetitions, store_vector, load_vector, store_conflicts, load_conflicts)


def _offset_directions(window, vector, src_columns, dst_columns, element_bits, *,
                       store_weight, load_weight, store_bits, load_bits) -> list[int]:
    """Vector, bank and segment directions (in offset-bit order) spanning the window."""
    size = len(window)
    line_bits = _log2(LINE_BYTES * 8 // element_bits)
    segments_needed = size - max(len(vector), min(line_bits, size))
    store_tile = src_columns["lane"][: _phase_lane_bits(store_bits, element_bits)]
    load_tile = dst_columns["lane"][: _phase_lane_bits(load_bits, element_bits)]
    avoid_store = XorBasis(vector + store_tile)
    avoid_load = XorBasis(vector + load_tile)
    pool = _nonzero(src_columns["warp"] + dst_columns["warp"]) + window[len(vector):] + window
    placed = XorBasis(vector)
    segments = []
    while len(segments) < segments_needed:
        direction = outside_both(avoid_store, avoid_load, pool)
        if direction is None:
            # One access already fills the rest of the window: conflicts are unavoidable;
            # keep the side with more wavefronts conflict-free if it still can be.
            keep = avoid_store if store_weight >= load_weight else avoid_load
            direction = next((v for v in pool if not keep.contains(v)), None)
            if direction is None:
                direction = next(v for v in pool if not placed.contains(v))
        segments.append(direction)
        for span in (avoid_store, avoid_load, placed):
            span.add(direction)
    banks = independent(_nonzero(store_tile + load_tile) + pool, within=vector + segments)
    return vector + banks + segments


def _phase_lane_bits(vector_bits: int, element_bits: int) -> int:
    return _log2(32 // access_phases(1 << vector_bits, element_bits))


def _access(offsets: dict[str, list[int]], vector_bits: int, element_bits: int) -> tuple[int, int]:
    """Widest aligned vector (at most 2^vector_bits) and its bank conflicts for one side,
    from the scratch offsets of each lane, warp and block bit."""
    thread_offsets = [o for dim in IN_DIMS[1:] for o in offsets[dim]]
    while vector_bits and any(o & ((1 << vector_bits) - 1) for o in thread_offsets):
        vector_bits -= 1  # a lane's vector must start at a multiple of its length
    return 1 << vector_bits, extra_wavefronts(offsets["lane"], 1 << vector_bits, element_bits)


def _groups(unique_bits: list[int], mapping: LinearLayout, vector: int, iterations: int):
    """Per iteration, the instructions: unique registers in offset order, `vector` each."""
    registers = linear_table([1 << b for b in unique_bits])
    offset, repetition, _ = mapping(register=registers)
    per_iteration = [dict() for _ in range(iterations)]
    for register, o, r in zip(registers.tolist(), offset.tolist(), repetition.tolist()):
        per_iteration[r].setdefault(o // vector, {})[o % vector] = register
    result = []
    for groups in per_iteration:
        instructions = []
        for base in sorted(groups):
            lanes = groups[base]
            if sorted(lanes) != list(range(vector)):
                raise LayoutError(f"internal: vector group at offset {base * vector} is incomplete: {lanes}")
            instructions.append(tuple(lanes[i] for i in range(vector)))
        result.append(tuple(instructions))
    return tuple(result)


def _with_tables(pair: _Pair, best: _Candidate) -> SharedRoundTrip:
    src, dst = pair.src, pair.dst
    scratch = LinearLayout(
        {
            "offset": [src.unflatten_out(v) for v in best.offsets],
            "repetition": [src.unflatten_out(v) for v in best.repetitions],
            "block": [src.unflatten_out(v) for v in pair.src_columns["block"]],
        },
        src.out_dims,
    )
    solver = XorBasis(scratch.columns())
    scratch_in = tuple(scratch.in_dims.items())
    store_map = LinearLayout.from_columns(_solve_all(solver, src.columns()), tuple(src.in_dims.items()), scratch_in)
    load_map = LinearLayout.from_columns(_solve_all(solver, dst.columns()), tuple(dst.in_dims.items()), scratch_in)
    iterations = 1 << len(best.repetitions)
    return SharedRoundTrip(
        element_bits=pair.element_bits,
        scratch=scratch,
        store_map=store_map,
        load_map=load_map,
        store_vector=best.store_vector,
        load_vector=best.load_vector,
        store_conflicts=best.store_conflicts,
        load_conflicts=best.load_conflicts,
        store_groups=_groups(pair.unique_src_bits, store_map, best.store_vector, iterations),
        load_groups=_groups(pair.unique_dst_bits, load_map, best.load_vector, iterations),
        register_copies=register_copies(dst),
    )


def shared_cost(plan: SharedRoundTrip) -> float:
    """Wavefronts of all stores and loads plus the barriers, per warp."""
    bits = plan.element_bits
    stores = sum(len(g) for g in plan.store_groups)
    loads = sum(len(g) for g in plan.load_groups)
    return (
        stores * (access_phases(plan.store_vector, bits) + plan.store_conflicts)
        + loads * (access_phases(plan.load_vector, bits) + plan.load_conflicts)
        + BARRIER_COST * (2 * plan.iterations - 1)
    )
