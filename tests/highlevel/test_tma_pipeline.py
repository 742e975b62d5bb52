"""Dot loops whose operands are `desc.load`s, pipelined with `num_stages` into rings that
TMA fills (compiler/passes/pipeline_tma_loops.py, part of pipeline_dot_loops; the loops say
warp_specialize=False, keeping one partition; the split is test_warp_specialize_tma.py): run on the
CPU emulator, whose race checks see every TMA box in flight until its mbarrier wait and
every wgmma operand read until its wait, and whose deadlock check sees a phase never
completed, against numpy float64: 2-4 stages, K loops shorter than the prologue, tails,
fp16 / bf16 / fp8, host and in-kernel descriptors, TMA completions in shuffled orders; a
hypothesis property over tiles, stages, warps and tails; the races the emulator reports
when the ring refills the slot being read, waits on the wrong phase or refills without
waiting for the slot's empty barrier (and the deadlock when that wait's phase is wrong);
the loop's IR, with no CTA barrier in it; and the Hopper tiles through ptxas without
spills."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (Barrier, For, MBarrierArrive, MBarrierWait, SharedLoad, SharedPermute, SharedStore,
                              TmaAsyncCopyGlobalToShared, WarpgroupMma, WarpgroupMmaWait)
from weft.compiler.ir import Binary
from weft.compiler.passes import pipeline_tma_loops
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator.errors import EmulationError
from weft.runtime.emulator import emulate

torch = pytest.importorskip("torch")  # bf16 and fp8 host arrays

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(4042)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8e4m3": torch.float8_e4m3fn}


@tl.jit
def ringed_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """C = A @ B from host descriptors, the K loop over STAGES stages."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=False):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def made_ringed_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The same from in-kernel descriptors, the loop over K blocks (offsets = k * BLOCK_K)."""
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES, warp_specialize=False):
        acc = tl.dot(a_desc.load([m, k * BLOCK_K]), b_desc.load([k * BLOCK_K, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def ringed_matmul_bt(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """C = A @ B.T with B stored [N, K] (tutorial 09's descriptor kernels)."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=False):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([n, k]).T, acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def random(rows: int, cols: int, dtype: str, multiple: int = 16):
    """A random [rows, cols] view with rows padded to `multiple` elements (TMA strides)."""
    width = -(-cols // multiple) * multiple
    full = torch.tensor(RNG.standard_normal((rows, width)), dtype=torch.float32).to(TORCH_TYPES[dtype])
    return full[:, :cols]


def check_product(out, a, b):
    a64, b64 = a.double().numpy(), b.double().numpy()
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    rounding = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[out.dtype]
    error = np.abs(out.double().numpy() - reference)
    assert (error <= 1e-5 * scale + rounding * np.abs(reference) + 1e-6).all(), f"largest error {error.max()}"


def signature(dtype: str, block, out: str = "fp16") -> dict:
    bm, bn, bk = block
    return {"a_desc": f"tensordesc<{dtype}[{bm},{bk}]>", "b_desc": f"tensordesc<{dtype}[{bk},{bn}]>",
            "c_desc": f"tensordesc<{out}[{bm},{bn}]>", "K": "i32"}


def prepared(block, stages: int, num_warps: int = 4, dtype: str = "fp16", b_transposed: bool = False):
    """ringed_matmul (or ringed_matmul_bt) at the `layout` stage the emulator runs."""
    constexprs = dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages)
    out = "bf16" if dtype == "bf16" else "fp16"
    sig = signature(dtype, block, out)
    if b_transposed:
        sig["b_desc"] = f"tensordesc<{dtype}[{block[1]},{block[2]}]>"
    kernel = build_kernel(ringed_matmul_bt if b_transposed else ringed_matmul, sig, constexprs, num_warps, {},
                          language="highlevel")
    return pipeline.prepare_for_emulator(kernel)


def run(kernel, block, m: int, n: int, k: int, dtype: str):
    a, b = random(m, k or 1, dtype)[:, :k], random(k, n, dtype)
    out_type = torch.bfloat16 if dtype == "bf16" else torch.float16
    c = torch.zeros((m, -(-n // 16) * 16), dtype=out_type)[:, :n]
    descs = (described(a, block[::2]), described(b, block[2:0:-1]), described(c, block[:2]))
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])), (*descs, k))
    check_product(c, a, b)


def described(tensor, box):
    """The tensor's descriptor; for an empty one (K = 0: the loop loads nothing) any of that box."""
    if not tensor.numel():
        tensor = torch.zeros(tuple(box), dtype=tensor.dtype)
    return TensorDescriptor.from_tensor(tensor, list(box))


def loop_of(kernel) -> For:
    (loop,) = [op for op in kernel.walk() if isinstance(op, For) and
               any(isinstance(inner, WarpgroupMma) for inner in op.body.walk())]
    return loop


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("dtype, m, n, k", [("fp16", 100, 72, 176), ("bf16", 64, 64, 32), ("fp16", 70, 40, 16)])
def test_ringed_matmul_matches_numpy(stages, dtype, m, n, k):
    block = (64, 64, 32)
    run(prepared(block, stages, dtype=dtype), block, m, n, k, dtype)


@pytest.mark.parametrize("k", [0, 32, 64])  # no iteration; fewer than the prologue loads
def test_short_loops_load_only_what_exists(k):
    block = (64, 64, 32)
    run(prepared(block, 4), block, 64, 64, k, "fp16")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_shuffled_tma_completions_still_match(monkeypatch, seed):
    monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(seed))
    block = (64, 64, 32)
    run(prepared(block, 3), block, 96, 80, 224, "fp16")


def test_fp8_operands_and_two_warpgroups():
    block = (128, 64, 64)
    kernel = prepared(block, 3, num_warps=8, dtype="fp8e4m3")
    a, b = random(130, 200, "fp8e4m3"), random(200, 64, "fp8e4m3")
    c = torch.zeros((130, 64), dtype=torch.float16)
    emulate(kernel, (2, 1), (TensorDescriptor.from_tensor(a, [128, 64]), TensorDescriptor.from_tensor(b, [64, 64]),
                             TensorDescriptor.from_tensor(c, [128, 64]), 200))
    check_product(c, a, b)


def test_in_kernel_descriptors_are_ringed_too():
    m, n, k = 100, 72, 176
    a, b = random(m, k, "fp16"), random(k, n, "fp16")
    c = torch.zeros((m, n), dtype=torch.float16)
    made_ringed_matmul[(2, 2)](a.contiguous(), b.contiguous(), c, m, n, k, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32,
                               STAGES=3)
    check_product(c, a, b)


TILES = [(64, 64, 32), (128, 64, 64), (64, 128, 16), (64, 32, 64)]


@settings(max_examples=200 if DEEP else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(block=st.sampled_from(TILES), stages=st.integers(2, 4), num_warps=st.sampled_from([4, 8]),
       k_blocks=st.integers(0, 5), remainders=st.tuples(*(st.integers(0, 15) for _ in range(3))),
       shuffle=st.sampled_from([None, 7]), b_transposed=st.booleans())
def test_ringed_matmul_property(monkeypatch, block, stages, num_warps, k_blocks, remainders, shuffle, b_transposed):
    """Any tile, stage count, warp count, tails, TMA completion order and B stored [K, N]
    or [N, K]: the emulator (races, deadlocks) agrees with numpy."""
    if num_warps == 8:
        block = (128,) + block[1:]  # 8 warps stack two warpgroups along M
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    kernel = prepared(block, stages, num_warps, b_transposed=b_transposed)
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in kernel.walk()) == 2 * stages
    m, n = (max(1, b - r) for b, r in zip(block[:2], remainders))
    k = max(0, k_blocks * block[2] - 16 * (remainders[2] % 2))
    if not b_transposed:
        run(kernel, block, m, n, k, "fp16")
        return
    a, b = random(m, k or 1, "fp16")[:, :k], random(n, k or 1, "fp16")[:, :k]
    c = torch.zeros((m, -(-n // 16) * 16), dtype=torch.float16)[:, :n]
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])),
            (described(a, block[::2]), described(b, block[1:]), described(c, block[:2]), k))
    check_product(c, a, b.T)


def test_the_loop_waits_on_its_slot_and_keeps_one_wgmma_in_flight():
    loop = loop_of(prepared((64, 64, 32), 3))
    body = loop.body.ops
    kinds = [type(op).__name__ for op in body if isinstance(op, (MBarrierWait, MBarrierArrive, WarpgroupMma,
                                                                 WarpgroupMmaWait, TmaAsyncCopyGlobalToShared,
                                                                 SharedLoad))]
    assert kinds == ["MBarrierWait", "WarpgroupMma", "WarpgroupMmaWait", "MBarrierArrive", "MBarrierWait",
                     "TmaAsyncCopyGlobalToShared", "TmaAsyncCopyGlobalToShared"]
    (wait,) = [op for op in body if isinstance(op, WarpgroupMmaWait)]
    assert wait.pending == 1
    full, empty = [op for op in body if isinstance(op, MBarrierWait)]
    (arrive,) = [op for op in body if isinstance(op, MBarrierArrive)]
    assert not full.elected and empty.elected and arrive.per_warp and arrive.barrier is not full.barrier
    # The boxes need no CTA barrier to be seen, and the refill none for the other warps'
    # wgmma reads: they release the slot on its empty barrier, which the issuer waits on.
    assert not any(isinstance(op, Barrier) for op in loop.body.walk())


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("block, num_warps, stages", [((128, 256, 64), 8, 3), ((128, 128, 64), 4, 4)])
def test_the_hopper_tiles_assemble_without_spills(block, num_warps, stages):
    compiled = ringed_matmul.compile(signature=signature("fp16", block), num_warps=num_warps,
                                     constexprs=dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2],
                                                     STAGES=stages))
    ptx = compiled.asm["ptx"]
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global", "mbarrier.try_wait.parity",
                        "wgmma.wait_group.sync.aligned 1"):
        assert instruction in ptx, instruction
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert not compiled.metadata["performance_warnings"], compiled.metadata["performance_warnings"]


