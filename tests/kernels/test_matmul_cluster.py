"""kernels/matmul/cluster.py: CTA pairs sharing the A or B tile by TMA multicast
(Config.cluster_m / cluster_n). On the CPU emulator (race tracking on: a producer that
refilled a slot its peer still reads fails there) against numpy float64, with tails in M,
N and K, partner tiles wholly past the edge, both B layouts and both pair directions;
through ptxas for sm_90a; on the H200 against torch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.compiler.backend import ptxas
from weft.compiler.hardware import SHARED_LIMIT
from weft.kernels.matmul import Config, configs_for, matmul, reference_matmul, shared_bytes
from weft.kernels.matmul import host as matmul_host
from weft.kernels.matmul.cluster import cluster_matmul
from weft.kernels.matmul.config import staged_columns
from weft.kernels.matmul.two_piece import two_piece_matmul

from ._matmul_gpu import check_bf16_matmul_on_gpu

RNG = np.random.default_rng(41)
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
SMALL = dict(block_m=64, block_n=128, block_k=64, stages=2, num_warps=4)  # quick on the emulator


def _operands(m, n, k, k_major, rng=RNG):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16).T if k_major else rng.standard_normal((k, n)).astype(np.float16)
    return a, b


def _check(m, n, k, k_major, config):
    a, b = _operands(m, n, k, k_major)
    out = matmul(a, b, np.float32, config=config)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("cluster_m, cluster_n", [(2, 1), (1, 2)])
@pytest.mark.parametrize("m, n, k, k_major", [
    (200, 300, 72, False),   # tails in M, N and K; several pairs walked by one cluster
    (100, 120, 200, True),   # the partner tile wholly past M (pairs along M) or N (along N)
])
def test_emulated_pairs_match_numpy(m, n, k, k_major, cluster_m, cluster_n):
    _check(m, n, k, k_major, Config(**SMALL, cluster_m=cluster_m, cluster_n=cluster_n))


def test_emulated_two_warpgroup_tiles_match_numpy():
    """128x256 tiles (two consumer warpgroups) in pairs along M: B's shared halves are two
    64-column boxes each. (128-row pairs along N: the 128x192 ones below.)"""
    _check(150, 300, 100, False, Config(128, 256, 64, 2, cluster_m=2))


def test_clusters_after_the_first_take_their_own_pairs(monkeypatch):
    """Three clusters on the emulator (the host gives it one): cluster c takes units (pairs,
    or pairs' K parts) c, c + 3, ...; a cluster with no unit left exits without touching
    its peer's barriers."""
    monkeypatch.setattr(matmul_host, "persistent_cluster_grid", lambda *args: 6)
    _check(300, 260, 80, False, Config(**SMALL, cluster_m=2))  # 6 pairs
    _check(70, 200, 80, True, Config(**SMALL, cluster_n=2))    # 1 pair: clusters 1 and 2 idle
    _check(130, 200, 300, False, Config(**SMALL, cluster_m=2, split_k=2, split_reduce="tma"))  # 4 units


@pytest.mark.parametrize("cluster_m, cluster_n, k_major", [(2, 1, False), (1, 2, True), (2, 1, True)])
def test_emulated_192_wide_pairs_match_numpy(cluster_m, cluster_n, k_major):
    """128x192 tiles (two_piece.py: 128- and 64-column pieces) in pairs: along M, B's three
    64-column boxes are shared, rank 0 loading two; along N, A's two halves."""
    _check(200, 500, 100, k_major, Config(128, 192, 64, 2, cluster_m=cluster_m, cluster_n=cluster_n))


@pytest.mark.parametrize("config, k_major", [
    (Config(**SMALL, cluster_m=2, split_k=3, split_reduce="tma"), False),  # parts of 2, 2 and 1 K steps
    (Config(**SMALL, cluster_n=2, split_k=4, split_reduce="tma"), True),   # the last part empty
    (Config(128, 256, 64, 2, cluster_m=2, split_k=2, split_reduce="tma"), True),  # tiles added in halves
])
def test_emulated_split_pairs_match_numpy(config, k_major):
    """Pairs whose K range is cut into parts (long K): both CTAs of a cluster take the same
    part of their own tiles and add them by TMA reduce-add; `finish_split` writes C."""
    _check(150, 200, 300, k_major, config)


@settings(max_examples=4)
@given(m=st.integers(1, 260), n=st.integers(8, 300).map(lambda n: n - n % 8), k=st.integers(8, 160),
       k_major=st.booleans(), along_m=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_emulated_pairs_match_numpy_on_any_shape(m, n, k, k_major, along_m, seed):
    a, b = _operands(m, n, k, k_major, np.random.default_rng(seed))
    config = Config(**SMALL, cluster_m=2 if along_m else 1, cluster_n=1 if along_m else 2)
    out = matmul(a, b, np.float32, config=config)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-3, atol=1e-3)


def test_bad_cluster_configs_say_what_to_change():
    with pytest.raises(ValueError, match="not both"):
        Config(cluster_m=2, cluster_n=2)
    with pytest.raises(ValueError, match="each is 1 or 2"):
        Config(cluster_m=4)
    with pytest.raises(ValueError, match="each is 1 or 2"):
        Config(cluster_n=True)
    with pytest.raises(ValueError, match="split_k=1 or split_reduce='tma'"):
        Config(128, 128, cluster_m=2, split_k=4)
    with pytest.raises(ValueError, match="variant='warp_specialized'"):
        Config(variant="pipelined", cluster_n=2)
    with pytest.raises(ValueError, match="block_n=192 .* split_k=1"):
        Config(128, 192, cluster_n=2, split_k=2, split_reduce="tma")
    with pytest.raises(ValueError, match="stream_k=False"):
        Config(cluster_m=2, stream_k=True)
    with pytest.raises(ValueError, match="block_n must be 128, 192 or 256"):
        Config(128, 64, cluster_m=2)
    assert Config(128, 64, cluster_n=2).cluster_n == 2  # A's halves are whole rows: any width


H200_SMS = 132


@pytest.mark.parametrize("m, n, k", [(1000, 3000, 5000), (1024, 3000, 5120)])
def test_under_two_waves_of_tiles_add_pairs_along_m(m, n, k):
    """Where 128x128 tiles make under two waves (the measured odd-stride shapes), pairs along
    M of the unsplit 128x256 (3 stages) and 128x192 (4) candidates join, after the rest,
    and a 128x256 pair with 4 stages, written half at a time; 16-bit inputs only."""
    candidates = configs_for(16, 16, m, n, k, H200_SMS)
    pairs = [c for c in candidates if c.cluster_m * c.cluster_n > 1]
    assert pairs == [Config(128, 256, 64, 3, group_m=8, cluster_m=2), Config(128, 192, 64, 4, group_m=8, cluster_m=2),
                     Config(128, 256, 64, 4, group_m=8, staged_halves=True, cluster_m=2)]
    assert shared_bytes(pairs[-1], 16, 16) <= SHARED_LIMIT
    assert candidates[-len(pairs):] == pairs
    assert not [c for c in configs_for(8, 16, m, n, k, H200_SMS) if c.cluster_m > 1]
    # fp32 output: the 128x256 pairs' rings and tiles (or halves) pass the shared memory; the
    # 128x192 one fits.
    assert [c for c in configs_for(16, 32, m, n, k, H200_SMS) if c.cluster_m > 1] == [
        Config(128, 192, 64, 3, group_m=8, cluster_m=2)]


@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 11008, 4096), (1, 4096, 4096)])
def test_other_shapes_get_no_pairs(m, n, k):
    assert not [c for c in configs_for(16, 16, m, n, k, H200_SMS) if c.cluster_m * c.cluster_n > 1]
    assert not [c for c in configs_for(16, 16) if c.cluster_m * c.cluster_n > 1]


