"""Kernel parameters in the backend: TMA descriptors as grid-constant by-value params."""

from __future__ import annotations

import dataclasses
import re

import pytest
from llvmlite import ir as llvm_ir

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.backend import DEFAULT_RULES, compile_to_ptx
from weft.compiler.backend import llvm_types as T
from weft.compiler.frontend import build_kernel
from weft.compiler.types import PointerType, TensorDescriptorType, fp32, parse_signature_type
from weft.compiler.backend import ptxas

HAS_PTXAS = ptxas.find_ptxas() is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefetchTensorMap(ir.Op):
    """Test-only op: `prefetch.tensormap [desc]` from one descriptor parameter."""

    NAME = "test_prefetch_tensormap"
    descriptor: ir.Value


def _prefetch(ctx, op):
    address = ctx.get(op.descriptor)
    assert address.type == T.I64  # the generic address of the param-space tensor map
    asm = llvm_ir.InlineAsm(llvm_ir.FunctionType(llvm_ir.VoidType(), [T.I64]),
                            "prefetch.tensormap [$0];", "l", side_effect=True)
    ctx.builder.call(asm, [address])


def _descriptor_kernel():
    a = ir.Value(parse_signature_type("tensordesc<bf16[128,64]>"), "a_desc")
    b = ir.Value(parse_signature_type("tensordesc<fp32[8,32],swizzle=128>"), "b_desc")
    out = ir.Value(PointerType(fp32), "out")
    body = ir.Block((), (PrefetchTensorMap(descriptor=a), PrefetchTensorMap(descriptor=b)))
    return ir.Kernel("tma_params", (a, out, b), body, num_warps=4)


def test_descriptor_params_are_grid_constant_byval_and_never_copied():
    llir, ptx = compile_to_ptx(_descriptor_kernel(), rules={**DEFAULT_RULES, PrefetchTensorMap: _prefetch})
    assert 'ptr byval([128 x i8]) "nvvm.grid_constant" align 64 %"a_desc"' in llir
    assert 'ptrtoint ptr %"a_desc" to i64' in llir
    params = re.search(r"\.entry tma_params\((.*?)\)", ptx, re.S).group(1)
    assert [line.strip().rstrip(",") for line in params.strip().splitlines()] == [
        ".param .align 64 .b8 tma_params_param_0[128]",
        ".param .u64 .ptr .global .align 1 tma_params_param_1",
        ".param .align 64 .b8 tma_params_param_2[128]"]
    # The address is the param's own (cvta.param), not a local copy of its 128 bytes.
    assert len(re.findall(r"cvta\.param\.u64\s+(%rd\d+)", ptx)) == 2
    assert len(re.findall(r"prefetch\.tensormap \[%rd\d+\];", ptx)) == 2
    assert "__local_depot" not in ptx and "st.local" not in ptx and "ld.param.b8" not in ptx
    if HAS_PTXAS:
        _, report = ptxas.assemble(ptx, arch="sm_90a")
        assert report["stack_frame"] == 0


def tma_kernel(a_desc, out, n):
    pass


def test_signature_to_kernel_param():
    kernel = build_kernel(tma_kernel, {"a_desc": "tensordesc<bf16[128,64]>", "out": "*fp32", "n": "i32"},
                          {}, 4)
    desc = kernel.params[0]
    assert isinstance(desc, ir.Value) and isinstance(desc.type, TensorDescriptorType)
    assert desc.type.block_shape == (128, 64) and desc.hint == "a_desc"


def test_bad_descriptor_signature_is_a_compilation_error():
    from weft.compiler.errors import CompilationError

    with pytest.raises(CompilationError, match=r"bad signature type for 'a_desc': .*block_shape\[1\] = 512"):
        build_kernel(tma_kernel, {"a_desc": "tensordesc<bf16[8,512]>", "out": "*fp32", "n": "i32"}, {}, 4)


def test_jit_compile_with_a_descriptor_signature(cache_dir):
    compiled = ll.jit(tma_kernel).compile(
        signature={"a_desc": "tensordesc<bf16[128,64]>", "out": "*fp32", "n": "i32"})
    assert compiled.params[0].type == "tensordesc<bf16[128,64],swizzle=128>"
    assert ".param .align 64 .b8 tma_kernel_param_0[128]" in compiled.asm["ptx"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path / "cache"))
