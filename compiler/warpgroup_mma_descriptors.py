"""wgmma operands: shared-memory matrix descriptors, their decoder, and register fragments.

Pure Python (numpy only), so the descriptor logic is proved on the CPU: `plan_operand`
derives a descriptor from a buffer's own addressing, and `decode` says which bytes the
hardware reads for that descriptor; `plan_operand` only returns a plan after checking
that the two agree on every element of every instruction tile it will be used for.

The model (PTX ISA 9.7.15.5.1.2, "Shared Memory Matrix Layout" and "Matrix Descriptor
Format", https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-shared-memory-layout):

- A wgmma operand tile is MN x K elements; every instruction reads 32 bytes of K per row
  (k16 for 16-bit types, k32 for 8-bit, k8 for tf32). Memory is read in 16-byte chunks
  ("rows" of 8 x 16-byte core matrices). In a K-major tile a chunk runs along K, in an
  MN-major (transposed) tile along M or N; only 16-bit types may be MN-major.
- The descriptor (64 bits): start address >> 4 in bits 0-13, leading-dimension byte
  offset (LBO) >> 4 in bits 16-29, stride-dimension byte offset (SBO) >> 4 in bits 32-45,
  base offset in bits 49-51, swizzle mode in bits 62-63 (0 none, 1 128B, 2 64B, 3 32B).
- Canonical byte offsets, with T = 16 bytes of elements per chunk and S = swizzle bytes
  (CUTLASS writes the same table in `make_gmma_desc`):

      K-major,  no swizzle:  mn%8 * 16 + mn/8 * SBO + (k/T) * LBO + k%T
      K-major,  swizzled:    mn%8 * S  + mn/8 * SBO + (k/T) * 16  + k%T     (LBO unused)
      MN-major, no swizzle:  k%8 * 16  + k/8 * LBO  + (mn/T) * SBO + mn%T
      MN-major, swizzled:    k%8 * S   + k/8 * SBO  + (mn/T % (S/16)) * 16
                             + (mn/T / (S/16)) * LBO + mn%T

  (element terms in bytes). The address start + offset is then swizzled: its bits
  [4, 4 + log2(S/16)) are XORed with bits [7, 7 + log2(S/16)) — the NVMMA swizzle that
  TMA writes, applied to absolute shared addresses. A base whose address is a multiple of
  the pattern's repeat (8 * S bytes) therefore needs base offset 0, the only value this
  module emits; sub-tiles (K slices, warpgroup rows, N blocks) are reached by moving the
  start address by their *unswizzled* offset, as CUTLASS's descriptor iterator does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

from ..layouts import LinearLayout
from .hardware import WARPS_PER_WARPGROUP

ISA = "https://docs.nvidia.com/cuda/parallel-thread-execution/index.html"
SWIZZLE_CODES = {0: 0, 128: 1, 64: 2, 32: 3}
K_BYTES = 32       # bytes of K every wgmma instruction reads per row
CHUNK_BYTES = 16   # one row of a core matrix
CORE_ROWS = 8      # rows of a core matrix
FIELD_LIMIT = 1 << 18  # descriptor fields hold (x & 0x3FFFF) >> 4
M_PER_WARPGROUP = 64
MAX_N = 256


class WgmmaError(ValueError):
    """A wgmma operand, accumulator or shape the hardware cannot use; `suggestion` says
    what to do instead."""

    def __init__(self, message: str, suggestion: str = ""):
        super().__init__(message)
        self.suggestion = suggestion


def instruction_k(element_bits: int) -> int:
    """Elements of K one instruction consumes: 32 bytes (k16 bf16/f16, k32 fp8, k8 tf32)."""
    return K_BYTES * 8 // element_bits


# ------------------------------------------------------------------------ descriptor
@dataclass(frozen=True)
class MatrixDescriptor:
    """The fields of a wgmma shared-memory matrix descriptor, in bytes."""

    start_address: int
    leading_byte_offset: int
    stride_byte_offset: int
    swizzle: int  # swizzle bytes: 0, 32, 64 or 128
    base_offset: int = 0

    def __post_init__(self):
        for name in ("start_address", "leading_byte_offset", "stride_byte_offset"):
            value = getattr(self, name)
            if value < 0 or value >= FIELD_LIMIT or value % CHUNK_BYTES:
                raise WgmmaError(f"descriptor {name} {value} must be a multiple of 16 below {FIELD_LIMIT}")
        if self.swizzle not in SWIZZLE_CODES:
            raise WgmmaError(f"descriptor swizzle {self.swizzle} must be 0, 32, 64 or 128 bytes")
        if not 0 <= self.base_offset < 8:
            raise WgmmaError(f"descriptor base offset {self.base_offset} must be 0..7")

    @property
    def value(self) -> int:
        """The 64-bit descriptor."""
        def encode(x: int) -> int:
            return (x & (FIELD_LIMIT - 1)) >> 4

        return (encode(self.start_address) | encode(self.leading_byte_offset) << 16
                | encode(self.stride_byte_offset) << 32 | self.base_offset << 49
                | SWIZZLE_CODES[self.swizzle] << 62)

    @classmethod
    def from_value(cls, value: int) -> "MatrixDescriptor":
        field = 0x3FFF
        swizzle = {code: size for size, code in SWIZZLE_CODES.items()}[(value >> 62) & 3]
        return cls((value & field) << 4, ((value >> 16) & field) << 4, ((value >> 32) & field) << 4,
                   swizzle, (value >> 49) & 7)


def swizzle_address(address, swizzle: int):
    """The NVMMA swizzle of a byte address (ints or numpy arrays); its own inverse."""
    if swizzle == 0:
        return address
    mask = swizzle // CHUNK_BYTES - 1
    return address ^ (((address >> 7) & mask) << 4)


def decode(value: int, major: str, element_bits: int, tile_mn: int, tile_k: int) -> np.ndarray:
    """Byte addresses wgmma reads for a descriptor: array [tile_mn, tile_k] of element
    (mn, k) of one instruction's operand tile (see the module docstring)."""
    d = MatrixDescriptor.from_value(value)
    if d.base_offset:
        raise WgmmaError("a non-zero descriptor base offset is not modelled")
    if tile_k * element_bits != K_BYTES * 8:
        raise WgmmaError(f"one instruction reads {instruction_k(element_bits)} elements of K, not {tile_k}")
    per_chunk = CHUNK_BYTES * 8 // element_bits
    element_bytes = element_bits // 8
    mn = np.arange(tile_mn, dtype=np.int64)[:, None]
    k = np.arange(tile_k, dtype=np.int64)[None, :]
    s = d.swizzle
    if major == "K":
        chunk, within = k // per_chunk, k % per_chunk
        row, group = mn % CORE_ROWS, mn // CORE_ROWS
        if s == 0:
            offset = row * CHUNK_BYTES + group * d.stride_byte_offset + chunk * d.leading_byte_offset
        else:
            offset = row * s + group * d.stride_byte_offset + chunk * CHUNK_BYTES
    elif major == "MN":
        chunk, within = mn // per_chunk, mn % per_chunk
        row, group = k % CORE_ROWS, k // CORE_ROWS
        if s == 0:
            offset = row * CHUNK_BYTES + group * d.leading_byte_offset + chunk * d.stride_byte_offset
        else:
            width = s // CHUNK_BYTES
            offset = (row * s + group * d.stride_byte_offset + (chunk % width) * CHUNK_BYTES
                      + (chunk // width) * d.leading_byte_offset)
    else:
        raise WgmmaError(f"major must be 'K' or 'MN', not {major!r}")
    return swizzle_address(d.start_address + offset + within * element_bytes, s)


# ------------------------------------------------------------- operands in shared memory
def _xor_span(bases: Sequence[int], indices: np.ndarray) -> np.ndarray:
    out = np.zeros(indices.shape, dtype=np.int64)
    for bit, basis in enumerate(bases):
        out ^= ((indices >> bit) & 1) * basis
    return out


def _xor_of(bases: Sequence[int], index: int) -> int:
    out = 0
    for bit, basis in enumerate(bases):
        if index >> bit & 1:
            out ^= basis
    return out


@dataclass(frozen=True)
class OperandView:
    """A shared operand as the backend sees it: element offset of (mn, k) from the view's
    base = XOR of `mn_bases` over the bits of mn, of `k_bases` over the bits of k, and
    `xor` (all in elements; the layout's own addressing)."""

    mn_bases: tuple[int, ...]
    k_bases: tuple[int, ...]
    xor: int
    element_bits: int

    @classmethod
    def from_addressing(cls, addressing: LinearLayout, xor: int, element_bits: int, mn_dim: int) -> "OperandView":
        """From a SharedView's addressing (dims -> offset) of a rank-2 view whose dim
        `mn_dim` is M (for A) or N (for B) and the other dim is K."""
        bases = addressing.bases
        k_dim = 1 - mn_dim
        return cls(tuple(b[0] for b in bases[f"dim{mn_dim}"]), tuple(b[0] for b in bases[f"dim{k_dim}"]),
                   xor, element_bits)

    @property
    def shape(self) -> tuple[int, int]:
        return 1 << len(self.mn_bases), 1 << len(self.k_bases)

    def byte_offsets(self, origin: tuple[int, int], tile_mn: int, tile_k: int) -> np.ndarray:
        """Byte offset from the base of each element of the tile at `origin` (aligned to
        the tile size), as array [tile_mn, tile_k]."""
        mn0, k0 = origin
        if mn0 % tile_mn or k0 % tile_k or mn0 + tile_mn > self.shape[0] or k0 + tile_k > self.shape[1]:
            raise WgmmaError(f"tile {tile_mn}x{tile_k} at {origin} is not an aligned tile of the "
                             f"{self.shape[0]}x{self.shape[1]} operand")
        mn = _xor_span(self.mn_bases, mn0 + np.arange(tile_mn, dtype=np.int64))
        k = _xor_span(self.k_bases, k0 + np.arange(tile_k, dtype=np.int64))
        return ((mn[:, None] ^ k[None, :]) ^ self.xor) * (self.element_bits // 8)


@dataclass(frozen=True)
class OperandPlan:
    """How wgmma reads one shared operand: major-ness, swizzle and strides, and the
    unswizzled byte offsets that move the start address to any tile."""

    major: str  # "K" or "MN"
    swizzle: int
    leading_byte_offset: int
    stride_byte_offset: int
    element_bits: int
    tile_mn: int
    tile_k: int
    mn_bases: tuple[int, ...]  # unswizzled byte offset of each bit of mn
    k_bases: tuple[int, ...]
    xor: int  # unswizzled byte offset of the view's xor

    @property
    def transposed(self) -> int:
        """The instruction's imm-trans operand: 1 for MN-major."""
        return int(self.major == "MN")

    @property
    def alignment(self) -> int:
        """Bytes the view's base address must be a multiple of (the swizzle's repeat)."""
        return CORE_ROWS * self.swizzle if self.swizzle else CHUNK_BYTES

    def linear_offset(self, mn: int, k: int) -> int:
        """Unswizzled byte offset of element (mn, k) without the view's xor (for parts of
        an offset that are added at run time, e.g. a warpgroup's rows)."""
        return _xor_of(self.mn_bases, mn) ^ _xor_of(self.k_bases, k)

    def start_offset(self, mn: int, k: int) -> int:
        """Byte offset, from the view's base, of the start address of the tile at (mn, k)."""
        return self.linear_offset(mn, k) ^ self.xor

    def descriptor(self, start_address: int) -> MatrixDescriptor:
        return MatrixDescriptor(start_address, self.leading_byte_offset, self.stride_byte_offset, self.swizzle)

    @property
    def constant_bits(self) -> int:
        """The descriptor with start address 0: the backend adds address >> 4."""
        return self.descriptor(0).value


def _derive(view: OperandView, swizzle: int, major: str, tile_mn: int, tile_k: int) -> Optional[OperandPlan]:
    """Descriptor fields for one (swizzle, major) guess, read off the unswizzled bases;
    None when the guess cannot hold (checked for real by `_agrees`)."""
    element_bytes = view.element_bits // 8
    per_chunk = CHUNK_BYTES // element_bytes
    chunk_bits = per_chunk.bit_length() - 1
    mn = tuple(int(swizzle_address(b * element_bytes, swizzle)) for b in view.mn_bases)
    k = tuple(int(swizzle_address(b * element_bytes, swizzle)) for b in view.k_bases)
    xor = int(swizzle_address(view.xor * element_bytes, swizzle))
    contiguous = k if major == "K" else mn
    if tuple(contiguous[:chunk_bits]) != tuple(element_bytes << j for j in range(chunk_bits)):
        return None
    row_bytes = swizzle or CHUNK_BYTES  # bytes between the 8 rows of a core matrix

    def field(bases: tuple[int, ...], bit: int, needed: bool, default: int) -> int:
        # A stride the tile never uses keeps a harmless default.
        return bases[bit] if needed and bit < len(bases) else default

    if major == "K":
        sbo = field(mn, 3, tile_mn > CORE_ROWS, CORE_ROWS * row_bytes)
        lbo = field(k, chunk_bits, swizzle == 0 and tile_k > per_chunk, CHUNK_BYTES)
    elif swizzle == 0:
        sbo = field(mn, chunk_bits, tile_mn > per_chunk, CORE_ROWS * CHUNK_BYTES)
        lbo = field(k, 3, tile_k > CORE_ROWS, CORE_ROWS * CHUNK_BYTES)
    else:
        width_bits = (swizzle // CHUNK_BYTES).bit_length() - 1
        lbo = field(mn, chunk_bits + width_bits, tile_mn > per_chunk << width_bits, CORE_ROWS * swizzle)
        sbo = field(k, 3, tile_k > CORE_ROWS, CORE_ROWS * swizzle)
    if any(x <= 0 or x >= FIELD_LIMIT or x % CHUNK_BYTES for x in (lbo, sbo)):
        return None
    return OperandPlan(major, swizzle, lbo, sbo, view.element_bits, tile_mn, tile_k, mn, k, xor)


def _agrees(plan: OperandPlan, view: OperandView, origin: tuple[int, int]) -> bool:
    """decode(descriptor of the tile at `origin`) == the view's own byte offsets."""
    start = plan.start_offset(*origin)
    if start % CHUNK_BYTES or start >= FIELD_LIMIT:
        return False
    expected = view.byte_offsets(origin, plan.tile_mn, plan.tile_k)
    read = decode(plan.descriptor(start).value, plan.major, plan.element_bits, plan.tile_mn, plan.tile_k)
    return bool(np.array_equal(read, expected))


def check_alignment(plan: OperandPlan, base_alignment: int) -> None:
    """WgmmaError when a view whose base is a multiple of `base_alignment` bytes cannot
    start the plan's swizzle pattern (the base address is the one run-time part of a
    descriptor, so its alignment is checked where the address is known)."""
    if plan.alignment > base_alignment:
        raise WgmmaError(
            f"the {plan.swizzle}-byte swizzle needs the buffer at a multiple of "
            f"{plan.alignment} bytes, but this view is only known to be {base_alignment}-byte aligned",
            "index whole buffers of the allocation (views at swizzle-pattern boundaries)")


def plan_operand(view: OperandView, tile_mn: int, tile_k: int, origins: Iterable[tuple[int, int]],
                 allow_mn_major: Optional[bool] = None, base_alignment: int = 1024) -> OperandPlan:
    """The descriptor plan that reads every tile at `origins` exactly as the view's
    addressing lays it out, assuming the view's base is a multiple of `base_alignment`.

    Tries every swizzle mode and major-ness and keeps the first that `decode` proves
    right on all tiles. WgmmaError says why no mode fits.
    """
    bits = view.element_bits
    if allow_mn_major is None:
        allow_mn_major = bits == 16
    origins = tuple(origins) or ((0, 0),)
    if tile_mn > view.shape[0] or tile_k > view.shape[1]:
        raise WgmmaError(f"the operand is {view.shape[0]}x{view.shape[1]} (MN x K) but one "
                         f"instruction reads {tile_mn}x{tile_k}")
    for major in ("K", "MN"):
        for swizzle in (128, 64, 32, 0):
            plan = _derive(view, swizzle, major, tile_mn, tile_k)
            if plan is None or not all(_agrees(plan, view, o) for o in origins):
                continue
            if major == "MN" and not allow_mn_major:
                raise WgmmaError(
                    f"{bits}-bit operands must be K-major (contiguous along K) for wgmma; this "
                    f"buffer is contiguous along M/N (MN-major)",
                    "store the operand K-major (for B: an [N, K] buffer viewed with .permute((1, 0)))")
            check_alignment(plan, base_alignment)
            return plan
    raise WgmmaError("wgmma cannot read this shared layout: no descriptor (swizzle 128/64/32/none, "
                     "K- or MN-major) reproduces its addressing")


# ------------------------------------------------------------------------ registers
# PTX ISA 9.7.15.5.1.1 ("Register Fragments"). Per warpgroup, warp w (0..3) and lane l:
#   D (m64nN, 32-bit): d_i at row 16w + l/4 + 8*((i/2)%2), col 2*(l%4) + i%2 + 8*(i/4);
#   A (m64kK): 4 registers of kw = 32/bits elements; element i (0 .. 4*kw-1) at
#     row 16w + l/4 + 8*((i/kw)%2), col kw*(l%4) + i%kw + 4*kw*(i/(2*kw)).
FRAGMENT_LANES = ((0, 2), (0, 4), (1, 0), (2, 0), (4, 0))  # accumulator lane bases (row, col)
FRAGMENT_WARPS = ((16, 0), (32, 0))                        # the 4 warps of a warpgroup


def accumulator_position(i: int) -> tuple[int, int]:
    """(row, col) of d_i for lane 0 of warp 0."""
    return 8 * ((i // 2) % 2), i % 2 + 8 * (i // 4)


def operand_a_position(i: int, element_bits: int) -> tuple[int, int]:
    """(row, k) of register-A element i for lane 0 of warp 0."""
    kw = 32 // element_bits
    return 8 * ((i // kw) % 2), i % kw + 4 * kw * (i // (2 * kw))


def operand_a_lanes(element_bits: int) -> tuple[tuple[int, int], ...]:
    kw = 32 // element_bits
    return (0, kw), (0, 2 * kw), (1, 0), (2, 0), (4, 0)


def register_table(layout: LinearLayout) -> dict[tuple[int, int], int]:
    """(row, col) held by register r of thread 0 -> r (the first such r)."""
    rows = layout.transpose_outs(["dim0", "dim1"]).bases.get("register", ())
    table: dict[tuple[int, int], int] = {}
    for r in range(1 << len(rows)):
        row = col = 0
        for bit, (a, b) in enumerate(rows):
            if r >> bit & 1:
                row, col = row ^ a, col ^ b
        table.setdefault((row, col), r)
    return table


def thread_bases(layout: LinearLayout, dim: str) -> tuple[tuple[int, int], ...]:
    return tuple(tuple(b) for b in layout.transpose_outs(["dim0", "dim1"]).bases.get(dim, ()))


@dataclass(frozen=True)
class AccumulatorPlan:
    """How a [M, N] accumulator maps onto m64nNk instructions.

    `tiles[t]` is the (row, col) origin of instruction tile t relative to its warpgroup's
    origin; `registers[t][i]` is the accumulator register holding d_i of that tile;
    `warpgroup_origins[j]` is the (row, col) that warp-index bit 2 + j adds.
    """

    n: int
    tiles: tuple[tuple[int, int], ...]
    registers: tuple[tuple[int, ...], ...]
    warpgroup_origins: tuple[tuple[int, int], ...]

    @property
    def num_warpgroups(self) -> int:
        return 1 << len(self.warpgroup_origins)

    def warpgroup_origin(self, group: int) -> tuple[int, int]:
        row = col = 0
        for bit, (a, b) in enumerate(self.warpgroup_origins):
            if group >> bit & 1:
                row, col = row ^ a, col ^ b
        return row, col


def _accumulator_for_n(layout: LinearLayout, n: int, shape: tuple[int, int]) -> Optional[AccumulatorPlan]:
    warps = thread_bases(layout, "warp")
    groups = warps[2:]
    if any(row % M_PER_WARPGROUP or col % n for row, col in groups):
        return None
    table = register_table(layout)
    count = layout.in_dims.get("register", 1)
    if len(table) != count:
        return None
    origins = sorted({(row & ~(M_PER_WARPGROUP - 1), col & ~(n - 1)) for row, col in table})
    used: set[int] = set()
    registers = []
    for m0, n0 in origins:
        tile = []
        for i in range(n // 2):
            row, col = accumulator_position(i)
            r = table.get((m0 | row, n0 | col))
            if r is None:
                return None
            tile.append(r)
        used.update(tile)
        registers.append(tuple(tile))
    if len(used) != count or len(origins) * (n // 2) != count:
        return None
    return AccumulatorPlan(n, tuple(origins), tuple(registers), groups)


def plan_accumulator(layout: LinearLayout, shape: Sequence[int]) -> AccumulatorPlan:
    """Map an accumulator layout onto wgmma D fragments, with the widest instruction N
    (at most 256) that fits. WgmmaError when the layout is not a wgmma accumulator."""
    m, n_total = shape
    if m % M_PER_WARPGROUP:
        raise WgmmaError(f"the accumulator has M = {m} rows; wgmma needs a multiple of "
                         f"{M_PER_WARPGROUP} rows per warpgroup")
    if n_total % 8:
        raise WgmmaError(f"the accumulator has N = {n_total} columns; wgmma needs a multiple of 8")
    warps = thread_bases(layout, "warp")
    if len(warps) < 2:
        raise WgmmaError(f"the accumulator layout spans {1 << len(warps)} warps; wgmma runs on whole "
                         f"warpgroups of {WARPS_PER_WARPGROUP} warps")
    if thread_bases(layout, "lane") != FRAGMENT_LANES or warps[:2] != FRAGMENT_WARPS:
        raise WgmmaError("the accumulator layout is not the wgmma accumulator fragment (lanes "
                         f"{list(thread_bases(layout, 'lane'))}, warps {list(warps)}; wgmma wants lanes "
                         f"{list(FRAGMENT_LANES)} and the 4 warps of a warpgroup at rows 16, 32)",
                         "use NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * g, 1], instr_shape=[16, N, K])")
    n = min(MAX_N, 1 << (n_total.bit_length() - 1))
    while n >= 8:
        plan = _accumulator_for_n(layout, n, (m, n_total))
        if plan is not None:
            return plan
        n //= 2
    raise WgmmaError("the accumulator layout does not match the wgmma D fragment for any instruction "
                     "N from 8 to 256",
                     "use NVMMADistributedLayout(version=[3, 0], ...) for the accumulator")


def plan_register_a(layout: LinearLayout, element_bits: int, acc: AccumulatorPlan,
                    k_total: int) -> dict[tuple[int, int], tuple[tuple[int, ...], ...]]:
    """For register A: {(tile row origin, k step): 4 tuples of register indices}, each
    tuple the 32/bits registers packed (lowest first) into one 32-bit instruction operand."""
    kw = 32 // element_bits
    k_instr = instruction_k(element_bits)
    if thread_bases(layout, "lane") != operand_a_lanes(element_bits):
        raise WgmmaError(f"register A is not in the wgmma A fragment (lanes {list(thread_bases(layout, 'lane'))}, "
                         f"expected {list(operand_a_lanes(element_bits))})",
                         f"use DotOperandLayout(operand_index=0, parent=<the accumulator layout>, k_width={kw})")
    warps = thread_bases(layout, "warp")
    expected_warps = FRAGMENT_WARPS + tuple((row, 0) for row, _ in acc.warpgroup_origins)
    if warps != expected_warps:
        raise WgmmaError(f"register A's warps {list(warps)} do not hold the rows of the accumulator's "
                         f"warpgroups (expected {list(expected_warps)})",
                         f"use DotOperandLayout(operand_index=0, parent=<the accumulator layout>, k_width={kw})")
    table = register_table(layout)
    if len(table) != layout.in_dims.get("register", 1):
        raise WgmmaError("register A holds some elements twice; use a DotOperandLayout")
    plan = {}
    for m0 in sorted({m0 for m0, _ in acc.tiles}):
        for step in range(k_total // k_instr):
            k0 = step * k_instr
            words = []
            for word in range(4):
                group = []
                for i in range(word * kw, (word + 1) * kw):
                    row, col = operand_a_position(i, element_bits)
                    r = table.get((m0 | row, k0 | col))
                    if r is None:
                        raise WgmmaError(f"register A has no register for row {m0 | row}, k {k0 | col} "
                                         "of the wgmma A fragment",
                                         f"use DotOperandLayout(operand_index=0, parent=<the accumulator "
                                         f"layout>, k_width={kw})")
                    group.append(r)
                words.append(tuple(group))
            plan[(m0, step)] = tuple(words)
    return plan


# ------------------------------------------------------------------------ types
# PTX type names of wgmma inputs and accumulators (PTX ISA 9.7.15.5, "wgmma.mma_async").
INPUT_TYPES = {"bf16": "bf16", "fp16": "f16", "fp8e4m3": "e4m3", "fp8e5m2": "e5m2", "fp32": "tf32"}
ACCUMULATOR_TYPES = {"fp32": "f32", "fp16": "f16"}


def check_types(a: str, b: str, acc: str) -> tuple[str, str, str]:
    """(atype, btype, dtype) PTX names for element names a, b, acc; WgmmaError otherwise."""
    if a not in INPUT_TYPES or b not in INPUT_TYPES:
        bad = a if a not in INPUT_TYPES else b
        raise WgmmaError(f"wgmma has no {bad} inputs (bf16, fp16, fp8e4m3, fp8e5m2, fp32 as tf32)")
    fp8 = ("fp8e4m3", "fp8e5m2")
    if a != b and not (a in fp8 and b in fp8):
        raise WgmmaError(f"wgmma operands must have the same element type (fp8 may mix e4m3 and e5m2); "
                         f"found a: {a}, b: {b}", "convert one operand with .to(...)")
    if acc not in ACCUMULATOR_TYPES or (acc == "fp16" and a in ("bf16", "fp32")):
        allowed = "fp32" if a in ("bf16", "fp32") else "fp32 or fp16"
        raise WgmmaError(f"a wgmma with {a} inputs accumulates in {allowed}, not {acc}")
    return INPUT_TYPES[a], INPUT_TYPES[b], ACCUMULATOR_TYPES[acc]
