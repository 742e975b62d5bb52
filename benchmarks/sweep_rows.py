"""Configuration sweep for the row kernels (softmax, layer norm) at one shape.

    python -m weft.benchmarks.sweep_rows [--shape 4096 4096]

Every configuration is checked against a float64 reference before it is timed.
"""

from __future__ import annotations

import argparse


def run(shape) -> list[dict]:
    import torch

    from weft.benchmarks.memory_bound import _graph_bench, _relative_error, copy_roof
    from weft.kernels import layer_norm, softmax

    roof = copy_roof(torch)
    rows = []
    for dtype, bits in ((torch.bfloat16, 16), (torch.float32, 32)):
        xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4)]
        w = torch.randn(shape[1], device="cuda", dtype=dtype)
        b = torch.randn(shape[1], device="cuda", dtype=dtype)
        moved = 2 * xs[0].numel() * xs[0].element_size()
        ref_softmax = torch.softmax(xs[0].double(), -1)
        ref_norm = torch.nn.functional.layer_norm(xs[0].double(), (shape[1],), w.double(), b.double(), 1e-5)
        block = 1 << (shape[1] - 1).bit_length()
        for warps in (4, 8, 16):
            vector = 128 // bits
            if block < 32 * warps * vector:
                continue
            cases = [("softmax", lambda i, c=softmax.Config(block, warps, vector): softmax.softmax(xs[i], c), ref_softmax)]
            for early in (False, True):
                config = layer_norm.Config(block, warps, vector, 0, early)
                label = "layer_norm" + ("_early" if early else "")
                cases.append((label, lambda i, c=config: layer_norm.layer_norm(xs[i], w, b, 1e-5, config=c), ref_norm))
            for name, fn, ref in cases:
                error = _relative_error(fn(0), ref)
                row = {"kernel": name, "dtype": str(dtype).split(".")[-1], "warps": warps, "vector": vector,
                       "rel_error": error}
                if error < (1e-5 if bits == 32 else 1e-2):
                    ms = _graph_bench([lambda i=i: fn(i) for i in range(4)])
                    row.update(ms=ms, gbps=moved / (ms * 1e-3) / 1e9, over_roof=moved / (ms * 1e-3) / 1e9 / roof)
                rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=int, nargs=2, default=(4096, 4096))
    args = parser.parse_args(argv)
    rows = run(tuple(args.shape))
    for r in rows:
        shown = f"{r['gbps']:7.0f} GB/s {r['over_roof']:.2f} roof" if "gbps" in r else f"WRONG {r['rel_error']:.1e}"
        print(f"{r['kernel']:<20}{r['dtype']:<9} warps {r['warps']:>2} vec {r['vector']}  {shown}")


if __name__ == "__main__":
    main()
