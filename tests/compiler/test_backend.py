"""The backend on hand-built kernels: LLVM IR, PTX for sm_90a, and ptxas's verdict.

No GPU needed. Each kernel goes through the lowlevel passes, `lower_to_llvm`, `emit_ptx`,
then ptxas (skipped only when ptxas is missing); the PTX is checked for the instructions
the lowering promises and the ptxas report for spills.

LLVM 20+ prints every global load/store with a bit type (`ld.global.v4.b32` for four
fp32), so the checks accept `.b32` or `.f32`.
"""

from __future__ import annotations

import re

import pytest

from weft.compiler import ir
from weft.compiler.backend import (DEFAULT_RULES, compile_to_ptx, emit_ptx, lower_to_llvm, lowers,
                                   static_shared_bytes)
from weft.compiler.errors import CompilationError
from weft.compiler.passes.plan_data_movement import plan_data_movement
from weft.compiler.ir import (Binary, Bitcast, Cast, Compare, Constant, ConvertLayout, DeviceAssert, DevicePrint, Fma,
                              Load, Store, Unary, Where)
from weft.compiler.types import PointerType, ScalarType, bf16, fp16, fp32, fp64, i1, i8, i32, i64, u8, u32
from weft.layouts import LinearLayout, blocked, swizzled_shared
from weft.layouts.plans import NoOp, RegisterPermutation, SharedRoundTrip, WarpShuffle
from weft.compiler.backend import ptxas

from .backend_kernels import (KernelBuilder, blocked_1d, convert, full_reduce, loop_accumulate, prepare, row_reduce,
                              shared_transpose, tensor, vector_add, while_and_if)

HAS_PTXAS = ptxas.find_ptxas() is not None


def compile_kernel(kernel, passes=True):
    """(llir, ptx, ptxas report or None)."""
    kernel = prepare(kernel) if passes else kernel
    llir, ptx = compile_to_ptx(kernel)
    assert ".target sm_90a" in ptx
    report = None
    if HAS_PTXAS:
        _, report = ptxas.assemble(ptx, arch="sm_90a")
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report["text"]
    return llir, ptx, report


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


# ----------------------------------------------------------------- global memory
def test_vector_add_masked_uses_predicated_v4_accesses():
    llir, ptx, report = compile_kernel(vector_add(per_thread=4, masked=True))
    assert 'ptx_kernel void @"vector_add"' in llir and '"nvvm.maxntid"="128"' in llir
    assert ".maxntid 128" in ptx
    assert count(r"@%p\d+ ld\.global\.v4\.(b32|f32)", ptx) == 4  # 8 registers = 2 vectors, x and y
    assert count(r"@%p\d+ st\.global\.v4\.(b32|f32)", ptx) == 2
    assert "ld.global.b32" not in ptx


def test_vector_add_unmasked_uses_plain_v4_accesses():
    _, ptx, _ = compile_kernel(vector_add(per_thread=4, masked=False))
    assert count(r"ld\.global\.v4\.(b32|f32)", ptx) == 4
    assert count(r"st\.global\.v4\.(b32|f32)", ptx) == 2
    assert "inline asm" not in ptx


@pytest.mark.parametrize("element,per_thread,vector_re", [
    (fp16, 8, r"ld\.global\.v4\.b32"),       # 8 x 16 bits = 128 bits
    (bf16, 2, r"ld\.global\.b32"),           # 2 x 16 bits = 32 bits
    (i64, 2, r"ld\.global\.v2\.(b64|u64|s64)"),
    (i8, 16, r"ld\.global\.v4\.b32"),
    (i8, 1, r"@%p\d+ st\.global\.b8"),           # one byte from a 16-bit register
])
def test_vector_widths_follow_the_vector_field(element, per_thread, vector_re):
    _, ptx, _ = compile_kernel(vector_add(per_thread=per_thread, masked=True, size=per_thread * 128, element=element))
    assert re.search(vector_re, ptx), ptx


