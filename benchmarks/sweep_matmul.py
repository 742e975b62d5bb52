"""Sweep matmul configs at one size beside cuBLAS, with the SM clock read after each
timing (to tell a slower kernel from a throttled GPU). Used to choose configs_for.

    python -m benchmarks.sweep_matmul [M N K]
"""

from __future__ import annotations

import subprocess
import sys


def _clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as error:  # no nvidia-smi: say so
        return f"? ({error})"


def main(argv=None) -> int:
    import torch

    from benchmarks.matmul import _error, _time
    from weft.kernels.matmul import Config, matmul

    m, n, k = (int(x) for x in (argv or sys.argv[1:] or [8192, 8192, 8192]))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    flops = 2 * m * n * k
    t = _time(torch, lambda: torch.matmul(a, b))
    print(f"cublas {flops / t / 1e12:7.1f} TFLOP/s  clock {_clock()}")
    configs = [Config(128, 256, 64, 3, group_m=g, variant=v) for v in ("warp_specialized", "pipelined")
               for g in (4, 8, 16, 32)]
    configs += [Config(128, 128, 64, s, group_m=g) for s in (4, 5) for g in (8, 16)]
    for config in configs:
        err = _error(matmul(a, b, config=config), ref)
        t = _time(torch, lambda: matmul(a, b, config=config))
        print(f"{config.variant:>17} {config.block_n} s{config.stages} g{config.group_m:<3} "
              f"{flops / t / 1e12:7.1f} TFLOP/s err {err:.1e} clock {_clock()}")
    t = _time(torch, lambda: torch.matmul(a, b))
    print(f"cublas {flops / t / 1e12:7.1f} TFLOP/s  clock {_clock()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
