"""Launch arguments: what each one is (signature, specialization, device) and how it is
packed for cuLaunchKernelEx.

Every argument is *read* once per launch by a reader chosen by `type(arg)` (cached), giving

    key   = (type, signature string, specialization bits, device)
    value = the 64-bit address for arrays, the Python number for scalars, the 128 bytes
            of the CUtensorMap for a TensorDescriptor (None for a host one)

`key` is hashable and cheap, so a launcher or the JIT dispatcher can check a whole
argument list with one dict lookup; `value` is what gets packed. `device` is a CUDA
ordinal, HOST for host memory (numpy, CPU torch), UNKNOWN_DEVICE for CUDA memory whose
ordinal the object does not tell (a bare `__cuda_array_interface__`), OTHER_DEVICE for
memory weft cannot use (MPS, XPU, ...), and None for scalars.

Specialization (docs/design.md runtime/): integers on `== 1` and divisibility by 16, pointers
on 16-byte alignment. A TensorDescriptor's signature string ("tensordesc<bf16[128,64],
swizzle=128>") is its specialization: element, box and swizzle; it goes to the kernel by
value as a 128-byte parameter.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from typing import Callable, Optional, Sequence

import numpy as np

from ..compiler.hardware import (MAX_CLUSTER_CTAS, MAX_GRID, MAX_REGISTERS, MIN_REGISTERS, TENSOR_MAP_ALIGN,
                                 TENSOR_MAP_BYTES)
from ..compiler.types import (TENSOR_DESCRIPTOR_PREFIX, parse_tensor_descriptor_signature,
                              tensor_descriptor_signature, tensor_descriptor_swizzle,
                              tensor_descriptor_type)

HOST = -1
UNKNOWN_DEVICE = -2
OTHER_DEVICE = -3

# Specialization bits, and the names the compiler sees (`specialization_names`).
SPEC_EQUAL_TO_1 = 1
SPEC_DIVISIBLE_BY_16 = 2
# In a TensorDescriptor's key: its memory is a torch tensor's, so the launch follows
# torch's current stream as it does for torch tensor arguments (no compiler meaning).
TORCH_MEMORY = 4
EQUAL_TO_1 = "equal_to_1"
DIVISIBLE_BY_16 = "divisible_by_16"


class LaunchError(ValueError):
    """A launch cannot proceed: wrong argument count, device, grid, ..."""


class ArgumentTypeError(LaunchError, TypeError):
    """An argument has a type or dtype the kernel cannot take."""


# ----------------------------------------------------------------------------- dtypes

# numpy dtype names (ml_dtypes names for bf16/fp8) and torch dtype names share spellings.
_DTYPE_NAMES = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "i1",
    "float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2",
}
# __cuda_array_interface__ typestr without the byte-order character.
_TYPESTRS = {
    "f2": "fp16", "f4": "fp32", "f8": "fp64", "i1": "i8", "i2": "i16", "i4": "i32",
    "i8": "i64", "u1": "u8", "u2": "u16", "u4": "u32", "u8": "u64", "b1": "i1",
}
# DLPack (type code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6,
# kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12 (dlpack.h, DLDataTypeCode).
_DLPACK_TYPES = {
    (0, 8): "i8", (0, 16): "i16", (0, 32): "i32", (0, 64): "i64",
    (1, 8): "u8", (1, 16): "u16", (1, 32): "u32", (1, 64): "u64",
    (2, 16): "fp16", (2, 32): "fp32", (2, 64): "fp64", (4, 16): "bf16",
    (6, 8): "i1", (10, 8): "fp8e4m3", (12, 8): "fp8e5m2",
}
_numpy_sigs: dict = {}  # numpy dtype -> signature string


def dtype_signature(dtype) -> str:
    """The element signature ("fp32", "bf16", ...) of a torch dtype, numpy dtype or
    `__cuda_array_interface__` typestr. ArgumentTypeError for anything else."""
    if isinstance(dtype, str) and len(dtype) == 3 and dtype[0] in "<>|=":
        sig = _TYPESTRS.get(dtype[1:])
    else:
        text = str(dtype)
        sig = _DTYPE_NAMES.get(text[6:] if text.startswith("torch.") else text)
        if sig is None and not text.startswith("torch."):
            try:
                sig = _DTYPE_NAMES.get(np.dtype(dtype).name)
            except TypeError:
                sig = None
    if sig is None:
        raise ArgumentTypeError(f"weft has no element type for dtype {dtype!r}; supported: "
                                f"{', '.join(sorted(set(_DTYPE_NAMES.values())))}")
    return sig


def _numpy_sig(dtype) -> str:
    sig = _numpy_sigs.get(dtype)
    if sig is None:
        sig = _numpy_sigs[dtype] = dtype_signature(dtype)
    return sig


# ----------------------------------------------------------------------------- readers

def _align_bits(address: int) -> int:
    return 0 if address & 15 else SPEC_DIVISIBLE_BY_16


def _read_int(x):
    if -0x80000000 <= x <= 0x7FFFFFFF:
        sig = "i32"
    elif -0x8000000000000000 <= x <= 0x7FFFFFFFFFFFFFFF:
        sig = "i64"
    elif 0 <= x <= 0xFFFFFFFFFFFFFFFF:
        sig = "u64"
    else:
        raise ArgumentTypeError(f"integer {x} does not fit in 64 bits")
    spec = SPEC_EQUAL_TO_1 if x == 1 else (0 if x & 15 else SPEC_DIVISIBLE_BY_16)
    return (int, sig, spec, None), x


def _read_bool(x):
    return (bool, "i1", 0, None), x


def _read_float(x):
    return (float, "fp32", 0, None), x


def _read_numpy_scalar(x):
    sig = _numpy_sig(x.dtype)
    if sig[0] in "iu" and sig != "i1":
        value = int(x)
        spec = SPEC_EQUAL_TO_1 if value == 1 else (0 if value & 15 else SPEC_DIVISIBLE_BY_16)
        return (type(x), sig, spec, None), value
    return (type(x), sig, 0, None), (bool(x) if sig == "i1" else float(x))


def _read_numpy_array(a):
    address = a.ctypes.data
    return (type(a), "*" + _numpy_sig(a.dtype), _align_bits(address), HOST), address


# Pointer signatures, looked up directly on the hot path (one dict probe per argument).
_TORCH_POINTER_SIGS: dict = {}  # torch.dtype -> "*bf16", ...
_TYPESTR_POINTER_SIGS = {order + code: "*" + sig for code, sig in _TYPESTRS.items()
                         for order in "<>|="}


def _read_torch_tensor(t):
    address = t.data_ptr()
    sig = _TORCH_POINTER_SIGS.get(t.dtype)
    if sig is None:
        sig = _TORCH_POINTER_SIGS[t.dtype] = "*" + dtype_signature(t.dtype)
    device = t.get_device()  # the CUDA ordinal; -1 for CPU (and other devices)
    if device < 0:
        device = HOST if t.device.type == "cpu" else OTHER_DEVICE
    return (type(t), sig, 0 if address & 15 else SPEC_DIVISIBLE_BY_16, device), address


def _read_cuda_array_interface(obj):
    cai = obj.__cuda_array_interface__
    address = cai["data"][0]
    sig = _TYPESTR_POINTER_SIGS.get(cai["typestr"]) or _typestr_sig(cai["typestr"])
    return (type(obj), sig, 0 if address & 15 else SPEC_DIVISIBLE_BY_16,
            UNKNOWN_DEVICE), address


def _read_cuda_array_interface_with_device(obj):
    # CuPy and others also answer __dlpack_device__, which tells the ordinal cheaply.
    cai = obj.__cuda_array_interface__
    address = cai["data"][0]
    sig = _TYPESTR_POINTER_SIGS.get(cai["typestr"]) or _typestr_sig(cai["typestr"])
    kind, ordinal = obj.__dlpack_device__()
    device = ordinal if kind == _DL_CUDA else _dlpack_place(kind, ordinal)
    return (type(obj), sig, 0 if address & 15 else SPEC_DIVISIBLE_BY_16, device), address


def _typestr_sig(typestr: str) -> str:
    sig = _TYPESTRS.get(typestr[1:])
    if sig is None:
        raise ArgumentTypeError(
            f"__cuda_array_interface__ typestr {typestr!r} has no weft element type "
            "(bf16 and fp8 have no typestr; pass such arrays as torch tensors or DLPack)")
    return "*" + sig


# DLPack's kDLCUDA 2 and kDLCUDAManaged 13 are device memory; kDLCPU 1 and
# kDLCUDAHost 3 (pinned) are host memory for weft's purposes.
_DL_CUDA, _DL_CUDA_MANAGED, _DL_CPU, _DL_CUDA_HOST = 2, 13, 1, 3


def _dlpack_place(kind: int, ordinal: int) -> int:
    if kind == _DL_CUDA or kind == _DL_CUDA_MANAGED:
        return int(ordinal)
    return HOST if kind in (_DL_CPU, _DL_CUDA_HOST) else OTHER_DEVICE


def _dlpack_device(obj) -> int:
    return _dlpack_place(*obj.__dlpack_device__())


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


# DLManagedTensorVersioned starts with {uint32 major, minor}, manager_ctx, deleter,
# uint64 flags, then the DLTensor; the unversioned DLManagedTensor starts with it.
_VERSIONED_OFFSET = 8 + 8 + 8 + 8
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype, _capsule_is_valid.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                       ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                       ctypes.c_char_p]


def dlpack_tensor_info(capsule) -> tuple[int, str, int, int]:
    """(data address incl. byte_offset, element signature, device type, device id) of a
    DLPack capsule. The capsule is only read, not consumed: its producer's destructor
    still frees it, and the caller keeps the producing object alive."""
    if _capsule_is_valid(capsule, b"dltensor"):
        tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    elif _capsule_is_valid(capsule, b"dltensor_versioned"):
        base = _capsule_pointer(capsule, b"dltensor_versioned")
        tensor = _DLTensor.from_address(base + _VERSIONED_OFFSET)
    else:
        raise ArgumentTypeError("__dlpack__() did not return a 'dltensor' capsule")
    dtype = tensor.dtype
    sig = _DLPACK_TYPES.get((dtype.code, dtype.bits)) if dtype.lanes == 1 else None
    if sig is None:
        raise ArgumentTypeError(f"DLPack dtype (code {dtype.code}, {dtype.bits} bits, "
                                f"{dtype.lanes} lanes) has no weft element type")
    address = (tensor.data or 0) + tensor.byte_offset
    return address, sig, tensor.device.device_type, tensor.device.device_id


def _read_dlpack(obj):
    device = _dlpack_device(obj)
    # Called without a stream: the producer then orders its work before the legacy
    # default stream, which is where weft launches when no torch tensor is involved.
    address, sig, _, _ = dlpack_tensor_info(obj.__dlpack__())
    return (type(obj), "*" + sig, _align_bits(address), device), address


def _read_tensor_descriptor(desc):
    return desc.launch_key, desc.tensor_map


def _read_triton_tensor_descriptor(desc):
    """Triton's host descriptor, encoded at launch (runtime/host_tensor_descriptor.py)."""
    return _read_tensor_descriptor(desc.encoded())


