"""runtime/arguments.py: reading, checking and packing launch arguments (no GPU needed)."""

import ctypes

import numpy as np
import pytest

from weft.runtime import arguments
from weft.runtime.arguments import ArgumentTypeError, LaunchError


class FakeCudaArray:
    """An object exposing only __cuda_array_interface__ (like a Numba device array)."""

    def __init__(self, address, typestr="<f4", shape=(16,)):
        self.__cuda_array_interface__ = {"data": (address, False), "typestr": typestr,
                                         "shape": shape, "version": 3}


class FakeCupyArray(FakeCudaArray):
    """__cuda_array_interface__ plus __dlpack_device__, as CuPy arrays have."""

    def __init__(self, address, device=0, typestr="<f4"):
        super().__init__(address, typestr)
        self.device = device

    def __dlpack_device__(self):
        return (2, self.device)


class DLPackOnly:
    """Only the DLPack protocol, reporting a CUDA device but backed by a numpy array,
    so the capsule parsing is tested on real capsules without a GPU."""

    def __init__(self, array, device=(2, 0), versioned=False):
        self.array, self.device, self.versioned = array, device, versioned

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self):
        if self.versioned:
            return self.array.__dlpack__(max_version=(1, 0))
        return self.array.__dlpack__()


class FakeTorchDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


def test_signatures_of_scalars_and_host_arrays():
    args = (np.zeros(4, np.float32), np.zeros(4, np.float16), np.zeros(4, np.int8),
            np.zeros(4, np.uint8), np.zeros(4, np.bool_), np.zeros(4, np.int64),
            3, 2**40, 2**63, 1.5, True, np.float32(2.0), np.int64(5))
    assert arguments.signature_of(args) == (
        "*fp32", "*fp16", "*i8", "*u8", "*i1", "*i64", "i32", "i64", "u64", "fp32", "i1",
        "fp32", "i64")


def test_dtype_signature_names():
    assert arguments.dtype_signature(FakeTorchDtype("bfloat16")) == "bf16"
    assert arguments.dtype_signature(FakeTorchDtype("float8_e4m3fn")) == "fp8e4m3"
    assert arguments.dtype_signature(FakeTorchDtype("float8_e5m2")) == "fp8e5m2"
    assert arguments.dtype_signature(np.dtype(np.float32)) == "fp32"
    assert arguments.dtype_signature("<i4") == "i32"
    assert arguments.dtype_signature("|b1") == "i1"
    with pytest.raises(ArgumentTypeError, match="weft has no element type for dtype "
                                                 "dtype\\('complex64'\\)"):
        arguments.dtype_signature(np.dtype(np.complex64))


def test_specialization_of_ints_and_pointers():
    base = np.zeros(64, np.float32)
    assert base.ctypes.data % 16 == 0
    args = (1, 32, 0, 17, -16, 1.0, True, base, base[1:])
    assert arguments.specialization_of(args) == (
        "equal_to_1", "divisible_by_16", "divisible_by_16", "", "divisible_by_16", "", "",
        "divisible_by_16", "")


def test_cuda_array_interface_and_dlpack_device():
    keys, values = arguments.read_all([FakeCudaArray(0x7000_0000_0010),
                                       FakeCupyArray(0x7000_0000_0004, device=1, typestr="<f2")])
    assert [(k[1], k[2], k[3]) for k in keys] == [
        ("*fp32", arguments.SPEC_DIVISIBLE_BY_16, arguments.UNKNOWN_DEVICE),
        ("*fp16", 0, 1)]
    assert values == [0x7000_0000_0010, 0x7000_0000_0004]


@pytest.mark.parametrize("versioned", [False, True])
def test_dlpack_capsule_parsing(versioned):
    array = np.arange(10, dtype=np.int32)[2:]
    key, value = arguments.read(DLPackOnly(array, versioned=versioned))
    assert value == array.ctypes.data
    assert key[1:] == ("*i32", 0, 0)  # address 8 bytes past an aligned start


