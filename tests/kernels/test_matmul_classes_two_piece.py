"""kernels/matmul's 192-column tiles (two_piece.py: a 128- and a 64-wide accumulator per
tile): on the CPU emulator against numpy float64 (tails in M, N and K, B [K, N] and
[N, K], fp16 and bf16, fp16 and fp32 output), ptxas (no spills, two wgmmas per k16
step), Config's checks, the chooser's rule (128x192 candidates where they fill the
waves that 128x256 and 128x128 tiles leave part empty), and on the GPU against float32 torch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.compiler.backend import ptxas
from weft.kernels.matmul import Config, configs_for, matmul, reference_matmul
from weft.kernels.matmul.config import SHARED_LIMIT, _deepest, shared_bytes

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
WIDE = Config(128, 192, 64, 3, group_m=8)


def _fp16_operands(m, n, k, k_major, rng):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16).T if k_major else \
        rng.standard_normal((k, n)).astype(np.float16)
    return a, b


def _check(out, a, b, tol):
    ref = reference_matmul(a, b)
    got = out.float().numpy() if hasattr(out, "float") else out.astype(np.float64)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * max(np.abs(ref).max(), 1.0))


# ------------------------------------------------------------------ emulator
@pytest.mark.parametrize("m, n, k, k_major, out_dtype", [
    (130, 200, 150, False, np.float32),  # two tile rows, the second column tile 8 wide: the right piece empty
    (70, 390, 130, True, None),          # three column tiles, the last cut inside its left piece
    (129, 150, 70, True, np.float32),    # the right piece cut part-way (columns 128..149)
    (1, 192, 64, False, None),           # one row, one whole tile, one K step
])
def test_emulated_two_piece_tiles_match_numpy(m, n, k, k_major, out_dtype):
    a, b = _fp16_operands(m, n, k, k_major, np.random.default_rng(m * n + k))
    out = matmul(a, b, out_dtype, config=WIDE)
    assert out.dtype == (out_dtype or np.float16)
    _check(out, a, b, 1e-3 if out_dtype else 2e-3)


def test_emulated_bf16_two_piece_tiles_match_numpy():
    """bf16 (numpy has none) through CPU torch tensors, B in both layouts."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    a = torch.randn(140, 200, generator=g).to(torch.bfloat16)
    k_major = torch.randn(260, 200, generator=g).to(torch.bfloat16).T
    got = matmul(a, k_major, config=WIDE)
    assert got.dtype == torch.bfloat16
    _check(got, a, k_major, 1e-2)
    row_major = torch.randn(200, 250, generator=g).to(torch.bfloat16)
    _check(matmul(a, row_major, torch.float32, config=Config(128, 192, 64, 3, group_m=1)), a, row_major, 1e-4)


@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 200), n=st.integers(1, 420), k=st.integers(1, 300), k_major=st.booleans(),
       seed=st.integers(0, 2**16))
def test_emulated_two_piece_tiles_on_any_small_shape(m, n, k, k_major, seed):
    a, b = _fp16_operands(m, n, k, k_major, np.random.default_rng(seed))
    _check(matmul(a, b, np.float32, config=WIDE), a, b, 1e-3)


# ------------------------------------------------------------------ config
def test_two_piece_configs_say_what_is_wrong():
    with pytest.raises(ValueError, match="block_n must be one of"):
        Config(128, 96)
    with pytest.raises(ValueError, match="block_n=192"):
        Config(128, 192, split_k=2, split_reduce="tma")
    with pytest.raises(ValueError, match="block_n=192"):
        Config(128, 192, variant="pipelined")


def test_two_piece_stages_fit_shared_memory():
    """4 stages of 16-bit A and B (40 KiB each) and the 48 KiB output tile fit; an fp32
    output tile (96 KiB) leaves room for 3."""
    assert _deepest(Config(128, 192, 64, 8, group_m=8), 16, 16).stages == 4
    assert _deepest(Config(128, 192, 64, 8, group_m=8), 16, 32).stages == 3
    assert shared_bytes(Config(128, 192, 64, 4), 16, 16) <= SHARED_LIMIT


