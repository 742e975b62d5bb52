"""TMA dot loops written `tl.range(..., warp_specialize=True)`, split into a one-warp
producer partition and the consumer warps (compiler/passes/pipeline_tma_warp_specialize.py):
run on the CPU emulator, whose partitions run interleaved and whose race and deadlock
checks see every TMA box in flight until its full-barrier wait, every wgmma read until its
wait and every slot until its empty-barrier release, against numpy float64: a hypothesis
property over tiles, stages, warps, tails and shuffled TMA completions; the race when the
producer does not wait for the release and the deadlock when the consumers never
release; the IR (a warp_specialize whose worker holds the TMA copies); the Hopper tiles
through ptxas without spills; and, on a GPU, against float32 torch."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (Barrier, For, MBarrierArrive, MBarrierWait, TmaAsyncCopyGlobalToShared,
                              TmaAsyncCopySharedToGlobal, WarpgroupMma, WarpSpecialize)
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator import emulate
from weft.runtime.emulator.errors import EmulationError

torch = pytest.importorskip("torch")  # host arrays

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(4043)


@tl.jit
def specialized_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """C = A @ B from host descriptors, the K loop split into producer and consumers."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=True):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def specialized_matmul_bt(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """C = A @ B.T with B stored [N, K]."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=True):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([n, k]).T, acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def signature(block, b_transposed: bool = False) -> dict:
    bm, bn, bk = block
    b_box = f"[{bn},{bk}]" if b_transposed else f"[{bk},{bn}]"
    return {"a_desc": f"tensordesc<fp16[{bm},{bk}]>", "b_desc": f"tensordesc<fp16{b_box}>",
            "c_desc": f"tensordesc<fp16[{bm},{bn}]>", "K": "i32"}


def prepared(block, stages: int, num_warps: int = 4, b_transposed: bool = False):
    constexprs = dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages)
    fn = specialized_matmul_bt if b_transposed else specialized_matmul
    kernel = build_kernel(fn, signature(block, b_transposed), constexprs, num_warps, {}, language="highlevel")
    return pipeline.prepare_for_emulator(kernel)


def random(rows: int, cols: int):
    """A random fp16 [rows, cols] view, rows padded to 16 elements (TMA strides)."""
    width = -(-max(cols, 1) // 16) * 16
    return torch.tensor(RNG.standard_normal((rows, width)), dtype=torch.float16)[:, :cols]


def described(tensor, box):
    if not tensor.numel():  # K = 0: the loop loads nothing; any descriptor of that box
        tensor = torch.zeros(tuple(box), dtype=tensor.dtype)
    return TensorDescriptor.from_tensor(tensor, list(box))


def run(kernel, block, m: int, n: int, k: int, b_transposed: bool = False):
    a = random(m, k)
    b = random(n, k) if b_transposed else random(k, n)
    c = torch.zeros((m, -(-n // 16) * 16), dtype=torch.float16)[:, :n]
    b_box = block[1:] if b_transposed else block[2:0:-1]
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])),
            (described(a, block[::2]), described(b, b_box), described(c, block[:2]), k))
    a64, b64 = a.double().numpy(), b.double().numpy()
    if b_transposed:
        b64 = b64.T
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    error = np.abs(c.double().numpy() - reference)
    assert (error <= 1e-5 * scale + 2 ** -10 * np.abs(reference) + 1e-6).all(), f"largest error {error.max()}"


def split_of(kernel) -> WarpSpecialize:
    (split,) = [op for op in kernel.walk() if isinstance(op, WarpSpecialize)]
    return split


TILES = [(64, 64, 32), (64, 128, 16), (64, 32, 64)]


@settings(max_examples=200 if DEEP else 5, deadline=None, suppress_health_check=list(HealthCheck))
@given(block=st.sampled_from(TILES), stages=st.integers(2, 4), num_warps=st.sampled_from([4, 8]),
       k_blocks=st.integers(0, 5), remainders=st.tuples(*(st.integers(0, 15) for _ in range(3))),
       shuffle=st.sampled_from([None, 5]), b_transposed=st.booleans())
def test_specialized_matmul_property(monkeypatch, block, stages, num_warps, k_blocks, remainders, shuffle,
                                     b_transposed):
    """Any tile, stage count, warp count, tails, TMA completion order and B layout: the
    emulator (races, deadlocks, partitions interleaved) agrees with numpy."""
    if num_warps == 8:
        block = (128,) + block[1:]  # 8 warps stack two warpgroups along M
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    kernel = prepared(block, stages, num_warps, b_transposed)
    m, n = (max(1, b - r) for b, r in zip(block[:2], remainders))
    k = max(0, k_blocks * block[2] - 16 * (remainders[2] % 2))
    run(kernel, block, m, n, k, b_transposed)


