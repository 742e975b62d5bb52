"""The highlevel matmul (highlevel/examples.py) through ptxas for sm_90a at the tiles a
Hopper matmul uses: wgmma from NVMMA-swizzled shared memory, its operands read by TMA boxes
(stage_pointer_loads) or, launched with pointer_tma=False, by 128-bit loads; no spills;
and a small tile on mma.sync."""

import pytest

from weft.compiler.backend import ptxas
from weft.highlevel import examples

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")

STRIDES = ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")


def compile_matmul(element: str, block, num_warps: int, out: str = "fp16", activation: str = "leaky_relu",
                   **options):
    """As a launch on [4096, 4096] row-major tensors specializes it: sizes and row strides
    divisible by 16, unit column strides."""
    signature = {"a_ptr": f"*{element}", "b_ptr": f"*{element}", "c_ptr": f"*{out}", "M": "i32", "N": "i32",
                 "K": "i32", **{name: "i32" for name in STRIDES}}
    specialization = {name: "divisible_by_16" for name in signature}
    specialization.update(stride_ak="equal_to_1", stride_bn="equal_to_1", stride_cn="equal_to_1")
    block_m, block_n, block_k = block
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, ACTIVATION=activation,
                      ACC_IN_DOT=True)
    return examples.matmul_kernel.compile(signature=signature, constexprs=constexprs, num_warps=num_warps,
                                          specialization=specialization, **options)


@needs_ptxas
@pytest.mark.parametrize("element, block, num_warps", [("fp16", (128, 128, 64), 8), ("fp16", (128, 256, 64), 8),
                                                       ("bf16", (64, 128, 64), 4), ("fp32", (128, 128, 32), 8),
                                                       ("fp8e4m3", (128, 128, 128), 8)])
@pytest.mark.parametrize("pointer_tma", [True, False])
def test_matmul_assembles_without_spills(element, block, num_warps, pointer_tma):
    compiled = compile_matmul(element, block, num_warps, pointer_tma=pointer_tma)
    ptx = compiled.asm["ptx"]
    load = "cp.async.bulk.tensor" if pointer_tma else "ld.global.v4"
    for instruction in ("wgmma.mma_async", "wgmma.wait_group", "fence.proxy.async", load):
        assert instruction in ptx, instruction
    assert {"fp32": ".tf32.tf32", "fp8e4m3": ".e4m3.e4m3", "fp16": ".f16.f16", "bf16": ".bf16.bf16"}[element] in ptx
    if not (pointer_tma and element == "fp8e4m3"):  # an 8-bit [K, N] box is transposed each K step, by design
        assert "convert_layout" not in compiled.asm["layout"].split("= for")[1].split("yield")[0]  # none per K step
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.metadata["performance_warnings"] == []


@needs_ptxas
def test_a_small_tile_assembles_on_mma_sync():
    compiled = compile_matmul("fp16", (32, 128, 64), 4)
    assert "mma.sync.aligned.m16n8k16" in compiled.asm["ptx"] and "wgmma" not in compiled.asm["ptx"]
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
