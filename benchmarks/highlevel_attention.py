"""The tutorial-style attention forward (weft/highlevel/attention_example.py) compiled by
weft.highlevel and, from the same source, by Triton, beside weft.lowlevel's flash_attention
and torch SDPA on cuDNN, one run.

    python -m benchmarks.highlevel_attention [--quick] [--source block|descriptor|both] [--out results.json]

fp16 [batch 4, heads 32 (head_dim 64) or 16 (head_dim 128), seq 4096], causal and not.
Every system is checked against float32 torch (benchmarks/attention.reference) before it
is timed; then the right ones are timed by CUDA-graph replay (attention._time, do_bench's
window) and by triton.testing.do_bench on the eager call, in ROUNDS interleaved rounds
(medians). Both compilers run the same configs (BLOCK_M x BLOCK_N, warps, stages), each
named in the table. `weft.hl` runs weft's default schedule (each block's dots in its own
iteration, as Triton schedules them), `weft.hl.ahead` the same source with `dot_ahead=True`
(issue_dot_ahead: Q K^T of block j issued with P V of block j - 1, the softmax of j beside
that P V, where the tiles fit the registers). Triton is imported lazily: without it its columns say why, and the
do_bench times are left out. The JSON goes to --out, or to $OUT/highlevel_attention.json
when OUT is set.

`--source descriptor` times the descriptor source instead (weft/highlevel/
attention_descriptor_example.py, Triton's tutorial structure): weft's default (`weft.desc`:
warp-specialized with ping-pong where that pays, head_dim 128 at 8 warps), in one partition
(`weft.desc.1p`, warp_specialize=False), warp-specialized (`weft.desc.ws`) and with the consumer warpgroups taking
turns at the tensor cores (`weft.desc.wspp`, pingpong=True), beside Triton compiling the
same source at its tutorial's Hopper configs (`triton.desc`; Triton 3.6 does not
warp-specialize this loop on Hopper) and weft.lowlevel, by graph replay only (it stays
well under 150 s);
`--source both` times both sources; `--wide` the descriptor source's 128 x 128 tiles at
head_dim 128 over a 2-stage ring (WIDE_CONFIGS). Each entry of DESCRIPTOR_CONFIGS is the launch of
attention_descriptor_example.attention that names it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from benchmarks.attention import TOLERANCE, _reason, _time, _versions, forward_flops, reference
from benchmarks.matmul import ROUNDS, _error
from benchmarks.same_source import triton_module

SHAPES = [(4, 32, 4096, 64), (4, 16, 4096, 128)]
# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head_dim: the tutorial's Hopper configs
# (4 warps hold a 128 x 128 fp32 accumulator only with spills), and head_dim 128's 128 x 128
# in 2 stages: the block-pointer loads are TMA boxes (stage_block_pointers), and there the
# default splits the loop into a producer and consumers taking turns (3 stages of 64 KB K
# and V fit beside Q and O only in one partition).
CONFIGS = {64: [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4)],
           128: [(128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2)]}
# The descriptor source: (system, (BLOCK_M, BLOCK_N), num_warps, num_stages, further launch
# options) per head_dim. Triton's are its tutorial's Hopper picks (8 warps only for 128 x 128).
_WEFT_DESCRIPTOR = [("weft.desc", {}), ("weft.desc.ws", {"warp_specialize": True, "pingpong": False}),
                    ("weft.desc.wspp", {"warp_specialize": True, "pingpong": True}),
                    ("weft.desc.wspp-after_wait", {"warp_specialize": True, "pingpong": "after_wait"}),
                    ("weft.desc.1p", {"warp_specialize": False})]
DESCRIPTOR_CONFIGS = {
    64: [(name, (128, 64), 8, 3, options) for name, options in _WEFT_DESCRIPTOR]
    + [(name, (256, 64), 8, 3, options) for name, options in _WEFT_DESCRIPTOR[1:3]]
    + [("weft.desc", (128, 64), 4, 3, {}), ("weft.desc.wspp", (128, 128), 8, 3, _WEFT_DESCRIPTOR[2][1])]
    + [("triton.desc", (128, 64), 4, 3, {}), ("triton.desc", (128, 128), 8, 3, {})],
    128: [(name, (128, 64), 8, 3, options) for name, options in _WEFT_DESCRIPTOR]
    + [(name, (128, 128), 8, 2, options) for name, options in _WEFT_DESCRIPTOR[1:3]]
    + [("triton.desc", (128, 64), 4, 3, {}), ("triton.desc", (128, 128), 8, 3, {})],
}

# `--ahead`: each descriptor schedule beside itself with dot_ahead=True (issue_dot_ahead
# on the TMA rings: Q K^T of block j issued with P V of block j - 1), 8 warps, 3 stages,
# with Triton's picks; one head_dim a run (`--head-dim`) keeps a run under two minutes.
_AHEAD_SCHEDULES = [("weft.desc.1p", {"warp_specialize": False}),
                    ("weft.desc.ws", {"warp_specialize": True, "pingpong": False}),
                    ("weft.desc.wspp", {"warp_specialize": True, "pingpong": True})]
AHEAD_CONFIGS = {
    head_dim: [(name + suffix, block, 8, 3, {**options, **extra}) for block in blocks
               for name, options in _AHEAD_SCHEDULES for suffix, extra in (("", {}), (".ahead", {"dot_ahead": True}))]
    + [("triton.desc", (128, 64), 4, 3, {}), ("triton.desc", (128, 128), 8, 3, {})]
    for head_dim, blocks in ((64, [(128, 64), (128, 128)]), (128, [(128, 64)]))}

# `--wide`: head_dim 128's 128 x 128 tiles, split over a 2-stage ring (3 stages of 64 KB
# K and V boxes do not fit beside Q and O), with and without dot_ahead, with turns, beside the split's
# 128 x 64 tiles in 3 stages and Triton's picks.
_WIDE_SCHEDULES = [(name + suffix, {"warp_specialize": True, "pingpong": False, **extra})
                   for name in ("weft.desc.ws",) for suffix, extra in (("", {}), (".ahead", {"dot_ahead": True}))]
WIDE_CONFIGS = {
    128: [(name, (128, 64), 8, 3, options) for name, options in _WIDE_SCHEDULES]
    + [(name, (128, 128), 8, 2, options) for name, options in _WIDE_SCHEDULES]
    + [("weft.desc.wspp", (128, 128), 8, 2, {"warp_specialize": True, "pingpong": True})]
    + [("triton.desc", (128, 64), 4, 3, {}), ("triton.desc", (128, 128), 8, 3, {})]}


@functools.cache
def triton_attention_kernel():
    """attention_example.attention_kernel (and its helper) compiled by Triton from its own
    source."""
    from weft.highlevel import attention_example

    return triton_module("tutorial_attention", attention_example._attention_blocks,
                         attention_example.attention_kernel).attention_kernel


@functools.cache
def triton_descriptor_attention():
    """attention_descriptor_example.attention_kernel compiled by Triton from its own source,
    and Triton's host TensorDescriptor."""
    from weft.highlevel import attention_descriptor_example

    module = triton_module("descriptor_attention", attention_descriptor_example._key_blocks,
                           attention_descriptor_example.attention_kernel)
    from triton.tools.tensor_descriptor import TensorDescriptor

    return module.attention_kernel, TensorDescriptor


