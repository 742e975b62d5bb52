"""kernels/attention: the forward configs' validation with readable errors (a type per
kernel variant: PingpongConfig, SimpleConfig), and the defaults chosen per head dim and
problem (clusters, tile groups, conditional rescale, lazy max, stages, claim-ahead,
per-warp release, replicated consumers, half key tiles)."""

import dataclasses

import numpy as np
import pytest

from weft.kernels.attention import ForwardConfig, PingpongConfig, SimpleConfig, default_config, flash_attention
from weft.kernels.attention.config import register_cap, shared_bytes, shared_limit
from weft.kernels.attention.pingpong_config import (buffering, claim_ahead, cluster_size, half_tiles, lazy_max,
                                                    per_warp_release, replicated, rescale_above, tile_group)
from weft.kernels.attention.rings import ready_barriers

RNG = np.random.default_rng(11)


def test_cluster_size():
    """Pairs of CTAs share K/V (PingpongConfig.cluster) by default where they can: non-causal
    head_dim 128 and 256, an even count of query tiles per head, one head at a time, the
    persistent pingpong kernel; elsewhere the default is one CTA, and an explicit 2 is an
    error that says why."""
    chosen = default_config(128)
    paired = dataclasses.replace(chosen, cluster=2)
    assert chosen.cluster is None and default_config(256).cluster is None
    assert cluster_size(chosen, False, 32, 1) == cluster_size(paired, False, 32, 1) == 2
    assert cluster_size(default_config(256), False, 8, 1) == 2
    assert cluster_size(dataclasses.replace(chosen, cluster=1), False, 32, 1) == 1
    assert cluster_size(default_config(64), False, 32, 1) == 1
    assert cluster_size(dataclasses.replace(chosen, persistent=False), False, 32, 1) == 1
    for args, why in [((True, 32, 1), "causal"), ((False, 7, 1), "count even"),
                      ((False, 32, 4), "one head at a time")]:
        assert cluster_size(chosen, *args) == 1
        with pytest.raises(ValueError, match=why):
            cluster_size(paired, *args)
    with pytest.raises(ValueError, match="None .2 where it applies., 1 or 2"):
        PingpongConfig(cluster=4)
    with pytest.raises(ValueError, match="head_dim 128 or 256"):
        PingpongConfig(head_dim=64, cluster=2)
    with pytest.raises(ValueError, match="needs persistent=True"):
        PingpongConfig(persistent=False, cluster=2)
    q = RNG.standard_normal((1, 2, 384, 128)).astype(np.float16)
    with pytest.raises(ValueError, match="count even"):
        flash_attention(q, q, q, config=paired)  # three query tiles a head


def test_configs_validate_with_readable_errors():
    for head_dim in (64, 128, 256):
        assert default_config(head_dim).head_dim == head_dim
    with pytest.raises(ValueError, match="head_dim must be one of"):
        PingpongConfig(head_dim=96)
    with pytest.raises(ValueError, match="consumers .warpgroups of 64 query rows. must be 1 to 4"):
        PingpongConfig(consumers=5)
    with pytest.raises(ValueError, match="shared memory"):
        PingpongConfig(head_dim=256, block_n=128)
    with pytest.raises(ValueError, match="lower consumer_regs to 160"):
        PingpongConfig(head_dim=64, consumers=3)
    with pytest.raises(ValueError, match="replicated must be None"):
        PingpongConfig(replicated="yes")
    with pytest.raises(ValueError, match="per_warp_release must be None"):
        PingpongConfig(per_warp_release=1)
    with pytest.raises(ValueError, match="release warp by warp"):
        PingpongConfig(replicated=True, per_warp_release=False)

    with pytest.raises(ValueError, match="multiple of 8"):
        PingpongConfig(consumer_regs=236)
    with pytest.raises(ValueError, match="stages"):
        PingpongConfig(stages=1)
    with pytest.raises(ValueError, match="l2_group_bytes must be None or a positive int"):
        PingpongConfig(l2_group_bytes=0)
    with pytest.raises(ValueError, match="persistent must be True or False"):
        PingpongConfig(persistent="yes")
    with pytest.raises(ValueError, match=r"q_buffers must be None \(as many as fit\) or a count from "
                                         r"consumers = 2 to 4"):
        PingpongConfig(q_buffers=5)
    with pytest.raises(ValueError, match="with 4 Q buffers; a CTA has 232448"):
        PingpongConfig(head_dim=256, block_n=64, q_buffers=4)
    with pytest.raises(ValueError, match=r"exp2_fma_share must be a number in \[0, 1\]"):
        PingpongConfig(exp2_fma_share=2)
    for bad in (-1.0, 16, True, "8", None):
        with pytest.raises(ValueError, match=r"rescale_above must be a number in \[0, 15\] \(log2 units"):
            PingpongConfig(rescale_above=bad)
    with pytest.raises(ValueError, match="conditional_rescale must be None"):
        PingpongConfig(conditional_rescale=1)
    with pytest.raises(ValueError, match="lazy_max must be None"):
        PingpongConfig(lazy_max="yes")
    with pytest.raises(ValueError, match="lazy_max rescales O only where the max moves: it needs "
                                         "conditional_rescale None or True"):
        PingpongConfig(conditional_rescale=False, lazy_max=True)
    with pytest.raises(ValueError, match=r"lazy_max needs rescale_above above log2\(block_n\) = 7"):
        PingpongConfig(rescale_above=7, lazy_max=True)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="claim_ahead must be None .* or a count of K/V loads >= 0"):
            PingpongConfig(claim_ahead=bad)
    with pytest.raises(ValueError, match="half_tiles must be None"):
        PingpongConfig(half_tiles=1)