def test_scalar_load_and_store_run_in_thread_zero_only():
    kb = KernelBuilder("scalar_copy", num_warps=1)
    src, dst = kb.param(PointerType(fp32), "src"), kb.param(PointerType(fp32), "dst")
    value = kb.add(Load, fp32, pointer=src)
    kb.add(Store, pointer=dst, value=value)
    _, ptx, _ = compile_kernel(kb.build())
    assert re.search(r"@%p\d+ st\.global\.b32", ptx)


def test_broadcast_store_is_done_by_the_owning_threads_only():
    layout = blocked((64,), (1,), (32,), (4,), (0,))  # 64 elements, 128 threads: warps 2, 3 repeat
    kb = KernelBuilder("broadcast_store")
    out = kb.param(PointerType(fp32), "out")
    offs = kb.add(ir.Arange, tensor((64,), i32, layout), start=0, end=64)
    ones = kb.full(1.0, fp32, offs.type)
    kb.add(Store, pointer=kb.pointers(out, offs), value=ones)
    _, ptx, _ = compile_kernel(kb.build())
    assert re.search(r"@%p\d+ st\.global\.b32", ptx)


# -------------------------------------------------------------------- reductions
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_row_reduction_across_warps_uses_shuffles_and_shared_memory(kind):
    kernel = row_reduce(kind, rows=16, cols=512, warps=(1, 4), per_thread=(1, 4))
    _, ptx, report = compile_kernel(kernel)
    assert count(r"shfl\.sync\.bfly\.b32", ptx) == 5 * 16  # 5 lane bits, 16 rows per thread
    assert count(r"bar\.sync\s+0", ptx) == 1
    assert count(r"st\.shared", ptx) >= 1 and count(r"ld\.shared", ptx) >= 4
    if report is not None:
        assert report["shared_bytes"] == 4 * 32 * 16 * 4


def test_row_reduction_inside_a_warp_needs_no_shared_memory():
    kernel = row_reduce("sum", rows=16, cols=128, warps=(4, 1), per_thread=(1, 4))
    _, ptx, _ = compile_kernel(kernel)
    assert "shfl.sync.bfly" in ptx
    assert "bar.sync" not in ptx and "st.shared" not in ptx


@pytest.mark.parametrize("element", [fp16, bf16, i32])
def test_row_reduction_of_narrow_and_integer_types(element):
    _, ptx, _ = compile_kernel(row_reduce("sum", rows=8, cols=512, warps=(1, 4), element=element))
    if element in (fp16, bf16):
        assert "add.rn.f32" in ptx or "add.f32" in ptx  # accumulated in fp32


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_arg_reductions_carry_indices(kind):
    _, ptx, _ = compile_kernel(row_reduce(kind, rows=8, cols=512, warps=(1, 4), out_element=i32))
    assert count(r"shfl\.sync\.bfly\.b32", ptx) == 2 * 5 * 8  # value and index per step
    assert "selp" in ptx


def test_full_reduction_to_a_rank0_tensor_is_stored_once():
    _, ptx, _ = compile_kernel(full_reduce("max"))
    assert "bar.sync" in ptx and re.search(r"@%p\d+ st\.global\.b32", ptx)


# ------------------------------------------------------------------ control flow
def test_for_loop_carries_every_register_as_a_phi():
    llir, ptx, _ = compile_kernel(loop_accumulate(size=512, per_thread=4))
    assert count(r"= phi\s+float", llir) == 4
    assert re.search(r"bra(\.uni)?\s", ptx)


@pytest.mark.parametrize("element", [fp16, bf16])
def test_for_loop_carries_16_bit_registers_in_pairs(element):
    """The induction variable, then one 32-bit phi per pair of 16-bit registers (16-bit
    phis make ptxas take pairs apart and re-pack them with PRMTs on every trip)."""
    llir, _, _ = compile_kernel(loop_accumulate(size=512, per_thread=4, element=element))
    assert count(r"= phi\s+i32", llir) == 1 + 2 and count(r"= phi\s+(half|bfloat)", llir) == 0


