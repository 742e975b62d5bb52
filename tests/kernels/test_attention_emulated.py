"""kernels/attention: small cases on the CPU emulator against the float64 numpy reference
(masks, GQA, tails, configs, persistent CTAs, clusters, conditional rescale and lazy max),
the order of query tiles, the reference itself, and the promised errors."""

import dataclasses
import math

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.kernels.attention import PingpongConfig, SimpleConfig, default_config, flash_attention, reference_attention
from weft.kernels.attention.pingpong_config import buffering
from weft.kernels.attention.tiles import tile_coordinates

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("head_dim, seq_q, seq_k", [(128, 256, 300), (256, 200, 130)])
def test_emulated_clusters_match_the_reference(head_dim, seq_q, seq_k):
    """PingpongConfig.cluster=2 on the emulator: one cluster of two CTAs walks the pairs of query
    tiles (two heads, so the ring runs on from one pair to the next), each CTA loading
    half of every K/V tile into both; GQA, a key tail and a partial second query tile."""
    q = RNG.standard_normal((1, 4, seq_q, head_dim)).astype(np.float16)
    k, v = (RNG.standard_normal((1, 2, seq_k, head_dim)).astype(np.float16) for _ in range(2))
    config = dataclasses.replace(default_config(head_dim), cluster=2)
    out, lse = flash_attention(q, k, v, return_lse=True, config=config)
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= 2e-2 * np.abs(ref).max()
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-4)


def _inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout="bhsd", rng=RNG):
    """Random q, k, v; a test that checks a property of its inputs passes an rng of its
    own, so that the check does not depend on the order tests draw from RNG."""
    def shape(h, s):
        return (batch, h, s, head_dim) if layout == "bhsd" else (batch, s, h, head_dim)
    q = rng.standard_normal(shape(heads, seq_q)).astype(np.float16)
    k = rng.standard_normal(shape(kv_heads, seq_k)).astype(np.float16)
    v = rng.standard_normal(shape(kv_heads, seq_k)).astype(np.float16)
    return q, k, v


EMULATED = [
    # (batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout)
    (1, 2, 2, 70, 70, 64, False, "bhsd"),
    (1, 2, 2, 200, 200, 64, True, "bhsd"),
    (1, 1, 1, 400, 400, 64, True, "bhsd"),      # warpgroups skip key tiles others of the CTA see
    (1, 4, 2, 130, 200, 64, True, "bhsd"),      # GQA, seq_q < seq_k
    (1, 2, 1, 300, 70, 64, True, "bhsd"),       # MQA, seq_q > seq_k: rows that see no key
    (2, 2, 2, 150, 100, 128, False, "bshd"),
    (1, 2, 2, 100, 140, 256, True, "bhsd"),
]


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout", EMULATED)
def test_emulated_attention_matches_numpy(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout):
    _check_emulated(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout)


def _check_emulated(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, config=None):
    q, k, v = _inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, layout=layout, config=config)
    ref, ref_lse = reference_attention(q, k, v, causal=causal, return_lse=True, layout=layout)
    assert out.shape == q.shape and out.dtype == np.float16 and lse.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-2)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("config", [PingpongConfig(head_dim=64, block_n=64, consumers=3, consumer_regs=160),
                                    PingpongConfig(head_dim=64),  # 2 consumer warpgroups
                                    PingpongConfig(head_dim=64, block_n=32, stages=3, consumers=1),
                                    PingpongConfig(head_dim=64, consumers=3, consumer_regs=160, exp2_fma_share=0.25),
                                    SimpleConfig(head_dim=64)])
def test_emulated_other_configs(config):
    _check_emulated(1, 2, 1, 200, 150, 64, True, "bhsd", config)


