"""wgmma in the backend: PTX for hand-built one-CTA kernels, ptxas's verdict, and errors.

Each kernel (warpgroup_mma_kernels.warpgroup_mma_dot) loads A and B, stores them into NVMMA shared
buffers, fences, and runs one WarpgroupMma; the PTX must hold the instructions the
lowering promises (shape, count, transpose immediates, fence/commit/wait) and ptxas
(sm_90a) must accept it without spills or wgmma serialization.
"""

from __future__ import annotations

import re

import pytest

from weft.compiler.backend import compile_to_ptx
from weft.compiler.errors import CompilationError, Loc
from weft.compiler.ir import (AllocateSharedMemory, Constant, FenceAsyncShared, SharedPermute, Store, Value,
                              WarpgroupMma, WarpgroupMmaWait)
from weft.compiler.types import PointerType, ScalarType, SharedType, fp32, i32
from weft.layouts import blocked, nvmma_shared, wgmma_accumulator
from weft.lowlevel.layouts import BlockedLayout, NVMMADistributedLayout
from weft.compiler.backend import ptxas

from .backend_kernels import KernelBuilder, _grid_offsets, prepare, row_major_shared, tensor
from .warpgroup_mma_kernels import DotConfig, warpgroup_mma_dot

HAS_PTXAS = ptxas.find_ptxas() is not None


def compile_dot(config: DotConfig):
    _, ptx = compile_to_ptx(prepare(warpgroup_mma_dot(config)))
    report = None
    if HAS_PTXAS:
        _, report = ptxas.assemble(ptx, arch="sm_90a")
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report["text"]
        assert "serializ" not in report["text"], report["text"]
    return ptx, report


def mma_lines(ptx: str) -> list[str]:
    return re.findall(r"wgmma\.mma_async\.sync\.aligned\.\S+ \{[^}]*\}, [^;]*;", ptx)


PTX_TYPES = {"bf16": "bf16", "fp16": "f16", "fp8e4m3": "e4m3", "fp8e5m2": "e5m2", "fp32": "tf32"}

CONFIGS = [
    DotConfig(element="bf16"),
    DotConfig(element="fp16", b_kmajor=False),
    DotConfig(element="fp8e4m3", k=128),
    DotConfig(element="fp8e5m2", n=128),
    DotConfig(element="bf16", a_in_registers=True),
    DotConfig(element="fp8e4m3", a_in_registers=True, n=128),
    DotConfig(element="bf16", n=128, b_kmajor=False),
    DotConfig(element="fp16", n=256, k=32),
    DotConfig(element="bf16", m=128, n=256, warpgroups=2),
    DotConfig(element="bf16", m=128, n=128, warpgroups=2, warps_n=2, b_kmajor=False),
    DotConfig(element="bf16", m=128, n=128, warpgroups=2, a_in_registers=True, b_kmajor=False),
    DotConfig(element="bf16", a_swizzle=0, b_swizzle=0, b_kmajor=False),
    DotConfig(element="fp16", a_swizzle=32, b_swizzle=64),
    DotConfig(element="fp16", acc="fp16", is_async=True, use_acc=False),
    DotConfig(element="fp32", k=32),
    DotConfig(element="bf16", a_mmajor=True),
    DotConfig(element="fp16", m=64, n=64, warpgroups=2, warps_n=2, b_kmajor=False),
    DotConfig(element="fp16", m=128, warpgroups=2, a_mmajor=True, b_kmajor=False, a_swizzle=64),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name + ("_async" if c.is_async else ""))
