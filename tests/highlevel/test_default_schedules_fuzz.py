"""What a new user writes, compiled with no schedule option: dot loops over descriptors or
block pointers, attention-like (two dots, optionally causal in two loops) or a single
dot, with drawn variations that change layouts and barriers (a row reduction, a column
reduction, an extra elementwise op or a tl.where in the body; fp32 or fp16 stores through
pointers, desc.store, a masked tail in the epilogue), at head_dim 64 or 128, 4 or 8 warps
and 2 to 4 stages. Whatever schedule the compiler picks by default (TMA rings, the split,
ping-pong turns), the emulator (races and deadlocks reported, TMA completions shuffled
when drawn) agrees with numpy float64. The three explicit examples are what this property
found: an attention loop's column sum, a bar.sync of both consumer warpgroups inside a
ping-pong turn (drop_deadlocking_turns); an attention loop's row maximum carried to the
epilogue, whose conversion through shared memory came between the loop and the last turn's
pass (pass_after_drain now moves it after the pass, and the turns stay); and a single-dot loop whose K box, loaded again
each iteration, reused the bytes of the previous column sum's scratch with no proxy fence
(insert_barriers)."""

import os

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.highlevel.jit import compile_kernel
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator import emulate

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"

BLOCK_N = 64
PLAIN, ROW_MAX, COLUMN_SUM, ELEMENTWISE, WHERE = range(5)  # the loop body's variation
FP32, FP16, DESCRIPTOR, MASKED_TAIL = range(4)  # the epilogue's store
TAIL = 37  # rows the masked epilogue leaves unwritten


