"""One launch each of weft's attention kernel (under its default Config and each variant
given) and cuDNN's (torch SDPA) per shape, inside a profiler range, for Nsight Compute to
compare what limits each (tensor-pipe use, issue, DRAM and L2 traffic, stalls). Every
output is checked against the float32 math reference first.

    ncu --profile-from-start off --section SpeedOfLight ... \\
        python -m weft.benchmarks.profile_attention 16,16,4096,128 32,8,512,256:causal \\
        --variant l2_group_bytes=1 --variant q_buffers=2
"""

from __future__ import annotations

import sys


def parse(spec: str) -> tuple[tuple[int, int, int, int], bool]:
    """"batch,heads,seq,head_dim[:causal]" -> ((b, h, s, d), causal)."""
    dims, _, mask = spec.partition(":")
    if mask not in ("", "causal"):
        raise SystemExit(f"{spec}: the suffix may only be ':causal'")
    shape = tuple(int(x) for x in dims.split(","))
    if len(shape) != 4:
        raise SystemExit(f"{spec}: give batch,heads,seq,head_dim")
    return shape, mask == "causal"


def main(args: list[str]) -> None:
    import ast
    import dataclasses

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from weft.kernels.attention import default_config, flash_attention

    specs = [a for i, a in enumerate(args) if a != "--variant" and (i == 0 or args[i - 1] != "--variant")]
    variants = [{}] + [dict([(key, ast.literal_eval(value))]) for a, b in zip(args, args[1:]) if a == "--variant"
                       for key, _, value in [b.partition("=")]]

    def weft(q, k, v, causal, fields):
        config = dataclasses.replace(default_config(q.shape[-1]), **fields)
        return flash_attention(q, k, v, causal=causal, config=config)

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    cases = [parse(spec) for spec in specs]
    inputs = []
    for shape, causal in cases:
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with sdpa_kernel(SDPBackend.MATH):
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                   is_causal=causal)
        systems = [(f"weft {fields}", lambda fields=fields: weft(q, k, v, causal, fields)) for fields in variants]
        for name, system in systems + [("cudnn", lambda: cudnn(q, k, v, causal))]:
            error = ((system().float() - ref).norm() / ref.norm()).item()  # compiles and warms up
            print(f"{shape} causal={causal} {name}: relative error {error:.2e}", flush=True)
            if error > 1e-2:
                raise SystemExit(f"{name} is wrong on {shape}: not profiled")
        inputs.append((q, k, v, causal))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for q, k, v, causal in inputs:
        for fields in variants:
            weft(q, k, v, causal, fields)
        cudnn(q, k, v, causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
