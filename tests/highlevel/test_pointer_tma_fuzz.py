"""stage_pointer_loads against what pointer loads mean: matmul-like pointer kernels written
to sit on the prover's edges, drawn by hypothesis, on the emulator (races and deadlocks
reported, TMA completions shuffled when drawn) against a numpy float64 model of the same
pointer arithmetic, launched both by default and with pointer_tma=False.

Drawn: tile sizes, warps, stages, M, N, K with tails (K = 0, K < BLOCK_K), A or B stored
transposed (a pointer tile whose rows are contiguous), B's tile loaded [BLOCK_N, BLOCK_K]
and transposed for the dot, A's rows and B's columns starting at a runtime offset and both
arrays starting anywhere in a bigger buffer (the pointer's alignment as a launch
specializes it), row strides wider than the rows, per operand a mask on none, one or both
dims, a loop (plain or written warp-specialized) advancing pointer tiles (`K - k * BLOCK_K`
bounds, k counting from 0 or later, by 1 or BLOCK_K; or A's tiles walked backwards) or
recomputing them from the induction variable (`offs_k < K` bounds), and one deliberately
non-tile form: a K bound that moves in absolute terms (`K - k`, `k * BLOCK_K + 7`),
`other=1.0`, `<=`, rows wrapped `% M`, an advance by a runtime amount, an advance inside an
`if`, two loads of one pointer tile, a mask over an index vector the pointer does not use,
a K start carried by the loop.
Whatever the prover decides, both launches agree with the model; the non-tile forms that
TMA cannot read as written must stay on cp.async.

What the GPU run of these kernels found (test_pointer_tma_fuzz_gpu.py): a row stride of -64
(B's rows read from the last up) is specialized divisible by 16 like 64, so B became a box
whose tensor map the GPU's encoding refused at launch, while the emulator answered. Now the
emulator refuses such a map as the GPU does, and the launch takes the pointer_tma=False
variant (runtime/jit.py); two explicit tests at the end check both. What the property
found on the emulator: a `<=` mask taken as one answer per run of 8 (axis_analysis, fixed),
and a proxy race in a warp-specialized loop over a transposed box (such a loop now stays one partition)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler.errors import CompilationWarning
from weft.compiler.ir import AsyncCopyGlobalToShared, TmaAsyncCopyGlobalToShared
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator import emulate

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"

# The non-tile forms (ODD): none, then K bounds that move, other=1.0, `<=`, wrapped rows,
# a runtime advance, an advance in some iterations, two loads of A's tile, a mask over an
# absolute index vector the carried pointer does not use, a recomputed tile whose K start
# is a carried scalar advanced in some iterations. BACKWARDS is a tile: A's K tiles from the
# last one down (a negative advance; its bound K + done is K in absolute terms).
PLAIN, DRIFT, SEVEN, OTHER_ONE, AT_MOST, WRAP, RUNTIME_ADVANCE, SOME_ITERATIONS, TWO_LOADS, OTHER_INDEX, \
    CARRIED_START, BACKWARDS = range(12)
CARRIED_ONLY = (RUNTIME_ADVANCE, SOME_ITERATIONS, OTHER_INDEX, BACKWARDS)
RECOMPUTED_ONLY = (CARRIED_START,)
# Forms TMA cannot read as written: each must stay on cp.async (the others may go either way).
NOT_BOXES = (DRIFT, SEVEN, OTHER_ONE, AT_MOST, WRAP, RUNTIME_ADVANCE, SOME_ITERATIONS, OTHER_INDEX)


@tl.jit
def bounded(first, second, first_bound, second_bound, MASK: tl.constexpr, AT_MOST_: tl.constexpr):
    """The mask of a [len(first), len(second)] tile: MASK bit 0 bounds the first dim, bit 1
    the second (AT_MOST_: written `second <= bound - 1`)."""
    if AT_MOST_:
        inner = second[None, :] <= second_bound - 1
    else:
        inner = second[None, :] < second_bound
    if MASK == 1:
        mask = first[:, None] < first_bound
    elif MASK == 2:
        mask = inner
    else:
        mask = (first[:, None] < first_bound) & inner
    return mask


@tl.jit
def loaded(pointers, first, second, first_bound, second_bound, MASK: tl.constexpr, AT_MOST_: tl.constexpr,
           OTHER: tl.constexpr):
    if MASK == 0:
        tile = tl.load(pointers)
    else:
        tile = tl.load(pointers, mask=bounded(first, second, first_bound, second_bound, MASK, AT_MOST_), other=OTHER)
    return tile


@tl.jit
def fuzzed_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, row_a, col_b,
                  advance_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  RECOMPUTED: tl.constexpr, MASK_A: tl.constexpr, MASK_B: tl.constexpr, ODD: tl.constexpr,
                  FIRST: tl.constexpr, STEP: tl.constexpr, B_LOADED_T: tl.constexpr, MASK_B_T: tl.constexpr,
                  WS: tl.constexpr):
    """c[:M, :N] = sum over the loop of A's tile @ B's tile; A's rows start at row_a, B's
    columns at col_b (bounded by row_a + M and col_b + N). The loop that advances pointer
    tiles counts k from FIRST * STEP by STEP (1 or BLOCK_K). B_LOADED_T: B's tile is loaded
    [BLOCK_N, BLOCK_K] (masked by MASK_B_T, MASK_B's bits swapped) and transposed for the dot.
    WS: the loop is written warp-specialized."""
    if ODD == 5:
        rows = row_a + (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    else:
        rows = row_a + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = col_b + tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    other_a = 1.0 if ODD == 3 else 0.0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if RECOMPUTED:
        start = 0
        for k in tl.range(0, K, BLOCK_K, warp_specialize=WS):
            if ODD == 10:
                offs_k = start + tl.arange(0, BLOCK_K)
            else:
                offs_k = k + tl.arange(0, BLOCK_K)
            if ODD == 1:
                bound_a = K - k
            elif ODD == 2:
                bound_a = k + 7
            else:
                bound_a = K
            a = loaded(a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak, rows, offs_k, row_a + M,
                       bound_a, MASK_A, ODD == 4, other_a)
            if B_LOADED_T:
                b = loaded(b_ptr + cols[:, None] * stride_bn + offs_k[None, :] * stride_bk, cols, offs_k, col_b + N, K,
                           MASK_B_T, False, 0.0).T
            else:
                b = loaded(b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn, offs_k, cols, K,
                           col_b + N, MASK_B, False, 0.0)
            acc = tl.dot(a, b, acc)
            if ODD == 8:
                a_again = loaded(a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak, rows, offs_k,
                                 row_a + M, bound_a, MASK_A, False, 0.0)
                acc = tl.dot(a_again, b, acc)
            if ODD == 10:
                if k % (2 * BLOCK_K) == 0:
                    start += BLOCK_K
    else:
        ks = tl.arange(0, BLOCK_K)
        if ODD == 11:
            ks_a = (tl.cdiv(K, BLOCK_K) - 1) * BLOCK_K + ks
        else:
            ks_a = ks
        a_ptrs = a_ptr + rows[:, None] * stride_am + ks_a[None, :] * stride_ak
        if B_LOADED_T:
            b_ptrs = b_ptr + cols[:, None] * stride_bn + ks[None, :] * stride_bk
        else:
            b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
        for k in tl.range(FIRST * STEP, (tl.cdiv(K, BLOCK_K) + FIRST) * STEP, STEP, warp_specialize=WS):
            done = (k - FIRST * STEP) * (BLOCK_K // STEP)  # K elements behind this iteration's tile
            if ODD == 1:
                bound_a = K - k
            elif ODD == 2:
                bound_a = k * BLOCK_K + 7
            elif ODD == 9:
                bound_a = K
            elif ODD == 11:
                bound_a = K + done
            else:
                bound_a = K - done
            if ODD == 9:
                a = loaded(a_ptrs, rows, done + ks, row_a + M, bound_a, MASK_A, False, other_a)
            else:
                a = loaded(a_ptrs, rows, ks_a, row_a + M, bound_a, MASK_A, ODD == 4, other_a)
            if B_LOADED_T:
                b = loaded(b_ptrs, cols, ks, col_b + N, K - done, MASK_B_T, False, 0.0).T
            else:
                b = loaded(b_ptrs, ks, cols, K - done, col_b + N, MASK_B, False, 0.0)
            acc = tl.dot(a, b, acc)
            if ODD == 8:
                a_again = loaded(a_ptrs, rows, ks, row_a + M, bound_a, MASK_A, False, 0.0)
                acc = tl.dot(a_again, b, acc)
            if ODD == 6:
                a_ptrs += advance_k * stride_ak
            elif ODD == 7:
                if k % 2 == 0:
                    a_ptrs += BLOCK_K * stride_ak
            elif ODD == 11:
                a_ptrs -= BLOCK_K * stride_ak
            else:
                a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    out_rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :], acc,
             mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


NAMES = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm",
         "row_a", "col_b", "advance_k")
SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", **{name: "i32" for name in NAMES[3:]}}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mask_of(mask: int, first, second, first_bound: int, second_bound: int, at_most: bool = False) -> np.ndarray:
    inner = second[None, :] <= second_bound - 1 if at_most else second[None, :] < second_bound
    outer = first[:, None] < first_bound
    shape = (len(first), len(second))
    return np.broadcast_to({0: True, 1: outer, 2: inner, 3: outer & inner}[mask], shape)


def operand_reads(case: dict, v: dict):
    """Per program (its C rows and columns) and per dot of each iteration, the (offsets,
    mask, other) of A's and B's tiles, as the pointer arithmetic of fuzzed_matmul reads them."""
    bm, bn, bk, odd = case["BLOCK_M"], case["BLOCK_N"], case["BLOCK_K"], case["ODD"]
    m, n, k_total = v["M"], v["N"], v["K"]
    ks = np.arange(bk)
    for p0 in range(cdiv(m, bm)):
        for p1 in range(cdiv(n, bn)):
            local = p0 * bm + np.arange(bm)
            rows = v["row_a"] + (local % m if odd == WRAP else local)
            cols = v["col_b"] + p1 * bn + np.arange(bn)
            other_a = 1.0 if odd == OTHER_ONE else 0.0
            dots = []
            if case["RECOMPUTED"]:
                start = 0
                for k in range(0, k_total, bk):
                    offs_k = (start if odd == CARRIED_START else k) + ks
                    bound_a = {DRIFT: k_total - k, SEVEN: k + 7}.get(odd, k_total)
                    a = (rows[:, None] * v["stride_am"] + offs_k[None, :] * v["stride_ak"],
                         mask_of(case["MASK_A"], rows, offs_k, v["row_a"] + m, bound_a, odd == AT_MOST), other_a)
                    b = (offs_k[:, None] * v["stride_bk"] + cols[None, :] * v["stride_bn"],
                         mask_of(case["MASK_B"], offs_k, cols, k_total, v["col_b"] + n), 0.0)
                    dots.append((a, b))
                    if odd == TWO_LOADS:
                        dots.append(((a[0], a[1], 0.0), b))
                    if odd == CARRIED_START and k % (2 * bk) == 0:
                        start += bk
            else:
                a_start = b_start = 0
                ks_a = (cdiv(k_total, bk) - 1) * bk + ks if odd == BACKWARDS else ks
                for i in range(cdiv(k_total, bk)):
                    k, done = (i + case["FIRST"]) * case["STEP"], i * bk
                    bound_a = {DRIFT: k_total - k, SEVEN: k * bk + 7, OTHER_INDEX: k_total,
                               BACKWARDS: k_total + done}.get(odd, k_total - done)
                    index = done + ks if odd == OTHER_INDEX else ks_a
                    a = (a_start + rows[:, None] * v["stride_am"] + ks_a[None, :] * v["stride_ak"],
                         mask_of(case["MASK_A"], rows, index, v["row_a"] + m, bound_a, odd == AT_MOST), other_a)
                    b = (b_start + ks[:, None] * v["stride_bk"] + cols[None, :] * v["stride_bn"],
                         mask_of(case["MASK_B"], ks, cols, k_total - done, v["col_b"] + n), 0.0)
                    dots.append((a, b))
                    if odd == TWO_LOADS:
                        dots.append(((a[0], a[1], 0.0), b))
                    if odd == RUNTIME_ADVANCE:
                        a_start += v["advance_k"] * v["stride_ak"]
                    elif odd == BACKWARDS:
                        a_start -= bk * v["stride_ak"]
                    elif odd != SOME_ITERATIONS or k % 2 == 0:
                        a_start += bk * v["stride_ak"]
                    b_start += bk * v["stride_bk"]
            yield p0, p1, dots


def extent(reads) -> int:
    """Elements a buffer needs so that every read lies inside it."""
    offsets = np.concatenate([offsets[mask].ravel() for offsets, mask, _ in reads] + [np.zeros(1, np.int64)])
    assert offsets.min() >= 0, "the drawn case reads before its buffer"
    return int(offsets.max()) + 1


def gathered(buffer: np.ndarray, read) -> np.ndarray:
    offsets, mask, other = read
    return np.where(mask, buffer.astype(np.float64)[np.where(mask, offsets, 0)], other)


def model(case: dict, v: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C in float64: each program's sum of its dots' tiles, stored where rows < M and cols < N."""
    bm, bn = case["BLOCK_M"], case["BLOCK_N"]
    c = np.zeros((cdiv(v["M"], bm) * bm, cdiv(v["N"], bn) * bn))
    for p0, p1, dots in operand_reads(case, v):
        acc = np.zeros((bm, bn))
        for read_a, read_b in dots:
            acc += gathered(a, read_a) @ gathered(b, read_b)
        c[p0 * bm:(p0 + 1) * bm, p1 * bn:(p1 + 1) * bn] = acc
    return c[:v["M"], :v["N"]]


def copies(kernel) -> tuple[int, int]:
    """(TMA copies, cp.async copies) in the compiled layout IR."""
    ops = list(kernel.walk())
    return (sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops),
            sum(isinstance(op, AsyncCopyGlobalToShared) for op in ops))


