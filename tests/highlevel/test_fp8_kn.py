"""fp8 dots whose B is a [K, N] TMA box (`b_desc.load([k, n])`, B stored [K, N]): wgmma
reads 8-bit B K-major only, so each iteration copies the ring slot's box through
registers into a K-major buffer the wgmma reads (accelerate_dots), and the loop is
pipelined with TMA rings (pipeline_tma_loops' staged operands). Run on the CPU emulator,
whose race checks see every box in flight until its mbarrier wait and every wgmma operand
read until its wait, against numpy float64 of the same fp8 values, with tails in M, N and
K and 2-4 stages (and a tf32 box, which wgmma reads K-major only too); the race the
emulator reports were both iterations to store into one buffer; the loop's IR; ptxas
without spills at the tutorial's tiles; on a GPU, against float32 torch."""

import re
import warnings

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (For, MBarrierWait, SharedIndex, SharedLoad, SharedStore, TmaAsyncCopyGlobalToShared,
                              WarpgroupMma, WarpgroupMmaWait)
from weft.compiler.passes import pipeline_tma_loops
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator import emulate
from weft.runtime.emulator.dtypes import from_fp8, to_fp8
from weft.runtime.emulator.errors import EmulationError

torch = pytest.importorskip("torch")  # fp8 host arrays

RNG = np.random.default_rng(4046)
FP8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}