@tl.jit
def key_block(desc, base, start, n_ctx, BLOCK_PTRS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows [start, start + ROWS) of a [n_ctx, HEAD_DIM] fp16 tensor."""
    if BLOCK_PTRS:
        tile = tl.load(tl.make_block_ptr(base, (n_ctx, HEAD_DIM), (HEAD_DIM, 1), (start, 0), (ROWS, HEAD_DIM), (1, 0)))
    else:
        tile = desc.load([start, 0])
    return tile


@tl.jit
def varied(s, rows, cols, BODY: tl.constexpr, DIAGONAL: tl.constexpr):
    """The scores after the body's elementwise variation and, on the causal diagonal, the mask."""
    if BODY == 3:
        s = s * 0.5 + 0.25
    if BODY == 4:
        s = tl.where(cols[None, :] > rows[:, None], s, 0.0)
    if DIAGONAL:
        s = tl.where(rows[:, None] >= cols[None, :], s, 0.0)
    return s


@tl.jit
def reduced(s, row_max, column_sums, BODY: tl.constexpr):
    """The running row maxima of the scores; their column sums stored at `column_sums`."""
    if BODY == 1:
        row_max = tl.maximum(row_max, tl.max(s, 1))
    if BODY == 2:
        tl.store(column_sums, tl.sum(s, 0))
    return row_max


@tl.jit
def plain_dots(desc_q, desc_k, desc_v, desc_o, Q, K, V, Out, RowMax, ColSum, n_ctx, n_valid,
               TWO_DOTS: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_PTRS: tl.constexpr, BODY: tl.constexpr,
               REDUCE_FIRST: tl.constexpr,
               EPILOGUE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               WIDTH: tl.constexpr):
    """TWO_DOTS: Out = sum over key blocks of f(Q K^T) V (f's output rounded to fp16); else
    Out = sum over key blocks of f(Q K^T) ([BLOCK_M, BLOCK_N]). RowMax and ColSum take the
    row maxima and per-block column sums of f(Q K^T) when BODY asks, computed before the
    second dot when REDUCE_FIRST, else after it."""
    row = tl.program_id(0) * BLOCK_M
    rows = row + tl.arange(0, BLOCK_M)
    q = key_block(desc_q, Q, row, n_ctx, BLOCK_PTRS, BLOCK_M, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, WIDTH], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], -1.0e30, tl.float32)
    end = row if CAUSAL else n_ctx
    for start in tl.range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = key_block(desc_k, K, start, n_ctx, BLOCK_PTRS, BLOCK_N, HEAD_DIM)
        if TWO_DOTS:
            s = varied(tl.dot(q, k.T), rows, cols, BODY, False)
            if REDUCE_FIRST:
                row_max = reduced(s, row_max, ColSum + tl.program_id(0) * n_ctx + cols, BODY)
            acc = tl.dot(s.to(tl.float16), key_block(desc_v, V, start, n_ctx, BLOCK_PTRS, BLOCK_N, HEAD_DIM), acc)
            if REDUCE_FIRST == 0:
                row_max = reduced(s, row_max, ColSum + tl.program_id(0) * n_ctx + cols, BODY)
        elif BODY == 0:
            acc = tl.dot(q, k.T, acc)
        else:
            s = varied(tl.dot(q, k.T), rows, cols, BODY, False)
            acc += s
            row_max = reduced(s, row_max, ColSum + tl.program_id(0) * n_ctx + cols, BODY)
    if CAUSAL:
        for start in tl.range(row, row + BLOCK_M, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            k = key_block(desc_k, K, start, n_ctx, BLOCK_PTRS, BLOCK_N, HEAD_DIM)
            s = varied(tl.dot(q, k.T), rows, cols, BODY, True)
            if REDUCE_FIRST:
                row_max = reduced(s, row_max, ColSum + tl.program_id(0) * n_ctx + cols, BODY)
            acc = tl.dot(s.to(tl.float16), key_block(desc_v, V, start, n_ctx, BLOCK_PTRS, BLOCK_N, HEAD_DIM), acc)
            if REDUCE_FIRST == 0:
                row_max = reduced(s, row_max, ColSum + tl.program_id(0) * n_ctx + cols, BODY)
    if BODY == 1:
        tl.store(RowMax + rows, row_max)
    offsets = rows[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    if EPILOGUE == 0:
        tl.store(Out + offsets, acc)
    if EPILOGUE == 1:
        tl.store(Out + offsets, acc.to(tl.float16))
    if EPILOGUE == 2:
        desc_o.store([row, 0], acc.to(tl.float16))
    if EPILOGUE == 3:
        tl.store(Out + offsets, acc, mask=rows[:, None] < n_valid)


def reference(q, k, v, case):
    """(Out, RowMax, ColSum) in float64, as the kernel computes them."""
    n_ctx = q.shape[0]
    block_m = case["BLOCK_M"]
    scores = q.astype(np.float64) @ k.astype(np.float64).T
    rows, cols = np.arange(n_ctx)[:, None], np.arange(n_ctx)[None, :]
    body = case["BODY"]
    f = scores * 0.5 + 0.25 if body == ELEMENTWISE else scores
    f = np.where(cols > rows, f, 0.0) if body == WHERE else f
    program = rows // block_m
    if case["CAUSAL"]:
        visited = cols < (program + 1) * block_m
        f = np.where(visited & (cols >= program * block_m) & (rows < cols), 0.0, f)  # the diagonal's mask
    else:
        visited = np.ones_like(f, dtype=bool)
    f = np.where(visited, f, 0.0)
    if case["TWO_DOTS"]:
        out = f.astype(np.float16).astype(np.float64) @ v.astype(np.float64)
    else:
        out = f.reshape(n_ctx, -1, BLOCK_N).sum(axis=1)
    row_max = np.where(visited, f, -np.inf).max(axis=1)
    column_sums = np.where(visited, f, 0.0).reshape(-1, block_m, n_ctx).sum(axis=1)
    return out, row_max, column_sums


def prepared(case, num_warps: int, num_stages: int):
    """plain_dots for the emulator, launched with no option but warps and stages."""
    head_dim, block_m, width = case["HEAD_DIM"], case["BLOCK_M"], case["WIDTH"]
    out = "fp16" if case["EPILOGUE"] in (FP16, DESCRIPTOR) else "fp32"
    signature = {"desc_q": f"tensordesc<fp16[{block_m},{head_dim}]>", "desc_k": f"tensordesc<fp16[{BLOCK_N},{head_dim}]>",
                 "desc_v": f"tensordesc<fp16[{BLOCK_N},{head_dim}]>", "desc_o": f"tensordesc<{out}[{block_m},{width}]>",
                 "Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": f"*{out}", "RowMax": "*fp32", "ColSum": "*fp32",
                 "n_ctx": "i32", "n_valid": "i32"}
    return compile_kernel(plain_dots, signature, case, {},
                          {"num_warps": num_warps, "num_stages": num_stages, "target": "emulator"})


def launch(case, num_warps: int, num_stages: int):
    n_ctx, head_dim, block_m, width = 256, case["HEAD_DIM"], case["BLOCK_M"], case["WIDTH"]
    rng = np.random.default_rng(40)
    q, k, v = ((0.5 * rng.standard_normal((n_ctx, head_dim))).astype(np.float16) for _ in range(3))
    out_type = np.float16 if case["EPILOGUE"] in (FP16, DESCRIPTOR) else np.float32
    out = np.zeros((n_ctx, width), out_type)
    row_max = np.zeros(n_ctx, np.float32)
    column_sums = np.zeros((n_ctx // block_m, n_ctx), np.float32)
    n_valid = n_ctx - TAIL
    descs = [TensorDescriptor(t, [n_ctx, head_dim], [head_dim, 1], [rows, head_dim])
             for t, rows in ((q, block_m), (k, BLOCK_N), (v, BLOCK_N))]
    desc_o = TensorDescriptor(out, [n_ctx, width], [width, 1], [block_m, width])
    kernel = prepared(case, num_warps, num_stages)
    emulate(kernel, (n_ctx // block_m, 1), (*descs, desc_o, q, k, v, out, row_max, column_sums, n_ctx, n_valid))
    expected, expected_max, expected_sums = reference(q, k, v, case)
    checked = n_valid if case["EPILOGUE"] == MASKED_TAIL else n_ctx
    np.testing.assert_allclose(out[:checked].astype(np.float64), expected[:checked], atol=5e-2, rtol=1e-2)
    assert not out[checked:].any()
    if case["BODY"] == ROW_MAX:
        np.testing.assert_allclose(row_max, expected_max, atol=1e-2, rtol=1e-3)
    if case["BODY"] == COLUMN_SUM:
        np.testing.assert_allclose(column_sums, expected_sums, atol=1e-2, rtol=1e-3)


@settings(max_examples=300 if DEEP else 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(two_dots=st.booleans(), causal=st.booleans(), block_ptrs=st.booleans(),
       body=st.sampled_from([PLAIN, ROW_MAX, COLUMN_SUM, ELEMENTWISE, WHERE]), reduce_first=st.booleans(),
       epilogue=st.sampled_from([FP32, FP16, DESCRIPTOR, MASKED_TAIL]), head_dim=st.sampled_from([64, 128]),
       num_warps=st.sampled_from([4, 8]), num_stages=st.integers(2, 4), shuffle=st.sampled_from([None, 3, 11]))
@example(two_dots=True, causal=False, block_ptrs=False, body=COLUMN_SUM, reduce_first=False, epilogue=FP32,
         head_dim=128, num_warps=8, num_stages=3, shuffle=None).via("deadlocked: the column sum's bar.sync inside a turn")
@example(two_dots=False, causal=False, block_ptrs=False, body=COLUMN_SUM, reduce_first=False, epilogue=FP16,
         head_dim=64, num_warps=8, num_stages=3, shuffle=None).via("raced: K's box reloaded over the column sum's scratch, no proxy fence")
@example(two_dots=True, causal=False, block_ptrs=False, body=ROW_MAX, reduce_first=False, epilogue=FP32,
         head_dim=128, num_warps=8, num_stages=3, shuffle=None).via("deadlocked: the row maximum's conversion before the pass")
def test_default_schedules_match_numpy(monkeypatch, two_dots, causal, block_ptrs, body, reduce_first, epilogue,
                                       head_dim, num_warps, num_stages, shuffle):
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    case = dict(TWO_DOTS=two_dots, CAUSAL=causal and two_dots, BLOCK_PTRS=block_ptrs, BODY=body,
                REDUCE_FIRST=reduce_first and two_dots,
                EPILOGUE=epilogue, HEAD_DIM=head_dim, BLOCK_M=64 if num_warps == 4 else 128,
                BLOCK_N=BLOCK_N, WIDTH=head_dim if two_dots else BLOCK_N)
    launch(case, num_warps, num_stages)


def test_a_row_maximum_carried_out_of_the_turned_loop_keeps_the_turns():
    """The conversion of the carried row maximum follows the last pass, so the turns stay."""
    from weft.compiler.ir import WarpgroupTurn

    case = dict(TWO_DOTS=True, CAUSAL=False, BLOCK_PTRS=False, BODY=ROW_MAX, REDUCE_FIRST=False, EPILOGUE=FP32,
                HEAD_DIM=128, BLOCK_M=128, BLOCK_N=BLOCK_N, WIDTH=128)
    assert any(isinstance(op, WarpgroupTurn) for op in prepared(case, 8, 3).walk())
