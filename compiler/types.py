"""IR types: scalars, pointers, distributed tensors, shared-memory buffers, TMA descriptors.

An mbarrier is not a type of its own: it is an 8-byte shared buffer of one i64 (shape
[1], or [n, 1] for n barriers used through `index`), as in Gluon.

A distributed tensor's type carries its layout (a `LinearLayout` from register/lane/warp/
block to the tensor's dims) once the `layout` stage is reached; at the `tile` stage the
layout is None. A shared buffer's type always carries its shared layout (offset/block to
dims; offsets count elements).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional, Union

from ..layouts import DistributedLayout, LinearLayout, SharedLayout
from .hardware import TMA_MAX_BOX, TMA_MAX_RANK


@dataclass(frozen=True)
class ScalarType:
    """An element type; names follow Triton's signature strings."""

    name: str

    def __post_init__(self):
        if self.name not in _SCALAR_BITS:
            raise ValueError(f"unknown scalar type {self.name!r}; known: {sorted(_SCALAR_BITS)}")

    @property
    def bits(self) -> int:
        return _SCALAR_BITS[self.name]

    @property
    def primitive_bitwidth(self) -> int:
        """`bits` under Gluon's name."""
        return self.bits

    @property
    def is_float(self) -> bool:
        return self.name.startswith(("fp", "bf"))

    @property
    def is_int(self) -> bool:
        return not self.is_float

    @property
    def is_signed(self) -> bool:
        return self.name.startswith("i") and self.name != "i1"

    @property
    def is_bool(self) -> bool:
        return self.name == "i1"

    def __str__(self) -> str:
        return self.name


_SCALAR_BITS = {
    "i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64,
    "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "fp8e4m3": 8, "fp8e5m2": 8, "fp16": 16, "bf16": 16, "fp32": 32, "fp64": 64,
}

i1, i8, i16, i32, i64 = (ScalarType(n) for n in ("i1", "i8", "i16", "i32", "i64"))
u8, u16, u32, u64 = (ScalarType(n) for n in ("u8", "u16", "u32", "u64"))
fp8e4m3, fp8e5m2 = ScalarType("fp8e4m3"), ScalarType("fp8e5m2")
fp16, bf16, fp32, fp64 = (ScalarType(n) for n in ("fp16", "bf16", "fp32", "fp64"))


@dataclass(frozen=True)
class PointerType:
    """A pointer to global memory holding `pointee` elements."""

    pointee: ScalarType

    @property
    def bits(self) -> int:
        return 64

    @property
    def element_ty(self) -> ScalarType:
        """Triton's spelling of the pointee (`ptr.dtype.element_ty`)."""
        return self.pointee

    def __str__(self) -> str:
        return f"*{self.pointee}"


Element = Union[ScalarType, PointerType]


@dataclass(frozen=True)
class TensorType:
    """A distributed tensor: `shape` elements of `element`, spread over threads by `layout`."""

    shape: tuple[int, ...]
    element: Element
    layout: Optional[LinearLayout] = None
    # The description the layout came from (BlockedLayout, SliceLayout, ... of layouts/),
    # kept for error messages and shape-changing ops; two types with equal linear layouts
    # are the same type whatever their descriptions.
    encoding: Optional[DistributedLayout] = field(default=None, compare=False)

    def __post_init__(self):
        if self.layout is not None:
            expected = {f"dim{i}": size for i, size in enumerate(self.shape)}
            if self.layout.out_dims != expected:
                raise ValueError(
                    f"layout covers {self.layout.out_dims} but the tensor has shape {list(self.shape)}"
                )

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def num_elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def with_layout(self, layout: Optional[LinearLayout],
                    encoding: Optional[DistributedLayout] = None) -> "TensorType":
        return TensorType(self.shape, self.element, layout, encoding)

    def with_element(self, element: Element) -> "TensorType":
        return TensorType(self.shape, element, self.layout, self.encoding)

    def __str__(self) -> str:
        return f"tensor<{'x'.join(map(str, self.shape))}x{self.element}>"


@dataclass(frozen=True)
class SharedType:
    """A buffer in shared memory, addressed through its shared layout (offset -> dims)."""

    shape: tuple[int, ...]
    element: ScalarType
    layout: LinearLayout
    # The shared layout's description (as TensorType.encoding), for messages and for the
    # layouts of views (index/slice); not part of the type's identity.
    encoding: Optional[SharedLayout] = field(default=None, compare=False)

    @property
    def num_elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def num_bytes(self) -> int:
        return self.num_elements * self.element.bits // 8

    def __str__(self) -> str:
        return f"shared<{'x'.join(map(str, self.shape))}x{self.element}>"


