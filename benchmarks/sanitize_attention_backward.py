"""Small attention backwards of every head_dim, causal and not, GQA and tails, checked
against float32 torch autograd: the workload compute-sanitizer runs (memcheck, racecheck)
on the GPU machine.

    python3 -m benchmarks.sanitize_attention_backward --tool racecheck [--dq tma] [--cases 0,2]
    python3 -m benchmarks.sanitize_attention_backward --tool memcheck

runs each case in its own `compute-sanitizer --tool ...` process (racecheck is slow: a case
that runs out of --timeout is reported, not waited for) and prints a table of the cases,
their gradients' check and the sanitizer's summary, then one line: how many cases are clean.
Without --tool the cases run here, unsanitized (what each sanitizer process runs).
`--dq` and `--pipelined` pick the backward variant (default_backward_config's arguments);
`--split columns` runs columns_split_config (backward.py) with that dQ accumulation;
`--releases` and `--p-releases` the keys split's BackwardConfig.releases and p_releases.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

# (heads, kv_heads, seq_q, seq_k, head_dim, causal): small enough for racecheck. Every head
# dim; causal and not; GQA (a CTA walks its query blocks once for each head of its group,
# so ring slots are reused across heads); tails of both block sizes.
CASES = [(2, 1, 130, 200, 64, True), (2, 2, 64, 64, 64, False), (2, 1, 100, 77, 128, False),
         (2, 1, 96, 160, 128, True), (2, 1, 70, 70, 256, True), (2, 2, 150, 90, 256, False)]
SANITIZER_ARGS = {"racecheck": ["--tool", "racecheck"],
                  "memcheck": ["--tool", "memcheck", "--report-api-errors", "no"]}
_RACECHECK = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_MEMCHECK = re.compile(r"ERROR SUMMARY: (\d+) errors?")


def case_label(case) -> str:
    heads, kv_heads, seq_q, seq_k, head_dim, causal = case
    return f"h={heads}/{kv_heads} seq={seq_q}x{seq_k} d={head_dim}{' causal' if causal else ''}"


def sanitizer_verdict(tool: str, output: str) -> tuple[bool, str]:
    """(clean, what the summary says) from a compute-sanitizer run's output; a run with no
    summary (it crashed or was cut off) is not clean."""
    if tool == "racecheck":
        found = _RACECHECK.search(output)
        if found is None:
            return False, "no racecheck summary"
        hazards, errors, warnings = map(int, found.groups())
        return hazards == 0, f"{hazards} hazards ({errors} errors, {warnings} warnings)"
    found = _MEMCHECK.search(output)
    if found is None:
        return False, "no memcheck summary"
    return int(found.group(1)) == 0, f"{found.group(1)} errors"


def gradients_verdict(output: str) -> str:
    """The child's check line: 'ok 1.2e-03', 'WRONG 3.0e-01', 'skipped' (no such variant at
    that head_dim), or '-' where it printed none."""
    found = re.search(r"worst relative error (\S+) (ok|WRONG)", output)
    if found:
        return f"{found.group(2)} {found.group(1)}"
    return "skipped" if "no such variant, skipped" in output else "-"


def sanitize(args) -> int:
    """Each case under compute-sanitizer in its own process; a table and a one-line summary."""
    variant = ["--dq", args.dq, "--split", args.split, "--releases", args.releases] + \
        (["--p-releases", args.p_releases] if args.p_releases else []) + (["--pipelined"] if args.pipelined else [])
    indices = _indices(args.cases)
    clean = 0
    print(f"compute-sanitizer {' '.join(SANITIZER_ARGS[args.tool])}, dq={args.dq} split={args.split} "
          f"releases={args.releases}{f' p_releases={args.p_releases}' if args.p_releases else ''}"
          f"{' pipelined' if args.pipelined else ''}")
    print(f"{'case':<32}{'gradients':>18}  {args.tool}")
    for i in indices:
        command = ["compute-sanitizer", *SANITIZER_ARGS[args.tool], sys.executable, "-m",
                   "benchmarks.sanitize_attention_backward", "--cases", str(i), *variant]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            output = run.stdout + run.stderr
            ok, verdict = sanitizer_verdict(args.tool, output)
            gradients = gradients_verdict(output)
            ok = ok and run.returncode == 0 and gradients.startswith(("ok", "skipped"))
        except subprocess.TimeoutExpired:
            ok, verdict, gradients = False, f"timed out after {args.timeout} s", "-"
        clean += ok
        print(f"{case_label(CASES[i]):<32}{gradients:>18}  {verdict}", flush=True)
    print(f"{args.tool}: {clean} of {len(indices)} cases clean")
    return 0 if clean == len(indices) else 1


def _indices(cases: str | None) -> list[int]:
    return [int(i) for i in cases.split(",")] if cases else list(range(len(CASES)))


def _reference(q, k, v, do, causal):
    import torch

    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    seq_q, seq_k = q.shape[2], k.shape[2]
    if causal:  # bottom-right aligned, as flash_attention; every row here sees a key
        keys = torch.arange(seq_k, device=q.device)[None, :]
        rows = torch.arange(seq_q, device=q.device)[:, None]
        s = s.masked_fill(keys > rows + (seq_k - seq_q), float("-inf"))
    (torch.softmax(s, -1) @ v.repeat_interleave(group, 1) * do.float()).sum().backward()
    return q.grad, k.grad, v.grad


def run_cases(args) -> int:
    import dataclasses

    import torch

    from weft.kernels.attention import flash_attention, flash_attention_backward
    from weft.kernels.attention.backward_host import columns_split_config, default_backward_config

    torch.manual_seed(0)
    failures = 0
    for i in _indices(args.cases):
        heads, kv_heads, seq_q, seq_k, head_dim, causal = CASES[i]
        q = torch.randn(1, heads, seq_q, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, kv_heads, seq_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        try:
            config = columns_split_config(head_dim, args.dq, args.pipelined) if args.split == "columns" else \
                dataclasses.replace(default_backward_config(head_dim, args.dq, args.pipelined), releases=args.releases,
                                    p_releases=args.p_releases)
        except ValueError as error:  # e.g. head_dim 256 has no pipelined walk with dQ by TMA
            print(f"{case_label(CASES[i])}: no such variant, skipped ({error})")
            continue
        grads = flash_attention_backward(q, k, v, out, lse, do, causal=causal, config=config)
        worst = max(((g.float() - r).norm() / r.norm()).item()
                    for g, r in zip(grads, _reference(q, k, v, do, causal)))
        ok = worst < 2e-2
        failures += not ok
        print(f"{case_label(CASES[i])}: worst relative error {worst:.2e} {'ok' if ok else 'WRONG'}")
    torch.cuda.synchronize()
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=tuple(SANITIZER_ARGS),
                        help="run each case under compute-sanitizer with this tool and print a summary")
    parser.add_argument("--timeout", type=int, default=300, help="--tool: seconds a case may take")
    parser.add_argument("--dq", choices=("atomics", "tma"), default="tma", help="dQ accumulation")
    parser.add_argument("--pipelined", action="store_true", help="the software-pipelined walk")
    parser.add_argument("--split", choices=("columns", "keys"), default="keys",
                        help="what the consumer warpgroups split (BackwardConfig.split)")
    parser.add_argument("--releases", choices=("thread", "warp", "partition"), default="thread",
                        help="split keys: who arrives on the handoffs of ordinary shared accesses")
    parser.add_argument("--p-releases", choices=("thread", "warp", "partition"),
                        help="split keys: the same for head_dim 256's P^T alone (default: as --releases)")
    parser.add_argument("--cases", help=f"comma-separated indices of the cases to run, of 0..{len(CASES) - 1}")
    args = parser.parse_args(argv)
    return sanitize(args) if args.tool else run_cases(args)


if __name__ == "__main__":
    sys.exit(main())
