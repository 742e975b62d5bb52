"""kernels/attention backward with the key block split between the consumer warpgroups
(BackwardConfig split="keys", backward_keys.py) on the CPU emulator, race detection on:
dq, dk and dv against float64 numpy gradients across causal masks, GQA/MQA, tails of
neither block size, seq_q != seq_k, both dQ accumulations; its config's errors; and its
kernel through ptxas for sm_90a with no spills (needs ptxas, not a GPU); and (marked gpu)
its gradients on the GPU against float32 torch autograd."""

import dataclasses

import pytest

from weft.compiler.backend import ptxas
from weft.kernels.attention.backward_host import (BackwardConfig, backward_constexprs, backward_kernel,
                                                  default_backward_config, keys_split_config)

from .test_attention_backward import _check, _inputs
from .test_attention_backward_gpu import GPU_CASES, check_gradients_on_the_gpu

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, dq_reduce", [
    (1, 2, 1, 100, 200, 128, True, "bhsd", "tma"),     # GQA, seq_q < seq_k, diagonal blocks, a cut key block
    (2, 2, 2, 150, 70, 128, False, "bshd", "tma"),     # seq_q > seq_k: one key block cut at 70, three query blocks
    (1, 3, 1, 130, 90, 128, True, "bhsd", "atomics"),  # MQA of three heads, rows that see no key
    (1, 2, 1, 70, 150, 64, True, "bshd", "tma"),       # head_dim 64: dQ by the consumers in turn
    (1, 2, 1, 100, 70, 256, True, "bhsd", "tma"),      # head_dim 256: two consumers on one band, one slot
])
def test_gradients_match_float64(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, dq_reduce):
    """Each band of 64 keys: S^T and dP^T, P^T and dS^T as register operands of dV and
    dK, every key's dS through shared memory for dQ (the emulator checks the dS buffer and
    the ring slots are read before they are rewritten)."""
    config = keys_split_config(head_dim, dq_reduce)
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, seed=21), causal, layout=layout,
           config=config)


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, dq_reduce, stages", [
    (1, 2, 1, 100, 70, 256, True, "bhsd", "tma", 1),      # GQA, seq_q > seq_k, diagonal blocks, cut keys
    (1, 3, 1, 70, 150, 256, True, "bshd", "atomics", 2),  # MQA, three key blocks, rows past the diagonal
    (2, 1, 1, 130, 100, 128, False, "bhsd", "tma", 3),    # head_dim 128: 64 columns a consumer, two
])                                                         # batches, the last query block cut
def test_split_scores_gradients_match_float64(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout,
                                              dq_reduce, stages):
    """split_scores: one warpgroup's S^T and P^T, the other's dP^T and dS^T, P^T handed
    over in shared memory (the emulator checks p_smem and dS^T are each read before they
    are rewritten, and written before they are read)."""
    config = BackwardConfig(head_dim=head_dim, block_n=64, consumers=2, stages=stages, dq_reduce=dq_reduce,
                            split="keys", split_scores=True)
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, seed=23), causal, layout=layout,
           config=config)


def test_split_scores_is_refused_where_a_band_has_one_consumer():
    with pytest.raises(ValueError, match=r"split_scores=True\): one band of 64 keys shared by two consumers"):
        dataclasses.replace(keys_split_config(128), split_scores=True)
    with pytest.raises(ValueError, match="split_scores is an option of split='keys'"):
        BackwardConfig(head_dim=256, consumers=2, launches=2, split_scores=True)