def test_tile_groups_by_default():
    """Non-causal at head_dim 128 and 256: one head per group (its query tiles side by
    side); otherwise heads whose K/V fill 24 MB (8 MB for causal head_dim 256), or the
    PingpongConfig's bytes, within bounds."""
    mb = 1 << 20
    assert tile_group(default_config(128), False, 2 * mb, 64) == 1
    assert tile_group(default_config(256), False, 2 * mb, 64) == 1
    assert tile_group(default_config(128), True, 2 * mb, 64) == 12
    assert tile_group(default_config(256), True, 2 * mb, 64) == 4  # 8 MB groups
    assert tile_group(default_config(64), False, 2 * mb, 64) == 12
    assert tile_group(default_config(64), False, 2 * mb, 5) == 5  # no more than there are
    assert tile_group(default_config(64), False, 30 * mb, 64) == 1  # at least one
    assert tile_group(PingpongConfig(l2_group_bytes=8 * mb), False, 2 * mb, 64) == 4


def test_conditional_rescale_by_default():
    assert rescale_above(default_config(256)) == 8.0
    assert rescale_above(default_config(128)) == 8.0  # lazy_max, which rescales conditionally
    assert rescale_above(default_config(64)) == 8.0
    assert rescale_above(PingpongConfig(head_dim=64, lazy_max=False)) is None
    assert rescale_above(PingpongConfig(head_dim=128, conditional_rescale=True, rescale_above=4)) == 4.0
    assert rescale_above(PingpongConfig(head_dim=128, conditional_rescale=False)) is None
    assert rescale_above(PingpongConfig(head_dim=256, block_n=64, conditional_rescale=False)) is None


def test_lazy_max_by_default():
    """On at head_dim 64 and 128; off at 256 (+1 to +2% there, and 8 bytes spilled with
    one tile's Q buffers) and where a PingpongConfig rules it out, rather than an error."""
    for head_dim in (64, 128):
        assert lazy_max(default_config(head_dim)) and lazy_max(default_config(head_dim, causal=True))
    assert not lazy_max(default_config(256)) and lazy_max(dataclasses.replace(default_config(256), lazy_max=True))
    assert lazy_max(PingpongConfig(head_dim=64, block_n=64, lazy_max=True))
    assert not lazy_max(PingpongConfig(head_dim=128, conditional_rescale=False))
    assert not lazy_max(PingpongConfig(head_dim=128, rescale_above=7))  # a row of 128 keys may sum to 2^7
    assert not lazy_max(PingpongConfig(head_dim=128, lazy_max=False))


