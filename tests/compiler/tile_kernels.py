"""Small highlevel kernels for the inference-pass tests, and running passes up to one."""

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import ConvertLayout, Kernel
from weft.compiler.verifier import verify


@tl.jit
def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@tl.jit
def row_softmax(x_ptr, out_ptr, stride, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    offsets = rows[:, None] * stride + cols[None, :]
    mask = cols[None, :] < n_cols
    x = tl.load(x_ptr + offsets, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    tl.store(out_ptr + offsets, e / tl.sum(e, axis=1)[:, None], mask=mask)


@tl.jit
def transpose(x_ptr, out_ptr, N: tl.constexpr):
    rows = tl.arange(0, N)
    cols = tl.arange(0, N)
    tile = tl.load(x_ptr + rows[:, None] * N + cols[None, :])
    tl.store(out_ptr + cols[None, :] * N + rows[:, None], tile)


@tl.jit
def accumulate(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        acc += tl.load(x_ptr + start + offsets, mask=start + offsets < n, other=0.0)
    tl.store(out_ptr + offsets, acc)


ALIGNED = "divisible_by_16"
KERNELS = {
    "vector_add": (vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
                   {"BLOCK": 512}, 4),
    "row_softmax": (row_softmax, {"x_ptr": "*bf16", "out_ptr": "*bf16", "stride": "i32", "n_cols": "i32"},
                    {"ROWS": 4, "COLS": 128}, 2),
    "transpose": (transpose, {"x_ptr": "*fp16", "out_ptr": "*fp16"}, {"N": 32}, 4),
    "accumulate": (accumulate, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, {"BLOCK": 256}, 2),
}


def tile_kernel(name: str) -> Kernel:
    """The `tile`-stage IR of KERNELS[name], every runtime argument 16-aligned."""
    fn, signature, constexprs, warps = KERNELS[name]
    return build_kernel(fn, signature, constexprs, warps, {n: ALIGNED for n in signature},
                        language="highlevel")


def run_until(name: str, last_pass: str) -> Kernel:
    """KERNELS[name] after the tile passes up to and including `last_pass`, verified
    after each."""
    kernel = tile_kernel(name)
    for pass_name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if pass_name == last_pass:
            return kernel
    raise AssertionError(f"no tile pass {last_pass!r}")


def count_conversions(kernel: Kernel) -> int:
    return sum(isinstance(op, ConvertLayout) for op in kernel.walk())