H100_SMS = 132


@pytest.mark.parametrize("in_bits, out_bits, stages", [(16, 16, 4), (8, 16, 4), (16, 32, 3)])
def test_shapes_whose_waves_128x192_tiles_fill_get_them(in_bits, out_bits, stages):
    """1000 x 3000: 96 128x256 tiles and 192 128x128 ones fill 73% of their waves on 132
    SMs, 128 128x192 tiles 97% of one: a candidate, as deep as shared memory allows."""
    wide = [c for c in configs_for(in_bits, out_bits, 1000, 3000, 5000, H100_SMS)
            if c.block_n == 192 and c.cluster_m == 1]  # CTA pairs of them: test_matmul_cluster.py
    assert wide == [Config(128, 192, 1024 // in_bits, stages, group_m=8)]
    assert shared_bytes(wide[0], in_bits, out_bits) <= SHARED_LIMIT


@pytest.mark.parametrize("m, n, sm_count", [
    (4096, 4096, H100_SMS), (8192, 8192, H100_SMS),  # 128x256 tiles fill 97% of their waves
    (4095, 4097, H100_SMS),                          # 128x128 tiles fill 8 waves exactly
    (128, 11008, H100_SMS),                          # 58 128x192 tiles fill under half a wave
    (1000, 3000, 96),                                # 192 128x128 tiles: two full waves on 96 SMs
])
def test_shapes_other_tiles_fill_get_no_128x192_candidate(m, n, sm_count):
    assert not [c for c in configs_for(16, 16, m, n, 4096, sm_count) if c.block_n == 192]


# ------------------------------------------------------------------ ptxas
@needs_ptxas
@pytest.mark.parametrize("in_type, out_type, k_major, stages, block_k", [
    ("bf16", "bf16", True, 4, 64), ("fp16", "fp32", False, 3, 64), ("fp8e4m3", "bf16", True, 4, 128),
])
def test_two_piece_kernel_assembles_without_spills(in_type, out_type, k_major, stages, block_k):
    from weft.kernels.matmul.two_piece import two_piece_matmul

    b_box = [64, block_k] if k_major else [block_k, 64]
    out_row = 1024 // (32 if out_type == "fp32" else 16)
    signature = {"a_desc": f"tensordesc<{in_type}[128,{block_k}]>",
                 "b_desc": f"tensordesc<{in_type}[{b_box[0]},{b_box[1]}]>",
                 "c_desc": f"tensordesc<{out_type}[128,{out_row}]>", "M": "i32", "N": "i32", "K": "i32"}
    compiled = two_piece_matmul.compile(
        signature=signature, num_warps=8,
        constexprs=dict(BLOCK_M=128, BLOCK_N=192, BLOCK_K=block_k, STAGES=stages, GROUP_M=8, B_K_MAJOR=k_major,
                        NUM_WARPS=8, PRODUCER_REGS=40))
    ptx = compiled.asm["ptx"]
    # Per k16 (k32 for fp8) step, one wgmma of each piece: n128 and n64.
    assert ptx.count("wgmma.mma_async") == 2 * (block_k * (8 if "fp8" in in_type else 16) // 256)
    assert "n128k" in ptx and "n64k" in ptx and "setmaxnreg" in ptx
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.metadata["performance_warnings"] == []


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, k_major", [
    (1000, 3000, 5000, False), (1000, 3000, 5000, True), (4095, 4097, 4093, False), (333, 2047, 1999, True),
])
def test_gpu_two_piece_tiles_match_torch(m, n, k, k_major):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen).t() if k_major else
         torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen))
    ref = a.float() @ b.float()
    for config in (Config(128, 192, 64, 4, group_m=8), Config(128, 192, 64, 3, group_m=16)):
        got = matmul(a, b, config=config).float()
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
