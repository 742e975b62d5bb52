"""lower_reduce: the in-thread fold is a balanced tree (depth ceil(log2 n), not n - 1).

Three views of the same tree: its shape (`fold_tree` on tuples), the dependency depth of
the combines in a kernel's LLVM IR, and the values of the real LLVM combines, run on the
host by llvmlite's JIT for any register count (odd ones included, which no layout makes),
against numpy. The GPU runs the whole reduction in `test_tree_reduction_on_gpu` (marked
`gpu`).
"""

from __future__ import annotations

import ctypes
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

from weft.compiler.backend import lower_to_llvm
from weft.compiler.backend.lower_reduce import _Combiner, fold_tree
from weft.compiler.types import fp32, i32

from .backend_kernels import prepare, row_reduce

KINDS = ["sum", "max", "min", "argmax", "argmin"]


def _depth(tree) -> int:
    return 0 if not isinstance(tree, tuple) else 1 + max(_depth(tree[0]), _depth(tree[1]))


def _leaves(tree) -> list:
    return [tree] if not isinstance(tree, tuple) else _leaves(tree[0]) + _leaves(tree[1])


@pytest.mark.parametrize("n", range(1, 34))
def test_fold_tree_is_balanced_and_keeps_operand_order(n):
    tree = fold_tree(list(range(n)), lambda a, b: (a, b))
    assert _depth(tree) == math.ceil(math.log2(n))
    assert _leaves(tree) == list(range(n))


# ----------------------------------------------------------------- LLVM IR depth
_COMBINE = {"sum": r"fadd", "max": r"call float @\"llvm\.maxnum", "min": r"call float @\"llvm\.minnum",
            "argmax": r"select\s+i1 %\S+, float", "argmin": r"select\s+i1 %\S+, float"}


def combine_depth(llir: str, combine: str) -> int:
    """Longest SSA path counted in instructions matching `combine` (others pass through)."""
    depth: dict[str, int] = {}
    for line in llir.splitlines():
        match = re.match(r'\s*(%"?[\w.]+"?) = (.*)', line)
        if match:
            rest = match.group(2)
            below = max((depth.get(name, 0) for name in re.findall(r'%"?[\w.]+"?', rest)), default=0)
            depth[match.group(1)] = below + (1 if re.match(combine, rest) else 0)
    return max(depth.values())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_thread", [8, 32])
def test_in_thread_fold_has_logarithmic_depth(kind, per_thread):
    # Warps split the rows, so a row is per_thread registers in each of 32 lanes:
    # log2(per_thread) tree levels, then one combine per lane butterfly step.
    kernel = row_reduce(kind, rows=4, cols=32 * per_thread, warps=(4, 1), per_thread=(1, per_thread),
                        out_element=i32 if kind.startswith("arg") else None)
    llir = lower_to_llvm(prepare(kernel))
    assert combine_depth(llir, _COMBINE[kind]) == int(math.log2(per_thread)) + 5


# ------------------------------------------------- the LLVM combines, run on the host
def _fold_function(kind: str, n: int) -> str:
    """LLVM IR of `fold(float* x) -> float or i32`: the tree over x[0..n) with index i."""
    module = ir.Module("fold")
    result = ir.IntType(32) if kind.startswith("arg") else ir.FloatType()
    function = ir.Function(module, ir.FunctionType(result, [ir.PointerType(ir.FloatType())]), "fold")
    builder = ir.IRBuilder(function.append_basic_block())

    def intrinsic(name, return_type, args):
        callee = module.globals.get(name) or ir.Function(
            module, ir.FunctionType(return_type, [a.type for a in args]), name)
        return builder.call(callee, list(args))

    combine = _Combiner(SimpleNamespace(builder=builder, intrinsic=intrinsic), kind, fp32)
    values = []
    for i in range(n):
        value = builder.load(builder.gep(function.args[0], [ir.Constant(ir.IntType(32), i)]))
        values.append((value, ir.Constant(ir.IntType(32), i)) if combine.with_index else (value,))
    total = fold_tree(values, combine)
    builder.ret(total[1] if combine.with_index else total[0])
    return str(module)


@pytest.fixture(scope="module")
def host_jit():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
    return engine


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 13, 31, 33])
def test_tree_of_llvm_combines_matches_numpy(host_jit, kind, n):
    module = llvm.parse_assembly(_fold_function(kind, n))
    module.verify()
    host_jit.add_module(module)
    try:
        host_jit.finalize_object()
        restype = ctypes.c_int32 if kind.startswith("arg") else ctypes.c_float
        fold = ctypes.CFUNCTYPE(restype, ctypes.POINTER(ctypes.c_float))(host_jit.get_function_address("fold"))
        rng = np.random.default_rng(n)
        for trial in range(20):
            x = rng.integers(-4, 5, n).astype(np.float32)  # small integers: many ties, exact sums
            if trial % 2:
                x = rng.standard_normal(n).astype(np.float32)
            got = fold(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
            expected = getattr(np, kind)(x)
            if kind == "sum":
                assert got == pytest.approx(float(expected), rel=1e-5, abs=1e-5)
            else:
                assert got == expected, (x, got, expected)  # argmax/argmin: the first index wins
    finally:
        host_jit.remove_module(module)


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_thread", [8, 32])
def test_tree_reduction_on_gpu(kind, per_thread):
    from .test_backend_gpu import launch

    rows, cols = 4, 32 * per_thread
    rng = np.random.default_rng(per_thread)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[0, 1] = x[0, per_thread - 1] = 9.0  # a tie inside one thread's registers
    x[1, 2] = x[1, cols - 1] = -9.0  # a tie across lanes
    x[2] = rng.integers(-3, 4, cols)  # many ties
    out_type = np.int32 if kind.startswith("arg") else np.float32
    kernel = row_reduce(kind, rows=rows, cols=cols, warps=(4, 1), per_thread=(1, per_thread),
                        out_element=i32 if kind.startswith("arg") else None)
    _, got = launch(kernel, [x, np.zeros(rows, out_type), cols])
    expected = getattr(np, kind)(x, axis=1)
    if kind == "sum":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, expected.astype(out_type))