def test_dlpack_host_device_reads_as_host():
    key, _ = arguments.read(DLPackOnly(np.zeros(4, np.float64), device=(1, 0)))
    assert key[1:] == ("*fp64", arguments.SPEC_DIVISIBLE_BY_16, arguments.HOST)


def test_unsupported_types_name_the_alternatives():
    with pytest.raises(ArgumentTypeError, match=r"cannot pass builtins.list to a kernel; "
                                                 r"pass a torch tensor, an object with "):
        arguments.read([1, 2])
    with pytest.raises(ArgumentTypeError, match=r"__cuda_array_interface__ typestr '<c8' "
                                                 r"has no weft element type"):
        arguments.read(FakeCudaArray(0, typestr="<c8"))
    with pytest.raises(ArgumentTypeError, match="integer 18446744073709551616 does not "
                                                 "fit in 64 bits"):
        arguments.read(2**64)


NAMES = ("x", "y", "out", "n")
TYPES = ("*fp32", "*fp32", "*fp32", "i32")


def _keys(*args):
    return arguments.read_all(args)[0]


def test_wrong_argument_count():
    with pytest.raises(LaunchError) as info:
        arguments.check_count("vadd", NAMES, (1, 2))
    assert str(info.value) == "kernel 'vadd' takes 4 arguments (x, y, out, n), got 2"


def test_dtype_mismatch_message():
    keys = _keys(FakeCupyArray(16), FakeCupyArray(32, typestr="<f2"), FakeCupyArray(64), 10)
    with pytest.raises(ArgumentTypeError) as info:
        arguments.check_keys("vadd", NAMES, TYPES, keys)
    assert str(info.value) == (
        f"argument 'y' of kernel 'vadd' was compiled for *fp32 but got a "
        f"{FakeCupyArray.__module__}.FakeCupyArray of dtype fp16 (*fp16) in cuda:0; pass a "
        f"fp32 array or compile the kernel for *fp16")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_scalar_where_a_pointer_is_needed_and_back():
    with pytest.raises(ArgumentTypeError) as info:
        arguments.check_keys("vadd", NAMES, TYPES, _keys(3, 4, 5, 6))
    assert str(info.value) == ("argument 'x' of kernel 'vadd' must be a *fp32 array, got "
                               "a Python int (i32)")
    keys = _keys(FakeCupyArray(16), FakeCupyArray(16), FakeCupyArray(16), 2.5)
    with pytest.raises(ArgumentTypeError) as info:
        arguments.check_keys("vadd", NAMES, TYPES, keys)
    assert str(info.value) == ("argument 'n' of kernel 'vadd' was compiled for i32 but got "
                               "a Python float (fp32)")


def test_host_array_where_device_memory_is_needed():
    keys = _keys(np.zeros(4, np.float32), FakeCupyArray(16), FakeCupyArray(16), 4)
    with pytest.raises(LaunchError) as info:
        arguments.check_keys("vadd", NAMES, TYPES, keys)
    assert str(info.value) == (
        "argument 'x' of kernel 'vadd' is a numpy.ndarray of dtype fp32 (*fp32) in host "
        "memory, but a GPU launch needs device memory; move it to the GPU (e.g. "
        "tensor.cuda()) or pass only host arrays to run on the CPU emulator")


def test_arrays_on_two_devices():
    keys = _keys(FakeCupyArray(16, device=0), FakeCupyArray(16, device=1),
                 FakeCupyArray(16), 4)
    with pytest.raises(LaunchError) as info:
        arguments.check_keys("vadd", NAMES, TYPES, keys)
    assert str(info.value) == ("argument 'y' of kernel 'vadd' is on cuda:1 but 'x' is on "
                               "cuda:0; all arrays of one launch must be on one device")


