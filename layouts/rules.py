"""How shape-changing ops move layouts, and how reductions and broadcasts use them.

Functions of linear layouts, shared by every layer above: the language ops and the
layout inference compute result layouts with them (and with the one slice rule,
`standard.slice_layout`, which SliceLayout and reductions both use), the verifier
re-checks them, and the backend and the emulator read the same register maps, reduction
plans (recorded on each reduce by the compiler's planning pass) and shared-memory
addressing, so the CPU emulator executes exactly the data movement the GPU code performs.

Distributed layouts here have in-dims register/lane/warp/block and out-dims dim0.. ;
shared layouts (the addressing functions at the end) offset/block -> dim0.. .
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayoutError
from .gf2 import XorBasis
from .linear_layout import LinearLayout
from .standard import slice_layout

HARDWARE_DIMS = ("register", "lane", "warp", "block")


def _dims(shape) -> list[tuple[str, int]]:
    return [(f"dim{i}", int(s)) for i, s in enumerate(shape)]


def _with_hardware_dims(layout: LinearLayout) -> LinearLayout:
    """The same layout with every hardware in-dim present, in the standard order."""
    bases = layout.bases
    return LinearLayout({d: bases.get(d, ()) for d in HARDWARE_DIMS}, layout.out_dims)


def expand_dims_layout(layout: LinearLayout, axis: int) -> LinearLayout:
    """The operand's layout with a size-1 dim inserted at `axis` (nothing moves)."""
    rank = len(layout.out_dims)
    if not 0 <= axis <= rank:
        raise LayoutError(f"expand_dims axis {axis} out of range for a rank-{rank} tensor")
    shape = list(layout.out_dims.values())
    shape.insert(axis, 1)
    bases = {n: [tuple(b[:axis]) + (0,) + tuple(b[axis:]) for b in rows] for n, rows in layout.bases.items()}
    return LinearLayout(bases, _dims(shape))


def permute_layout(layout: LinearLayout, order) -> LinearLayout:
    """Result dim i is operand dim order[i]; no data moves."""
    order = tuple(order)
    rank = len(layout.out_dims)
    if sorted(order) != list(range(rank)):
        raise LayoutError(f"permute order {list(order)} is not a permutation of {list(range(rank))}")
    shape = list(layout.out_dims.values())
    bases = {n: [tuple(b[i] for i in order) for b in rows] for n, rows in layout.bases.items()}
    return LinearLayout(bases, _dims([shape[i] for i in order]))


def reshape_layout(layout: LinearLayout, new_shape) -> LinearLayout:
    """Row-major reshape (the last dim is the most minor); no data moves."""
    old_names = list(layout.out_dims)
    row_major = layout.transpose_outs(list(reversed(old_names)))
    new_dims = _dims(new_shape)
    reshaped = row_major.reshape_outs(list(reversed(new_dims)))
    return reshaped.transpose_outs([n for n, _ in new_dims])


def broadcast_register_map(source: LinearLayout, result: LinearLayout) -> tuple[int, ...]:
    """For each register of `result`, the register of `source` holding its element.

    `source` has size 1 in every dim that `result` stretches. Valid only when each thread
    already holds what it needs: lane/warp/block bases of the result, with stretched dims
    zeroed, equal the source's. Otherwise LayoutError (convert the operand first).
    """
    shape_s = list(source.out_dims.values())
    shape_r = list(result.out_dims.values())
    if len(shape_s) != len(shape_r):
        raise LayoutError(f"broadcast from rank {len(shape_s)} to rank {len(shape_r)}")
    for a, b in zip(shape_s, shape_r):
        if a != b and a != 1:
            raise LayoutError(f"cannot broadcast shape {shape_s} to {shape_r}")
    keep = [a == b for a, b in zip(shape_s, shape_r)]

    def project(basis):
        return tuple(v if k else 0 for v, k in zip(basis, keep))

    src = _with_hardware_dims(source).bases
    res = _with_hardware_dims(result).bases
    for dim in ("lane", "warp", "block"):
        projected = [project(b) for b in res[dim]]
        if len(projected) != len(src[dim]) or any(p != s for p, s in zip(projected, src[dim])):
            raise LayoutError(
                f"broadcast needs the threads to keep their elements: result {dim} bases "
                f"{projected} (stretched dims zeroed) differ from the operand's {list(src[dim])}"
            )
    solver = XorBasis(source.flatten_basis(b) for b in src["register"])
    registers = []
    for index in range(1 << len(res["register"])):
        target = 0
        for bit, basis in enumerate(res["register"]):
            if index >> bit & 1:
                target ^= source.flatten_basis(project(basis))
        solution = solver.solve(target)
        if solution is None:
            raise LayoutError(
                f"broadcast: result register {index} holds an element the thread does not have"
            )
        registers.append(solution)
    return tuple(registers)


