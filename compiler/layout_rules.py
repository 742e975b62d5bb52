"""How shape-changing ops move layouts, and how reductions and broadcasts use them.

The frontend computes result layouts with these functions, the verifier re-checks them,
and the backend and the emulator read the same register maps and reduction plans, so the
CPU emulator executes exactly the data movement the GPU code performs.

All layouts here are distributed: in-dims register/lane/warp/block, out-dims dim0.. .
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layouts import LayoutError, LinearLayout
from ..layouts.gf2 import XorBasis

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


def remove_dim_layout(layout: LinearLayout, axis: int) -> LinearLayout:
    """The layout of a reduction's result along `axis` (Triton's SliceLayout).

    Bases lose their `axis` coordinate; lane/warp bases that moved only along `axis` become
    broadcasts; register bases that become zero or repeat an earlier register are dropped,
    because after the in-thread reduction those registers hold nothing new.
    """
    shape = list(layout.out_dims.values())
    if not 0 <= axis < len(shape):
        raise LayoutError(f"axis {axis} out of range for a rank-{len(shape)} tensor")
    del shape[axis]
    bases = {}
    for name, rows in _with_hardware_dims(layout).bases.items():
        projected = [tuple(b[:axis]) + tuple(b[axis + 1:]) for b in rows]
        if name == "register":
            kept = []
            for b in projected:
                if any(b) and b not in kept:
                    kept.append(b)
            projected = kept
        bases[name] = projected
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
    - `lane_masks`: XOR lane masks of the butterfly shuffles that combine lanes;
    - `warp_masks`: XOR warp masks combined through shared memory (scratch holds one value
      per (warp, lane, result register)).
    Every thread ends holding the full result for its result registers.
    """

    axis: int
    result_layout: LinearLayout
    register_groups: tuple[tuple[int, ...], ...]
    lane_masks: tuple[int, ...]
    warp_masks: tuple[int, ...]

    @property
    def needs_shared(self) -> bool:
        return bool(self.warp_masks)

    def scratch_elements(self, num_warps: int) -> int:
        return num_warps * 32 * len(self.register_groups) if self.warp_masks else 0


def plan_reduction(layout: LinearLayout, axis: int) -> ReductionPlan:
    """Split a reduction into in-thread folds, lane butterflies and a cross-warp exchange."""
    full = _with_hardware_dims(layout)
    result = remove_dim_layout(full, axis)
    bases = full.bases
    rank = len(full.out_dims)

    def project(basis):
        return tuple(basis[:axis]) + tuple(basis[axis + 1:])

    res_regs = result.bases["register"]
    res_solver = XorBasis(result.flatten_basis(b) for b in res_regs)
    groups: list[list[int]] = [[] for _ in range(1 << len(res_regs))]
    for reg in range(1 << len(bases["register"])):
        element = [0] * rank
        for bit, basis in enumerate(bases["register"]):
            if reg >> bit & 1:
                element = [e ^ v for e, v in zip(element, basis)]
        key = res_solver.solve(result.flatten_basis(project(element)))
        if key is None:  # cannot happen: result registers span the projected registers
            raise LayoutError("internal: reduction register outside the result layout")
        # A register repeating an element the thread already folded is a copy: skip it,
        # or a sum would count that element twice.
        if all(_element(bases["register"], other, rank) != element for other in groups[key]):
            groups[key].append(reg)

    lane_masks = _kernel_masks([result.flatten_basis(project(b)) for b in bases["lane"]],
                               [full.flatten_basis(b) for b in bases["lane"]])
    warp_masks = _kernel_masks([result.flatten_basis(project(b)) for b in bases["warp"]],
                               [full.flatten_basis(b) for b in bases["warp"]])
    # Every set of hardware indices holding one result element must be reachable by the
    # three stages: the kernel of the projected map must split into pure register, pure
    # lane and pure warp parts.
    columns = [result.flatten_basis(project(b)) for d in ("register", "lane", "warp") for b in bases[d]]
    kernel_dim = len(columns) - XorBasis(columns).rank
    register_columns = [result.flatten_basis(project(b)) for b in bases["register"]]
    register_kernel = len(register_columns) - XorBasis(register_columns).rank
    copies = [len(bases[d]) - XorBasis(full.flatten_basis(b) for b in bases[d]).rank for d in ("lane", "warp")]
    if kernel_dim != register_kernel + len(lane_masks) + len(warp_masks) + sum(copies):
        raise LayoutError(
            f"cannot reduce along axis {axis} in this layout: some lanes or warps hold the same "
            f"result elements as other registers; convert the operand to a blocked layout first"
        )
    return ReductionPlan(axis, result, tuple(tuple(g) for g in groups), lane_masks, warp_masks)


def reduction_in_warp(layout: LinearLayout, axis: int) -> bool:
    """Whether a reduction along `axis` combines lanes within each warp only (no exchange
    through shared memory), so that each warp may run it alone, e.g. in a branch taken
    warp by warp."""
    try:
        return not plan_reduction(layout, axis).warp_masks
    except LayoutError:
        return False


def _element(register_rows, reg: int, rank: int) -> list[int]:
    element = [0] * rank
    for bit, basis in enumerate(register_rows):
        if reg >> bit & 1:
            element = [e ^ v for e, v in zip(element, basis)]
    return element


def _kernel_masks(projected: list[int], unprojected: list[int]) -> tuple[int, ...]:
    """XOR masks over one hardware dim (lanes or warps) that a butterfly must combine.

    They span the index moves that stay inside one result element (the kernel of the
    projected map), leaving out moves between exact copies (the kernel of the unprojected
    map: broadcast lanes hold the same value, and combining them would count it twice).
    """
    def kernel(columns: list[int]) -> list[int]:
        masks = []
        for bit in XorBasis(columns).free_columns:
            combination = XorBasis(columns[:bit]).solve(columns[bit]) or 0
            masks.append(combination | (1 << bit))
        return masks

    span = XorBasis(kernel(unprojected))
    chosen = []
    for mask in kernel(projected):
        if span.add(mask):
            chosen.append(mask)
    return tuple(chosen)


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
