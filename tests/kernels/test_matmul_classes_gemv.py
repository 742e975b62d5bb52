"""kernels/matmul's gemv (gemv.py: one row of C a CTA, B read into registers in 16-byte
vectors, K parts added by atomics, the last to arrive writing C): on the CPU emulator
against numpy float64 (B [K, N] and [N, K], tails in N and K, several rows, split and
unsplit, fp16 and bf16), the workspace left zeroed, Config's and the host's checks, the
chooser's rule (gemv candidates first at M = 1 with 16-bit inputs and B's layout known),
ptxas (vector loads, no spills) and, on the GPU, against float32 torch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.compiler.backend import ptxas
from weft.kernels.matmul import Config, configs_for, matmul, reference_matmul
from weft.kernels.matmul.config import GEMV_CTAS_PER_SM

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
H100_SMS = 132


def _gemv(block_n, block_k, parts=1, num_warps=4):
    return Config(1, block_n, block_k, num_warps=num_warps, group_m=1, variant="gemv", split_k=parts)


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
@pytest.mark.parametrize("m, n, k, k_major, config", [
    (1, 100, 600, True, _gemv(16, 256)),        # tails in N (100 of 7 x 16) and K (600 of 3 x 256)
    (2, 37, 1100, True, _gemv(16, 256, 3)),     # two rows; parts of 2, 2 and 1 K steps
    (1, 150, 300, False, _gemv(64, 64)),        # row-major B, tails in N and K
    (3, 130, 700, False, _gemv(32, 256, 4)),    # the last part empty (3 K steps in 4 parts)
    (1, 64, 40, False, _gemv(128, 64, 2, 8)),   # N and K within one strip and one step
])
def test_emulated_gemv_matches_numpy(m, n, k, k_major, config):
    a, b = _fp16_operands(m, n, k, k_major, np.random.default_rng(n * k + m))
    out = matmul(a, b, np.float32, config=config)
    assert out.dtype == np.float32
    _check(out, a, b, 1e-4)


def test_emulated_bf16_gemv_matches_numpy():
    """bf16 (numpy has none) through CPU torch tensors, B in both layouts, bf16 out."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(7)
    a = torch.randn(1, 520, generator=g).to(torch.bfloat16)
    k_major = torch.randn(72, 520, generator=g).to(torch.bfloat16).T
    got = matmul(a, k_major, config=_gemv(16, 256, 2))
    assert got.dtype == torch.bfloat16
    _check(got, a, k_major, 1e-2)
    row_major = torch.randn(520, 200, generator=g).to(torch.bfloat16)
    _check(matmul(a, row_major, torch.float32, config=_gemv(64, 128)), a, row_major, 1e-4)


@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 3), n=st.integers(1, 300), k=st.integers(1, 1200), k_major=st.booleans(),
       parts=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_emulated_gemv_on_any_small_shape(m, n, k, k_major, parts, seed):
    a, b = _fp16_operands(m, n, k, k_major, np.random.default_rng(seed))
    # One column of B is K-major whichever way it was made (its strides say both).
    config = _gemv(16, 256, parts) if k_major or n == 1 else _gemv(64, 64, parts)
    _check(matmul(a, b, np.float32, config=config), a, b, 1e-4)


def test_split_gemv_leaves_its_workspace_zeroed():
    """The parts add into the workspace; the last to arrive writes C and puts zeros
    back in its strip and counter, so a second launch on them adds from zero."""
    from weft.kernels.matmul import host

    a, b = _fp16_operands(2, 40, 700, True, np.random.default_rng(3))
    c = np.empty((2, 40), np.float32)
    call = host._kernel_call(a, b, c, 2, 40, 700, True, _gemv(16, 256, 3), 2, 16, 32)
    workspace, arrivals = call[6]
    assert workspace.shape == (2, 40) and arrivals.shape == (3 * 2,)
    for _ in range(2):
        c[:] = np.nan
        host._run(call)
        assert not workspace.any() and not arrivals.any()
        _check(c, a, b, 1e-4)


