"""Small matmuls of every variant, checked against torch: the workload compute-sanitizer
runs (memcheck, racecheck) in benchmarks/run_matmul_gpu.sh."""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    from weft.kernels.matmul import Config, matmul

    torch.manual_seed(0)
    failures = 0
    cases = [("warp_specialized", torch.bfloat16, False), ("pipelined", torch.float16, True),
             ("warp_specialized", torch.float8_e4m3fn, True)]
    for variant, dtype, k_major in cases:
        m, n, k = 200, 136, 264
        block_k = 128 if dtype.itemsize == 1 else 64
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(n, k, device="cuda").to(dtype).t() if k_major else torch.randn(k, n, device="cuda").to(dtype)
        out = matmul(a, b, torch.bfloat16, config=Config(128, 128, block_k, 2, variant=variant)).float()
        ref = a.float() @ b.float()
        error = ((out - ref).abs().max() / ref.abs().max()).item()
        ok = error < 1e-2
        failures += not ok
        print(f"{variant:>17} {str(dtype):>22} k_major={k_major}: max rel error {error:.2e} {'ok' if ok else 'WRONG'}")
    torch.cuda.synchronize()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
