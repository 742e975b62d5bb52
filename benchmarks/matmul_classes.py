"""Matmul across the shape classes real models use, weft beside torch.matmul (cuBLAS) in
one run: decode (M <= 64), long K with small M x N, sizes that are multiples of no tile,
LLM projections (11008, 14336), and the squares 4096^3 and 8192^3.

    python3 -m benchmarks.matmul --shapes classes [--out results.json]
    python3 -m benchmarks.matmul --shapes classes --configs [--only "long K"]

`--configs` times, beside cuBLAS and weft's autotuned pick, every candidate that
kernels/matmul/config.py `configs_for` gives the shape (each forced with `config=`), so
that a class's default can be chosen from measurements; `--only` keeps one class.

Per shape, each system's output is checked against a float32 torch reference, then both
are timed in interleaved rounds (the clock drifts with temperature; neither system gets
only the cool minutes), two ways each:
- graph: CUDA-graph replays of 10 calls (the GPU work alone; host time hidden);
- bench: triton.testing.do_bench on the Python call (L2 flushed before each call, host
  path included where it is longer than the flush), or, without Triton, CUDA events
  around back-to-back Python calls.
ratio = cuBLAS time / weft time (> 1: weft is faster), by each method.
"""

from __future__ import annotations

# (class, M, N, K, B layout): "kn" is B [K, N] row-major (torch.matmul(x, b)); "nk" is
# B = W.t() for W [N, K], as torch.nn.functional.linear multiplies (K-major B).
SHAPES = [
    ("decode", 1, 4096, 4096, "nk"), ("decode", 1, 4096, 4096, "kn"),
    ("decode", 16, 11008, 4096, "nk"), ("decode", 16, 4096, 11008, "nk"),
    ("decode", 64, 14336, 4096, "nk"), ("decode", 64, 4096, 14336, "kn"),
    ("decode", 1, 14336, 4096, "kn"),
    ("long K", 512, 512, 32768, "kn"), ("long K", 1024, 1024, 65536, "kn"), ("long K", 768, 1024, 32768, "nk"),
    ("odd", 4095, 4097, 4093, "kn"), ("odd", 1000, 3000, 5000, "kn"), ("odd", 333, 2047, 1999, "nk"),
    ("LLM", 4096, 11008, 4096, "nk"), ("LLM", 4096, 4096, 11008, "nk"), ("LLM", 4096, 14336, 4096, "kn"),
    ("LLM", 2048, 4096, 14336, "nk"),
    ("square", 4096, 4096, 4096, "kn"), ("square", 8192, 8192, 8192, "kn"),
]
ROUNDS = 2


def _graph_ms(torch, fn, calls: int = 10, replays: int = 5) -> float:
    """Milliseconds per call: CUDA-graph replays of `calls` calls (warm-up outside)."""
    from benchmarks.memory_bound import _graph_bench

    return _graph_bench([fn], repeats=calls, replays=replays)


