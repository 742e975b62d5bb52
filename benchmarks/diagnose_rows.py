"""Diagnosis helper for the row kernels: timing spread within one process, and one
launch each of weft's and Triton's bf16 layer norm for ncu to profile.

    python -m benchmarks.diagnose_rows spread
    ncu --clock-control none -k regex:layer_norm -c 2 python -m benchmarks.diagnose_rows once
"""

from __future__ import annotations

import sys


def main(mode: str) -> None:
    import torch

    from benchmarks import triton_reference as triton_ref
    from benchmarks.memory_bound import _bench, _graph_bench
    from weft.kernels.layer_norm import layer_norm
    from weft.kernels.softmax import softmax

    shape = (4096, 4096)
    w = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16)
    b = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if mode == "host":
        import time

        for label, fn in (("weft layer_norm", lambda: layer_norm(x, w, b, 1e-5)),
                          ("triton layer_norm", lambda: triton_ref.layer_norm(x, w, b, 1e-5)),
                          ("weft softmax", lambda: softmax(x)),
                          ("triton softmax", lambda: triton_ref.softmax(x))):
            fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(200):
                fn()
            host = (time.perf_counter() - start) / 200 * 1e6
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(200):
                fn()
            end.record()
            torch.cuda.synchronize()
            loop = begin.elapsed_time(end) / 200 * 1e3
            # Pure GPU time: a CUDA graph of 20 calls (no host time between kernels).
            replay = _graph_bench([fn], repeats=20) * 1e3
            print(f"{label:<18} host {host:6.1f} us/call  back-to-back {loop:6.1f} us/call "
                  f"({2 * x.numel() * 2 / loop / 1e3:5.0f} GB/s)  graph replay {replay:6.1f} us "
                  f"({2 * x.numel() * 2 / replay / 1e3:5.0f} GB/s)")
        return
    if mode == "once":
        layer_norm(x, w, b, 1e-5)
        triton_ref.layer_norm(x, w, b, 1e-5)
        torch.cuda.synchronize()
        return
    moved = 2 * x.numel() * 2
    for label, fn in (("weft layer_norm", lambda: layer_norm(x, w, b, 1e-5)),
                      ("triton layer_norm", lambda: triton_ref.layer_norm(x, w, b, 1e-5)),
                      ("weft softmax", lambda: softmax(x)),
                      ("triton softmax", lambda: triton_ref.softmax(x))):
        same = [moved / (_bench(fn) * 1e-3) / 1e9 for _ in range(4)]
        fresh = []
        for _ in range(4):
            x.copy_(torch.randn(shape, device="cuda", dtype=torch.bfloat16))
            fresh.append(moved / (_bench(fn) * 1e-3) / 1e9)
        print(f"{label:<18} same input GB/s {[round(v) for v in same]}  fresh inputs {[round(v) for v in fresh]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "spread")