def test_check_keys_returns_the_device():
    keys = _keys(FakeCudaArray(16), FakeCupyArray(16, device=2), FakeCupyArray(16, device=2),
                 True)
    assert arguments.check_keys("vadd", NAMES, TYPES, keys) == 2
    assert arguments.check_keys("vadd", NAMES, TYPES, _keys(*[FakeCudaArray(16)] * 3, 1)) \
        == arguments.UNKNOWN_DEVICE


@pytest.mark.parametrize("grid, message", [
    ((0,), "grid (0, 1, 1) of kernel 'vadd' has a zero dimension; every grid dimension must "
           "be at least 1 (skip the launch for empty inputs)"),
    ((4, 0), "grid (4, 0, 1) of kernel 'vadd' has a zero dimension; every grid dimension "
             "must be at least 1 (skip the launch for empty inputs)"),
    ((-1, 2), "grid (-1, 2, 1) of kernel 'vadd' has a negative dimension"),
    ((1, 2, 3, 4), "grid of kernel 'vadd' must have 1 to 3 dimensions, got 4: (1, 2, 3, 4)"),
    ((1, 70000), "grid (1, 70000, 1) of kernel 'vadd' exceeds the limit of 65535 blocks "
                 "along axis 1"),
    ("big", "grid of kernel 'vadd' must be 1 to 3 ints, got 'big'"),
])
def test_grid_errors(grid, message):
    with pytest.raises(LaunchError) as info:
        arguments.check_grid("vadd", grid)
    assert str(info.value) == message


def test_grid_normalisation():
    assert arguments.check_grid("k", 7) == (7, 1, 1)
    assert arguments.check_grid("k", [2, 3]) == (2, 3, 1)
    assert arguments.check_grid("k", (np.int64(2), 3, 4)) == (2, 3, 4)


def test_pack_values_types_and_ranges():
    types = ("*fp32", "i32", "i64", "fp32", "fp64", "fp16", "bf16", "u8", "i1")
    holders = arguments.pack_values(types, (0x1234_5678_9ABC, -5, 2**40, 1.5, 0.1, 1.0, -2.0,
                                            255, True))
    assert [type(h) for h in holders] == [
        ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_double,
        ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32]
    assert [h.value for h in holders] == [0x1234_5678_9ABC, -5, 2**40, 1.5, 0.1, 0x3C00,
                                          0xC000, 255, 1]
    with pytest.raises(ArgumentTypeError) as info:
        arguments.pack_values(("i32",), (2**31,), kernel="k", names=("n",))
    assert str(info.value) == ("argument 'n' of kernel 'k' is i32, but 2147483648 is outside "
                               "[-2147483648, 2147483647]")
    with pytest.raises(ArgumentTypeError, match="parameter type 'fp8e4m3' cannot be passed "
                                                "by value"):
        arguments.pack_values(("fp8e4m3",), (1.0,))


def test_fp16_and_bf16_bit_patterns():
    for x in (0.0, -0.0, 1.0, 0.1, 65504.0, 1e-7, -3.25):
        assert arguments.fp16_bits(x) == int(np.float16(x).view(np.uint16))
    assert arguments.fp16_bits(1e6) == 0x7C00
    assert arguments.bf16_bits(1.0) == 0x3F80
    assert arguments.bf16_bits(1.0 + 2**-8) == 0x3F80  # a tie rounds to even
    assert arguments.bf16_bits(1.0 + 3 * 2**-8) == 0x3F82
    assert arguments.bf16_bits(float("inf")) == 0x7F80
    assert arguments.bf16_bits(float("nan")) & 0x7FC0 == 0x7FC0
    assert arguments.bf16_bits(1e39) == 0x7F80


def test_torch_tensors_if_torch_is_installed():
    torch = pytest.importorskip("torch")
    t = torch.zeros(8, dtype=torch.bfloat16)
    key, value = arguments.read(t)
    assert key[1:] == ("*bf16", arguments.SPEC_DIVISIBLE_BY_16, arguments.HOST)
    assert value == t.data_ptr()
