"""Attention forward on the H200: weft's flash_attention beside torch SDPA with the cuDNN
backend, SDPA with the flash backend (FlashAttention-2) and a plain Triton kernel
(benchmarks/triton_attention.py), in one run. Each output is checked against a float32
torch reference before it is timed.

    python -m benchmarks.attention [--quick] [--out results.json] [--systems weft,cudnn]
    python -m benchmarks.attention --backward    # the backward: benchmarks/attention_backward.py

TFLOP/s = 4 B H Sq Sk D / time (x 0.5 causal), bf16 random normal inputs, the time of the
GPU work by CUDA-graph replay for every system alike (`_time`: 100 ms of replays after
25 ms of them, do_bench's window, whatever a call takes; warm-up and autotuning happen
before the capture), the median of three rounds that visit the systems in turn (the clock
drifts as the GPU heats up). Every system here holds the H200 at its 700 W cap, where the
clock falls within about a tenth of a second: a window of a few milliseconds flatters the
kernel that does the most work per cycle (docs/attention-journal.md), and
benchmarks/probe_power.py times seconds-long runs beside the power and clock.

Shapes (../shared/BENCHMARKS.md): the FA3 grid, batch * seq = 16k tokens and heads *
head_dim = 2048 for seq 512..16k and head_dim 64, 128, 256, causal and not, plus (4, 16,
4096, 128) and (2, 16, 16384, 128). A system that is missing, raises, or is wrong (max
|out - ref| / max |ref| > 1e-2) is recorded with the reason, not timed, and the run goes on.

The reference is float32 torch on the GPU, in query chunks so that no score matrix passes
1 GiB: weft.kernels.attention.reference_attention (float64 numpy on the host) is far too
slow at these sizes, so it only checks this reference's conventions on small cases.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings

from benchmarks.matmul import ROUNDS, _error  # max |out - ref| / max |ref|

TOLERANCE = 1e-2
WINDOW_S, WARMUP_S = 0.1, 0.025  # each timing: 100 ms of replays after 25 ms, as do_bench
PEAK_TFLOPS = 989.0  # dense bf16 on the H100/H200
SYSTEMS = ("weft", "cudnn", "flash", "triton")
# Also measurable (--systems): weft with one CTA per tile, or with persistent CTAs, whatever
# its default for the shape.
EXTRA_SYSTEMS = ("weft_tiles", "weft_persistent")
CAUSAL_CHOICES = {"both": (False, True), "only": (True,), "none": (False,)}  # --causal: the masks timed


def fa3_shape(seq: int, head_dim: int) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head_dim) of the FA3 grid: batch * seq = 16k tokens, heads *
    head_dim = 2048."""
    return 16384 // seq, 2048 // head_dim, seq, head_dim


def random_inputs(torch, count: int, batch: int, heads: int, seq: int, head_dim: int) -> tuple:
    """`count` bf16 random normal CUDA tensors [batch, heads, seq, head_dim]: q, k, v (and dO)."""
    return tuple(torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
                 for _ in range(count))


def forward_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    """The forward's 4 B H S^2 D, halved under a causal mask."""
    return 4 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)


def save_json(data, out_path: str | None) -> None:
    """Write `data` to out_path, when given (after every shape: a run cut short keeps what
    it measured)."""
    if out_path:
        with open(out_path, "w") as f:
            json.dump(data, f, indent=1)


def print_failures(results) -> None:
    """One line per system and reason it was not timed for (or not by one method: "graph"
    or "eager"), with one shape of those."""
    reasons = {}
    for row in results["rows"]:
        for name in results["systems"]:
            for key in ("failure", "graph_failure", "eager_failure"):
                if key in row[name]:
                    what = f"{name} ({key.split('_')[0]})" if key != "failure" else name
                    reasons.setdefault((what, row[name][key]), []).append(_label(row))
    for (name, reason), where in reasons.items():
        print(f"{name} not timed on {len(where)} shape(s), e.g. {where[0]}: {reason}")


