"""kernels/attention: every (head_dim, causal, dtype) variant, and other configs, through
ptxas for sm_90a: the instructions each needs in its PTX, no layout conversion that moves
data, no spills, and no ptxas performance warnings."""

import dataclasses

import pytest

from weft.kernels.attention import ForwardConfig, PingpongConfig, SimpleConfig, default_config
from weft.kernels.attention.config import SHARED_LIMIT, register_cap, shared_bytes
from weft.kernels.attention.pingpong_config import (buffering, claim_ahead, cluster_size, dynamic_schedule,
                                                    half_tiles, lazy_max, per_warp_release, replicated,
                                                    rescale_above)
from weft.kernels.attention.kernels import flash_attention_fa3
from weft.kernels.attention.simple import flash_attention_forward
from weft.compiler.backend import ptxas

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
# The causal kernels differ from the full ones by the diagonal's masked step; each family
# keeps its full kernels in the default suite and its causal ones in the slow set (CI time).
CAUSAL_IN_SLOW_SET = pytest.param(True, marks=pytest.mark.slow)


def _compile(config: ForwardConfig, dtype: str, causal: bool, write_lse: bool = True, o_buffer: bool = False,
             q_buffers: int = 0, replicated: bool = True, per_warp: bool | None = None, cluster: int = 1,
             dynamic: bool = True):
    """The FA3 (or simple) kernel for a config, compiled for sm_90a with the launch options
    the host gives it (maxnreg for config.ctas_per_sm above 1)."""
    box = lambda rows: f"tensordesc<{dtype}[1,1,{rows},64]>"  # noqa: E731
    simple = isinstance(config, SimpleConfig)
    q_rows = config.block_m if simple else 64
    signature = {"q_desc": box(q_rows), "k_desc": box(config.block_n), "v_desc": box(config.block_n),
                 "o_desc": box(q_rows), "lse_ptr": "*fp32", "softmax_scale": "fp32", "seq_q": "i32",
                 "seq_k": "i32", "heads": "i32", "kv_group": "i32"}
    constexprs = dict(BLOCK_N=config.block_n, HEAD_DIM=config.head_dim, STAGES=config.stages,
                      CAUSAL=causal, WRITE_LSE=write_lse, PRODUCER_REGS=config.producer_regs,
                      CONSUMER_REGS=config.consumer_regs)
    if simple:
        constexprs.update(BLOCK_M=config.block_m, NUM_WARPS=4 * config.consumers)
        return flash_attention_forward.compile(signature=signature, constexprs=constexprs,
                                               num_warps=4 * config.consumers)
    signature.update(counter_ptr="*i32", num_m_tiles="i32", batch_heads="i32", group="i32")
    constexprs.update(CONSUMERS=config.consumers, O_BUFFER=o_buffer,
                      Q_BUFFERS=q_buffers or config.consumers,
                      EXP2_FMA=float(config.exp2_fma_share), REPLICATED=replicated, PER_WARP=per_warp,
                      RESCALE_ABOVE=rescale_above(config), CLAIM_AHEAD=claim_ahead(config),
                      DYNAMIC=dynamic and cluster == 1)
    if lazy_max(config):
        constexprs.update(LAZY_MAX=True)
    if half_tiles(config, causal):
        constexprs.update(HALF_TILES=True)
    if cluster > 1:
        return flash_attention_fa3.compile(signature=signature, constexprs={**constexprs, "CLUSTER": cluster},
                                           num_warps=4, cluster=(cluster, 1, 1))
    options = dict(maxnreg=register_cap(config)) if config.ctas_per_sm > 1 else {}
    return flash_attention_fa3.compile(signature=signature, constexprs=constexprs, num_warps=4, **options)


def _check_assembly(compiled, config: ForwardConfig):
    ptx = compiled.asm["ptx"]
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor.4d", "mbarrier.try_wait",
                        "setmaxnreg.inc", "setmaxnreg.dec", "ex2.approx", "fence.proxy.async"):
        assert instruction in ptx, instruction
    # P goes from the S accumulator to wgmma's register A without moving, and row
    # statistics from S's rows to O's: no conversion moves data.
    layout_ir = compiled.asm["layout"]
    assert layout_ir.count("convert_layout") == layout_ir.count("convert_layout [plan=NoOp()]") >= 2
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert meta["performance_warnings"] == []  # e.g. wgmma serialized by ptxas
    assert meta["total_warps"] == 4 * config.consumers + 4


