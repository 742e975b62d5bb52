"""One launch of each attention system per shape (weft, weft under other PingpongConfigs, cuDNN:
benchmarks/attention.py's names) inside a profiler range, for Nsight Compute to compare
what limits each (tensor-pipe use, issue, DRAM and L2 traffic, stalls). Every output is
checked against the benchmark's float32 reference first.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python -m benchmarks.profile_attention 16,16,4096,128 32,8,512,256:causal \\
        --systems weft,weft:l2_group_bytes=1,cudnn
"""

from __future__ import annotations

import argparse
import math

from benchmarks.attention import check, find_systems, reference


def parse(spec: str) -> tuple[tuple[int, int, int, int], bool]:
    """"batch,heads,seq,head_dim[:causal]" -> ((b, h, s, d), causal)."""
    dims, _, mask = spec.partition(":")
    if mask not in ("", "causal"):
        raise SystemExit(f"{spec}: the suffix may only be ':causal'")
    shape = tuple(int(x) for x in dims.split(","))
    if len(shape) != 4:
        raise SystemExit(f"{spec}: give batch,heads,seq,head_dim")
    return shape, mask == "causal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="batch,heads,seq,head_dim[:causal]")
    parser.add_argument("--systems", default="weft,cudnn", help="comma-separated, as in attention.py")
    args = parser.parse_args()
    import torch

    systems = find_systems(torch, args.systems.split(","))
    for name, system in systems.items():
        if isinstance(system, str):
            raise SystemExit(f"{name}: {system}")
    cases = []
    for shape, causal in map(parse, args.shapes):
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = 1.0 / math.sqrt(shape[3])
        ref = reference(q, k, v, causal, scale)
        for name, system in systems.items():  # compiles and warms up, and must be right
            entry = check(torch, system, q, k, v, causal, scale, ref)
            print(f"{shape} causal={causal} {name}: {entry}", flush=True)
            if "failure" in entry:
                raise SystemExit(f"{name} on {shape}: {entry['failure']}; not profiled")
        cases.append((q, k, v, causal, scale))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for q, k, v, causal, scale in cases:
        for system in systems.values():
            system(q, k, v, causal, scale)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