def launched(case: dict, v: dict, a, b, num_warps: int, num_stages: int, **options):
    """(C as the emulator computes it, (TMA copies, cp.async copies)), specialized as a
    launch with these arguments is."""
    from weft.runtime.arguments import specialization_of

    c = np.zeros((v["M"], v["N"]), np.float32)
    args = (a, b, c, *(v[name] for name in NAMES[3:]))
    specialization = dict(zip(NAMES, specialization_of(args)))
    kernel = compile_kernel(fuzzed_matmul, SIGNATURE, case, specialization,
                            {"num_warps": num_warps, "num_stages": num_stages, "target": "emulator", **options})
    emulate(kernel, (cdiv(v["M"], case["BLOCK_M"]), cdiv(v["N"], case["BLOCK_N"])), args)
    return c, copies(kernel)


def check(case: dict, v: dict, num_warps: int, num_stages: int, starts: tuple[int, int], seed: int = 0) -> int:
    """Both launches against the model; the default launch's TMA copies."""
    reads = [read for _, _, dots in operand_reads(case, v) for pair in dots for read in pair]
    rng = np.random.default_rng(seed)
    # Each operand lies `start` elements into its buffer (a view: its address is the buffer's
    # plus start * 2 bytes, aligned to 16 or not).
    a_view, b_view = (rng.standard_normal(start + extent(reads[i::2]) + 8).astype(np.float16)[start:]
                      for i, start in enumerate(starts))
    expected = model(case, v, a_view, b_view)
    tolerance = dict(rtol=1e-3, atol=1e-3 * (1 + v["K"]))
    c, (tma, cp_async) = launched(case, v, a_view, b_view, num_warps, num_stages)
    np.testing.assert_allclose(c, expected, **tolerance)
    # `K - k` is the tutorial's absolute bound where k counts elements (STEP = BLOCK_K).
    if case["ODD"] in NOT_BOXES and not (case["ODD"] == DRIFT and case["STEP"] > 1 and not case["RECOMPUTED"]):
        assert tma == 0, f"a non-tile form ({case['ODD']}) went by TMA"
    c, (tma_off, _) = launched(case, v, a_view, b_view, num_warps, num_stages, pointer_tma=False)
    assert tma_off == 0
    np.testing.assert_allclose(c, expected, **tolerance)
    return tma


