"""libdevice linked where math calls it, as Triton does (compiler/backend/target.py,
lower_math.py): the PTX carries libdevice's code inlined (no external symbol; ptxas
assembles it), fp64 math compiles, kernels without such calls are not touched, and the
emulator's numpy math stays within a few ulps of the float64 truth (it is not libdevice bit
for bit; libdevice itself is within 1-2 ulps of it for these functions).
"""

import math

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.backend import target

from ..highlevel._compile import ptx_through_ptxas

RNG = np.random.default_rng(7)
# Emulator (numpy) against float64 references, in units of the result type's last place.
EMULATED_ULPS = {np.float32: 4, np.float64: 4}


@tl.jit
def apply_math(x_ptr, y_ptr, out_ptr, KIND: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    if KIND == "log":
        r = tl.log(x)
    elif KIND == "sin":
        r = tl.sin(x)
    elif KIND == "cos":
        r = tl.cos(x)
    elif KIND == "erf":
        r = tl.erf(x)
    elif KIND == "exp":
        r = tl.exp(x)
    elif KIND == "log2":
        r = tl.log2(x)
    elif KIND == "pow":
        r = x ** y
    else:
        r = tl.sqrt(x) + tl.exp2(y)
    tl.store(out_ptr + offs, r)


def _ptx(kind: str, dtype: str) -> str:
    signature = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "out_ptr": f"*{dtype}"}
    return ptx_through_ptxas(apply_math, signature, {"KIND": kind, "N": 256}, num_warps=4)


def test_log_carries_libdevices_code_inlined():
    ptx = _ptx("log", "fp32")
    assert "__nv_" not in ptx and ".extern" not in ptx and "call" not in ptx
    assert "lg2.approx" not in ptx  # libdevice's logf is a polynomial, not the exp-unit log
    assert "fma.rn.ftz.f32" in ptx  # its flush-to-zero path: Triton's reflect flag


def test_sin_reduces_large_arguments_by_payne_hanek():
    ptx = _ptx("sin", "fp32")
    assert "sin.approx" not in ptx and ".local" in ptx  # the reduction's 2/pi bits on the stack


@pytest.mark.parametrize("kind", ["exp", "log", "log2", "sin", "cos", "erf", "pow", "fast"])
def test_fp64_math_compiles_through_libdevice(kind):
    ptx = _ptx(kind, "fp64")
    assert "__nv_" not in ptx and ".extern" not in ptx


def test_kernels_without_libdevice_calls_are_not_linked():
    compiled = apply_math.compile(signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32"},
                                  constexprs={"KIND": "fast", "N": 256}, num_warps=4)
    assert not target.calls_libdevice(compiled.asm["llir"])
    ptx = compiled.asm["ptx"]
    assert "sqrt.approx.ftz.f32" in ptx and "ex2.approx.ftz.f32" in ptx and ".local" not in ptx


def _inputs(kind: str, dtype, n: int):
    if kind == "log":
        x = np.exp(RNG.uniform(-80, 80, n))
    elif kind in ("sin", "cos"):
        x = RNG.uniform(-200, 200, n)
    elif kind == "erf":
        x = RNG.uniform(-4, 4, n)
    else:  # pow
        x = RNG.uniform(0.01, 10, n)
    return x.astype(dtype), RNG.uniform(-4, 4, n).astype(dtype)


REFERENCES = {"log": lambda x, y: np.log(x), "sin": lambda x, y: np.sin(x), "cos": lambda x, y: np.cos(x),
              "erf": lambda x, y: np.vectorize(math.erf)(x), "pow": lambda x, y: np.power(x, y)}


def _ulps(got: np.ndarray, reference: np.ndarray, dtype) -> np.ndarray:
    spacing = np.spacing(np.abs(reference).astype(dtype)).astype(np.float64)
    return np.abs(got.astype(np.float64) - reference) / spacing


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", sorted(REFERENCES))
def test_emulated_math_is_within_a_few_ulps(kind, dtype):
    n = 1024
    x, y = _inputs(kind, dtype, n)
    out = np.zeros(n, dtype)
    apply_math[(1,)](x, y, out, KIND=kind, N=n)
    reference = REFERENCES[kind](x.astype(np.float64), y.astype(np.float64))
    assert _ulps(out, reference, dtype).max() <= EMULATED_ULPS[dtype]
