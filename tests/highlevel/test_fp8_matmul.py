"""fp8 tl.dot (float8e4nv = e4m3, float8e5 = e5m2; fp32 accumulation) in the tutorial-style
matmuls: the descriptor source with B stored [N, K] and read `b_desc.load([n, k]).T` (the
form wgmma's fp8 reads, K-major; warp-specialized by default) and the pointer source
(highlevel/examples.py) with B the [K, N] view of an [N, K] array (Triton's fp8 tutorial
passes b.T). Run on the CPU emulator against numpy float64 of the same fp8 values (rounded
by the emulator's own fp8 conversion, RNE as the hardware's cvt), with tails in M, N and
K; through ptxas, each is a wgmma of fp8 operands (no upcast to 16 bits) without spills.
On a GPU, against float32 torch. (A B box stored [K, N] is test_fp8_kn.py's.)"""

import re
import warnings

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import WarpSpecialize
from weft.compiler.passes import pipeline_tma_warp_specialize
from weft.highlevel import examples
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator.dtypes import from_fp8, to_fp8

torch = pytest.importorskip("torch")  # fp8 host arrays

RNG = np.random.default_rng(4044)
FP8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}


@tl.jit
def fp8_descriptor_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """C = A @ B with B stored [N, K]; WARP_SPECIALIZE None: the compiler's choice."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([n, k]).T, acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def fp8_array(rows: int, cols: int, dtype: str, pad: int = 16):
    """Random fp8 [rows, cols] (rows padded to `pad` bytes, TMA strides) and its float64 values."""
    width = -(-max(cols, 1) // pad) * pad
    bits = to_fp8(RNG.standard_normal((rows, width)), dtype)
    values = from_fp8(bits, dtype).astype(np.float64)[:, :cols]
    return torch.from_numpy(bits).view(FP8[dtype])[:, :cols], values


def check_product(out, a64, b64):
    """fp16 `out` against numpy's float64 product: the emulator sums exactly; only the
    fp16 rounding of the result (and fp32 accumulation) is allowed."""
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    error = np.abs(out.double().numpy() - reference)
    assert (error <= 1e-5 * scale + 2 ** -10 * np.abs(reference) + 1e-6).all(), f"largest error {error.max()}"


def descriptor_signature(dtype: str, block, b_box) -> dict:
    bm, bn, bk = block
    return {"a_desc": f"tensordesc<{dtype}[{bm},{bk}]>", "b_desc": f"tensordesc<{dtype}[{b_box[0]},{b_box[1]}]>",
            "c_desc": f"tensordesc<fp16[{bm},{bn}]>", "K": "i32"}


def descriptor_constexprs(block, stages: int, warp_specialize) -> dict:
    return dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages, WARP_SPECIALIZE=warp_specialize)


@pytest.mark.parametrize("dtype, warp_specialize, num_warps", [("fp8e4m3", None, 4), ("fp8e5m2", None, 8),
                                                                ("fp8e4m3", False, 8)])
def test_descriptor_source_matches_numpy(monkeypatch, dtype, warp_specialize, num_warps):
    # Split by default at these small tiles too (the default takes only rings too large for
    # two CTAs per SM; the emulator runs small tiles quickly).
    monkeypatch.setattr(pipeline_tma_warp_specialize, "DEFAULT_SPLIT_RING_BYTES", 0)
    block = (64 * num_warps // 4, 64, 64)
    m, n, k = 150, 100, 200  # tails in M, N and K (TMA fills the K tail with zeros)
    (a, a64), (b, b64) = fp8_array(m, k, dtype), fp8_array(n, k, dtype)
    c = torch.zeros((m, 112), dtype=torch.float16)[:, :n]
    kernel = pipeline.prepare_for_emulator(build_kernel(
        fp8_descriptor_matmul, descriptor_signature(dtype, block, block[1:]),
        descriptor_constexprs(block, 3, warp_specialize), num_warps, {}, language="highlevel"))
    assert any(isinstance(op, WarpSpecialize) for op in kernel.walk()) == (warp_specialize is None)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[1:]),
                                                                       (c, block[:2]))]
    from weft.runtime.emulator import emulate
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])), (*descs, k))
    check_product(c, a64, b64.T)


@pytest.mark.parametrize("dtype", ["fp8e4m3", "fp8e5m2"])
def test_pointer_source_with_b_k_major_matches_numpy(dtype):
    m, n, k = 100, 72, 160
    (a, a64), (b_stored, b64) = fp8_array(m, k, dtype), fp8_array(n, k, dtype)
    out = examples.matmul(a, b_stored.T, block=(64, 64, 64), num_warps=4, num_stages=3, out_dtype="float16")
    check_product(out, a64, b64.T)


def test_the_k_major_box_compiles_without_a_warning():
    block = (64, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        pipeline.prepare_for_emulator(build_kernel(
            fp8_descriptor_matmul, descriptor_signature("fp8e4m3", block, block[1:]),
            descriptor_constexprs(block, 3, None), 4, {}, language="highlevel"))


def wgmma_instructions(ptx: str) -> set:
    return set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+\.f32\.\w+\.\w+)", ptx))


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("dtype, suffix", [("fp8e4m3", "e4m3.e4m3"), ("fp8e5m2", "e5m2.e5m2")])
def test_both_sources_are_fp8_wgmmas_without_spills(dtype, suffix):
    """Triton's fp8 tutorial config, 128x256x128, 8 warps, 3 stages: k32 fp8 wgmmas, no
    conversion of the operands to 16 bits, nothing spilled."""
    block = (128, 256, 128)
    descriptor = fp8_descriptor_matmul.compile(signature=descriptor_signature(dtype, block, block[1:]), num_warps=8,
                                               constexprs=descriptor_constexprs(block, 3, None))
    signature = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
                 "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32", "stride_cm": "i32",
                 "stride_cn": "i32"}
    unit = ("stride_ak", "stride_bk", "stride_cn")  # A and B K-major, as a launch with b.T specializes them
    pointer = examples.matmul_kernel.compile(
        signature=signature, num_warps=8, num_stages=3,
        specialization={name: "equal_to_1" if name in unit else "divisible_by_16" for name in signature},
        constexprs=dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True))
    for compiled in (descriptor, pointer):
        ptx = compiled.asm["ptx"]
        assert wgmma_instructions(ptx) == {f"m64n256k32.f32.{suffix}"}
        assert "f16x2.e4m3x2" not in ptx and "f16x2.e5m2x2" not in ptx  # no upcast of the operands
        assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert "setmaxnreg" in descriptor.asm["ptx"]  # warp-specialized by default
    assert "cp.async.bulk.tensor" in pointer.asm["ptx"]  # the pointer loads are TMA boxes (stage_pointer_loads)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp8e4m3", "fp8e5m2"])
def test_on_the_gpu_against_float32_torch(dtype):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    m, n, k = 1000, 1064, 1008  # tails in M, N and K; rows of 1008 fp8 bytes, as TMA needs 16-byte strides
    a = (torch.randn(m, k, device="cuda") * 0.5).to(FP8[dtype])
    b = (torch.randn(n, k, device="cuda") * 0.5).to(FP8[dtype])
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    block = (128, 256, 128)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[1:]),
                                                                       (c, block[:2]))]
    grid = (-(-m // block[0]), -(-n // block[1]))
    fp8_descriptor_matmul[grid](*descs, k, **descriptor_constexprs(block, 3, None), num_warps=8)
    pointer = examples.matmul(a, b.T, block=block, num_warps=8, num_stages=3, out_dtype="float16")
    torch.cuda.synchronize()
    exact = a.double() @ b.double().T
    # Hopper's fp8 wgmma keeps fewer mantissa bits than fp32 in its sums (test_dot_gpu.py)
    bound = 2.0 ** -10 * (a.double().abs() @ b.double().abs().T) + 2 ** -10 * exact.abs() + 1e-6
    for out in (c, pointer):
        assert ((out.double() - exact).abs() <= bound).all()