def find_descriptor_systems(causal: bool, head_dim: int, configs=None) -> dict:
    """name -> fn(q, k, v, scale) for `configs` (DESCRIPTOR_CONFIGS by default), or a string
    saying why it is unavailable."""
    from weft.highlevel import attention_descriptor_example

    try:
        triton_kernel, descriptor = triton_descriptor_attention()
    except Exception as error:
        triton_kernel, descriptor = "Triton unavailable: " + _reason(error), None
    found = {}
    for name, (block_m, block_n), warps, stages, options in (configs or DESCRIPTOR_CONFIGS)[head_dim]:
        kernel = triton_kernel if name.startswith("triton") else None
        key = f"{name} {block_m}x{block_n} w{warps} s{stages}"
        if isinstance(kernel, str):
            found[key] = kernel
            continue
        found[key] = (lambda q, k, v, scale, kernel=kernel, descriptor=(descriptor if kernel else None),
                      block=(block_m, block_n), warps=warps, stages=stages, options=options:
                      attention_descriptor_example.attention(q, k, v, causal, scale, block=block, num_warps=warps,
                                                             num_stages=stages, kernel=kernel,
                                                             descriptor=descriptor, **options)[0])
    return found


def find_systems(torch, causal: bool, head_dim: int, anchors=(), source: str = "block", ahead: bool = False,
                 wide: bool = False) -> dict:
    """name -> fn(q, k, v, scale), or a string saying why it is unavailable; `anchors` adds
    `weft.hl.ahead-<anchor>` with dot_ahead=<anchor> (the instruction before P V's wait);
    `ahead` times the descriptor source's AHEAD_CONFIGS, `wide` its WIDE_CONFIGS."""
    from weft.highlevel import attention_example

    configs = WIDE_CONFIGS if wide else AHEAD_CONFIGS if ahead else None
    found = find_descriptor_systems(causal, head_dim, configs) if source in ("descriptor", "both") else {}
    try:
        triton_kernel = triton_attention_kernel()
    except Exception as error:
        triton_kernel = "Triton unavailable: " + _reason(error)
    for block_m, block_n, warps, stages in CONFIGS[head_dim] if source in ("block", "both") else ():
        config = f"{block_m}x{block_n} w{warps} s{stages}"
        # weft.hl.ptr: the block-pointer loads kept (block_pointer_tma=False), K and V by cp.async.
        for name, kernel, dot_ahead, options in (
                ("weft.hl", None, None, {}), ("weft.hl.ahead", None, True, {}),
                ("weft.hl.ptr", None, None, {"block_pointer_tma": False}),
                *((f"weft.hl.ahead-{anchor}", None, anchor, {}) for anchor in anchors),
                ("triton", triton_kernel, None, {})):
            if isinstance(kernel, str):
                found[f"{name} {config}"] = kernel
                continue
            found[f"{name} {config}"] = (
                lambda q, k, v, scale, kernel=kernel, block=(block_m, block_n), warps=warps, stages=stages,
                dot_ahead=dot_ahead, options=options: attention_example.attention(
                    q, k, v, causal, scale, block=block, num_warps=warps, num_stages=stages, kernel=kernel,
                    dot_ahead=dot_ahead, **options)[0])
    try:
        from weft.kernels.attention import flash_attention

        found["weft.ll"] = lambda q, k, v, scale: flash_attention(q, k, v, causal=causal, softmax_scale=scale)
    except Exception as error:
        found["weft.ll"] = "weft.kernels.attention unavailable: " + _reason(error)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn(q, k, v, scale):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

        if source != "descriptor":
            found["cudnn"] = cudnn
    except Exception as error:
        found["cudnn"] = "torch.nn.attention unavailable: " + _reason(error)
    return found


