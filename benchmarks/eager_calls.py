"""Eager-mode time of weft's public wrappers beside torch, one process per weft tree:
do_bench (median, CUDA events) of the Python call, host path included, beside the same
call's CUDA-graph replay time (the kernel alone), after an output check against torch.
Where the two are close, the host path hides behind the GPU work. Run it once per tree with PYTHONPATH pointing at that tree's package,
alternating trees, to see what a host-path change costs a user who calls from eager torch.

    PYTHONPATH=/tmp/pkg/old python3 benchmarks/eager_calls.py --out old.json
"""

from __future__ import annotations

import argparse
import json


def _graph_ms(torch, fn, calls: int = 10, rounds: int = 20) -> float:
    """Milliseconds per call of `fn`'s GPU work: `calls` calls captured in a CUDA graph,
    the median replay of `rounds`, timed with CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (compiles, tunes, caches)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


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
        try:
            graph_ms = _graph_ms(torch, fn)
        except Exception as exc:  # a host path that cannot be captured: say so, go on
            graph_ms, failure = None, f"{type(exc).__name__}: {exc}"[:200]
        else:
            failure = None
        rows.append(dict(system=name, shape=shape, error=error, eager_ms=ms, graph_ms=graph_ms,
                         graph_failure=failure, tflops=flops / ms / 1e9))

    for b, h, hk, s, d, causal in ((16, 16, 16, 1024, 128, False), (16, 32, 32, 1024, 64, False),
                                   (4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True),
                                   (4, 32, 32, 4096, 64, False), (2, 32, 8, 4096, 128, True)):
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1)
        cudnn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                         enable_gqa=hk != h)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            for name, fn in (("weft", lambda: flash_attention(q, k, v, causal=causal)), ("cudnn", cudnn)):
                bench(f"attention {name}", [b, h, hk, s, d, causal], fn, cudnn, flops)
    for m, n, kk in ((4096, 4096, 4096), (8192, 8192, 8192)):
        a = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16)
        bt = torch.randn(kk, n, device="cuda", dtype=torch.bfloat16)
        for name, fn in (("weft", lambda: matmul(a, bt)), ("cublas", lambda: a @ bt)):
            bench(f"matmul {name}", [m, n, kk], fn, lambda: a @ bt, 2 * m * n * kk)
    print(f"weft from {weft.__file__}")
    for row in rows:
        eager, graph = row.get("eager_ms") or float("nan"), row.get("graph_ms") or float("nan")
        print(f"{row['system']:>18} {str(row['shape']):>30} eager {eager * 1e3:9.1f} us, graph "
              f"{graph * 1e3:9.1f} us ({eager / graph:5.3f}x) {row.get('tflops', 0):7.1f} TFLOP/s eager")
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