@needs_ptxas
@pytest.mark.parametrize("replicated", [False, True])
# fp16 builds the same kernel as bf16 but for the element type: in the slow set (CI time).
@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("causal", [False, CAUSAL_IN_SLOW_SET])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_variant_assembles_without_spills(head_dim, causal, dtype, replicated):
    """Both consumer layouts: a partition per warpgroup, and one replicated partition
    (one copy of the code). head_dim 256 replicates only with its default Q ring (with
    one tile's Q buffers it spills 4 bytes; the host never replicates it)."""
    config = default_config(head_dim)
    q_buffers = buffering(config)[1] if replicated and head_dim == 256 else 0
    per_warp = per_warp_release(config, replicated)  # as the host picks it: also head_dim 128
    compiled = _compile(config, dtype, causal, q_buffers=q_buffers, replicated=replicated, per_warp=per_warp)
    _check_assembly(compiled, config)
    ptx = compiled.asm["ptx"]
    # The two GEMMs of a step are in flight together: S_n is waited for with P V pending.
    assert "wgmma.wait_group.sync.aligned 1;" in ptx
    # One copy of the consumer code (its softmax exps) or one per warpgroup.
    per_copy = ptx.count("ex2.approx") // (1 if replicated else config.consumers)
    assert per_copy and ptx.count("ex2.approx") == per_copy * (1 if replicated else config.consumers)
    # Warpgroups that release ring slots warp by warp (replicated ones, and head_dim 128's)
    # sync each warp and arrive from its lane 0, without a named barrier.
    assert ("bar.warp.sync" in ptx) == per_warp == (replicated or head_dim == 128)
    # The max moves (lazy_max) and O is rescaled only in warps whose rows grew: a vote per
    # softmax; at head_dim 64 a P that overflowed sends its warp alone to compute its rows
    # of S again with mma.sync, reading Q and K by ldmatrix: no warpgroup-wide vote.
    assert "vote.sync.any.pred" in ptx and "bar.red.or.pred" not in ptx
    assert ("mma.sync.aligned.m16n8k16" in ptx) == ("ldmatrix.sync.aligned" in ptx) == (head_dim == 64)


@needs_ptxas
@pytest.mark.parametrize("causal", [False, CAUSAL_IN_SLOW_SET])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_conditional_rescale_either_way_assembles_without_spills(head_dim, causal):
    """PingpongConfig.conditional_rescale the other way from its default for the head dim: on
    at 64 and 128, off at 256."""
    config = dataclasses.replace(default_config(head_dim), conditional_rescale=head_dim != 256)
    replicate = replicated(config, causal, 4096)
    o_buffer, q_buffers = buffering(config)
    compiled = _compile(config, "bf16", causal, o_buffer=o_buffer, q_buffers=q_buffers, replicated=replicate,
                        per_warp=per_warp_release(config, replicate))
    _check_assembly(compiled, config)
    votes = compiled.asm["ptx"].count("vote.sync.any.pred")
    assert (votes > 0) == (head_dim != 256)


@needs_ptxas
@pytest.mark.parametrize("spare_q", [False, True])
@pytest.mark.parametrize("causal", [False, CAUSAL_IN_SLOW_SET])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_persistent_buffering_variants_assemble_without_spills(head_dim, causal, spare_q):
    """What persistent CTAs run: O through its own buffer for head_dim 64 and 128, and
    (spare_q, the default) a Q ring of as many buffers as fit: two tiles' for 64 and 128,
    three warpgroups' for 256; at 1k keys, where head_dim 64 keeps four K/V tiles in
    flight (three causal)."""
    config = default_config(head_dim, causal, 1024)
    assert config.stages == ((3 if causal else 4) if head_dim == 64 else 2)
    o_buffer, q_buffers = buffering(config)
    assert (o_buffer, q_buffers) == ((False, 3) if head_dim == 256 else (True, 2 * config.consumers))
    q_buffers = q_buffers if spare_q else config.consumers
    replicate = replicated(config, causal, 4096)
    compiled = _compile(config, "bf16", causal, o_buffer=o_buffer, q_buffers=q_buffers,
                        replicated=replicate, per_warp=per_warp_release(config, replicate))
    _check_assembly(compiled, config)
    need = shared_bytes(config, o_buffer=o_buffer, q_buffers=q_buffers)
    assert need - 64 <= compiled.metadata["shared"] <= SHARED_LIMIT


@needs_ptxas
@pytest.mark.parametrize("config", [PingpongConfig(head_dim=64, block_n=64, consumers=3, consumer_regs=160),
                                    PingpongConfig(head_dim=64),  # 2 consumer warpgroups
                                    PingpongConfig(head_dim=64, consumers=3, consumer_regs=160,
                                                   exp2_fma_share=0.25),
                                    PingpongConfig(head_dim=128, exp2_fma_share=0.5),
                                    SimpleConfig(head_dim=128),
                                    SimpleConfig(head_dim=256, block_n=64)])
def test_other_configs_assemble_without_spills(config):
    _check_assembly(_compile(config, "bf16", True), config)


