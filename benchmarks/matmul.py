"""Matmul on the H200: every weft variant beside torch.matmul (cuBLAS), a plain Triton
matmul and, for fp8, torch._scaled_mm, in one run. Each result is checked against an
fp32 torch reference before it is timed.

    python -m benchmarks.matmul [--quick] [--out results.json]
    python -m benchmarks.matmul --shapes classes   # decode, long K, odd sizes, LLM (matmul_classes.py)
    python -m benchmarks.matmul --shapes classes --configs [--only "long K"]   # every candidate too

TFLOP/s = 2 M N K / time, the time of the GPU work measured by CUDA-graph replay for every
system alike; weft's host time per call (descriptors, checks, launch) is reported beside.
"""

from __future__ import annotations

import argparse
import json
import sys


def _time(torch, fn) -> float:
    """Seconds per call of the GPU work alone: CUDA-graph replays (docs/performance-journal.md),
    the same method for every system."""
    from benchmarks.memory_bound import _graph_bench

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


ROUNDS = 3  # every system timed once per round, rounds interleaved: the GPU's clock
            # drifts with its temperature (1.5-2.0 GHz in one run), so no system gets
            # only the cool or only the hot minutes


def _measure(torch, row: dict, reference_name: str, systems: dict, ref, flops: int) -> None:
    """Check every system against `ref`, then time the correct ones in interleaved rounds;
    record TFLOP/s (median over rounds) and the ratio to `reference_name`."""
    timed = {}
    for name, fn in systems.items():
        try:
            err = _error(fn(), ref)
            row[name] = {"error": err}
            if err < 2e-2:
                timed[name] = fn
        except Exception as error:  # a missing backend or a failure: record it, go on
            row[name] = {"failure": f"{type(error).__name__}: {error}"[:500]}
    times = {name: [] for name in timed}
    for _ in range(ROUNDS):
        for name, fn in timed.items():
            times[name].append(_time(torch, fn))
    for name, samples in times.items():
        samples.sort()
        row[name]["tflops"] = flops / samples[len(samples) // 2] / 1e12
    base = row.get(reference_name, {}).get("tflops")
    for name in timed:
        if base and name != reference_name:
            row[name]["ratio"] = row[name]["tflops"] / base


def run(quick: bool = False) -> list[dict]:
    import torch

    from weft.kernels.matmul import Config, matmul

    results = []
    sizes = [(4096, 4096, 4096)] if quick else [(4096, 4096, 4096), (8192, 8192, 8192)]
    variants = {
        "weft (autotuned)": None,
        "weft ws 128x256x64 s3": Config(128, 256, 64, 3),
        "weft ws 128x128x64 s5": Config(128, 128, 64, 5, group_m=8),
        "weft pipelined 128x256x64 s3": Config(128, 256, 64, 3, variant="pipelined"),
    }
    torch.manual_seed(0)
    for m, n, k in sizes:
        flops = 2 * m * n * k
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            row = {"shape": [m, n, k], "dtype": str(dtype).replace("torch.", "")}
            systems = {"cublas": lambda: torch.matmul(a, b)}
            try:
                from benchmarks import triton_matmul

                systems["triton"] = lambda: triton_matmul.matmul(a, b)
            except Exception as error:  # Triton missing: say so, keep going
                row["triton"] = {"failure": f"{type(error).__name__}: {error}"[:300]}
            for name, config in variants.items():
                systems[name] = lambda config=config: matmul(a, b, config=config)
            _measure(torch, row, "cublas", systems, a.float() @ b.float(), flops)
            for name, config in variants.items():
                if "tflops" in row[name]:
                    row[name]["host_us"] = 1e6 * _host_time(torch, systems[name])
            results.append(row)
        # fp8 e4m3: A [M, K], B K-major, bf16 out, beside torch._scaled_mm with unit scales.
        a8 = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        b8 = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        row = {"shape": [m, n, k], "dtype": "fp8e4m3"}
        systems = {
            "scaled_mm": lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            "weft fp8 (autotuned)": lambda: matmul(a8, b8, torch.bfloat16),
            "weft fp8 ws 128x256x128 s3": lambda: matmul(a8, b8, torch.bfloat16, config=Config(128, 256, 128, 3)),
        }
        _measure(torch, row, "scaled_mm", systems, a8.float() @ b8.float(), flops)
        results.append(row)
    return results


def print_table(results) -> None:
    print(f"{'shape':>16} {'dtype':>8} {'system':>30} {'TFLOP/s':>8} {'ratio':>6} {'err':>8} {'host us':>8}")
    for row in results:
        shape = "x".join(map(str, row["shape"]))
        for name, entry in row.items():
            if not isinstance(entry, dict):
                continue
            if "failure" in entry:
                print(f"{shape:>16} {row['dtype']:>8} {name:>30} FAILED {entry['failure'][:120]}")
                continue
            print(f"{shape:>16} {row['dtype']:>8} {name:>30} {entry.get('tflops', float('nan')):8.1f} "
                  f"{entry.get('ratio', float('nan')):6.3f} {entry['error']:8.1e} "
                  f"{entry.get('host_us', float('nan')):8.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--shapes", choices=("squares", "classes"), default="squares",
                        help="squares: every variant at 4096^3 and 8192^3; classes: the shape classes "
                             "real models use, weft (autotuned) beside cuBLAS")
    parser.add_argument("--configs", action="store_true",
                        help="with --shapes classes: also time every candidate config of each shape "
                             "(configs_for), each forced, interleaved with cuBLAS and the autotuned pick")
    parser.add_argument("--only", help="with --shapes classes: one class (decode, 'long K', odd, LLM, square)")
    args = parser.parse_args(argv)
    if args.shapes == "classes":
        from benchmarks import matmul_classes

        matmul_classes.print_header()
        results = matmul_classes.run_classes(configs=args.configs, only=args.only)
    else:
        results = run(args.quick)
        print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