@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("replicated", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_replicated_consumers(causal, replicated, consumers):
    """The consumer warpgroups as one replicated partition (each copy finds its rows,
    turn and Q buffer from its index at run time) or a partition each, whichever the
    host picks by default for that mask or not, over persistent tiles with tails."""
    config = PingpongConfig(head_dim=64, consumers=consumers, consumer_regs=240 if consumers == 2 else 160,
                    replicated=replicated)
    _check_emulated(1, 2, 1, 300, 250, 64, causal, "bhsd", config)


@pytest.mark.parametrize("half_tiles", [False, True])
@pytest.mark.parametrize("head_dim, seq_q, seq_k, causal", [
    (64, 400, 400, True),    # rows from 0, 128, 256, 384: no row sees its diagonal tile's second half
    (64, 130, 250, True),    # seq_q < seq_k: the diagonals shift by 120 keys
    (128, 150, 190, False),  # the last key tile holds 62 keys
    (64, 70, 60, False),     # one key tile, of 60 keys: taken whole
])
def test_emulated_half_key_tiles(head_dim, seq_q, seq_k, causal, half_tiles):
    """PingpongConfig.half_tiles: a warpgroup's last key tile, where none of its rows sees the
    tile's second half, taken as a GEMM of half the keys (its mask's columns and the V
    rows of its P V halved too); right against float64 either way."""
    config = dataclasses.replace(default_config(head_dim), half_tiles=half_tiles)
    _check_emulated(1, 2, 1, seq_q, seq_k, head_dim, causal, "bhsd", config)


@pytest.mark.parametrize("per_warp", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_per_warp_release(causal, per_warp):
    """Partitions per warpgroup releasing ring slots and turns warp by warp (the barriers
    count four arrivals a warpgroup) or once after a named barrier, over persistent tiles
    with tails and warpgroups that skip key tiles."""
    config = PingpongConfig(head_dim=64, consumers=3, consumer_regs=160, replicated=False, per_warp_release=per_warp)
    _check_emulated(1, 2, 1, 300, 250, 64, causal, "bhsd", config)


def _jumping_scores(q, k, rows, key, gain=3.0):
    """Key `key` of every head made `gain` times the first of `rows`' query, so those rows'
    max jumps far past 2^8 at that key tile (log2 units: about gain * head_dim / sqrt(head_dim)
    * 1.44), while other rows' grows by less than 8."""
    k = k.copy()
    k[:, :, key, :] = (gain * q[:, : k.shape[1], rows[0], :].astype(np.float32)).astype(k.dtype)
    return k


@pytest.mark.parametrize("threshold", [None, 0.0, 8.0])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_conditional_rescale(causal, threshold):
    """O rescaled only in warps where some row's max grew past rescale_above
    (PingpongConfig.conditional_rescale): one row's max jumps by ~2^35 at key 200, a tile after the
    first, where only its warp must rescale; the others keep their max. Right either way,
    and not bitwise the result of rescaling at every step (the skipped path ran)."""
    q, k, v = _inputs(1, 2, 2, 300, 280, 64, rng=np.random.default_rng(5))
    k = _jumping_scores(q, k, [250], 200)
    config = PingpongConfig(head_dim=64, consumers=3, consumer_regs=160, conditional_rescale=threshold is not None,
                    rescale_above=threshold or 0.0)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
    ref, ref_lse = reference_attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)
    assert abs(ref_lse[0, 0, 250] - ref_lse[0, 0, 249]) > 10  # the jump is there
    if threshold == 8.0:
        always = flash_attention(q, k, v, causal=causal, config=PingpongConfig(
            head_dim=64, consumers=3, consumer_regs=160, conditional_rescale=False))
        assert not np.array_equal(out, always)


@pytest.mark.parametrize("head_dim, block_n", [(64, 64), (64, 128), (128, 128), (256, 64)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gain", [0.0, pytest.param(3.0, marks=pytest.mark.slow), 40.0])  # 3.0: slow set (CI time)
def test_emulated_lazy_max(head_dim, block_n, causal, gain):
    """PingpongConfig.lazy_max: P against the last tiles' max, moved by the log2 of their sums in
    warps whose row sums pass 2^8. gain 0: no row's max jumps; 3: a row's max jumps far
    past 2^8 at a later key tile (non-causal: an unmasked one); 40: past 2^128, so its P
    overflows to inf and its warp computes its rows of S again (mma_v2). Each right against float64."""
    q, k, v = _inputs(1, 2, 1, 200, 300, head_dim, rng=np.random.default_rng(head_dim))
    if gain:
        k = _jumping_scores(q, k, [150], 240, gain)  # key 240: seen by row 150 when causal too
    config = PingpongConfig(head_dim=head_dim, block_n=block_n, lazy_max=True,
                    **({"consumers": 3, "consumer_regs": 160} if head_dim == 64 else {}))
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
    ref, ref_lse = reference_attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)
    if gain:  # row 150's scores jump at key 240 past those of the key tile before (natural log)
        row = q[0, 0, 150].astype(np.float64) @ k[0, 0].astype(np.float64).T / math.sqrt(head_dim)
        assert row[240] - row[:128].max() > (10 if gain == 3.0 else 100)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_emulated_lazy_max_jumps_near_the_exponent_limit(head_dim):
    """Rows whose scores jump at an unmasked key tile by 100, 124, 127, 127.9 (P finite
    but past 2^126, so a rescale by the whole jump would flush to 0), 129 and 200 (P
    overflows: its warp computes its rows of S again) log2 units over the max of the tile
    before, the other rows' scores small; right against float64 (the emulator flushes
    exp2's denormal results as the GPU does)."""
    q, k, v = _inputs(1, 1, 1, 200, 300, head_dim)
    q, k = (0.3 * x.astype(np.float32) for x in (q, k))
    scale = 1.0 / math.sqrt(head_dim)
    for i, jump in enumerate([100.0, 124.0, 127.0, 127.9, 129.0, 200.0]):
        row, key = 10 + 30 * i, 140 + 10 * i
        gain = jump / (float(q[0, 0, row] @ q[0, 0, row]) * scale * math.log2(math.e))
        k[0, 0, key] = gain * q[0, 0, row]
    q, k = q.astype(np.float16), k.astype(np.float16)
    out, lse = flash_attention(q, k, v, return_lse=True, config=default_config(head_dim))
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_emulated_lazy_max_row_sum_past_the_exponent_limit(head_dim):
    """A row whose scores jump by 127.5 log2 units at two keys of one key tile held by
    different threads of its quad (columns 8 j + 2 t: keys 140 and 142): each P and each
    thread's share of the row sum is finite, the row's sum, 2^128.5, is not (the vote
    reads the shares, and the sum moves the max by at most softmax.SHIFT_LIMIT). Right
    against float64."""
    q, k, v = _inputs(1, 1, 1, 200, 300, head_dim)
    q, k = (0.3 * x.astype(np.float32) for x in (q, k))
    scale = 1.0 / math.sqrt(head_dim)
    row = 50
    for key in (140, 142):
        k[0, 0, key] = 127.5 / (float(q[0, 0, row] @ q[0, 0, row]) * scale * math.log2(math.e)) * q[0, 0, row]
    q, k = q.astype(np.float16), k.astype(np.float16)
    out, lse = flash_attention(q, k, v, return_lse=True, config=default_config(head_dim))
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)
    scores = q[0, 0, row].astype(np.float64) @ k[0, 0].astype(np.float64).T * scale * math.log2(math.e)
    assert 127 < scores[[140, 142]].min() - scores[:128].max() < 128  # each P finite, their sum not


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_emulated_first_key_tile_max_past_its_first_keys(head_dim, causal):
    """A row's first key tile takes P against the max of its first 32 keys only
    (softmax.first_keys_max): rows whose max in that tile lies past them, by 20, 60, 129
    (P overflows to inf) and 200 log2 units, move to the exact max (max_where_grew);
    right against float64, and the jumps are there. Causal rows from 130 on see all of key
    tile 0 unmasked. (Inputs of their own, so that the check does not depend on the
    order tests draw from RNG.)"""
    rng = np.random.default_rng(head_dim + causal)
    q, k, v = (rng.standard_normal((1, 1, n, head_dim)).astype(np.float32) for n in (250, 300, 300))
    q, k = 0.3 * q, 0.3 * k
    scale = 1.0 / math.sqrt(head_dim)
    jumps = [(130, 40, 20.0), (160, 64, 60.0), (190, 100, 129.0), (220, 127, 200.0)]
    for row, key, jump in jumps:
        k[0, 0, key] = jump / (float(q[0, 0, row] @ q[0, 0, row]) * scale * math.log2(math.e)) * q[0, 0, row]
    q, k, v = q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=default_config(head_dim))
    ref, ref_lse = reference_attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=1e-2)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)
    for row, key, jump in jumps:  # past 2^8 over the first 32 keys: those rows move their max
        scores = q[0, 0, row].astype(np.float64) @ k[0, 0, :128].astype(np.float64).T * scale * math.log2(math.e)
        assert scores[key] - scores[:32].max() > 8


