"""Sweep matmul configs on the shape classes of matmul_classes.py, beside cuBLAS, to choose
kernels/matmul/config.py's `configs_for` rules from measurements.

    python3 -m benchmarks.sweep_matmul_classes [--out sweep.json] [--only odd,long K] [--shapes 1000x3000x5000]
                                               [--budget 170] [--jobs 16]

First `--jobs` processes compile every candidate at once (into the kernel cache), so that
the timed pass spends its budget timing.

Per shape: cuBLAS (torch.matmul), weft's autotuned pick ("weft") and every candidate, each
forced with `config=`: those `configs_for` gives the shape, and the `extra_candidates`
below (split counts over 1 to 4 waves of SMs, the other reduce, 128x192 tiles, gemv
strips at M = 1, stage and group counts, stream-K tiles: Config(stream_k=True)). Each output is checked against a float32
torch reference first (a wrong or failing candidate is reported and not timed); then
all are timed in interleaved rounds, by CUDA-graph replays and by do_bench on the
Python call (matmul_classes.py's `_graph_ms` and `_bench_ms`), each system's best
round kept. ratio = cuBLAS time / the candidate's (> 1: weft is faster). Shapes run
hardest class first; past `--budget` seconds the remaining shapes are skipped (and say
so), so the run stays bounded.

The JSON (`--out`) has one row per shape: every system's graph_us, bench_us, ratios,
error and, for the candidates, the Config's fields; and the best candidate by each
method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from benchmarks.matmul_classes import SHAPES, _bench_ms, _graph_ms, config_label

CLASS_ORDER = ("odd", "long K", "decode", "LLM", "square")  # the furthest below cuBLAS first
ROUNDS = 2
TOLERANCE = 2e-2  # max |error| / max |reference|, bf16 output


def extra_candidates(m: int, n: int, k: int, sm_count: int, in_bits: int, b_k_major: bool) -> list:
    """Configs beside `configs_for`'s for an [m, k] x [k, n] problem: in its class, the
    neighbours of the chooser's picks (the most K parts within 1, 2 and 4 waves, the
    other way of adding parts, wider and narrower tiles, stages, groups)."""
    from weft.kernels.matmul import Config
    from weft.kernels.matmul.config import DECODE_ROWS, MAX_SPLIT_K, MIN_PART_STEPS, _deepest, _tiles

    block_k = 1024 // in_bits
    k_steps = -(-k // block_k)

    def split(block_m, block_n, waves):
        """The most K parts whose units fit in `waves` waves of SMs (split_for takes the
        fewest that fill them as well; this finds the longer alternatives)."""
        tiles = _tiles(m, n, block_m, block_n)
        return max(1, min(waves * sm_count // tiles, k_steps // MIN_PART_STEPS, MAX_SPLIT_K))

    extras = []
    if m == 1:  # gemv: the other strip shapes, and K split in halves and doubles of configs_for's
        strips = ((16, 512), (32, 512), (16, 1024)) if b_k_major else ((64, 128), (128, 64), (32, 256))
        for strip_n, strip_k in strips:
            for per_sm in (4, 8, 16):
                parts = max(1, min(-(-per_sm * sm_count // -(-n // strip_n)), k // (2 * strip_k), MAX_SPLIT_K))
                extras.append(Config(1, strip_n, strip_k, num_warps=4, group_m=1, variant="gemv", split_k=parts))
    if m <= DECODE_ROWS:
        for block_n in (64, 128, 256):
            for waves in (1, 2, 4):
                parts = split(64, block_n, waves)
                if block_n <= 128:
                    extras.append(Config(64, block_n, block_k, 8, num_warps=4, group_m=1, split_k=parts))
                if parts > 1 and block_n > 64:
                    extras.append(Config(64, block_n, block_k, 8, num_warps=4, group_m=1, split_k=parts,
                                         split_reduce="tma"))
        extras.append(Config(64, 128, block_k, 4, num_warps=4, group_m=1, split_k=split(64, 128, 4)))
        extras += [Config(64, block_n, block_k, 8, num_warps=4, group_m=1, stream_k=True) for block_n in (128, 256)]
    elif 2 * _tiles(m, n, 128, 128) <= sm_count:
        for waves in (1, 2, 4):
            for block_m, block_n in ((128, 128), (64, 128)):
                parts = split(block_m, block_n, waves)
                extras.append(Config(block_m, block_n, block_k, 8, num_warps=block_m // 16, group_m=8,
                                     split_k=parts))
                if parts > 1:
                    extras.append(Config(block_m, block_n, block_k, 8, num_warps=block_m // 16, group_m=8,
                                         split_k=parts, split_reduce="tma"))
            parts = split(128, 256, waves)
            if parts > 1:
                extras.append(Config(128, 256, block_k, 3, group_m=8, split_k=parts, split_reduce="tma"))
        extras += [Config(block_m, block_n, block_k, 8, num_warps=block_m // 16, group_m=8, stream_k=True)
                   for block_m, block_n in ((128, 128), (64, 128), (128, 256))]
    else:
        extras += [Config(128, 192, block_k, stages, group_m=group) for stages in (4, 3) for group in (8, 16)]
        extras += [Config(128, 256, block_k, 3, group_m=8), Config(128, 128, block_k, 6, group_m=16),
                   Config(128, 64, block_k, 8, num_warps=8, group_m=8)]
        for waves in (1, 2):
            parts = split(128, 256, waves)
            if parts > 1:
                extras.append(Config(128, 256, block_k, 3, group_m=8, split_k=parts, split_reduce="tma"))
        if _tiles(m, n, 128, 256) % sm_count or _tiles(m, n, 128, 128) % sm_count:  # a partial wave to share
            extras += [Config(128, 256, block_k, 3, group_m=group, stream_k=True) for group in (8, 16)]
            extras.append(Config(128, 128, block_k, 5, group_m=8, stream_k=True))
    return [_deepest(config, in_bits, 16) for config in extras]


def candidates_for(m: int, n: int, k: int, sm_count: int, in_bits: int, b_k_major: bool) -> list:
    """`configs_for`'s candidates, then the extras, without repeats."""
    from weft.kernels.matmul import configs_for
    from weft.kernels.matmul.config import SHARED_LIMIT, shared_bytes

    configs = configs_for(in_bits, in_bits, m, n, k, sm_count, b_k_major=b_k_major) + \
        extra_candidates(m, n, k, sm_count, in_bits, b_k_major)
    return [c for c in dict.fromkeys(configs) if shared_bytes(c, in_bits, in_bits) <= SHARED_LIMIT]


