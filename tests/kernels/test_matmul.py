"""kernels/matmul: every variant through ptxas for sm_90a (with the instructions each must
contain and no spills), on the CPU emulator against numpy, and on the H200 against torch."""

import numpy as np
import pytest

from weft.kernels.matmul import Config, configs_for, matmul, reference_matmul, shared_bytes
from weft.kernels.matmul.kernels import pipelined_matmul, warp_specialized_matmul
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(7)
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


def _signature(in_type, out_type, config, k_major):
    row_in, row_out = 1024 // {"bf16": 16, "fp16": 16}.get(in_type, 8), 1024 // (32 if out_type == "fp32" else 16)
    b_box = [config.block_n, config.block_k] if k_major else [config.block_k, min(row_in, config.block_n)]
    return {
        "a_desc": f"tensordesc<{in_type}[{config.block_m},{config.block_k}]>",
        "b_desc": f"tensordesc<{in_type}[{b_box[0]},{b_box[1]}]>",
        "c_desc": f"tensordesc<{out_type}[{config.block_m},{min(row_out, config.block_n)}]>",
        "M": "i32", "N": "i32", "K": "i32",
    }


VARIANTS = [
    # (kernel, input, output, config, B K-major)
    (warp_specialized_matmul, "bf16", "bf16", Config(128, 256, 64, 3), False),
    (warp_specialized_matmul, "fp16", "fp32", Config(128, 128, 64, 4), True),
    (pipelined_matmul, "bf16", "bf16", Config(128, 256, 64, 3, variant="pipelined"), False),
    (warp_specialized_matmul, "fp8e4m3", "bf16", Config(128, 256, 128, 3), True),
    (warp_specialized_matmul, "fp8e5m2", "fp16", Config(128, 128, 128, 4), True),
]


@needs_ptxas
@pytest.mark.parametrize("kernel, in_type, out_type, config, k_major", VARIANTS)
def test_every_variant_assembles_without_spills(kernel, in_type, out_type, config, k_major):
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                      NUM_WARPS=config.num_warps)
    if kernel is warp_specialized_matmul:
        constexprs["PRODUCER_REGS"] = config.producer_regs
    compiled = kernel.compile(signature=_signature(in_type, out_type, config, k_major),
                              constexprs=constexprs, num_warps=config.num_warps)
    ptx = compiled.asm["ptx"]
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait",
                        "wgmma.wait_group", "fence.proxy.async"):
        assert instruction in ptx, instruction
    assert ("setmaxnreg" in ptx) == (kernel is warp_specialized_matmul)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.metadata["performance_warnings"] == []  # e.g. wgmma serialized by ptxas
    assert compiled.metadata["shared"] >= shared_bytes(config, 8 if "fp8" in in_type else 16,
                                                       32 if out_type == "fp32" else 16) - 64


def test_configs_fit_in_shared_memory_and_bad_ones_say_why():
    for config in configs_for(16, 16) + configs_for(8, 32):
        assert config.block_m == 16 * config.num_warps
    with pytest.raises(ValueError, match="shared memory"):
        Config(128, 256, 64, 4).check_fits(16, 16)
    with pytest.raises(ValueError, match="block_m must be 16 x num_warps"):
        Config(block_m=64, num_warps=8)
    with pytest.raises(ValueError, match="variant"):
        Config(variant="split_k")


@pytest.mark.parametrize("variant", ["warp_specialized", "pipelined"])
@pytest.mark.parametrize("m, n, k, k_major", [(128, 256, 64, False), (200, 136, 72, False),
                                               (130, 264, 200, True)])
def test_emulated_matmul_matches_numpy(variant, m, n, k, k_major):
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((n, k)).astype(np.float16).T if k_major else \
        RNG.standard_normal((k, n)).astype(np.float16)
    config = Config(128, 128, 64, 2, variant=variant)
    out = matmul(a, b, np.float32, config=config)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-3, atol=1e-3)


