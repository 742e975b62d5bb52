"""Configuration sweep for flash attention: weft under several PingpongConfigs per shape, beside
cuDNN and the plain Triton kernel in the same run, for choosing defaults.

    python -m benchmarks.sweep_attention [--seqs 512 1024] [--head-dims 64 128]
                                              [--out sweep.json]

Shapes are the FA3 grid's (batch * seq = 16k tokens, heads * head_dim = 2048). Every
configuration is checked against the float32 reference of attention.py before it is
timed, by CUDA-graph replay like the benchmark itself; one that fails to compile or is
wrong is recorded with the reason and the sweep goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from benchmarks.attention import (_reason, fa3_shape, find_systems, forward_flops, measure, random_inputs, reference,
                                  save_json)


def candidates(head_dim: int, causal: bool):
    """(label, PingpongConfig) pairs to try; "default" is what flash_attention picks."""
    from weft.kernels.attention import PingpongConfig, default_config

    yield "default", default_config(head_dim)
    options = {
        64: [dict(block_n=128, consumers=3, consumer_regs=160, stages=3),
             dict(block_n=64, consumers=3, consumer_regs=160, stages=4),
             dict(block_n=128, consumers=2, stages=2),
             dict(block_n=128, consumers=2, stages=3),
             dict(block_n=64, consumers=2, stages=4)],
        128: [dict(block_n=128, stages=3),
              dict(block_n=64, stages=4),
              dict(block_n=64, consumers=3, consumer_regs=160, stages=4)],
        256: [dict(block_n=32, stages=4),
              dict(block_n=32, stages=3)],
    }[head_dim]
    for option in options:
        config = PingpongConfig(head_dim=head_dim, **option)
        yield _label(option), config
    # The other tile schedule for the default tiles: persistent CTAs for causal, one CTA
    # per tile for non-causal.
    yield "default, persistent" if causal else "default, one CTA per tile", \
        dataclasses.replace(default_config(head_dim), persistent=causal)


def _label(option: dict) -> str:
    short = {"block_n": "n", "consumers": "c", "stages": "s", "consumer_regs": "r"}
    return " ".join(f"{short[key]}{value}" for key, value in option.items())


def _shapes(seqs, head_dims):
    return [fa3_shape(seq, head_dim) for head_dim in head_dims for seq in seqs]


def _warm(shape) -> int:
    """Compile every candidate for one shape (both masks) by running it once; the kernel
    cache keeps the result for the timed run. Returns how many raised."""
    import torch

    from weft.kernels.attention import flash_attention

    batch, heads, seq, head_dim = shape
    q, k, v = random_inputs(torch, 3, batch, heads, seq, head_dim)
    failed = 0
    for causal in (False, True):
        for _, config in candidates(head_dim, causal):
            try:
                flash_attention(q, k, v, causal=causal, config=config)
            except Exception:
                failed += 1
    torch.cuda.synchronize()
    return failed


def warm(shapes, processes: int) -> None:
    """Compile the candidates in `processes` worker processes, before any timing."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        failed = sum(pool.map(_warm, shapes, chunksize=1))
    print(f"warmed {len(shapes)} shapes in {processes} processes ({failed} configs raised)",
          file=sys.stderr, flush=True)


def run(seqs, head_dims, out_path=None) -> list[dict]:
    import torch

    from weft.kernels.attention import flash_attention

    torch.manual_seed(0)
    references = find_systems(torch, ("cudnn", "triton"))
    rows = []
    for batch, heads, seq, head_dim in _shapes(seqs, head_dims):
        q, k, v = random_inputs(torch, 3, batch, heads, seq, head_dim)
        scale = head_dim ** -0.5
        for causal in (False, True):
            ref = reference(q, k, v, causal, scale)
            flops = forward_flops(batch, heads, seq, head_dim, causal)
            row = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim,
                   "causal": causal, "configs": {}}
            for name, system in references.items():
                row[name] = measure(torch, system, q, k, v, causal, scale, ref, flops)
            for label, config in candidates(head_dim, causal):
                def weft(q, k, v, causal, scale, config=config):
                    return flash_attention(q, k, v, causal=causal, softmax_scale=scale, config=config)
                try:
                    row["configs"][label] = measure(torch, weft, q, k, v, causal, scale, ref, flops)
                except Exception as error:  # e.g. a config ptxas refuses
                    row["configs"][label] = {"failure": _reason(error)}
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
            save_json(rows, out_path)
    return rows


def _tflops(entry) -> float:
    return entry.get("tflops", 0.0)


def _line(row) -> str:
    best = max(row["configs"], key=lambda label: _tflops(row["configs"][label]))
    cells = " | ".join(f"{label} {_tflops(entry):.0f}" for label, entry in row["configs"].items())
    return (f"s{row['seq']} d{row['head_dim']} {'causal' if row['causal'] else 'full'}: "
            f"cudnn {_tflops(row['cudnn']):.0f} triton {_tflops(row['triton']):.0f} | {cells} "
            f"|| best {best}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--out", help="write the rows as JSON here (after every shape)")
    parser.add_argument("--warm-processes", type=int, default=0,
                        help="compile every candidate first in this many processes (0: no)")
    args = parser.parse_args(argv)
    if args.warm_processes:
        warm(_shapes(args.seqs, args.head_dims), args.warm_processes)
    rows = run(args.seqs, args.head_dims, args.out)
    print("best config per shape (TFLOP/s; x default, x cuDNN, x Triton)")
    for row in rows:
        best = max(row["configs"], key=lambda label: _tflops(row["configs"][label]))
        top, default = _tflops(row["configs"][best]), _tflops(row["configs"]["default"])
        ratios = [top / value if value else float("nan")
                  for value in (default, _tflops(row["cudnn"]), _tflops(row["triton"]))]
        print(f"s{row['seq']:<6} d{row['head_dim']:<4} {'causal' if row['causal'] else 'full':<7}"
              f"{best:<28} {top:6.0f}  " + "  ".join(f"{r:.2f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