def on_torch_stream(key: tuple) -> bool:
    """True when an argument's memory belongs to torch on a CUDA device: the launch then
    goes to torch's current stream."""
    cls, sig, bits, device = key
    if device is None or device < 0:
        return False
    if is_descriptor_type(sig):
        return bool(bits & TORCH_MEMORY)
    return cls.__module__.split(".")[0] == "torch"


def is_descriptor_type(param_type: str) -> bool:
    """True for a TMA descriptor parameter's signature string."""
    return param_type.startswith(TENSOR_DESCRIPTOR_PREFIX)


def canonical_descriptor_type(text: str) -> str:
    """The canonical spelling of a descriptor signature string (the swizzle spelled out,
    no spaces), so that compile(signature=...) and launched descriptors key alike.
    ValueError naming the broken rule for a box TMA cannot move."""
    element, block_shape, swizzle = parse_tensor_descriptor_signature(text)
    type_ = tensor_descriptor_type(element, block_shape, swizzle)
    return tensor_descriptor_signature(element, block_shape, tensor_descriptor_swizzle(type_))


def _reader_for(cls) -> Callable:
    """Choose (once per type) how to read arguments of type `cls`."""
    from .tensor_descriptor import TensorDescriptor  # it imports this module
    from .host_tensor_descriptor import TensorDescriptor as TritonTensorDescriptor
    if issubclass(cls, TensorDescriptor):
        return _read_tensor_descriptor
    if issubclass(cls, TritonTensorDescriptor):
        return _read_triton_tensor_descriptor
    if issubclass(cls, bool):
        return _read_bool
    if issubclass(cls, int):
        return _read_int
    if issubclass(cls, float):
        return _read_float
    if issubclass(cls, np.ndarray):
        return _read_numpy_array
    if issubclass(cls, np.generic):
        return _read_numpy_scalar
    if cls.__module__.split(".")[0] == "torch":
        torch = sys.modules.get("torch")
        if torch is not None and issubclass(cls, torch.Tensor):
            return _read_torch_tensor
    if hasattr(cls, "__cuda_array_interface__"):
        if hasattr(cls, "__dlpack_device__"):
            return _read_cuda_array_interface_with_device
        return _read_cuda_array_interface
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        return _read_dlpack
    return _read_by_instance


