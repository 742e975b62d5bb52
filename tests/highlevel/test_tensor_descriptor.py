"""Tensor descriptors in highlevel kernels, as Triton writes them: host `TensorDescriptor`
arguments (weft.highlevel.tools.tensor_descriptor, no layout), `desc.load` / `desc.store`
moved by TMA, on the CPU emulator (race checks on) against numpy float64 on random inputs:
copies whose boxes leave the tensor (zero fill, clipped stores), matmuls with tails in
fp16 / bf16 / fp8, the dot reading the TMA box itself, and errors at the user's line."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import SharedLoad, SharedStore, TmaAsyncCopyGlobalToShared, WarpgroupMma
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.tensor_descriptor import TensorDescriptorError

from ._compile import ptx_through_ptxas

torch = pytest.importorskip("torch")  # bf16 and fp8 host arrays

RNG = np.random.default_rng(4040)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8e4m3": torch.float8_e4m3fn,
               "fp8e5m2": torch.float8_e5m2}


@tl.jit
def scale_copy(in_desc, out_desc, BM: tl.constexpr, BN: tl.constexpr):
    m = tl.program_id(0) * BM
    n = tl.program_id(1) * BN
    out_desc.store([m, n], in_desc.load([m, n]) * 2 + 1)


@tl.jit
def descriptor_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """The tutorial's descriptor matmul: C = A @ B, C stored in A's element type."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def padded(rows: int, cols: int, dtype: str, multiple: int = 16):
    """A random [rows, cols] torch view whose rows are padded to `multiple` elements (TMA
    strides are multiples of 16 bytes)."""
    width = -(-cols // multiple) * multiple
    full = torch.tensor(RNG.standard_normal((rows, width)), dtype=torch.float32).to(TORCH_TYPES[dtype])
    return full[:, :cols]


def check_product(out, a, b):
    a64, b64 = a.double().numpy(), b.double().numpy()
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    rounding = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}.get(out.dtype, 2 ** -3)
    error = np.abs(out.double().numpy() - reference)
    assert (error <= 1e-5 * scale + rounding * np.abs(reference) + 1e-6).all(), f"largest error {error.max()}"


def test_boxes_past_the_edges_load_zeros_and_store_nothing():
    x = padded(40, 72, "fp16")
    canvas = torch.full((48, 144), 7.0, dtype=torch.float16)
    out = canvas[:40, :72]
    scale_copy[(3, 2)](TensorDescriptor.from_tensor(x, [16, 64]), TensorDescriptor.from_tensor(out, [16, 64]),
                       BM=16, BN=64)
    np.testing.assert_array_equal(out.numpy(), (x.double() * 2 + 1).half().numpy())
    outside = canvas.numpy().copy()
    outside[:40, :72] = 7
    assert (outside == 7).all()  # the boxes past row 40 and column 72 were clipped


@pytest.mark.parametrize("dtype, m, n, k, block, num_warps", [
    ("fp16", 100, 72, 80, (64, 64, 32), 4),      # tails in every dim
    ("bf16", 130, 200, 48, (128, 128, 32), 8),
    ("fp16", 64, 64, 16, (64, 64, 64), 4),       # one K box, mostly past the end
    ("fp8e4m3", 70, 48, 96, (64, 32, 64), 4),    # fp8's B is read K-major: through registers
])
def test_descriptor_matmul_matches_numpy(dtype, m, n, k, block, num_warps):
    bm, bn, bk = block
    a, b = padded(m, k, dtype), padded(k, n, dtype)
    c = torch.zeros((m, -(-n // 16) * 16), dtype=torch.float16 if dtype.startswith("fp8") else TORCH_TYPES[dtype])
    c = c[:, :n]
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn])  # fp8 products are stored in fp16
    descriptor_matmul[(-(-m // bm), -(-n // bn))](
        TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]), c_desc, k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=num_warps)
    check_product(c, a, b)


def _layout_kernel(kernel, signature: dict, constexprs: dict, num_warps: int = 4):
    built = build_kernel(kernel, signature, constexprs, num_warps, {}, language="highlevel")
    return pipeline.prepare_for_emulator(built)


def test_a_dot_reads_16_bit_boxes_where_tma_wrote_them():
    kernel = _layout_kernel(descriptor_matmul, {
        "a_desc": "tensordesc<fp16[64,32]>", "b_desc": "tensordesc<fp16[32,64]>",
        "c_desc": "tensordesc<fp16[64,64]>", "K": "i32"}, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32})
    ops = list(kernel.walk())
    copies = [op.buffer for op in ops if isinstance(op, TmaAsyncCopyGlobalToShared)]
    (mma,) = [op for op in ops if isinstance(op, WarpgroupMma)]
    assert (mma.a, mma.b) == tuple(copies)
    assert not any(isinstance(op, SharedLoad) for op in ops)
    assert [op for op in ops if isinstance(op, SharedStore)] and \
        all(op.buffer not in copies for op in ops if isinstance(op, SharedStore))  # only the epilogue's