def shapes(quick: bool = False, causal=(False, True), head_dims=(64, 128, 256),
           seqs=None) -> list[tuple[int, int, int, int, bool]]:
    """(batch, heads, seq, head_dim, causal) for every configuration measured, of the
    head dims `head_dims` and (when given) the sequence lengths `seqs`."""
    if quick:
        grid = [(4, 2048 // d, 4096, d) for d in (128, 64, 256)]
    else:
        grid = [fa3_shape(s, d) for d in (64, 128, 256) for s in (512, 1024, 2048, 4096, 8192, 16384)]
        grid += [(4, 16, 4096, 128), (2, 16, 16384, 128)]  # the first is also in the grid
    grid = [shape for shape in grid if shape[3] in head_dims and (seqs is None or shape[2] in seqs)]
    return [(*shape, masked) for shape in dict.fromkeys(grid) for masked in causal]


def reference(q, k, v, causal: bool, scale: float, budget: int = 1 << 28):
    """float32 softmax(q k^T * scale) v with flash_attention's conventions: causal aligned
    bottom-right, k/v heads shared by groups of q heads, rows that see no key give 0.
    Query rows go in chunks of at most `budget` scores (1 GiB of fp32)."""
    import torch

    batch, heads, seq_q, _ = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    k, v = (x.float().repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    rows = max(1, budget // (batch * heads * seq_k))
    for start in range(0, seq_q, rows):
        stop = min(seq_q, start + rows)
        scores = torch.matmul(q[:, :, start:stop].float(), k.transpose(-1, -2)).mul_(scale)
        if causal:
            last_key = torch.arange(start, stop, device=q.device)[:, None] + (seq_k - seq_q)
            scores.masked_fill_(torch.arange(seq_k, device=q.device)[None, :] > last_key, float("-inf"))
        out[:, :, start:stop] = torch.matmul(torch.softmax(scores, dim=-1).nan_to_num_(0.0), v)
    return out


def _reason(error, caught=()) -> str:
    """One line on why a system did not run; torch's SDPA says why in its warnings."""
    said = "; ".join(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
    return (f"{type(error).__name__}: {error}" + (f" [{said}]" if said else ""))[:600]


def check_reference(torch):
    """Max error of `reference` against weft's float64 numpy reference on small causal and
    full cases with GQA and seq_q != seq_k both ways; None if weft's is missing."""
    try:
        from weft.kernels.attention import reference_attention
    except Exception:
        return None
    worst = 0.0
    try:
        for seq_q, seq_k in ((70, 100), (100, 70)):
            q = torch.randn(1, 4, seq_q, 64, device="cuda")
            k, v = (torch.randn(1, 2, seq_k, 64, device="cuda") for _ in range(2))
            for causal in (False, True):
                mine = reference(q, k, v, causal, 0.125)
                theirs = torch.from_numpy(reference_attention(q, k, v, causal, 0.125)).to(mine)
                worst = max(worst, _error(mine, theirs))
    except Exception as error:
        return _reason(error)
    return worst


def find_systems(torch, wanted) -> dict:
    """name -> fn(q, k, v, causal, scale), or a string saying why it is unavailable."""
    found = {}
    try:
        from weft.kernels.attention import default_config, flash_attention

        found["weft"] = lambda q, k, v, causal, scale: flash_attention(q, k, v, causal=causal,
                                                                        softmax_scale=scale)
        for name, persistent in (("weft_tiles", False), ("weft_persistent", True)):
            found[name] = lambda q, k, v, causal, scale, persistent=persistent: flash_attention(
                q, k, v, causal=causal, softmax_scale=scale,
                config=dataclasses.replace(default_config(q.shape[-1], causal, k.shape[2]),
                                           persistent=persistent))
    except Exception as error:
        for name in ("weft",) + EXTRA_SYSTEMS:
            found[name] = "weft.kernels.attention unavailable: " + _reason(error)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(backend):
            # is_causal is top-left aligned in SDPA, the same as bottom-right for seq_q == seq_k.
            def call(q, k, v, causal, scale):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                            scale=scale)
            return call

        found["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
        found["flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    except Exception as error:
        found["cudnn"] = found["flash"] = "torch.nn.attention unavailable: " + _reason(error)
    try:
        from benchmarks.triton_attention import attention

        found["triton"] = attention
    except Exception as error:
        found["triton"] = "Triton kernel unavailable: " + _reason(error)
    for name in wanted:
        if name.startswith("weft:") and name not in found:
            found[name] = _weft_with(name)
    return {name: found[name] for name in wanted}


def _weft_with(name: str):
    """weft under its default PingpongConfig with fields overridden, from a system name such as
    "weft:q_buffers=2" or "weft:persistent=False+stages=3"."""
    import ast

    try:
        from weft.kernels.attention import PingpongConfig, default_config, flash_attention

        fields = {}
        for item in name[len("weft:"):].split("+"):
            key, _, value = item.partition("=")
            fields[key] = ast.literal_eval(value)
        # A misspelt field fails here, once; values are checked against each shape's default
        # config when it runs (stages=4 fits head_dim 64's shared memory, not 128's).
        unknown = set(fields) - {field.name for field in dataclasses.fields(PingpongConfig)}
        if unknown:
            raise ValueError(f"PingpongConfig has no field {', '.join(sorted(unknown))}")
    except Exception as error:
        return f"{name}: " + _reason(error)
    return lambda q, k, v, causal, scale: flash_attention(
        q, k, v, causal=causal, softmax_scale=scale,
        config=dataclasses.replace(default_config(q.shape[-1], causal, k.shape[2]), **fields))


def _time(torch, fn) -> float:
    """Seconds per call of the GPU work alone, over a do_bench-long window of CUDA-graph
    replays (memory_bound._graph_bench_window), the same method for every system."""
    from benchmarks.memory_bound import _graph_bench_window

    return _graph_bench_window(fn, WINDOW_S, WARMUP_S) * 1e-3


def measure(torch, system, q, k, v, causal, scale, ref, flops) -> dict:
    """Check one system's output, then time it once if it is right."""
    entry = check(torch, system, q, k, v, causal, scale, ref)
    if "failure" in entry:
        return entry
    try:
        seconds = _time(torch, lambda: system(q, k, v, causal, scale))
    except Exception as error:
        return {**entry, "failure": "timing: " + _reason(error)}
    return {**entry, "ms": seconds * 1e3, "tflops": flops / seconds / 1e12}


def measure_all(torch, systems: dict, q, k, v, causal, scale, ref, flops) -> dict:
    """name -> entry: every system checked, then the right ones timed in ROUNDS
    interleaved rounds (the median), so that the GPU's clock drift over a run (it heats
    up) falls on all of them alike."""
    entries = {name: {"failure": system} if isinstance(system, str) else
               check(torch, system, q, k, v, causal, scale, ref) for name, system in systems.items()}
    samples = {name: [] for name, entry in entries.items() if "failure" not in entry}
    for _ in range(ROUNDS):
        for name in list(samples):
            try:
                samples[name].append(_time(torch, lambda fn=systems[name]: fn(q, k, v, causal, scale)))
            except Exception as error:
                entries[name]["failure"] = "timing: " + _reason(error)
                del samples[name]
    for name, seconds in samples.items():
        median = sorted(seconds)[len(seconds) // 2]
        entries[name].update(ms=median * 1e3, tflops=flops / median / 1e12)
    return entries


def check(torch, system, q, k, v, causal, scale, ref) -> dict:
    """{"error": max relative error}, with a "failure" when the system raises or is wrong."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = system(q, k, v, causal, scale)
            torch.cuda.synchronize()
        except Exception as error:
            return {"failure": _reason(error, caught)}
    entry = {"error": _error(out, ref)}
    del out
    if _wrong(entry):
        return {**entry, "failure": f"wrong result: error {entry['error']:.2e} > {TOLERANCE}"}
    return entry


def _versions(torch) -> dict:
    import datetime

    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "triton": triton_version}


def run(quick: bool = False, wanted=SYSTEMS, out_path: str | None = None, causal=(False, True),
        head_dims=(64, 128, 256), seqs=None) -> dict:
    import torch

    torch.manual_seed(0)
    found = find_systems(torch, wanted)
    results = {**_versions(torch), "tolerance": TOLERANCE, "systems": list(wanted),
               "reference_vs_weft_numpy": check_reference(torch), "rows": []}
    for batch, heads, seq, head_dim, causal in shapes(quick, causal, head_dims, seqs):
        q, k, v = random_inputs(torch, 3, batch, heads, seq, head_dim)
        scale = head_dim ** -0.5
        ref = reference(q, k, v, causal, scale)
        flops = forward_flops(batch, heads, seq, head_dim, causal)
        row = {"batch": batch, "heads": heads, "seq_q": seq, "seq_k": seq, "head_dim": head_dim,
               "causal": causal, "dtype": "bfloat16"}
        row.update(measure_all(torch, found, q, k, v, causal, scale, ref, flops))
        variants = tuple(name for name in found if name.startswith("weft:"))
        for other in ("cudnn", "flash", "triton") + EXTRA_SYSTEMS + variants:
            if "tflops" in row.get("weft", {}) and "tflops" in row.get(other, {}):
                row[f"weft_over_{other}"] = row["weft"]["tflops"] / row[other]["tflops"]
        del q, k, v, ref
        results["rows"].append(row)
        print(_label(row), " ".join(f"{name} {_cell(row[name])}" for name in found), file=sys.stderr,
              flush=True)
        save_json(results, out_path)
    return results


def _label(row) -> str:
    return (f"b{row['batch']} h{row['heads']} s{row['seq_q']} d{row['head_dim']} "
            f"{'causal' if row['causal'] else 'full'}")


def _wrong(entry) -> bool:
    return "error" in entry and not entry["error"] <= TOLERANCE  # NaN is wrong too


def _cell(entry) -> str:
    if "tflops" in entry:
        return f"{entry['tflops']:.0f}"
    return "WRONG" if _wrong(entry) else "ERR"


def print_table(results) -> None:
    systems = results["systems"]
    print(f"{results['device']}  torch {results['torch']}  cuDNN {results['cudnn']}  "
          f"Triton {results['triton']}  {results['date']}")
    print(f"reference vs weft's float64 numpy reference: {results['reference_vs_weft_numpy']}")
    print_failures(results)
    print("TFLOP/s (CUDA-graph replay, bf16; ERR = raised or unavailable, WRONG = failed the check)")
    print(f"{'shape':<26}" + "".join(f"{name:>8}" for name in systems)
          + f"{'w/cuDNN':>9}{'w/Triton':>9}{'w/peak':>8}")
    for row in results["rows"]:
        ratios = "".join(f"{row[key]:>9.2f}" if key in row else f"{'-':>9}"
                         for key in ("weft_over_cudnn", "weft_over_triton"))
        peak = f"{row['weft']['tflops'] / PEAK_TFLOPS:>8.2f}" if "tflops" in row.get("weft", {}) else f"{'-':>8}"
        print(f"{_label(row):<26}" + "".join(f"{_cell(row[name]):>8}" for name in systems) + ratios + peak)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="seq 4096 only: head_dim 128, 64 and 256, causal and not")
    parser.add_argument("--out", help="write the full results as JSON here (after every shape)")
    parser.add_argument("--causal", choices=tuple(CAUSAL_CHOICES), default="both",
                        help="causal and non-causal shapes, causal only, or non-causal only")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256],
                        help="only these head dims")
    parser.add_argument("--seqs", type=int, nargs="+", help="only these sequence lengths")
    known = SYSTEMS + EXTRA_SYSTEMS
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated subset of {','.join(known)}, or weft under its "
                             f"default PingpongConfig with fields changed: weft:q_buffers=2+stages=3")
    parser.add_argument("--backward", action="store_true",
                        help="time the backward (benchmarks/attention_backward.py): seq 1k..16k, graph and "
                             "do_bench times")
    parser.add_argument("--dq", default="atomics,tma",
                        help="--backward: weft once per dQ accumulation listed (atomics, tma), in the same run")
    parser.add_argument("--walk", default="plain",
                        help="--backward: and once per walk listed (plain, pipelined)")
    args = parser.parse_args(argv)
    if args.backward:
        from benchmarks.attention_backward import main as backward_main

        return backward_main(args)
    wanted = [name for name in args.systems.split(",") if name]
    if not wanted or {name for name in wanted if not name.startswith("weft:")} - set(known):
        parser.error(f"--systems takes names from {','.join(known)}, got {args.systems!r}")
    masks = CAUSAL_CHOICES[args.causal]
    results = run(args.quick, wanted, args.out, masks, tuple(args.head_dims), args.seqs)
    print_table(results)
    wrong = any(_wrong(row[name]) for row in results["rows"] for name in wanted)
    weft_short = "weft" in wanted and any("tflops" not in row["weft"] for row in results["rows"])
    return 1 if wrong or weft_short else 0


if __name__ == "__main__":
    sys.exit(main())
