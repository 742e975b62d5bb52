"""Eager-mode time of weft's public wrappers beside torch, one process per weft tree:
do_bench (median, CUDA events) of the Python call, host path included, after an output
check against torch. Run it once per tree with PYTHONPATH pointing at that tree's package,
alternating trees, to see what a host-path change costs a user who calls from eager torch.

    PYTHONPATH=/tmp/pkg/old python3 benchmarks/eager_calls.py --out old.json
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    import torch
    import triton.testing
    import weft
    from weft.kernels.attention import flash_attention
    from weft.kernels.matmul import matmul

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []

    def bench(name, shape, fn, ref_fn, flops):
        out, ref = fn(), ref_fn()
        error = float(((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item())
        if error > 2e-2:
            rows.append(dict(system=name, shape=shape, error=error, failed="wrong result"))
            return
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        rows.append(dict(system=name, shape=shape, error=error, eager_ms=ms,
                         tflops=flops / ms / 1e9))

    for b, h, s, d, causal in ((16, 16, 1024, 128, False), (4, 16, 4096, 128, False),
                               (4, 16, 4096, 128, True), (4, 32, 4096, 64, False)):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1)
        cudnn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            for name, fn in (("weft", lambda: flash_attention(q, k, v, causal=causal)), ("cudnn", cudnn)):
                bench(f"attention {name}", [b, h, s, d, causal], fn, cudnn, flops)
    for m, n, kk in ((4096, 4096, 4096), (8192, 8192, 8192)):
        a = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16)
        bt = torch.randn(kk, n, device="cuda", dtype=torch.bfloat16)
        for name, fn in (("weft", lambda: matmul(a, bt)), ("cublas", lambda: a @ bt)):
            bench(f"matmul {name}", [m, n, kk], fn, lambda: a @ bt, 2 * m * n * kk)
    print(f"weft from {weft.__file__}")
    for row in rows:
        print(f"{row['system']:>18} {str(row['shape']):>24} "
              f"{row.get('eager_ms', float('nan')) * 1e3:9.1f} us {row.get('tflops', 0):7.1f} TFLOP/s")
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