@pytest.mark.parametrize("q_buffers", [2, 3, 4])
@pytest.mark.parametrize("ctas", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_persistent_ctas_walk_every_tile(monkeypatch, causal, ctas, q_buffers):
    """1 or 4 CTAs over 6 tiles of different lengths (GQA, tails), claiming tiles from the
    counter (the emulator runs CTAs one after another: the first takes every tile the
    others have not started): the K/V ring's slots and phases, the Q ring's (one tile's
    buffers, a spare, two tiles') and the warpgroups' turns run on from tile to tile."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", ctas)
    config = PingpongConfig(head_dim=64, block_n=64, stages=3, persistent=True, q_buffers=q_buffers)
    _check_emulated(1, 3, 1, 200, 230, 64, causal, "bhsd", config)


@pytest.mark.parametrize("ctas", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_static_schedule_walks_every_tile(monkeypatch, causal, ctas):
    """PingpongConfig.dynamic_schedule=False: CTA i takes tiles i, i + ctas, ... (no counter), over
    6 tiles of different lengths with GQA and tails; the rings and turns run on as with
    claimed tiles."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", ctas)
    config = PingpongConfig(head_dim=64, block_n=64, stages=3, persistent=True, dynamic_schedule=False)
    _check_emulated(1, 3, 1, 200, 230, 64, causal, "bhsd", config)