def test_kv_stages_of_head_dim_64():
    """default_config per problem at head_dim 64: four K/V stages non-causal, three causal
    up to 2048 keys, two causal beyond (and without the problem's lengths); two at 128
    and 256."""
    assert default_config(64, True, 512).stages == default_config(64, True, 2048).stages == 3
    assert default_config(64, True, 4096).stages == default_config(64, True).stages == 2
    assert default_config(64).stages == default_config(64, False, 512).stages == 4
    assert default_config(128, True, 512).stages == default_config(128).stages == 2
    assert default_config(256, True, 512).stages == 2


def test_four_consumers_by_default():
    """Non-causal head_dim 64 with at most 1024 keys runs 256-row tiles: four consumer
    warpgroups of 64-key tiles at 112 registers (what 640 threads get at launch), one
    replicated copy of the code; more keys, or causal, three. 120 registers is an error
    that names the most."""
    four = default_config(64, False, 512)
    assert (four.consumers, four.block_n, four.consumer_regs, four.replicated, four.block_m) == (4, 64, 112, True, 256)
    assert default_config(64, False, 1024).consumers == 4
    assert default_config(64, False, 1025).consumers == default_config(64, True, 512).consumers == 3
    assert default_config(64).consumers == 3 and default_config(128, False, 512).consumers == 2
    with pytest.raises(ValueError, match="a CTA of 640 threads gets 61440; lower consumer_regs to 112"):
        PingpongConfig(head_dim=64, block_n=64, consumers=4, consumer_regs=120)
    with pytest.raises(ValueError, match=r"SimpleConfig.consumers \(warpgroups of 64 query rows\) must be 1 to 2"):
        SimpleConfig(head_dim=64, consumers=4, consumer_regs=112)


def test_several_ctas_an_sm_for_one_key_tile():
    """head_dim 64 with at most 64 keys runs three CTAs an SM of one consumer warpgroup each
    (causal or not): a CTA gets a third of the registers (80 a thread of 256 at launch, so
    136 for the consumer beside a 24-register producer) and of the shared memory; head_dim
    128 two (232 registers), 256 one."""
    one = default_config(64, False, 64)
    assert (one.consumers, one.ctas_per_sm, one.consumer_regs, one.block_n, one.stages) == (1, 3, 136, 64, 3)
    assert default_config(64, True, 64) == one and default_config(64, False, 65).consumers == 4
    assert default_config(64, True, 65).ctas_per_sm == default_config(64).ctas_per_sm == 1
    two = default_config(128, True, 64)
    assert (two.consumers, two.ctas_per_sm, two.consumer_regs, two.block_n) == (1, 2, 232, 64)
    assert default_config(128, False, 64) == two and default_config(128, False, 65).ctas_per_sm == 1
    assert default_config(256, False, 64).ctas_per_sm == 1 and register_cap(two) == 128
    assert register_cap(one) == 80 and register_cap(default_config(64)) == 128
    assert shared_limit(one) == 228 * 1024 // 3 - 1024 and shared_limit(default_config(64)) == 227 * 1024
    assert buffering(one) == (True, 2)  # O's buffer and two Q buffers in its 75 KB
    for bad in (0, 5, True, "2"):
        with pytest.raises(ValueError, match="ctas_per_sm must be an int from 1 to 4"):
            PingpongConfig(ctas_per_sm=bad)
    with pytest.raises(ValueError, match="ctas_per_sm above 1 needs cluster 1"):
        PingpongConfig(cluster=2, ctas_per_sm=2)
    with pytest.raises(ValueError, match="gets 20480 with 3 CTAs an SM; lower consumer_regs to 136"):
        PingpongConfig(head_dim=64, block_n=64, consumers=1, consumer_regs=144, ctas_per_sm=3)
    with pytest.raises(ValueError, match="a CTA has 76800. Use a smaller block_n or fewer stages .or fewer CTAs"):
        PingpongConfig(head_dim=64, block_n=128, stages=3, consumers=1, consumer_regs=136, ctas_per_sm=3)
    two = PingpongConfig(head_dim=128, block_n=64, consumers=1, consumer_regs=232, ctas_per_sm=2)
    assert cluster_size(two, False, 32, 1) == 1  # clusters of two launch one CTA an SM