def _bench_ms(torch, fn) -> float:
    """Milliseconds per Python call, host path included (do_bench where Triton is)."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return do_bench(fn, warmup=10, rep=50, return_mode="median")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 20
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _median(samples):
    samples = sorted(samples)
    return samples[len(samples) // 2]


def config_label(config) -> str:
    """A candidate config in a few characters: tile, stages, warps, group, split, halves."""
    label = f"{config.block_m}x{config.block_n}x{config.block_k} s{config.stages} w{config.num_warps} g{config.group_m}"
    if config.variant != "warp_specialized":
        label += f" {config.variant}"
    if config.split_k > 1:
        label += f" split{config.split_k} {config.split_reduce}"
    if config.stream_k:
        label += " stream-K"
    if config.staged_halves:
        label += " halves"
    return label


def run_classes(dtype_name: str = "bfloat16", configs: bool = False, only: str | None = None) -> list[dict]:
    import torch

    from weft.kernels.matmul import configs_for, matmul
    from weft.runtime import driver

    dtype = getattr(torch, dtype_name)
    bits = torch.finfo(dtype).bits
    sms = driver.device_properties(torch.cuda.current_device()).sm_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for shape_class, m, n, k, layout in SHAPES:
        if only is not None and shape_class != only:
            continue
        a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
        b = (torch.randn(n, k, device="cuda", dtype=dtype, generator=gen).t() if layout == "nk" else
             torch.randn(k, n, device="cuda", dtype=dtype, generator=gen))
        ref = a.float() @ b.float()
        systems = {"cublas": lambda: torch.matmul(a, b), "weft": lambda: matmul(a, b)}
        if configs:
            for config in configs_for(bits, bits, m, n, k, sms):
                systems[f"weft {config_label(config)}"] = lambda config=config: matmul(a, b, config=config)
        row = dict(shape_class=shape_class, shape=[m, n, k], layout=layout, dtype=dtype_name)
        timed = {}
        for name, fn in systems.items():
            try:
                out = fn()
                error = float(((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item())
            except Exception as failure:  # record it, time the others
                row[name] = {"failure": f"{type(failure).__name__}: {failure}"[:300]}
                continue
            row[name] = {"error": error}
            if error < 2e-2:
                timed[name] = fn
            else:
                row[name]["failure"] = "wrong result"
        samples = {name: {"graph": [], "bench": []} for name in timed}
        for _ in range(ROUNDS):
            for name, fn in timed.items():
                samples[name]["graph"].append(_graph_ms(torch, fn))
                samples[name]["bench"].append(_bench_ms(torch, fn))
        for name in timed:
            row[name].update({f"{how}_us": 1e3 * _median(s) for how, s in samples[name].items()})
            row[name]["tflops"] = 2 * m * n * k / (row[name]["bench_us"] * 1e-6) / 1e12
        for name in timed:
            if "cublas" in timed and name != "cublas":
                for how in ("graph", "bench"):
                    row[name][f"ratio_{how}"] = row["cublas"][f"{how}_us"] / row[name][f"{how}_us"]
        if "cublas" in timed and "weft" in timed:
            for how in ("graph", "bench"):
                row[f"ratio_{how}"] = row["weft"][f"ratio_{how}"]
        results.append(row)
        print_row(row, flush=True)
        if configs:
            print_candidates(row, flush=True)
    return results


def print_candidates(row: dict, flush: bool = False) -> None:
    """One line per forced candidate of `row`, fastest by graph time first."""
    entries = [(name, entry) for name, entry in row.items() if isinstance(entry, dict) and name.startswith("weft ")]
    entries.sort(key=lambda item: item[1].get("graph_us", float("inf")))
    for name, entry in entries:
        if "graph_us" not in entry:
            print(f"{'':>30} {name[5:]:<44} FAILED {entry.get('failure', '')[:100]}", flush=flush)
            continue
        print(f"{'':>30} {name[5:]:<44} {entry['graph_us']:8.1f}us {entry['ratio_graph']:6.3f}  "
              f"{entry['bench_us']:8.1f}us {entry['ratio_bench']:6.3f}  {entry['error']:8.1e}", flush=flush)


def print_header() -> None:
    print(f"{'class':>7} {'M x N x K':>18} {'B':>3} {'cuBLAS graph':>12} {'weft graph':>10} {'ratio':>6}  "
          f"{'cuBLAS bench':>12} {'weft bench':>10} {'ratio':>6}  {'weft err':>8}")


def print_row(row: dict, flush: bool = False) -> None:
    shape = "x".join(map(str, row["shape"]))
    head = f"{row['shape_class']:>7} {shape:>18} {row['layout']:>3}"
    failed = [f"{name}: {row[name]['failure']}" for name in ("cublas", "weft") if "failure" in row.get(name, {})]
    if failed:
        print(f"{head} FAILED {'; '.join(failed)[:200]}", flush=flush)
        return
    c, w = row["cublas"], row["weft"]
    print(f"{head} {c['graph_us']:10.1f}us {w['graph_us']:8.1f}us {row['ratio_graph']:6.3f}  "
          f"{c['bench_us']:10.1f}us {w['bench_us']:8.1f}us {row['ratio_bench']:6.3f}  {w['error']:8.1e}",
          flush=flush)
