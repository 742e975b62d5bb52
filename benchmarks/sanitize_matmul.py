"""Small matmuls of every variant, checked against torch: the workload compute-sanitizer
runs (memcheck, racecheck) in benchmarks/run_matmul_gpu.sh."""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    from weft.kernels.matmul import Config, matmul

    torch.manual_seed(0)
    failures = 0
    # (variant, dtype, B K-major, split_k, block_m, m): split-K twice, the second
    # call adding into the scratch the first left zeroed; the odd size is staged.
    cases = [("warp_specialized", torch.bfloat16, False, 1, 128, 200), ("pipelined", torch.float16, True, 1, 128, 200),
             ("warp_specialized", torch.float8_e4m3fn, True, 1, 128, 200),
             ("warp_specialized", torch.bfloat16, True, 3, 64, 5), ("warp_specialized", torch.bfloat16, True, 3, 64, 5),
             ("warp_specialized", torch.float16, False, 4, 128, 131)]
    for variant, dtype, k_major, split_k, block_m, m in cases:
        n, k = 136, 264 if m != 131 else 1001
        block_k = 128 if dtype.itemsize == 1 else 64
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(n, k, device="cuda").to(dtype).t() if k_major else torch.randn(k, n, device="cuda").to(dtype)
        config = Config(block_m, 128, block_k, 2, num_warps=block_m // 16, variant=variant, split_k=split_k)
        out = matmul(a, b, torch.bfloat16, config=config).float()
        ref = a.float() @ b.float()
        error = ((out - ref).abs().max() / ref.abs().max()).item()
        ok = error < 1e-2
        failures += not ok
        print(f"{variant:>17} split_k={split_k} {str(dtype):>22} k_major={k_major}: max rel error {error:.2e} {'ok' if ok else 'WRONG'}")
    # (config, B K-major, m, n, k): 128x192 tiles (two_piece.py) cut in both pieces; gemv
    # unsplit and split (twice: the second call adds into the workspace the first left zeroed).
    gemv = dict(num_warps=4, group_m=1, variant="gemv")
    explicit = [(Config(128, 192, 64, 3, group_m=8), False, 200, 300, 264),
                (Config(128, 192, 64, 3, group_m=8), True, 131, 150, 264),
                (Config(1, 16, 256, **gemv), True, 1, 136, 1000), (Config(1, 64, 64, **gemv), False, 1, 136, 1000),
                (Config(1, 16, 256, split_k=3, **gemv), True, 3, 136, 1000),
                (Config(1, 16, 256, split_k=3, **gemv), True, 3, 136, 1000),
                (Config(1, 64, 64, split_k=5, **gemv), False, 2, 136, 1000)]
    for config, k_major, m, n, k in explicit:
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = (torch.randn(n, k, device="cuda").to(torch.bfloat16).t() if k_major else
             torch.randn(k, n, device="cuda").to(torch.bfloat16))
        out = matmul(a, b, config=config).float()
        ref = a.float() @ b.float()
        error = ((out - ref).abs().max() / ref.abs().max()).item()
        ok = error < 1e-2
        failures += not ok
        print(f"{config.variant:>17} {config.block_m}x{config.block_n} split_k={config.split_k} k_major={k_major}: "
              f"max rel error {error:.2e} {'ok' if ok else 'WRONG'}")
    torch.cuda.synchronize()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
