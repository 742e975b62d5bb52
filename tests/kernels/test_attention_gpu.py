"""kernels/attention on the H200 (marked gpu): against a float32 torch reference across
shapes, layouts and dtypes, and bitwise across clusters, persistent CTAs and schedules."""

import dataclasses
import math

import pytest

from weft.kernels.attention import PingpongConfig, default_config, flash_attention

from .attention_torch import random_attention_inputs, torch_attention


GPU_CASES = [
    # (batch, heads, kv_heads, seq_q, seq_k, head_dim, layout)
    (2, 8, 8, 1024, 1024, 64, "bhsd"),
    (2, 8, 8, 1024, 1024, 128, "bhsd"),
    (2, 4, 4, 1024, 1024, 256, "bhsd"),
    (1, 6, 2, 1000, 777, 128, "bhsd"),     # GQA, odd lengths, seq_q > seq_k
    (3, 4, 1, 333, 1111, 64, "bshd"),      # MQA, seq_q < seq_k
    (1, 4, 4, 4097, 4097, 256, "bshd"),
    (2, 2, 2, 1, 513, 128, "bhsd"),        # decoding-like single query
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, layout", GPU_CASES)
def test_gpu_attention_matches_torch(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout,
                                     causal, dtype_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(seq_q * 7 + seq_k + head_dim)
    q, k, v = random_attention_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, dtype, gen)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, layout=layout)
    ref, ref_lse = torch_attention(q, k, v, causal, 1.0 / math.sqrt(head_dim), layout)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (batch, heads, seq_q)
    error = (out.float() - ref).norm() / ref.norm().clamp_min(1e-6)
    assert error.item() <= 1e-2, error.item()
    assert (out.float() - ref).abs().max().item() <= 5e-2 * ref.abs().max().item()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 1e-3 * max(1.0, ref_lse[finite].abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k", [
    (3, 16, 4, 1500, 1700),   # 12 query tiles a head, GQA, key tail: many tiles per cluster
    (2, 4, 4, 4096, 4096),
    (1, 6, 2, 1000, 777),     # a partial last query tile: its pair's rows past seq_q
    (1, 2, 2, 200, 4099)])    # one pair a head, seq_q < seq_k
def test_gpu_clusters_match_single_ctas(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout):
    """Pairs of CTAs sharing K/V by multicast (PingpongConfig.cluster=2): bitwise the result of
    CTAs that load their own (each tile's arithmetic is the same), and right."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(seq_q + seq_k + head_dim)
    q, k, v = random_attention_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, torch.bfloat16, gen)
    runs = {}
    for cluster in (1, 2):
        config = dataclasses.replace(default_config(head_dim), cluster=cluster)
        runs[cluster] = flash_attention(q, k, v, return_lse=True, layout=layout, config=config)
    assert torch.equal(runs[1][0], runs[2][0]) and torch.equal(runs[1][1], runs[2][1])
    ref, ref_lse = torch_attention(q, k, v, False, 1.0 / math.sqrt(head_dim), layout)
    assert ((runs[2][0].float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert (runs[2][1] - ref_lse).abs().max().item() <= 1e-3 * max(1.0, ref_lse.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim, q_buffers", [(64, None), (64, 4), (128, None), (128, 3), (256, None),
                                                 (256, 2)])
def test_gpu_persistent_ctas_match_one_cta_per_tile(head_dim, q_buffers, causal):
    """2-5 tiles per persistent CTA (GQA, odd lengths), with the Q ring the host picks
    (None) or another: bitwise the result of one CTA per tile (each tile's arithmetic is
    the same wherever it runs), and right."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(head_dim + causal)
    q = torch.randn(3, 16, 1500, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(3, 4, 1700, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    persistent = dataclasses.replace(default_config(head_dim), persistent=True, q_buffers=q_buffers)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=persistent)
    tiles = dataclasses.replace(default_config(head_dim), persistent=False)
    out_tiles, lse_tiles = flash_attention(q, k, v, causal=causal, return_lse=True, config=tiles)
    assert torch.equal(out, out_tiles) and torch.equal(lse, lse_tiles)
    for dynamic in (False, True):  # whichever way persistent CTAs find their tiles
        config = dataclasses.replace(persistent, dynamic_schedule=dynamic, cluster=1)
        out_walk, lse_walk = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
        assert torch.equal(out_walk, out_tiles) and torch.equal(lse_walk, lse_tiles)
    ref, _ = torch_attention(q, k, v, causal, 1.0 / math.sqrt(head_dim), "bhsd")
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, seq_q, seq_k, causal", [(64, 1000, 1000, True), (128, 700, 1200, True),
                                                           (64, 500, 1050, False), (128, 300, 1090, False)])
