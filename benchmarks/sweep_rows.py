"""Configuration sweep for the row kernels (softmax, layer norm): one row per CTA with the
row in registers, and persistent CTAs streaming rows through a shared-memory ring.

    python -m benchmarks.sweep_rows [--shapes 4096x4096 2048x8192] [--out sweep.json]

Every configuration is checked against a float64 reference before it is timed; the
copy roof and the default configuration are measured in the same run.
"""

from __future__ import annotations

import argparse
import json


def _configs(kernel, block: int, bits: int, rings: bool = True):
    """(label, config) pairs to try for one row length."""
    from weft.kernels import layer_norm, softmax

    vector = 128 // bits
    make = layer_norm.Config if kernel == "layer_norm" else softmax.Config
    yield "default", None
    for warps in (4, 8, 16):
        if block < 32 * warps * vector:
            continue
        yield f"registers w{warps}", make(block, warps, vector)
        if kernel == "softmax":
            hints = {"cs": {"out_cache": ".cs"}, "evict+cs": {"row_eviction": "evict_first", "out_cache": ".cs"}}
            for name, options in hints.items():
                yield f"registers w{warps} {name}", make(block, warps, vector, **options)
        if kernel == "layer_norm":
            hints = {"evict": {"row_eviction": "evict_first"}, "no_allocate": {"row_eviction": "no_allocate"},
                     "cg": {"row_cache": ".cg"},
                     "evict+wlast": {"row_eviction": "evict_first", "weight_eviction": "evict_last"},
                     "evict+cs": {"row_eviction": "evict_first", "out_cache": ".cs"},
                     "evict+cg": {"row_eviction": "evict_first", "out_cache": ".cg"},
                     "evict+wlast+cs": {"row_eviction": "evict_first", "weight_eviction": "evict_last",
                                        "out_cache": ".cs"}}
            for name, options in hints.items():
                yield f"registers w{warps} {name}", make(block, warps, vector, **options)
            if bits == 32:
                yield f"registers w{warps} early", make(block, warps, vector, early_weights=True)
                yield f"registers w{warps} early+cs", make(block, warps, vector, early_weights=True,
                                                           out_cache=".cs")
                yield f"registers w{warps} early+evict+cs", make(block, warps, vector, early_weights=True,
                                                                 row_eviction="evict_first", out_cache=".cs")
        if warps == 16 or not rings:  # rings with 16 warps measured slowest everywhere (docs/performance-journal.md)
            continue
        for stages in (1, 2, 4):
            if stages * block * bits // 8 > 200 * 1024:
                continue
            holds = (False, True) if kernel == "layer_norm" else (False,)
            for hold in holds:
                extra = {"hold_weights": True} if hold else {}
                label = f"ring w{warps} s{stages}" + (" hold" if hold else "")
                yield label, make(block, warps, vector, 0, stages, **extra)


def run(shapes, kernels=("softmax", "layer_norm"), dtypes=("bfloat16", "float32"), rings=True) -> dict:
    import torch

    from benchmarks.memory_bound import _graph_bench, _relative_error, copy_roof
    from weft.kernels import layer_norm, softmax

    roof = copy_roof(torch)
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            dtype = getattr(torch, dtype)
            bits = dtype.itemsize * 8
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4)]
            w = torch.randn(shape[1], device="cuda", dtype=dtype)
            b = torch.randn(shape[1], device="cuda", dtype=dtype)
            moved = 2 * xs[0].numel() * xs[0].element_size()
            block = 1 << (shape[1] - 1).bit_length()
            references = {
                "softmax": torch.softmax(xs[0].double(), -1),
                "layer_norm": torch.nn.functional.layer_norm(xs[0].double(), (shape[1],), w.double(),
                                                             b.double(), 1e-5)}
            for kernel in kernels:
                for label, config in _configs(kernel, block, bits, rings):
                    if kernel == "softmax":
                        fn = lambda i, c=config: softmax.softmax(xs[i], c)  # noqa: E731
                    else:
                        fn = lambda i, c=config: layer_norm.layer_norm(xs[i], w, b, 1e-5, config=c)  # noqa: E731
                    row = {"kernel": kernel, "dtype": str(dtype).split(".")[-1], "shape": list(shape),
                           "config": label}
                    try:
                        row["rel_error"] = _relative_error(fn(0), references[kernel])
                    except Exception as error:  # a config that does not compile or launch
                        row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                        rows.append(row)
                        continue
                    if row["rel_error"] < (1e-5 if bits == 32 else 1e-2):
                        ms = _graph_bench([lambda i=i, fn=fn: fn(i) for i in range(4)])
                        row.update(ms=ms, gbps=moved / (ms * 1e-3) / 1e9,
                                   over_roof=moved / (ms * 1e-3) / 1e9 / roof)
                    rows.append(row)
    return {"copy_roof_gbps": roof, "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["4096x4096"])
    parser.add_argument("--kernels", nargs="+", default=["softmax", "layer_norm"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--no-rings", action="store_true", help="registers-only configurations")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes]
    results = run(shapes, args.kernels, args.dtypes, not args.no_rings)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"copy roof {results['copy_roof_gbps']:.0f} GB/s")
    for r in results["rows"]:
        if "gbps" in r:
            shown = f"{r['gbps']:7.0f} GB/s {r['over_roof']:.3f} roof"
        else:
            shown = r.get("error") or f"WRONG {r['rel_error']:.1e}"
        shape = "x".join(map(str, r["shape"]))
        print(f"{r['kernel']:<11}{r['dtype']:<9}{shape:<10}{r['config']:<20}{shown}")


if __name__ == "__main__":
    main()
