"""`flash_attention(q, k, v, causal=False, softmax_scale=None, return_lse=False,
layout="bhsd")`: FlashAttention-3-style forward attention on Hopper, in weft.lowlevel.

torch CUDA tensors run on the GPU; numpy arrays or CPU torch tensors run the same kernel
on the CPU emulator (numpy has no bf16: use fp16 there).

    from weft.kernels.attention import flash_attention
    o = flash_attention(q, k, v, causal=True)             # q, k, v [batch, heads, seq, head_dim]
    o, lse = flash_attention(q, k, v, return_lse=True)    # lse: fp32 [batch, heads, seq_q]

bf16/fp16; head_dim 64, 128 or 256; any sequence lengths (seq_q != seq_k: causal is
aligned bottom-right); GQA/MQA (k/v heads dividing q heads); layout="bshd" for
[batch, seq, heads, head_dim] tensors. `reference_attention` is the float64 numpy
reference. `config=` picks the kernel and its knobs: a `PingpongConfig` (the FA3 kernel;
`default_config` gives the one flash_attention picks) or a `SimpleConfig` (a baseline
without overlaps): tile sizes, stages, register budgets.

    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=True)   # the gradients

`reference_attention_backward` is its float64 numpy reference.
"""

from __future__ import annotations

from .config import ForwardConfig, SimpleConfig, shared_bytes
from .pingpong_config import PingpongConfig, default_config
from .backward_host import flash_attention_backward, reference_attention_backward
from .host import flash_attention, reference_attention

__all__ = ["ForwardConfig", "PingpongConfig", "SimpleConfig", "default_config", "flash_attention",
           "flash_attention_backward", "reference_attention", "reference_attention_backward", "shared_bytes"]