def _do_bench_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def measure_all(torch, systems: dict, q, k, v, scale, ref, flops, graph_only: bool = False) -> dict:
    """name -> entry: every system checked against `ref`, then the right ones timed by graph
    replay and (unless `graph_only`) by do_bench in ROUNDS interleaved rounds (the medians,
    as TFLOP/s)."""
    entries = {}
    for name, system in systems.items():
        if isinstance(system, str):
            entries[name] = {"failure": system}
            continue
        try:
            out = system(q, k, v, scale)
            torch.cuda.synchronize()
            entries[name] = {"error": _error(out, ref)}
            del out
        except Exception as error:
            entries[name] = {"failure": _reason(error)}
            continue
        if not entries[name]["error"] <= TOLERANCE:
            entries[name]["failure"] = f"wrong result: error {entries[name]['error']:.2e} > {TOLERANCE}"
    timers = {"graph": lambda fn: _time(torch, fn) * 1e3, **({} if graph_only else {"do_bench": _do_bench_ms})}
    samples = {name: {kind: [] for kind in timers} for name, entry in entries.items() if "failure" not in entry}
    for _ in range(ROUNDS):
        for name, times in samples.items():
            call = lambda fn=systems[name]: fn(q, k, v, scale)  # noqa: E731
            for kind, timer in timers.items():
                if times[kind] is None:
                    continue
                try:
                    times[kind].append(timer(call))
                except Exception as error:
                    entries[name][f"{kind}_failure"] = _reason(error)
                    times[kind] = None
    for name, times in samples.items():
        for kind, values in times.items():
            if values:
                median = sorted(values)[len(values) // 2]
                entries[name][f"{kind}_ms"] = median
                entries[name][f"{kind}_tflops"] = flops / (median * 1e-3) / 1e12
    return entries


def best(row: dict, prefix: str, kind: str = "graph") -> float | None:
    """The best TFLOP/s among the row's systems named `prefix ...` (or exactly `prefix`)."""
    values = [cell[f"{kind}_tflops"] for name, cell in row.items()
              if isinstance(cell, dict) and (name == prefix or name.startswith(prefix + " "))
              and f"{kind}_tflops" in cell]
    return max(values) if values else None


def run(quick: bool = False, out_path: str | None = None, anchors=(), source: str = "block", ahead: bool = False,
        head_dims=None, wide: bool = False) -> dict:
    import torch

    torch.manual_seed(0)
    results = {**_versions(torch), "tolerance": TOLERANCE, "dtype": "float16", "rows": []}
    shapes = SHAPES[:1] if quick else SHAPES
    for batch, heads, seq, head_dim in [shape for shape in shapes if not head_dims or shape[3] in head_dims]:
        for causal in (False, True):
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.float16)
                       for _ in range(3))
            scale = head_dim ** -0.5
            ref = reference(q, k, v, causal, scale)
            row = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim, "causal": causal}
            systems = find_systems(torch, causal, head_dim, anchors, source, ahead, wide)
            row.update(measure_all(torch, systems, q, k, v, scale, ref,
                                   forward_flops(batch, heads, seq, head_dim, causal), source == "descriptor"))
            for kind in ("graph", "do_bench"):
                mine = best(row, "weft.hl", kind)
                for other in ("triton", "weft.ll", "cudnn", "weft.hl.ahead"):
                    theirs = best(row, other, kind)
                    if mine and theirs:
                        row[f"hl_over_{other}_{kind}"] = mine / theirs
                for name in sorted({key.split(" ")[0] for key in row if key.startswith("weft.desc")}):
                    mine = best(row, name, kind)
                    for other in ("triton.desc", "weft.ll"):
                        theirs = best(row, other, kind)
                        if mine and theirs:
                            row[f"{name}_over_{other}_{kind}"] = mine / theirs
            del q, k, v, ref
            results["rows"].append(row)
            print(_label(row), {name: round(cell.get("graph_tflops", 0)) for name, cell in row.items()
                                if isinstance(cell, dict)}, file=sys.stderr, flush=True)
            if out_path:
                with open(out_path, "w") as f:
                    json.dump(results, f, indent=1)
    return results


