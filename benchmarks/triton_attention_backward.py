"""The Triton fused-attention tutorial's backward, as the backward benchmark's "triton"
system (issue 41 asks for >= 1.5x of it): highlevel/attention_backward_example.py's
kernels compiled by Triton, the same source the "weft.hl" system compiles with
weft.highlevel (the example's docstring says what it computes and its limits, which are
the tutorial's: other inputs raise ValueError, the benchmark prints that as the reason).
Only imported on the GPU machine, where Triton is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import tempfile


@functools.cache
def triton_kernels():
    """(row_deltas, attention_backward_kernel) of the example compiled by Triton: their
    source (and their helpers') in a module that imports triton.language as tl, the
    decorators spelled triton.jit."""
    from weft.highlevel import attention_backward_example as example

    if importlib.util.find_spec("triton") is None:
        raise ImportError("no module named 'triton'")
    parts = ["import triton\nimport triton.language as tl\n"]
    for kernel in (example.row_deltas, example._key_block_grads, example._query_block_grad,
                   example.attention_backward_kernel):
        parts.append(inspect.getsource(kernel.fn).replace("@tl.jit", "@triton.jit", 1))
    path = os.path.join(tempfile.mkdtemp(prefix="weft_tutorial_attention_backward_"), "tutorial_backward.py")
    with open(path, "w") as f:
        f.write("\n\n".join(parts))
    spec = importlib.util.spec_from_file_location("tutorial_backward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.row_deltas, module.attention_backward_kernel


def attention_backward(q, k, v, out, lse, do, causal=False, softmax_scale=None):
    """(dq, dk, dv) by Triton for [batch, heads, seq, head_dim] q, k, v, the forward's out
    and natural-log lse [batch, heads, seq] (fp32), and dO."""
    from weft.highlevel.attention_backward_example import attention_backward as backward

    return backward(q, k, v, out, lse, do, causal, softmax_scale, kernels=triton_kernels())
