"""weft.highlevel's tutorial-style matmul (highlevel/examples.py: pointer loads, tl.dot, the
K loop pipelined by cp.async) and a descriptor matmul (`desc.load`: the K loop staged by TMA
into rings, with and without `warp_specialize=True`) beside Triton 3.6's tutorial matmul,
the same two sources compiled by Triton at the same configs ("triton.src", "triton.desc"),
and cuBLAS, one run.

    python -m benchmarks.highlevel_matmul [--out results.json]

Every system is checked against float32 torch first, then timed by CUDA-graph replay in
interleaved rounds (benchmarks/matmul.py's method); TFLOP/s and the ratio to cuBLAS.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from benchmarks.same_source import triton_module
from weft import highlevel as tl

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 11008, 4096), (1000, 3000, 5000)]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): Triton's Hopper tutorial configs
CONFIGS = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]


@tl.jit
def descriptor_matmul_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
                             WARP_SPECIALIZE: tl.constexpr):
    """C = A @ B by tensor descriptors, tiles in grouped order (tutorial 03's L2 swizzle)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    m = (first_m + (pid % per_group) % rows) * BLOCK_M
    n = (pid % per_group) // rows * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def descriptor_matmul(a, b, block, num_warps: int, num_stages: int, warp_specialize: bool, triton: bool = False):
    """a @ b (fp16, torch) by descriptor_matmul_kernel, compiled by weft.highlevel or (with
    `triton`) by Triton from the same source, with that compiler's host descriptors."""
    import torch

    if triton:
        from triton.tools.tensor_descriptor import TensorDescriptor
    else:
        from weft.highlevel.tools.tensor_descriptor import TensorDescriptor

    (m, k), (_, n) = a.shape, b.shape
    bm, bn, bk = block
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, (bm, bk)), (b, (bk, bn)), (c, (bm, bn)))]
    grid = (-(-m // bm) * -(-n // bn),)
    kernel = triton_same_source_kernel(descriptor_matmul_kernel) if triton else descriptor_matmul_kernel
    kernel[grid](*descs, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                 STAGES=num_stages, WARP_SPECIALIZE=warp_specialize, num_warps=num_warps)
    return c


@functools.cache
def triton_same_source_kernel(kernel=None):
    """A weft.highlevel kernel (examples.matmul_kernel by default) compiled by Triton from
    its own source."""
    from weft.highlevel import examples

    kernel = examples.matmul_kernel if kernel is None else kernel
    return getattr(triton_module("tutorial_matmul", kernel), kernel.fn.__name__)


def triton_same_source(torch, a, b, block, num_warps: int, num_stages: int):
    """a @ b in fp16 by `triton_same_source_kernel`, launched as examples.matmul launches
    weft's (GROUP_M 8, no activation, the accumulator in the dot)."""
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=torch.float16)
    block_m, block_n, block_k = block
    grid = (-(-m // block_m) * -(-n // block_n),)
    triton_same_source_kernel()[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                      out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
                                      BLOCK_K=block_k, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True,
                                      num_warps=num_warps, num_stages=num_stages)
    return out


def run(quick: bool = False) -> list[dict]:
    import torch

    from benchmarks.matmul import _measure
    from weft.highlevel import examples

    torch.manual_seed(0)
    rows = []
    for m, n, k in SHAPES[:1] if quick else SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        ref = a.float() @ b.float()
        systems = {"cublas": lambda: torch.matmul(a, b)}
        try:
            from benchmarks import triton_matmul

            systems["triton"] = lambda: triton_matmul.matmul(a, b)
        except ImportError:
            pass
        for bm, bn, bk, warps, stages in CONFIGS:
            systems[f"weft.hl {bm}x{bn}x{bk} w{warps} s{stages}"] = (
                lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages: examples.matmul(
                    a, b, block=(bm, bn, bk), num_warps=warps, num_stages=stages, out_dtype="float16"))
            for specialized in (False, True):
                name = f"weft.hl desc{' ws' if specialized else ''} {bm}x{bn}x{bk} w{warps} s{stages}"
                systems[name] = (lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, ws=specialized:
                                 descriptor_matmul(a, b, (bm, bn, bk), warps, stages, ws))
        try:
            triton_same_source_kernel()
            for bm, bn, bk, warps, stages in CONFIGS:
                systems[f"triton.src {bm}x{bn}x{bk} w{warps} s{stages}"] = (
                    lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages: triton_same_source(
                        torch, a, b, (bm, bn, bk), warps, stages))
                for specialized in (False, True):
                    name = f"triton.desc{' ws' if specialized else ''} {bm}x{bn}x{bk} w{warps} s{stages}"
                    systems[name] = (lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, ws=specialized:
                                     descriptor_matmul(a, b, (bm, bn, bk), warps, stages, ws, triton=True))
        except ImportError:
            pass
        row = {"shape": [m, n, k], "dtype": "float16"}
        _measure(torch, row, "cublas", systems, ref, 2 * m * n * k)
        rows.append(row)
        print(row["shape"], {name: round(cell.get("tflops", 0)) for name, cell in row.items()
                             if isinstance(cell, dict)}, file=sys.stderr, flush=True)
    return rows


def print_table(rows) -> None:
    print("TFLOP/s by CUDA-graph replay (ratio to cuBLAS); ERR = raised or wrong")
    for row in rows:
        cells = [f"{name} {cell['tflops']:.0f} ({cell.get('ratio', 1):.2f})" if "tflops" in cell
                 else f"{name} ERR: {cell.get('failure', cell.get('error'))}"[:160]
                 for name, cell in row.items() if isinstance(cell, dict)]
        print("x".join(map(str, row["shape"])), " | ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4096^3 only")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