@pytest.mark.parametrize("dtype", ["fp16", "fp8e4m3"])
def test_a_transposed_box_is_read_through_a_permuted_view_of_the_ring(dtype):
    m, n, k = 100, 80, 200
    constexprs = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, STAGES=3)
    sig = {"a_desc": f"tensordesc<{dtype}[64,64]>", "b_desc": f"tensordesc<{dtype}[64,64]>",
           "c_desc": "tensordesc<fp16[64,64]>", "K": "i32"}
    kernel = pipeline.prepare_for_emulator(build_kernel(ringed_matmul_bt, sig, constexprs, 4, {}, language="highlevel"))
    body = loop_of(kernel).body.ops
    (mma,) = [op for op in body if isinstance(op, WarpgroupMma)]
    permuted = {op.result for op in body if isinstance(op, SharedPermute)}
    assert mma.b in permuted and not any(isinstance(op, SharedStore) for op in body)
    a, b = random(m, k, dtype), random(n, k, dtype)
    c = torch.zeros((m, n), dtype=torch.float16)
    emulate(kernel, (2, 2), (described(a, [64, 64]), described(b, [64, 64]), described(c, [64, 64]), k))
    check_product(c, a, b.T)


@pytest.mark.parametrize("wrong", ["slot read now", "phase never flips", "release phase never flips"])
def test_the_emulator_catches_a_ring_that_refills_or_waits_wrongly(monkeypatch, wrong):
    if wrong == "slot read now":  # the refill lands in the slot this iteration's wgmma still reads
        monkeypatch.setattr(pipeline_tma_loops.TmaLoopPipeliner, "refill_slot", lambda self, out, slot: slot)
    elif wrong == "release phase never flips":  # the first refill waits for a release that never comes
        monkeypatch.setattr(pipeline_tma_loops, "Binary", lambda **fields: Binary(**{
            **fields, "kind": "and" if fields["result"].hint == "released" else fields["kind"]}))
        block = (64, 64, 32)
        with pytest.raises(EmulationError, match="deadlock"):
            run(prepared(block, 3), block, 64, 64, 256, "fp16")
        return
    else:  # every wait is for phase 0: the second round of a slot passes before its box landed
        monkeypatch.setattr(pipeline_tma_loops, "Binary", lambda **fields: Binary(**{
            **fields, "kind": "and" if fields["result"].hint == "phase" else fields["kind"]}))
    block = (64, 64, 32)
    with pytest.raises(EmulationError, match="shared-memory race"):
        run(prepared(block, 3), block, 64, 64, 256, "fp16")


