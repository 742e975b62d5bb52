"""`tl.math`: Triton's math namespace, for the functions weft provides.

The same ops as the top-level names (`tl.math.exp is tl.exp`), plus the few that Triton
keeps here only: `umulhi`, `div_rn`, `fdiv` and `sqrt_rn`. weft's `/` on floats already
rounds to nearest (div.rn), so `div_rn` is `/`; `sqrt` is Triton's approximate one
(sqrt.approx.ftz.f32, what libdevice gives it), `sqrt_rn` rounds to nearest (sqrt.rn).

Precision is Triton's: log, sin, cos, erf and pow (and the fp64 functions) are libdevice's,
linked and inlined as Triton does (compiler/backend/lower_math.py lists which functions
use the hardware's approximations instead). The CPU emulator computes them with numpy:
within a few ulps of libdevice (tests/compiler/test_libdevice.py holds the bound), not
bit for bit.
"""

from __future__ import annotations

from typing import Any

from ..compiler.builder import builtin
from ..compiler.types import u32, u64
from ..lowlevel import semantic as ll_sem
from . import semantic as sem
from ..lowlevel.builtins import sqrt as sqrt_rn
from .builtins import abs, ceil, cos, erf, exp, exp2, floor, fma, log, log2, rsqrt, sin, sqrt

__all__ = ["abs", "ceil", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2",
           "rsqrt", "sin", "sqrt", "sqrt_rn", "umulhi"]


@builtin
def umulhi(x: Any, y: Any):
    """The high 32 bits of the 64-bit product of two 32-bit integers, read as unsigned
    (PTX mul.hi.u32); the result keeps the operands' (promoted) type."""
    b = sem.builder()
    element = ll_sem.promote(ll_sem.operand_element(x, [y]), ll_sem.operand_element(y, [x]), "mul", "umulhi")
    if element.is_float or element.is_bool or element.bits != 32:
        raise b.error(f"umulhi needs 32-bit integer operands, found {sem.describe(x)} and {sem.describe(y)}",
                      suggestion="convert with .to(tl.uint32) (64-bit operands are not supported)")
    x, y = sem.broadcast_all(ll_sem.to_value(x, element), ll_sem.to_value(y, element), what="umulhi")

    def widened(v):
        return ll_sem.cast(ll_sem.cast(ll_sem.cast(v, element), u32, bitcast=True), u64)

    high = ll_sem.binary("shr", ll_sem.binary("mul", widened(x), widened(y), "*"), 32, ">>")
    return ll_sem.cast(ll_sem.cast(high, u32), element, bitcast=True)


@builtin
def div_rn(x: Any, y: Any):
    """x / y rounded to nearest (what `/` does on floats)."""
    return x / y


@builtin
def fdiv(x: Any, y: Any, ieee_rounding: bool = False):
    """x / y; weft always rounds to nearest, so `ieee_rounding` changes nothing."""
    return x / y
