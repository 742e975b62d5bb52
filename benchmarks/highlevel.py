"""weft.highlevel beside the hand-written lowlevel kernels and Triton, one run.

    python -m benchmarks.highlevel [--out results.json]

Same method as memory_bound.py: each kernel is checked against float64 first, then timed
by CUDA-graph replay over 4 rotating input sets; the copy roof is measured in the run.
"""

from __future__ import annotations

import argparse
import json
import sys


def run() -> dict:
    import torch

    from benchmarks import triton_reference as triton_ref
    from benchmarks.memory_bound import _graph_bench, _relative_error, copy_roof
    from weft.highlevel import examples as high
    from weft.kernels import layer_norm as low_norm
    from weft.kernels import softmax as low_softmax
    from weft.kernels import vector_add as low_add

    torch.manual_seed(0)
    roof = copy_roof(torch)
    rows = []
    shape = (4096, 4096)
    for dtype in (torch.float32, torch.bfloat16):
        xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4)]
        ys = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4)]
        w = torch.randn(shape[1], device="cuda", dtype=dtype)
        b = torch.randn(shape[1], device="cuda", dtype=dtype)
        size = xs[0].element_size() * xs[0].numel()
        cases = {
            "softmax": ({"highlevel": lambda i: high.softmax(xs[i]), "lowlevel": lambda i: low_softmax.softmax(xs[i]),
                         "triton": lambda i: triton_ref.softmax(xs[i])},
                        torch.softmax(xs[0].double(), -1), 2 * size),
            "layer_norm": ({"highlevel": lambda i: high.layer_norm(xs[i], w, b, 1e-5),
                            "lowlevel": lambda i: low_norm.layer_norm(xs[i], w, b, 1e-5),
                            "triton": lambda i: triton_ref.layer_norm(xs[i], w, b, 1e-5)},
                           torch.nn.functional.layer_norm(xs[0].double(), (shape[1],), w.double(), b.double(), 1e-5),
                           2 * size),
            "vector_add": ({"highlevel": lambda i: high.add(xs[i], ys[i]), "lowlevel": lambda i: low_add.add(xs[i], ys[i]),
                            "triton": lambda i: triton_ref.add(xs[i], ys[i])},
                           xs[0].double() + ys[0].double(), 3 * size),
        }
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        for name, (systems, reference, moved) in cases.items():
            row = {"kernel": name, "dtype": str(dtype).split(".")[-1]}
            for system, fn in systems.items():
                error = _relative_error(fn(0), reference)
                row[f"{system}_error"] = error
                if error > tolerance:
                    row[f"{system}_gbps"] = None
                    continue
                ms = _graph_bench([lambda i=i, fn=fn: fn(i) for i in range(4)])
                row[f"{system}_gbps"] = moved / (ms * 1e-3) / 1e9
            if all(row.get(f"{s}_gbps") for s in systems):
                row["high_over_low"] = row["highlevel_gbps"] / row["lowlevel_gbps"]
                row["high_over_triton"] = row["highlevel_gbps"] / row["triton_gbps"]
                row["high_over_roof"] = row["highlevel_gbps"] / roof
            rows.append(row)
    return {"copy_roof_gbps": roof, "rows": rows, "device": torch.cuda.get_device_name()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    results = run()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"device {results['device']}  copy roof {results['copy_roof_gbps']:.0f} GB/s (CUDA-graph kernel time)")
    print(f"{'kernel':<11}{'dtype':<9}{'high GB/s':>10}{'low':>7}{'triton':>8}{'high/low':>9}{'high/tri':>9}{'/roof':>7}")
    ok = True
    for r in results["rows"]:
        if "high_over_low" not in r:
            ok = False
            errors = {k: f"{v:.1e}" for k, v in r.items() if k.endswith("_error")}
            print(f"{r['kernel']:<11}{r['dtype']:<9} WRONG RESULT {errors}")
            continue
        print(f"{r['kernel']:<11}{r['dtype']:<9}{r['highlevel_gbps']:>10.0f}{r['lowlevel_gbps']:>7.0f}"
              f"{r['triton_gbps']:>8.0f}{r['high_over_low']:>9.2f}{r['high_over_triton']:>9.2f}{r['high_over_roof']:>7.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
