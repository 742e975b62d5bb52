"""Backend code quality: what the PTX of small kernels holds, and the GPU values behind it.

- A wgmma whose accumulator is known to start at 0 (use_acc the constant false, or an
  accumulator that is the constant +0.0) takes undef registers and scale-d 0: no zeros
  are moved into place, and the other wgmma keep scale-d 1 and their real inputs.
- fp32 -> bf16/fp16 casts of tensors are one packed `cvt.rn.{bf16x2,f16x2}.f32` per
  register pair; on the GPU (marked `gpu`) the bits match numpy's round-to-nearest-even,
  infinities, NaNs, denormals and ties included.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas

from .global_tiles import load_tile, store_tile

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")

ACC = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 16])
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
A_SMEM = ll.NVMMASharedLayout.get_default_for([64, 64], 16)


# ------------------------------------------------------------------ zero accumulators
@ll.jit
def twice_product(a_ptr, b_ptr, c_ptr, out_ptr, BY_USE_ACC: ll.constexpr):
    """out = A B + (A B + C): the first wgmma starts from 0 (by use_acc=False, or by a
    zeros accumulator with use_acc=True), the second accumulates onto its result + C."""
    a = ll.allocate_shared_memory(ll.bfloat16, [64, 64], A_SMEM, load_tile(a_ptr, 64, 64, BLOCKED))
    b = ll.allocate_shared_memory(ll.bfloat16, [64, 64], A_SMEM, load_tile(b_ptr, 64, 64, BLOCKED))
    ll.fence_async_shared()
    ll.barrier()
    if BY_USE_ACC:
        s = ll.warpgroup_mma(a, b, ll.full([64, 64], 5.0, ll.float32, ACC), use_acc=False)
    else:
        s = ll.warpgroup_mma(a, b, ll.zeros([64, 64], ll.float32, ACC))
    c = ll.convert_layout(load_tile(c_ptr, 64, 64, BLOCKED), ACC)
    out = ll.warpgroup_mma(a, b, s + c)
    store_tile(out_ptr, out, 64, 64, BLOCKED)


@ll.jit
def dynamic_use_acc(a_ptr, b_ptr, c_ptr, out_ptr, flag):
    a = ll.allocate_shared_memory(ll.bfloat16, [64, 64], A_SMEM, load_tile(a_ptr, 64, 64, BLOCKED))
    b = ll.allocate_shared_memory(ll.bfloat16, [64, 64], A_SMEM, load_tile(b_ptr, 64, 64, BLOCKED))
    ll.fence_async_shared()
    ll.barrier()
    c = ll.convert_layout(load_tile(c_ptr, 64, 64, BLOCKED), ACC)
    out = ll.warpgroup_mma(a, b, c, use_acc=flag != 0)
    store_tile(out_ptr, out, 64, 64, BLOCKED)


SIGNATURE = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32", "out_ptr": "*fp32"}
# The asm text holds newlines; its arguments follow the constraint string.
MMA_CALL = re.compile(r'asm sideeffect "[^"]*wgmma\.mma_async[^"]*", "[^"]*"\(([^)]*)\)')


def _mma_calls(llir: str) -> list[tuple[int, str]]:
    """Per wgmma.mma_async call in the LLVM IR: how many undef accumulators it takes, and
    its scale-d operand (the last one)."""
    calls = MMA_CALL.findall(llir)
    return [(args.count("float undef"), args.rsplit(", ", 1)[1]) for args in calls]


@needs_ptxas
@pytest.mark.parametrize("by_use_acc", [True, False], ids=["use_acc_false", "zeros"])
def test_a_zero_start_moves_no_zeros(by_use_acc):
    compiled = twice_product.compile(signature=SIGNATURE, constexprs={"BY_USE_ACC": by_use_acc}, num_warps=4)
    # Undef inputs exactly where scale-d is the constant 0: the first K step of the first
    # product. Every other step reads its accumulator (scale-d 1).
    calls = _mma_calls(compiled.asm["llir"])
    assert calls == [(32, "i32 0")] + [(0, "i32 1")] * 7, calls
    # No register is set to 0.0 (or 5.0) for the first product.
    assert not re.search(r"mov\.b32\s+%r\d+, 0f(00000000|40A00000);", compiled.asm["ptx"])


@needs_ptxas
def test_a_dynamic_use_acc_keeps_its_accumulator():
    compiled = dynamic_use_acc.compile(signature={**SIGNATURE, "flag": "i32"}, num_warps=4)
    calls = _mma_calls(compiled.asm["llir"])
    assert len(calls) == 4 and all(undef == 0 for undef, _ in calls), calls
    assert calls[0][1].startswith("i32 %") and [scale for _, scale in calls[1:]] == ["i32 1"] * 3, calls


@pytest.mark.gpu
@pytest.mark.parametrize("by_use_acc", [True, False], ids=["use_acc_false", "zeros"])
def test_a_zero_start_computes_the_product(by_use_acc):
    torch = pytest.importorskip("torch")
    generator = torch.Generator(device="cuda").manual_seed(3)
    a, b = (torch.randn(64, 64, device="cuda", generator=generator).to(torch.bfloat16) for _ in range(2))
    c = torch.randn(64, 64, device="cuda", generator=generator)
    out = torch.full((64, 64), float("nan"), device="cuda")
    twice_product[(1,)](a, b, c, out, BY_USE_ACC=by_use_acc, num_warps=4)
    torch.cuda.synchronize()
    reference = 2 * (a.double() @ b.double()) + c.double()
    error = float((out.double() - reference).norm() / reference.norm())
    assert error < 1e-5, error


# ------------------------------------------------------------------------ packed casts
@ll.jit
def cast_tile(x_ptr, y_ptr, TARGET: ll.constexpr, LAYOUT: ll.constexpr):
    x = ll.convert_layout(load_tile(x_ptr, 64, 64, BLOCKED), LAYOUT)
    store_tile(y_ptr, x.to(TARGET), 64, 64, BLOCKED)


CAST_LAYOUTS = {"nvmma": ACC, "blocked": BLOCKED}
PTX_NAMES = {"bf16": "bf16x2", "fp16": "f16x2"}


def _cast(target: str, layout: str):
    return cast_tile.compile(signature={"x_ptr": "*fp32", "y_ptr": f"*{target}"},
                             constexprs={"TARGET": getattr(ll, {"bf16": "bfloat16", "fp16": "float16"}[target]),
                                         "LAYOUT": CAST_LAYOUTS[layout]}, num_warps=4)


@needs_ptxas
@pytest.mark.parametrize("layout", sorted(CAST_LAYOUTS))
@pytest.mark.parametrize("target", ["bf16", "fp16"])
def test_casts_to_16_bits_are_packed_pairs(target, layout):
    ptx = _cast(target, layout).asm["ptx"]
    packed = re.findall(rf"cvt\.rn\.{PTX_NAMES[target]}\.f32\s+%r\d+, %r\d+, %r\d+;", ptx)
    assert len(packed) == 64 * 64 // 128 // 2  # 32 fp32 registers per thread, two per cvt
    assert not re.search(r"cvt\.rn\.(bf16|f16)\.f32", ptx)


def _specials() -> np.ndarray:
    """Random fp32 bits plus every class round-to-nearest-even must get right."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, 64 * 64, dtype=np.uint64).astype(np.uint32)
    special = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
               0x00000001, 0x807FFFFF, 0x00400000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF,
               0x7F7FFFFF, 0xFF7FFFFF, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x387FE000,
               0x38800000, 0x3F801000, 0x3F803000, 0x3F802FFF]
    bits[:len(special)] = special
    # ties for bf16 (low 16 bits 0x8000) and fp16 (low 13 bits 0x1000), both parities
    bits[100:400] = (bits[100:400] & 0xFFFF0000) | 0x8000
    bits[400:700] = (bits[400:700] & 0xFFFFE000) | 0x1000
    return bits.view(np.float32).reshape(64, 64)