_WARM_OPERANDS: dict = {}  # a warming worker's operands, per shape


def _warm_one(task) -> None:
    """Compile one candidate (into the disk cache) by running it once on zeros of its shape."""
    import torch

    from weft.kernels.matmul import matmul

    m, n, k, layout, config = task
    key = (m, n, k, layout)
    if key not in _WARM_OPERANDS:
        _WARM_OPERANDS.clear()
        a = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
        b = (torch.zeros(n, k, device="cuda", dtype=torch.bfloat16).t() if layout == "nk" else
             torch.zeros(k, n, device="cuda", dtype=torch.bfloat16))
        _WARM_OPERANDS[key] = a, b
    try:
        matmul(*_WARM_OPERANDS[key], config=config)
        torch.cuda.synchronize()
    except Exception:  # the timed pass reports it
        pass


def warm(shapes, sm_count: int, jobs: int) -> None:
    """Compile every candidate of `shapes` in `jobs` processes at once (compiling is
    single-threaded Python; the kernel cache's writes are atomic), so that the timed pass
    finds them all in the cache."""
    import multiprocessing

    tasks = [(m, n, k, layout, config) for _, m, n, k, layout in shapes
             for config in candidates_for(m, n, k, sm_count, 16, layout == "nk")]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for _ in pool.imap(_warm_one, tasks, chunksize=4):
            pass


