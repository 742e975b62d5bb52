"""kernels/attention backward on the CPU emulator: dq, dk and dv of
flash_attention_backward against float64 numpy gradients (reference_attention_backward,
itself checked against finite differences), across causal masks, GQA/MQA, lengths that
are multiples of no tile, both layouts and the softmax_scale edge cases; and its errors."""

import numpy as np
import pytest

from weft.kernels.attention import flash_attention, flash_attention_backward, reference_attention
from weft.kernels.attention.backward_host import BackwardConfig, columns_split_config, reference_attention_backward

TOLERANCE = 1e-2  # max |grad - ref| / max |ref|, fp16 inputs and P, dS rounded to fp16


def _inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout="bhsd", seed=0):
    rng = np.random.default_rng(seed)

    def make(h, s):
        shape = (batch, h, s, head_dim) if layout == "bhsd" else (batch, s, h, head_dim)
        return rng.standard_normal(shape).astype(np.float16)

    return make(heads, seq_q), make(kv_heads, seq_k), make(kv_heads, seq_k), make(heads, seq_q)


def _forward(q, k, v, causal, scale, layout):
    """O (fp16) and the LSE (fp32) as flash_attention returns them, from the float64
    reference: the emulated forward would double each test's time."""
    out, lse = reference_attention(q, k, v, causal, scale, return_lse=True, layout=layout)
    return out.astype(np.float16), lse.astype(np.float32)


def _check(q, k, v, do, causal, scale=None, layout="bhsd", out=None, lse=None, config=None):
    if out is None:
        out, lse = _forward(q, k, v, causal, scale, layout)
    grads = flash_attention_backward(q, k, v, out, lse, do, causal=causal, softmax_scale=scale, layout=layout,
                                     config=config)
    refs = reference_attention_backward(q, k, v, do, causal=causal, softmax_scale=scale, layout=layout)
    for name, got, ref, like in zip(("dq", "dk", "dv"), grads, refs, (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        error = np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-6)
        assert error < TOLERANCE, (name, error)
    return grads, refs


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout", [
    (1, 2, 1, 100, 130, 64, True, "bhsd"),    # GQA (MQA), tails, seq_q < seq_k, diagonal blocks
    (2, 2, 2, 130, 70, 64, False, "bshd"),    # two batches, seq_q > seq_k, three query blocks, bshd
    (1, 2, 1, 37, 90, 128, False, "bhsd"),    # head_dim 128: two consumer warpgroups
    (1, 2, 1, 30, 50, 256, True, "bshd"),     # head_dim 256: two launches of 128 columns
])
def test_gradients_match_float64(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout):
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout), causal, layout=layout)


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout", [
    (1, 2, 1, 100, 130, 64, True, "bhsd"),    # GQA, tails: the last query block's box is cut by seq_q
    (2, 2, 2, 130, 70, 128, False, "bshd"),   # two consumers, each its own dQ box, heads side by side
    (1, 2, 1, 30, 50, 256, True, "bshd"),     # two launches, one Q/dO slot
])
def test_gradients_with_dq_added_by_tma(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout):
    """dq_reduce="tma": each consumer's dQ goes through its fp32 box in shared memory and
    is added into the accumulator by TMA reduce-add (the emulator checks that the box is
    read before it is rewritten)."""
    config = columns_split_config(head_dim, "tma")
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, seed=11), causal, layout=layout,
           config=config)


def test_one_consumer_of_128_columns_adding_dq_by_tma():
    """Two dQ chunks a step through one box: the second waits for the first's add."""
    q, k, v, do = _inputs(1, 1, 1, 70, 40, 128, seed=4)
    _check(q, k, v, do, False, config=BackwardConfig(head_dim=128, dq_reduce="tma"))


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, dq_reduce", [
    (1, 2, 1, 100, 130, 64, True, "bhsd", "atomics"),  # a group of two heads, masked and unmasked blocks
    (2, 3, 1, 130, 70, 128, True, "bshd", "tma"),      # three heads, rows that see no key, two consumers
])
def test_gradients_with_a_pipelined_walk(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout,
                                         dq_reduce):
    """pipelined=True: each step's gradient GEMMs are those of the block before, the
    last block's after the walk (the emulator checks the slots and P/dS buffers are read
    before they are refilled)."""
    config = columns_split_config(head_dim, dq_reduce, pipelined=True)
    assert config.stages == 3  # room for a third Q/dO slot at 64 and 128
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, seed=12), causal, layout=layout,
           config=config)


def test_a_pipelined_consumer_of_128_columns():
    """dQ's second chunk reads the last step's dS before the step writes its own."""
    q, k, v, do = _inputs(1, 2, 1, 150, 40, 128, seed=6)
    _check(q, k, v, do, True, config=BackwardConfig(head_dim=128, pipelined=True))


