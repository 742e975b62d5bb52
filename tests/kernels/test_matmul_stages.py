"""Config.staged_halves (kernels/matmul/staged_halves.py): the tile taken apart into column
halves in registers and written through a half-tile buffer, so that 128x256 tiles of 16-bit
C run 4 ring stages, unpaired and in CTA pairs (cluster.py). On the CPU emulator (race tracking on: a
half written over the buffer before the previous TMA stores read it, or a slot refilled
while a wgmma reads it, fails there) against numpy float64, with tails in M, N and K and
both B layouts; through ptxas for sm_90a; on the H200 against torch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.compiler.backend import ptxas
from weft.compiler.hardware import SHARED_LIMIT
from weft.kernels.matmul import Config, matmul, reference_matmul, shared_bytes
from weft.kernels.matmul.cluster import cluster_matmul
from weft.kernels.matmul.staged_halves import staged_halves_matmul

from ._matmul_gpu import check_bf16_matmul_on_gpu

RNG = np.random.default_rng(48)
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
SMALL = dict(block_m=64, block_n=128, block_k=64, num_warps=4, staged_halves=True)  # quick on the emulator
DEEP = Config(128, 256, 64, 4, group_m=8, staged_halves=True)  # the shape class's 4-stage tile


def _operands(m, n, k, k_major, rng=RNG):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16).T if k_major else rng.standard_normal((k, n)).astype(np.float16)
    return a, b


def _check(m, n, k, k_major, config, out_dtype=np.float32):
    a, b = _operands(m, n, k, k_major)
    out = matmul(a, b, out_dtype, config=config)
    tolerance = 1e-3 if out_dtype == np.float32 else 2e-2
    np.testing.assert_allclose(out.astype(np.float64), reference_matmul(a, b), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("cluster_m, cluster_n", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("m, n, k, k_major", [
    (200, 300, 136, False),  # tails in M, N and K; several tiles (pairs) a CTA (cluster)
    (100, 120, 200, True),   # the partner tile wholly past M (pairs along M) or N (along N)
])
def test_emulated_halves_match_numpy(m, n, k, k_major, cluster_m, cluster_n):
    _check(m, n, k, k_major, Config(**SMALL, stages=3, cluster_m=cluster_m, cluster_n=cluster_n))


@pytest.mark.parametrize("config, k_major", [(DEEP, False), (Config(128, 256, 64, 4, staged_halves=True, cluster_m=2), True)])
def test_emulated_deep_128x256_tiles_match_numpy(config, k_major):
    """The configs the benchmark times, 16-bit output (the buffer is C's dtype): two
    consumer warpgroups, each half two 64-column TMA stores, 4 stages walked past a wrap."""
    _check(150, 300, 330, k_major, config, np.float16)


@settings(max_examples=3, deadline=None)
@given(m=st.integers(1, 200), n=st.integers(8, 280).map(lambda n: n - n % 8), k=st.integers(8, 200),
       k_major=st.booleans(), pair=st.sampled_from([(1, 1), (2, 1), (1, 2)]), stages=st.integers(2, 4),
       seed=st.integers(0, 2**32 - 1))
def test_emulated_halves_match_numpy_on_any_shape(m, n, k, k_major, pair, stages, seed):
    a, b = _operands(m, n, k, k_major, np.random.default_rng(seed))
    config = Config(**SMALL, stages=stages, cluster_m=pair[0], cluster_n=pair[1])
    out = matmul(a, b, np.float32, config=config)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-3, atol=1e-3)


def test_halves_let_128x256_tiles_run_4_stages():
    whole = Config(128, 256, 64, 4, group_m=8)
    assert shared_bytes(whole, 16, 16) > SHARED_LIMIT >= shared_bytes(DEEP, 16, 16)
    assert shared_bytes(DEEP, 16, 16) == 4 * 48 * 1024 + 32 * 1024 + 16 * 4
    DEEP.check_fits(16, 16)
    Config(128, 256, 64, 4, staged_halves=True, cluster_m=2).check_fits(16, 16)
    with pytest.raises(ValueError, match="or staged_halves=True"):
        whole.check_fits(16, 16)
    with pytest.raises(ValueError, match="Use fewer stages or a smaller block_n\\."):  # fp32 halves: 64 KiB
        DEEP.check_fits(16, 32)


def test_bad_halves_configs_say_what_to_change():
    for bad in (dict(block_n=192), dict(block_n=64), dict(split_k=2, split_reduce="tma"),
                dict(variant="pipelined"), dict(stream_k=True)):
        with pytest.raises(ValueError, match="staged_halves=True .* block_n 128 or 256, split_k=1"):
            Config(**{**dict(block_m=128, block_n=256, staged_halves=True), **bad})


def _constexprs(config, k_major):
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, STAGES=config.stages,
                GROUP_M=config.group_m, B_K_MAJOR=k_major, NUM_WARPS=config.num_warps,
                PRODUCER_REGS=config.producer_regs)


def _signature(config, k_major):
    b_box = [config.block_n // config.cluster_m, 64] if k_major else [64, 64]
    return {"a_desc": f"tensordesc<bf16[{config.block_m // config.cluster_n},64]>",
            "b_desc": f"tensordesc<bf16[{b_box[0]},{b_box[1]}]>", "c_desc": "tensordesc<bf16[128,64]>",
            "M": "i32", "N": "i32", "K": "i32"}


def _check_assembly(compiled, config):
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert meta["performance_warnings"] == []  # e.g. wgmma serialized by ptxas
    assert shared_bytes(config, 16, 16) <= meta["shared"] <= SHARED_LIMIT
    ptx = compiled.asm["ptx"]
    # Each half: two 64-column TMA stores, after a read-wait on the buffer's last stores.
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == 4
    # One 256-wide wgmma a K step; the halves come apart in registers.
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in ptx and "m64n128k16" not in ptx


@needs_ptxas
@pytest.mark.parametrize("k_major", [False, True])
def test_deep_halves_assemble_without_spills(k_major):
    compiled = staged_halves_matmul.compile(signature=_signature(DEEP, k_major), num_warps=8,
                                            constexprs=_constexprs(DEEP, k_major))
    _check_assembly(compiled, DEEP)


@needs_ptxas
@pytest.mark.parametrize("cluster_m, cluster_n, k_major", [(2, 1, False), (1, 2, True)])
def test_deep_paired_halves_assemble_without_spills(cluster_m, cluster_n, k_major):
    config = Config(128, 256, 64, 4, group_m=8, staged_halves=True, cluster_m=cluster_m, cluster_n=cluster_n)
    compiled = cluster_matmul.compile(
        signature=_signature(config, k_major), num_warps=8, cluster=(2, 1, 1),
        constexprs=dict(_constexprs(config, k_major), CLUSTER_M=cluster_m, CLUSTER_N=cluster_n, STAGED_N=128))
    _check_assembly(compiled, config)


# ------------------------------------------------------------------ on the H200
@pytest.mark.gpu
@pytest.mark.parametrize("cluster_m, cluster_n", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("m, n, k, layout", [(1000, 3000, 5000, "kn"), (1000, 3000, 5000, "nk"),
                                             (768, 1024, 32768, "nk"), (333, 2047, 1999, "nk"),
                                             (4096, 4096, 4096, "kn"), (200, 136, 72, "kn")])
def test_gpu_deep_halves_match_torch(m, n, k, layout, cluster_m, cluster_n):
    config = Config(128, 256, 64, 4, group_m=8, staged_halves=True, cluster_m=cluster_m, cluster_n=cluster_n)
    check_bf16_matmul_on_gpu(m, n, k, layout, config, seed=m * n + k)