@dataclass(frozen=True)
class TensorDescriptorType:
    """A TMA tensor map (CUtensorMap, 128 bytes) passed to the kernel by value.

    What the kernel is specialised on: the element type, the box (`block_shape`, the tile
    one copy moves) and the shared layout the box lands in (its swizzle). The global
    shape and strides live in the descriptor and are only known at run time.
    """

    element: ScalarType
    block_shape: tuple[int, ...]
    layout: LinearLayout  # shared layout of one box (offset -> dims)
    encoding: Optional[SharedLayout] = field(default=None, compare=False)  # the box's description

    @property
    def rank(self) -> int:
        return len(self.block_shape)

    @property
    def box_bytes(self) -> int:
        n = 1
        for s in self.block_shape:
            n *= s
        return n * self.element.bits // 8

    @property
    def copies(self) -> int:
        """TMA copies one box takes: a box whose inner dim spans several swizzle rows is
        moved one row-wide column strip at a time (a copy's inner box dim may not exceed
        the swizzle width), each strip landing after the last (`strip_bytes` apart), as
        the NVMMA layout stores such a box."""
        return max(1, self.block_shape[-1] // self.copy_box[-1])

    @property
    def copy_box(self) -> tuple[int, ...]:
        """The box one TMA copy moves (what the tensor map encodes): the whole box, or
        for a wide box one swizzle-row-wide strip of it."""
        try:
            swizzle = tensor_descriptor_swizzle(self)
        except ValueError:  # a layout no swizzle mode places (hand-built IR): copied whole
            return self.block_shape
        return tma_copy_box(self.block_shape, swizzle, self.element.bits)

    @property
    def strip_bytes(self) -> int:
        """Shared-memory bytes between the strips of a wide box (one strip's bytes)."""
        return math.prod(self.copy_box) * self.element.bits // 8

    @property
    def block_type(self) -> "BlockType":
        """The box as a type (Gluon's `desc.type.block_type`)."""
        return BlockType(self.block_shape, self.element)

    def __str__(self) -> str:
        return f"tensordesc<{'x'.join(map(str, self.block_shape))}x{self.element}>"


@dataclass(frozen=True, eq=False)
class BlockType:
    """A tile's shape and element type, as Gluon names a descriptor's box: `.shape` a list
    (kernels index and compare it as one), equal when shape and element agree."""

    dims: tuple[int, ...]
    element_ty: ScalarType

    @property
    def shape(self) -> list[int]:
        return list(self.dims)

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * self.element_ty.bits // 8

    def __eq__(self, other) -> bool:
        return isinstance(other, BlockType) and (self.dims, self.element_ty) == (other.dims, other.element_ty)

    def __hash__(self) -> int:
        return hash((self.dims, self.element_ty))

    def __str__(self) -> str:
        return f"<{list(self.dims)}, {self.element_ty}>"


Type = Union[ScalarType, PointerType, TensorType, SharedType, TensorDescriptorType]


def element_of(type_: Type) -> Element:
    """The element type of a scalar, pointer or tensor type."""
    if isinstance(type_, (TensorType, SharedType)):
        return type_.element
    return type_


def scalar_type(name: str) -> ScalarType:
    aliases = {"f16": "fp16", "f32": "fp32", "f64": "fp64", "float16": "fp16", "float32": "fp32",
               "bfloat16": "bf16", "int32": "i32", "int64": "i64", "int8": "i8", "int16": "i16",
               "uint8": "u8", "bool": "i1"}
    return ScalarType(aliases.get(name, name))


def parse_signature_type(text: str) -> Union[ScalarType, PointerType, TensorDescriptorType]:
    """"*fp32" -> pointer to fp32, "i32" -> i32 (Triton's signature strings);
    "tensordesc<bf16[128,64]>" or "tensordesc<bf16[128,64],swizzle=64>" -> a TMA
    descriptor type (see `tensor_descriptor_type`)."""
    if text.startswith("*"):
        return PointerType(scalar_type(text[1:]))
    if text.lstrip().startswith(TENSOR_DESCRIPTOR_PREFIX):
        return tensor_descriptor_type(*parse_tensor_descriptor_signature(text))
    return scalar_type(text)


# ----------------------------------------------------------------------------- TMA boxes
# A descriptor's signature string names what the kernel is specialised on: element, box
# and swizzle, e.g. "tensordesc<bf16[128,64],swizzle=128>" (the canonical form always
# spells the swizzle; parsing accepts it left out, meaning default_nvmma_swizzle).

TENSOR_DESCRIPTOR_PREFIX = "tensordesc<"
TMA_SWIZZLES = (0, 32, 64, 128)
_SIGNATURE = re.compile(r"tensordesc<\s*(\w+)\s*\[([0-9,\s]*)\]\s*(?:,\s*swizzle\s*=\s*([0-9]+)\s*)?>")


def parse_tensor_descriptor_signature(text: str) -> tuple[ScalarType, tuple[int, ...], Optional[int]]:
    """(element, block_shape, swizzle or None) of "tensordesc<bf16[128,64],swizzle=128>"."""
    match = _SIGNATURE.fullmatch(text.strip())
    dims = match.group(2).split(",") if match else ()
    if match is None or not all(d.strip().isdigit() for d in dims):
        raise ValueError(f"bad tensor descriptor signature {text!r}; expected e.g. "
                         "'tensordesc<bf16[128,64]>' or 'tensordesc<bf16[128,64],swizzle=128>'")
    block_shape = tuple(int(d) for d in dims)
    swizzle = match.group(3)
    return scalar_type(match.group(1)), block_shape, None if swizzle is None else int(swizzle)


def tensor_descriptor_signature(element: ScalarType, block_shape, swizzle: int) -> str:
    """The canonical signature string of a descriptor type (the runtime's key)."""
    return f"tensordesc<{element}[{','.join(map(str, block_shape))}],swizzle={swizzle}>"


def tensor_descriptor_swizzle(type_: TensorDescriptorType) -> int:
    """The TMA swizzle (0, 32, 64 or 128 bytes) that places a box as `type_.layout`."""
    for swizzle in TMA_SWIZZLES:
        if type_.rank == 1 and swizzle:
            break
        if tma_box_layout(type_.block_shape, swizzle, type_.element.bits) == type_.layout:
            return swizzle
    raise ValueError(f"{type_}: its layout is not a TMA box placement")


def tma_copy_box(block_shape, swizzle: int, element_bits: int) -> tuple[int, ...]:
    """The box one TMA copy of a `block_shape` box moves: the inner dim cut to one swizzle
    row (16 bytes unswizzled), as cuTensorMapEncodeTiled requires of a swizzled box; the
    whole box when it is narrower or rank 1."""
    block_shape = tuple(block_shape)
    if len(block_shape) == 1:
        return block_shape
    row = max(swizzle, 16) * 8 // element_bits
    return block_shape[:-1] + (min(row, block_shape[-1]),)


def tma_box_layout(block_shape, swizzle: int, element_bits: int) -> LinearLayout:
    """Where TMA puts each element of a box in shared memory (offset, in elements ->
    dims): row-major with the innermost dim contiguous, then, for a swizzle of 32/64/128
    bytes, bits [4, 4+k) of the byte address XORed with bits [7, 7+k), k = 1/2/3 (the
    CU_TENSOR_MAP_SWIZZLE_*B modes; CUTLASS's Swizzle<k, 4, 3>). A box whose inner dim
    is wider than a swizzle row (16 bytes unswizzled) is copied one row-wide column strip
    at a time, the strips one after another (`TensorDescriptorType.copies`)."""
    rank = len(block_shape)
    element_shift = (element_bits // 8).bit_length() - 1
    strip = block_shape[-1]
    if rank > 1:
        strip = min(strip, max(swizzle, 16) >> element_shift)
    row_major = []  # offset bit -> coordinates, innermost dim first
    for dim in reversed(range(rank)):
        size = strip if dim == rank - 1 else block_shape[dim]
        for bit in range(size.bit_length() - 1):
            row_major.append(tuple((1 << bit) if d == dim else 0 for d in range(rank)))
    k = TMA_SWIZZLES.index(swizzle)
    bases = []
    for bit, coords in enumerate(row_major):
        if 7 <= bit + element_shift < 7 + k:  # this bit flips the chunk bit 3 below it
            coords = tuple(a ^ b for a, b in zip(coords, row_major[bit - 3]))
        bases.append(coords)
    for bit in range(strip.bit_length() - 1, block_shape[-1].bit_length() - 1):  # the strips
        bases.append(tuple((1 << bit) if d == rank - 1 else 0 for d in range(rank)))
    return LinearLayout({"offset": bases, "block": []},
                        [(f"dim{d}", size) for d, size in enumerate(block_shape)])


def tensor_descriptor_type(element: ScalarType, block_shape, swizzle: Optional[int] = None,
                           encoding: Optional[SharedLayout] = None) -> TensorDescriptorType:
    """The type of a TMA descriptor moving `block_shape` boxes of `element` with `swizzle`
    bytes (None: `default_nvmma_swizzle`). ValueError naming the broken rule otherwise.

    TMA's rules (cuTensorMapEncodeTiled): rank 1..5, box dims 1..256, the inner box dim a
    multiple of 16 bytes and at most the swizzle width. weft's: box dims are powers of two,
    and the box lands in shared memory as the NVMMA layout of its swizzle (HOPPER.md), so
    the inner box dim is at least one swizzle row (16 bytes when unswizzled) and a swizzled
    box has at least the 8 rows one swizzle pattern spans. An inner dim of several swizzle
    rows is moved by several copies, one row-wide strip each (`TensorDescriptorType.copies`).
    A rank-1 box is unswizzled and contiguous.
    """
    from ..layouts import LayoutError, nvmma_shared
    from ..layouts.standard import default_nvmma_swizzle

    block_shape = tuple(block_shape)
    what = f"TMA box {list(block_shape)} of {element}"
    if not 1 <= len(block_shape) <= TMA_MAX_RANK:
        raise ValueError(f"{what}: a TMA box has 1 to {TMA_MAX_RANK} dims, got {len(block_shape)}")
    for dim, size in enumerate(block_shape):
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= TMA_MAX_BOX:
            raise ValueError(f"{what}: block_shape[{dim}] = {size!r} must be an int from 1 to "
                             f"{TMA_MAX_BOX} (the TMA box limit); split larger tiles into "
                             "several copies")
        if size & (size - 1):
            raise ValueError(f"{what}: block_shape[{dim}] = {size} must be a power of two "
                             "(weft's shared layouts cover power-of-two shapes)")
    if element.name not in _TMA_ELEMENTS:
        raise ValueError(f"{what}: TMA cannot move {element} elements; supported: "
                         f"{', '.join(_TMA_ELEMENTS)}")
    bits = element.bits
    inner_bytes = block_shape[-1] * bits // 8
    if swizzle is None:
        swizzle = 0 if len(block_shape) == 1 else default_nvmma_swizzle(block_shape, bits)
    if swizzle not in TMA_SWIZZLES:
        raise ValueError(f"{what}: swizzle {swizzle!r} must be one of {TMA_SWIZZLES} bytes")
    if inner_bytes % 16:
        raise ValueError(f"{what}: the inner box dim holds {inner_bytes} bytes; TMA needs a "
                         f"multiple of 16 bytes (block_shape[-1] a multiple of {128 // bits})")
    if len(block_shape) == 1:
        if swizzle:
            raise ValueError(f"{what}: a rank-1 box cannot be swizzled (swizzle {swizzle}); "
                             "use swizzle 0 or a 2-D box")
        return TensorDescriptorType(element, block_shape,
                                    tma_box_layout(block_shape, 0, bits), encoding)
    row_bytes = swizzle or 16
    if inner_bytes < row_bytes:
        hint = f"use block_shape[-1] = {row_bytes * 8 // bits} ({row_bytes} bytes)"
        if inner_bytes in TMA_SWIZZLES:
            rows = math.prod(block_shape[:-1])
            hint += f", or swizzle {inner_bytes}" + (
                "" if rows >= 8 else f" with at least 8 box rows (the box has {rows}; a "
                "swizzle pattern spans 8 rows, so the default swizzle is 0)")
        raise ValueError(
            f"{what}: the inner box dim holds {inner_bytes} bytes, but with swizzle {swizzle} "
            f"a box row in shared memory (the NVMMA layout TMA writes) is {row_bytes} bytes; "
            + hint)
    try:
        layout = nvmma_shared(block_shape, swizzle, bits)
    except LayoutError as error:
        raise ValueError(f"{what} with swizzle {swizzle}: {error}") from None
    if layout != tma_box_layout(block_shape, swizzle, bits):  # the rules above exclude this
        raise ValueError(f"{what}: TMA's placement with swizzle {swizzle} is not the NVMMA layout")
    return TensorDescriptorType(element, block_shape, layout, encoding)


# Elements a tensor map can hold (CUtensorMapDataType covers 8- to 64-bit elements; i1 is
# a bit, not a byte, in weft's types).
_TMA_ELEMENTS = ("fp16", "bf16", "fp32", "fp64", "fp8e4m3", "fp8e5m2",
                 "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64")
