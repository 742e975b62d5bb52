"""weft.highlevel's tutorial-style matmul (highlevel/examples.py: pointer loads, tl.dot, the
loads TMA boxes by stage_pointer_loads), the same pointer loop at weft's default split rule
("ptr"), with `warp_specialize=False` and `=True` ("ptr nows", "ptr ws": a producer
warpgroup issues the copies) and with its loads staged by cp.async ("ptr cp.async": the
launch option pointer_tma=False) and a descriptor matmul (`desc.load`: the K loop staged by TMA
into rings; at weft's default, `warp_specialize=False` and `=True`) beside
Triton 3.6's tutorial matmul, the same two sources compiled by Triton at the same configs
("triton.src", "triton.ptr", "triton.desc", with and without `warp_specialize=True`), and cuBLAS; for
fp8 (B K-major, fp16 out; "desc kn": the descriptor matmul with B stored [K, N], which
wgmma reads only after a transpose in shared memory) beside torch._scaled_mm with unit
scales. One run:

    python -m benchmarks.highlevel_matmul [--dtypes float16,bfloat16,float8e4nv,float8e5]
        [--shapes 4096x4096x4096,8192x8192x8192] [--only desc] [--quick] [--out results.json]

Every system is checked against float32 torch on the same inputs first (fp8: the fp8
values, widened), then timed by CUDA-graph replay in interleaved rounds
(benchmarks/matmul.py's method); TFLOP/s and the ratio to the reference (cuBLAS, or
scaled_mm for fp8).
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
# fp8: Triton's fp8 tutorial config first (K steps of 128 bytes, as the 16-bit configs' 64)
FP8_CONFIGS = [(128, 256, 128, 8, 3), (128, 128, 128, 8, 4), (128, 128, 128, 4, 4)]


@tl.jit
def descriptor_matmul_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
                             WARP_SPECIALIZE: tl.constexpr, B_KMAJOR: tl.constexpr):
    """C = A @ B by tensor descriptors, tiles in grouped order (tutorial 03's L2 swizzle);
    B_KMAJOR: B stored [N, K] (b_desc over B.T), the form fp8 wgmma reads without a
    transpose. WARP_SPECIALIZE None leaves the choice to the compiler."""
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
        if B_KMAJOR:
            b = b_desc.load([n, k]).T
        else:
            b = b_desc.load([k, n])
        acc = tl.dot(a_desc.load([m, k]), b, acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def pointer_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                          stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """C = A @ B by pointer loads (tutorial 03's loop and grouped order), the K loop asked
    to warp-specialize or not."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
    group_rows = tl.minimum(tiles_m - group_first_m, GROUP_M)
    pid_m = group_first_m + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def pointer_matmul(a, b, block, num_warps: int, num_stages: int, warp_specialize: bool, triton: bool = False,
                   **options):
    """a @ b (torch, a's dtype) by pointer_matmul_kernel, compiled by weft.highlevel or (with
    `triton`) by Triton from the same source; `options` further weft launch options
    (pointer_tma=False: the loads staged by cp.async, not as TMA boxes)."""
    import torch

    (m, k), (_, n) = a.shape, b.shape
    bm, bn, bk = block
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    kernel = triton_same_source_kernel(pointer_matmul_kernel) if triton else pointer_matmul_kernel
    kernel[(-(-m // bm) * -(-n // bn),)](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                         c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                         STAGES=num_stages, WARP_SPECIALIZE=warp_specialize, num_warps=num_warps,
                                         **options)
    return c


def descriptor_matmul(a, b, block, num_warps: int, num_stages: int, warp_specialize, triton: bool = False,
                      b_kmajor: bool = False):
    """a @ b (torch; fp16 out for fp8 inputs, else a's dtype) by descriptor_matmul_kernel,
    compiled by weft.highlevel or (with `triton`) by Triton from the same source, with that
    compiler's host descriptors. `b_kmajor`: `b` is the [K, N] view of a [N, K] tensor
    (b.T), described as stored. `warp_specialize` None: the compiler's choice."""
    import torch

    if triton:
        from triton.tools.tensor_descriptor import TensorDescriptor
    else:
        from weft.highlevel.tools.tensor_descriptor import TensorDescriptor

    (m, k), (_, n) = a.shape, b.shape
    bm, bn, bk = block
    c = torch.empty((m, n), device=a.device, dtype=out_dtype(torch, a.dtype))
    b_stored, b_box = (b.T, (bn, bk)) if b_kmajor else (b, (bk, bn))
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, (bm, bk)), (b_stored, b_box),
                                                                       (c, (bm, bn)))]
    grid = (-(-m // bm) * -(-n // bn),)
    kernel = triton_same_source_kernel(descriptor_matmul_kernel) if triton else descriptor_matmul_kernel
    kernel[grid](*descs, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, STAGES=num_stages,
                 WARP_SPECIALIZE=warp_specialize, B_KMAJOR=b_kmajor, num_warps=num_warps)
    return c


def out_dtype(torch, dtype):
    """fp16 for fp8 inputs (wgmma's fp8 products in an fp32 accumulator), else the input's."""
    return torch.float16 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype


@functools.cache
def triton_same_source_kernel(kernel=None):
    """A weft.highlevel kernel (examples.matmul_kernel by default) compiled by Triton from
    its own source."""
    from weft.highlevel import examples

    kernel = examples.matmul_kernel if kernel is None else kernel
    return getattr(triton_module("tutorial_matmul", kernel), kernel.fn.__name__)


def triton_same_source(torch, a, b, block, num_warps: int, num_stages: int):
    """a @ b by `triton_same_source_kernel`, launched as examples.matmul launches weft's
    (GROUP_M 8, no activation, the accumulator in the dot); fp16 out for fp8 inputs."""
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=out_dtype(torch, a.dtype))
    block_m, block_n, block_k = block
    grid = (-(-m // block_m) * -(-n // block_n),)
    triton_same_source_kernel()[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                      out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
                                      BLOCK_K=block_k, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True,
                                      num_warps=num_warps, num_stages=num_stages)
    return out


DTYPES = ("float16", "bfloat16", "float8e4nv", "float8e5")  # Triton's names
# Warp specialization of the descriptor loop: weft's default (None: the compiler's choice,
# which splits rings too large for two CTAs per SM), off, and asked for; Triton is timed
# off and asked for.
WEFT_SPLITS = {"": None, " nows": False, " ws": True}
TRITON_SPLITS = {"": False, " ws": True}
# The pointer loop, Triton's splits off and asked for.
POINTER_SPLITS = {" nows": False, " ws": True}
# weft's pointer loop: its loads are TMA boxes (stage_pointer_loads), so the descriptor
# loop's default rule applies; " cp.async" keeps them pointer loads (pointer_tma=False),
# staged by cp.async rings, the form the pointer source had before.
WEFT_POINTER_SPLITS = {"": (None, {}), " nows": (False, {}), " ws": (True, {}),
                       " cp.async": (False, {"pointer_tma": False})}


def operands(torch, dtype: str, m: int, n: int, k: int):
    """Random A [M, K] and B [K, N]; for fp8, B is the [K, N] view of an [N, K] tensor (K
    contiguous: what fp8 wgmma reads, and what Triton's fp8 tutorial passes)."""
    if dtype.startswith("float8"):
        element = torch.float8_e4m3fn if dtype == "float8e4nv" else torch.float8_e5m2
        a = (torch.randn(m, k, device="cuda") * 0.5).to(element)
        b = (torch.randn(n, k, device="cuda") * 0.5).to(element).T
        return a, b
    element = getattr(torch, dtype)
    return torch.randn(m, k, device="cuda", dtype=element), torch.randn(k, n, device="cuda", dtype=element)


def systems_for(torch, dtype: str, a, b) -> tuple[str, dict]:
    """The reference system's name and every system, named, for one dtype and shape."""
    from weft.highlevel import examples

    fp8 = dtype.startswith("float8")
    configs = FP8_CONFIGS if fp8 else CONFIGS
    if fp8:
        one = torch.ones((), device="cuda")
        reference = "scaled_mm"
        systems = {reference: lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float16)}
    else:
        reference = "cublas"
        systems = {reference: lambda: torch.matmul(a, b)}
        try:
            from benchmarks import triton_matmul

            systems["triton"] = lambda: triton_matmul.matmul(a, b)
        except ImportError:
            pass
    out = "float16" if fp8 else dtype
    b_kn = b.contiguous() if fp8 else None  # fp8 B stored [K, N]: each box transposed in shared memory
    for bm, bn, bk, warps, stages in configs:
        tile = f"{bm}x{bn}x{bk} w{warps} s{stages}"
        systems[f"weft.hl {tile}"] = (lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages: examples.matmul(
            a, b, block=(bm, bn, bk), num_warps=warps, num_stages=stages, out_dtype=out))
        for suffix, (split, options) in ({} if fp8 else WEFT_POINTER_SPLITS).items():
            systems[f"weft.hl ptr{suffix} {tile}"] = (
                lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=split, options=options: pointer_matmul(
                    a, b, (bm, bn, bk), warps, stages, split, **options))
        for suffix, split in WEFT_SPLITS.items():
            systems[f"weft.hl desc{suffix} {tile}"] = (
                lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=split: descriptor_matmul(
                    a, b, (bm, bn, bk), warps, stages, split, b_kmajor=fp8))
        if fp8:
            systems[f"weft.hl desc kn {tile}"] = (lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages:
                                                  descriptor_matmul(a, b_kn, (bm, bn, bk), warps, stages, None))
    try:
        triton_same_source_kernel()
    except ImportError:
        return reference, systems
    for bm, bn, bk, warps, stages in configs:
        tile = f"{bm}x{bn}x{bk} w{warps} s{stages}"
        systems[f"triton.src {tile}"] = (lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages: triton_same_source(
            torch, a, b, (bm, bn, bk), warps, stages))
        for suffix, split in ({} if fp8 else POINTER_SPLITS).items():
            systems[f"triton.ptr{suffix} {tile}"] = (
                lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=split: pointer_matmul(
                    a, b, (bm, bn, bk), warps, stages, split, triton=True))
        for suffix, split in TRITON_SPLITS.items():
            systems[f"triton.desc{suffix} {tile}"] = (
                lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=split: descriptor_matmul(
                    a, b, (bm, bn, bk), warps, stages, split, triton=True, b_kmajor=fp8))
        if fp8:
            systems[f"triton.desc kn {tile}"] = (lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages:
                                                 descriptor_matmul(a, b_kn, (bm, bn, bk), warps, stages, False,
                                                                   triton=True))
    return reference, systems


def run(shapes=SHAPES, dtypes=("float16",), only=None) -> list[dict]:
    """One row per (shape, dtype); `only`: substrings, a system runs when its name has one
    (the reference always runs)."""
    import torch

    from benchmarks.matmul import _measure

    torch.manual_seed(0)
    rows = []
    for m, n, k in shapes:
        for dtype in dtypes:
            a, b = operands(torch, dtype, m, n, k)
            ref = a.float() @ b.float()
            reference, systems = systems_for(torch, dtype, a, b)
            if only:
                systems = {name: fn for name, fn in systems.items()
                           if name == reference or any(part in name for part in only)}
            row = {"shape": [m, n, k], "dtype": dtype}
            _measure(torch, row, reference, systems, ref, 2 * m * n * k)
            rows.append(row)
            print(row["shape"], dtype, {name: round(cell.get("tflops", 0)) for name, cell in row.items()
                                        if isinstance(cell, dict)}, file=sys.stderr, flush=True)
    return rows


def print_table(rows) -> None:
    print("TFLOP/s by CUDA-graph replay (ratio to cuBLAS, fp8: to scaled_mm); ERR = raised or wrong")
    for row in rows:
        cells = [f"{name} {cell['tflops']:.0f} ({cell.get('ratio', 1):.2f})" if "tflops" in cell
                 else f"{name} ERR: {cell.get('failure', cell.get('error'))}"[:160]
                 for name, cell in row.items() if isinstance(cell, dict)]
        print("x".join(map(str, row["shape"])), row["dtype"], " | ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4096^3 only")
    parser.add_argument("--shapes", help="comma-separated MxNxK (default: all of SHAPES)")
    parser.add_argument("--dtypes", default="float16,bfloat16,float8e4nv",
                        help=f"comma-separated, of {', '.join(DTYPES)}")
    parser.add_argument("--only", help="comma-separated substrings: only the systems whose names hold one "
                                       "(the reference, cuBLAS or scaled_mm, always runs)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")] if args.shapes else SHAPES
    dtypes = args.dtypes.split(",")
    unknown = [dtype for dtype in dtypes if dtype not in DTYPES]
    if unknown:
        parser.error(f"unknown dtypes {unknown}: choose from {', '.join(DTYPES)}")
    rows = run(shapes[:1] if args.quick else shapes, dtypes, args.only.split(",") if args.only else None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