@needs_ptxas
@pytest.mark.parametrize("head_dim", [pytest.param(128, marks=pytest.mark.slow), 256])  # 128: CI time
def test_cluster_variants_assemble_without_spills(head_dim):
    """Two CTAs sharing K/V (PingpongConfig.cluster): each issues half of a tile's boxes as
    multicast loads, and its consumers release slots on both CTAs' barriers."""
    config = default_config(head_dim)
    o_buffer, q_buffers = buffering(config)
    compiled = _compile(config, "bf16", False, o_buffer=o_buffer, q_buffers=q_buffers, replicated=False,
                        per_warp=per_warp_release(config, False), cluster=2)
    _check_assembly(compiled, config)
    ptx = compiled.asm["ptx"]
    assert compiled.cluster == (2, 1, 1)
    boxes = head_dim // 64
    # Every box of K and V is multicast, wherever the producer's code loads a tile; Q is not.
    multicast = ptx.count(".multicast::cluster")
    assert multicast > 0 and multicast % (2 * boxes) == 0
    assert ptx.count("mbarrier::complete_tx::bytes [") == 2 * boxes  # Q's loads: own rows only
    # Slots come back to the peer at CTA scope (read by GEMMs already waited for).
    assert "mbarrier.arrive.shared::cluster.b64" in ptx and "arrive.release.cluster" not in ptx
    assert ptx.count("barrier.cluster.arrive") == 2  # after the inits, before the end


@needs_ptxas
@pytest.mark.parametrize("replicated", [True, False])
def test_four_consumer_warpgroups_assemble_without_spills(replicated):
    """Non-causal head_dim 64 up to 1024 keys: four consumer warpgroups at 112 registers
    (the launch's 96 a thread for 640 threads, moved by setmaxnreg), 64-key tiles, two
    tiles' Q buffers and O's own."""
    config = default_config(64, False, 512)
    o_buffer, q_buffers = buffering(config)
    assert (o_buffer, q_buffers) == (True, 8)
    compiled = _compile(config, "bf16", False, o_buffer=o_buffer, q_buffers=q_buffers, replicated=replicated,
                        per_warp=per_warp_release(config, replicated))
    _check_assembly(compiled, config)


@needs_ptxas
def test_static_schedule_claims_nothing():
    """A dynamic schedule claims tiles with a global atomic add; a static one (and clusters of
    two, whose CTAs take tiles side by side) has none, so the host need not zero a
    counter for it."""
    config = default_config(64)
    assert ".global.add" in _compile(config, "bf16", False, o_buffer=True, q_buffers=6).asm["ptx"]
    static = _compile(config, "bf16", False, o_buffer=True, q_buffers=6, dynamic=False)
    assert ".global.add" not in static.asm["ptx"]
    _check_assembly(static, config)
    assert dynamic_schedule(config, 1) and not dynamic_schedule(config, 2)
    assert not dynamic_schedule(dataclasses.replace(config, dynamic_schedule=False), 1)
    chosen = default_config(128)
    assert cluster_size(dataclasses.replace(chosen, dynamic_schedule=True), False, 32, 1) == 1
    for bad, why in [(dict(dynamic_schedule=1), "must be None .chosen per problem., True or False"),
                     (dict(dynamic_schedule=False, persistent=False), "needs persistent=True"),
                     (dict(dynamic_schedule=True, cluster=2), "static schedule")]:
        with pytest.raises(ValueError, match=why):
            dataclasses.replace(chosen, **bad)


@needs_ptxas
@pytest.mark.parametrize("head_dim, causal", [(64, False), (64, True), (128, False), (128, True)])
def test_several_ctas_an_sm_assemble_without_spills(head_dim, causal):
    """A single key tile (PingpongConfig.ctas_per_sm): at head_dim 64 the kernel launches at 80
    registers a thread (.maxnreg, the launch option maxnreg) so that three CTAs fit an SM,
    its one consumer warpgroup at 136 beside a 24-register producer; at 128, two CTAs at
    128 a thread and 232 for the consumer."""
    config = default_config(head_dim, causal, 64)
    o_buffer, q_buffers = buffering(config)
    compiled = _compile(config, "bf16", causal, o_buffer=o_buffer, q_buffers=q_buffers, replicated=True,
                        per_warp=per_warp_release(config, True))
    _check_assembly(compiled, config)
    cap, consumer = (80, 136) if head_dim == 64 else (128, 232)
    ptx = compiled.asm["ptx"]
    assert f".maxnreg {cap}" in ptx and f"setmaxnreg.inc.sync.aligned.u32 {consumer};" in ptx
    assert compiled.metadata["registers"] <= cap
    assert compiled.metadata["shared"] <= 228 * 1024 // config.ctas_per_sm - 1024