def test_gpu_half_key_tiles(head_dim, seq_q, seq_k, causal):
    """Last key tiles whose second half no row of the warpgroup sees, taken as GEMMs of
    half the keys (PingpongConfig.half_tiles; the default for causal head_dim 64 and 128, and
    non-causal here where seq_k % 128 is at most 64): right with it and without."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(seq_k)
    q = torch.randn(2, 6, seq_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(2, 3, seq_k, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    ref, ref_lse = torch_attention(q, k, v, causal, 1.0 / math.sqrt(head_dim), "bhsd")
    for half in (False, True):
        config = dataclasses.replace(default_config(head_dim), half_tiles=half)
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
        assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
        assert (lse - ref_lse).abs().max().item() <= 1e-3 * ref_lse.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 256])
def test_gpu_causal_tiles_whose_rows_see_no_key(head_dim):
    """Causal with seq_q well past seq_k: each head's top query tiles load no key tile and
    take no turns, so a warpgroup can run ahead of another through them (the head_dim 256
    Q ring race of docs/attention-journal.md, 2026-11-27: one `ready` barrier per warpgroup's
    uses since). Many heads, so persistent CTAs walk several such tiles; right against
    float32 torch (rows that see no key: O 0, log-sum-exp inf) and bitwise alike over
    repeated calls."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q = torch.randn(2, 64, 700, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(2, 64, 450, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = torch_attention(q, k, v, True, 1.0 / math.sqrt(head_dim), "bhsd")
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (out[:, :, :250] == 0).all()
    for _ in range(20):
        again, again_lse = flash_attention(q, k, v, causal=True, return_lse=True)
        assert torch.equal(again, out) and torch.equal(again_lse, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k", [(8, 32, 32, 512, 512), (3, 12, 4, 500, 300),
                                                              (2, 8, 8, 1000, 1024)])
