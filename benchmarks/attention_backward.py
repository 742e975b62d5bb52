"""Attention backward on the GPU: weft's flash_attention_backward beside torch SDPA's backward
with the cuDNN backend, with the flash backend (FlashAttention-2) and the Triton tutorial's
backward (benchmarks/triton_attention_backward.py), and as "weft.hl" that same tutorial
source (highlevel/attention_backward_example.py) compiled by weft.highlevel, in one run
(`python -m benchmarks.attention --backward`). Each system's dq, dk and dv are checked against a
float32 torch reference before they are timed.

TFLOP/s = 2.5 x the forward's 4 B H Sq Sk D (x 0.5 causal; ../shared/BENCHMARKS.md), bf16
random normal inputs. Two times for every system: the GPU work by CUDA-graph replay
(`attention._time`, do_bench's window) and the eager call by triton.testing.do_bench
(median, host path included); the medians of ROUNDS rounds that visit the systems in
turn. Only the backward is timed: weft's forward output and LSE, and SDPA's forward graph,
are made once before.

Shapes: the FA3 grid from 1k tokens (batch * seq = 16k tokens, heads * head_dim = 2048,
seq 1k..16k, head_dim 64, 128, 256), causal and not.

"weft.hl:stages=N+early=0" is weft.hl launched with num_stages=N (the tutorial's is 5: at
head_dim 128 its rings keep one CTA per SM, 2 stages let two fit) and issue_dots_early off
(compiler/passes/issue_dots_early.py); "+sink=1" adds the launch option sink_waits
(compiler/passes/merge_wgmma_waits.py), "+fit=0" the launch option fit_rings=False (rings
num_stages deep even where they cost a CTA an SM: compiler/ring_depth.py), "+rows=1" the launch
option hoist_slot_loads (compiler/passes/hoist_slot_loads.py); any field may be left out.

Variants of weft's kernel are systems of their own, timed in the same run: "weft:f=v+g=w"
is head_dim's default BackwardConfig with fields f and g changed. dq_reduce, split and
pipelined pick the config: split "keys" (the default, keys_split_config) or "columns"
(columns_split_config, the only layout with a pipelined walk, which pipelined=True picks;
at head_dim 256 "tma" takes one Q/dO slot, so it does not pipeline there).
`--dq atomics,tma --walk plain` (the defaults) put one such system in weft's place for each
dQ accumulation and walk listed: weft (the default, dQ by TMA reduce-add, plain walk) and
weft:dq_reduce=atomics; `--walk plain,pipelined` adds the pipelined walks. `--dq tma
--systems weft,weft:split=columns,cudnn,flash,triton` times the two layouts beside cuDNN,
flash and the Triton tutorial.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
import warnings

from benchmarks.attention import (CAUSAL_CHOICES, PEAK_TFLOPS, _label, _reason, _time, forward_flops, print_failures,
                                  random_inputs, save_json, shapes)
from benchmarks.matmul import ROUNDS, _error  # max |out - ref| / max |ref|

TOLERANCE = 2e-2  # bf16 gradients: dS and P rounded to bf16 before their GEMMs
SYSTEMS = ("weft", "cudnn", "flash", "triton", "weft.hl")
HL_VARIANT = "weft.hl:"  # "weft.hl:stages=3+early=0": weft.hl with num_stages=3, issue_dots_early=False
SEQS = (1024, 2048, 4096, 8192, 16384)


def reference_gradients(q, k, v, do, causal: bool, scale: float, budget: int = 1 << 28):
    """(dq, dk, dv) in float32 with flash_attention's conventions (bottom-right causal,
    k/v heads shared by groups of q heads summed over, rows that see no key give 0), in
    query chunks of at most `budget` scores: P = exp(S - L), dP = dO V^T,
    dS = P (dP - rowsum(dO O)), dq = scale dS K, dk = scale dS^T Q, dv = P^T dO."""
    import torch

    batch, heads, seq_q, _ = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    kf, vf = (x.float().repeat_interleave(group, dim=1) for x in (k, v))
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
    rows = max(1, budget // (batch * heads * seq_k))
    for start in range(0, seq_q, rows):
        stop = min(seq_q, start + rows)
        qc, doc = q[:, :, start:stop].float(), do[:, :, start:stop].float()
        s = torch.matmul(qc, kf.transpose(-1, -2)).mul_(scale)
        if causal:
            last_key = torch.arange(start, stop, device=q.device)[:, None] + (seq_k - seq_q)
            s.masked_fill_(torch.arange(seq_k, device=q.device)[None, :] > last_key, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num_(0.0)
        del s
        out = torch.matmul(p, vf)
        dv += torch.matmul(p.transpose(-1, -2), doc)
        ds = torch.matmul(doc, vf.transpose(-1, -2))
        ds.sub_((doc * out).sum(-1, keepdim=True)).mul_(p)
        del p
        dq[:, :, start:stop] = torch.matmul(ds, kf) * scale
        dk += torch.matmul(ds.transpose(-1, -2), qc) * scale
    dk, dv = (x.view(batch, kv_heads, group, seq_k, -1).sum(2) for x in (dk, dv))
    return dq, dk, dv


def check_reference(torch):
    """Max error of `reference_gradients` against weft's float64 numpy reference on small
    causal and full cases with GQA and seq_q != seq_k both ways; a reason if that fails."""
    try:
        from weft.kernels.attention import reference_attention_backward

        worst = 0.0
        for seq_q, seq_k in ((70, 100), (100, 70)):
            q, do = (torch.randn(1, 4, seq_q, 64, device="cuda") for _ in range(2))
            k, v = (torch.randn(1, 2, seq_k, 64, device="cuda") for _ in range(2))
            for causal in (False, True):
                mine = reference_gradients(q, k, v, do, causal, 0.125, budget=2000)  # several chunks
                theirs = reference_attention_backward(q, k, v, do, causal, 0.125)
                worst = max(worst, *(_error(a, torch.from_numpy(b).to(a)) for a, b in zip(mine, theirs)))
    except Exception as error:
        return _reason(error)
    return worst


def find_systems(torch, wanted, q, k, v, do, causal: bool, scale: float) -> dict:
    """name -> a call returning (dq, dk, dv) for these inputs (the forward made already),
    or a string saying why the system is unavailable."""
    found = {}
    try:
        from weft.kernels.attention import flash_attention, flash_attention_backward

        out, lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
        found["weft"] = lambda: flash_attention_backward(q, k, v, out, lse, do, causal=causal, softmax_scale=scale)
    except Exception as error:
        found["weft"] = "weft.kernels.attention unavailable: " + _reason(error)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa_backward(backend):
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with sdpa_kernel(backend):  # is_causal: top-left, the same as bottom-right at seq_q == seq_k
                        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                                               scale=scale)
                except Exception as error:
                    return _reason(error, caught)
            return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)

        found["cudnn"] = sdpa_backward(SDPBackend.CUDNN_ATTENTION)
        found["flash"] = sdpa_backward(SDPBackend.FLASH_ATTENTION)
    except Exception as error:
        found["cudnn"] = found["flash"] = "torch.nn.attention unavailable: " + _reason(error)
    try:
        from benchmarks.triton_attention_backward import attention_backward as triton_backward

        out_lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
        found["triton"] = lambda: triton_backward(q, k, v, *out_lse, do, causal=causal, softmax_scale=scale)
    except Exception as error:
        found["triton"] = "the tutorial's Triton backward unavailable: " + _reason(error)
    try:
        from weft.highlevel.attention_backward_example import attention_backward as highlevel_backward

        out_lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
        found["weft.hl"] = lambda: highlevel_backward(q, k, v, *out_lse, do, causal=causal, softmax_scale=scale)
    except Exception as error:
        found["weft.hl"] = "the tutorial's backward by weft.highlevel unavailable: " + _reason(error)
    for name in wanted:
        if name.startswith(HL_VARIANT):  # the tutorial's backward by weft.highlevel with other options
            found[name] = found["weft.hl"] if isinstance(found["weft.hl"], str) else \
                (lambda options=_hl_options(name): highlevel_backward(q, k, v, *out_lse, do, causal=causal,
                                                                       softmax_scale=scale, **options))
        if name.startswith("weft:"):
            found[name] = found["weft"] if isinstance(found["weft"], str) else \
                _weft_with(name, q, k, v, out, lse, do, causal, scale)
    return {name: found[name] for name in wanted}


def _weft_with(name: str, q, k, v, out, lse, do, causal: bool, scale: float):
    """weft under head_dim's default BackwardConfig with fields overridden, from a system
    name such as "weft:dq_reduce='tma'" or "weft:dq_reduce=tma+stages=1" (a value that is
    no Python literal is taken as a string); a reason where the config is refused."""
    try:
        from weft.kernels.attention import flash_attention_backward
        from weft.kernels.attention.backward_host import (columns_split_config, default_backward_config,
                                                          keys_split_config)

        fields = {}
        for item in name[len("weft:"):].split("+"):
            key, _, value = item.partition("=")
            try:
                fields[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                fields[key] = value
        default = default_backward_config(q.shape[-1])
        dq_reduce = fields.pop("dq_reduce", default.dq_reduce)
        split, pipelined = fields.pop("split", default.split), fields.pop("pipelined", default.pipelined)
        if split == "keys" and not pipelined:
            config = keys_split_config(q.shape[-1], dq_reduce)
        else:
            config = columns_split_config(q.shape[-1], dq_reduce, pipelined)
        config = dataclasses.replace(config, **fields)
    except Exception as error:
        return f"{name}: " + _reason(error)
    return lambda: flash_attention_backward(q, k, v, out, lse, do, causal=causal, softmax_scale=scale,
                                            config=config)


def _wefts(names) -> list:
    return [name for name in names if name == "weft" or name.startswith("weft:")]


def _eager_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def check(torch, system, refs) -> dict:
    """{"error": the worst of dq, dk and dv}, with a "failure" when the system raises or is wrong."""
    try:
        grads = system()
        torch.cuda.synchronize()
    except Exception as error:
        return {"failure": _reason(error)}
    entry = {"error": max(_error(got, ref) for got, ref in zip(grads, refs))}
    if not entry["error"] <= TOLERANCE:
        entry["failure"] = f"wrong result: error {entry['error']:.2e} > {TOLERANCE}"
    return entry


def measure_all(torch, systems: dict, refs, flops: float) -> dict:
    """name -> entry: every system checked, then the right ones timed (graph and eager)
    in ROUNDS interleaved rounds, the medians."""
    entries = {name: {"failure": system} if isinstance(system, str) else check(torch, system, refs)
               for name, system in systems.items()}
    samples = {name: {"graph": [], "eager": []} for name, entry in entries.items() if "failure" not in entry}
    for _ in range(ROUNDS):
        for name, times in samples.items():
            for kind, timer in (("graph", lambda fn: _time(torch, fn) * 1e3), ("eager", _eager_ms)):
                if times[kind] is None:
                    continue
                try:
                    times[kind].append(timer(systems[name]))
                except Exception as error:
                    entries[name][f"{kind}_failure"] = _reason(error)
                    times[kind] = None
    for name, times in samples.items():
        for kind, values in times.items():
            if values:
                median = sorted(values)[len(values) // 2]
                entries[name].update({f"{kind}_ms": median, f"{kind}_tflops": flops / median / 1e9})
    return entries


def run(wanted=SYSTEMS, out_path: str | None = None, causal=(False, True), head_dims=(64, 128, 256),
        seqs=SEQS) -> dict:
    import torch

    from benchmarks.attention import _versions

    torch.manual_seed(0)
    results = {**_versions(torch), "tolerance": TOLERANCE, "systems": list(wanted),
               "reference_vs_weft_numpy": check_reference(torch), "rows": []}
    for batch, heads, seq, head_dim, masked in shapes(False, causal, head_dims, seqs):
        q, k, v, do = random_inputs(torch, 4, batch, heads, seq, head_dim)
        scale = head_dim ** -0.5
        refs = reference_gradients(q, k, v, do, masked, scale)
        flops = 2.5 * forward_flops(batch, heads, seq, head_dim, masked)
        row = {"batch": batch, "heads": heads, "seq_q": seq, "seq_k": seq, "head_dim": head_dim,
               "causal": masked, "dtype": "bfloat16"}
        row.update(measure_all(torch, find_systems(torch, wanted, q, k, v, do, masked, scale), refs, flops))
        for weft in _wefts(wanted):
            for other in ("cudnn", "flash"):
                for kind in ("graph", "eager"):
                    key = f"{kind}_tflops"
                    if key in row.get(weft, {}) and key in row.get(other, {}):
                        row[f"{weft}_over_{other}_{kind}"] = row[weft][key] / row[other][key]
        for kind in ("graph", "eager"):  # issue 40: the same source by weft.highlevel over Triton
            key = f"{kind}_tflops"
            if key in row.get("weft.hl", {}) and key in row.get("triton", {}):
                row[f"weft.hl_over_triton_{kind}"] = row["weft.hl"][key] / row["triton"][key]
        del q, k, v, do, refs
        torch.cuda.empty_cache()
        results["rows"].append(row)
        print(_label(row), " ".join(f"{name} {_cell(row[name])}" for name in wanted), file=sys.stderr, flush=True)
        save_json(results, out_path)
    return results


def _cell(entry) -> str:
    if "graph_tflops" in entry:
        eager = f"{entry['eager_tflops']:.0f}" if "eager_tflops" in entry else "-"
        return f"{entry['graph_tflops']:.0f}/{eager}"
    return "WRONG" if "wrong result" in entry.get("failure", "") else "ERR"


def print_table(results) -> None:
    systems = results["systems"]
    print(f"{results['device']}  torch {results['torch']}  cuDNN {results['cudnn']}  {results['date']}")
    print(f"reference vs weft's float64 numpy reference: {results['reference_vs_weft_numpy']}")
    print_failures(results)
    print("backward TFLOP/s, CUDA-graph / do_bench eager (bf16; ERR = raised or unavailable, WRONG = failed "
          "the check)")
    widths = {name: max(11, len(name) + 2) for name in systems}
    wefts = _wefts(systems)
    short = {weft: weft[len("weft:"):].replace("dq_reduce=", "").replace("pipelined=True", "pipe") or "w"
             for weft in wefts}
    print(f"{'shape':<26}" + "".join(f"{name:>{widths[name]}}" for name in systems)
          + "".join(f"{short[w] + '/cuDNN':>{max(13, len(short[w]) + 8)}}"
                    f"{short[w] + '/flash':>{max(13, len(short[w]) + 8)}}" for w in wefts) + f"{'w/peak':>8}"
          + (f"{'hl/triton':>13}" if {"weft.hl", "triton"} <= set(systems) else ""))
    for row in results["rows"]:
        ratios = ""
        for weft in wefts:
            for other in ("cudnn", "flash"):
                pair = [row.get(f"{weft}_over_{other}_{kind}") for kind in ("graph", "eager")]
                ratios += f"{'/'.join('-' if x is None else f'{x:.2f}' for x in pair):>{max(13, len(short[weft]) + 8)}}"
        weft = row.get("weft", {})
        peak = f"{weft['graph_tflops'] / PEAK_TFLOPS:>8.2f}" if "graph_tflops" in weft else f"{'-':>8}"
        if {"weft.hl", "triton"} <= set(systems):
            pair = [row.get(f"weft.hl_over_triton_{kind}") for kind in ("graph", "eager")]
            peak += f"{'/'.join('-' if x is None else f'{x:.2f}' for x in pair):>13}"
        print(f"{_label(row):<26}" + "".join(f"{_cell(row[name]):>{widths[name]}}" for name in systems)
              + ratios + peak)


def _variant(dq_reduce: str, walk: str) -> str:
    """The system name of weft's default config with this dQ accumulation and walk."""
    if walk not in ("plain", "pipelined"):
        raise SystemExit(f"--walk takes plain and pipelined, got {walk!r}")
    from weft.kernels.attention.backward_host import default_backward_config

    default = default_backward_config(128)
    fields = ([f"dq_reduce={dq_reduce}"] if dq_reduce != default.dq_reduce else []) + \
        ([f"pipelined={walk == 'pipelined'}"] if (walk == "pipelined") != default.pipelined else [])
    return "weft:" + "+".join(fields) if fields else "weft"


