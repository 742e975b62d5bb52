"""Memory-bound kernels on the GPU: weft beside torch eager and the copy roof, one run.

    python -m benchmarks.memory_bound [--out results.json] [--quick]

Every timed kernel is first checked against a float64 reference on fresh random inputs
(poisoned outputs, so unwritten elements fail). Bandwidth counts bytes read plus bytes
written once each; the roof is a device-to-device copy measured in the same run.

Kernel time is measured by replaying a CUDA graph of 20 calls that rotate over 4 input
sets (so no input is still in L2): at these sizes a kernel runs ~20 us, less than any
Python launcher's host time per call (weft's, Triton's or torch's), and timing calls one
by one would measure the host. The end-to-end time per call (`do_bench`, host included)
is reported beside it. Also measured: the host cost of a cached 3-argument launch.
"""

from __future__ import annotations

import argparse
import json
import sys


def _bench(fn, warmup=25, rep=100):
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")  # milliseconds


def _capture_graph(fns, repeats: int):
    """A CUDA graph of `repeats` passes over `fns`, each called once before the capture
    (it compiles and allocates there, not inside the graph)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(repeats):
                for fn in fns:
                    fn()
    torch.cuda.synchronize()
    return graph


def _graph_bench(fns, repeats=5, replays=10) -> float:
    """Milliseconds per call: a CUDA graph of `repeats` passes over `fns` (one per input
    set), replayed `replays` times between two events."""
    import torch

    graph = _capture_graph(fns, repeats)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * repeats * len(fns))


def _graph_bench_window(fn, seconds: float, warmup: float, repeats: int = 3) -> float:
    """Milliseconds per call over at least `seconds` of back-to-back replays of a CUDA
    graph of `repeats` calls, after at least `warmup` seconds of them: the window of
    triton.testing.do_bench (100 ms after 25 ms; ../shared/BENCHMARKS.md) whatever a call
    takes. A fixed count of calls times a short kernel over a few milliseconds, before the
    GPU's power limiter has pulled its clock down (docs/performance-journal.md)."""
    import math

    import torch

    graph = _capture_graph([fn], repeats)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    per_replay = max(start.elapsed_time(end) * 1e-3, 1e-6)
    for _ in range(math.ceil(warmup / per_replay)):
        graph.replay()
    replays = math.ceil(seconds / per_replay)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * repeats)


def _relative_error(out, ref) -> float:
    import torch

    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))


def copy_roof(torch, nbytes=1 << 30):
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9  # GB/s


def launch_overhead(torch):
    """Microseconds of host time per cached launch of a 3-argument kernel: weft and Triton
    (launch_overhead.py measures them, with the raw driver calls beside them)."""
    from benchmarks.launch_overhead import run as launch_paths

    paths = launch_paths()
    return {"weft": paths["weft jit kernel[grid](x, y, n)"],
            "triton": paths["triton kernel[grid](x, y, n)"], "paths": paths}


def run(quick=False):
    import torch

    from benchmarks import triton_reference as triton_ref
    from weft.kernels.layer_norm import layer_norm
    from weft.kernels.softmax import softmax
    from weft.kernels.vector_add import add

    torch.manual_seed(0)
    roof = copy_roof(torch)
    rows = []
    shapes = [(4096, 4096)] if quick else [(4096, 4096), (8192, 1024), (2048, 8192), (4096, 1000)]
    for dtype in (torch.float32, torch.bfloat16):
        for shape in shapes:
            sets = 4
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(sets)]
            ys = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(sets)]
            w = torch.randn(shape[1], device="cuda", dtype=dtype)
            b = torch.randn(shape[1], device="cuda", dtype=dtype)
            x, y = xs[0], ys[0]
            nbytes = 2 * x.numel() * x.element_size()
            cases = {
                "softmax": (lambda i: softmax(xs[i]), lambda i: torch.softmax(xs[i], dim=-1),
                            lambda i: triton_ref.softmax(xs[i]), torch.softmax(x.double(), dim=-1), nbytes),
                "layer_norm": (lambda i: layer_norm(xs[i], w, b, 1e-5),
                               lambda i: torch.nn.functional.layer_norm(xs[i], (shape[1],), w, b, 1e-5),
                               lambda i: triton_ref.layer_norm(xs[i], w, b, 1e-5),
                               torch.nn.functional.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-5),
                               nbytes + 2 * w.numel() * w.element_size()),
                "vector_add": (lambda i: add(xs[i], ys[i]), lambda i: xs[i] + ys[i], lambda i: triton_ref.add(xs[i], ys[i]),
                               x.double() + y.double(), 3 * x.numel() * x.element_size()),
            }
            for name, (weft_fn, torch_fn, triton_fn, reference, moved) in cases.items():
                tolerance = 1e-5 if dtype == torch.float32 else 1e-2
                error = _relative_error(weft_fn(0), reference)
                triton_error = _relative_error(triton_fn(0), reference)
                row = {"kernel": name, "dtype": str(dtype).split(".")[-1], "shape": list(shape),
                       "rel_error": error, "correct": error <= tolerance and triton_error <= tolerance}
                if row["correct"]:
                    times = {}
                    for system, fn in (("weft", weft_fn), ("torch", torch_fn), ("triton", triton_fn)):
                        times[system] = _graph_bench([lambda i=i, fn=fn: fn(i) for i in range(sets)])
                        row[f"{system}_ms"] = times[system]
                        row[f"{system}_gbps"] = moved / (times[system] * 1e-3) / 1e9
                        row[f"{system}_end_to_end_ms"] = _bench(lambda fn=fn: fn(0))
                    row["weft_over_roof"] = row["weft_gbps"] / roof
                    row["weft_over_torch"] = times["torch"] / times["weft"]
                    row["weft_over_triton"] = times["triton"] / times["weft"]
                rows.append(row)
    overhead = launch_overhead(torch)
    return {"copy_roof_gbps": roof, "rows": rows, "launch_us": overhead,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}


def print_table(results) -> None:
    print(f"device {results['device']}  copy roof {results['copy_roof_gbps']:.0f} GB/s  "
          "(GB/s from CUDA-graph replay; e2e = end-to-end us per call, host included)")
    print(f"{'kernel':<11}{'dtype':<9}{'shape':<12}{'err':>9}{'weft GB/s':>11}{'torch':>7}{'triton':>8}"
          f"{'/roof':>7}{'/torch':>8}{'/triton':>8}{'e2e weft':>10}{'triton':>8}")
    for r in results["rows"]:
        shape = "x".join(map(str, r["shape"]))
        if not r["correct"]:
            print(f"{r['kernel']:<11}{r['dtype']:<9}{shape:<12}{r['rel_error']:>9.1e}   WRONG RESULT")
            continue
        print(f"{r['kernel']:<11}{r['dtype']:<9}{shape:<12}{r['rel_error']:>9.1e}{r['weft_gbps']:>11.0f}"
              f"{r['torch_gbps']:>7.0f}{r['triton_gbps']:>8.0f}{r['weft_over_roof']:>7.2f}"
              f"{r['weft_over_torch']:>8.2f}{r['weft_over_triton']:>8.2f}"
              f"{r['weft_end_to_end_ms'] * 1e3:>10.1f}{r['triton_end_to_end_ms'] * 1e3:>8.1f}")
    launch = results["launch_us"]
    print(f"cached launch (host us): weft {launch['weft']:.1f}  triton {launch['triton']:.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the full results as JSON here")
    parser.add_argument("--quick", action="store_true", help="one shape per kernel")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print_table(results)
    return 0 if all(r["correct"] for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
