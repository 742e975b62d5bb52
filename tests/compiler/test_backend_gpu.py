"""The backend's kernels run on the GPU and checked against numpy (marked `gpu`).

Each test compiles a hand-built kernel (backend_kernels), launches it through
weft.runtime.driver with device buffers made from numpy arrays, and compares the results.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from weft.compiler import ir
from weft.compiler.backend import compile_to_ptx, uses_dynamic_shared_memory
from weft.compiler.ir import Binary, Cast, Load, Store, Unary
from weft.compiler.types import PointerType, fp16, fp32, i32, i64
from weft.layouts import LinearLayout, blocked, nvmma_shared, swizzled_shared

from .backend_kernels import (KernelBuilder, blocked_1d, convert, full_reduce, loop_accumulate, prepare, row_reduce,
                              shared_transpose, tensor, vector_add, while_and_if)

pytestmark = pytest.mark.gpu


def launch(kernel, args, grid=(1, 1, 1)):
    """Compile, launch once with numpy arrays (copied in and back out) and scalars."""
    from weft.compiler.backend import ptxas
    from weft.runtime import driver

    kernel = prepare(kernel)
    _, ptx = compile_to_ptx(kernel)
    if ptxas.find_ptxas() is not None:
        cubin, _ = ptxas.assemble(ptx)
        module = driver.load_module("cubin", cubin)
    else:
        module = driver.load_module("ptx", ptx)
    function = driver.get_function(module, kernel.name)
    dynamic = kernel.shared_bytes if uses_dynamic_shared_memory(kernel) else 0
    if dynamic:
        driver.set_max_dynamic_shared(function, dynamic)
    cuda = driver.cuda()
    buffers, values = [], []
    for param, arg in zip(kernel.params, args):
        if isinstance(param.type, PointerType):
            host = np.ascontiguousarray(arg)
            pointer = driver.check(cuda.cuMemAlloc(max(host.nbytes, 16)), "cuMemAlloc")
            driver.check(cuda.cuMemcpyHtoD(pointer, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
            buffers.append((pointer, host))
            values.append(ctypes.c_uint64(int(pointer)))
        elif param.type.is_float:
            values.append(ctypes.c_float(arg))
        else:
            values.append(ctypes.c_int32(arg))
    driver.launch(function, grid, (32 * kernel.num_warps, 1, 1), dynamic, None, values)
    driver.synchronize()
    results = []
    for pointer, host in buffers:
        out = np.empty_like(host)
        driver.check(cuda.cuMemcpyDtoH(out.ctypes.data, pointer, host.nbytes), "cuMemcpyDtoH")
        driver.check(cuda.cuMemFree(pointer), "cuMemFree")
        results.append(out)
    return results


RNG = np.random.default_rng(7)


def test_vector_add_masked_tail():
    x = RNG.standard_normal(1024).astype(np.float32)
    y = RNG.standard_normal(1024).astype(np.float32)
    out = np.full(1024, -7.0, np.float32)
    _, _, got = launch(vector_add(per_thread=4, masked=True), [x, y, out, 1000])
    np.testing.assert_array_equal(got[:1000], x[:1000] + y[:1000])
    assert np.all(got[1000:] == -7.0)


@pytest.mark.parametrize("shape,warps", [((16, 512), (1, 4)), ((16, 128), (4, 1)), ((8, 256), (2, 2))])
@pytest.mark.parametrize("kind", ["sum", "max", "min", "argmax", "argmin"])
def test_row_reductions(kind, shape, warps):
    rows, cols = shape
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 5] = x[0, 77] = 9.0  # a tie: the smaller index wins
    out_type = np.int32 if kind.startswith("arg") else np.float32
    out = np.zeros(rows, out_type)
    kernel = row_reduce(kind, rows=rows, cols=cols, warps=warps, per_thread=(1, 4),
                        out_element=i32 if kind.startswith("arg") else None)
    _, got = launch(kernel, [x, out, cols])
    expected = getattr(np, kind)(x, axis=1)
    if kind == "sum":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, expected.astype(out_type))


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_full_reduction(kind):
    x = RNG.standard_normal(1024).astype(np.float32)
    _, got = launch(full_reduce(kind), [x, np.zeros(1, np.float32)])
    np.testing.assert_allclose(got[0], getattr(np, kind)(x), rtol=1e-5, atol=1e-5)


def test_fp16_sum_accumulates_in_fp32():
    x = RNG.standard_normal((8, 512)).astype(np.float16)
    _, got = launch(row_reduce("sum", rows=8, cols=512, warps=(1, 4), element=fp16), [x, np.zeros(8, np.float16), 512])
    np.testing.assert_allclose(got.astype(np.float32), x.astype(np.float32).sum(axis=1), rtol=2e-3, atol=2e-2)


def test_for_loop_accumulates():
    x = RNG.standard_normal(512 * 6).astype(np.float32)
    _, got = launch(loop_accumulate(512, 4), [x, np.zeros(512, np.float32), 6])
    np.testing.assert_allclose(got, x.reshape(6, 512).sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,sign", [(1000, 1.0), (3000, -1.0), (5, 1.0)])
def test_while_and_if(n, sign):
    # n halves while >= 256: 1000 -> 500 -> 250 (even: -x); 3000 -> ... -> 187 (odd: x); 5 (odd)
    m = n
    while m >= 256:
        m //= 2
    x = RNG.standard_normal(256).astype(np.float32)
    _, got = launch(while_and_if(256), [x, np.zeros(256, np.float32), n])
    np.testing.assert_array_equal(got, x if m % 2 else -x)


def _lanes_reversed(layout):
    return LinearLayout({**layout.bases, "lane": tuple(reversed(layout.bases["lane"]))}, layout.out_dims)


def _warp_xor_pair():
    """dst's warp bit is src's warp bit plus a register bit: a WarpShuffle whose register
    names depend on the warp (warp_register_xor)."""
    rows = [(1, 0), (2, 0), (4, 0), (8, 0)]
    lanes = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16)]
    make = lambda warp: LinearLayout({"register": rows, "lane": lanes, "warp": [warp], "block": []},  # noqa: E731
                                     {"dim0": 32, "dim1": 32})
    return make((16, 0)), make((24, 0))


@pytest.mark.parametrize("src,dst,shape", [
    (*_warp_xor_pair(), (32, 32)),
    (blocked((64, 64), (1, 4), (4, 8), (4, 1), (1, 0)), blocked((64, 64), (4, 1), (8, 4), (1, 4), (0, 1)), (64, 64)),
    (blocked((32, 32), (1, 1), (1, 32), (4, 1), (1, 0)),
     _lanes_reversed(blocked((32, 32), (1, 1), (1, 32), (4, 1), (1, 0))), (32, 32)),
    (blocked((32, 64), (1, 2), (4, 8), (4, 1), (1, 0)), blocked((32, 64), (2, 1), (4, 8), (2, 2), (0, 1)), (32, 64)),
    (blocked((8, 128), (2, 4), (1, 32), (4, 1), (1, 0)), blocked((8, 128), (1, 1), (1, 32), (1, 4), (1, 0)), (8, 128)),
])
@pytest.mark.parametrize("element", [np.float32, np.float16, np.int8])
def test_conversions_move_every_element(src, dst, shape, element):
    from weft.compiler.types import fp16 as f16, i8

    weft_type = {np.float32: fp32, np.float16: f16, np.int8: i8}[element]
    x = (RNG.standard_normal(shape) * 50).astype(element)
    kernel = convert(src, dst, shape, element=weft_type, num_warps=src.in_dim_size("warp"))
    _, got = launch(kernel, [x, np.zeros(shape, element)])
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("rows,smem", [
    (64, None), (128, None),
    (64, swizzled_shared((64, 64), 4, 1, 8, (1, 0))), (128, swizzled_shared((128, 64), 2, 2, 4, (1, 0))),
    (64, nvmma_shared((64, 64), 128, 32)), (64, nvmma_shared((64, 64), 32, 32)),
])
def test_shared_round_trip_index_and_slice(rows, smem):
    x = RNG.standard_normal((rows, 64)).astype(np.float32)
    _, out, tail = launch(shared_transpose(rows=rows, cols=64, swizzled=smem),
                          [x, np.zeros_like(x), np.zeros((rows // 2, 64), np.float32)])
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(tail, x[rows // 2:])


def _unary_all(kinds, size=1024):
    layout = blocked_1d(size, 2)
    kb = KernelBuilder("unary_all")
    x, out = kb.param(PointerType(fp32), "x"), kb.param(PointerType(fp32), "out")
    offs = kb.add(ir.Arange, tensor((size,), i32, layout), start=0, end=size)
    value = kb.add(Load, tensor((size,), fp32, layout), pointer=kb.pointers(x, offs))
    for index, kind in enumerate(kinds):
        shifted = kb.binary("add", offs, kb.splat(kb.add(ir.Constant, i32, value=index * size), offs.type))
        kb.add(Store, pointer=kb.pointers(out, shifted), value=kb.add(Unary, value.type, kind=kind, operand=value))
    return kb.build(param_divisibility=(16, 16))


def test_unary_math_accuracy():
    from math import erf

    kinds = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "erf", "sin", "cos", "floor", "ceil", "abs", "neg"]
    x = np.concatenate([np.linspace(-6, 6, 512), np.geomspace(1e-3, 80, 512)]).astype(np.float32)
    _, got = launch(_unary_all(kinds), [x, np.zeros(len(kinds) * 1024, np.float32)])
    got = got.reshape(len(kinds), 1024).astype(np.float64)
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        reference = {
            "exp": np.exp(xd), "exp2": np.exp2(xd), "log": np.log(xd), "log2": np.log2(xd),
            "sqrt": np.sqrt(xd), "rsqrt": 1 / np.sqrt(xd), "erf": np.array([erf(v) for v in xd]),
            "sin": np.sin(xd), "cos": np.cos(xd), "floor": np.floor(xd), "ceil": np.ceil(xd),
            "abs": np.abs(xd), "neg": -xd,
        }
    errors = {}
    for row, kind in zip(got, kinds):
        want = reference[kind]
        finite = np.isfinite(want)
        if kind in ("sqrt", "floor", "ceil", "abs", "neg"):  # correctly rounded
            np.testing.assert_array_equal(row[finite], want.astype(np.float32)[finite], err_msg=kind)
        elif kind in ("sin", "cos", "log", "log2"):  # absolute error near their zeros
            errors[kind] = (np.abs(row - want) / np.maximum(np.abs(want), 1.0))[finite].max()
        else:
            errors[kind] = (np.abs(row - want) / np.maximum(np.abs(want), 1e-30))[finite].max()
    print("max errors:", {k: f"{v:.2e}" for k, v in errors.items()})
    limits = {"exp": 2e-5, "exp2": 1e-6, "rsqrt": 1e-6, "erf": 1e-6, "sin": 2e-6, "cos": 2e-6,
              "log": 1e-6, "log2": 1e-6}
    assert all(errors[k] <= limits[k] for k in errors), errors


def test_integer_division_truncates_like_c():
    layout = blocked_1d(256, 2)
    kb = KernelBuilder("int_division")
    a_ptr, b_ptr, out = (kb.param(PointerType(i32), n) for n in ("a", "b", "out"))
    offs = kb.add(ir.Arange, tensor((256,), i32, layout), start=0, end=256)
    a = kb.add(Load, tensor((256,), i32, layout), pointer=kb.pointers(a_ptr, offs))
    b = kb.add(Load, tensor((256,), i32, layout), pointer=kb.pointers(b_ptr, offs))
    one = kb.full(1, i32, a.type)
    for index, kind in enumerate(("div", "floordiv", "mod", "shr", "max")):
        shifted = kb.binary("add", offs, kb.splat(kb.add(ir.Constant, i32, value=index * 256), offs.type))
        result = kb.add(Binary, a.type, kind=kind, lhs=a, rhs=one if kind == "shr" else b)
        kb.add(Store, pointer=kb.pointers(out, shifted), value=result)
    a_host = RNG.integers(-1000, 1000, 256).astype(np.int32)
    b_host = RNG.integers(1, 30, 256).astype(np.int32) * RNG.choice([-1, 1], 256).astype(np.int32)
    *_, got = launch(kb.build(param_divisibility=(16, 16, 16)), [a_host, b_host, np.zeros(5 * 256, np.int32)])
    got = got.reshape(5, 256)
    quotient = np.trunc(a_host / b_host).astype(np.int32)
    np.testing.assert_array_equal(got[0], quotient)
    np.testing.assert_array_equal(got[1], quotient)
    np.testing.assert_array_equal(got[2], np.fmod(a_host, b_host))
    np.testing.assert_array_equal(got[3], a_host >> 1)
    np.testing.assert_array_equal(got[4], np.maximum(a_host, b_host))


def test_casts_round_trip():
    from weft.compiler.types import ScalarType, bf16, i8, u8

    targets = [fp16, bf16, ScalarType("fp8e4m3"), ScalarType("fp8e5m2"), i32, i8, u8, i64]
    layout = blocked_1d(256, 2)
    kb = KernelBuilder("casts")
    x, out = kb.param(PointerType(fp32), "x"), kb.param(PointerType(fp32), "out")
    offs = kb.add(ir.Arange, tensor((256,), i32, layout), start=0, end=256)
    value = kb.add(Load, tensor((256,), fp32, layout), pointer=kb.pointers(x, offs))
    for index, target in enumerate(targets):
        there = kb.add(Cast, tensor((256,), target, layout), operand=value)
        back = kb.add(Cast, value.type, operand=there)
        shifted = kb.binary("add", offs, kb.splat(kb.add(ir.Constant, i32, value=index * 256), offs.type))
        kb.add(Store, pointer=kb.pointers(out, shifted), value=back)
    host = np.concatenate([[0.0, 1.0, -2.5, 448.0, 1e6, -1e6, 0.3, 100.7, 57344.0, 3.0]],
                          axis=None).astype(np.float32)
    host = np.resize(host, 256).astype(np.float32)
    _, got = launch(kb.build(param_divisibility=(16, 16)), [host, np.zeros(len(targets) * 256, np.float32)])
    got = got.reshape(len(targets), 256)[:, :10]
    with np.errstate(over="ignore"):  # 1e6 is inf in fp16, on both sides
        np.testing.assert_array_equal(got[0], host[:10].astype(np.float16).astype(np.float32))
    bf = (host[:10].view(np.uint32) + 0x7FFF + ((host[:10].view(np.uint32) >> 16) & 1)) & 0xFFFF0000
    np.testing.assert_array_equal(got[1], bf.astype(np.uint32).view(np.float32))
    np.testing.assert_array_equal(got[2][:5], [0.0, 1.0, -2.5, 448.0, 448.0])  # e4m3 saturates at 448
    np.testing.assert_array_equal(got[3][:4], [0.0, 1.0, -2.5, 448.0])
    assert got[3][8] == 57344.0 and got[3][4] == 57344.0  # e5m2 saturates at 57344
    np.testing.assert_array_equal(got[4][:4], [0, 1, -2, 448])  # truncation toward zero
    assert got[5][1] == 1.0 and got[5][2] == -2.0 and got[6][7] == 100.0
    np.testing.assert_array_equal(got[7][:6], [0, 1, -2, 448, 1e6, -1e6])


def test_masked_loads_with_other_and_booleans():
    from weft.compiler.types import i1

    layout = blocked_1d(1024, 8)  # 8 fp16 per thread: one 128-bit access
    kb = KernelBuilder("masked_other")
    x, flags, out, bools, n = (kb.param(PointerType(fp16), "x"), kb.param(PointerType(i1), "flags"),
                               kb.param(PointerType(fp16), "out"), kb.param(PointerType(i1), "bools"),
                               kb.param(i32, "n"))
    offs = kb.add(ir.Arange, tensor((1024,), i32, layout), start=0, end=1024)
    mask = kb.add(ir.Compare, tensor((1024,), i1, layout), predicate="lt", lhs=offs, rhs=kb.splat(n, offs.type))
    other = kb.full(-3.0, fp16, offs.type)
    value = kb.add(Load, tensor((1024,), fp16, layout), pointer=kb.pointers(x, offs), mask=mask, other=other)
    flag = kb.add(Load, tensor((1024,), i1, layout), pointer=kb.pointers(flags, offs))
    chosen = kb.add(ir.Where, value.type, condition=flag, true_value=value, false_value=kb.full(7.0, fp16, offs.type))
    kb.add(Store, pointer=kb.pointers(out, offs), value=chosen)
    kb.add(Store, pointer=kb.pointers(bools, offs), value=kb.add(ir.Unary, flag.type, kind="not", operand=flag))
    host = RNG.standard_normal(1024).astype(np.float16)
    host_flags = RNG.integers(0, 2, 1024).astype(np.bool_)
    _, _, got, got_bools = launch(kb.build(param_divisibility=(16, 16, 16, 16, 16)),
                                  [host, host_flags, np.zeros(1024, np.float16), np.zeros(1024, np.bool_), 704])
    expected = np.where(np.arange(1024) < 704, host, np.float16(-3.0))
    np.testing.assert_array_equal(got, np.where(host_flags, expected, np.float16(7.0)))
    np.testing.assert_array_equal(got_bools, ~host_flags)


def test_print_shows_each_element_with_its_coordinates(capfd):
    layout = blocked_1d(128, 1)
    kb = KernelBuilder("printing")
    x = kb.param(PointerType(fp32), "x")
    offs = kb.add(ir.Arange, tensor((128,), i32, layout), start=0, end=128)
    value = kb.add(Load, tensor((128,), fp32, layout), pointer=kb.pointers(x, offs))
    kb.add(ir.DevicePrint, prefix="x", values=(value,))
    launch(kb.build(param_divisibility=(16,)), [np.arange(128, dtype=np.float32) * 0.5])
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("pid")]
    assert len(lines) == 128
    assert "pid (0, 0, 0) idx (3) x: 1.500000" in lines