@tl.jit
def mixed_matmul(a_desc, b_ptr, c_ptr, K, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr):
    """A from a descriptor, B through pointers: B gets the cp.async ring, A's box is loaded each step."""
    m = tl.program_id(0) * BLOCK_M
    offs_k, offs_n = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_N)
    b_ptrs = b_ptr + offs_k[:, None] * N + offs_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=False):
        acc = tl.dot(a_desc.load([m, k]), tl.load(b_ptrs), acc)
        b_ptrs += BLOCK_K * N
    tl.store(c_ptr + (m + tl.arange(0, BLOCK_M))[:, None] * BLOCK_N + offs_n[None, :], acc.to(tl.float16))


def test_a_box_loaded_each_step_keeps_the_cp_async_ring_from_leaving_its_wgmma_in_flight():
    m, n, k = 128, 64, 256
    a, b = random(m, k, "fp16"), random(k, n, "fp16").contiguous()
    c = torch.zeros((m, n), dtype=torch.float16)
    mixed_matmul[(2,)](described(a, [64, 32]), b, c, k, n, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, STAGES=3)
    check_product(c, a, b)


def without_elected_waits(block):
    """`block` with every elected mbarrier wait (the refill's wait for the slot's release) dropped."""
    ops = [op.map_regions(without_elected_waits) for op in block.ops
           if not (isinstance(op, MBarrierWait) and op.elected)]
    return type(block)(block.args, tuple(ops))


@pytest.mark.parametrize("num_warps", [4, 8])
def test_the_emulator_catches_a_refill_that_does_not_wait_for_the_slot_release(num_warps):
    """The refill overwrites the slot the previous iteration's wgmma read; the arrive alone
    orders nothing: without the issuer's wait on the empty barrier, and with no CTA barrier
    in the loop, other warps' reads race with the TMA write."""
    block = (64 * (num_warps // 4), 64, 32)
    kernel = prepared(block, 3, num_warps)
    kernel = kernel.with_body(without_elected_waits(kernel.body))
    with pytest.raises(EmulationError, match="shared-memory race"):
        run(kernel, block, block[0], 64, 256, "fp16")
