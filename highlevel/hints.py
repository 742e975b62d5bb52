"""Loop scheduling keywords and compiler hints, with Triton's names: `tl.range(...,
num_stages=, warp_specialize=, ...)`, `tl.multiple_of`, `tl.max_contiguous`,
`tl.max_constancy` and `tl.assume`.

The loop keywords are checked here and recorded on the loop (`ir.LoopSchedule`) for the
pipelining passes. The axis hints become `axis_hint` ops that axis analysis reads, so a
promised alignment or contiguity widens loads and stores as Triton's does.
"""

from __future__ import annotations

import builtins as py
from typing import Any, Optional

from ..compiler import ir
from ..compiler.builder import builtin, dynamic_range
from ..compiler.types import PointerType, TensorType
from ..lowlevel import semantic as ll_sem
from . import semantic as sem


class range(dynamic_range):
    """`for i in tl.range(start, stop, step, num_stages=..., ...)`: a runtime loop whose
    keywords tell the pipelining passes what the user wants (Triton's `tl.range`):

    - num_stages: loads of the loop pipelined over this many stages (0 or 1: none);
    - warp_specialize: producer and consumer warps split for this loop (True), or kept
      together (False); not given, weft splits descriptor dot loops where it pays: large
      matmul rings, attention's two-dot loops at head_dim 128 with 8 warps
      (compiler/passes/pipeline_tma_warp_specialize.py);
    - flatten: the loop flattened with the loop nested in it;
    - loop_unroll_factor: the body unrolled this many times;
    - disallow_acc_multi_buffer: a dot's accumulator is not double-buffered.
    Every keyword is a compile-time value."""

    def __init__(self, start, stop=None, step=None, num_stages: Optional[int] = None,
                 loop_unroll_factor: Optional[int] = None, disallow_acc_multi_buffer: bool = False,
                 flatten: bool = False, warp_specialize: Optional[bool] = None, disable_licm: bool = False):
        super().__init__(start, stop, 1 if step is None else step)
        self.schedule = ir.LoopSchedule(
            num_stages=_count(num_stages, "num_stages", minimum=0),
            warp_specialize=None if warp_specialize is None else _flag(warp_specialize, "warp_specialize"),
            flatten=_flag(flatten, "flatten"),
            loop_unroll_factor=_count(loop_unroll_factor, "loop_unroll_factor", minimum=1),
            disallow_acc_multi_buffer=_flag(disallow_acc_multi_buffer, "disallow_acc_multi_buffer"))
        _flag(disable_licm, "disable_licm")  # accepted: weft hoists nothing out of loops yet


def _count(value: Any, name: str, minimum: int) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, py.bool) or not isinstance(value, py.int) or value < minimum:
        raise sem.builder().error(f"tl.range({name}=...) takes a compile-time int >= {minimum}, "
                                  f"found {sem.describe(value)}",
                                  suggestion=f"pass a number, or a constexpr parameter ({name}: tl.constexpr)")
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, py.bool):
        raise sem.builder().error(f"tl.range({name}=...) takes True or False, found {sem.describe(value)}",
                                  suggestion="pass a compile-time bool")
    return value


def _hint(kind: str, x: Any, values: Any):
    b = sem.builder()
    if not ll_sem.is_value(x):
        raise b.error(f"{kind} needs a tensor or a scalar value, found {sem.describe(x)}")
    element = ll_sem.element_of(x.type)
    if not isinstance(element, PointerType) and not element.is_int:
        raise b.error(f"{kind} describes integers or pointers, found {sem.describe(x)}")
    if isinstance(values, (py.int, py.bool)):
        values = (values,)
    rank = len(x.type.shape) if isinstance(x.type, TensorType) else 1
    if not isinstance(values, (tuple, list)) or len(values) != rank or \
            any(isinstance(v, py.bool) or not isinstance(v, py.int) or v < 1 for v in values):
        raise b.error(f"{kind}({sem.describe(x)}, {values!r}): expected {rank} positive compile-time "
                      f"int{'s' if rank > 1 else ''}, one per dim")
    return b.wrap(b.create(ir.AxisHint, x.type, operand=x.handle, kind=kind, values=tuple(values)))


@builtin
def multiple_of(input: Any, values: Any):
    """`input`, with the promise that its values are multiples of `values` (one per dim;
    for pointers the address in bytes, as in Triton)."""
    return _hint("multiple_of", input, values)


@builtin
def max_contiguous(input: Any, values: Any):
    """`input`, with the promise that along each dim its values run in steps of +1 over
    groups of `values[d]` elements."""
    return _hint("max_contiguous", input, values)


@builtin
def max_constancy(input: Any, values: Any):
    """`input`, with the promise that along each dim its values stay equal over groups of
    `values[d]` elements."""
    return _hint("max_constancy", input, values)


@builtin
def assume(cond: Any):
    """Accepted as Triton's `tl.assume(cond)`: a condition the compiler may rely on. weft
    checks it is a boolean (a constant False is an error) and otherwise does not use it yet."""
    b = sem.builder()
    if not ll_sem.is_value(cond):
        if not cond:
            raise b.error(f"tl.assume({cond!r}): the assumption is false at compile time")
        return None
    element = ll_sem.element_of(cond.type)
    if isinstance(element, PointerType) or not element.is_bool:
        raise b.error(f"tl.assume needs a condition (a comparison), found {sem.describe(cond)}",
                      suggestion="write the assumption as a comparison, e.g. tl.assume(n > 0)")
    return None