def test_half_tiles_by_default():
    """Causal attention with 128-key tiles (head_dim 64 and 128) takes the last key tile
    of a warpgroup as half a tile where its rows see only the first half; not with 64-key
    tiles (head_dim 256, whose diagonal tiles each row sees part of), nor non-causal,
    unless the config says so."""
    assert half_tiles(default_config(64), True) and half_tiles(default_config(128), True)
    assert not half_tiles(default_config(256), True)
    assert not half_tiles(default_config(64), False) and not half_tiles(default_config(128), False)
    assert half_tiles(PingpongConfig(head_dim=128, half_tiles=True), False)
    assert not half_tiles(PingpongConfig(head_dim=64, half_tiles=False), True)


def test_q_ready_barriers_are_one_warpgroups_each():
    """A ring whose positions go to its readers in turn has lcm(slots, readers) ready
    barriers, so no barrier is waited on by two readers (rings.ready_barriers); shared
    memory counts them."""
    assert ready_barriers(3, 2) == 6 and ready_barriers(6, 3) == 6 and ready_barriers(4, 2) == 4
    config = default_config(256)
    assert shared_bytes(config, q_buffers=3) - shared_bytes(config, q_buffers=2) == \
        64 * 256 * 2 + 8 * (6 - 2) + 8 * (3 - 2) + 4 * 4 * (3 - 2)


def test_claim_ahead_by_default():
    assert claim_ahead(default_config(64)) == 2
    assert claim_ahead(default_config(128)) == claim_ahead(default_config(256)) == 0
    assert claim_ahead(PingpongConfig(head_dim=128, claim_ahead=3)) == 3


def test_per_warp_release_by_default():
    """Replicated consumers always release warp by warp; others at head_dim 128 only,
    unless the config says otherwise."""
    assert per_warp_release(default_config(128), False) and per_warp_release(default_config(64), True)
    assert not per_warp_release(default_config(64), False) and not per_warp_release(default_config(256), False)
    assert not per_warp_release(PingpongConfig(head_dim=128, per_warp_release=False), False)
    assert per_warp_release(PingpongConfig(head_dim=256, block_n=64, per_warp_release=True), False)


def test_replicated_consumers_by_default():
    """One copy of the consumer code for causal head_dim 64, and causal head_dim 128 up
    to 4096 keys (measured faster there), a partition per warpgroup elsewhere."""
    assert all(replicated(default_config(64), True, seq) for seq in (128, 4096, 16384))
    assert replicated(default_config(128), True, 4096) and not replicated(default_config(128), True, 4097)
    assert not any(replicated(default_config(d), False, 512) for d in (64, 128, 256))
    assert not replicated(default_config(256), True, 512)
    assert replicated(PingpongConfig(head_dim=256, block_n=64, replicated=True), False, 16384)
    assert not replicated(PingpongConfig(head_dim=64, replicated=False), True, 512)


def test_a_config_type_per_variant():
    """Each kernel variant has its own config type, with only its own knobs: a knob of the
    FA3 kernel's is no SimpleConfig field (the type error names it), the shared part
    alone is no config, both validate the knobs they share alike, and flash_attention
    takes nothing else."""
    simple = SimpleConfig(head_dim=64)
    assert simple.block_m == 128 and simple.ctas_per_sm == 1 and isinstance(simple, ForwardConfig)
    assert simple != PingpongConfig(head_dim=64)  # the same shared knobs, another kernel
    for knob in ("per_warp_release", "lazy_max", "half_tiles", "exp2_fma_share", "ctas_per_sm", "cluster"):
        with pytest.raises(TypeError, match=knob):
            SimpleConfig(head_dim=64, **{knob: 1})
    with pytest.raises(TypeError, match="construct one of those"):
        ForwardConfig()
    for kind in (SimpleConfig, PingpongConfig):
        with pytest.raises(ValueError, match=f"{kind.__name__}.stages must be 2..4"):
            kind(stages=5)
        with pytest.raises(ValueError, match=f"{kind.__name__}.head_dim must be one of"):
            kind(head_dim=32)
        with pytest.raises(ValueError, match="shared memory"):
            kind(head_dim=256, block_n=128)
    q = RNG.standard_normal((1, 1, 64, 64)).astype(np.float16)
    with pytest.raises(TypeError, match="config must be a PingpongConfig or a SimpleConfig"):
        flash_attention(q, q, q, config={"block_n": 64})
