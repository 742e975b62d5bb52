"""kernels/matmul's split-K by TMA bulk reduce-add (split_k_tma.py, Config.split_reduce='tma')
and the shape classes it serves: on the CPU emulator against numpy float64 (tails in M, N
and K, B [K, N] and [N, K], fp16 and bf16, decode tiles up to 64x256), the workspace left
zeroed for the next launch, the prepared fast path's two launches under the stubbed
driver, the config chooser's rules (from the SM and tile counts; unchanged candidates for
the shapes that were already fast), ptxas (no spills) and, on the GPU, every candidate of
each class's real shapes against float32 torch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.compiler.backend import ptxas
from weft.kernels.matmul import Config, configs_for, matmul, reference_matmul
from weft.kernels.matmul.config import FILL, SHARED_LIMIT, WAVE_FILLING_TILES, _deepest, shared_bytes, staged_columns

RNG = np.random.default_rng(41)
H100_SMS = 132
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


def _tma(block_m, block_n, stages, parts, num_warps=None, group_m=1):
    return Config(block_m, block_n, 64, stages, num_warps=num_warps or block_m // 16, group_m=group_m,
                  split_k=parts, split_reduce="tma")


def _fp16_operands(m, n, k, k_major, rng=RNG):
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
@pytest.mark.parametrize("m, n, k, config, k_major", [
    (70, 36, 1100, _tma(64, 64, 2, 6), True),               # tails in M, N, K; parts of 3 steps, one empty
    (130, 300, 300, _tma(128, 256, 2, 2, group_m=8), True),  # a 128x256 tile, added in two halves
    (129, 72, 500, _tma(128, 64, 3, 3, group_m=8), False),   # two tile rows, the second of one row
    (1, 200, 700, _tma(64, 256, 2, 3), False),               # decode, a 256-wide tile past N
    (3, 136, 650, _tma(64, 128, 3, 4), True),                # decode, K-major B
])
def test_emulated_reduce_add_split_k_matches_numpy(m, n, k, config, k_major):
    a, b = _fp16_operands(m, n, k, k_major)
    out_dtype, tol = (np.float32, 1e-3) if k_major else (None, 2e-3)
    out = matmul(a, b, out_dtype, config=config)
    assert out.dtype == (out_dtype or np.float16)
    _check(out, a, b, tol)


def test_emulated_bf16_reduce_add_split_k_matches_numpy():
    """bf16 (numpy has none) through CPU torch tensors, B in both layouts."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(20, 300, generator=g).to(torch.bfloat16)
    k_major = torch.randn(72, 300, generator=g).to(torch.bfloat16).T
    got = matmul(a, k_major, config=_tma(64, 64, 3, 4))
    assert got.dtype == torch.bfloat16
    _check(got, a, k_major, 1e-2)
    row_major = torch.randn(300, 72, generator=g).to(torch.bfloat16)
    _check(matmul(a, row_major, torch.float32, config=_tma(64, 128, 3, 3)), a, row_major, 1e-4)


@settings(max_examples=5)
@given(m=st.integers(1, 140), n=st.integers(1, 140), k=st.integers(1, 500),
       config=st.sampled_from([_tma(64, 64, 2, 3), _tma(64, 128, 3, 5), _tma(128, 64, 2, 2, group_m=8)]),
       k_major=st.booleans(), seed=st.integers(0, 2**16))
def test_emulated_reduce_add_split_k_on_any_small_shape(m, n, k, config, k_major, seed):
    """Parts may be empty (fewer K steps than parts), tiles cut anywhere."""
    a, b = _fp16_operands(m, n, k, k_major, np.random.default_rng(seed))
    _check(matmul(a, b, np.float32, config=config), a, b, 1e-3)


def test_reduce_add_split_k_leaves_its_workspace_zeroed():
    """finish_split puts zeros back (the next launch adds into them), C's padding columns
    included: the workspace has C's row stride."""
    from weft.kernels.matmul import host

    a, b = _fp16_operands(20, 100, 600, True)
    scratches = []
    original = host._kernel_call

    def recorded(*args, **kwargs):
        call = original(*args, **kwargs)
        scratches.append(call[-1])
        return call
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(host, "_kernel_call", recorded)
        out = matmul(a, b, None, config=_tma(64, 64, 2, 3))
    _check(out, a, b, 2e-3)
    (workspace,), = scratches
    assert workspace.shape == (20, 104) and workspace.dtype == np.float32 and not workspace.any()


