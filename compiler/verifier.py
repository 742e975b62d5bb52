"""The IR verifier: run between passes in tests and under WEFT_VERIFY / WEFT_DEBUG.

It checks what every later stage assumes: values are defined before use and in scope,
elementwise ops agree on shape and layout, shape ops carry the layout their rule gives,
region yields match the values they feed, per-warp branches hold register arithmetic (and
in-warp reductions) only, and shared-memory allocations fit.
A failure is a compiler bug (or a hand-built IR mistake), reported with the op's location.
"""

from __future__ import annotations

from ..layouts import LayoutError
from . import layout_rules
from .errors import CompilationError
from .ir import (ATOMIC_KINDS, ATOMICS, MEMORY_SCOPES, MEMORY_SEMANTICS, AddPtr, AtomicRMW, BarrierAny,
                 Binary, Block, Broadcast, Cast, Compare, Condition, Constant, ExpandDims, Fma, For, If, Kernel,
                 Load, Op, Permute, Reduce, Reshape, Select, Splat, Store, Unary, Value, WarpAny, While, Yield,
                 first_non_register_op)
from .types import TensorType, element_of, i1

_ELEMENTWISE = (Binary, Unary, Compare, Fma, Select, Cast, AddPtr, Load, Store, Splat, Constant) + ATOMICS


class VerificationError(CompilationError):
    pass


def _fail(op: Op, message: str):
    raise VerificationError(f"invalid IR at {op.NAME}: {message}", op.loc)


def _check_elementwise(op: Op) -> None:
    tensors = [v for v in op.uses() + op.defines() if isinstance(v.type, TensorType)]
    if not tensors:
        return
    first = tensors[0].type
    for value in tensors[1:]:
        if value.type.shape != first.shape:
            _fail(op, f"shapes differ: {list(first.shape)} and {list(value.type.shape)}")
        if value.type.layout != first.layout:
            _fail(op, "operands and result have different layouts")
    scalars = [v for v in op.uses() if not isinstance(v.type, TensorType)]
    if isinstance(op, (Load, Store, AddPtr)) and scalars and op.defines() and isinstance(op.defines()[0].type, TensorType):
        _fail(op, "mixes scalar and tensor operands; splat the scalar first")
    if isinstance(op, ATOMICS) and scalars and isinstance(op.pointer.type, TensorType):
        _fail(op, "mixes scalar and tensor operands; splat the scalar first")


def _check_unary(op: Unary) -> None:
    if op.fma_share and (op.kind != "exp2" or not 0 <= op.fma_share <= 1):
        _fail(op, f"fma_share={op.fma_share} is for exp2 only, in [0, 1]; found it on {op.kind}")


def _check_per_warp_if(op: If) -> None:
    if not isinstance(op.condition.type, TensorType) or op.condition.type.element != i1:
        _fail(op, f"a per-warp if branches on a boolean tensor (a warp_any result), found {op.condition.type}")
    for result in op.results:
        if not isinstance(result.type, TensorType):
            _fail(op, f"a per-warp if merges tensors only, found {result.type}")
    inner = first_non_register_op((op.then_body, op.else_body))
    if inner is not None:
        _fail(inner, "is in a per-warp if, which holds register arithmetic (and in-warp reductions) only")


def _check_atomic(op: Op) -> None:
    if isinstance(op, AtomicRMW) and op.kind not in ATOMIC_KINDS:
        _fail(op, f"unknown kind {op.kind!r}")
    if op.sem not in MEMORY_SEMANTICS or op.scope not in MEMORY_SCOPES:
        _fail(op, f"unknown sem {op.sem!r} or scope {op.scope!r}")


