"""`tl.dot` in highlevel kernels on the CPU emulator (with its shared-memory race checks)
against numpy float64 on random inputs: the tutorial-style matmul of highlevel/examples.py
over tile sizes, warps, tails, input types and both ways of accumulating; single dots for
the output types and precisions; and the errors for what no path runs."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import Barrier, Block, WarpgroupMma
from weft.highlevel import examples
from weft.runtime.emulator import EmulationError, emulate

torch = pytest.importorskip("torch")  # bf16 and fp8 host arrays

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(40)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
               "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2, "int8": torch.int8}
# Error per unit of sum(|a| |b|): fp32 accumulation of exact products, or tf32 inputs (10-bit mantissa).
TOLERANCE = {"fp16": 1e-5, "bf16": 1e-5, "fp8e4m3": 1e-5, "fp8e5m2": 1e-5, "fp32": 2e-3, "int8": 0}


def random_tile(shape, dtype: str):
    if dtype == "int8":
        return torch.tensor(RNG.integers(-128, 128, shape), dtype=torch.int8)
    return torch.tensor(RNG.standard_normal(shape) * 2, dtype=torch.float32).to(TORCH_TYPES[dtype])


def check_product(out, a, b, dtype: str, activation: str = "", acc=None):
    """out against a @ b (+ acc) in float64, within the input type's accumulation error."""
    a64, b64 = a.double().numpy(), b.double().numpy()
    reference = a64 @ b64 + (0 if acc is None else acc.double().numpy())
    scale = np.abs(a64) @ np.abs(b64) + (0 if acc is None else np.abs(acc.double().numpy()))
    if activation == "leaky_relu":
        reference = np.where(reference >= 0, reference, 0.01 * reference)
    error = np.abs(out.double().numpy() - reference)
    assert (error <= TOLERANCE[dtype] * scale + 1e-6).all(), f"largest error {error.max()}"


# ------------------------------------------------------------------ the matmul kernel
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps): wgmma tiles, and small ones the fallback takes.
TILES = [(64, 64, 32, 4), (128, 64, 32, 4), (64, 128, 16, 8), (128, 128, 64, 8), (64, 32, 64, 8),
         (16, 16, 16, 4), (32, 16, 32, 4), (16, 32, 16, 8)]


@settings(max_examples=200 if DEEP else 10, deadline=None, suppress_health_check=list(HealthCheck))
@given(tile=st.sampled_from(TILES), dtype=st.sampled_from(["fp16", "bf16", "fp32", "fp8e4m3"]),
       tails=st.tuples(*(st.integers(1, 2) for _ in range(3))),
       remainders=st.tuples(*(st.integers(0, 15) for _ in range(3))),
       acc_in_dot=st.booleans(), activation=st.sampled_from(["", "leaky_relu"]))
def test_matmul_matches_numpy(tile, dtype, tails, remainders, acc_in_dot, activation):
    *block, num_warps = tile
    if dtype.startswith("fp8") and block[2] < 32:
        block[2] = 32  # 8-bit dots need K >= 32
    # Sizes a tile or two long, most of them not a multiple of the block (tails).
    m, n, k = (max(1, t * b - r) for t, b, r in zip(tails, block, remainders))
    a, b = random_tile((m, k), dtype), random_tile((k, n), dtype)
    out = examples.matmul(a, b, activation, block=tuple(block), num_warps=num_warps, acc_in_dot=acc_in_dot)
    check_product(out, a, b, dtype, activation)


def test_strided_operands():
    a = random_tile((96, 80), "fp16")[:, ::2]   # [96, 40] with columns 2 apart
    b = random_tile((40, 130), "fp16").t().contiguous().t()  # [40, 130] stored column-major
    check_product(examples.matmul(a, b, block=(64, 64, 32)), a, b, "fp16")


def test_int8_products_sum_exactly_in_int32():
    a, b = random_tile((40, 70), "int8"), random_tile((70, 24), "int8")
    out = examples.matmul(a, b, block=(16, 16, 32), acc_in_dot=False)
    assert out.dtype == torch.int32
    np.testing.assert_array_equal(out.numpy(), a.long().numpy() @ b.long().numpy())


