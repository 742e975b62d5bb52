"""TensorDescriptor: fields, every validation error, the encoder's driver call (with a fake
driver), argument reading/checking/packing, and JIT specialisation on the descriptor type."""

from __future__ import annotations

import ctypes
import struct
import types

import numpy as np
import pytest

from weft.runtime import tensor_descriptor

from weft.compiler.types import ScalarType, TensorDescriptorType, fp16
from weft.lowlevel import NVMMASharedLayout, SwizzledSharedLayout
from weft.runtime import TensorDescriptor, TensorDescriptorError, arguments, driver
from weft.runtime.arguments import HOST, ArgumentTypeError, LaunchError
from weft.runtime.jit import JITFunction


def aligned(shape, dtype=np.float16, offset=0):
    """A C-contiguous array whose data starts `offset` bytes past a 128-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 128 + offset
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class FakeCudaTensor:
    """__cuda_array_interface__ (+ __dlpack_device__) at a made-up device address."""

    def __init__(self, shape, typestr="<f2", address=0x7F00_0000_0000, strides=None, device=0):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": tuple(shape),
                                         "typestr": typestr, "strides": strides, "version": 3}
        self.device = device

    def __dlpack_device__(self):
        return (2, self.device)


@pytest.fixture
def fake_driver(monkeypatch):
    """driver.cuda() with real enums but a recording cuTensorMapEncodeTiled."""
    real = pytest.importorskip("cuda.bindings.driver")
    calls = []
    tensor_descriptor._encoded.cache_clear()  # encodings are cached by value across calls

    def encode(*args):
        calls.append(args)
        tensor_map = types.SimpleNamespace(opaque=[real.cuuint64_t(0x0101 * (i + 1)) for i in range(16)])
        return (0, tensor_map)

    fake = types.SimpleNamespace(**{name: getattr(real, name) for name in dir(real)
                                    if name.startswith(("CU", "cuuint"))},
                                 cuTensorMapEncodeTiled=encode,
                                 cuCtxGetCurrent=lambda: (0, 1))  # a context is current
    monkeypatch.setattr(driver, "cuda", lambda: fake)
    monkeypatch.setattr(driver, "init", lambda: None)
    return types.SimpleNamespace(calls=calls, driver=real)


# ----------------------------------------------------------------------------- fields

def test_host_descriptor_fields():
    a = aligned((256, 128))
    desc = TensorDescriptor.from_tensor(a, [64, 64])
    assert desc.base is a
    assert desc.shape == (256, 128) and desc.strides == (128, 1)
    assert desc.block_shape == (64, 64)
    assert desc.layout == NVMMASharedLayout(128, 16, rank=2)
    assert desc.dtype == fp16 and desc.swizzle == 128
    assert isinstance(desc.type, TensorDescriptorType)
    assert desc.type == TensorDescriptorType(fp16, (64, 64), desc.layout.to_linear([64, 64]))
    assert desc.type.encoding == desc.layout
    assert desc.signature == "tensordesc<fp16[64,64],swizzle=128>"
    assert desc.device == HOST and desc.tensor_map is None
    with pytest.raises(AttributeError, match="read-only"):
        desc.shape = (1, 1)


def test_explicit_layout_view_and_default_swizzles():
    a = aligned((64, 256), np.float32)
    layout = NVMMASharedLayout(64, 32)
    desc = TensorDescriptor(a, shape=[50, 200], strides=[256, 1], block_shape=[8, 16], layout=layout)
    assert desc.shape == (50, 200) and desc.layout is layout and desc.swizzle == 64
    assert desc.signature == "tensordesc<fp32[8,16],swizzle=64>"
    assert TensorDescriptor.from_tensor(a, [8, 32]).swizzle == 128
    assert TensorDescriptor.from_tensor(a, [4, 4]).swizzle == 0  # 16-byte rows, unswizzled
    three = TensorDescriptor.from_tensor(aligned((4, 16, 64)), [2, 8, 64])
    assert three.layout == NVMMASharedLayout(128, 16, rank=3)


def test_rank_1_box_is_contiguous_and_takes_no_layout():
    desc = TensorDescriptor.from_tensor(aligned((1000,), np.int32), [64])
    assert desc.layout is None and desc.swizzle == 0
    assert desc.signature == "tensordesc<i32[64],swizzle=0>"
    assert desc.type.layout.bases["offset"] == tuple((1 << b,) for b in range(6))


def test_integer_and_8_bit_elements():
    assert TensorDescriptor.from_tensor(aligned((64, 128), np.uint8), [8, 128]).dtype == ScalarType("u8")
    assert TensorDescriptor.from_tensor(aligned((64, 32), np.int32), [8, 32]).swizzle == 128


def test_fp8_dtypes_are_recognised():
    class FakeTorchDtype:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return f"torch.{self.name}"

    assert arguments.dtype_signature(FakeTorchDtype("float8_e4m3fn")) == "fp8e4m3"
    assert arguments.dtype_signature(FakeTorchDtype("float8_e5m2")) == "fp8e5m2"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    desc = TensorDescriptor.from_tensor(aligned((64, 128), ml_dtypes.float8_e4m3fn), [8, 128])
    assert desc.signature == "tensordesc<fp8e4m3[8,128],swizzle=128>"


# ----------------------------------------------------------------------------- errors

def _transposed():
    return aligned((128, 64)).T


@pytest.mark.parametrize("make, block, layout, error, message", [
    (lambda: aligned((8,) * 6), [8] * 6, None, TensorDescriptorError, "1 to 5 dims, got 6"),
    (lambda: aligned((64, 64)), [], None, TensorDescriptorError, "1 to 5 dims, got 0"),
    (lambda: aligned((64, 64), offset=8), [8, 64], None, TensorDescriptorError,
     r"base address 0x[0-9a-f]+ is not 16-byte aligned"),
    (lambda: aligned((64, 66))[:, :64], [8, 64], None, TensorDescriptorError,
     "stride of dim 0 is 66 elements = 132 bytes; TMA needs every stride but the innermost "
     "to be a non-negative multiple of 16 bytes"),
    (_transposed, [8, 8], None, TensorDescriptorError,
     r"the innermost stride is 64 elements; TMA needs the last dim contiguous"),
    (lambda: aligned((512, 64)), [512, 64], None, TensorDescriptorError,
     r"block_shape\[0\] = 512 must be an int from 1 to 256"),
    (lambda: aligned((64, 64)), [0, 64], None, TensorDescriptorError,
     r"block_shape\[0\] = 0 must be an int from 1 to 256"),
    (lambda: aligned((96, 64)), [24, 64], None, TensorDescriptorError,
     r"block_shape\[0\] = 24 must be a power of two"),
    (lambda: aligned((64, 64)), [8, 2.0], None, TensorDescriptorError, "block_shape must be a list of ints"),
    (lambda: aligned((64,)), [4], None, TensorDescriptorError,
     "the inner box dim holds 8 bytes; TMA needs a multiple of 16 bytes"),
    (lambda: aligned((64, 128)), [64, 16], NVMMASharedLayout(128, 16), TensorDescriptorError,
     r"the inner box dim holds 32 bytes, but with swizzle 128 a box row .* is 128 bytes; "
     r"use block_shape\[-1\] = 64"),
    (lambda: aligned((64, 64)), [64, 32], NVMMASharedLayout(128, 16), TensorDescriptorError,
     "holds 64 bytes, but with swizzle 128 .* or swizzle 64"),
    (lambda: aligned((64, 64)), [4, 64], NVMMASharedLayout(128, 16), TensorDescriptorError,
     "shape \\[4, 64\\] has 4 rows; the 128B swizzle pattern spans 8 rows"),
    (lambda: aligned((64, 64)), [64, 64], NVMMASharedLayout(128, 32), TensorDescriptorError,
     "is for 32-bit elements but the tensor holds fp16 .*; use element_bitwidth=16"),
    (lambda: aligned((64, 64)), [64, 64], NVMMASharedLayout(128, 16, transposed=True),
     TensorDescriptorError, "is transposed, but TMA always stores the tensor's innermost dim"),
    (lambda: aligned((64, 64)), [64, 64], SwizzledSharedLayout(8, 1, 8, [1, 0]), ArgumentTypeError,
     "layout must be an NVMMASharedLayout"),
    (lambda: aligned((8, 8, 64)), [4, 2, 64], NVMMASharedLayout(128, 16, rank=2),
     TensorDescriptorError, r"does not place a \[4, 2, 64\] box where TMA writes it .* use rank=3"),
    (lambda: aligned((64,)), [64], NVMMASharedLayout(0, 16), TensorDescriptorError,
     "a rank-1 box .* takes layout=None"),
    (lambda: aligned((64, 64)), [64], None, TensorDescriptorError,
     r"block_shape \[64\] has 1 dims but the tensor has shape \[64, 64\]"),
    (lambda: aligned((0, 64)), [8, 64], None, TensorDescriptorError,
     r"shape\[0\] = 0 must be from 1 to 2\*\*32"),
    (lambda: aligned((64, 64), np.bool_), [8, 64], None, TensorDescriptorError,
     "TMA cannot move i1"),
    (lambda: aligned((64, 64), np.complex64), [8, 64], None, ArgumentTypeError,
     "weft has no element type for dtype"),
    (lambda: [[1.0] * 64] * 64, [8, 64], None, ArgumentTypeError,
     "TensorDescriptor needs a torch tensor, an object with __cuda_array_interface__"),
])
def test_validation_errors(make, block, layout, error, message):
    with pytest.raises(error, match=message):
        TensorDescriptor.from_tensor(make(), block, layout)


def test_misaligned_element_strides_are_refused():
    fake = FakeCudaTensor((8, 64), strides=(130, 3))
    with pytest.raises(TensorDescriptorError, match="stride 3 bytes of dim 1 is not a whole number"):
        TensorDescriptor.from_tensor(fake, [8, 64])


# ----------------------------------------------------------------------------- encoding

def test_a_thread_without_a_context_gets_the_tensors_devices_context(fake_driver, monkeypatch):
    """torch's autograd threads have no current driver context; encoding there failed with
    CUDA_ERROR_INVALID_CONTEXT. The primary context of the device holding the tensor (asked
    of the driver by address) is made current first; a thread with a context keeps it."""
    fake, d = driver.cuda(), fake_driver.driver
    asked, made_current = [], []
    fake.cuCtxGetCurrent = lambda: (0, 0)
    fake.cuPointerGetAttribute = lambda attribute, address: asked.append((attribute, address)) or (0, 3)
    monkeypatch.setattr(driver, "set_current", made_current.append)
    TensorDescriptor.from_tensor(FakeCudaTensor((64, 64), strides=(128, 2), device=3), [64, 64])
    assert asked == [(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 0x7F00_0000_0000)]
    assert made_current == [3] and len(fake_driver.calls) == 1
    fake.cuCtxGetCurrent = lambda: (0, 1)
    TensorDescriptor.from_tensor(FakeCudaTensor((64, 32), strides=(64, 2), device=3), [64, 32])
    assert made_current == [3] and len(fake_driver.calls) == 2


def test_encoder_call_reverses_dims_and_packs_128_bytes(fake_driver):
    d = fake_driver.driver
    fake = FakeCudaTensor((300, 70, 64), strides=(70 * 64 * 2 * 2, 64 * 2, 2), device=1)
    desc = TensorDescriptor.from_tensor(fake, [1, 16, 64])
    assert desc.device == 1 and desc.strides == (70 * 64 * 2, 64, 1)
    (call,) = fake_driver.calls
    (data_type, rank, address, dims, strides, box, element_strides, interleave, swizzle,
     promotion, fill) = call
    assert data_type == d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    assert rank == 3 and address == 0x7F00_0000_0000
    assert [int(x) for x in dims] == [64, 70, 300]
    assert [int(x) for x in strides] == [128, 70 * 64 * 2 * 2]
    assert [int(x) for x in box] == [64, 16, 1]
    assert [int(x) for x in element_strides] == [1, 1, 1]
    assert interleave == d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert swizzle == d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert promotion == d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B
    assert fill == d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    assert desc.tensor_map == struct.pack("<16Q", *(0x0101 * (i + 1) for i in range(16)))


@pytest.mark.parametrize("typestr, block, name, swizzle", [
    ("<f4", [8, 32], "FLOAT32", "128B"), ("<i4", [8, 8], "INT32", "32B"),
    ("|u1", [8, 64], "UINT8", "64B"), ("<f2", [16, 8], "FLOAT16", "NONE"),
])
def test_encoder_data_types_and_swizzles(fake_driver, typestr, block, name, swizzle):
    d = fake_driver.driver
    TensorDescriptor.from_tensor(FakeCudaTensor((64, 64), typestr=typestr), block)
    call = fake_driver.calls[-1]
    assert call[0] == getattr(d.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{name}")
    assert call[8] == getattr(d.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}")


def test_encoder_errors_name_the_call(monkeypatch, fake_driver):
    fake = driver.cuda()
    monkeypatch.setattr(fake, "cuTensorMapEncodeTiled", lambda *args: (1, None))
    monkeypatch.setattr(driver, "_error_text", lambda err: ("CUDA_ERROR_INVALID_VALUE", "invalid argument"))
    with pytest.raises(driver.DriverError, match=r"cuTensorMapEncodeTiled\(fp16, shape=\[64, 64\]"):
        TensorDescriptor.from_tensor(FakeCudaTensor((64, 64)), [8, 64])


# ----------------------------------------------------------------------------- arguments

def test_read_check_and_pack_a_device_descriptor(fake_driver):
    desc = TensorDescriptor.from_tensor(FakeCudaTensor((64, 64), device=0), [64, 64])
    key, value = arguments.read(desc)
    assert key == (TensorDescriptor, "tensordesc<fp16[64,64],swizzle=128>", 0, 0)
    assert value == desc.tensor_map and len(value) == 128
    sig = desc.signature
    assert arguments.check_keys("k", ["a"], [sig], [key]) == 0
    assert not arguments.on_torch_stream(key)
    (holder,) = arguments.pack_values([sig], [value])
    assert holder.raw == value and ctypes.addressof(holder) % 64 == 0 and ctypes.sizeof(holder) == 128


def test_check_keys_messages(fake_driver):
    desc = TensorDescriptor.from_tensor(FakeCudaTensor((64, 64)), [64, 64])
    key = arguments.read(desc)[0]
    other = "tensordesc<fp16[32,64],swizzle=128>"
    with pytest.raises(ArgumentTypeError, match=(
            r"argument 'a' of kernel 'k' was compiled for tensordesc<fp16\[32,64\],swizzle=128> but "
            r"got a .*TensorDescriptor tensordesc<fp16\[64,64\],swizzle=128> over cuda:0; pass a "
            r"TensorDescriptor of that type or compile the kernel for tensordesc<fp16\[64,64\]")):
        arguments.check_keys("k", ["a"], [other], [key])
    with pytest.raises(ArgumentTypeError, match=r"'a' of kernel 'k' must be a \*fp16 array, got .*TensorDescriptor"):
        arguments.check_keys("k", ["a"], ["*fp16"], [key])
    pointer = arguments.read(FakeCudaTensor((4,)))[0]
    with pytest.raises(ArgumentTypeError, match=r"must be a TensorDescriptor \(tensordesc<fp16\[64,64\]"):
        arguments.check_keys("k", ["a"], [desc.signature], [pointer])
    with pytest.raises(ArgumentTypeError, match="must be a TensorDescriptor"):
        arguments.check_keys("k", ["a"], [desc.signature], [arguments.read(3)[0]])
    host = arguments.read(TensorDescriptor.from_tensor(aligned((64, 64)), [64, 64]))[0]
    with pytest.raises(LaunchError, match="over host memory, but a GPU launch needs device memory"):
        arguments.check_keys("k", ["a"], [desc.signature], [host])


# ----------------------------------------------------------------------------- jit

def _recording_jit():
    compiled = []

    def kernel(a_desc, n):
        pass

    def compile_fn(jit, signature, constexprs, specialization, options):
        compiled.append((signature, options["target"]))
        return ("ir", signature)

    emulated = []
    fn = JITFunction(kernel, compile_fn, lambda k, grid, args: emulated.append((k, args)))
    return fn, compiled, emulated


def test_jit_specialises_on_the_descriptor_type(monkeypatch):
    monkeypatch.delenv("WEFT_EMULATE", raising=False)
    fn, compiled, emulated = _recording_jit()
    a = aligned((256, 128))
    small, large = (TensorDescriptor.from_tensor(a, block) for block in ([32, 64], [64, 64]))
    fn[(1,)](small, 5)
    fn[(1,)](TensorDescriptor.from_tensor(aligned((64, 64)), [32, 64]), 7)  # same type: no compile
    fn[(1,)](large, 5)
    assert compiled == [({"a_desc": "tensordesc<fp16[32,64],swizzle=128>", "n": "i32"}, "emulator"),
                        ({"a_desc": "tensordesc<fp16[64,64],swizzle=128>", "n": "i32"}, "emulator")]
    assert emulated[0][1][0] is small  # the emulator gets the descriptor itself


def test_compile_canonicalises_descriptor_signatures(cache_dir):
    fn, compiled, _ = _recording_jit()
    fn.compile(signature={"a_desc": " tensordesc< bf16[128, 64] >", "n": "i32"})
    fn.compile(signature={"a_desc": "tensordesc<bf16[128,64],swizzle=128>", "n": "i32"})
    assert compiled == [({"a_desc": "tensordesc<bf16[128,64],swizzle=128>", "n": "i32"}, "sm_90a")]
    with pytest.raises(LaunchError, match=r"signature of 'a_desc': TMA box \[128, 16\] of bf16: "
                                          "the inner box dim holds 32 bytes"):
        fn.compile(signature={"a_desc": "tensordesc<bf16[128,16],swizzle=128>", "n": "i32"})


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name, block", [("bfloat16", [64, 64]), ("float8_e4m3fn", [16, 128]),
                                               ("float8_e5m2", [16, 128]), ("float32", [8, 32])])
def test_encode_torch_tensor(dtype_name, block):
    torch = pytest.importorskip("torch")
    t = torch.zeros((256, 256), device="cuda").to(getattr(torch, dtype_name))
    desc = TensorDescriptor.from_tensor(t, block)
    assert desc.device == t.get_device() and desc.dtype.bits == t.element_size() * 8
    assert isinstance(desc.tensor_map, bytes) and len(desc.tensor_map) == 128
    assert any(desc.tensor_map)
    key, value = arguments.read(desc)
    assert key[2] == arguments.TORCH_MEMORY and arguments.on_torch_stream(key) and value == desc.tensor_map


@pytest.mark.gpu
def test_encode_rejects_what_the_driver_rejects_before_calling_it():
    torch = pytest.importorskip("torch")
    t = torch.zeros((64, 64), device="cuda", dtype=torch.float16)
    with pytest.raises(TensorDescriptorError, match="not 16-byte aligned"):
        TensorDescriptor(t[:, 1:], [64, 63], [64, 1], [8, 8])  # the view starts 2 bytes in