def _check_shape_op(op: Op) -> None:
    src, dst = op.operand.type, op.result.type
    if isinstance(op, Reduce):
        _check_reduction_plan(op)
    if isinstance(op, Reduce) and not isinstance(dst, TensorType):
        if src.rank != 1:
            _fail(op, f"reducing a rank-{src.rank} tensor gives a tensor, not a scalar")
        return
    if src.layout is None or dst.layout is None:
        return
    try:
        if isinstance(op, ExpandDims):
            expected = layout_rules.expand_dims_layout(src.layout, op.axis)
        elif isinstance(op, Permute):
            expected = layout_rules.permute_layout(src.layout, op.order)
        elif isinstance(op, Reshape):
            expected = layout_rules.reshape_layout(src.layout, dst.shape)
        elif isinstance(op, Reduce):
            expected = layout_rules.reduce_layout(src.layout, op.axis)
        else:
            layout_rules.broadcast_register_map(src.layout, dst.layout)
            return
    except LayoutError as error:
        _fail(op, str(error))
    if _strip(expected) != _strip(dst.layout):
        _fail(op, f"result layout should be {expected}, found {dst.layout}")


def _check_reduction_plan(op: Reduce) -> None:
    """A recorded plan (the verifier runs before planning too) is for this op's axis and
    gives its result layout."""
    plan = op.plan
    if plan is None:
        return
    if plan.axis != op.axis:
        _fail(op, f"its plan reduces axis {plan.axis}, the op axis {op.axis}")
    if isinstance(op.result.type, TensorType) and op.result.type.layout is not None \
            and _strip(plan.result_layout) != _strip(op.result.type.layout):
        _fail(op, f"its plan gives the result layout {plan.result_layout}, found {op.result.type.layout}")


def _strip(layout):
    """Compare layouts without caring whether an empty `block` dim is listed."""
    bases = {k: v for k, v in layout.bases.items() if v or k != "block"}
    return (tuple(sorted(bases.items())), tuple(layout.out_dims.items()))


def _check_yield(op: Op, block: Block, expected: tuple[Value, ...], what: str) -> None:
    terminator = block.ops[-1] if block.ops else None
    if not isinstance(terminator, (Yield, Condition)):
        _fail(op, f"{what} does not end with yield")
    values = terminator.values
    if len(values) != len(expected):
        _fail(op, f"{what} yields {len(values)} values for {len(expected)}")
    for got, want in zip(values, expected):
        if got.type != want.type:
            _fail(op, f"{what} yields {got.type} where {want.type} is carried")


def _verify_block(block: Block, scope: set) -> None:
    scope = set(scope) | set(block.args)
    for op in block.ops:
        for value in op.uses():
            if value not in scope:
                _fail(op, f"uses {value!r} before it is defined (or outside its scope)")
        if isinstance(op, _ELEMENTWISE):
            _check_elementwise(op)
        elif isinstance(op, (ExpandDims, Permute, Reshape, Reduce, Broadcast)):
            _check_shape_op(op)
        if isinstance(op, ATOMICS):
            _check_atomic(op)
        if isinstance(op, Unary):
            _check_unary(op)
        if isinstance(op, For):
            _check_yield(op, op.body, op.results, "loop body")
            for init, arg in zip(op.inits, op.body.args[1:]):
                if init.type != arg.type:
                    _fail(op, f"loop-carried value starts as {init.type} but the body takes {arg.type}")
        elif isinstance(op, If):
            if op.results:
                _check_yield(op, op.then_body, op.results, "then branch")
                _check_yield(op, op.else_body, op.results, "else branch")
            if op.per_warp:
                _check_per_warp_if(op)
        elif isinstance(op, BarrierAny):
            if element_of(op.operand.type) != i1 or op.result.type != i1:
                _fail(op, f"takes a boolean tensor or scalar to an i1, found {op.operand.type} -> {op.result.type}")
        elif isinstance(op, WarpAny):
            if not isinstance(op.operand.type, TensorType) or op.operand.type.element != i1 \
                    or op.result.type != op.operand.type:
                _fail(op, f"takes a boolean tensor to one of its type, found {op.operand.type} -> {op.result.type}")
        elif isinstance(op, While):
            _check_yield(op, op.after, op.inits, "while body")
        for region in op.nested_blocks():
            _verify_block(region, scope)
        scope.update(op.defines())


def verify(kernel: Kernel) -> Kernel:
    """Raise VerificationError on the first problem; return the kernel unchanged."""
    _verify_block(kernel.body, set(kernel.params))
    return kernel