@st.composite
def drawn_cases(draw):
    """(case constexprs, argument values, warps, stages, the operands' starts in their buffers)."""
    block_m, block_n, block_k = (draw(st.sampled_from(sizes)) for sizes in ((64, 128), (32, 64, 128), (16, 32, 64)))
    recomputed = draw(st.booleans())
    odd = draw(st.sampled_from([odd for odd in range(12)
                                   if odd not in (CARRIED_ONLY if recomputed else RECOMPUTED_ONLY)]))
    mask_a, mask_b = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    if odd in (DRIFT, SEVEN, OTHER_ONE, AT_MOST, OTHER_INDEX):
        mask_a |= 2  # the form is in A's K bound
    m, n = draw(st.integers(1, 2 * block_m)), draw(st.integers(1, 2 * block_n))
    k = draw(st.one_of(st.just(0), st.integers(1, block_k - 1), st.integers(block_k, 3 * block_k)))
    row_a, col_b = draw(st.sampled_from((0, 3, 16))), draw(st.sampled_from((0, 5, 64)))
    pad_a, pad_b = draw(st.sampled_from((0, 8, 5, 64))), draw(st.sampled_from((0, 8, 5, 64)))
    if draw(st.booleans()):  # A stored [K, rows]
        stride_am, stride_ak = 1, cdiv(row_a + m, 16) * 16 + pad_a
    else:
        stride_am, stride_ak = cdiv(max(k, 1), 16) * 16 + pad_a, 1
    if draw(st.booleans()):  # B stored [columns, K]: a transposed pointer tile
        stride_bk, stride_bn = 1, cdiv(max(k, 1), 16) * 16 + pad_b
    else:
        stride_bk, stride_bn = cdiv(col_b + n, 16) * 16 + pad_b, 1
    advance_k = draw(st.sampled_from((block_k, block_k - 8, block_k + 3))) if odd == RUNTIME_ADVANCE else block_k
    case = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, RECOMPUTED=recomputed, MASK_A=mask_a,
                MASK_B=mask_b, ODD=odd, FIRST=draw(st.sampled_from((0, 2))), STEP=draw(st.sampled_from((1, block_k))),
                B_LOADED_T=draw(st.booleans()), MASK_B_T=(mask_b & 1) << 1 | mask_b >> 1,
                WS=draw(st.booleans()))
    values = dict(M=m, N=n, K=k, stride_am=stride_am, stride_ak=stride_ak, stride_bk=stride_bk, stride_bn=stride_bn,
                  stride_cm=n, row_a=row_a, col_b=col_b, advance_k=advance_k)
    starts = (draw(st.sampled_from((0, 8, 3, 40))), draw(st.sampled_from((0, 8, 3, 40))))
    return case, values, draw(st.sampled_from((4, 8))), draw(st.integers(2, 4)), starts


