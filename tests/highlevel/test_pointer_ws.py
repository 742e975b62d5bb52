"""Pointer (cp.async) dot loops written `tl.range(..., warp_specialize=True)`, split into a
producer partition that issues the copies and arrives on each slot's full barrier by
cp.async.mbarrier.arrive.noinc, and the consumer warps that wait, multiply and release
(compiler/passes/pipeline_copy_warp_specialize.py): run on the CPU emulator, whose race
and deadlock checks see every copy in flight until its arrival and every slot until its
release, against numpy float64: tails in M, N and K, fp16 and bf16, 2 to 4 stages, 4 and
8 warps, and a hypothesis property over tiles, stages and tails; the race when the
producer does not wait for the release and the deadlock when the consumers never release;
the golden IR of the split; the Hopper tiles through ptxas without spills; and, on a GPU,
against float32 torch."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (AsyncCopyCommitGroup, AsyncCopyGlobalToShared, AsyncCopyMBarrierArrive,
                              AsyncCopyWaitGroup, Barrier, For, MBarrierArrive, MBarrierWait, WarpgroupMma,
                              WarpSpecialize)
from weft.runtime.emulator import emulate
from weft.runtime.emulator.errors import EmulationError

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(4044)
STRIDES = ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
HOST = {"fp16": np.float16, "bf16": None}


@tl.jit
def pointer_ws_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                      stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      STAGES: tl.constexpr):
    """c = a @ b (in c's element type), one tile per program, its K loop split into
    producer and consumers."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES, warp_specialize=True):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def signature(dtype: str = "fp16", c_dtype: str = "fp32") -> dict:
    return {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{c_dtype}", "M": "i32", "N": "i32", "K": "i32",
            **{name: "i32" for name in STRIDES}}


def constexprs(block, stages: int) -> dict:
    return dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages)


def prepared(block, stages: int, num_warps: int = 4, dtype: str = "fp16", c_dtype: str = "fp32"):
    tile = build_kernel(pointer_ws_matmul, signature(dtype, c_dtype), constexprs(block, stages), num_warps, {},
                        language="highlevel")
    return pipeline.prepare_for_emulator(tile)


def operands(m: int, n: int, k: int, dtype: str):
    """Random a [m, k] and b [k, n] as the kernel reads them, and their float64 values."""
    a64, b64 = RNG.standard_normal((m, k)), RNG.standard_normal((k, n))
    if dtype == "fp16":
        a, b = a64.astype(np.float16), b64.astype(np.float16)
        return a, b, a.astype(np.float64), b.astype(np.float64)
    # bf16: the top half of each float32 (the emulator reads the raw bits)
    a_bits = (a64.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b_bits = (b64.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    widen = lambda bits: (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    return a_bits, b_bits, widen(a_bits), widen(b_bits)


def run(kernel, block, m: int, n: int, k: int, dtype: str = "fp16") -> None:
    a, b, a64, b64 = operands(m, n, k, dtype)
    c = np.full((m, n), np.nan, np.float32)
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])), [a, b, c, m, n, k, k, 1, n, 1, n, 1])
    reference = a64 @ b64
    error = np.abs(c - reference)
    assert (error <= 1e-5 * (np.abs(a64) @ np.abs(b64)) + 1e-6).all(), f"largest error {error.max()}"


def split_of(kernel) -> WarpSpecialize:
    (split,) = [op for op in kernel.walk() if isinstance(op, WarpSpecialize)]
    return split


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_tails_in_m_n_and_k_match_numpy(stages, dtype):
    block = (64, 64, 32)
    run(prepared(block, stages, 4, dtype), block, 100, 90, 150, dtype)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_eight_warps_match_numpy(stages):
    block = (128, 64, 32)
    run(prepared(block, stages, 8), block, 130, 70, 72)


TILES = [(64, 64, 32), (64, 32, 64), (64, 128, 16)]


