"""The tutorial's attention backward (highlevel/attention_backward_example.py) launched
twice per system and mask, for Nsight Compute to profile: Triton 3.6 and weft.highlevel on
the same source, bf16, batch 4, seq 4096, 2048 / head_dim heads (the backward benchmark's
shape). Run it under ncu with benchmarks/ncu_tutorial_backward.sh, which prints the table.

    python3 -m benchmarks.profile_tutorial_backward 64 triton,weft.hl nocausal,causal
"""

from __future__ import annotations

import sys

SEQ, BATCH, WIDTH = 4096, 4, 2048  # heads * head_dim


def main(argv: list[str]) -> int:
    import torch

    from benchmarks.attention import random_inputs
    from benchmarks.attention_backward import _hl_options
    from benchmarks.triton_attention_backward import attention_backward as triton_backward
    from weft.highlevel.attention_backward_example import attention_backward as weft_backward
    from weft.kernels.attention import flash_attention

    head_dim = int(argv[0])
    systems = argv[1].split(",") if len(argv) > 1 else ["triton", "weft.hl"]
    masks = argv[2].split(",") if len(argv) > 2 else ["nocausal", "causal"]
    q, k, v, do = random_inputs(torch, 4, BATCH, WIDTH // head_dim, SEQ, head_dim)
    for mask in masks:
        causal = mask == "causal"
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        for system in systems:
            if system == "triton":
                triton_backward(q, k, v, out, lse, do, causal=causal)
            else:
                weft_backward(q, k, v, out, lse, do, causal=causal, **(_hl_options(system) or {}))
            torch.cuda.synchronize()
            print(f"launched {system} {mask}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