@pytest.mark.parametrize("ctas", [1, 2])
@pytest.mark.parametrize("seq_q", [200, 330])
def test_emulated_turns_skip_warpgroups_without_rows(monkeypatch, seq_q, ctas):
    """Non-causal 192-row tiles (three consumer warpgroups) whose last tile has rows for
    one (seq_q 200) or two (330) of them: the turn goes round those alone
    (kernels.turn_takers), and each warpgroup counts its own turns, so that the tiles of
    the next heads, which all three take, find every turn barrier in its phase (tile
    groups of one head: a CTA walks a head's tiles, the partial one, then the next head's)."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", ctas)
    config = dataclasses.replace(default_config(64), l2_group_bytes=1)
    _check_emulated(1, 3, 1, seq_q, 300, 64, False, "bhsd", config)  # 3 key tiles: an odd count


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_emulated_causal_tiles_claimed_ahead(monkeypatch, ahead):
    """PingpongConfig.claim_ahead: the producer claims its next causal tile before the last
    `ahead` K/V loads of one (0: after all of them; 3: before them all, for these tiles
    of at most 4 key tiles), over 4 CTAs of 6 tiles."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", 4)
    config = PingpongConfig(head_dim=64, block_n=64, stages=3, persistent=True, claim_ahead=ahead)
    _check_emulated(1, 3, 1, 200, 230, 64, True, "bhsd", config)


@pytest.mark.parametrize("causal", [False, True])
def test_emulated_head_dim_256_q_ring(causal):
    """head_dim 256's persistent CTA: O leaves through the Q buffers, three of them for
    two warpgroups, so a warpgroup's next Q lands where the other stored its last O."""
    assert buffering(default_config(256)) == (False, 3)
    _check_emulated(1, 2, 1, 300, 260, 256, causal, "bhsd", default_config(256))