def test_dq_boxes_that_pass_shared_memory_are_refused():
    with pytest.raises(ValueError, match="pass the 232448 a CTA has at 1 CTA.s. an SM; use fewer stages"):
        BackwardConfig(head_dim=256, consumers=2, launches=2, dq_reduce="tma")
    with pytest.raises(ValueError, match="dq_reduce must be one of"):
        BackwardConfig(head_dim=64, dq_reduce="red")
    with pytest.raises(ValueError, match="pipelined walk holds two Q/dO slots"):
        BackwardConfig(head_dim=64, stages=1, pipelined=True)


def test_one_consumer_of_128_columns():
    """A config whose consumer holds all of head_dim 128 (dQ in two chunks of 64 columns):
    not the default (ptxas spills it), but right."""
    q, k, v, do = _inputs(1, 1, 1, 40, 70, 128, seed=9)
    out, lse = _forward(q, k, v, True, None, "bhsd")
    grads = flash_attention_backward(q, k, v, out, lse, do, causal=True, config=BackwardConfig(head_dim=128))
    for got, ref in zip(grads, reference_attention_backward(q, k, v, do, causal=True)):
        assert np.abs(got.astype(np.float64) - ref).max() < TOLERANCE * np.abs(ref).max()


def test_rows_that_see_no_key_get_zero_dq_with_the_forwards_lse():
    """Causal with seq_q > seq_k: the first rows see no key (LSE +inf from the emulated
    forward); their dq is 0 and they give nothing to dk and dv."""
    q, k, v, do = _inputs(1, 1, 1, 80, 20, 64, seed=3)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert np.isinf(lse[0, 0, :60]).all()
    (dq, _, _), _ = _check(q, k, v, do, True, out=out, lse=lse)
    assert (dq[0, 0, :60] == 0).all()


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_negative_and_zero_softmax_scale(scale):
    """A negative scale runs on -q (dq negated back), a zero one on zero queries: dq = 0."""
    q, k, v, do = _inputs(1, 1, 1, 17, 33, 64, seed=5)
    (dq, _, _), _ = _check(q, k, v, do, False, scale=scale)
    if scale == 0.0:
        assert (dq == 0).all()


@pytest.mark.parametrize("seq_q, seq_k", [(0, 5), (5, 0)])
def test_empty_sequences_give_zero_gradients(seq_q, seq_k):
    q, k, v, do = _inputs(1, 2, 1, seq_q, seq_k, 64)
    lse = np.full((1, 2, seq_q), np.inf, np.float32)
    grads = flash_attention_backward(q, k, v, np.zeros_like(q), lse, do)
    for got, like in zip(grads, (q, k, v)):
        assert got.shape == like.shape and not got.any()


def test_reference_matches_finite_differences():
    """The float64 reference's gradients are those of reference_attention: central
    differences of <out, do> in a few coordinates of q, k and v (GQA, causal)."""
    rng = np.random.default_rng(7)
    q, k, v, do = (rng.standard_normal(shape) for shape in
                   ((1, 2, 5, 4), (1, 1, 6, 4), (1, 1, 6, 4), (1, 2, 5, 4)))
    grads = reference_attention_backward(q, k, v, do, causal=True, softmax_scale=0.7)
    eps = 1e-6
    for which, grad in enumerate(grads):
        for index in [(0, 0, 1, 2), (0, 0, 4, 0), (0, 0 if which else 1, 3, 3)]:
            args = [q.copy(), k.copy(), v.copy()]
            args[which][index] += eps
            plus = (reference_attention(*args, causal=True, softmax_scale=0.7) * do).sum()
            args[which][index] -= 2 * eps
            minus = (reference_attention(*args, causal=True, softmax_scale=0.7) * do).sum()
            assert abs((plus - minus) / (2 * eps) - grad[index]) < 1e-6, (which, index)


def test_input_errors_say_what_to_pass():
    q, k, v, do = _inputs(1, 2, 1, 8, 8, 64)
    out, lse = _forward(q, k, v, False, None, "bhsd")
    with pytest.raises(ValueError, match=r"lse must be fp32 \[batch, heads, seq_q\] = \[1, 2, 8\]"):
        flash_attention_backward(q, k, v, out, lse[:, :1], do)
    with pytest.raises(ValueError, match="lse must be fp32"):
        flash_attention_backward(q, k, v, out, lse.astype(np.float64), do)
    with pytest.raises(ValueError, match="dout must have q's shape"):
        flash_attention_backward(q, k, v, out, lse, do[:, :, :4])
    with pytest.raises(ValueError, match="out must have q's shape .* and dtype fp16"):
        flash_attention_backward(q, k, v, out.astype(np.float32), lse, do)
    with pytest.raises(TypeError, match="lse must be one of"):
        flash_attention_backward(q, k, v, out, lse.tolist(), do)
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        flash_attention_backward(q, k, v, out, lse, do, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match="multiple of 64 of head_dim 64's columns"):
        BackwardConfig(head_dim=64, consumers=2)
    with pytest.raises(ValueError, match="is for head_dim 128"):
        flash_attention_backward(q, k, v, out, lse, do, config=BackwardConfig(head_dim=128))
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention_backward(q[..., :32], k[..., :32], v[..., :32], out[..., :32], lse, do[..., :32])
