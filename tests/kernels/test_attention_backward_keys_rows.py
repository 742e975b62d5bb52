"""kernels/attention backward, keys split, with each query block's L and delta staged in
shared memory by the producer (BackwardConfig stats_in_shared, backward.stage_row_stats)
and read by the consumers where they use them: block_m 128 at head_dim 64 (FA3's 128 x 128
tiles) on the CPU emulator, race detection on, against float64 numpy gradients (causal
masks, GQA/MQA, tails of neither block size, seq_q != seq_k, both dQ accumulations); its
config's errors; and its kernel through ptxas for sm_90a with no spills."""

import dataclasses

import pytest

from weft.compiler.backend import ptxas
from weft.kernels.attention.backward_host import BackwardConfig, backward_constexprs, backward_kernel, keys_split_config

from .test_attention_backward import _check, _inputs

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


def _rows128(**fields):
    return dataclasses.replace(keys_split_config(64), block_m=128, stats_in_shared=True, **fields)


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, fields", [
    (1, 2, 1, 150, 200, 64, True, "bhsd", {}),                      # GQA, seq_q < seq_k, a cut block of each
    (2, 1, 1, 300, 130, 64, False, "bshd", dict(stages=1)),          # seq_q > seq_k: three query blocks, one slot
    (1, 3, 1, 200, 70, 64, True, "bhsd", dict(dq_reduce="atomics")),  # MQA, rows that see no key
    (1, 2, 2, 100, 150, 128, True, "bshd", dict(block_m=64)),         # head_dim 128 at block_m 64, staged
    (1, 1, 1, 260, 70, 128, False, "bhsd", dict(block_m=64, stages=3)),  # three slots (not a power of two) wrap
])
def test_gradients_match_float64(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, fields):
    """S^T and dP^T over 128 query columns a consumer, P^T and dS^T from L and delta read
    out of the ring slot the producer wrote them to (the emulator checks each slot's
    stats are written before they are read and read before they are rewritten)."""
    config = dataclasses.replace(keys_split_config(head_dim), stats_in_shared=True, **fields) \
        if head_dim != 64 else _rows128(**fields)
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, seed=31), causal, layout=layout,
           config=config)


def test_block_m_128_needs_head_dim_64_and_stats_in_shared():
    with pytest.raises(ValueError, match=r"block_m=128\): head_dim 64 with stats_in_shared=True"):
        dataclasses.replace(keys_split_config(64), stats_in_shared=False)  # the default's block_m 128
    with pytest.raises(ValueError, match=r"got head_dim 128, stats_in_shared True"):
        dataclasses.replace(keys_split_config(128), block_m=128, stats_in_shared=True)
    with pytest.raises(ValueError, match="stats_in_shared is an option of split='keys'"):
        BackwardConfig(head_dim=64, stats_in_shared=True)
    rows64 = dataclasses.replace(keys_split_config(64), block_m=64, stats_in_shared=False)
    assert _rows128().shared_bytes == rows64.shared_bytes + 2 * (2 * 2 * 64 * 64 + 64 * 128) \
        + 4 * 2 * 2 * 128  # Q/dO slots and dS^T twice the rows (dQ's boxes the same: 64 rows a consumer); stats


@needs_ptxas
@pytest.mark.parametrize("fields", [{}, dict(stages=1), dict(dq_reduce="atomics")])
def test_block_m_128_assembles_without_spills(fields, causal=True):  # causal: both kinds of step
    """Two consumers of 64 keys x 128 queries (S^T and dP^T 64 registers a thread each) and
    64 columns of fp32 dK and dV in 240 registers: no spills, L and delta never held."""
    config = _rows128(**fields)
    box = lambda rows: f"tensordesc<bf16[1,1,{rows},64]>"  # noqa: E731
    signature = {"q_desc": box(128), "k_desc": box(128), "v_desc": box(128), "do_desc": box(128),
                 "lse_ptr": "*fp32", "delta_ptr": "*fp32",
                 "dq_ptr": ("tensordesc<fp32[1,1,64,64],swizzle=128>" if config.dq_reduce == "tma" else "*fp32"),
                 "dk_ptr": "*bf16", "dv_ptr": "*bf16", "dkv_stride_b": "i32", "dkv_stride_h": "i32",
                 "dkv_stride_s": "i32", "softmax_scale": "fp32", "seq_q": "i32", "seq_k": "i32", "heads": "i32",
                 "kv_group": "i32"}
    compiled = backward_kernel(config).compile(signature=signature, constexprs=backward_constexprs(config, causal),
                                               num_warps=4, **config.launch_options())
    ptx = compiled.asm["ptx"]
    for instruction in ("wgmma.mma_async.sync.aligned.m64n128k16.f32", "ld.shared", "bar.sync", "ex2.approx"):
        assert instruction in ptx, instruction
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fields", [{}, dict(stages=1), dict(dq_reduce="atomics")])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k", [(2, 4, 2, 1000, 1000), (1, 3, 1, 300, 700),
                                                                  (1, 2, 2, 700, 300)])
def test_gpu_gradients_match_torch(batch, heads, kv_heads, seq_q, seq_k, causal, fields):
    """block_m 128 at head_dim 64 on the GPU against float32 torch autograd (GQA, tails,
    seq_q != seq_k), at test_attention_backward_keys.py's tolerances."""
    torch = pytest.importorskip("torch")
    from weft.kernels.attention import flash_attention, flash_attention_backward

    from .attention_torch import random_attention_inputs, torch_gradients

    gen = torch.Generator(device="cuda").manual_seed(seq_q * 7 + seq_k)
    q, k, v, do = random_attention_inputs(batch, heads, kv_heads, seq_q, seq_k, 64, "bhsd", torch.bfloat16, gen,
                                          with_output_grad=True)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    grads = flash_attention_backward(q, k, v, out, lse, do, causal=causal, config=_rows128(**fields))
    refs = torch_gradients(q, k, v, do, causal, 64 ** -0.5, "bhsd")
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert torch.isfinite(got).all(), name
        error = ((got.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()
        assert error <= 2e-2, (name, error)
        worst = (got.float() - ref).abs().max().item()
        assert worst <= 5e-2 * max(ref.abs().max().item(), 1e-6), (name, worst)