@dataclass(frozen=True)
class ReductionPlan:
    """How a reduction along `axis` runs, in three stages.

    - `register_groups[k]`: operand registers folded (in this order) into result register k;
    - `lane_steps`: (lane mask, register xor) pairs: butterfly shuffles in which result
      register k of a lane combines with result register k ^ (register xor) of lane ^ mask;
    - `warp_steps`: (warp mask, lane xor, register xor) triples combined through shared
      memory (scratch holds one value per (warp, lane, result register)).
    A nonzero register or lane xor appears where the layout mixes the reduced dim with a
    kept one (a lane basis (1, 1) beside a register basis (0, 1), reduced along dim0).
    Every thread ends holding the full result for its result registers.
    `scratch_bytes`: the shared scratch the warp stage needs, which depends on the
    partition's warps and the element type as well, so the planning pass fills it in
    (compiler/passes/plan_data_movement.py).
    """

    axis: int
    result_layout: LinearLayout
    register_groups: tuple[tuple[int, ...], ...]
    lane_steps: tuple[tuple[int, int], ...]
    warp_steps: tuple[tuple[int, int, int], ...]
    scratch_bytes: int = 0

    @property
    def warp_masks(self) -> tuple[int, ...]:
        return tuple(step[0] for step in self.warp_steps)

    @property
    def warps_only(self) -> bool:
        """Whether every warp step combines the same lane and register of other warps."""
        return all(lane == 0 and register == 0 for _, lane, register in self.warp_steps)

    @property
    def needs_shared(self) -> bool:
        return bool(self.warp_steps)

    def scratch_elements(self, num_warps: int) -> int:
        return num_warps * 32 * len(self.register_groups) if self.warp_steps else 0


def reduce_layout(layout: LinearLayout, axis: int) -> LinearLayout:
    """The layout of a reduction's result along `axis`: the slice rule, over every
    hardware dim (what the frontend builds and the verifier checks; the plan agrees)."""
    full = _with_hardware_dims(layout)
    if not 0 <= axis < len(full.out_dims):
        raise LayoutError(f"axis {axis} out of range for a rank-{len(full.out_dims)} tensor")
    return slice_layout(full, axis)


def plan_reduction(layout: LinearLayout, axis: int) -> ReductionPlan:
    """Split a reduction into in-thread folds, lane butterflies and a cross-warp exchange.

    In GF(2) terms: the hardware indices holding one result element form a coset of the
    kernel of P (the layout followed by dropping `axis`); indices in the kernel of the
    layout itself hold the same element twice and must be combined once only. Each stage
    takes the kernel vectors of P whose highest bit lies in its hardware dim (registers,
    then lanes, then warps), keeping those that add an element not yet counted.
    """
    full = _with_hardware_dims(layout)
    result = reduce_layout(layout, axis)
    bases = full.bases
    rank = len(full.out_dims)

    def project(basis):
        return tuple(basis[:axis]) + tuple(basis[axis + 1:])

    res_regs = result.bases["register"]
    res_solver = XorBasis(result.flatten_basis(b) for b in res_regs)
    groups: list[list[int]] = [[] for _ in range(1 << len(res_regs))]
    for reg in range(1 << len(bases["register"])):
        element = _element(bases["register"], reg, rank)
        key = res_solver.solve(result.flatten_basis(project(element)))
        if key is None:  # cannot happen: result registers span the projected registers
            raise LayoutError("internal: reduction register outside the result layout")
        # A register repeating an element the thread already folded is a copy: skip it,
        # or a sum would count that element twice.
        if all(_element(bases["register"], other, rank) != element for other in groups[key]):
            groups[key].append(reg)

    sizes = [len(bases[d]) for d in ("register", "lane", "warp")]
    hardware = [b for d in ("register", "lane", "warp", "block") for b in bases[d]]
    projected = [result.flatten_basis(project(b)) for b in hardware]
    counted = XorBasis(_kernel([full.flatten_basis(b) for b in hardware]))
    steps: dict[str, list] = {"register": [], "lane": [], "warp": []}
    for vector in _kernel(projected):  # ascending highest bit: registers, lanes, warps, blocks
        if not counted.add(vector):
            continue  # moves only between copies of elements already counted
        if vector >> sum(sizes):
            raise LayoutError(
                f"cannot reduce along axis {axis}: the CTAs of the cluster hold different "
                f"elements along it (block bases {list(bases['block'])}); convert the operand "
                f"to a layout whose block bases do not move along dim{axis} first")
        register = vector & ((1 << sizes[0]) - 1)
        lane = vector >> sizes[0] & ((1 << sizes[1]) - 1)
        warp = vector >> (sizes[0] + sizes[1])
        # The result register holding what operand register `register` adds.
        shift = res_solver.solve(result.flatten_basis(project(_element(bases["register"], register, rank))))
        stage = "warp" if warp else "lane" if lane else "register"
        steps[stage].append((lane, shift) if stage == "lane" else (warp, lane, shift))
    return ReductionPlan(axis, result, tuple(tuple(g) for g in groups),
                         tuple(steps["lane"]), tuple(steps["warp"]))