def test_while_and_if():
    llir, ptx, _ = compile_kernel(while_and_if())
    assert "while_before" in llir and "then" in llir and "endif" in llir


# --------------------------------------------------------------- shared memory
def test_shared_store_load_index_and_slice():
    _, ptx, report = compile_kernel(shared_transpose())
    assert re.search(r"st\.shared\.v4\.(b32|f32)", ptx)  # 4 consecutive fp32 of a row
    assert "ld.shared" in ptx and "bar.sync" in ptx
    assert ".shared .align 1024 .b8 weft_shared[" in ptx
    if report is not None:
        assert report["shared_bytes"] == 2 * 64 * 64 * 4  # the 2 stages reuse the first buffer


def test_swizzled_shared_layout_keeps_vector_accesses():
    smem = swizzled_shared((64, 64), 4, 1, 8, (1, 0))  # 16-byte chunks XORed by the row
    _, ptx, _ = compile_kernel(shared_transpose(swizzled=smem))
    assert re.search(r"st\.shared\.v4\.(b32|f32)", ptx) and "xor.b32" in ptx


def test_shared_memory_above_48k_is_dynamic():
    small, large = prepare(shared_transpose()), prepare(shared_transpose(rows=128, cols=64))
    assert static_shared_bytes(small) == small.shared_bytes and static_shared_bytes(large) == 0
    _, ptx, report = compile_kernel(large, passes=False)
    assert ".extern .shared .align 1024 .b8 weft_shared[]" in ptx
    if report is not None:
        assert report["shared_bytes"] == 0  # nothing static: the launch passes it all


# --------------------------------------------------------------- conversions
def _plan_kinds(kernel):
    return {type(op.plan) for op in prepare(kernel).walk() if isinstance(op, ConvertLayout)}


def test_convert_through_shared_memory():
    src = blocked((64, 64), (1, 4), (4, 8), (4, 1), (1, 0))
    dst = blocked((64, 64), (4, 1), (8, 4), (1, 4), (0, 1))
    kernel = convert(src, dst, (64, 64))
    assert _plan_kinds(kernel) == {SharedRoundTrip}
    _, ptx, _ = compile_kernel(kernel)
    assert "st.shared" in ptx and "ld.shared" in ptx and "bar.sync" in ptx


def test_convert_with_warp_shuffles():
    src = blocked((32, 32), (1, 1), (1, 32), (4, 1), (1, 0))
    reversed_lanes = LinearLayout(
        {"register": src.bases["register"], "lane": list(reversed(src.bases["lane"])),
         "warp": src.bases["warp"], "block": []}, src.out_dims)
    kernel = convert(src, reversed_lanes, (32, 32))
    assert _plan_kinds(kernel) == {WarpShuffle}
    _, ptx, _ = compile_kernel(kernel)
    assert "shfl.sync.idx" in ptx and "bar.sync" not in ptx


def test_convert_by_register_permutation_and_no_op():
    src = blocked((8, 128), (2, 4), (1, 32), (4, 1), (1, 0))
    swapped = LinearLayout({**src.bases, "register": tuple(reversed(src.bases["register"]))}, src.out_dims)
    assert _plan_kinds(convert(src, swapped, (8, 128))) == {RegisterPermutation}
    assert _plan_kinds(convert(src, src, (8, 128))) == {NoOp}
    for dst in (swapped, src):
        _, ptx, _ = compile_kernel(convert(src, dst, (8, 128)))
        assert "shfl" not in ptx and "bar.sync" not in ptx


def test_convert_without_plan_is_refused():
    src = blocked((8, 128), (2, 4), (1, 32), (4, 1), (1, 0))
    kernel = convert(src, src, (8, 128))
    with pytest.raises(CompilationError, match="plan_data_movement"):
        lower_to_llvm(kernel)