def test_gpu_four_consumer_warpgroups(batch, heads, kv_heads, seq_q, seq_k):
    """Non-causal head_dim 64 up to 1024 keys runs four consumer warpgroups of 64-key
    tiles by default: right against float32 torch, close to three warpgroups of 128-key
    tiles, and bitwise the same on persistent CTAs as on one CTA per tile."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(seq_q)
    q = torch.randn(batch, heads, seq_q, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(batch, kv_heads, seq_k, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    config = default_config(64, False, seq_k)
    assert config.consumers == 4
    out, lse = flash_attention(q, k, v, return_lse=True)
    ref, ref_lse = torch_attention(q, k, v, False, 0.125, "bhsd")
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert (lse - ref_lse).abs().max().item() <= 1e-3 * ref_lse.abs().max().item()
    three = flash_attention(q, k, v, config=default_config(64))
    assert ((three.float() - out.float()).norm() / ref.norm()).item() <= 1e-2
    tiles, tiles_lse = flash_attention(q, k, v, return_lse=True,
                                       config=dataclasses.replace(config, persistent=False))
    assert torch.equal(tiles, out) and torch.equal(tiles_lse, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim, share", [(64, 0.25), (64, 0.5), (128, 0.25)])
def test_gpu_exps_on_the_fma_pipe(head_dim, share, causal):
    """Part of the softmax's exps by FMA polynomials (PingpongConfig.exp2_fma_share): still within
    the bf16 tolerance of the float32 reference, and not bitwise the exp unit's result."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(head_dim + causal)
    q, k, v = (torch.randn(2, 4, 1100, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    config = dataclasses.replace(default_config(head_dim), exp2_fma_share=share)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
    ref, ref_lse = torch_attention(q, k, v, causal, 1.0 / math.sqrt(head_dim), "bhsd")
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert (lse - ref_lse).abs().max().item() <= 1e-3 * ref_lse.abs().max().item()
    assert not torch.equal(out, flash_attention(q, k, v, causal=causal, config=default_config(head_dim)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_conditional_rescale(head_dim, causal, dtype_name):
    """Rows whose max jumps far past 2^8 at a key tile in the middle (only their warps
    rescale O) beside rows whose max barely moves (whose warps skip it), with
    PingpongConfig.conditional_rescale, without, and with PingpongConfig.lazy_max: all right."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(head_dim * 3 + causal)
    q, k, v = (torch.randn(2, 4, 1500, head_dim, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    for row, key, gain in ((700, 300, 4.0), (1400, 1200, 4.0), (1450, 20, 4.0), (1100, 1000, 40.0)):
        k[:, :, key] = gain * q[:, :, row]  # gain 40: past 2^128, where P against the old max overflows
    scale = 1.0 / math.sqrt(head_dim)
    ref, ref_lse = torch_attention(q, k, v, causal, scale, "bhsd")
    # Row 700's max jumps at key 300 (tile 2 of 128 keys, tile 4 of 64) by more than
    # 8 natural-log units (2^11.5) over the keys of the tiles before.
    row_700 = (q[:, :, 700:701].float() @ k.float().transpose(-1, -2))[:, :, 0] * scale
    assert (row_700[:, :, 300] - row_700[:, :, :256].amax(-1)).min().item() > 8
    configs = [dataclasses.replace(default_config(head_dim), conditional_rescale=conditional, lazy_max=lazy)
               for conditional, lazy in ((True, False), (False, False), (True, True))]
    for config in configs:
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
        assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2, config
        assert (out.float() - ref).abs().max().item() <= 5e-2 * ref.abs().max().item()
        assert (lse - ref_lse).abs().max().item() <= 1e-3 * ref_lse.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_first_key_tile_max_past_its_first_keys(head_dim, causal, dtype_name):
    """A row's first key tile takes P against the max of its first 32 keys
    (softmax.first_keys_max): rows whose max in that tile lies past them, far past 2^8
    and past 2^128 (P overflows), take the exact max; one inside them needs nothing."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(head_dim * 5 + causal)
    q, k, v = (torch.randn(2, 4, 1500, head_dim, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    spikes = ((300, 100, 4.0), (900, 64, 40.0), (1200, 127, 6.0), (600, 10, 4.0))
    for row, key, gain in spikes:
        k[:, :, key] = gain * q[:, :, row]
    scale = 1.0 / math.sqrt(head_dim)
    ref, ref_lse = torch_attention(q, k, v, causal, scale, "bhsd")
    for row, key, _ in spikes[:3]:  # past 2^8 (8 log2 units) over the first 32 keys
        scores = (q[:, :, row:row + 1].float() @ k[:, :, :128].float().transpose(-1, -2))[:, :, 0] * scale
        assert (scores[:, :, key] - scores[:, :, :32].amax(-1)).min().item() > 8 * math.log(2)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert (out.float() - ref).abs().max().item() <= 5e-2 * ref.abs().max().item()
    assert (lse - ref_lse).abs().max().item() <= 1e-3 * ref_lse.abs().max().item()


@pytest.mark.gpu
def test_gpu_attention_without_lse_and_with_scale():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(2, 4, 513, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attention(q, k, v, softmax_scale=0.05)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.05)
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.gpu
def test_gpu_strided_views_and_errors():
    torch = pytest.importorskip("torch")
    # q, k and v as views into one packed qkv tensor (bshd): strides, not copies.
    qkv = torch.randn(2, 300, 3, 4, 64, device="cuda", dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    out = flash_attention(q, k, v, causal=True, layout="bshd")
    ref, _ = torch_attention(q, k, v, True, 1 / 8, "bshd")
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    with pytest.raises(ValueError, match="one device"):
        flash_attention(q, k.cpu(), v)
    with pytest.raises(TypeError, match="bf16 or fp16"):
        flash_attention(q.float(), k.float(), v.float())


ONE_TILE_CONFIGS = {  # several CTAs an SM of one consumer warpgroup (PingpongConfig.ctas_per_sm)
    64: PingpongConfig(head_dim=64, block_n=64, stages=3, consumers=1, consumer_regs=136, replicated=True,
                       ctas_per_sm=3),
    128: PingpongConfig(head_dim=128, block_n=64, stages=2, consumers=1, consumer_regs=232, replicated=True,
                        ctas_per_sm=2),
}


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, causal", [(64, False), (64, True), (128, False), (128, True)])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k", [(64, 32, 32, 64, 64), (3, 12, 4, 500, 50),
                                                              (2, 8, 8, 1, 64)])
def test_gpu_one_key_tile_several_ctas_an_sm(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal):
    """A single key tile, run by several CTAs an SM of one consumer warpgroup each
    (PingpongConfig.ctas_per_sm, launched with maxnreg; the default at head_dim 64 and 128 up to
    64 keys): right against float32 torch, and bitwise the result of one such CTA an SM
    (the same arithmetic per tile)."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(seq_q + seq_k + head_dim)
    q = torch.randn(batch, heads, seq_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(batch, kv_heads, seq_k, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    config = ONE_TILE_CONFIGS[head_dim]
    assert default_config(head_dim, causal, seq_k) == config
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=config)
    ref, ref_lse = torch_attention(q, k, v, causal, head_dim ** -0.5, "bhsd")
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 1e-3 * max(1.0, ref_lse[finite].abs().max().item())
    single, single_lse = flash_attention(q, k, v, causal=causal, return_lse=True,
                                         config=dataclasses.replace(config, ctas_per_sm=1))
    assert torch.equal(single, out) and torch.equal(single_lse, lse)