def reduction_in_warp(layout: LinearLayout, axis: int) -> bool:
    """Whether a reduction along `axis` combines lanes within each warp only (no exchange
    through shared memory), so that each warp may run it alone, e.g. in a branch taken
    warp by warp."""
    try:
        return not plan_reduction(layout, axis).warp_steps
    except LayoutError:
        return False


def _element(register_rows, reg: int, rank: int) -> list[int]:
    element = [0] * rank
    for bit, basis in enumerate(register_rows):
        if reg >> bit & 1:
            element = [e ^ v for e, v in zip(element, basis)]
    return element


def _kernel(columns: list[int]) -> list[int]:
    """A basis of the kernel of the map with these columns, as input bit masks: one vector
    per column in the span of the earlier ones, whose highest bit is that column."""
    basis = XorBasis()
    vectors = []
    for bit, column in enumerate(columns):
        if not basis.add(column):
            vectors.append((XorBasis(columns[:bit]).solve(column) or 0) | (1 << bit))
    return vectors


# ----------------------------------------------------------- shared-memory addressing
# A shared buffer is addressed through `addressing`: tensor dims -> element offset, the
# minimal inverse of its shared layout. Views (index, slice) derive their addressing from
# their root's. The backend and the emulator both use these, so both address alike.

def shared_addressing(shared_layout: LinearLayout) -> LinearLayout:
    """dims -> offset for a shared layout (offset[, block] -> dims): its minimal inverse."""
    inverse = shared_layout.pseudo_invert()
    return inverse.sublayout(inverse.in_dim_names, ["offset"])


def is_row_major(addressing: LinearLayout, shape) -> bool:
    """Whether `addressing` (dims -> offset) puts the elements one after another in
    row-major order, as a plain byte copy (cp.async.bulk) writes them."""
    stride = 1
    strides = []
    for size in reversed(tuple(shape)):
        strides.append(stride)
        stride *= size
    strides.reverse()
    bases = addressing.bases
    return all(bases.get(f"dim{d}", ()) == tuple((s << bit,) for bit in range((size - 1).bit_length()))
               for d, (size, s) in enumerate(zip(shape, strides)))


def _renumbered(bases: dict, size: int) -> LinearLayout:
    return LinearLayout({f"dim{i}": rows for i, rows in enumerate(bases.values())}, {"offset": size})


def shared_index_addressing(addressing: LinearLayout, shape, xor: int) -> LinearLayout:
    """Addressing of sub-buffer i of the leading dim (its element offset is i * stride).

    The leading dim must own the top offset bits (bases stride, 2 * stride, ...), so every
    sub-buffer is a contiguous block with the same addressing as the rest of the dims.
    """
    stride = 1
    for size in shape[1:]:
        stride *= size
    bases = addressing.bases
    leading = bases.pop("dim0")
    if any(row != (stride << bit,) for bit, row in enumerate(leading)) or xor >= stride:
        raise LayoutError(
            "shared_index needs the indexed dim to be the outermost of the shared layout "
            f"(offset bases {[stride << b for b in range(len(leading))]}), found {list(leading)}")
    return _renumbered(bases, addressing.out_dims["offset"])


def shared_slice_addressing(addressing: LinearLayout, dim: int, start: int, size: int):
    """(addressing, offset XOR) of a window [start, start + size) along `dim`.

    With size a power of two and start a multiple of it, c + start = c XOR start: the
    window keeps the low bits of `dim` and XORs in the offset of `start`.
    """
    name = f"dim{dim}"
    bases = addressing.bases
    start_offset = 0
    for bit, (value,) in enumerate(bases[name]):
        if start >> bit & 1:
            start_offset ^= value
    bases[name] = bases[name][:size.bit_length() - 1]
    return LinearLayout(bases, addressing.out_dims), start_offset