def test_warpgroup_mma_kernels_compile_to_the_promised_instructions(config):
    ptx, _ = compile_dot(config)
    element = ScalarType(config.element)
    k_instr = 256 // element.bits
    n_instr = min(256, config.n // config.warps_n)
    dtype = "f16" if config.acc == "fp16" else "f32"
    name = PTX_TYPES[config.element]
    lines = mma_lines(ptx)
    shape = f"m64n{n_instr}k{k_instr}.{dtype}.{name}.{name}"
    assert lines and all(shape in line for line in lines), lines[:1]
    m_tiles = config.m // 64 // (config.warpgroups // config.warps_n)
    n_tiles = config.n // config.warps_n // n_instr
    assert len(lines) == m_tiles * n_tiles * (config.k // k_instr)
    registers = n_instr // 2 if dtype == "f32" else n_instr // 4
    assert all(len(re.search(r"\{([^}]*)\}", line).group(1).split(",")) == registers for line in lines)
    immediates = [line.rsplit("p, ", 1)[1].rstrip(";") for line in lines]
    if element.bits == 16:
        trans_a, trans_b = int(config.a_mmajor), int(not config.b_kmajor)
        expected = f"1, 1, {trans_b}" if config.a_in_registers else f"1, 1, {trans_a}, {trans_b}"
    else:
        expected = "1, 1"
    assert set(immediates) == {expected}
    if config.a_in_registers:
        assert all(re.search(r"\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+, p", line) for line in lines)
    else:
        assert all(re.search(r"\}, %rd\d+, %rd\d+, p", line) for line in lines)
    body = ptx[ptx.index("wgmma.fence"):]
    assert body.index("wgmma.fence") < body.index("wgmma.mma_async") < body.index("wgmma.commit_group")
    assert body.index("wgmma.commit_group") < body.index("wgmma.wait_group.sync.aligned 0")
    assert ptx.index("fence.proxy.async.shared::cta") < ptx.index("bar.sync") < ptx.index("wgmma.fence")
    assert ptx.count("setp.ne.b32 p,") == len(lines)


def test_two_warpgroups_point_their_descriptors_at_their_own_rows():
    """With 8 warps along M, warps 4..7 read A from 64 rows (8 KB of 128-byte rows) further."""
    ptx, _ = compile_dot(DotConfig(m=128, n=64, warpgroups=2))
    assert len(mma_lines(ptx)) == 4  # each warpgroup: one m64 tile x 4 K steps
    # (tid << 6) & 8192: warp-index bit 2 (tid bit 7) times 64 rows of 128 bytes
    assert re.search(r"and\.b32\s+%r\d+, %r\d+, 8192;", ptx), "A's start must move with the warpgroup"


def test_k_steps_advance_the_descriptors_by_32_bytes():
    ptx, _ = compile_dot(DotConfig(element="bf16", k=64))
    constants = {int(c) & 0x3FFF for c in re.findall(r"(?:or|add)\.(?:b|s)64\s+%rd\d+, %rd\d+, (\d+);", ptx)}
    assert {2, 4, 6} <= constants  # start address + 32, 64, 96 bytes (>> 4)


# ------------------------------------------------------------------- the other ops
def test_fence_permute_and_wait_lower():
    config = DotConfig(element="bf16", is_async=True)
    ptx, _ = compile_dot(config)
    assert "fence.proxy.async.shared::cta;" in ptx
    assert ptx.count("wgmma.wait_group.sync.aligned 0;") == 1


def test_wait_keeps_pending_groups_and_passes_registers_through():
    kb, acc = _dot_builder()
    waited = Value(acc.type, "waited")
    kb.regions[-1].append(WarpgroupMmaWait(results=(waited,), deps=(acc,), pending=1))
    out = kb.param(PointerType(fp32), "out")
    stride = kb.add(Constant, i32, value=64)
    offsets, _ = _grid_offsets(kb, waited.type.layout, 64, 64, stride)
    kb.add(Store, pointer=kb.pointers(out, offsets), value=waited)
    _, ptx = compile_to_ptx(prepare(kb.build()))
    wait = re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)
    assert wait and ptx.index("wgmma.commit_group") < wait.start() < ptx.index("st.global")


# ------------------------------------------------------------------- errors
LOC = Loc("user.py", 12, 4, "acc = ll.warpgroup_mma(a, b, acc)\n")


def _dot_builder(m=64, n=64, k=64, a="bf16", b="bf16", acc_element="fp32", a_layout=None, b_layout=None,
                 acc_layout=None, acc_encoding=None, num_warps=4, b_transposed_view=False, a_element=None):
    """Empty shared operands (contents do not matter for compiling) and one async dot."""
    kb = KernelBuilder("dot_error", num_warps=num_warps)
    a_type, b_type = ScalarType(a), ScalarType(b)
    a_layout = a_layout or nvmma_shared((m, k), 128 if k * a_type.bits >= 1024 else 0, a_type.bits)
    a_smem = kb.add(AllocateSharedMemory, SharedType((m, k), a_type, a_layout), "a")
    if b_transposed_view:
        stored = kb.add(AllocateSharedMemory,
                        SharedType((n, k), b_type, b_layout or nvmma_shared((n, k), 64, b_type.bits)), "bt")
        b_smem = kb.add(SharedPermute, SharedType((k, n), b_type, nvmma_shared((k, n), 64, b_type.bits, True)), "b",
                        buffer=stored, order=(1, 0))
    else:
        b_smem = kb.add(AllocateSharedMemory,
                        SharedType((k, n), b_type, b_layout or nvmma_shared((k, n), 64, b_type.bits)), "b")
    kb.add(FenceAsyncShared)
    warps = (num_warps, 1)
    layout = acc_layout or wgmma_accumulator((m, n), warps, n)
    encoding = acc_encoding or NVMMADistributedLayout((3, 0), warps, (16, n, 16))
    acc_type = tensor((m, n), ScalarType(acc_element), layout).with_layout(layout, encoding)
    zero = kb.add(Constant, acc_type, value=0.0)
    result = kb.add(WarpgroupMma, acc_type, "acc", a=a_smem, b=b_smem, acc=zero, is_async=True, loc=LOC)
    return kb, result


def error_of(kb) -> CompilationError:
    with pytest.raises(CompilationError) as info:
        compile_to_ptx(prepare(kb.build()))
    assert info.value.loc == LOC
    return info.value


def test_k_must_be_a_multiple_of_the_instruction_k():
    kb, _ = _dot_builder(k=8, a_layout=nvmma_shared((64, 8), 0, 16), b_layout=nvmma_shared((8, 64), 0, 16))
    assert "K = 8 is not a multiple of the instruction's k = 16" in str(error_of(kb))


def test_mismatched_operand_types():
    kb, _ = _dot_builder(a="bf16", b="fp16")
    assert "same element type" in str(error_of(kb))


def test_fp8_b_must_be_k_major():
    kb, _ = _dot_builder(a="fp8e4m3", b="fp8e4m3")  # B [K, N] with N contiguous
    message = str(error_of(kb))
    assert "operand b" in message and "must be K-major" in message
    kb, _ = _dot_builder(a="fp8e4m3", b="fp8e4m3", b_transposed_view=True)
    compile_to_ptx(prepare(kb.build()))  # the permuted [N, K] buffer is K-major: fine
    kb, _ = _dot_builder(a="fp8e4m3", b="fp8e4m3", b_transposed_view=True,
                         a_layout=nvmma_shared((64, 64), 64, 8, transposed=True))
    message = str(error_of(kb))
    assert "operand a" in message and "must be K-major" in message


def test_accumulator_must_be_a_wgmma_layout():
    layout = blocked((64, 64), (1, 4), (4, 8), (4, 1), (1, 0))
    kb, _ = _dot_builder(acc_layout=layout, acc_encoding=BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))
    error = error_of(kb)
    assert "NVMMADistributedLayout" in str(error) and "BlockedLayout" in str(error)


def test_accumulator_needs_whole_warpgroups_and_64_rows():
    layout = blocked((64, 64), (1, 4), (4, 8), (2, 1), (1, 0))
    kb, _ = _dot_builder(num_warps=2, acc_layout=layout, acc_encoding=None)
    assert "whole warpgroups" in str(error_of(kb))
    small = wgmma_accumulator((32, 64), (4, 1), 64)
    kb, _ = _dot_builder(m=32, acc_layout=small, a_layout=nvmma_shared((32, 64), 128, 16))
    assert "multiple of 64 rows" in str(error_of(kb))


def test_unreadable_shared_layout_names_it_and_suggests_the_default():
    kb, _ = _dot_builder(a_layout=row_major_shared(64, 64))
    error = error_of(kb)
    assert "operand a" in str(error) and "cannot read this shared layout" in str(error)
    assert "NVMMASharedLayout.get_default_for" in error.suggestion