# A loop written warp-specialized that weft does not split warns (CompilationWarning).
@pytest.mark.filterwarnings("ignore::weft.compiler.errors.CompilationWarning")
@settings(max_examples=300 if DEEP else 10, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=drawn_cases(), shuffle=st.sampled_from((None, 3, 11)))
def test_pointer_kernels_match_the_model_with_and_without_tma(monkeypatch, drawn, shuffle):
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    check(*drawn)


NEGATIVE_STRIDE_CASE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, RECOMPUTED=False, MASK_A=2, MASK_B=1, ODD=PLAIN, FIRST=0,
                            STEP=1, B_LOADED_T=False, MASK_B_T=2, WS=False)


def flipped_operands(m: int, n: int, k: int):
    """a [m, k], b [k, n] and b's rows from the last up: a view whose element 0 is b's last
    row and whose row stride is -n (a pointer kernel reads it with stride_bk = -n)."""
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(shape).astype(np.float16) for shape in ((m, k), (k, n)))
    return a, b, b[::-1]


def test_a_negative_row_stride_launches_the_cp_async_variant_and_matches_numpy():
    # A launch specializes stride_bk = -64 as divisible by 16, so B is staged as a box; TMA
    # cannot take the map's negative stride, and the launch takes the pointer_tma=False variant.
    m, n, k = 64, 64, 80
    a, b, flipped = flipped_operands(m, n, k)
    c = np.zeros((m, n), np.float32)
    fuzzed_matmul[(1, 1)](a, flipped, c, m, n, k, k, 1, -n, 1, n, 0, 0, 32, **NEGATIVE_STRIDE_CASE, num_warps=4,
                          num_stages=3)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b[::-1].astype(np.float64), rtol=1e-3, atol=1e-3 * k)