def test_bad_inputs_get_clear_errors():
    a = np.zeros((64, 32), np.float16)
    with pytest.raises(ValueError, match="a's K"):
        matmul(a, np.zeros((16, 64), np.float16))
    with pytest.raises(TypeError, match="one dtype"):
        matmul(a, np.zeros((32, 64), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        matmul(np.zeros((2, 64, 32), np.float16), np.zeros((32, 64), np.float16))


# ------------------------------------------------------------------ on the H200
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["warp_specialized", "pipelined"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("out_name", [None, "float32"])
def test_gpu_matmul_matches_torch_with_tails(variant, dtype_name, out_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    out_dtype = getattr(torch, out_name) if out_name else None
    gen = torch.Generator(device="cuda").manual_seed(3)
    for m, n, k in [(4096, 4096, 4096), (1000, 1016, 776), (129, 264, 64), (64, 8, 8), (3000, 200, 4104)]:
        a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
        for k_major in (False, True):
            b = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen).t() if k_major else \
                torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
            config = Config(128, 256, 64, 3 if out_name is None else 2, variant=variant)
            got = matmul(a, b, out_dtype, config=config).float()
            ref = a.float() @ b.float()
            scale = ref.abs().max().item()
            assert (got - ref).abs().max().item() <= 1e-2 * scale, (m, n, k, k_major)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_gpu_fp8_matmul_matches_torch(fp8):
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(5)
    for m, n, k in [(4096, 4096, 4096), (1000, 264, 520)]:
        a = (torch.randn(m, k, device="cuda", generator=gen) * 0.5).to(getattr(torch, fp8))
        b = (torch.randn(n, k, device="cuda", generator=gen) * 0.5).to(getattr(torch, fp8)).t()
        got = matmul(a, b).float()
        ref = a.float() @ b.float()
        assert (got - ref).abs().max().item() <= 1e-2 * ref.abs().max().item(), (m, n, k)


@pytest.mark.gpu
def test_gpu_autotuned_matmul_matches_torch():
    torch = pytest.importorskip("torch")
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16)
    got = matmul(a, b).float()
    ref = a.float() @ b.float()
    assert (got - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


@pytest.mark.parametrize("fp8", ["fp8e4m3", "fp8e5m2"])
def test_emulated_fp8_variant_matches_numpy(fp8):
    """The fp8 variant on the emulator: numpy has no fp8, so the operands are uint8 bit
    patterns and the kernel is compiled with an explicit fp8 signature."""
    from weft.compiler.frontend import build_kernel
    from weft.compiler.pipeline import run_layout_passes
    from weft.lowlevel import NVMMASharedLayout, TensorDescriptor
    from weft.runtime.emulator import emulate
    from weft.runtime.emulator.dtypes import from_fp8, to_fp8

    m, n, k = 130, 136, 200
    config = Config(128, 128, 128, 2)
    a_bits = to_fp8(RNG.standard_normal((m, 208)) * 0.5, fp8)[:, :k]   # rows 16-byte aligned
    bt_bits = to_fp8(RNG.standard_normal((n, 208)) * 0.5, fp8)[:, :k]
    c = np.zeros((m, n), np.float16)
    swizzled = NVMMASharedLayout(128, 8)
    descriptors = (TensorDescriptor.from_tensor(a_bits, [128, 128], swizzled),
                   TensorDescriptor.from_tensor(bt_bits, [128, 128], swizzled),
                   TensorDescriptor.from_tensor(c, [128, 64], NVMMASharedLayout(128, 16)))
    signature = _signature(fp8, "fp16", config, True)
    constexprs = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, STAGES=2, GROUP_M=8, B_K_MAJOR=True,
                      NUM_WARPS=8, PRODUCER_REGS=40)
    kernel = run_layout_passes(build_kernel(warp_specialized_matmul, signature, constexprs, 8))
    emulate(kernel, (2, 1, 1), descriptors + (m, n, k))
    reference = from_fp8(a_bits, fp8).astype(np.float64) @ from_fp8(bt_bits, fp8).astype(np.float64).T
    np.testing.assert_allclose(c.astype(np.float64), reference, rtol=2e-3, atol=2e-2)
