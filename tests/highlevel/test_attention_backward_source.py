"""The fused-attention tutorial's backward as a Triton user writes it
(highlevel/attention_backward_example.py, the source benchmarks/triton_attention_backward.py
also compiles with Triton): on the CPU emulator against the float64 numpy reference,
causal and not, head_dim 64 and 128, at the tutorial's blocks and launch (32 x 128 for
dK/dV, 128 x 32 for dQ, 4 warps, 5 stages)."""

import numpy as np
import pytest

from weft.highlevel import attention_backward_example
from weft.kernels.attention import reference_attention_backward

RNG = np.random.default_rng(45)


def forward(q, k, v, causal: bool, scale: float):
    """(out as fp16, natural-log lse as fp32) in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) * scale
    if causal:
        n = scores.shape[-1]
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - top)
    total = weights.sum(-1, keepdims=True)
    return (weights / total @ v).astype(np.float16), (top + np.log(total))[..., 0].astype(np.float32)


@pytest.mark.parametrize("seq,head_dim,causal", [(256, 64, False), (256, 64, True), (128, 128, True)])
def test_backward_matches_float64(seq, head_dim, causal):
    q, k, v, do = ((0.5 * RNG.standard_normal((1, 2, seq, head_dim))).astype(np.float16) for _ in range(4))
    scale = head_dim ** -0.5
    out, lse = forward(q, k, v, causal, scale)
    grads = attention_backward_example.attention_backward(q, k, v, out, lse, do, causal)
    for name, got, expected in zip(("dq", "dk", "dv"), grads, reference_attention_backward(q, k, v, do, causal, scale)):
        # P and dS rounded to fp16 before their dots, fp32 sums, fp16 results: a few 2^-11
        # of the largest gradient.
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=4e-3 * np.abs(expected).max(), rtol=0,
                                   err_msg=name)
