"""Named hardware layouts: constructors that return a `LinearLayout` for a tensor shape.

Register (distributed) layouts map the in-dims `register`, `lane`, `warp`, `block` (in that
order; `block` has no bases: one CTA) to the out-dims `dim0`, `dim1`, ... of a tensor, with
the tensor's shape as their sizes. Shared-memory layouts map `offset` (counted in elements,
not bytes) and `block` to the same out-dims.

Each register-layout constructor first builds the layout of one *tile*: what all warps cover with one set of
registers. The tile is then fitted to the shape as Triton does (`combineCtaCgaWithShape` in
LinearLayoutConversions.cpp):

- a shape larger than the tile *repeats* it in registers: register bits are appended one
  out-dim at a time, in the layout's repeat order (minor dim first);
- a shape smaller than the tile *wraps*: coordinates are taken modulo the shape. Lane and
  warp bases that fall outside become zero (several threads hold the same element);
  register bases that fall outside are dropped, so a thread never holds one element in
  two registers. (Triton keeps them as zero bases; weft drops them.)

Worked example: `blocked([4, 8], [1, 2], [4, 8], [1, 1], [1, 0])` has a 4 x 16 tile (two
registers along dim1, 8 lanes along dim1, then 4 lanes along dim0). The shape has only 8
columns, so lane bit 2 (column 8) wraps to a zero basis, and lanes l and l ^ 4 hold the same
elements::

    register [(0, 1)]
    lane     [(0, 2), (0, 4), (0, 0), (1, 0), (2, 0)]
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from .errors import LayoutError
from .gf2 import XorBasis
from .linear_layout import LinearLayout, identity_1d, zeros_1d

__all__ = [
    "blocked",
    "slice_layout",
    "mma_v2",
    "wgmma_accumulator",
    "dot_operand",
    "wgmma_operand_a",
    "nvmma_shared",
    "swizzled_shared",
    "default_nvmma_swizzle",
]

REGISTER_IN_DIMS = ("register", "lane", "warp", "block")
LANES_PER_WARP = 32
MAX_WARPS_PER_CTA = 32  # 1024 threads
WARPS_PER_WARPGROUP = 4


# ------------------------------------------------------------------------ validation
def _is_power_of_two(value) -> bool:
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and value >= 1
        and value & (value - 1) == 0
    )


def _checked_shape(shape: Sequence[int], function: str, min_rank: int = 1) -> tuple[int, ...]:
    """The shape as a tuple of ints; LayoutError unless every size is a power of two."""
    shape = tuple(shape)
    if len(shape) < min_rank:
        raise LayoutError(f"{function}: shape {list(shape)} needs at least {min_rank} dims")
    for dim, size in enumerate(shape):
        if not _is_power_of_two(size):
            raise LayoutError(
                f"{function}: shape[{dim}] = {size!r} is not a power of two (shape {list(shape)})"
            )
    return tuple(int(size) for size in shape)


def _checked_per_dim(
    values: Sequence[int], name: str, shape: tuple[int, ...], function: str
) -> tuple[int, ...]:
    """One power of two per dim of `shape`, else LayoutError naming `name`."""
    values = tuple(values)
    if len(values) != len(shape):
        raise LayoutError(
            f"{function}: {name} {list(values)} has {len(values)} entries but shape "
            f"{list(shape)} has {len(shape)} dims"
        )
    for dim, value in enumerate(values):
        if not _is_power_of_two(value):
            raise LayoutError(
                f"{function}: {name}[{dim}] = {value!r} is not a power of two "
                f"({name} {list(values)}, shape {list(shape)})"
            )
    return tuple(int(value) for value in values)


def _checked_order(order: Sequence[int], shape: tuple[int, ...], function: str) -> tuple[int, ...]:
    order = tuple(order)
    all_ints = all(isinstance(d, (int, np.integer)) for d in order)
    if not all_ints or sorted(order) != list(range(len(shape))):
        raise LayoutError(
            f"{function}: order {list(order)} must list every dim of shape {list(shape)} "
            f"exactly once, minor dim first"
        )
    return tuple(int(d) for d in order)


def _checked_warps(
    warps_per_cta: Sequence[int], shape: tuple[int, ...], function: str
) -> tuple[int, ...]:
    warps = _checked_per_dim(warps_per_cta, "warps_per_cta", shape, function)
    if math.prod(warps) > MAX_WARPS_PER_CTA:
        raise LayoutError(
            f"{function}: warps_per_cta {list(warps)} asks for {math.prod(warps)} warps; "
            f"a CTA holds at most {MAX_WARPS_PER_CTA} (1024 threads)"
        )
    return warps


def _check_warpgroups(warps: tuple[int, ...], function: str) -> None:
    # wgmma is issued by a warpgroup: 4 consecutive warps that split the 64 rows of m64.
    if warps[-2] % WARPS_PER_WARPGROUP:
        raise LayoutError(
            f"{function}: warps_per_cta[{len(warps) - 2}] = {warps[-2]} (warps_per_cta "
            f"{list(warps)}) must be a multiple of {WARPS_PER_WARPGROUP}: wgmma runs on whole "
            f"warpgroups of 4 warps stacked along M"
        )


# -------------------------------------------------------------------- tile building
def _dim(d: int) -> str:
    return f"dim{d}"


def _matrix_order(rank: int, row_major: bool) -> tuple[int, ...]:
    """Minor-first order of a batch of matrices [..., rows, cols] (Triton's getMatrixOrder)."""
    order = list(range(rank - 1, -1, -1))
    if not row_major:
        order[0], order[1] = order[1], order[0]
    return tuple(order)


def _identity_nd(in_dim: str, sizes: Sequence[int], order: Sequence[int]) -> LinearLayout:
    """`in_dim` counts through a `sizes` box, dims taken in `order` (minor first).

    The out-dims are listed in `order`, which makes it the repeat order of `_fit_to_shape`.
    """
    layout = LinearLayout({in_dim: []}, [])
    for d in order:
        layout = layout * identity_1d(sizes[d], in_dim, _dim(d))
    return layout


def _fit_to_shape(tile: LinearLayout, shape: tuple[int, ...]) -> LinearLayout:
    """Repeat or wrap `tile` so that its out-dims are exactly `shape` (see module doc).

    The tile's out-dim order is the repeat order, minor dim first.
    """
    layout = tile
    for name in tile.out_dim_names:
        wanted, have = shape[int(name[3:])], layout.out_dims[name]
        if wanted > have:
            layout = layout * identity_1d(wanted // have, "register", name)
    names = layout.out_dim_names
    masks = [shape[int(name[3:])] - 1 for name in names]
    bases = {}
    old_bases = layout.bases
    for in_dim in REGISTER_IN_DIMS:
        kept = []
        for row in old_bases.get(in_dim, ()):
            wrapped = tuple(value & mask for value, mask in zip(row, masks))
            if in_dim == "register" and any(row) and not any(wrapped):
                continue  # a register beyond the shape would only duplicate another one
            kept.append(wrapped)
        bases[in_dim] = kept
    fitted = LinearLayout(bases, [(name, mask + 1) for name, mask in zip(names, masks)])
    return fitted.transpose_outs([_dim(d) for d in range(len(shape))])


def _mma_warp_tile(
    inner: int,
    outer: int,
    inner_size: int,
    outer_size: int,
    k_width: int,
    repeat_order: Sequence[int],
) -> LinearLayout:
    """One warp's share of a tensor-core fragment (Triton's nvidiaMmaTile).

    Every mma.sync / wgmma register fragment has the same shape: a thread holds `k_width`
    consecutive elements along the `inner` dim, 4 lanes continue along `inner`, 8 lanes go
    down `outer`; then registers repeat down `outer` (in steps of 8) and then along
    `inner` (in steps of 4 * k_width) until the fragment is `outer_size` x `inner_size`.
    """
    layout = LinearLayout({"register": []}, [(_dim(d), 1) for d in repeat_order])
    steps = (
        ("register", k_width, inner),
        ("lane", 4, inner),
        ("lane", 8, outer),
        ("register", outer_size // 8, outer),
        ("register", inner_size // (4 * k_width), inner),
    )
    for in_dim, size, dim in steps:
        layout = layout * identity_1d(size, in_dim, _dim(dim))
    return layout


def _mma_warps(
    warps: Sequence[int], warp_order: Sequence[int], broadcast_dim: Optional[int] = None
) -> LinearLayout:
    """Warps tiled in `warp_order`; along `broadcast_dim` (K of an operand) they all hold the
    same data, since every warp along the output's N (for A) or M (for B) needs all of K."""
    layout = LinearLayout({"warp": []}, [])
    for d in warp_order:
        make = zeros_1d if d == broadcast_dim else identity_1d
        layout = layout * make(warps[d], "warp", _dim(d))
    return layout


# --------------------------------------------------------------------- constructors
def blocked(
    shape: Sequence[int],
    size_per_thread: Sequence[int],
    threads_per_warp: Sequence[int],
    warps_per_cta: Sequence[int],
    order: Sequence[int],
) -> LinearLayout:
    """Triton's BlockedEncoding: each thread holds a `size_per_thread` box of contiguous
    elements, the 32 lanes of a warp tile `threads_per_warp` such boxes, and the warps tile
    `warps_per_cta` warp tiles. Within each level, dims are filled in `order` (minor dim
    first). Larger shapes repeat the CTA tile in registers, smaller ones wrap.
    """
    function = "blocked"
    shape = _checked_shape(shape, function)
    per_thread = _checked_per_dim(size_per_thread, "size_per_thread", shape, function)
    threads = _checked_per_dim(threads_per_warp, "threads_per_warp", shape, function)
    warps = _checked_warps(warps_per_cta, shape, function)
    order = _checked_order(order, shape, function)
    if math.prod(threads) != LANES_PER_WARP:
        raise LayoutError(
            f"{function}: threads_per_warp {list(threads)} covers {math.prod(threads)} lanes; "
            f"a warp has exactly {LANES_PER_WARP} (shape {list(shape)})"
        )
    tile = (
        _identity_nd("register", per_thread, order)
        * _identity_nd("lane", threads, order)
        * _identity_nd("warp", warps, order)
    )
    return _fit_to_shape(tile, shape)


def slice_layout(parent: LinearLayout, dim: int) -> LinearLayout:
    """Triton's SliceEncoding: the parent layout with tensor dim `dim` removed.

    This is the one slice rule of weft: a reduction's result, a `SliceLayout` and the
    operand of an `expand_dims` all use it, so they always agree.

    The remaining out-dims are renumbered dim0, dim1, ...; a base that only moved along
    `dim` becomes zero (threads that differed only along `dim` now hold the same element).
    Register bases in the span of earlier register bases (zero ones included) are dropped,
    so a thread holds each element of the slice once: with register bases (1, 1), (2, 2),
    (0, 3) sliced along dim0, the third, (3), is (1) XOR (2), and registers 0 and 7 of the
    parent (rows 0 and 3 of column 0) fold into register 0 of the slice. A register layout
    (in-dims among register, lane, warp, block) comes back with all four in-dims.
    """
    function = "slice_layout"
    rank = len(parent.out_dims)
    names = [_dim(d) for d in range(rank)]
    if sorted(parent.out_dim_names) != sorted(names) or rank < 1:
        raise LayoutError(
            f"{function}: the parent's out-dims {parent.out_dims} must be dim0..dim{rank - 1} "
            f"of a tensor with at least 1 dim"
        )
    if not isinstance(dim, (int, np.integer)) or not 0 <= dim < rank:
        raise LayoutError(
            f"{function}: dim {dim!r} is not a dim of the parent's out-dims {parent.out_dims}"
        )
    parent = parent.transpose_outs(names)
    kept_dims = [d for d in range(rank) if d != dim]
    out_dims = [(_dim(new), parent.out_dims[_dim(old)]) for new, old in enumerate(kept_dims)]
    flat = LinearLayout({}, out_dims)
    parent_bases = parent.bases
    if set(parent_bases) <= set(REGISTER_IN_DIMS):
        parent_bases = {name: parent_bases.get(name, ()) for name in REGISTER_IN_DIMS}
    bases = {}
    for in_dim, rows in parent_bases.items():
        projected = [tuple(row[d] for d in kept_dims) for row in rows]
        if in_dim == "register":
            span = XorBasis()
            projected = [row for row in projected if span.add(flat.flatten_basis(row))]
        bases[in_dim] = projected
    return LinearLayout(bases, out_dims)


def mma_v2(
    shape: Sequence[int], warps_per_cta: Sequence[int], instr_shape: Sequence[int] = (16, 8)
) -> LinearLayout:
    """The mma.sync m16n8 accumulator (C/D) layout (Triton's NvidiaMma version 2).

    Per warp, PTX ISA 9.7.14.5 ("Matrix Fragments for mma.m16n8k16", accumulator C/D):
    c_i sits at row groupID + 8 * (i >= 2), col 2 * threadID_in_group + (i & 1), with
    groupID = lane >> 2 and threadID_in_group = lane % 4. Warps tile [..., M, N] row-major
    (N first); repeats go along N first, then M, then batch dims. Leading dims are batch.
    """
    function = "mma_v2"
    shape = _checked_shape(shape, function, min_rank=2)
    warps = _checked_warps(warps_per_cta, shape, function)
    if tuple(instr_shape) != (16, 8):
        raise LayoutError(
            f"{function}: instr_shape {list(instr_shape)} is not an mma.sync accumulator; "
            f"every m16n8kK shape has the 16 x 8 fragment (instr_shape (16, 8))"
        )
    rank = len(shape)
    order = _matrix_order(rank, row_major=True)
    tile = _mma_warp_tile(rank - 1, rank - 2, 8, 16, 2, order)
    return _fit_to_shape(tile * _mma_warps(warps, order), shape)


def wgmma_accumulator(
    shape: Sequence[int], warps_per_cta: Sequence[int], instr_n: int
) -> LinearLayout:
    """The wgmma m64nNk16 accumulator (D) layout (Triton's NvidiaMma version 3).

    PTX ISA 9.7.15.5.1.1 ("Register Fragments", wgmma .m64nNk16 accumulator D): warp w of
    the warpgroup holds rows 16w .. 16w + 15; d_i sits at row 16w + lane / 4 + 8 * ((i / 2) % 2),
    col 2 * (lane % 4) + (i % 2) + 8 * (i / 4), for i < instr_n / 2. Warps stack along M
    (16 rows each) for warps_per_cta[0], then along N in steps of instr_n; repeats go along
    N first, then M.
    """
    function = "wgmma_accumulator"
    shape = _checked_shape(shape, function, min_rank=2)
    if len(shape) != 2:
        raise LayoutError(f"{function}: shape {list(shape)} must be 2-D [M, N]")
    warps = _checked_warps(warps_per_cta, shape, function)
    _check_warpgroups(warps, function)
    if not _is_power_of_two(instr_n) or not 8 <= instr_n <= 256:
        raise LayoutError(
            f"{function}: instr_n = {instr_n!r} must be a power of two from 8 to 256 "
            f"(wgmma n is a multiple of 8 up to 256; layouts need powers of two)"
        )
    tile = _mma_warp_tile(1, 0, int(instr_n), 16, 2, (1, 0))
    return _fit_to_shape(tile * _mma_warps(warps, (0, 1)), shape)


def dot_operand(
    shape: Sequence[int],
    parent_warps_per_cta: Sequence[int],
    op_idx: int,
    k_width: int,
    version: int,
) -> LinearLayout:
    """Register layout of a tensor-core operand (Triton's DotOperandEncoding over NvidiaMma).

    `shape` is the operand's shape: [..., M, K] for A (op_idx 0), [..., K, N] for B (op_idx 1).
    `parent_warps_per_cta` and `version` describe the accumulator the operand feeds:
    version 2 is `mma_v2` (A and B), version 3 is `wgmma_accumulator` (A only: wgmma reads
    B from shared memory). Each thread holds `k_width` consecutive K elements per register
    group: 32 // element_bits reproduces the hardware fragments, larger values permute K
    identically in A and B (Triton's wider-load trick).

    PTX ISA 9.7.14.5 ("Matrix Fragments for mma.m16n8k16"), 16-bit A: a_i at row groupID +
    8 * ((i / 2) % 2), col 2 * threadID_in_group + (i & 1) + 8 * (i >= 4); B: b_i at row
    2 * threadID_in_group + (i & 1) + 8 * (i >= 2), col groupID. PTX ISA 9.7.15.5.1.1: the
    wgmma register A fragment is the m16n8k16 A pattern per warp, warps stacked by 16 rows.
    Warps along the accumulator's other dim (N for A, M for B) hold copies of the operand.
    """
    function = "dot_operand"
    shape = _checked_shape(shape, function, min_rank=2)
    warps = _checked_warps(parent_warps_per_cta, shape, function)
    if version not in (2, 3):
        raise LayoutError(f"{function}: version {version!r} must be 2 (mma.sync) or 3 (wgmma)")
    if op_idx not in (0, 1):
        raise LayoutError(f"{function}: op_idx {op_idx!r} must be 0 (A, [M, K]) or 1 (B, [K, N])")
    if not _is_power_of_two(k_width):
        raise LayoutError(
            f"{function}: k_width = {k_width!r} is not a power of two (shape {list(shape)})"
        )
    rank = len(shape)
    if version == 3:
        if op_idx == 1:
            raise LayoutError(
                f"{function}: wgmma reads B (op_idx=1) only from shared memory, so it has no "
                f"register layout; describe B with nvmma_shared instead"
            )
        if rank != 2:
            raise LayoutError(
                f"{function}: the wgmma A operand shape {list(shape)} must be 2-D [M, K]"
            )
        _check_warpgroups(warps, function)
    rows, cols = rank - 2, rank - 1
    if op_idx == 0:  # A: K = cols is the inner dim of the fragment
        tile = _mma_warp_tile(cols, rows, 8 * k_width, 16, k_width, _matrix_order(rank, True))
        k_dim = cols
    else:  # B: K = rows is the inner dim
        tile = _mma_warp_tile(rows, cols, 8 * k_width, 8, k_width, _matrix_order(rank, False))
        k_dim = rows
    # Same warp order as the accumulator: row-major for mma.sync, M first for wgmma.
    warp_order = _matrix_order(rank, row_major=version == 2)
    return _fit_to_shape(tile * _mma_warps(warps, warp_order, broadcast_dim=k_dim), shape)


def wgmma_operand_a(
    shape: Sequence[int], warps_per_cta: Sequence[int], element_bits: int
) -> LinearLayout:
    """The wgmma A operand in registers: `dot_operand` version 3 with k_width = 32 // element_bits.

    PTX ISA 9.7.15.5.1.1 ("Register Fragments"): each 32-bit register packs 32 / element_bits
    consecutive K elements (2 for bf16/f16, 4 for e4m3/e5m2, 1 for tf32).
    """
    if element_bits not in (8, 16, 32):
        raise LayoutError(
            f"wgmma_operand_a: element_bits {element_bits!r} must be 8, 16 or 32 "
            f"(wgmma A types: e4m3/e5m2/s8, f16/bf16, tf32)"
        )
    return dot_operand(shape, warps_per_cta, 0, 32 // element_bits, 3)


# ------------------------------------------------------------------- shared memory
# swizzle bytes -> (per_phase, max_phase): every mode's XOR pattern repeats after 8 rows.
NVMMA_SWIZZLE_PHASES = {128: (1, 8), 64: (2, 4), 32: (4, 2)}
CHUNK_BYTES = 16  # the unit the swizzle permutes, and the width of a core-matrix row


def _shared_layout(offset_bases: list[tuple[int, ...]], shape: tuple[int, ...]) -> LinearLayout:
    return LinearLayout(
        {"offset": offset_bases, "block": []}, [(_dim(d), size) for d, size in enumerate(shape)]
    )


def _unit(rank: int, dim: int, value: int) -> tuple[int, ...]:
    return tuple(value if d == dim else 0 for d in range(rank))


def _nvmma_dims(shape: tuple[int, ...], transposed: bool) -> tuple[int, list[int], int]:
    """The contiguous dim, the row dims (major first) and the number of rows they make."""
    contiguous = 0 if transposed else len(shape) - 1
    row_dims = [d for d in range(len(shape)) if d != contiguous]
    return contiguous, row_dims, math.prod(shape[d] for d in row_dims)


def _check_element_bits(element_bits, function: str) -> None:
    if element_bits not in (8, 16, 32, 64):
        raise LayoutError(f"{function}: element_bits {element_bits!r} must be 8, 16, 32 or 64")


def nvmma_shared(
    shape: Sequence[int], swizzle_bytes: int, element_bits: int, transposed: bool = False
) -> LinearLayout:
    """The shared-memory layout that wgmma descriptors and TMA use (Triton's NVMMAShared).

    PTX ISA 9.7.15.5.1.2 ("Shared Memory Matrix Layout", swizzling modes) and the TMA
    CU_TENSOR_MAP_SWIZZLE_{32,64,128}B modes: the contiguous dim (the last one, or dim0 when
    `transposed`) is cut into rows of `swizzle_bytes`; the other dims, flattened row-major,
    number the rows. Element (r, c) of a row sits in 16-byte chunk
    (c / vec) XOR ((r / per_phase) % max_phase) of row r, with vec = 128 / element_bits and
    (per_phase, max_phase) = (1, 8), (2, 4), (4, 2) for 128, 64, 32 bytes. A contiguous dim
    wider than one swizzle row is stored as successive [rows x swizzle-row] blocks.
    `swizzle_bytes` 0 means no swizzle, with 16-byte rows: the 8-row x 16-byte core matrices
    of the wgmma no-swizzle mode stay contiguous (128 bytes each).

    Triton differs in two corners: it stores swizzle-0 tiles plainly row-major (the same
    layout when the contiguous dim is 16 bytes, the only case its heuristic picks 0 for),
    and for `transposed` with more than 2 dims it flattens in another order.
    """
    function = "nvmma_shared"
    shape = _checked_shape(shape, function, min_rank=2)
    _check_element_bits(element_bits, function)
    if swizzle_bytes not in (0, 32, 64, 128):
        raise LayoutError(f"{function}: swizzle_bytes {swizzle_bytes!r} must be 0, 32, 64 or 128")
    rank = len(shape)
    contiguous, row_dims, rows = _nvmma_dims(shape, transposed)
    row_width = max(swizzle_bytes, CHUNK_BYTES) * 8 // element_bits  # elements per row
    if shape[contiguous] < row_width:
        raise LayoutError(
            f"{function}: contiguous dim{contiguous} of shape {list(shape)} holds "
            f"{shape[contiguous] * element_bits // 8} bytes, less than one "
            f"{max(swizzle_bytes, CHUNK_BYTES)}-byte row of swizzle_bytes={swizzle_bytes}; "
            f"use default_nvmma_swizzle({list(shape)}, {element_bits}, {transposed}) = "
            f"{default_nvmma_swizzle(shape, element_bits, transposed)}"
        )
    if swizzle_bytes and rows < 8:
        raise LayoutError(
            f"{function}: shape {list(shape)} has {rows} rows; the {swizzle_bytes}B swizzle "
            f"pattern spans 8 rows, so use swizzle_bytes=0 or at least 8 rows"
        )
    offsets = [_unit(rank, contiguous, 1 << b) for b in range(row_width.bit_length() - 1)]
    vec = 128 // element_bits
    per_phase, max_phase = NVMMA_SWIZZLE_PHASES.get(swizzle_bytes, (1, 1))
    for b in range(rows.bit_length() - 1):
        row = 1 << b
        coords = [0] * rank
        rest = row
        for d in reversed(row_dims):  # row-major: the last row dim is the minor one
            coords[d], rest = rest % shape[d], rest // shape[d]
        coords[contiguous] = vec * ((row // per_phase) % max_phase)
        offsets.append(tuple(coords))
    offsets += [
        _unit(rank, contiguous, 1 << b)
        for b in range(row_width.bit_length() - 1, shape[contiguous].bit_length() - 1)
    ]
    return _shared_layout(offsets, shape)


def default_nvmma_swizzle(
    shape: Sequence[int], element_bits: int, transposed: bool = False
) -> int:
    """The widest swizzle (128, 64 or 32 bytes) dividing the contiguous row's bytes, else 0.

    Also 0 when the other dims make fewer than 8 rows: a swizzle pattern spans 8 rows.
    """
    function = "default_nvmma_swizzle"
    shape = _checked_shape(shape, function, min_rank=2)
    _check_element_bits(element_bits, function)
    contiguous, _, rows = _nvmma_dims(shape, transposed)
    row_bytes = shape[contiguous] * element_bits // 8
    if rows >= 8:
        for swizzle in (128, 64, 32):
            if row_bytes % swizzle == 0:
                return swizzle
    return 0


def swizzled_shared(
    shape: Sequence[int], vec: int, per_phase: int, max_phase: int, order: Sequence[int]
) -> LinearLayout:
    """Triton's SwizzledSharedEncoding: a generic XOR swizzle over the two most-minor dims.

    Dims are stored in `order` (minor first). With c = order[0] (columns) and r = order[1]
    (rows), element (r, c) sits at column c XOR (vec * ((r / per_phase) % max_phase)) of
    row r (taken modulo the row length); further dims are stacked unswizzled.
    """
    function = "swizzled_shared"
    shape = _checked_shape(shape, function)
    for name, value in (("vec", vec), ("per_phase", per_phase), ("max_phase", max_phase)):
        if not _is_power_of_two(value):
            raise LayoutError(
                f"{function}: {name} = {value!r} is not a power of two (shape {list(shape)})"
            )
    order = _checked_order(order, shape, function)
    rank = len(shape)
    offsets = [_unit(rank, order[0], 1 << b) for b in range(shape[order[0]].bit_length() - 1)]
    if rank >= 2:
        column, row_dim = order[0], order[1]
        for b in range(shape[row_dim].bit_length() - 1):
            row = 1 << b
            coords = [0] * rank
            coords[row_dim] = row
            coords[column] = (vec * ((row // per_phase) % max_phase)) % shape[column]
            offsets.append(tuple(coords))
        for d in order[2:]:
            offsets += [_unit(rank, d, 1 << b) for b in range(shape[d].bit_length() - 1)]
    return _shared_layout(offsets, shape)