def test_the_descriptor_reports_triton_fields_in_the_kernel():
    @tl.jit
    def fields(desc, out_ptr):
        tl.store(out_ptr + 0, desc.shape[0])
        tl.store(out_ptr + 1, desc.shape[1])
        tl.store(out_ptr + 2, desc.strides[0].to(tl.int32))
        tl.store(out_ptr + 3, desc.block_shape[0] * 1000 + desc.block_shape[1])
        tl.static_assert(desc.dtype == tl.float16)

    x = padded(37, 50, "fp16")
    out = np.zeros(4, np.int32)
    fields[(1,)](TensorDescriptor.from_tensor(x, [8, 32]), out)
    assert out.tolist() == [37, 50, 64, 8032]


def test_bad_boxes_are_refused_where_the_descriptor_is_built_or_launched():
    x = torch.zeros((64, 64), dtype=torch.float16)
    with pytest.raises(TensorDescriptorError, match="TMA box limit"):
        TensorDescriptor.from_tensor(x, [512, 64])
    with pytest.raises(TensorDescriptorError, match="padding"):
        TensorDescriptor.from_tensor(x, [64, 64], padding="nan")
    with pytest.raises(TensorDescriptorError, match="16-byte aligned"):
        TensorDescriptor(x[:, 1:], [64, 63], [64, 1], [8, 8])  # a base TMA cannot address
    narrow = TensorDescriptor.from_tensor(x, [64, 4])  # a placeholder box is fine until the launch
    with pytest.raises(TensorDescriptorError, match="16 bytes|swizzle row|inner"):
        scale_copy[(1, 1)](narrow, narrow, BM=64, BN=4)


def test_an_autotune_hook_may_set_the_block_shape_before_the_launch():
    x = padded(32, 64, "fp16")
    out = torch.zeros((32, 64), dtype=torch.float16)
    in_desc, out_desc = TensorDescriptor.from_tensor(x, [8, 32]), TensorDescriptor.from_tensor(out, [8, 32])
    in_desc.block_shape = out_desc.block_shape = [16, 64]  # as tutorial 09's pre-hook does
    scale_copy[(2, 1)](in_desc, out_desc, BM=16, BN=64)
    np.testing.assert_array_equal(out.numpy(), (x.double() * 2 + 1).half().numpy())


def test_store_of_another_type_says_to_convert():
    @tl.jit
    def wrong_type(desc):
        desc.store([0, 0], tl.zeros([16, 64], tl.float32))

    with pytest.raises(CompilationError, match=r"value.to\(tl.fp16\)") as error:
        _layout_kernel(wrong_type, {"desc": "tensordesc<fp16[16,64]>"}, {})
    assert "desc.store" in str(error.value) and error.value.loc.line > 0


@pytest.mark.parametrize("kernel, signature, constexprs", [
    (scale_copy, {"in_desc": "tensordesc<fp16[16,64]>", "out_desc": "tensordesc<fp16[16,64]>"}, dict(BM=16, BN=64)),
    (descriptor_matmul, {"a_desc": "tensordesc<bf16[128,64]>", "b_desc": "tensordesc<bf16[64,128]>",
                         "c_desc": "tensordesc<bf16[128,128]>", "K": "i32"},
     dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)),
])
def test_descriptor_kernels_compile_to_tma_without_spills(kernel, signature, constexprs):
    ptx = ptx_through_ptxas(kernel, signature, constexprs, num_warps=4)
    assert "cp.async.bulk.tensor" in ptx and "mbarrier.try_wait.parity" in ptx
