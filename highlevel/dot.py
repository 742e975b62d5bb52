"""`tl.dot`: the matrix product of two tiles, with Triton's names, types and shape rules.

The op only records what was asked (`ir.Dot`); the accelerate_dots pass chooses how it
runs (wgmma on shared-memory operands, or multiply-and-sum tile ops for tiles too small
for the tensor cores). What no path can run is refused here, at the user's line.
"""

from __future__ import annotations

from typing import Any, Optional

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.types import ScalarType, TensorType, bf16, fp8e4m3, fp8e5m2, fp16, fp32, i8, i32
from ..lowlevel import semantic as ll_sem
from . import semantic as sem

_FP8 = (fp8e4m3, fp8e5m2)
# Output types each input type may ask for (Triton's rules; fp32 first: the default).
OUT_TYPES = {fp16: (fp32, fp16), bf16: (fp32,), fp32: (fp32,), fp8e4m3: (fp32, fp16),
             fp8e5m2: (fp32, fp16), i8: (i32,)}
PRECISIONS = ("tf32", "tf32x3", "ieee")
MIN_DIM = 16  # Triton's rule: every dim of a dot at least 16


def _name(t: ScalarType) -> str:
    return {fp16: "float16", bf16: "bfloat16", fp32: "float32", i8: "int8", i32: "int32",
            fp8e4m3: "float8e4nv", fp8e5m2: "float8e5"}.get(t, str(t))


def _check_operands(a: Any, b: Any) -> tuple[int, int, int]:
    bld = sem.builder()
    for name, x in (("a", a), ("b", b)):
        if not ll_sem.is_tensor(x):
            raise bld.error(f"dot {name} must be a 2-D tensor, found {sem.describe(x)}")
        if len(x.type.shape) == 3:
            raise bld.error(f"dot of 3-D (batched) tiles is not supported yet; found {name} {sem.describe(x)}",
                            suggestion="loop over the batch dim and dot one 2-D tile at a time")
        if len(x.type.shape) != 2:
            raise bld.error(f"dot {name} must be a 2-D tensor, found {sem.describe(x)}")
    (m, k), (k2, n) = a.type.shape, b.type.shape
    if k != k2:
        raise bld.error(f"dot shapes do not chain: a {list(a.type.shape)} @ b {list(b.type.shape)}",
                        expected="a [M, K] and b [K, N]")
    if min(m, n, k) < MIN_DIM:
        raise bld.error(f"dot needs every dim at least {MIN_DIM} (as Triton does), found M={m}, N={n}, K={k}",
                        suggestion="use larger blocks and mask the loads at the edges")
    at, bt = a.type.element, b.type.element
    if at not in OUT_TYPES or bt not in OUT_TYPES:
        bad = at if at not in OUT_TYPES else bt
        raise bld.error(f"dot takes float16, bfloat16, float32, float8e4nv/float8e5 or int8 tiles, found {bad}",
                        suggestion="convert first, e.g. x.to(tl.float16)")
    if at != bt and not (at in _FP8 and bt in _FP8):
        raise bld.error(f"dot operands must have one element type (fp8 may mix e4m3 and e5m2), "
                        f"found a {at} and b {bt}", suggestion=f"convert one: b.to(tl.{_name(at)})")
    if at.bits == 8 and k < 32:
        raise bld.error(f"a dot of 8-bit tiles needs K at least 32, found K={k}")
    return m, n, k


def _check_precision(input_precision: Any, element: ScalarType) -> str:
    """The precision recorded on the op: fp32 inputs only ("tf32" unless asked otherwise)."""
    bld = sem.builder()
    if input_precision is not None and input_precision not in PRECISIONS:
        raise bld.error(f"dot input_precision must be one of {', '.join(map(repr, PRECISIONS))}, "
                        f"found {input_precision!r}")
    if element != fp32:
        return ""
    return input_precision or "tf32"


@builtin
def dot(input: Any, other: Any, acc: Any = None, input_precision: Optional[str] = None,
        allow_tf32: Any = None, max_num_imprecise_acc: Optional[int] = None,
        out_dtype: ScalarType = fp32):
    """`input @ other` (+ `acc`), accumulated in `out_dtype` (float32; float16 for float16
    or fp8 inputs; int32 for int8). fp32 inputs use tf32 tensor cores unless
    `input_precision="ieee"` asks for exact fp32 products."""
    bld = sem.builder()
    a, b = input, other
    m, n, _ = _check_operands(a, b)
    element = a.type.element
    if allow_tf32 is not None:
        if input_precision is not None:
            raise bld.error("dot takes allow_tf32 or input_precision, not both",
                            suggestion="drop allow_tf32 (deprecated in Triton)")
        input_precision = "tf32" if allow_tf32 else "ieee"
    precision = _check_precision(input_precision, element)
    if element == i8 and out_dtype == fp32:
        out_dtype = i32  # Triton's default for integer tiles
    if not isinstance(out_dtype, ScalarType) or out_dtype not in OUT_TYPES[element]:
        allowed = " or ".join(f"tl.{_name(t)}" for t in OUT_TYPES[element])
        raise bld.error(f"dot of {element} tiles accumulates in {allowed}, not {out_dtype}",
                        suggestion=f"pass out_dtype={allowed.split(' or ')[0]}")
    if max_num_imprecise_acc is not None and element in _FP8:
        raise bld.error("dot max_num_imprecise_acc is not supported yet: fp8 products are summed in the "
                        "tensor cores' own precision over each dot's K", suggestion="leave it None")
    result_type = TensorType((m, n), out_dtype)
    if acc is not None:
        if not ll_sem.is_tensor(acc) or acc.type.shape != (m, n):
            raise bld.error(f"dot acc must be a [{m}, {n}] tensor, found {sem.describe(acc)}")
        if acc.type.element != out_dtype:
            raise bld.error(f"dot acc holds {acc.type.element} but the dot accumulates in {out_dtype}",
                            suggestion=f"pass out_dtype=tl.{_name(acc.type.element)}"
                            if acc.type.element in OUT_TYPES[element] else
                            f"make acc {out_dtype}: acc.to(tl.{_name(out_dtype)})")
    return bld.wrap(bld.create(ir.Dot, result_type, a=a.handle, b=b.handle,
                               acc=None if acc is None else acc.handle, input_precision=precision))
