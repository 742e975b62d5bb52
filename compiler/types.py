"""IR types: scalars, pointers, distributed tensors, shared-memory buffers, TMA descriptors.

An mbarrier is not a type of its own: it is an 8-byte shared buffer of one i64 (shape
[1], or [n, 1] for n barriers used through `index`), as in Gluon.

A distributed tensor's type carries its layout (a `LinearLayout` from register/lane/warp/
block to the tensor's dims) once the `layout` stage is reached; at the `tile` stage the
layout is None. A shared buffer's type always carries its shared layout (offset/block to
dims; offsets count elements).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..layouts import LinearLayout


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
    # The user-level description the layout came from (a weft.lowlevel layout class), kept
    # for error messages and shape-changing ops; two types with equal linear layouts are
    # the same type whatever their descriptions.
    encoding: Any = field(default=None, compare=False)

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

    def with_layout(self, layout: Optional[LinearLayout], encoding: Any = None) -> "TensorType":
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
    # The user-level shared layout description (as TensorType.encoding), for messages and
    # for the layouts of views (index/slice); not part of the type's identity.
    encoding: Any = field(default=None, compare=False)

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
    encoding: Any = field(default=None, compare=False)  # the user-level shared layout

    @property
    def rank(self) -> int:
        return len(self.block_shape)

    @property
    def box_bytes(self) -> int:
        n = 1
        for s in self.block_shape:
            n *= s
        return n * self.element.bits // 8

    def __str__(self) -> str:
        return f"tensordesc<{'x'.join(map(str, self.block_shape))}x{self.element}>"


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


def parse_signature_type(text: str) -> Union[ScalarType, PointerType]:
    """"*fp32" -> pointer to fp32, "i32" -> i32 (Triton's signature strings)."""
    if text.startswith("*"):
        return PointerType(scalar_type(text[1:]))
    return scalar_type(text)
