"""TMA tensor descriptors on the host: `TensorDescriptor.from_tensor(t, block_shape, layout)`.

A descriptor names a global tensor (base address, shape, strides, element type) and the
box one TMA copy moves (`block_shape`, landing in shared memory as `layout`, an
`NVMMASharedLayout`). For a GPU tensor it holds the 128-byte CUtensorMap that
`cuTensorMapEncodeTiled` builds; kernels take it as a by-value parameter and are
specialised on its `type` (element, box, swizzle), not on the global shape.

For host arrays (numpy, CPU torch) nothing is encoded: the CPU emulator reads the fields
`.base`, `.shape`, `.strides` (elements), `.block_shape`, `.layout`, `.dtype` and `.type`.

Tensor dims are listed outermost first (as in Gluon and torch); the tensor map lists them
innermost first, so the encoder reverses them. Out-of-bounds box elements load as zeros
(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) and are not stored.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import operator
import struct
import sys
from typing import Any, Callable, Optional, Sequence

from ..compiler.hardware import TENSOR_MAP_BYTES, TMA_MAX_GLOBAL_DIM, TMA_MAX_STRIDE_BYTES
from ..compiler.types import (ScalarType, TensorDescriptorType, tensor_descriptor_signature,
                              tensor_descriptor_type, tma_copy_box)
from ..layouts import NVMMASharedLayout
from . import arguments, driver
from .arguments import HOST, OTHER_DEVICE, UNKNOWN_DEVICE, ArgumentTypeError


_C_UINT64_VALUE = ctypes.c_uint64.value  # the descriptor behind `word.value = ...`

# CUtensorMapDataType member per weft element: TMA moves bytes, so integers and fp8 only
# need the right width (OOB fill is zero bits either way).
_TMA_DATA_TYPES = {
    "fp16": "FLOAT16", "bf16": "BFLOAT16", "fp32": "FLOAT32", "fp64": "FLOAT64",
    "fp8e4m3": "UINT8", "fp8e5m2": "UINT8", "i8": "UINT8", "u8": "UINT8",
    "i16": "UINT16", "u16": "UINT16", "i32": "INT32", "u32": "UINT32",
    "i64": "INT64", "u64": "UINT64",
}
_TMA_SWIZZLE_NAMES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


class TensorDescriptorError(ValueError):
    """A tensor, box or layout that no TMA descriptor can describe."""


class TensorDescriptor:
    """A TMA descriptor: `base` tensor of `shape`/`strides` (elements) moved in
    `block_shape` boxes that land in shared memory as `layout`.

    Fields (read-only): base, shape, strides, block_shape, layout (an NVMMASharedLayout;
    None for a rank-1 box, which is contiguous), dtype (weft ScalarType), type (the
    TensorDescriptorType kernels are specialised on), swizzle (bytes), device (CUDA
    ordinal, or arguments.HOST / UNKNOWN_DEVICE), address (of base's first element),
    signature (the kernel's parameter type string), tensor_map (the 128 encoded bytes;
    None for host tensors) and launch_key (what `arguments.read` keys a launch on).

    `TensorDescriptor(base, shape, strides, block_shape, layout)` describes `shape` and
    `strides` (elements) starting at base's first element, e.g. a view that is not a
    tensor of its own; `from_tensor` takes them from the tensor.
    """

    __slots__ = ("base", "shape", "strides", "block_shape", "layout", "dtype", "type",
                 "swizzle", "device", "signature", "tensor_map", "address", "launch_key")

    def __init__(self, base: Any, shape: Sequence[int], strides: Sequence[int],
                 block_shape: Sequence[int], layout: Any = None):
        address, dtype, itemsize, device = _tensor_facts(base)
        shape, strides = _ints("shape", shape), _ints("strides", strides)
        block_shape = _ints("block_shape", block_shape)
        tensor_type = _box_type(dtype, block_shape, layout)
        if layout is None and len(block_shape) > 1:
            layout = NVMMASharedLayout.get_default_for(block_shape, dtype.bits)
            tensor_type = dataclasses.replace(tensor_type, encoding=layout)
        _check_global(address, shape, strides, block_shape, itemsize)
        for name, value in (("base", base), ("shape", shape), ("strides", strides),
                            ("block_shape", block_shape), ("layout", layout),
                            ("dtype", dtype), ("type", tensor_type),
                            ("swizzle", 0 if layout is None else layout.swizzle_byte_width),
                            ("device", device), ("address", address)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "signature", tensor_descriptor_signature(
            dtype, block_shape, self.swizzle))
        tensor_map = None if device == HOST else _encode(self, itemsize)
        object.__setattr__(self, "tensor_map", tensor_map)
        # What arguments.read returns as this argument's key (see arguments.py).
        bits = arguments.TORCH_MEMORY if _is_torch_tensor(base) else 0
        object.__setattr__(self, "launch_key", (type(self), self.signature, bits, device))

    @classmethod
    def from_tensor(cls, tensor: Any, block_shape: Sequence[int],
                    layout: Any = None) -> "TensorDescriptor":
        """A descriptor over all of `tensor` (a torch tensor, an object with
        `__cuda_array_interface__`, or a numpy array for the emulator) with boxes of
        `block_shape`; `layout` defaults to NVMMASharedLayout.get_default_for."""
        shape, strides = _shape_and_strides(tensor)
        return cls(tensor, shape, strides, block_shape, layout)

    def __setattr__(self, name, value):
        raise AttributeError(f"TensorDescriptor is read-only (tried to set {name!r}); "
                             "build a new one with TensorDescriptor.from_tensor")

    def __repr__(self) -> str:
        where = {HOST: "host", UNKNOWN_DEVICE: "cuda"}.get(self.device, f"cuda:{self.device}")
        return (f"TensorDescriptor({self.dtype}, shape={list(self.shape)}, "
                f"strides={list(self.strides)}, block_shape={list(self.block_shape)}, "
                f"swizzle={self.swizzle}, {where})")


# ----------------------------------------------------------------------------- reading

def _is_torch_tensor(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _tensor_facts(base) -> tuple[int, ScalarType, int, int]:
    """(address, element type, element bytes, device) of a descriptor's base tensor."""
    import numpy as np

    if isinstance(base, np.ndarray):
        address, dtype, device = base.ctypes.data, base.dtype, HOST
    elif _is_torch_tensor(base):
        address, dtype = base.data_ptr(), base.dtype
        device = base.get_device()
        if device < 0:
            device = HOST if base.device.type == "cpu" else OTHER_DEVICE
    elif hasattr(base, "__cuda_array_interface__"):
        cai = base.__cuda_array_interface__
        address, dtype = cai["data"][0], cai["typestr"]
        device = arguments._dlpack_device(base) if hasattr(base, "__dlpack_device__") \
            else UNKNOWN_DEVICE
    else:
        raise ArgumentTypeError(
            f"TensorDescriptor needs a torch tensor, an object with __cuda_array_interface__ "
            f"or a numpy array, got {type(base).__module__}.{type(base).__qualname__}")
    if device == OTHER_DEVICE:
        raise TensorDescriptorError("TensorDescriptor: the tensor lives on a device weft "
                                    "cannot use; move it to a CUDA device or to the host")
    element = ScalarType(arguments.dtype_signature(dtype))
    if element.bits < 8:
        raise TensorDescriptorError(f"TensorDescriptor: TMA cannot move {element} (bool) "
                                    "elements; store them as u8")
    return int(address), element, element.bits // 8, device


def _shape_and_strides(tensor) -> tuple[tuple, tuple]:
    """Shape and strides in elements of a numpy array, torch tensor or CAI object."""
    if _is_torch_tensor(tensor):
        return tuple(tensor.shape), tuple(tensor.stride())
    if hasattr(tensor, "__cuda_array_interface__"):
        cai = tensor.__cuda_array_interface__
        shape, strides = tuple(cai["shape"]), cai.get("strides")
        itemsize = int(cai["typestr"][2:])
        if strides is None:  # C-contiguous
            return shape, _contiguous_strides(shape)
        return shape, _element_strides(tuple(strides), itemsize)
    import numpy as np

    if isinstance(tensor, np.ndarray):
        return tuple(tensor.shape), _element_strides(tuple(tensor.strides), tensor.itemsize)
    _tensor_facts(tensor)  # raises the unsupported-type error
    raise AssertionError("unreachable")


def _contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _element_strides(byte_strides: tuple, itemsize: int) -> tuple:
    for dim, stride in enumerate(byte_strides):
        if stride % itemsize:
            raise TensorDescriptorError(
                f"TensorDescriptor: stride {stride} bytes of dim {dim} is not a whole number "
                f"of {itemsize}-byte elements; TMA needs element-aligned strides")
    return tuple(s // itemsize for s in byte_strides)


def _ints(name: str, values) -> tuple[int, ...]:
    try:
        items = tuple(values)
    except TypeError:
        raise TensorDescriptorError(f"TensorDescriptor: {name} must be a list of ints, "
                                    f"got {values!r}") from None
    try:
        if any(isinstance(v, bool) for v in items):
            raise TypeError
        return tuple(operator.index(v) for v in items)
    except TypeError:
        raise TensorDescriptorError(f"TensorDescriptor: {name} must be a list of ints, "
                                    f"got {list(items)}") from None


# ----------------------------------------------------------------------------- checking

@functools.lru_cache(maxsize=256)
def _box_type(dtype: ScalarType, block_shape: tuple, layout) -> TensorDescriptorType:
    """The kernel-facing type of the box, after checking `layout` against TMA's rules.
    Cached: a launch path builds descriptors per call, and the layout algebra behind
    this answer costs hundreds of microseconds (errors are not cached, they re-raise)."""
    if layout is None:
        swizzle = None
    else:
        if not isinstance(layout, NVMMASharedLayout):
            raise ArgumentTypeError(
                f"TensorDescriptor: layout must be an NVMMASharedLayout (the layout TMA "
                f"writes), got {layout!r}; use NVMMASharedLayout.get_default_for("
                f"{list(block_shape)}, {dtype.bits}) or leave layout=None")
        if len(block_shape) == 1 and layout.rank != 1:
            raise TensorDescriptorError(
                f"TensorDescriptor: a rank-1 box ({list(block_shape)}) lands contiguously "
                f"and takes layout=None or NVMMASharedLayout.get_default_for("
                f"{list(block_shape)}, {dtype.bits}), got {layout}")
        if layout.element_bitwidth != dtype.bits:
            raise TensorDescriptorError(
                f"TensorDescriptor: {layout} is for {layout.element_bitwidth}-bit elements but "
                f"the tensor holds {dtype} ({dtype.bits} bits); use element_bitwidth="
                f"{dtype.bits}")
        if layout.transposed:
            raise TensorDescriptorError(
                f"TensorDescriptor: {layout} is transposed, but TMA always stores the "
                "tensor's innermost dim contiguously; use transposed=False and permute the "
                "shared buffer (smem.permute) where a transposed operand is needed")
        swizzle = layout.swizzle_byte_width
    try:
        tensor_type = tensor_descriptor_type(dtype, block_shape, swizzle, encoding=layout)
    except ValueError as error:
        raise TensorDescriptorError(f"TensorDescriptor: {error}") from None
    if layout is not None:
        try:
            linear = layout.to_linear(block_shape)
        except ValueError as error:  # LayoutError
            linear = error
        if linear != tensor_type.layout:
            raise TensorDescriptorError(
                f"TensorDescriptor: {layout} does not place a {list(block_shape)} box where "
                f"TMA writes it ({linear if isinstance(linear, Exception) else 'another order'});"
                f" use rank={len(block_shape)}")
    return tensor_type


def _check_global(address: int, shape: tuple, strides: tuple, block_shape: tuple,
                  itemsize: int) -> None:
    """cuTensorMapEncodeTiled's rules for the global tensor."""
    rank = len(block_shape)
    if len(shape) != rank or len(strides) != rank:
        raise TensorDescriptorError(
            f"TensorDescriptor: block_shape {list(block_shape)} has {rank} dims but the tensor "
            f"has shape {list(shape)} and strides {list(strides)}; give one box size per "
            "tensor dim (1 for dims the box does not span)")
    if address % 16:
        raise TensorDescriptorError(
            f"TensorDescriptor: base address {address:#x} is not 16-byte aligned (TMA needs "
            "it); allocate the tensor afresh or start the view at an aligned element")
    for dim, size in enumerate(shape):
        if not 1 <= size <= TMA_MAX_GLOBAL_DIM:
            raise TensorDescriptorError(
                f"TensorDescriptor: shape[{dim}] = {size} must be from 1 to 2**32 (TMA "
                f"cannot describe empty tensors; shape {list(shape)})")
    if strides[-1] != 1:
        raise TensorDescriptorError(
            f"TensorDescriptor: the innermost stride is {strides[-1]} elements; TMA needs the "
            f"last dim contiguous (stride 1; strides {list(strides)}); make the tensor "
            ".contiguous() or describe a transposed view with its dims swapped")
    for dim in range(rank - 1):
        nbytes = strides[dim] * itemsize
        if strides[dim] < 0 or nbytes % 16 or nbytes >= TMA_MAX_STRIDE_BYTES:
            raise TensorDescriptorError(
                f"TensorDescriptor: stride of dim {dim} is {strides[dim]} elements = {nbytes} "
                f"bytes; TMA needs every stride but the innermost to be a non-negative "
                f"multiple of 16 bytes below 2**40 (strides {list(strides)}); pad the rows "
                f"to a multiple of {16 // itemsize} elements")


# ----------------------------------------------------------------------------- encoding

def _encode(desc: TensorDescriptor, itemsize: int) -> bytes:
    """The 128-byte CUtensorMap of `desc` (cuTensorMapEncodeTiled; CUDA driver API,
    "Tensor Map Object Management"): no interleave, L2 promotion 256B, OOB fill zeros."""
    return _encoded(desc.dtype.name, desc.address, desc.shape, desc.strides, _copy_box(desc),
                    desc.swizzle, itemsize)


def _copy_box(desc: TensorDescriptor) -> tuple:
    """The box the tensor map encodes: one TMA copy's, a swizzle-row-wide strip of a wider
    box (the kernel issues one copy per strip)."""
    return tma_copy_box(desc.block_shape, desc.swizzle, desc.dtype.bits)


@functools.lru_cache(maxsize=1024)
def _encoded(dtype_name: str, address: int, shape: tuple, strides: tuple, block_shape: tuple,
             swizzle: int, itemsize: int) -> bytes:
    """The encoding, cached: the 128 bytes depend only on these values (not on the
    tensor object), and a matmul in a loop builds the same descriptors every call."""
    driver.init()
    driver.make_address_context_current(address)
    d = driver.cuda()
    rank = len(shape)
    dims = [d.cuuint64_t(s) for s in reversed(shape)]
    byte_strides = [d.cuuint64_t(s * itemsize) for s in reversed(strides[:-1])]
    box = [d.cuuint32_t(b) for b in reversed(block_shape)]
    ones = [d.cuuint32_t(1)] * rank
    data_type = getattr(d.CUtensorMapDataType,
                        f"CU_TENSOR_MAP_DATA_TYPE_{_TMA_DATA_TYPES[dtype_name]}")
    swizzle_mode = getattr(d.CUtensorMapSwizzle,
                           f"CU_TENSOR_MAP_SWIZZLE_{_TMA_SWIZZLE_NAMES[swizzle]}")
    tensor_map = driver.check(d.cuTensorMapEncodeTiled(
        data_type, rank, address, dims, byte_strides, box, ones,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_mode,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({dtype_name}, shape={list(shape)}, strides={list(strides)}, "
        f"box={list(block_shape)}, swizzle={swizzle})")
    words = list(tensor_map.opaque)
    return EncodedTensorMap(struct.pack(f"<{len(words)}Q", *(int(w) for w in words)), shape, strides)


class EncodedTensorMap(bytes):
    """A CUtensorMap's 128 bytes (what a launch passes for a descriptor argument), with the
    global `shape` and `strides` (elements) they encode: a kernel that reads `desc.shape`
    takes them as hidden parameters, which the launcher fills from here."""

    def __new__(cls, data: bytes, shape: tuple, strides: tuple):
        encoded = super().__new__(cls, data)
        encoded.shape, encoded.strides = shape, strides
        return encoded


# ----------------------------------------------------------------------------- rebinding

def rebinder(desc: TensorDescriptor, holder) -> Callable[[int], None]:
    """A function address -> None that writes into `holder` (a 128-byte tensor-map
    holder) the tensor map of `desc` moved to another base address: same shape, strides,
    box and swizzle. For a launch repeated on new output tensors. The address must be
    16-byte aligned (a fresh torch allocation is).

    CUtensorMap is opaque in cuda.h. Where `address_field()` found, on this driver, the
    global address stored as is in 8 bytes of the map, the function writes just those;
    otherwise it encodes the map again (cached per address)."""
    field = address_field()
    if field is not None:
        word = ctypes.c_uint64.from_buffer(holder, field)
        word.value = desc.address
        if bytes(holder) == desc.tensor_map:
            # `word.value = address` as a C callable: a prepared call runs it every call.
            return functools.partial(_C_UINT64_VALUE.__set__, word)
    key = (desc.dtype.name, desc.shape, desc.strides, _copy_box(desc), desc.swizzle, desc.dtype.bits // 8)

    def encode(address: int) -> None:
        dtype_name, shape, strides, block_shape, swizzle, itemsize = key
        holder.value = _encoded(dtype_name, address, shape, strides, block_shape, swizzle, itemsize)
    return encode


_ADDRESS_FIELD: list = []  # [offset or None] once probed


def address_field() -> Optional[int]:
    """The byte offset in a CUtensorMap at which this driver stores the global address
    as a little-endian u64, or None when the probe cannot show it. The probe encodes
    sample maps (ranks 2 and 4, 16- and 32-bit elements) at addresses that differ in
    every bit from 4 to 47 and accepts an offset only when every encoding equals the
    first one with just those 8 bytes replaced by its address. Asked once per process."""
    if not _ADDRESS_FIELD:
        _ADDRESS_FIELD.append(_probe_address_field())
    return _ADDRESS_FIELD[0]


def clear_address_field() -> None:
    """Forget the probe's answer (tests that swap the driver)."""
    _ADDRESS_FIELD.clear()


_PROBE_BASE = 0x7F00_0000_0000


def _probe_address_field() -> Optional[int]:
    samples = (("bf16", (4, 8, 1024, 128), (8 * 1024 * 128, 1024 * 128, 128, 1), (1, 1, 64, 64), 128, 2),
               ("fp32", (1000, 520), (520, 1), (64, 32), 128, 4))
    try:
        first = _uncached_encode(*samples[0][:1], _PROBE_BASE, *samples[0][1:])
    except Exception:  # no driver: nothing to probe, nothing to patch
        return None
    offsets = [o for o in range(0, TENSOR_MAP_BYTES - 7, 8)
               if struct.unpack_from("<Q", first, o)[0] == _PROBE_BASE]
    if len(offsets) != 1:
        return None
    offset = offsets[0]
    for dtype_name, *rest in samples:
        template = _uncached_encode(dtype_name, _PROBE_BASE, *rest)
        for bit in range(4, 48):
            address = _PROBE_BASE ^ (1 << bit)
            expected = bytearray(template)
            struct.pack_into("<Q", expected, offset, address)
            if _uncached_encode(dtype_name, address, *rest) != bytes(expected):
                return None
    return offset


def _uncached_encode(dtype_name, address, shape, strides, block_shape, swizzle, itemsize) -> bytes:
    return _encoded.__wrapped__(dtype_name, address, shape, strides, block_shape, swizzle, itemsize)