def sweep_shape(torch, shape_class: str, m: int, n: int, k: int, layout: str, sm_count: int, gen) -> dict:
    from weft.kernels.matmul import matmul

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen).t() if layout == "nk" else
         torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen))
    ref = a.float() @ b.float()
    scale = ref.abs().max().clamp_min(1e-6)
    configs = {}
    systems = {"cublas": lambda: torch.matmul(a, b), "weft": lambda: matmul(a, b)}
    for config in candidates_for(m, n, k, sm_count, 16, layout == "nk"):
        name = f"weft {config_label(config)}"
        configs[name] = config
        systems[name] = lambda config=config: matmul(a, b, config=config)
    row = dict(shape_class=shape_class, shape=[m, n, k], layout=layout)
    timed = {}
    for name, fn in systems.items():
        try:
            error = float(((fn().float() - ref).abs().max() / scale).item())
        except Exception as failure:  # report it, time the others
            row[name] = {"failure": f"{type(failure).__name__}: {failure}"[:300]}
            continue
        row[name] = {"error": error}
        if name in configs:
            row[name]["config"] = asdict(configs[name])
        if error < TOLERANCE:
            timed[name] = fn
        else:
            row[name]["failure"] = f"wrong result (error {error:.1e})"
    samples = {name: {"graph": [], "bench": []} for name in timed}
    for _ in range(ROUNDS):
        for name, fn in timed.items():
            samples[name]["graph"].append(_graph_ms(torch, fn))
            samples[name]["bench"].append(_bench_ms(torch, fn))
    for name in timed:
        # The best round: a candidate slowed once by a clock dip is not the one to drop.
        row[name].update({f"{how}_us": 1e3 * min(s) for how, s in samples[name].items()})
        row[name]["tflops"] = 2 * m * n * k / (row[name]["graph_us"] * 1e-6) / 1e12
    if "cublas" in timed:
        for name in timed:
            for how in ("graph", "bench"):
                row[name][f"ratio_{how}"] = row["cublas"][f"{how}_us"] / row[name][f"{how}_us"]
    for how in ("graph", "bench"):
        ranked = sorted((row[name][f"{how}_us"], name) for name in timed if name in configs)
        if ranked:
            row[f"best_{how}"] = ranked[0][1]
    return row


def print_shape(row: dict) -> None:
    shape = "x".join(map(str, row["shape"]))
    print(f"\n{row['shape_class']} {shape} B {row['layout']}"
          + (f"  best graph: {row['best_graph'][5:]}  best bench: {row['best_bench'][5:]}" if "best_graph" in row
             else ""), flush=True)
    entries = [(name, entry) for name, entry in row.items() if isinstance(entry, dict)]
    entries.sort(key=lambda item: item[1].get("graph_us", float("inf")))
    for name, entry in entries:
        label = name[5:] if name.startswith("weft ") else name
        if "graph_us" not in entry:
            print(f"  {label:<46} FAILED {entry.get('failure', '')[:110]}", flush=True)
            continue
        ratios = (f"{entry['ratio_graph']:6.3f}", f"{entry['ratio_bench']:6.3f}") if "ratio_graph" in entry \
            else ("", "")
        print(f"  {label:<46} {entry['graph_us']:9.1f}us {ratios[0]:>6}  {entry['bench_us']:9.1f}us "
              f"{ratios[1]:>6}  {entry['tflops']:6.0f} TF/s  err {entry['error']:.1e}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--only", help="classes, comma-separated, among: " + ", ".join(CLASS_ORDER))
    parser.add_argument("--shapes", help="only these MxNxK, comma-separated (both B layouts where listed)")
    parser.add_argument("--budget", type=float, default=170.0, help="seconds after which shapes are skipped")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes that compile the candidates first (0: compile as they run)")
    args = parser.parse_args(argv)

    import torch

    from weft.runtime import driver

    started = time.monotonic()
    sm_count = driver.device_properties(torch.cuda.current_device()).sm_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    classes = None if args.only is None else args.only.split(",")
    wanted = None if args.shapes is None else {tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")}
    shapes = sorted((s for s in SHAPES if (classes is None or s[0] in classes) and (wanted is None or s[1:4] in wanted)),
                    key=lambda s: CLASS_ORDER.index(s[0]))
    print(f"{torch.cuda.get_device_name()}, {sm_count} SMs; per system: graph time, ratio, do_bench time, ratio "
          f"(ratio = cuBLAS time / its time)")
    if args.jobs > 0:
        try:
            warm(shapes, sm_count, args.jobs)
            print(f"compiled the candidates in {args.jobs} processes: {time.monotonic() - started:.0f} s", flush=True)
        except Exception as failure:  # the timed pass compiles what is missing
            print(f"compiling ahead failed ({type(failure).__name__}: {failure}); compiling as they run", flush=True)
    rows = []
    for shape_class, m, n, k, layout in shapes:
        if time.monotonic() - started > args.budget:
            print(f"\n{shape_class} {m}x{n}x{k} B {layout}: skipped (past the {args.budget:.0f} s budget)")
            rows.append(dict(shape_class=shape_class, shape=[m, n, k], layout=layout, skipped=True))
            continue
        row = sweep_shape(torch, shape_class, m, n, k, layout, sm_count, gen)
        row["elapsed_s"] = time.monotonic() - started
        rows.append(row)
        print_shape(row)
    print(f"\n{time.monotonic() - started:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), sm_count=sm_count, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