@pytest.mark.parametrize("stages", [2, 3])
def test_a_long_loop_matches_numpy(stages):
    block = (64, 64, 32)
    run(prepared(block, stages), block, 100, 72, 416)


def test_the_producer_issues_the_copies_and_the_consumers_only_wait_multiply_and_release():
    kernel = prepared((64, 64, 32), 3)
    split = split_of(kernel)
    producer = split.workers[0]
    assert split.worker_num_warps[0] == 1 and sum(split.worker_num_warps) == 4  # one warpgroup
    assert split.worker_num_regs[0] < split.default_num_regs
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in producer.walk()) == 2
    assert not any(isinstance(op, WarpgroupMma) for op in producer.walk())
    (empty_wait,) = [op for op in producer.walk() if isinstance(op, MBarrierWait)]
    default = list(split.default.walk())
    assert not any(isinstance(op, TmaAsyncCopyGlobalToShared) for op in default)
    assert sum(isinstance(op, WarpgroupMma) for op in default) == 1
    (release,) = [op for op in default if isinstance(op, MBarrierArrive)]
    assert release.per_warp
    # Nothing is issued outside the partitions, and neither partition syncs its warps per step.
    outside = [op for op in kernel.body.ops if isinstance(op, TmaAsyncCopyGlobalToShared)]
    assert not outside
    (consumer_loop,) = [op for op in split.default.ops if isinstance(op, For)]
    assert not any(isinstance(op, Barrier) for op in consumer_loop.body.walk())
    assert not any(isinstance(op, Barrier) for op in producer.walk())
    # The epilogue (the TMA store of C) runs in the consumer partition, which returns nothing.
    assert not split.results
    assert any(isinstance(op, TmaAsyncCopySharedToGlobal) for op in split.default.ops)


def without(kernel, unwanted):
    """`kernel` with the ops `unwanted(op)` picks dropped, wherever they are."""
    def block(region):
        ops = [op.map_regions(block) for op in region.ops if not unwanted(op)]
        return type(region)(region.args, tuple(ops))
    return kernel.with_body(block(kernel.body))


def test_the_emulator_catches_a_producer_that_does_not_wait_for_the_release():
    """Unchecked, the producer laps the ring: it arms a slot's full barrier again before
    the consumers took the last round (or overwrites a box they read: a race)."""
    block = (64, 64, 32)
    kernel = without(prepared(block, 2), lambda op: isinstance(op, MBarrierWait) and op.barrier.hint.startswith("empty"))
    with pytest.raises(EmulationError, match="shared-memory race|more arrivals than init"):
        run(kernel, block, 64, 64, 320)


def test_the_emulator_catches_consumers_that_never_release():
    block = (64, 64, 32)
    kernel = without(prepared(block, 2), lambda op: isinstance(op, MBarrierArrive))
    with pytest.raises(EmulationError, match="deadlock"):
        run(kernel, block, 64, 64, 320)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("block, num_warps, stages", [((128, 256, 64), 8, 3), ((128, 128, 64), 4, 4)])
def test_the_hopper_tiles_assemble_without_spills(block, num_warps, stages):
    compiled = specialized_matmul.compile(signature=signature(block), num_warps=num_warps,
                                          constexprs=dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2],
                                                          STAGES=stages))
    ptx = compiled.asm["ptx"]
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global", "setmaxnreg.dec.sync.aligned.u32 40",
                        "setmaxnreg.inc.sync.aligned.u32", "wgmma.wait_group.sync.aligned 1"):
        assert instruction in ptx, instruction
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert not compiled.metadata["performance_warnings"], compiled.metadata["performance_warnings"]


@pytest.mark.gpu
@pytest.mark.parametrize("block, num_warps, stages", [((128, 256, 64), 8, 3), ((128, 128, 64), 4, 4),
                                                      ((64, 64, 32), 4, 2)])
def test_on_the_gpu_against_float32_torch(block, num_warps, stages):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    m, n, k = 1000, 1064, 1000  # tails in M, N and K
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[2:0:-1]),
                                                                       (c, block[:2]))]
    grid = (-(-m // block[0]), -(-n // block[1]))
    specialized_matmul[grid](*descs, k, BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages,
                             num_warps=num_warps)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=1e-2)