def test_keys_split_configs_that_cannot_hold_their_keys_are_refused():
    with pytest.raises(ValueError, match=r"would hold 256 columns of dK and dV .* it takes 64 or 128"):
        BackwardConfig(head_dim=256, block_n=128, consumers=2, split="keys")
    with pytest.raises(ValueError, match=r"would hold 32 columns"):
        BackwardConfig(head_dim=64, consumers=2, split="keys")
    with pytest.raises(ValueError, match=r"one launch and the plain walk, got .* launches 2"):
        BackwardConfig(head_dim=256, consumers=2, launches=2, split="keys")
    with pytest.raises(ValueError, match="split must be one of"):
        BackwardConfig(head_dim=128, split="rows")
    assert keys_split_config(256, "tma").stages == 1  # dQ's boxes take the second slot's room


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_default_is_the_keys_split_and_a_pipelined_walk_the_columns_split(head_dim):
    assert default_backward_config(head_dim) == keys_split_config(head_dim)
    assert default_backward_config(head_dim, "atomics") == keys_split_config(head_dim, "atomics")
    assert default_backward_config(head_dim, "atomics", pipelined=True).split == "columns"


@needs_ptxas
@pytest.mark.parametrize("head_dim, fields", [
    (64, {}), (128, {}), (256, {}), (256, dict(split_scores=True)), (128, dict(block_n=64, split_scores=True)),
    (64, dict(block_m=64, block_n=64, consumers=1, consumer_regs=224, ctas_per_sm=2, stages=3,
              stats_in_shared=False)),  # two CTAs an SM
    (64, dict(block_m=64, stats_in_shared=False)),  # the 64-row step L and delta in registers
])
def test_keys_split_assembles_without_spills(head_dim, fields, causal=True):  # causal: both kinds of step
    """Consumers of 64 keys x 128 columns of fp32 dK and dV (128 registers a thread, 64 at
    head_dim 64) beside S^T, dP^T and their 16-bit operands, in 240 registers (224 where
    two CTAs share an SM): no spills (descriptors of buffers at fixed addresses unhoisted:
    dS^T, P^T, a one-slot ring)."""
    config = dataclasses.replace(keys_split_config(head_dim), **fields)
    box = lambda rows: f"tensordesc<bf16[1,1,{rows},64]>"  # noqa: E731
    signature = {"q_desc": box(config.block_m), "k_desc": box(config.block_n), "v_desc": box(config.block_n),
                 "do_desc": box(config.block_m), "lse_ptr": "*fp32", "delta_ptr": "*fp32",
                 "dq_ptr": "tensordesc<fp32[1,1,64,64],swizzle=128>", "dk_ptr": "*bf16", "dv_ptr": "*bf16",
                 "dkv_stride_b": "i32", "dkv_stride_h": "i32", "dkv_stride_s": "i32", "softmax_scale": "fp32",
                 "seq_q": "i32", "seq_k": "i32", "heads": "i32", "kv_group": "i32"}
    compiled = backward_kernel(config).compile(signature=signature, constexprs=backward_constexprs(config, causal),
                                               num_warps=4, **config.launch_options())
    ptx = compiled.asm["ptx"]
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor.4d", "setmaxnreg.inc", "ex2.approx",
                        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"):
        assert instruction in ptx, instruction
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert meta["total_warps"] == 4 * config.consumers + 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, layout", GPU_CASES)
@pytest.mark.parametrize("dq_reduce, split_scores", [("tma", False), ("atomics", False), ("tma", True)])
def test_gpu_gradients_match_torch(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal, dtype_name,
                                   dq_reduce, split_scores):
    """keys_split_config on the GPU against float32 torch autograd, as the default config
    is checked (test_attention_backward_gpu.py's cases and tolerances)."""
    if dq_reduce == "atomics" and dtype_name == "float16":
        pytest.skip("dQ by atomics runs in bf16 only")
    if split_scores and head_dim == 64:
        pytest.skip("split_scores: a band of 64 keys shared by two consumers of 64 columns at least")
    check_gradients_on_the_gpu(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal, dtype_name,
                               _with_split_scores(keys_split_config(head_dim, dq_reduce), split_scores))


def _with_split_scores(config, split_scores: bool):
    """config, or with split_scores on one band of 64 keys (block_n 64, two consumers)."""
    return dataclasses.replace(config, block_n=64, split_scores=True) if split_scores else config