@settings(max_examples=200 if DEEP else 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(block=st.sampled_from(TILES), stages=st.integers(2, 4), num_warps=st.sampled_from([4, 8]),
       k_blocks=st.integers(0, 4), remainders=st.tuples(*(st.integers(0, 15) for _ in range(3))))
def test_pointer_ws_property(block, stages, num_warps, k_blocks, remainders):
    """Any tile, stage count, warp count and tails (K = 0 included): the emulator (races,
    deadlocks, partitions interleaved) agrees with numpy."""
    if num_warps == 8:
        block = (128,) + block[1:]  # 8 warps stack two warpgroups along M
    m, n = (max(1, b - r) for b, r in zip(block[:2], remainders))
    k = max(0, k_blocks * block[2] - remainders[2])
    run(prepared(block, stages, num_warps), block, m, n, k)


def test_the_producer_copies_and_arrives_and_the_consumers_only_wait_multiply_and_release():
    kernel = prepared((64, 64, 32), 3)
    split = split_of(kernel)
    (producer,) = split.workers
    assert split.worker_num_warps == (4,) and split.worker_num_regs[0] < split.default_num_regs
    producer_ops = list(producer.walk())
    assert sum(isinstance(op, AsyncCopyGlobalToShared) for op in producer_ops) == 2
    assert sum(isinstance(op, AsyncCopyMBarrierArrive) for op in producer_ops) == 1
    assert not any(isinstance(op, (AsyncCopyCommitGroup, AsyncCopyWaitGroup, WarpgroupMma, Barrier))
                   for op in producer_ops)
    (empty_wait,) = [op for op in producer_ops if isinstance(op, MBarrierWait)]
    assert empty_wait.barrier.hint.startswith("empty")
    default = list(split.default.walk())
    assert not any(isinstance(op, (AsyncCopyGlobalToShared, AsyncCopyWaitGroup)) for op in default)
    assert sum(isinstance(op, WarpgroupMma) for op in default) == 1
    (release,) = [op for op in default if isinstance(op, MBarrierArrive)]
    assert release.per_warp
    (consumer_loop,) = [op for op in split.default.ops if isinstance(op, For)]
    assert not any(isinstance(op, Barrier) for op in consumer_loop.body.walk())
    # The consumers carry no pointers: only the accumulator, the slot and the phase.
    assert len(consumer_loop.inits) == 3
    assert not split.results  # the epilogue (the store of C) runs in the consumer partition


def without(kernel, unwanted):
    def block(region):
        ops = [op.map_regions(block) for op in region.ops if not unwanted(op)]
        return type(region)(region.args, tuple(ops))
    return kernel.with_body(block(kernel.body))


def test_the_emulator_catches_a_producer_that_does_not_wait_for_the_release():
    block = (64, 64, 32)
    kernel = without(prepared(block, 2), lambda op: isinstance(op, MBarrierWait) and op.barrier.hint.startswith("empty"))
    with pytest.raises(EmulationError, match="shared-memory race|more arrivals than init|overran"):
        run(kernel, block, 64, 64, 320)


def test_the_emulator_catches_consumers_that_never_release():
    block = (64, 64, 32)
    kernel = without(prepared(block, 2), lambda op: isinstance(op, MBarrierArrive))
    with pytest.raises(EmulationError, match="deadlock"):
        run(kernel, block, 64, 64, 320)


def test_the_emulator_catches_consumers_that_do_not_wait_for_the_copies():
    block = (64, 64, 32)
    kernel = without(prepared(block, 3), lambda op: isinstance(op, MBarrierWait) and op.barrier.hint.startswith("bar"))
    with pytest.raises(EmulationError, match="race|in flight"):
        run(kernel, block, 64, 64, 320)


def test_a_split_whose_rings_and_epilogue_would_not_fit_warns_and_runs_as_one_partition():
    """128x256x64 in 3 stages takes 144 KB of rings; its fp32 accumulator staged for the
    store would take 128 KB more, which the split (rings live throughout) cannot reuse."""
    with pytest.warns(CompilationWarning, match="would not both fit"):
        kernel = prepared((128, 256, 64), 3, 8, c_dtype="fp32")
    assert not any(isinstance(op, WarpSpecialize) for op in kernel.walk())
    assert any(isinstance(op, WarpSpecialize) for op in prepared((128, 256, 64), 3, 8, c_dtype="fp16").walk())


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("block, num_warps, stages", [((128, 256, 64), 8, 3), ((128, 128, 64), 8, 4)])
def test_the_hopper_tiles_assemble_without_spills(block, num_warps, stages):
    specialization = {name: "divisible_by_16" for name in signature()}
    specialization.update(stride_ak="equal_to_1", stride_bn="equal_to_1", stride_cn="equal_to_1")
    # pointer_tma=False: these aligned tiles would otherwise be TMA boxes (stage_pointer_loads)
    compiled = pointer_ws_matmul.compile(signature=signature(c_dtype="fp16"), num_warps=num_warps,
                                         specialization=specialization, constexprs=constexprs(block, stages),
                                         pointer_tma=False)
    ptx = compiled.asm["ptx"]
    for instruction in ("cp.async.cg.shared.global", "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                        "setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32"):
        assert instruction in ptx, instruction
    assert "cp.async.wait_group" not in ptx
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 1088, 1040), (1000, 1064, 1000)], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("block, num_warps, stages", [((128, 256, 64), 8, 3), ((128, 128, 64), 8, 4),
                                                      ((64, 64, 32), 4, 2)])
def test_on_the_gpu_against_float32_torch(block, num_warps, stages, dtype, shape):
    """Tails in M, N and K; "aligned": rows a multiple of 16 elements (16-byte cp.async; TMA
    boxes unless pointer_tma=False, which keeps this test on the cp.async split),
    "unaligned": K and N rows that are not (narrower copies)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    host = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=host)
    b = torch.randn(k, n, device="cuda", dtype=host)
    c = torch.empty(m, n, device="cuda", dtype=host)  # as the tutorial: fp32 would not fit beside 128x256 rings
    grid = (-(-m // block[0]), -(-n // block[1]))
    pointer_ws_matmul[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                            c.stride(1), num_warps=num_warps, pointer_tma=False, **constexprs(block, stages))
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=1e-2)