@pytest.mark.parametrize("m, n, k, parts", [(512, 512, 32768, 8), (768, 1024, 32768, 2)])
def test_long_k_adds_a_split_pair_filling_a_wave_of_clusters(m, n, k, parts):
    """8 pairs of 128x128 tiles x 8 parts = 64 units for about 66 clusters (24 x 2 = 48)."""
    pairs = [c for c in configs_for(16, 16, m, n, k, H200_SMS) if c.cluster_m * c.cluster_n > 1]
    assert pairs == [Config(128, 128, 64, 5, group_m=8, split_k=parts, split_reduce="tma", cluster_m=2)]
    assert -(-m // 256) * -(-n // 128) * parts <= H200_SMS // 2
    assert shared_bytes(pairs[0], 16, 16) <= SHARED_LIMIT


def _signature(in_type, out_type, config, k_major):
    row_in, row_out = 1024 // {"bf16": 16, "fp16": 16}.get(in_type, 8), 1024 // (32 if out_type == "fp32" else 16)
    b_box = [config.block_n // config.cluster_m, config.block_k] if k_major else [config.block_k, min(row_in, config.block_n)]
    return {
        "a_desc": f"tensordesc<{in_type}[{config.block_m // config.cluster_n},{config.block_k}]>",
        "b_desc": f"tensordesc<{in_type}[{b_box[0]},{b_box[1]}]>",
        "c_desc": f"tensordesc<{out_type}[{config.block_m},{min(row_out, config.block_n)}]>",
        "M": "i32", "N": "i32", "K": "i32",
    }


@needs_ptxas
@pytest.mark.parametrize("in_type, config, k_major, shared_boxes", [
    ("bf16", Config(128, 256, 64, 3, cluster_m=2), False, 4),   # B: four 64-column boxes, two each
    ("bf16", Config(128, 256, 64, 3, cluster_n=2), True, 2),    # A: two 64-row halves
    pytest.param("fp8e4m3", Config(128, 256, 128, 3, cluster_m=2), True, 2, marks=pytest.mark.slow),
    # Long K: parts added by TMA into an fp32 workspace, a 128x256 tile in two halves.
    ("bf16", Config(128, 256, 64, 3, cluster_m=2, split_k=4, split_reduce="tma"), True, 2),
])
def test_pairs_assemble_without_spills(in_type, config, k_major, shared_boxes):
    split = dict(SPLIT_K=config.split_k, STAGED_N=staged_columns(config.block_m, config.block_n))
    compiled = cluster_matmul.compile(
        signature=_signature(in_type, "fp32" if config.split_k > 1 else "bf16", config, k_major),
        num_warps=config.num_warps, cluster=(2, 1, 1),
        constexprs=dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                        STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                        NUM_WARPS=config.num_warps, PRODUCER_REGS=config.producer_regs,
                        CLUSTER_M=config.cluster_m, CLUSTER_N=config.cluster_n,
                        **(split if config.split_k > 1 else {})))
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert meta["performance_warnings"] == []  # e.g. wgmma serialized by ptxas
    assert compiled.cluster == (2, 1, 1)
    ptx = compiled.asm["ptx"]
    # Wherever the producer's loop loads a stage: the shared operand's boxes multicast,
    # the CTA's own operand one plain box.
    loads = ptx.count("mbarrier::complete_tx::bytes [")
    assert loads > 0 and ptx.count(".multicast::cluster") == shared_boxes * loads
    # Slots go back to the peer at CTA scope (read by wgmmas already waited for), warp by
    # warp: no named barrier in the consumer's K loop, which syncs only to store C.
    assert "mbarrier.arrive.shared::cluster.b64" in ptx and "arrive.release.cluster" not in ptx
    assert ptx.count("bar.sync \t1, 256;") == 2 * (1 + (config.split_k > 1))  # split: each half's add
    assert ptx.count("barrier.cluster.arrive") == 2  # after the inits, before the end


@needs_ptxas
@pytest.mark.parametrize("cluster_m, cluster_n, k_major", [(2, 1, False), (1, 2, True)])
def test_192_wide_pairs_assemble_without_spills(cluster_m, cluster_n, k_major):
    config = Config(128, 192, 64, 4, group_m=8, cluster_m=cluster_m, cluster_n=cluster_n)
    b_box = [64, 64]  # two_piece.py's B boxes: 64 columns (or rows of B^T) in both layouts
    compiled = two_piece_matmul.compile(
        signature={"a_desc": f"tensordesc<bf16[{128 // cluster_n},64]>", "b_desc": f"tensordesc<bf16[{b_box[0]},{b_box[1]}]>",
                   "c_desc": "tensordesc<bf16[128,64]>", "M": "i32", "N": "i32", "K": "i32"},
        num_warps=8, cluster=(2, 1, 1),
        constexprs=dict(BLOCK_M=128, BLOCK_N=192, BLOCK_K=64, STAGES=config.stages, GROUP_M=8, B_K_MAJOR=k_major,
                        NUM_WARPS=8, PRODUCER_REGS=config.producer_regs, CLUSTER_M=cluster_m, CLUSTER_N=cluster_n))
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert meta["performance_warnings"] == []
    ptx = compiled.asm["ptx"]
    # Per stage load: along M, A's one box own and B's three shared; along N, A's two halves
    # shared and B's three boxes own.
    own, shared = (1, 3) if cluster_m == 2 else (3, 2)
    stage_loads = ptx.count("mbarrier::complete_tx::bytes [") // own
    assert stage_loads > 0 and ptx.count(".multicast::cluster") == shared * stage_loads
    assert "mbarrier.arrive.shared::cluster.b64" in ptx and ptx.count("barrier.cluster.arrive") == 2


# ------------------------------------------------------------------ on the H200
@pytest.mark.gpu
@pytest.mark.parametrize("cluster_m, cluster_n", [(2, 1), (1, 2)])
@pytest.mark.parametrize("block_n, stages", [(256, 3), (192, 4), (128, 4)])
@pytest.mark.parametrize("m, n, k, layout", [(1000, 3000, 5000, "kn"), (1000, 3000, 5000, "nk"),
                                             (333, 2047, 1999, "nk"), (4096, 4096, 4096, "kn"),
                                             (200, 136, 72, "kn")])
def test_gpu_pairs_match_torch(m, n, k, layout, block_n, stages, cluster_m, cluster_n):
    config = Config(128, block_n, 64, stages, group_m=8, cluster_m=cluster_m, cluster_n=cluster_n)
    check_bf16_matmul_on_gpu(m, n, k, layout, config, seed=m * n + k)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster_m, cluster_n", [(2, 1), (1, 2)])
@pytest.mark.parametrize("m, n, k, layout", [(512, 512, 32768, "kn"), (768, 1000, 20000, "nk")])
def test_gpu_split_pairs_match_torch(m, n, k, layout, cluster_m, cluster_n):
    """The second call reuses the workspace the first left zeroed."""
    config = Config(128, 128, 64, 5, group_m=8, split_k=8, split_reduce="tma", cluster_m=cluster_m,
                    cluster_n=cluster_n)
    check_bf16_matmul_on_gpu(m, n, k, layout, config, seed=m + k)
