"""Small attention backwards of every head_dim, causal and not, GQA and tails, checked
against float32 torch autograd: the workload compute-sanitizer runs (memcheck, racecheck)
on the GPU machine, e.g.

    compute-sanitizer --tool racecheck python3 -m benchmarks.sanitize_attention_backward [--dq tma] [--pipelined]

`--dq` and `--pipelined` pick the backward variant (default_backward_config's arguments);
`--split columns` runs columns_split_config (backward.py) with that dQ accumulation.
"""

from __future__ import annotations

import argparse
import sys


def _reference(q, k, v, do, causal):
    import torch

    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    seq_q, seq_k = q.shape[2], k.shape[2]
    if causal:  # bottom-right aligned, as flash_attention; every row here sees a key
        keys = torch.arange(seq_k, device=q.device)[None, :]
        rows = torch.arange(seq_q, device=q.device)[:, None]
        s = s.masked_fill(keys > rows + (seq_k - seq_q), float("-inf"))
    (torch.softmax(s, -1) @ v.repeat_interleave(group, 1) * do.float()).sum().backward()
    return q.grad, k.grad, v.grad


def main(argv=None) -> int:
    import torch

    from weft.kernels.attention import flash_attention, flash_attention_backward
    from weft.kernels.attention.backward_host import columns_split_config, default_backward_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dq", choices=("atomics", "tma"), default="atomics", help="dQ accumulation")
    parser.add_argument("--pipelined", action="store_true", help="the software-pipelined walk")
    parser.add_argument("--split", choices=("columns", "keys"), default="keys",
                        help="what the consumer warpgroups split (BackwardConfig.split)")
    parser.add_argument("--cases", help="comma-separated indices of the cases to run (racecheck is slow)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    failures = 0
    # (heads, kv_heads, seq_q, seq_k, head_dim, causal): small enough for the sanitizers
    cases = [(2, 1, 130, 200, 64, True), (2, 2, 64, 64, 64, False), (2, 1, 100, 77, 128, False),
             (2, 2, 96, 160, 128, True), (2, 1, 70, 70, 256, True)]
    if args.cases:
        cases = [cases[int(i)] for i in args.cases.split(",")]
    for heads, kv_heads, seq_q, seq_k, head_dim, causal in cases:
        q = torch.randn(1, heads, seq_q, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, kv_heads, seq_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        try:
            config = columns_split_config(head_dim, args.dq, args.pipelined) if args.split == "columns" else \
                default_backward_config(head_dim, args.dq, args.pipelined)
        except ValueError as error:  # e.g. head_dim 256 has no pipelined walk with dQ by TMA
            print(f"d={head_dim}: no such variant ({error})")
            continue
        grads = flash_attention_backward(q, k, v, out, lse, do, causal=causal, config=config)
        worst = max(((g.float() - r).norm() / r.norm()).item()
                    for g, r in zip(grads, _reference(q, k, v, do, causal)))
        ok = worst < 2e-2
        failures += not ok
        print(f"h={heads}/{kv_heads} seq={seq_q}x{seq_k} d={head_dim} causal={causal}: "
              f"worst relative error {worst:.2e} {'ok' if ok else 'WRONG'}")
    torch.cuda.synchronize()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
