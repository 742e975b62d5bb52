"""Matmul on the H200: every weft variant beside torch.matmul (cuBLAS), a plain Triton
matmul and, for fp8, torch._scaled_mm, in one run. Each result is checked against an
fp32 torch reference before it is timed.

    python -m weft.benchmarks.matmul [--quick] [--out results.json]

TFLOP/s = 2 M N K / time, the time of the GPU work measured by CUDA-graph replay for every
system alike; weft's host time per call (descriptors, checks, launch) is reported beside.
"""

from __future__ import annotations

import argparse
import json
import sys


def _time(torch, fn) -> float:
    """Seconds per call of the GPU work alone: CUDA-graph replays (benchmarks/NOTES.md),
    the same method for every system."""
    from weft.benchmarks.memory_bound import _graph_bench

    return _graph_bench([fn], repeats=3, replays=5) * 1e-3


def _host_time(torch, fn, calls=30) -> float:
    """Seconds of host time per call (launches queue without waiting)."""
    import time

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls


def _error(out, ref) -> float:
    return float(((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item())


def run(quick: bool = False) -> list[dict]:
    import torch

    from weft.kernels.matmul import Config, matmul

    results = []
    sizes = [(4096, 4096, 4096)] if quick else [(4096, 4096, 4096), (8192, 8192, 8192)]
    variants = {
        "weft (autotuned)": None,
        "weft ws 128x256x64 s3": Config(128, 256, 64, 3, variant="warp_specialized"),
        "weft ws 128x128x64 s5": Config(128, 128, 64, 5, variant="warp_specialized"),
        "weft pipelined 128x256x64 s3": Config(128, 256, 64, 3, variant="pipelined"),
    }
    torch.manual_seed(0)
    for m, n, k in sizes:
        flops = 2 * m * n * k
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            ref = a.float() @ b.float()
            row = {"shape": [m, n, k], "dtype": str(dtype).replace("torch.", "")}
            cublas = _time(torch, lambda: torch.matmul(a, b))
            row["cublas_tflops"] = flops / cublas / 1e12
            try:
                from weft.benchmarks import triton_matmul

                row["triton_error"] = _error(triton_matmul.matmul(a, b), ref)
                row["triton_tflops"] = flops / _time(torch, lambda: triton_matmul.matmul(a, b)) / 1e12
            except Exception as error:  # Triton missing or failing: say so, keep going
                row["triton_failure"] = f"{type(error).__name__}: {error}"[:300]
            for name, config in variants.items():
                try:
                    err = _error(matmul(a, b, config=config), ref)
                    entry = {"error": err}
                    if err < 2e-2:
                        entry["tflops"] = flops / _time(torch, lambda: matmul(a, b, config=config)) / 1e12
                        entry["vs_cublas"] = entry["tflops"] / row["cublas_tflops"]
                        entry["host_us"] = 1e6 * _host_time(torch, lambda: matmul(a, b, config=config))
                except Exception as error:
                    entry = {"failure": f"{type(error).__name__}: {error}"[:500]}
                row[name] = entry
            results.append(row)
        # fp8 e4m3: A [M, K], B K-major, bf16 out, beside torch._scaled_mm with unit scales.
        a8 = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        bt8 = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        b8 = bt8.t()
        ref = a8.float() @ b8.float()
        one = torch.ones((), device="cuda")
        row = {"shape": [m, n, k], "dtype": "fp8e4m3"}
        scaled = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        row["scaled_mm_error"] = _error(scaled(), ref)
        row["scaled_mm_tflops"] = flops / _time(torch, scaled) / 1e12
        for name, config in {"weft fp8 (autotuned)": None,
                             "weft fp8 ws 128x256x128 s3": Config(128, 256, 128, 3)}.items():
            try:
                err = _error(matmul(a8, b8, torch.bfloat16, config=config), ref)
                entry = {"error": err}
                if err < 2e-2:
                    entry["tflops"] = flops / _time(torch, lambda: matmul(a8, b8, torch.bfloat16, config=config)) / 1e12
                    entry["vs_scaled_mm"] = entry["tflops"] / row["scaled_mm_tflops"]
            except Exception as error:
                entry = {"failure": f"{type(error).__name__}: {error}"[:500]}
            row[name] = entry
        results.append(row)
    return results


def print_table(results) -> None:
    print(f"{'shape':>16} {'dtype':>8} {'variant':>30} {'TFLOP/s':>8} {'ratio':>6} {'err':>8} {'host us':>8}")
    for row in results:
        shape = "x".join(map(str, row["shape"]))
        for key in ("cublas_tflops", "triton_tflops", "scaled_mm_tflops"):
            if key in row:
                print(f"{shape:>16} {row['dtype']:>8} {key.replace('_tflops', ''):>30} {row[key]:8.1f}")
        for name, entry in row.items():
            if isinstance(entry, dict):
                ratio = entry.get("vs_cublas", entry.get("vs_scaled_mm", float("nan")))
                if "failure" in entry:
                    print(f"{shape:>16} {row['dtype']:>8} {name:>30} FAILED {entry['failure'][:120]}")
                else:
                    print(f"{shape:>16} {row['dtype']:>8} {name:>30} {entry.get('tflops', float('nan')):8.1f} "
                          f"{ratio:6.3f} {entry['error']:8.1e} {entry.get('host_us', float('nan')):8.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    results = run(args.quick)
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
