"""Configuration sweep for the flash-attention backward: weft under several BackwardConfigs
per shape, beside torch SDPA's backward with the cuDNN backend, in one run, for choosing
keys_split_config's defaults (KEYS_SPLIT_TILES in kernels/attention/backward_host.py).

    python -m benchmarks.sweep_attention_backward [--head-dims 64 128 256] [--releases | --persistent]
        [--out sweep.json]

A candidate's label names the BackwardConfig fields it changes from keys_split_config's;
making it the default is putting those fields in head_dim's line of KEYS_SPLIT_TILES.

Shapes: batch 4, seq 4096, heads * head_dim = 2048, for each head_dim causal and not, and
one row at seq 1024 (batch 16: the same 16k tokens; with --persistent, at every head_dim
and causal too). Every candidate is checked against
the float32 torch reference (attention_backward.reference_gradients) before it is timed;
one that is refused, fails to compile or is wrong is recorded with the reason and the
sweep goes on. Timing is attention_backward.measure_all's: ROUNDS interleaved rounds of
CUDA-graph replay and do_bench on the eager call, the medians; TFLOP/s 2.5 x the
forward's (x 0.5 causal).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from benchmarks.attention import _reason, forward_flops, random_inputs, save_json

# (batch, seq) of the rows; the seq-1024 row at head_dim 128 only (keeps the run short).
ROWS = ((4, 4096),)
SHORT_ROW = (16, 1024, 128)


def candidates(head_dim: int, releases: bool = False, persistent: bool = False):
    """(label, BackwardConfig or a reason) for head_dim; "default" is what
    flash_attention_backward picks. Labels name the fields changed from the default.
    `releases`: the default's other BackwardConfig.releases only, and (split_scores) P^T's
    handoff alone released by a partition's one arrival. `persistent`: the default's
    persistent walk (backward_persistent.py) only, and at head_dim 128 with a third Q/dO
    slot (the ring runs on across tiles: more of the next tile's queries loaded ahead)."""
    from weft.kernels.attention.backward_host import RELEASES, keys_split_config

    default = keys_split_config(head_dim)
    yield "default", default
    if persistent:
        for option in [dict(persistent=True)] + ([dict(persistent=True, stages=3)] if head_dim == 128 else []):
            label = " ".join(f"{key}={value}" for key, value in option.items())
            try:
                yield label, dataclasses.replace(default, **option)
            except ValueError as error:
                yield label, _reason(error)
        return
    if releases:
        for kind in RELEASES:
            if kind != default.releases:
                yield f"releases={kind}", dataclasses.replace(default, releases=kind)
        if default.split_scores:
            yield "p_releases=partition", dataclasses.replace(default, p_releases="partition")
        return
    one_consumer = dict(block_n=64, consumers=1, consumer_regs=224, ctas_per_sm=2)
    options = {
        # head_dim 64 at FA3's 128 x 128 tiles: 128 query rows a step, L and delta staged in
        # shared memory by the producer (stats_in_shared; registers allow block_m 128 only
        # so), and the staging alone at block_m 64; then one consumer of one band a CTA, two
        # CTAs an SM (no barrier between consumers, one CTA's exponentials beside the
        # other's GEMMs).
        64: [dict(block_m=128, stats_in_shared=True, stages=stages) for stages in (2, 1)]
            + [dict(stats_in_shared=True), dict(one_consumer, stages=3)],
        # head_dim 128: L and delta loaded by the consumers (the former default), and a
        # third Q/dO slot.
        128: [dict(stats_in_shared=False), dict(stages=3)],
        # head_dim 256: L and delta loaded by the consumers (the former default).
        256: [dict(stats_in_shared=False), dict(dq_reduce="atomics", stages=2),
              dict(split_scores=True, dq_reduce="atomics", stages=2)],
    }[head_dim]
    for option in options:
        label = " ".join(f"{key}={value}" for key, value in option.items())
        try:
            yield label, dataclasses.replace(default, **option)
        except ValueError as error:
            yield label, _reason(error)


def systems_for(torch, configs: dict, q, k, v, do, causal: bool, scale: float) -> dict:
    """cudnn and "weft <label>" for each candidate: name -> a call returning (dq, dk, dv),
    or a reason it cannot run."""
    from benchmarks.attention_backward import find_systems
    from weft.kernels.attention import flash_attention, flash_attention_backward

    found = {"cudnn": find_systems(torch, ("cudnn",), q, k, v, do, causal, scale)["cudnn"]}
    out, lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    for label, config in configs.items():
        if isinstance(config, str):
            found[f"weft {label}"] = config
            continue
        found[f"weft {label}"] = (lambda config=config: flash_attention_backward(
            q, k, v, out, lse, do, causal=causal, softmax_scale=scale, config=config))
    return found


def row_kernels(torch, q, out, do, scale: float):
    """The backward's launches around its main kernel, as flash_attention_backward makes
    them: the row deltas (the preprocess), dQ's accumulator zeroed, dQ's conversion (the
    postprocess); a call that runs the three."""
    from weft.kernels.attention.backward import ROW_TILE_ROWS, convert_dq, row_deltas

    batch, heads, seq, head_dim = q.shape
    delta = torch.empty(batch, heads, seq, dtype=torch.float32, device=q.device)
    accum = torch.empty(batch, heads, seq, head_dim, dtype=torch.float32, device=q.device)
    dq = torch.empty_like(q)
    grid = (-(-seq // ROW_TILE_ROWS), batch * heads)

    def launch():
        row_deltas[grid](out, do, delta, seq, heads, *out.stride()[:3], *do.stride()[:3], HEAD_DIM=head_dim,
                         num_warps=4)
        accum.zero_()
        convert_dq[grid](accum, dq, scale, seq, heads, *dq.stride()[:3], HEAD_DIM=head_dim, num_warps=4)
        return dq

    return launch


def time_row_kernels(torch, q, do, causal: bool, scale: float) -> dict:
    """{"graph_ms", "eager_ms"} of row_kernels, or {"failure"}."""
    from benchmarks.attention import _time
    from benchmarks.attention_backward import _eager_ms
    from weft.kernels.attention import flash_attention

    try:
        out = flash_attention(q, q, q, causal=causal, softmax_scale=scale)
        launch = row_kernels(torch, q, out, do, scale)
        return {"graph_ms": _time(torch, launch) * 1e3, "eager_ms": _eager_ms(launch)}
    except Exception as error:
        return {"failure": _reason(error)}


def shapes(head_dims, causal_only: bool = False, short_rows: bool = False):
    """(batch, heads, seq, head_dim, causal) of every row; `short_rows`: the seq-1024 rows
    at every head_dim, causal and not, beside the seq-4096 ones."""
    for head_dim in head_dims:
        for batch, seq in ROWS + ((SHORT_ROW[:2],) if short_rows else ()):
            for causal in (True,) if causal_only else (False, True):
                yield batch, 2048 // head_dim, seq, head_dim, causal
    if short_rows:
        return
    batch, seq, head_dim = SHORT_ROW
    if head_dim in head_dims and not causal_only:
        yield batch, 2048 // head_dim, seq, head_dim, False


def run(head_dims=(64, 128, 256), out_path: str | None = None, releases: bool = False,
        causal_only: bool = False, persistent: bool = False) -> dict:
    import torch

    from benchmarks.attention import _versions
    from benchmarks.attention_backward import measure_all, reference_gradients

    torch.manual_seed(0)
    results = {**_versions(torch), "rows": []}
    for batch, heads, seq, head_dim, causal in shapes(head_dims, causal_only, short_rows=persistent):
        configs = dict(candidates(head_dim, releases, persistent))
        q, k, v, do = random_inputs(torch, 4, batch, heads, seq, head_dim)
        scale = head_dim ** -0.5
        refs = reference_gradients(q, k, v, do, causal, scale)
        flops = 2.5 * forward_flops(batch, heads, seq, head_dim, causal)
        row = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim, "causal": causal,
               "configs": {label: (config if isinstance(config, str) else dataclasses.asdict(config))
                           for label, config in configs.items()}}
        row["systems"] = measure_all(torch, systems_for(torch, configs, q, k, v, do, causal, scale), refs, flops)
        row["row_kernels"] = time_row_kernels(torch, q, do, causal, scale)
        del q, k, v, do, refs
        torch.cuda.empty_cache()
        results["rows"].append(row)
        print_row(row)
        save_json(results, out_path)
    return results


def _cell(entry: dict, cudnn: dict) -> str:
    """TFLOP/s by graph and eager, then each over cuDNN's eager (its backward breaks
    CUDA-graph capture in this harness: docs/attention-journal.md)."""
    if "graph_tflops" not in entry and "eager_tflops" not in entry:
        failure = entry.get("failure") or entry.get("graph_failure") or "not timed"
        return "WRONG" if "wrong result" in failure else "ERR " + failure[:90]
    graph, eager = entry.get("graph_tflops", float("nan")), entry.get("eager_tflops", float("nan"))
    cells = [f"{graph:5.0f} {eager:5.0f}"]
    if "eager_tflops" in cudnn:
        cells.append(f"{graph / cudnn['eager_tflops']:5.2f}x {eager / cudnn['eager_tflops']:5.2f}x")
    return "  ".join(cells)


def print_row(row: dict) -> None:
    """One line a system: TFLOP/s by graph and eager, and over cuDNN (graph, eager)."""
    print(f"b{row['batch']} h{row['heads']} s{row['seq']} d{row['head_dim']} "
          f"{'causal' if row['causal'] else 'full'}   (TFLOP/s graph eager; each over cuDNN eager)", flush=True)
    cudnn = row["systems"].get("cudnn", {})
    width = max(len(name) for name in row["systems"])
    for name, entry in row["systems"].items():
        print(f"  {name:{width}s}  {_cell(entry, cudnn)}", flush=True)
    rows, default = row.get("row_kernels", {}), row["systems"].get("weft default", {})
    if "graph_ms" in rows and "graph_ms" in default:
        print(f"  preprocess + dQ zeroing + postprocess: {rows['graph_ms'] * 1e3:.0f} us graph, "
              f"{rows['eager_ms'] * 1e3:.0f} us eager: {rows['graph_ms'] / default['graph_ms']:.0%} of the "
              f"default's graph time", flush=True)
    elif "failure" in rows:
        print(f"  preprocess + postprocess: {rows['failure']}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--releases", action="store_true",
                        help="candidates: the default and its other BackwardConfig.releases")
    parser.add_argument("--persistent", action="store_true",
                        help="candidates: the default and its persistent walk; rows: seq 1024 at every head_dim too")
    parser.add_argument("--causal-only", action="store_true", help="the causal rows only")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    started = time.time()
    run(tuple(args.head_dims), args.out, args.releases, args.causal_only, args.persistent)
    print(f"sweep took {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
