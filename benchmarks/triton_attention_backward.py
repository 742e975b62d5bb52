"""The Triton fused-attention tutorial's backward, as the backward benchmark's "triton"
system (issue 41 asks for >= 1.5x of it): highlevel/attention_backward_example.py's
kernels compiled by Triton, the same source the "weft.hl" system compiles with
weft.highlevel (the example's docstring says what it computes and its limits, which are
the tutorial's: other inputs raise ValueError, the benchmark prints that as the reason).
Only imported on the GPU machine, where Triton is installed.
"""

from __future__ import annotations

import functools

from benchmarks.same_source import triton_module


@functools.cache
def triton_kernels():
    """(row_deltas, attention_backward_kernel) of the example compiled by Triton (with the
    helpers they call), from the example's own source."""
    from weft.highlevel import attention_backward_example as example

    module = triton_module("tutorial_backward", example.row_deltas, example._key_block_grads,
                           example._query_block_grad, example.attention_backward_kernel)
    return module.row_deltas, module.attention_backward_kernel


def attention_backward(q, k, v, out, lse, do, causal=False, softmax_scale=None):
    """(dq, dk, dv) by Triton for [batch, heads, seq, head_dim] q, k, v, the forward's out
    and natural-log lse [batch, heads, seq] (fp32), and dO."""
    from weft.highlevel.attention_backward_example import attention_backward as backward

    return backward(q, k, v, out, lse, do, causal, softmax_scale, kernels=triton_kernels())