@tl.jit
def kn_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              STAGES: tl.constexpr):
    """C = A @ B with B stored [K, N], read as [BLOCK_K, BLOCK_N] boxes."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def fp8_array(rows: int, cols: int, dtype: str, pad: int = 16):
    """Random fp8 [rows, cols] (rows padded to `pad` bytes, TMA strides) and its float64 values."""
    width = -(-max(cols, 1) // pad) * pad
    bits = to_fp8(RNG.standard_normal((rows, width)), dtype)
    values = from_fp8(bits, dtype).astype(np.float64)[:, :cols]
    return torch.from_numpy(bits).view(FP8[dtype])[:, :cols], values


def signature(dtype: str, block) -> dict:
    bm, bn, bk = block
    return {"a_desc": f"tensordesc<{dtype}[{bm},{bk}]>", "b_desc": f"tensordesc<{dtype}[{bk},{bn}]>",
            "c_desc": f"tensordesc<fp16[{bm},{bn}]>", "K": "i32"}


def constexprs(block, stages: int) -> dict:
    return dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages)


def prepared(dtype: str, block, stages: int, num_warps: int):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)  # the [K, N] box no longer warns
        return pipeline.prepare_for_emulator(build_kernel(kn_matmul, signature(dtype, block), constexprs(block, stages),
                                                          num_warps, {}, language="highlevel"))


def the_loop(kernel) -> For:
    return next(op for op in kernel.body.ops if isinstance(op, For))


@pytest.mark.parametrize("dtype, stages, num_warps", [("fp8e4m3", 2, 4), ("fp8e5m2", 3, 4), ("fp8e4m3", 4, 8)])
def test_matches_numpy_with_tails(dtype, stages, num_warps):
    run_and_check(dtype, stages, num_warps)


def test_a_tf32_box_k_by_n_is_ringed_and_transposed_too():
    """fp32 inputs (tf32 products): wgmma reads 32-bit B K-major only as well."""
    block, m, n, k = (64, 64, 32), 80, 72, 100
    a = torch.from_numpy(RNG.standard_normal((m, 104)).astype(np.float32))[:, :k]
    b = torch.from_numpy(RNG.standard_normal((k, n)).astype(np.float32))
    c = torch.zeros((m, n))
    sig = {"a_desc": "tensordesc<fp32[64,32]>", "b_desc": "tensordesc<fp32[32,64]>",
           "c_desc": "tensordesc<fp32[64,64]>", "K": "i32"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        kernel = pipeline.prepare_for_emulator(build_kernel(kn_matmul, sig, constexprs(block, 3), 4, {},
                                                            language="highlevel"))
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in the_loop(kernel).body.ops) == 2  # ringed
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[2:0:-1]),
                                                                       (c, block[:2]))]
    emulate(kernel, (2, 2), (*descs, k))
    a64, b64 = a.double().numpy(), b.double().numpy()
    error = np.abs(c.double().numpy() - a64 @ b64)
    assert (error <= 2 ** -10 * (np.abs(a64) @ np.abs(b64)) + 1e-6).all(), f"largest error {error.max()}"


def test_one_buffer_for_both_iterations_is_a_race_the_emulator_reports(monkeypatch):
    """What the two halves prevent: with the wgmma left in flight, the next iteration's
    store would overwrite the buffer it reads."""
    def first_half_only(self, out, iv, views):
        for buffer, halves in self.transposed.items():
            views[buffer] = out.emit(SharedIndex, buffer.type, buffer.hint, buffer=halves, index=out.int(0))

    monkeypatch.setattr(pipeline_tma_loops.TmaLoopPipeliner, "alternate", first_half_only)
    with pytest.raises(EmulationError, match="wgmma"):
        run_and_check("fp8e5m2", 3, 4)


def run_and_check(dtype: str, stages: int, num_warps: int):
    block = (64 * num_warps // 4, 64, 64)
    m, n, k = block[0] + 22, 100, 200  # tails in M, N and K (TMA fills them with zeros)
    (a, a64), (b, b64) = fp8_array(m, k, dtype), fp8_array(k, n, dtype)
    c = torch.zeros((m, 112), dtype=torch.float16)[:, :n]
    kernel = prepared(dtype, block, stages, num_warps)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[2:0:-1]),
                                                                       (c, block[:2]))]
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])), (*descs, k))
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    error = np.abs(c.double().numpy() - reference)
    assert (error <= 1e-5 * scale + 2 ** -10 * np.abs(reference) + 1e-6).all(), f"largest error {error.max()}"


def test_the_loop_rings_both_boxes_and_transposes_the_slot():
    """Both boxes arrive by TMA into 3-slot rings; the body waits on the slot, reads B's
    slot in 4 x 4 blocks, renames the registers, stores into this iteration's half of two
    K-major buffers, which the wgmma reads, leaves that wgmma in flight (wait(1) retires the
    previous one, which read the other half) and refills the previous iteration's slot."""
    kernel = prepared("fp8e4m3", (64, 64, 64), 3, 4)
    loop = the_loop(kernel)
    kinds = [type(op).__name__ for op in loop.body.ops if type(op).__name__ not in
             ("Constant", "Binary", "Compare", "Cast", "SharedIndex")]
    assert kinds == ["MBarrierWait", "SharedLoad", "ConvertLayout",
                     "Barrier", "SharedStore", "FenceAsyncShared", "Barrier", "WarpgroupMma", "WarpgroupMmaWait",
                     "MBarrierArrive", "MBarrierWait", "MBarrierExpect", "TmaAsyncCopyGlobalToShared",
                     "TmaAsyncCopyGlobalToShared", "Yield"]
    assert next(op for op in loop.body.ops if isinstance(op, WarpgroupMmaWait)).pending == 1
    defined = {value: op for op in loop.body.ops for value in op.defines()}
    copies = [op for op in loop.body.ops if isinstance(op, TmaAsyncCopyGlobalToShared)]
    assert all(op.buffer.type.shape == (64, 64) for op in copies)
    read = next(op for op in loop.body.ops if isinstance(op, SharedLoad))
    store = next(op for op in loop.body.ops if isinstance(op, SharedStore))
    wgmma = next(op for op in loop.body.ops if isinstance(op, WarpgroupMma))
    assert wgmma.b is store.buffer and read.buffer.type.shape == (64, 64)
    assert defined[store.buffer].buffer.type.shape == (2, 64, 64)  # two halves, alternate iterations
    assert read.result.type.layout.bases["register"][:4] == ((0, 1), (0, 2), (1, 0), (2, 0))  # along N, then K
    assert store.value.type.layout.bases["register"][:4] == ((1, 0), (2, 0), (0, 1), (0, 2))  # along K, then N
    assert sum(isinstance(op, MBarrierWait) for op in loop.body.ops) == 2  # full, and the elected empty wait


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("block", [(128, 128, 128), (128, 256, 128)])
def test_fp8_wgmmas_with_32_bit_transposes_and_no_spills(block):
    """8 warps, 3 stages: k32 fp8 wgmmas; B's box read and written in 32-bit words (no
    byte stores, no shared round trip for the register renaming); nothing spilled."""
    compiled = kn_matmul.compile(signature=signature("fp8e4m3", block), num_warps=8, constexprs=constexprs(block, 3))
    ptx = compiled.asm["ptx"]
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+)\.f32\.e4m3\.e4m3", ptx)) == \
        {f"m64n{block[1]}k32"}
    accesses = set(re.findall(r"(?:ld|st)\.shared(?:\.v\d)?\.b\d+", ptx))
    assert accesses == {"ld.shared.b32", "st.shared.b32"}, accesses
    assert ptx.count("cp.async.bulk.tensor") >= 2  # the boxes by TMA, in the prologue and the loop
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp8e4m3", "fp8e5m2"])
@pytest.mark.parametrize("block, num_warps, stages", [((128, 256, 128), 8, 3), ((128, 128, 128), 8, 4),
                                                      ((64, 64, 64), 4, 2)])
def test_on_the_gpu_against_float32_torch(dtype, block, num_warps, stages):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    m, n, k = 1000, 1056, 1008  # tails in M, N and K; rows of 16-byte multiples, as TMA needs
    a = (torch.randn(m, k, device="cuda") * 0.5).to(FP8[dtype])
    b = (torch.randn(k, n, device="cuda") * 0.5).to(FP8[dtype])
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[2:0:-1]),
                                                                       (c, block[:2]))]
    kn_matmul[(-(-m // block[0]), -(-n // block[1]))](*descs, k, **constexprs(block, stages), num_warps=num_warps)
    torch.cuda.synchronize()
    exact = a.double() @ b.double()
    # Hopper's fp8 wgmma keeps fewer mantissa bits than fp32 in its sums (test_dot_gpu.py)
    bound = 2.0 ** -10 * (a.double().abs() @ b.double().abs()) + 2 ** -10 * exact.abs() + 1e-6
    assert ((c.double() - exact).abs() <= bound).all()