def _bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), rounded)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(CAST_LAYOUTS))
@pytest.mark.parametrize("target", ["bf16", "fp16"])
def test_packed_casts_round_to_nearest_even_bitwise(target, layout):
    torch = pytest.importorskip("torch")
    x = _specials()
    y = torch.zeros(64, 64, dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[target]), device="cuda")
    with np.errstate(over="ignore"):
        expected = _bf16_rne_bits(x) if target == "bf16" else x.astype(np.float16).view(np.uint16)
    _cast(target, layout)  # the same compile as the PTX test; launch compiles through the cache
    cast_tile[(1,)](torch.from_numpy(x).cuda(), y, TARGET=getattr(ll, {"bf16": "bfloat16", "fp16": "float16"}[target]),
                    LAYOUT=CAST_LAYOUTS[layout], num_warps=4)
    torch.cuda.synchronize()
    got = y.view(torch.int16).cpu().numpy().view(np.uint16)
    nan = np.isnan(x)
    exponent_mask, mantissa_mask = (0x7F80, 0x007F) if target == "bf16" else (0x7C00, 0x03FF)
    # NaN stays NaN (the payload is the hardware's canonical one); every other value bitwise.
    assert np.all((got[nan] & exponent_mask) == exponent_mask) and np.all(got[nan] & mantissa_mask)
    mismatch = np.nonzero(got[~nan] != expected[~nan])[0]
    assert mismatch.size == 0, [(hex(int(x[~nan].view(np.uint32)[i])), hex(int(got[~nan][i])),
                                 hex(int(expected[~nan][i]))) for i in mismatch[:8]]