def _read_by_instance(obj):
    # The protocols may be instance attributes (wrappers often set
    # __cuda_array_interface__ in __init__), so this type's readers are chosen per call.
    if hasattr(obj, "__cuda_array_interface__"):
        if hasattr(obj, "__dlpack_device__"):
            return _read_cuda_array_interface_with_device(obj)
        return _read_cuda_array_interface(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _read_dlpack(obj)
    raise ArgumentTypeError(
        f"cannot pass {type(obj).__module__}.{type(obj).__qualname__} to a kernel; "
        "pass a torch tensor, an object with __cuda_array_interface__ or __dlpack__, "
        "a numpy array (emulator), or a Python int/float/bool")


_READERS: dict[type, Callable] = {}


def read(arg) -> tuple[tuple, object]:
    """(key, value) for one argument; see the module docstring."""
    reader = _READERS.get(type(arg))
    if reader is None:
        reader = _READERS[type(arg)] = _reader_for(type(arg))
    return reader(arg)


def read_all(args: Sequence) -> tuple[tuple, list]:
    """(tuple of keys, list of values) for an argument list: the launch hot path."""
    readers = _READERS
    keys, values = [], []
    for arg in args:
        reader = readers.get(type(arg))
        if reader is None:
            reader = readers[type(arg)] = _reader_for(type(arg))
        key, value = reader(arg)
        keys.append(key)
        values.append(value)
    return tuple(keys), values


def signature_of(args: Sequence) -> tuple[str, ...]:
    """Signature strings per argument: "*fp32" for an fp32 array, "i32", "fp32", ..."""
    return tuple(read(a)[0][1] for a in args)


def specialization_names(bits: int) -> str:
    """EQUAL_TO_1, DIVISIBLE_BY_16 or "" for a key's specialization bits."""
    if bits & SPEC_EQUAL_TO_1:
        return EQUAL_TO_1
    return DIVISIBLE_BY_16 if bits & SPEC_DIVISIBLE_BY_16 else ""


def specialization_of(args: Sequence) -> tuple[str, ...]:
    """Per argument: "equal_to_1" (int == 1), "divisible_by_16" (int divisible by 16,
    or pointer aligned to 16 bytes) or ""."""
    return tuple(specialization_names(read(a)[0][2]) for a in args)


def is_host(key: tuple) -> bool:
    return key[3] == HOST


def describe(key: tuple) -> str:
    """A reader's key in words, for error messages."""
    cls, sig, _, device = key
    name = f"{cls.__module__}.{cls.__qualname__}".replace("builtins.", "")
    if device is None:
        return f"a Python {name} ({sig})" if cls.__module__ == "builtins" else \
            f"a {name} scalar ({sig})"
    where = {HOST: "host memory", UNKNOWN_DEVICE: "a CUDA device",
             OTHER_DEVICE: "a non-CUDA device"}.get(device, f"cuda:{device}")
    if is_descriptor_type(sig):
        return f"a {name} {sig} over {where}"
    return f"a {name} of dtype {sig[1:]} ({sig}) in {where}"


# ----------------------------------------------------------------------------- checking

def check_count(kernel: str, names: Sequence[str], args: Sequence) -> None:
    if len(args) != len(names):
        raise LaunchError(f"kernel '{kernel}' takes {len(names)} argument"
                          f"{'' if len(names) == 1 else 's'} ({', '.join(names)}), "
                          f"got {len(args)}")


_FLOAT_PARAMS = frozenset({"fp16", "bf16", "fp32", "fp64"})


def _scalar_accepts(param_type: str, arg_sig: str, cls) -> bool:
    if param_type == arg_sig:
        return True
    param_int = param_type[0] in "iu"
    if issubclass(cls, (bool, np.bool_)):
        return param_int
    arg_int = arg_sig[0] in "iu"
    if arg_int:
        return True  # ints go to int params (range-checked when packed) or float params
    return param_type in _FLOAT_PARAMS  # floats only to float params


def check_keys(kernel: str, names: Sequence[str], param_types: Sequence[str],
               keys: Sequence[tuple]) -> int | None:
    """Check read arguments against compiled parameter types; return the launch device
    (a CUDA ordinal, UNKNOWN_DEVICE, or None when no array says). Raises
    ArgumentTypeError / LaunchError with a message naming the argument."""
    device, device_from = None, None
    for name, ptype, key in zip(names, param_types, keys):
        cls, sig, _, where = key
        what = f"argument '{name}' of kernel '{kernel}'"
        descriptor = is_descriptor_type(ptype)
        if descriptor or ptype.startswith("*"):
            if where is None or descriptor != is_descriptor_type(sig):
                wanted = f"a TensorDescriptor ({ptype})" if descriptor else f"a {ptype} array"
                raise ArgumentTypeError(f"{what} must be {wanted}, got {describe(key)}")
            if sig != ptype:
                wanted = "a TensorDescriptor of that type" if descriptor else \
                    f"a {ptype[1:]} array"
                raise ArgumentTypeError(
                    f"{what} was compiled for {ptype} but got {describe(key)}; pass "
                    f"{wanted} or compile the kernel for {sig}")
            if where == HOST:
                raise LaunchError(
                    f"{what} is {describe(key)}, but a GPU launch needs device memory; "
                    "move it to the GPU (e.g. tensor.cuda()) or pass only host arrays to "
                    "run on the CPU emulator")
            if where == OTHER_DEVICE:
                raise LaunchError(f"{what} lives on a device weft cannot launch on "
                                  f"({describe(key)}); use a CUDA array")
            if where >= 0:
                if device is not None and device >= 0 and where != device:
                    raise LaunchError(f"{what} is on cuda:{where} but '{device_from}' is "
                                      f"on cuda:{device}; all arrays of one launch must be "
                                      "on one device")
                if device is None or device < 0:
                    device, device_from = where, name
            elif device is None:
                device, device_from = UNKNOWN_DEVICE, name
        else:
            if where is not None:
                raise ArgumentTypeError(f"{what} is a {ptype} scalar, got {describe(key)}")
            if not _scalar_accepts(ptype, sig, cls):
                raise ArgumentTypeError(f"{what} was compiled for {ptype} but got "
                                        f"{describe(key)}")
    return device


def check_cluster(kernel: str, value) -> Optional[tuple[int, int, int]]:
    """The `cluster=` launch option as CTA counts (x, y, z); None for clusters of one CTA.
    LaunchError naming the kernel for anything else."""
    if value is None:
        return None
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise LaunchError(f"kernel '{kernel}': cluster={value!r} must be 1-3 positive ints (CTAs "
                          f"per cluster along x, y, z)")
    dims = (dims + (1, 1))[:3]
    if dims[0] * dims[1] * dims[2] > MAX_CLUSTER_CTAS:
        raise LaunchError(f"kernel '{kernel}': cluster={value!r} has {dims[0] * dims[1] * dims[2]} "
                          f"CTAs; Hopper's portable limit is {MAX_CLUSTER_CTAS}")
    return None if dims == (1, 1, 1) else dims


def check_maxnreg(kernel: str, value) -> Optional[int]:
    """The `maxnreg=` launch option (registers a thread may hold at most, as in Triton), or
    None; LaunchError naming the kernel for anything but an int in [MIN_REGISTERS, the
    hardware's .maxnreg limit]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_REGISTERS <= value <= MAX_REGISTERS:
        raise LaunchError(f"kernel '{kernel}': maxnreg must be an int from {MIN_REGISTERS} to {MAX_REGISTERS} "
                          f"(registers a thread may hold), got {value!r}")
    return value


def check_grid(kernel: str, grid, cluster: Optional[Sequence[int]] = None) -> tuple[int, int, int]:
    """Normalise a grid to three positive ints, whole clusters of `cluster` CTAs along
    each axis; LaunchError naming the kernel if not."""
    try:
        dims = tuple(int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
    except (TypeError, ValueError):
        raise LaunchError(f"grid of kernel '{kernel}' must be 1 to 3 ints, "
                          f"got {grid!r}") from None
    if not 1 <= len(dims) <= 3:
        raise LaunchError(f"grid of kernel '{kernel}' must have 1 to 3 dimensions, "
                          f"got {len(dims)}: {dims}")
    dims = dims + (1,) * (3 - len(dims))
    if any(d < 0 for d in dims):
        raise LaunchError(f"grid {dims} of kernel '{kernel}' has a negative dimension")
    if any(d == 0 for d in dims):
        raise LaunchError(f"grid {dims} of kernel '{kernel}' has a zero dimension; every "
                          "grid dimension must be at least 1 (skip the launch for empty "
                          "inputs)")
    for axis, (d, limit) in enumerate(zip(dims, MAX_GRID)):
        if d > limit:
            raise LaunchError(f"grid {dims} of kernel '{kernel}' exceeds the limit of "
                              f"{limit} blocks along axis {axis}")
    for axis, (d, c) in enumerate(zip(dims, cluster or (1, 1, 1))):
        if d % c:
            raise LaunchError(f"grid {dims} of kernel '{kernel}' is not a whole number of clusters "
                              f"{tuple(cluster)}: make axis {axis} ({d} CTAs) a multiple of {c}")
    return dims


# ----------------------------------------------------------------------------- packing

_INT_RANGES = {
    "i1": (0, 1), "i8": (-2**7, 2**7 - 1), "i16": (-2**15, 2**15 - 1),
    "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1),
    "u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1),
}
# Holders are at least 32 bits wide: the PTX parameter may be .u8/.b16 or promoted to
# .b32, and the driver reads the parameter's own size from the holder's address, so a
# wider little-endian holder is correct for either lowering.
_HOLDERS = {
    "i1": ctypes.c_uint32, "i8": ctypes.c_int32, "i16": ctypes.c_int32,
    "i32": ctypes.c_int32, "i64": ctypes.c_int64, "u8": ctypes.c_uint32,
    "u16": ctypes.c_uint32, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
    "fp16": ctypes.c_uint32, "bf16": ctypes.c_uint32, "fp32": ctypes.c_float,
    "fp64": ctypes.c_double,
}


def fp16_bits(x: float) -> int:
    """IEEE binary16 bit pattern of x (round to nearest even; overflow -> inf)."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0xFC00 if x < 0 else 0x7C00


def bf16_bits(x: float) -> int:
    """bfloat16 bit pattern of x: the top half of its fp32 pattern, rounded to nearest
    even; NaN stays a quiet NaN."""
    try:
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        return 0xFF80 if x < 0 else 0x7F80
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        return (bits >> 16) | 0x0040
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def _int_packer(name: str, kernel: str, ptype: str) -> Callable:
    low, high = _INT_RANGES[ptype]

    def pack(value):
        if low <= value <= high:
            return value
        raise ArgumentTypeError(f"argument '{name}' of kernel '{kernel}' is {ptype}, "
                                f"but {value} is outside [{low}, {high}]")
    return pack


_TensorMapHolder = ctypes.c_char * TENSOR_MAP_BYTES


def tensor_map_holder() -> ctypes.Array:
    """A 64-byte aligned 128-byte holder; assigning `.value = bytes` copies all 128 bytes
    (a c_char array's value setter copies embedded zeros too)."""
    raw = (ctypes.c_char * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN))()
    offset = -ctypes.addressof(raw) % TENSOR_MAP_ALIGN
    return _TensorMapHolder.from_buffer(raw, offset)  # keeps `raw` alive