# ----------------------------------------------------------------- elementwise
def _unary_kernel(element, kinds):
    layout = blocked_1d(256, 2)
    kb = KernelBuilder(f"unary_{element}")
    x, out = kb.param(PointerType(element), "x"), kb.param(PointerType(element), "out")
    offs = kb.add(ir.Arange, tensor((256,), i32, layout), start=0, end=256)
    value = kb.add(Load, tensor((256,), element, layout), pointer=kb.pointers(x, offs))
    for kind in kinds:
        value = kb.add(Unary, value.type, kind=kind, operand=value)
    kb.add(Store, pointer=kb.pointers(out, offs), value=value)
    return kb.build(param_divisibility=(16, 16))


FLOAT_UNARY = ("neg", "exp", "exp2", "log", "log2", "sqrt", "sqrt_approx", "rsqrt", "abs", "erf", "sin", "cos",
               "floor", "ceil")


@pytest.mark.parametrize("element", [fp32, fp16, bf16])
def test_float_unary_ops(element):
    _, ptx, _ = compile_kernel(_unary_kernel(element, FLOAT_UNARY))
    for instruction in ("ex2.approx.ftz.f32", "lg2.approx", "rsqrt.approx", "sqrt.approx.ftz.f32", "sqrt.rn"):
        assert instruction in ptx
    assert "__nv_" not in ptx  # log, erf, sin, cos: libdevice linked and inlined


def test_integer_and_fp64_unary_ops():
    compile_kernel(_unary_kernel(i32, ("neg", "not", "abs")))
    _, ptx, _ = compile_kernel(_unary_kernel(fp64, FLOAT_UNARY))  # libdevice's fp64 math
    assert "__nv_" not in ptx and "sqrt.rn.f64" in ptx


def _binary_kernel(element, kinds):
    layout = blocked_1d(256, 2)
    kb = KernelBuilder(f"binary_{element}")
    x, out = kb.param(PointerType(element), "x"), kb.param(PointerType(element), "out")
    offs = kb.add(ir.Arange, tensor((256,), i32, layout), start=0, end=256)
    a = kb.add(Load, tensor((256,), element, layout), pointer=kb.pointers(x, offs))
    value = a
    for kind in kinds:
        value = kb.add(Binary, a.type, kind=kind, lhs=value, rhs=a)
    value = kb.add(Fma, a.type, a=value, b=a, c=value)
    smaller = kb.add(Compare, tensor((256,), i1, layout), predicate="lt", lhs=value, rhs=a)
    value = kb.add(Where, a.type, condition=smaller, true_value=value, false_value=a)
    kb.add(Store, pointer=kb.pointers(out, offs), value=value)
    return kb.build(param_divisibility=(16, 16))


@pytest.mark.parametrize("element,kinds", [
    (fp32, ("add", "sub", "mul", "div", "floordiv", "mod", "max", "min", "pow")),
    (bf16, ("add", "sub", "mul", "div", "max", "min", "pow")),
    (fp16, ("add", "mul", "mod")),
    (i32, ("add", "sub", "mul", "div", "floordiv", "mod", "and", "or", "xor", "shl", "shr", "max", "min")),
    (u32, ("div", "mod", "shr", "max", "min")),
    (i64, ("add", "mul", "div", "mod", "max")),
])
def test_binary_ops(element, kinds):
    llir, _, _ = compile_kernel(_binary_kernel(element, kinds))
    if element == i32:
        assert "sdiv" in llir and "srem" in llir and "ashr" in llir
    if element == u32:
        assert "udiv" in llir and "urem" in llir and "lshr" in llir


CAST_TYPES = (i1, i8, u8, i32, u32, i64, fp16, bf16, fp32, fp64, ScalarType("fp8e4m3"), ScalarType("fp8e5m2"))