@pytest.mark.parametrize("parts", [1, 3])
def test_gemv_prepared_call_repeats_its_launches_on_a_new_c(parts):
    """A repeated call repeats the recorded launch with C's pointer rebound (split: on
    the workspace and counters kept for the stream, with no memset)."""
    torch = pytest.importorskip("torch")
    from weft.kernels.matmul import host
    from weft.runtime import driver

    from .fake_gpu import fake_gpu
    from .test_host_fast_path import _Calls, _long_way_only, _normalized

    a = torch.randn(1, 512).to(torch.bfloat16)
    b = torch.randn(200, 512).to(torch.bfloat16).T
    config = _gemv(16, 256, parts)
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver, "make_address_context_current", lambda address: None)
        long_way = _Calls(patch, host)
        matmul(a, b, config=config)
        memsets, launches = len(fake.memsets), len(fake.launches)
        second = matmul(a, b, config=config)
        repeated = fake.launches[-1]
        assert long_way.count == 1 and len(fake.launches) == launches + 1 and len(fake.memsets) == memsets
        assert repeated["grid"] == (-(-200 // 16), parts, 1)
        with _long_way_only():
            ref = matmul(a, b, config=config)
        assert _normalized(fake, repeated, (second,)) == _normalized(fake, fake.launches[-1], (ref,))


# ------------------------------------------------------------------ config and host checks
def test_gemv_configs_say_what_is_wrong():
    with pytest.raises(ValueError, match="block_m must be 1"):
        Config(16, 16, 256, num_warps=4, variant="gemv")
    with pytest.raises(ValueError, match="block_n 16..256 and block_k 64..1024"):
        Config(1, 16, 48, num_warps=4, variant="gemv")
    with pytest.raises(ValueError, match="split_reduce='atomic'"):
        Config(1, 16, 256, num_warps=4, variant="gemv", split_k=2, split_reduce="tma")
    with pytest.raises(ValueError, match="16-bit inputs"):
        _gemv(16, 256).check_fits(8, 16)
    a, b = _fp16_operands(1, 64, 256, True, np.random.default_rng(0))
    with pytest.raises(ValueError, match="K-major B takes block_k a multiple of 256"):
        matmul(a, b, config=_gemv(16, 128))
    a, b = _fp16_operands(1, 64, 256, False, np.random.default_rng(0))
    with pytest.raises(ValueError, match="row-major B takes block_n from 8 to 256"):
        matmul(a, b, config=_gemv(16, 64, num_warps=8))


# ------------------------------------------------------------------ the chooser
@pytest.mark.parametrize("n, k", [(4096, 4096), (14336, 4096), (4096, 14336), (100, 64)])
@pytest.mark.parametrize("k_major", [True, False])
def test_one_row_gets_gemv_candidates_first(n, k, k_major):
    """At M = 1 with B's layout known, gemv strips whose K parts keep about
    GEMV_CTAS_PER_SM CTAs per SM (each part at least two K steps) come first, the
    tensor-core decode candidates after them."""
    from weft.kernels.matmul.gemv import gemv_tile_error

    candidates = configs_for(16, 16, 1, n, k, H100_SMS, b_k_major=k_major)
    gemvs = [c for c in candidates if c.variant == "gemv"]
    assert gemvs and candidates[:len(gemvs)] == gemvs
    assert candidates[len(gemvs):] == configs_for(16, 16, 1, n, k, H100_SMS)
    first = gemvs[0]
    assert gemv_tile_error(first.block_n, first.block_k, first.num_warps, 8, k_major) is None
    ctas = -(-n // first.block_n) * first.split_k
    assert first.split_k == 1 or (first.split_k - 1) * -(-n // first.block_n) < GEMV_CTAS_PER_SM * H100_SMS
    assert ctas >= GEMV_CTAS_PER_SM * H100_SMS or first.split_k == max(1, k // (2 * first.block_k))


@pytest.mark.parametrize("bits, m, k_major", [((16, 16), 2, True), ((8, 16), 1, True), ((16, 16), 1, None)])
def test_gemv_only_for_one_16_bit_row_of_known_layout(bits, m, k_major):
    assert not [c for c in configs_for(*bits, m, 4096, 4096, H100_SMS, b_k_major=k_major) if c.variant == "gemv"]


# ------------------------------------------------------------------ ptxas
@needs_ptxas
@pytest.mark.parametrize("k_major, config, out_type", [
    (True, _gemv(16, 512, 4), "bf16"), (True, _gemv(16, 256), "bf16"),
    (False, _gemv(64, 128, 4), "fp32"), (False, _gemv(64, 64), "bf16"),
])
def test_gemv_loads_whole_vectors_without_spills(k_major, config, out_type):
    """With N, K and the strides divisible by 16 (the launcher's specialization), every
    load of B is one 16-byte vector."""
    import re

    from weft.kernels.matmul.gemv import gemv

    names = ("a_ptr", "b_ptr", "c_ptr", "partial_ptr", "arrivals_ptr", "N", "K", "stride_am", "stride_b",
             "stride_cm")
    signature = dict(zip(names, ("*bf16", "*bf16", f"*{out_type}", "*fp32", "*i32", "i32", "i32", "i32", "i32",
                                 "i32")))
    compiled = gemv.compile(
        signature=signature, num_warps=config.num_warps, specialization={name: "divisible_by_16" for name in names},
        constexprs=dict(BLOCK_N=config.block_n, BLOCK_K=config.block_k, VEC=8, SPLIT_K=config.split_k,
                        B_K_MAJOR=k_major, NUM_WARPS=config.num_warps))
    ptx = compiled.asm["ptx"]
    b_vectors = config.block_n * config.block_k // (8 * 32 * config.num_warps)
    assert len(re.findall(r"ld\.global[.\w]*\.v4", ptx)) >= b_vectors
    assert "wgmma" not in ptx
    assert ("atom.acq_rel.gpu.global.add" in ptx) == (config.split_k > 1)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("n, k, k_major", [(4096, 4096, True), (4096, 4096, False), (14336, 4096, False),
                                           (4097, 4093, True), (4097, 4093, False)])
def test_gpu_gemv_matches_torch(n, k, k_major):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    a = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen).t() if k_major else
         torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen))
    ref = a.float() @ b.float()
    candidates = [c for c in configs_for(16, 16, 1, n, k, 132, b_k_major=k_major) if c.variant == "gemv"]
    for config in candidates:
        for _ in range(2):  # the second call reuses the split's workspace
            got = matmul(a, b, config=config).float()
            torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    torch.testing.assert_close(matmul(a, b).float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