def _label(row) -> str:
    return f"b{row['batch']} h{row['heads']} s{row['seq']} d{row['head_dim']} {'causal' if row['causal'] else 'full'}"


def print_table(results) -> None:
    print(f"{results['device']}  torch {results['torch']}  cuDNN {results['cudnn']}  Triton {results['triton']}  "
          f"{results['date']}")
    print("TFLOP/s, fp16: CUDA-graph replay / do_bench (eager); ERR = raised, unavailable or wrong")
    for row in results["rows"]:
        print(_label(row))
        for name, cell in row.items():
            if not isinstance(cell, dict):
                continue
            if "graph_tflops" in cell:
                eager = f"{cell['do_bench_tflops']:.0f}" if "do_bench_tflops" in cell else "-"
                print(f"  {name:<30}{cell['graph_tflops']:>7.0f} /{eager:>5}   (error {cell['error']:.1e})")
            else:
                print(f"  {name:<30}    ERR  {cell.get('failure', '')[:140]}")
        ratios = [f"{key[len('hl_over_'):]} {row[key]:.2f}" for key in row if key.startswith("hl_over_")]
        if ratios:
            print("  best weft.hl over: " + ", ".join(ratios))
        ratios = [f"{key.replace('_over_', ' / ')} {row[key]:.2f}" for key in row
                  if key.startswith("weft.desc") and key.endswith("_graph")]
        if ratios:
            print("  descriptor source, graph: " + ", ".join(ratios))