def test_the_emulator_refuses_a_made_map_with_a_negative_stride_as_the_gpu_does():
    from weft.runtime.arguments import specialization_of
    from weft.runtime.tensor_descriptor import TensorDescriptorError

    m, n, k = 64, 64, 80
    a, _, flipped = flipped_operands(m, n, k)
    args = (a, flipped, np.zeros((m, n), np.float32), m, n, k, k, 1, -n, 1, n, 0, 0, 32)
    kernel = compile_kernel(fuzzed_matmul, SIGNATURE, NEGATIVE_STRIDE_CASE, dict(zip(NAMES, specialization_of(args))),
                            {"num_warps": 4, "num_stages": 3, "target": "emulator"})
    assert copies(kernel) == (6, 0)  # B's map has stride_bk as its row stride
    with pytest.raises(TensorDescriptorError, match="non-negative"):
        emulate(kernel, (1, 1), args)


def test_a_mask_written_at_most_is_not_taken_uniform_over_runs():
    # What the property found: `offs_k <= K - 1` with K = 1 (specialized to the constant 1)
    # holds for offs_k = 0 only, but axis analysis took the compare as one answer per run
    # of 8 elements as it does for `<` (vectorized masked loads read the run as one): the
    # emulator caught the run whose values differ.
    case = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=16, RECOMPUTED=True, MASK_A=2, MASK_B=0, ODD=AT_MOST, FIRST=0, STEP=1,
                B_LOADED_T=False, MASK_B_T=0, WS=False)
    values = dict(M=1, N=1, K=1, stride_am=16, stride_ak=1, stride_bk=16, stride_bn=1, stride_cm=1, row_a=0, col_b=0,
                  advance_k=16)
    check(case, values, 4, 2, (0, 0))


def test_a_loop_over_a_transposed_box_asked_to_warp_specialize_stays_one_partition():
    # What the property found: A stored [K, M] (its box read into registers, so no ring takes
    # it), the loop written warp-specialized, 2 stages, two iterations. Split, the consumers
    # copied A's box again each iteration with nothing ordering the previous read's proxy
    # fence before the copy (a race the emulator reported); the loop now stays one partition.
    case = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=16, RECOMPUTED=False, MASK_A=0, MASK_B=0, ODD=PLAIN, FIRST=0, STEP=1,
                B_LOADED_T=False, MASK_B_T=0, WS=True)
    values = dict(M=1, N=1, K=17, stride_am=1, stride_ak=16, stride_bk=16, stride_bn=1, stride_cm=1, row_a=0, col_b=0,
                  advance_k=16)
    with pytest.warns(CompilationWarning, match="warp_specialize=True is not applied"):
        check(case, values, 4, 2, (0, 0))