def make_holders(param_types: Sequence[str]) -> list:
    """One ctypes holder per parameter (c_uint64 for pointers, 128 bytes for TMA
    descriptors)."""
    holders = []
    for ptype in param_types:
        if ptype.startswith("*"):
            holders.append(ctypes.c_uint64())
        elif is_descriptor_type(ptype):
            holders.append(tensor_map_holder())
        elif ptype in _HOLDERS:
            holders.append(_HOLDERS[ptype]())
        else:
            raise ArgumentTypeError(f"parameter type {ptype!r} cannot be passed by value; "
                                    "pass fp8 scalars as fp32 and convert in the kernel")
    return holders


def make_packers(kernel: str, names: Sequence[str], param_types: Sequence[str]) -> tuple:
    """Per parameter: None when the read value can be stored into its holder as is
    (pointers, fp32, fp64, tensor-map bytes), else a function value -> holder value
    (range checks, fp16 and bf16 bit patterns)."""
    packers = []
    for name, ptype in zip(names, param_types):
        if ptype.startswith("*") or ptype in ("fp32", "fp64") or is_descriptor_type(ptype):
            packers.append(None)
        elif ptype == "fp16":
            packers.append(fp16_bits)
        elif ptype == "bf16":
            packers.append(bf16_bits)
        else:
            packers.append(_int_packer(name, kernel, ptype))
    return tuple(packers)


def pack_values(param_types: Sequence[str], values: Sequence, kernel: str = "kernel",
                names: Sequence[str] | None = None) -> list:
    """ctypes holders filled with `values` (the slow, one-shot form of the launcher's
    packing), ready for `driver.launch`."""
    names = names or [f"arg{i}" for i in range(len(param_types))]
    holders = make_holders(param_types)
    for holder, pack, value in zip(holders, make_packers(kernel, names, param_types), values):
        holder.value = value if pack is None else pack(value)
    return holders