def print_registers(configs: dict, head_dims=None) -> int:
    """ptxas's registers a thread and spills of each weft system in `configs`, causal and
    not (compiled for sm_90a, nothing launched); 1 when one spills or fails to compile."""
    from weft.highlevel import attention_descriptor_example as example

    failed = False
    for head_dim, entries in configs.items():
        for name, (block_m, block_n), warps, stages, options in entries if not head_dims or head_dim in head_dims else ():
            if not name.startswith("weft"):
                continue
            for causal in (False, True):
                signature = {name_: f"tensordesc<fp16[{rows},{head_dim}]>" for name_, rows in
                             (("desc_q", block_m), ("desc_k", block_n), ("desc_v", block_n), ("desc_o", block_m))}
                signature.update(Out="*fp16", Lse="*fp32", sm_scale="fp32", n_ctx="i32")
                constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, EVEN=True,
                                  WARP_SPECIALIZE=options.get("warp_specialize"))
                launch = {key: value for key, value in options.items() if key != "warp_specialize"}
                label = f"{name} {block_m}x{block_n} w{warps} s{stages} d{head_dim} {'causal' if causal else 'full'}"
                try:
                    kernel = example.attention_kernel.compile(signature=signature, constexprs=constexprs,
                                                              num_warps=warps, num_stages=stages, **launch)
                except Exception as error:
                    print(f"{label:<52} ERR {_reason(error)[:100]}")
                    failed = True
                    continue
                meta = kernel.metadata
                ahead = kernel.asm["layout"].count("warpgroup_mma_wait [pending=1")
                print(f"{label:<52} registers {meta['registers']:>3}  spills {meta['spill_stores']}/"
                      f"{meta['spill_loads']}  loops issued ahead {ahead}  warnings {len(meta['performance_warnings'])}")
                failed = failed or bool(meta["spill_stores"] or meta["spill_loads"])
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="head_dim 64 only")
    parser.add_argument("--out", help="write the results as JSON here (after every shape)")
    parser.add_argument("--anchors", nargs="*", default=[], choices=["volatile", "sleep", "fence", "none"],
                        help="also time dot_ahead=<anchor> for each (the instruction before P V's wait)")
    parser.add_argument("--source", choices=["block", "descriptor", "both"], default="block",
                        help="the block-pointer source (attention_example), the descriptor one, or both")
    parser.add_argument("--ahead", action="store_true",
                        help="the descriptor source's schedules with and without dot_ahead (AHEAD_CONFIGS)")
    parser.add_argument("--wide", action="store_true",
                        help="the descriptor source's 128 x 128 tiles at head_dim 128 in 2 stages (WIDE_CONFIGS)")
    parser.add_argument("--head-dim", type=int, nargs="*", choices=[64, 128], help="only these head_dims")
    parser.add_argument("--registers", action="store_true",
                        help="print ptxas's registers and spills of each weft system of --source descriptor, no GPU")
    args = parser.parse_args(argv)
    if args.registers:
        return print_registers(WIDE_CONFIGS if args.wide else AHEAD_CONFIGS if args.ahead else DESCRIPTOR_CONFIGS,
                               args.head_dim)
    out_path = args.out or (os.path.join(os.environ["OUT"], "highlevel_attention.json") if os.environ.get("OUT")
                            else None)
    results = run(args.quick, out_path, tuple(args.anchors), args.source, args.ahead, args.head_dim, args.wide)
    print_table(results)
    short = any("graph_tflops" not in cell for row in results["rows"] for name, cell in row.items()
                if isinstance(cell, dict) and name.startswith(("weft.hl", "weft.desc")))
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