def test_reduce_add_prepared_call_repeats_both_launches_on_a_new_c():
    """A repeated call repeats the split launch and finish_split's (which writes the new
    C), with no memset: both point at the workspace kept for the stream and shape."""
    torch = pytest.importorskip("torch")
    from weft.kernels.matmul import host
    from weft.runtime import driver

    from .fake_gpu import fake_gpu
    from .test_host_fast_path import _Calls, _long_way_only, _normalized

    a = torch.randn(16, 512).to(torch.bfloat16)
    b = torch.randn(512, 200).to(torch.bfloat16)
    config = _tma(64, 128, 3, 4)
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        # Without a CUDA driver library, no context to look up (the fake's tensors are on the CPU).
        patch.setattr(driver, "make_address_context_current", lambda address: None)
        long_way = _Calls(patch, host)
        matmul(a, b, config=config)
        memsets, launches = len(fake.memsets), len(fake.launches)
        second = matmul(a, b, config=config)
        split, finish = fake.launches[-2:]
        assert long_way.count == 1 and len(fake.memsets) == memsets and len(fake.launches) == launches + 2
        with _long_way_only():
            ref = matmul(a, b, config=config)
        assert _normalized(fake, split, (second,)) == _normalized(fake, fake.launches[-2], (ref,))
        assert _normalized(fake, finish, (second,)) == _normalized(fake, fake.launches[-1], (ref,))
        assert split["grid"] == (2 * 4, 1, 1) and finish["grid"] == (-(-16 * 200 // 2048), 1, 1)


# ------------------------------------------------------------------ the chooser
def _old(block_m, block_n, block_k, stages, num_warps=8, group_m=16, variant="warp_specialized", split_k=1):
    return Config(block_m, block_n, block_k, stages, num_warps=num_warps, group_m=group_m, variant=variant,
                  split_k=split_k)


def _large(block_k):
    """configs_for's large-problem candidates at 0c47247."""
    return [_old(128, 256, block_k, 3), _old(128, 256, block_k, 3, variant="pipelined"),
            _old(128, 256, block_k, 2), _old(128, 128, block_k, 5, group_m=8), _old(128, 128, block_k, 4, group_m=8)]


# The candidates of 0c47247 for the shapes that were already at or past cuBLAS
# (docs/performance-journal.md, "Matmul across shape classes").
ALREADY_FAST = {
    (16, 16, 4096, 4096, 4096): _large(64), (16, 16, 8192, 8192, 8192): _large(64),
    (16, 16, 4096, 11008, 4096): _large(64), (16, 16, 4096, 4096, 11008): _large(64),
    (16, 16, 4096, 14336, 4096): _large(64), (16, 16, 2048, 4096, 14336): _large(64),
    (16, 16, 2048, 14336, 4096): _large(64),
    (16, 32, 4096, 4096, 4096): [_old(128, 256, 64, 2), _old(128, 128, 64, 5, group_m=8),
                                 _old(128, 128, 64, 4, group_m=8)],
    (8, 16, 4096, 4096, 4096): _large(128), (8, 16, 8192, 8192, 8192): _large(128),
    (16, 16, 4095, 4097, 4093): _large(64),
    (16, 16, 333, 2047, 1999): [_old(128, 128, 64, 6, group_m=8, split_k=2), _old(64, 128, 64, 8, 4, group_m=8)],
    (16, 16, 64, 14336, 4096): [_old(64, 128, 64, 8, 4, group_m=1), _old(64, 64, 64, 8, 4, group_m=1)],
    (16, 16, 1, 14336, 4096): [_old(64, 128, 64, 8, 4, group_m=1), _old(64, 64, 64, 8, 4, group_m=1)],
}


@pytest.mark.parametrize("key", sorted(ALREADY_FAST))
def test_shapes_that_were_fast_keep_their_candidates(key):
    """Every candidate they had is still offered (the autotuner times any added beside)."""
    in_bits, out_bits, m, n, k = key
    offered = configs_for(in_bits, out_bits, m, n, k, H100_SMS)
    assert [c for c in offered if c in ALREADY_FAST[key]] == ALREADY_FAST[key]


@pytest.mark.parametrize("m, n, k", [(512, 512, 32768), (1024, 1024, 65536), (768, 1024, 32768)])
def test_long_k_adds_reduce_add_candidates_that_fill_the_sms(m, n, k):
    candidates = configs_for(16, 16, m, n, k, H100_SMS)
    assert [c.split_reduce for c in candidates[:2]] == ["atomic", "atomic"]
    tma = [c for c in candidates if c.split_reduce == "tma" and c.cluster_m == 1]  # pairs: test_matmul_cluster.py
    assert tma and all(c.block_m == 128 and c.split_k > 1 for c in tma)
    assert tma[-1].block_n == 256 and tma[-1].stages == 3  # the wide tile, added in halves
    for c in tma:
        units = -(-m // 128) * -(-n // c.block_n) * c.split_k
        assert units <= 4 * H100_SMS and units / (-(-units // H100_SMS) * H100_SMS) > 0.7
        assert shared_bytes(c, 16, 16) <= SHARED_LIMIT
    if (m, n) == (768, 1024):  # 48 tiles: 2 parts fill 73% of one wave, 11 fill 4 waves whole
        assert [c.split_k for c in tma] == [2, 11, 11]


def test_one_to_two_waves_of_tiles_get_shapes_that_fill_them():
    """1000 x 3000: 192 128x128 tiles and 96 128x256 tiles on 132 SMs leave a wave part
    empty; 128x64 (376 tiles) and 64x128 (384) fill theirs past FILL, as does split-K."""
    candidates = configs_for(16, 16, 1000, 3000, 5000, H100_SMS)
    large = [c for c in candidates if c in _large(64)]
    assert large == _large(64)
    assert candidates[candidates.index(large[-1]) + 1] == _old(128, 128, 64, 5, group_m=8, split_k=2)
    assert Config(128, 128, 64, 5, group_m=8, split_k=2, split_reduce="tma") in candidates
    assert Config(128, 256, 64, 3, group_m=8, split_k=4, split_reduce="tma") in candidates  # 384 units
    shapes = {(c.block_m, c.block_n) for c in candidates if c.split_k == 1}
    assert {(128, 64), (64, 128)} <= shapes
    # The rule follows the SM count: on 96 SMs 192 tiles are two full waves.
    assert not any(c.split_k > 1 or c.block_n == 64 for c in configs_for(16, 16, 1000, 3000, 5000, 96))
    for c in candidates:
        if (c.block_m, c.block_n) in WAVE_FILLING_TILES:
            tiles = -(-1000 // c.block_m) * -(-3000 // c.block_n)
            assert tiles / (-(-tiles // H100_SMS) * H100_SMS) >= FILL


@pytest.mark.parametrize("m, n", [(1, 4096), (1, 4097), (16, 11008)])
def test_split_decode_adds_wide_reduce_add_tiles(m, n):
    """Decode whose 64x128 tiles are too few for the SMs unsplit: 64x128 and 64x256 tiles
    split by TMA reduce-add too, the units filling the SMs."""
    candidates = configs_for(16, 16, m, n, 4096, H100_SMS)
    tma = [c for c in candidates if c.split_reduce == "tma"]
    assert sorted(c.block_n for c in tma) == [128, 256] and all(c.block_m == 64 for c in tma)
    for c in tma:
        units = -(-n // c.block_n) * c.split_k
        assert units > H100_SMS * 0.9 and shared_bytes(c, 16, 16) <= SHARED_LIMIT


def test_deterministic_mode_unsplits_reduce_add_candidates():
    from weft.kernels.matmul.host import unsplit

    candidates = unsplit(configs_for(16, 16, 1, 4096, 4096, H100_SMS))
    assert all(c.split_k == 1 and c.split_reduce == "atomic" for c in candidates)
    assert [(c.block_n, c.stages) for c in candidates] == [(128, 8), (64, 8), (256, 4)]


def test_reduce_add_configs_say_what_is_wrong():
    with pytest.raises(ValueError, match="split_reduce must be one of"):
        Config(split_k=2, block_n=128, split_reduce="tree")
    with pytest.raises(ValueError, match="needs split_k > 1"):
        Config(split_reduce="tma")
    Config(64, 256, num_warps=4, split_k=2, split_reduce="tma")  # TMA adds take 256-wide tiles
    with pytest.raises(ValueError, match="split_reduce='tma' takes 256"):
        Config(64, 256, num_warps=4, split_k=2)


# ------------------------------------------------------------------ ptxas
TMA_VARIANTS = [
    ("bf16", _tma(64, 128, 8, 4), False), ("bf16", _tma(64, 256, 8, 8), False), ("bf16", _tma(64, 256, 8, 8), True),
    ("fp16", _tma(128, 128, 8, 8, group_m=8), True), ("bf16", _tma(128, 128, 8, 2, group_m=8), False),
    ("bf16", _tma(128, 256, 3, 4, group_m=8), False), ("bf16", _tma(128, 256, 3, 4, group_m=8), True),
    ("fp8e4m3", Config(64, 128, 128, 8, num_warps=4, group_m=1, split_k=4, split_reduce="tma"), True),
]


@needs_ptxas
@pytest.mark.parametrize("in_type, config, k_major", TMA_VARIANTS)
def test_reduce_add_variants_assemble_without_spills(in_type, config, k_major):
    from weft.kernels.matmul.split_k_tma import reduce_add_split_k_matmul

    in_bits = 8 if "fp8" in in_type else 16
    config = _deepest(config, in_bits, 16)
    b_box = [config.block_n, config.block_k] if k_major else [config.block_k, min(1024 // in_bits, config.block_n)]
    signature = {"a_desc": f"tensordesc<{in_type}[{config.block_m},{config.block_k}]>",
                 "b_desc": f"tensordesc<{in_type}[{b_box[0]},{b_box[1]}]>",
                 "ws_desc": f"tensordesc<fp32[{config.block_m},{min(32, config.block_n)}],swizzle=128>",
                 "M": "i32", "N": "i32", "K": "i32"}
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                      NUM_WARPS=config.num_warps, PRODUCER_REGS=config.producer_regs, SPLIT_K=config.split_k,
                      STAGED_N=staged_columns(config.block_m, config.block_n))
    compiled = reduce_add_split_k_matmul.compile(signature=signature, constexprs=constexprs,
                                                 num_warps=config.num_warps)
    ptx = compiled.asm["ptx"]
    assert ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group") == config.block_n // 32
    assert "red.relaxed.gpu.global.add.f32" not in ptx and "wgmma.mma_async" in ptx
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.metadata["performance_warnings"] == []


@needs_ptxas
@pytest.mark.parametrize("out_type", ["bf16", "fp16", "fp32"])
def test_finish_split_assembles_to_vector_accesses_without_spills(out_type):
    from weft.kernels.matmul.split_k_tma import finish_split

    aligned = {"ws_ptr": "divisible_by_16", "c_ptr": "divisible_by_16"}
    compiled = finish_split.compile(signature={"ws_ptr": "*fp32", "c_ptr": f"*{out_type}", "quads": "i32"},
                                    constexprs={}, num_warps=4, specialization=aligned)
    ptx = compiled.asm["ptx"]
    assert ptx.count("ld.global.cg.v4.b32") == 4 and "ld.global.cg.b32" not in ptx
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0


# ------------------------------------------------------------------ on the GPU
CLASS_SHAPES = [(1, 4096, 4096, False), (1, 4096, 4096, True), (16, 11008, 4096, True), (1, 4097, 4093, False),
                (512, 512, 32768, False), (1024, 1024, 65536, False), (768, 1024, 32768, True),
                (200, 300, 40000, False), (1000, 3000, 5000, False), (1000, 3000, 5000, True)]


FP16_TOO = {(1, 4096, 4096, False), (512, 512, 32768, False), (1000, 3000, 5000, True)}


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, k_major", CLASS_SHAPES)
def test_gpu_every_class_candidate_matches_torch(m, n, k, k_major):
    """Every candidate configs_for gives the class shapes, forced, twice (the second call
    through the prepared fast path: the workspace must come back zeroed); bf16, and fp16
    on one shape of each class (each dtype compiles its own kernels)."""
    torch = pytest.importorskip("torch")
    from weft.runtime import driver

    sms = driver.device_properties(0).sm_count
    gen = torch.Generator(device="cuda").manual_seed(5)
    dtypes = [torch.bfloat16] + ([torch.float16] if (m, n, k, k_major) in FP16_TOO else [])
    for dtype in dtypes:
        a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen).t() if k_major else \
            torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
        ref = a.float() @ b.float()
        scale = ref.abs().max().item()
        for config in configs_for(16, 16, m, n, k, sms):
            for attempt in range(2):
                got = matmul(a, b, config=config)
                assert got.dtype == dtype and got.shape == ref.shape
                error = (got.float() - ref).abs().max().item()
                assert error <= 1e-2 * scale, (config, attempt, error / scale)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 11008, 4096), (512, 512, 32768)])
def test_gpu_fp8_reduce_add_candidates_match_torch(m, n, k):
    """fp8 (K-major B, bf16 out) through every TMA-reduced candidate of the class."""
    torch = pytest.importorskip("torch")
    from weft.runtime import driver

    gen = torch.Generator(device="cuda").manual_seed(6)
    a = (torch.randn(m, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn).t()
    ref = a.float() @ b.float()
    configs = [c for c in configs_for(8, 16, m, n, k, driver.device_properties(0).sm_count) if c.split_reduce == "tma"]
    assert configs
    for config in configs:
        for attempt in range(2):
            got = matmul(a, b, torch.bfloat16, config=config)
            assert (got.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item(), (config, attempt)