def test_every_cast_pair_compiles():
    layout = blocked_1d(128, 1)
    kb = KernelBuilder("casts")
    x, out = kb.param(PointerType(fp32), "x"), kb.param(PointerType(fp32), "out")
    offs = kb.add(ir.Arange, tensor((128,), i32, layout), start=0, end=128)
    source = kb.add(Load, tensor((128,), fp32, layout), pointer=kb.pointers(x, offs))
    total = kb.full(0.0, fp32, source.type)
    for a in CAST_TYPES:
        first = kb.add(Cast, tensor((128,), a, layout), operand=source)
        for b in CAST_TYPES:
            second = kb.add(Cast, tensor((128,), b, layout), operand=first)
            back = kb.add(Cast, source.type, operand=second)
            total = kb.binary("add", total, back)
    kb.add(Store, pointer=kb.pointers(out, offs), value=total)
    _, ptx, _ = compile_kernel(kb.build(param_divisibility=(16, 16)))
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.rn.f16x2.e5m2x2" in ptx
    assert "cvt.rn.bf16.f32" in ptx


def test_bitcast_between_float_and_int_and_pointer():
    layout = blocked_1d(128, 1)
    kb = KernelBuilder("bitcasts")
    x, out = kb.param(PointerType(fp32), "x"), kb.param(PointerType(i32), "out")
    offs = kb.add(ir.Arange, tensor((128,), i32, layout), start=0, end=128)
    pointers = kb.pointers(x, offs)
    value = kb.add(Load, tensor((128,), fp32, layout), pointer=pointers)
    bits = kb.add(Bitcast, tensor((128,), i32, layout), operand=value)
    address = kb.add(Bitcast, tensor((128,), i64, layout), operand=pointers)
    low = kb.add(Cast, tensor((128,), i32, layout), operand=address)
    kb.add(Store, pointer=kb.pointers(out, offs), value=kb.binary("xor", bits, low))
    compile_kernel(kb.build(param_divisibility=(16, 16)))


# ------------------------------------------------------------------ debugging
def test_print_and_assert_call_the_cuda_syscalls():
    layout = blocked_1d(128, 1)
    kb = KernelBuilder("debug")
    x = kb.param(PointerType(fp32), "x")
    offs = kb.add(ir.Arange, tensor((128,), i32, layout), start=0, end=128)
    value = kb.add(Load, tensor((128,), fp32, layout), pointer=kb.pointers(x, offs))
    kb.add(DevicePrint, prefix="value", values=(value, offs))
    zero = kb.full(0.0, fp32, value.type)
    positive = kb.add(Compare, tensor((128,), i1, layout), predicate="ge", lhs=value, rhs=zero)
    kb.add(DeviceAssert, condition=positive, message="x must be non-negative")
    kb.add(DevicePrint, prefix="done")
    _, ptx, _ = compile_kernel(kb.build(param_divisibility=(16,)))
    assert "call.uni" in ptx or "call " in ptx
    assert "vprintf" in ptx and "__assertfail" in ptx


# -------------------------------------------------------------- the rule table
def test_rule_tables_can_be_extended_without_touching_the_default():
    kernel = prepare(vector_add(masked=False))
    calls = []

    def counting_store(ctx, op):
        calls.append(op)
        DEFAULT_RULES[Store](ctx, op)

    llir = lower_to_llvm(kernel, rules={**DEFAULT_RULES, Store: counting_store})
    assert len(calls) == 1 and DEFAULT_RULES[Store] is not counting_store
    emit_ptx(llir)


def test_missing_rule_names_the_op():
    kernel = prepare(vector_add(masked=False))
    rules = {k: v for k, v in DEFAULT_RULES.items() if k is not Store}
    with pytest.raises(CompilationError, match="no lowering for `store`"):
        lower_to_llvm(kernel, rules=rules)


def test_lowers_decorator_registers_into_a_given_table():
    table: dict = {}

    @lowers(Constant, table=table)
    def rule(ctx, op):
        pass

    assert table == {Constant: rule}


def test_missing_shared_offsets_are_reported():
    kernel = plan_data_movement(row_reduce("sum", rows=8, cols=512, warps=(1, 4)))
    with pytest.raises(CompilationError, match="allocate_shared_memory"):
        lower_to_llvm(kernel)