@pytest.mark.parametrize("shuffle", [None, 0, 1])
@pytest.mark.parametrize("head_dim, causal, seq_q, seq_k, q_buffers", [
    (256, True, 300, 230, None),   # three Q buffers for two warpgroups; rows 0-69 see no key
    (64, True, 300, 200, 4),       # four Q buffers for three warpgroups
    (64, False, 330, 230, None),   # partial tiles: a warpgroup without rows
    (128, False, 150, 300, 3),     # three Q buffers for two warpgroups
])
def test_emulated_persistent_ctas_with_loads_landing_in_any_order(monkeypatch, head_dim, causal, seq_q, seq_k,
                                                                  q_buffers, shuffle):
    """Two persistent CTAs over tiles of different lengths, TMA loads landing oldest first
    or (WEFT_EMULATE_SHUFFLE) in an order drawn from a seed. Where the Q ring's buffers do
    not divide among the warpgroups, each buffer serves them in turn; with a `ready`
    barrier per buffer, a warpgroup that ran ahead (causal tiles whose rows see no key
    load no K/V and take no turns) passed its wait on the phase two back and wrote O into
    a buffer another warpgroup's Q was still landing in. The barriers are now one
    warpgroup's each (rings.ready_barriers)."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", 2)
    if shuffle is not None:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    config = dataclasses.replace(default_config(head_dim, causal, seq_k), q_buffers=q_buffers)
    _check_emulated(1, 3, 1, seq_q, seq_k, head_dim, causal, "bhsd", config)


@pytest.mark.parametrize("shuffle", [None, 7])
@pytest.mark.parametrize("replicated", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_four_consumer_warpgroups(monkeypatch, causal, replicated, shuffle):
    """256-row tiles of four consumer warpgroups and 64-key tiles (the default for
    non-causal head_dim 64 up to 1024 keys; causal too, when asked), one replicated copy
    or a partition each, on two persistent CTAs over tiles with rows for four, three and
    fewer warpgroups (GQA, key tails), TMA loads landing oldest first or shuffled."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", 2)
    if shuffle is not None:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    config = dataclasses.replace(default_config(64, False, 512), replicated=replicated)
    _check_emulated(1, 3, 1, 500, 300, 64, causal, "bhsd", config)


@pytest.mark.parametrize("heads_per_group", [1, 3])
def test_emulated_tile_groups(heads_per_group):
    """Tiles in L2 groups of 1 or 3 (batch, head) pairs, the last group short."""
    kv_bytes_per_query_head = 2 * 100 * 64 * 2 // 2  # K and V, 100 keys, shared by 2 heads
    config = PingpongConfig(head_dim=64, consumers=3, consumer_regs=160,
                    l2_group_bytes=heads_per_group * kv_bytes_per_query_head)
    _check_emulated(2, 4, 2, 300, 100, 64, False, "bhsd", config)


@ll.aggregate
class _TileOrder:
    """The fields of the kernel's state (state.Forward) that tile_coordinates reads."""
    num_m_tiles: ll.tensor
    batch_heads: ll.tensor
    group: ll.tensor
    heads: ll.tensor
    kv_group: ll.tensor
    seq_q: ll.tensor
    CONSUMERS: ll.constexpr
    CAUSAL: ll.constexpr