def _hl_options(name: str):
    """The attention_backward keywords of a "weft.hl:stages=N+early=0|1+sink=0|1+fit=0|1+rows=0|1" system
    (any field may be left out), or None when `name` is not one."""
    if not name.startswith(HL_VARIANT):
        return None
    options = {}
    for field in name[len(HL_VARIANT):].split("+"):
        key, _, value = field.partition("=")
        if key == "stages" and value.isdigit() and 2 <= int(value) <= 9:
            options["num_stages"] = int(value)
        elif key == "early" and value in ("0", "1"):
            options["issue_dots_early"] = value == "1"
        elif key == "sink" and value in ("0", "1"):
            options["sink_waits"] = value == "1"
        elif key == "fit" and value in ("0", "1"):
            options["fit_rings"] = value == "1"
        elif key == "rows" and value in ("0", "1"):
            options["hoist_slot_loads"] = value == "1"
        else:
            return None
    return options


def main(args) -> int:
    """From benchmarks.attention's parsed arguments (--backward)."""
    wanted = [name for name in args.systems.split(",") if name]
    plain = {name for name in wanted if not name.startswith("weft:") and _hl_options(name) is None}
    if not wanted or plain - set(SYSTEMS):
        raise SystemExit(f"--backward --systems takes names from {','.join(SYSTEMS)}, weft:field=value or "
                         f"{HL_VARIANT}stages=N+early=0|1 (N from 2 to 9), got {args.systems!r}")
    if "weft" in wanted:  # weft's place: one system a dQ accumulation and walk
        at = wanted.index("weft")
        wanted[at:at + 1] = [_variant(mode, walk) for walk in args.walk.split(",") if walk
                             for mode in args.dq.split(",") if mode]
        wanted = list(dict.fromkeys(wanted))  # a variant also named in --systems is timed once
    masks = CAUSAL_CHOICES[args.causal]
    seqs = tuple(args.seqs) if args.seqs else ((4096,) if args.quick else SEQS)
    results = run(wanted, args.out, masks, tuple(args.head_dims), seqs)
    print_table(results)
    wrong = any("wrong result" in row[name].get("failure", "") for row in results["rows"] for name in wanted)
    # The default must time everywhere; a variant may be refused a shape (tma+pipelined at 256).
    weft_short = "weft" in wanted and any("graph_tflops" not in row["weft"] for row in results["rows"])
    return 1 if wrong or weft_short else 0
