"""Probe on the GPU: what the last, partial wave of equal non-causal tiles costs. The same
per-tile work (sequence length, head dim), tile counts that fill the H200's 132 SMs a
whole number of times or not; weft and cuDNN, each output checked before it is timed
(benchmarks/attention.py). Results in docs/attention-journal.md.

    OUT=/tmp/out python3 -m benchmarks.probe_waves      (from the repository root)
"""
import json
import os

import torch
from benchmarks.attention import find_systems, measure_all, reference

SHAPES = [  # (batch, heads, seq, d): tiles / 132
    (4, 16, 4096, 128),   # 2048 = 15.52 waves
    (6, 11, 4096, 128),   # 2112 = 16.00
    (4, 16, 4096, 128),
    (2, 16, 16384, 128),  # 4096 = 31.03
    (1, 33, 16384, 128),  # 4224 = 32.00
    (4, 8, 4096, 256),    # 1024 = 7.76
    (1, 33, 4096, 256),   # 1056 = 8.00
    (16, 16, 1024, 128),  # 2048
    (24, 11, 1024, 128),  # 2112
]
torch.manual_seed(0)
systems = find_systems(torch, ["weft", "cudnn"])
rows = []
for b, h, s, d in SHAPES:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = d ** -0.5
    ref = reference(q, k, v, False, scale)
    flops = 4 * b * h * s * s * d
    e = measure_all(torch, systems, q, k, v, False, scale, ref, flops)
    row = dict(shape=(b, h, s, d), **{n: e[n].get("tflops") for n in e}, err=e["weft"].get("error"))
    rows.append(row)
    print(row, flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_waves.json"), "w"), indent=1)