@ll.jit
def _tile_origins(out_ptr, num_m_tiles, batch_heads, group, heads, seq_q, BLOCK_M: ll.constexpr,
                  CAUSAL: ll.constexpr):
    tile = ll.program_id(0)
    order = _TileOrder(num_m_tiles, batch_heads, group, heads, 1, seq_q, BLOCK_M // 64, CAUSAL)
    batch, head, kv_head, off_m = tile_coordinates(order, tile)
    ll.store(out_ptr + 2 * tile, batch * heads + head)
    ll.store(out_ptr + 2 * tile + 1, off_m)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_q", [100, 500, 512, 576])
def test_causal_tiles_end_at_the_last_row(seq_q, causal):
    """The query tiles of each head cover its rows once, in the order the CTAs take them:
    causal ones bottom first and aligned to the last warpgroup's rows (seq_q rounded up
    to 64), so that a partial tile is the top one (it sees the fewest keys), non-causal
    ones top first from row 0."""
    block_m, heads, batch_heads, group = 192, 3, 6, 4
    num_m_tiles = -(-seq_q // block_m)
    out = np.zeros((num_m_tiles * batch_heads, 2), np.int32)
    _tile_origins[(len(out),)](out, num_m_tiles, batch_heads, group, heads, seq_q, block_m, causal)
    for bh in range(batch_heads):
        origins = out[out[:, 0] == bh, 1]  # in the order the tiles are numbered
        end = -(-seq_q // 64) * 64
        starts = end - block_m * np.arange(1, num_m_tiles + 1) if causal else block_m * np.arange(num_m_tiles)
        np.testing.assert_array_equal(origins, starts)


def test_emulated_attention_scale_and_no_keys():
    q, k, v = _inputs(1, 1, 1, 64, 64, 64)
    out = flash_attention(q, k, v, softmax_scale=0.3)
    np.testing.assert_allclose(out, reference_attention(q, k, v, softmax_scale=0.3), atol=2e-3, rtol=1e-2)
    # seq_q > seq_k, causal: the first seq_q - seq_k rows see no key at all.
    q, k, v = _inputs(1, 1, 1, 40, 8, 64)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert not out[:, :, :32].any() and np.isposinf(lse[:, :, :32]).all()
    np.testing.assert_allclose(out, reference_attention(q, k, v, causal=True), atol=2e-3, rtol=1e-2)


def test_reference_matches_the_definition():
    q, k, v = (RNG.standard_normal((1, 2, 5, 64)) for _ in range(3))
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out, lse = reference_attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(out, p @ v)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)))


def test_bad_inputs_get_clear_errors():
    q = np.zeros((1, 2, 16, 64), np.float16)
    with pytest.raises(TypeError, match="bf16 or fp16.*numpy has no bf16"):
        flash_attention(q.astype(np.float32), q.astype(np.float32), q.astype(np.float32))
    with pytest.raises(TypeError, match="one dtype"):
        flash_attention(q, q, q.astype(np.float32))
    with pytest.raises(ValueError, match="head_dim"):
        x = np.zeros((1, 2, 16, 96), np.float16)
        flash_attention(x, x, x)
    with pytest.raises(ValueError, match="4-D"):
        flash_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="must divide the q heads"):
        k = np.zeros((1, 3, 16, 64), np.float16)
        flash_attention(np.zeros((1, 4, 16, 64), np.float16), k, k)
    with pytest.raises(ValueError, match="k and v must have one shape"):
        flash_attention(q, q, q[:, :, :8])
    with pytest.raises(ValueError, match="batch and head_dim must match"):
        flash_attention(q, np.zeros((2, 2, 16, 64), np.float16), np.zeros((2, 2, 16, 64), np.float16))
    with pytest.raises(ValueError, match="layout must be"):
        flash_attention(q, q, q, layout="sbhd")
    with pytest.raises(TypeError, match="numpy arrays .* or torch tensors"):
        flash_attention(q.tolist(), q, q)
    with pytest.raises(ValueError, match="is for head_dim 128"):
        flash_attention(q, q, q, config=default_config(128))


def test_empty_sequences():
    q = np.zeros((1, 2, 0, 64), np.float16)
    k = np.ones((1, 2, 5, 64), np.float16)
    assert flash_attention(q, k, k).shape == (1, 2, 0, 64)
    out, lse = flash_attention(k, q, q, return_lse=True)
    assert not out.any() and np.isposinf(lse).all()


@pytest.mark.parametrize("ctas", [1, 3])
@pytest.mark.parametrize("head_dim, causal", [(64, False), (64, True), (128, False), (128, True)])
def test_emulated_one_key_tile_several_ctas_an_sm(monkeypatch, head_dim, causal, ctas):
    """The default with at most 64 keys: CTAs of one consumer warpgroup (three an SM at
    head_dim 64 on the GPU, two at 128), each walking several 64-row tiles (GQA, a query
    tail, a key tail; causal rows that see no key)."""
    from weft.kernels import _launch

    monkeypatch.setattr(_launch, "EMULATED_CTAS", ctas)
    assert default_config(head_dim, causal, 50).ctas_per_sm == (3 if head_dim == 64 else 2)
    _check_emulated(1, 4, 2, 150, 50, head_dim, causal, "bhsd")
