"""Where the host time of one kernel-family call goes (cProfile over many calls).

    python -m benchmarks.profile_host [softmax|layer_norm]
"""

from __future__ import annotations

import cProfile
import pstats
import sys


def main(which: str = "layer_norm") -> None:
    import torch

    from weft.kernels.layer_norm import layer_norm
    from weft.kernels.softmax import softmax

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    call = (lambda: layer_norm(x, w, b, 1e-5)) if which == "layer_norm" else (lambda: softmax(x))
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        call()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main(*sys.argv[1:])