def test_the_matmul_uses_wgmma_and_the_emulator_checks_its_shared_memory_for_races():
    """With its barriers removed, the same kernel is a race the emulator reports: the
    checks that pass in the tests above are on."""
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 **{f"stride_{name}": "i32" for name in ("am", "ak", "bk", "bn", "cm", "cn")}}
    constexprs = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True)
    tile = build_kernel(examples.matmul_kernel, signature, constexprs, 4, {}, language="highlevel")
    kernel = pipeline.prepare_for_emulator(tile)
    assert sum(isinstance(op, WarpgroupMma) for op in kernel.walk()) == 1

    def without_barriers(block: Block) -> Block:
        return Block(block.args, tuple(op.map_regions(without_barriers) for op in block.ops
                                       if not isinstance(op, Barrier)))

    a, b = random_tile((64, 64), "fp16").numpy(), random_tile((64, 64), "fp16").numpy()
    args = [a, b, np.zeros((64, 64), np.float32), 64, 64, 64, 64, 1, 64, 1, 64, 1]
    emulate(kernel, (1,), args)
    check_product(torch.tensor(args[2]), torch.tensor(a), torch.tensor(b), "fp16")
    with pytest.raises(EmulationError, match="race"):
        emulate(kernel.with_body(without_barriers(kernel.body)), (1,), args)


@tl.jit
def attention_forward(q_ptr, k_ptr, v_ptr, o_ptr, seq, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """softmax(q k^T) v for BLOCK_M query rows, keys in blocks (online softmax): a dot of a
    transposed tile, and one whose A was computed in registers."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + offs_m[:, None] * D + offs_d[None, :])
    row_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, seq, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + offs_n[:, None] * D + offs_d[None, :])
        v = tl.load(v_ptr + offs_n[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        new_max = tl.maximum(row_max, tl.max(s, 1))
        p = tl.exp(s - new_max[:, None])
        alpha = tl.exp(row_max - new_max)
        row_sum = row_sum * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        row_max = new_max
    tl.store(o_ptr + offs_m[:, None] * D + offs_d[None, :], acc / row_sum[:, None])


@pytest.mark.parametrize("block_m, num_warps", [(64, 4), (16, 4)])
def test_attention_forward_chains_two_dots(block_m, num_warps):
    seq, d = 128, 64
    q, k, v = (random_tile((seq, d), "fp16") for _ in range(3))
    out = torch.zeros((seq, d), dtype=torch.float32)
    attention_forward[(seq // block_m,)](q, k, v, out, seq, D=d, BLOCK_M=block_m, BLOCK_N=64, num_warps=num_warps)
    s = q.double().numpy() @ k.double().numpy().T
    p = np.exp(s - s.max(1, keepdims=True))
    reference = p / p.sum(1, keepdims=True) @ v.double().numpy()
    np.testing.assert_allclose(out.numpy(), reference, atol=2e-3 * np.abs(reference).max())


# ------------------------------------------------------------------ one dot
@tl.jit
def single_dot(a_ptr, b_ptr, c_ptr, acc_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               OUT: tl.constexpr, PRECISION: tl.constexpr, WITH_ACC: tl.constexpr):
    rows, cols, ks = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
    b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
    if WITH_ACC:
        c = tl.dot(a, b, tl.load(acc_ptr + rows[:, None] * N + cols[None, :]), input_precision=PRECISION,
                   out_dtype=OUT)
    else:
        c = tl.dot(a, b, input_precision=PRECISION, out_dtype=OUT)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], c)


def run_single(a, b, out_dtype=tl.float32, precision=None, acc=None, num_warps=4):
    (m, k), n = a.shape, b.shape[1]
    out = torch.zeros((m, n), dtype={tl.float32: torch.float32, tl.float16: torch.float16,
                                     tl.int32: torch.int32}[out_dtype])
    single_dot[(1,)](a, b, out, out if acc is None else acc, M=m, N=n, K=k, OUT=out_dtype, PRECISION=precision,
                     WITH_ACC=acc is not None, num_warps=num_warps)
    return out


@pytest.mark.parametrize("shape, num_warps", [((64, 64, 32), 4), ((16, 32, 16), 4)])
def test_fp16_accumulator(shape, num_warps):
    m, n, k = shape
    a, b = random_tile((m, k), "fp16"), random_tile((k, n), "fp16")
    acc = random_tile((m, n), "fp16")
    out = run_single(a, b, tl.float16, acc=acc, num_warps=num_warps)
    assert out.dtype == torch.float16
    reference = a.double().numpy() @ b.double().numpy() + acc.double().numpy()
    np.testing.assert_allclose(out.double().numpy(), reference, rtol=2e-3, atol=2e-2)


def test_fp32_precisions():
    a, b = random_tile((64, 32), "fp32"), random_tile((32, 64), "fp32")
    exact = a.double().numpy() @ b.double().numpy()
    tf32 = run_single(a, b)  # wgmma reads tf32 (10-bit mantissas), as Triton's default
    check_product(tf32, a, b, "fp32")
    assert np.abs(tf32.double().numpy() - exact).max() > 1e-4  # not fp32's error: the inputs were rounded
    tf32x3 = run_single(a, b, precision="tf32x3")  # three tf32 dots of the split operands: fp32's error
    np.testing.assert_allclose(tf32x3.double().numpy(), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    small_a, small_b = random_tile((32, 32), "fp32"), random_tile((32, 16), "fp32")
    ieee = run_single(small_a, small_b, precision="ieee").double().numpy()
    np.testing.assert_allclose(ieee, small_a.double().numpy() @ small_b.double().numpy(), rtol=1e-5, atol=1e-4)


def test_fp8_mixes_e4m3_and_e5m2():
    a, b = random_tile((64, 64), "fp8e4m3"), random_tile((64, 32), "fp8e5m2")
    check_product(run_single(a, b), a, b, "fp8e4m3")


# ------------------------------------------------------------------ errors
def _signature(dtype_a="fp16", dtype_b="fp16"):
    return {"a_ptr": f"*{dtype_a}", "b_ptr": f"*{dtype_b}", "c_ptr": "*fp32", "acc_ptr": "*fp32"}


@pytest.mark.parametrize("dtypes, options, message, suggestion", [
    (("fp16", "bf16"), {}, "one element type", "b.to(tl.float16)"),
    (("fp32", "fp32"), {"PRECISION": "bf16x3"}, "input_precision must be one of", ""),
    (("bf16", "bf16"), {"OUT": tl.float16}, "accumulates in tl.float32", "out_dtype=tl.float32"),
    (("fp16", "fp16"), {"K": 8}, "every dim at least 16", "larger blocks"),
    (("fp16", "fp16"), {"WITH_ACC": True, "OUT": tl.float16}, "acc holds fp32 but the dot accumulates in fp16",
     "out_dtype=tl.float32"),
    (("fp32", "fp32"), {"PRECISION": "ieee", "K": 64}, "cannot run on the tensor cores", "input_precision='tf32'"),
    (("int8", "int8"), {"K": 64}, "too large for the FMA fallback", "smaller tiles"),
])
def test_what_no_path_runs_is_refused_at_the_users_line(dtypes, options, message, suggestion):
    constexprs = {**dict(M=64, N=64, K=32, OUT=tl.float32, PRECISION=None, WITH_ACC=False), **options}
    with pytest.raises(CompilationError) as info:
        single_dot.compile(signature=_signature(*dtypes), constexprs=constexprs)
    error = info.value
    assert message in error.message
    assert suggestion in error.render()
    assert "tl.dot(a, b" in error.render()  # the caret is on the user's dot


def test_batched_dots_say_so():
    @tl.jit
    def batched(x_ptr):
        x = tl.load(x_ptr + tl.arange(0, 16)[:, None, None] + tl.arange(0, 16)[None, :, None]
                    + tl.arange(0, 16)[None, None, :])
        tl.store(x_ptr + tl.arange(0, 16), tl.sum(tl.sum(tl.dot(x, x), axis=2), axis=1))

    with pytest.raises(CompilationError, match="3-D"):
        batched.compile(signature={"x_ptr": "*fp16"})
