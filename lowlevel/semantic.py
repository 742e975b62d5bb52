"""The rules every lowlevel op follows: numbers next to tensors, type promotion,
broadcasting, and "elementwise operands share one layout".

Promotion follows Triton: a Python number adopts the type of the value beside it (an int
next to a float tensor becomes that float; a float next to an int tensor is fp32); two
floats promote to the wider (fp16 with bf16 gives fp32); an int with a float gives the
float; two ints give the wider, unsigned when the widths tie. `/` on ints computes in fp32.

Broadcasting follows numpy on shapes: missing leading dims are added with expand_dims
(so the operand must be in a SliceLayout of dim 0), size-1 dims stretch with a Broadcast
whose result layout is the operand's own layout description at the new shape. After
broadcasting, tensor operands must have equal layouts; otherwise the error names both
and suggests `convert_layout`. Scalars (program ids, kernel arguments, numbers) are
splatted into the tensors' layout.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from ..compiler import ir
from ..layouts import rules as layout_rules
from ..compiler.builder import Builder, DynamicValue, current_builder
from ..compiler.types import (PointerType, ScalarType, TensorType, Type, fp32, fp64, i1, i32,
                              i64)
from ..layouts import LayoutError
from ..layouts import describe as describe_layout

Number = (bool, int, float)
Element = Union[ScalarType, PointerType]
BITWISE = ("and", "or", "xor", "shl", "shr")
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1


def builder() -> Builder:
    return current_builder()


def is_value(x: Any) -> bool:
    return isinstance(x, DynamicValue)


def element_of(type_: Type) -> Element:
    return type_.element if isinstance(type_, TensorType) else type_


def shape_of(x: Any) -> tuple[int, ...]:
    return x.type.shape if is_value(x) and isinstance(x.type, TensorType) else ()


def is_tensor(x: Any) -> bool:
    return is_value(x) and isinstance(x.type, TensorType)


def type_text(type_: Type) -> str:
    return str(type_)


def describe(x: Any) -> str:
    """A value in words: its type, and for a tensor the layout it is in."""
    if not is_value(x):
        return repr(x)
    if isinstance(x.type, TensorType):
        return f"{x.type} in {describe_layout(x.type.encoding, x.type.layout)}"
    return f"a scalar {x.type}"


# --------------------------------------------------------------------- numbers
def default_type(value: Any) -> ScalarType:
    """The type of a Python number on its own: bool i1, int i32 (i64 when it does not
    fit), float fp32."""
    if isinstance(value, bool):
        return i1
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return i32
        if -(1 << 63) <= value < (1 << 64):
            return i64
        raise builder().error(f"integer {value} does not fit in 64 bits")
    if isinstance(value, float):
        return fp32
    raise builder().error(f"expected a number or a tensor, found {value!r}")


def adopted_type(value: Any, other: Element) -> Element:
    """The type a Python number takes next to a value of element type `other`."""
    if isinstance(other, PointerType):
        return default_type(value)  # an offset
    if isinstance(value, float) and not isinstance(value, bool):
        return other if other.is_float else fp32
    if isinstance(value, bool):
        return other
    if other.is_float:
        return other
    if other.is_bool:
        return default_type(value)
    lo, hi = (0, (1 << other.bits) - 1) if not other.is_signed else \
        (-(1 << (other.bits - 1)), (1 << (other.bits - 1)) - 1)
    return other if lo <= value <= hi else default_type(value)


def constant(value: Any, type_: Type) -> DynamicValue:
    """A scalar constant, or a tensor (`type_` a TensorType) filled with `value`."""
    element = element_of(type_)
    if isinstance(element, PointerType):
        raise builder().error(f"cannot make a pointer from the number {value!r}")
    value = bool(value) if element.is_bool else (float(value) if element.is_float else int(value))
    b = builder()
    return b.wrap(b.create(ir.Constant, type_, value=value))


def to_value(x: Any, like: Optional[Element] = None) -> DynamicValue:
    """A dynamic value for `x`: itself, or a scalar constant for a Python number (of the
    type it adopts next to `like`)."""
    if is_value(x):
        return x
    if isinstance(x, Number):
        return constant(x, adopted_type(x, like) if like is not None else default_type(x))
    raise builder().error(f"expected a tensor or a number, found {x!r}")


def operand_element(x: Any, others: Sequence[Any]) -> Element:
    """The element type of `x`; a Python number adopts that of the first dynamic other."""
    if is_value(x):
        return element_of(x.type)
    for other in others:
        if is_value(other):
            return adopted_type(x, element_of(other.type))
    return default_type(x)


# ------------------------------------------------------------------- promotion
def promote(a: Element, b: Element, kind: str, symbol: str) -> Element:
    """The type both operands of `symbol` are converted to before computing."""
    if isinstance(a, PointerType) or isinstance(b, PointerType):
        if a == b and kind == "compare":
            return a
        raise builder().error(f"'{symbol}' is not defined for {a} and {b}",
                              suggestion="pointers support + and - with integer offsets")
    for t in (a, b):
        if t.name.startswith("fp8"):
            raise builder().error(f"'{symbol}' on {t}: fp8 values are storage only",
                                  suggestion="convert with .to(ll.float16) or .to(ll.float32) first")
    if a.is_float or b.is_float:
        if kind in BITWISE or kind == "floordiv":
            raise builder().error(f"'{symbol}' needs integer operands, found {a} and {b}",
                                  suggestion="convert with .to(ll.int32) first")
        if fp64 in (a, b):
            return fp64
        if fp32 in (a, b):
            return fp32
        floats = [t for t in (a, b) if t.is_float]
        return floats[0] if len(floats) == 1 or floats[0] == floats[1] else fp32
    if kind == "div":
        return fp32
    if a == b:
        return a
    if a.is_bool or b.is_bool:
        return b if a.is_bool else a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if not a.is_signed else b


# ---------------------------------------------------------------- conversions
def cast(x: DynamicValue, element: Element, bitcast: bool = False) -> DynamicValue:
    """`x` converted to `element` (same shape and layout); itself when already so."""
    source = element_of(x.type)
    if source == element:
        return x
    b = builder()
    result_type = x.type.with_element(element) if isinstance(x.type, TensorType) else element
    pointers = isinstance(source, PointerType), isinstance(element, PointerType)
    if pointers[0] != pointers[1]:
        integer = element if pointers[0] else source
        if integer.is_float or integer.is_bool or integer.bits != 64:
            raise b.error(f"cannot convert {source} to {element}",
                          suggestion="pointers convert only to other pointer types and to or from "
                                     "64-bit integers (.to(ll.int64) first)")
        return b.wrap(b.create(ir.Cast, result_type, operand=x.handle))  # the address bits, unchanged
    if bitcast or all(pointers):
        if not all(pointers) and source.bits != element.bits:
            raise b.error(f"bitcast needs equal widths: {source} has {source.bits} bits, "
                          f"{element} has {element.bits}")
        return b.wrap(b.create(ir.Bitcast, result_type, operand=x.handle))
    return b.wrap(b.create(ir.Cast, result_type, operand=x.handle))


def splat(x: DynamicValue, template: TensorType) -> DynamicValue:
    """A tensor of `template`'s shape and layout holding the scalar `x` everywhere."""
    b = builder()
    result_type = template.with_element(element_of(x.type))
    return b.wrap(b.create(ir.Splat, result_type, operand=x.handle))


def coerce(x: Any, element: Element, template: Optional[TensorType]) -> DynamicValue:
    """`x` as a value of `element`, splatted to `template` when given: numbers become
    constants of the final type directly."""
    if not is_value(x):
        return constant(x, template.with_element(element) if template else element)
    x = cast(x, element)
    if template is not None and not isinstance(x.type, TensorType):
        x = splat(x, template)
    return x


# ---------------------------------------------------------------- broadcasting
def expand_dims(x: DynamicValue, axis: int) -> DynamicValue:
    """A size-1 dim inserted at `axis`; `x` must be in SliceLayout(axis, parent), and the
    result is in `parent` (no data moves)."""
    b = builder()
    if not is_tensor(x):
        raise b.error("expand_dims needs a tensor, found " + describe(x))
    rank = len(x.type.shape)
    if not isinstance(axis, int) or not -rank - 1 <= axis <= rank:
        raise b.error(f"expand_dims axis {axis!r} is out of range for a rank-{rank} tensor")
    axis = axis + rank + 1 if axis < 0 else axis
    parent = x.type.encoding.expanded(axis) if x.type.encoding is not None else None
    if parent is None:
        raise b.error(
            f"expand_dims at axis {axis} needs a tensor in SliceLayout(dim={axis}, parent=...)",
            expected=f"SliceLayout(dim={axis}, parent=<the layout of the result>)",
            found=describe(x),
            suggestion=f"build the tensor in SliceLayout({axis}, parent) (e.g. ll.arange(..., "
                       f"layout=ll.SliceLayout({axis}, parent))), or ll.convert_layout it there")
    layout = layout_rules.expand_dims_layout(x.type.layout, axis)
    shape = x.type.shape[:axis] + (1,) + x.type.shape[axis:]
    result_type = TensorType(shape, x.type.element, layout, parent)
    return b.wrap(b.create(ir.ExpandDims, result_type, operand=x.handle, axis=axis))


def broadcast_to(x: DynamicValue, shape: tuple[int, ...]) -> DynamicValue:
    """`x` with its size-1 dims stretched to `shape`, in its own layout description.

    Also used at equal shapes: an expand_dims result can hold fewer registers than its
    description gives for that shape (when the description repeats an element in two
    registers), and a register gather brings it to the description's layout.
    """
    encoding = x.type.encoding
    if x.type.shape == shape and (encoding is None or _same_layout(encoding, x.type.layout, shape)):
        return x
    b = builder()
    try:
        if encoding is None:
            raise LayoutError("the tensor has no layout description")
        layout = encoding.to_linear(shape)
        layout_rules.broadcast_register_map(x.type.layout, layout)
    except LayoutError as error:
        raise b.error(f"cannot broadcast {describe(x)} to shape {list(shape)}: {error}",
                      suggestion="convert the operand to a layout whose threads already hold "
                                 "the rows/columns being stretched (ll.convert_layout)")
    result_type = TensorType(shape, x.type.element, layout, encoding)
    return b.wrap(b.create(ir.Broadcast, result_type, operand=x.handle))


def _same_layout(encoding, layout, shape) -> bool:
    try:
        return encoding.to_linear(shape) == layout
    except LayoutError:
        return True  # not this function's problem: the op using the tensor reports it


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    result = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise builder().error(f"{what}: shapes {list(a)} and {list(b)} do not broadcast "
                                  f"(sizes {x} and {y} differ and neither is 1)")
        result.append(max(x, y))
    return tuple(result)


def broadcast_values(values: Sequence[Any], names: Sequence[str], what: str
                     ) -> tuple[list, Optional[TensorType]]:
    """Tensors among `values` broadcast to one shape and checked for one layout; the
    template type (shape, layout) the others must be splatted to, or None if no tensors."""
    values = list(values)
    tensors = [i for i, v in enumerate(values) if is_tensor(v)]
    if not tensors:
        return values, None
    rank = max(len(values[i].type.shape) for i in tensors)
    shape: tuple[int, ...] = ()
    for i in tensors:
        while len(values[i].type.shape) < rank:
            values[i] = expand_dims(values[i], 0)
        shape = values[i].type.shape if not shape else \
            broadcast_shapes(shape, values[i].type.shape, what)
    for i in tensors:
        values[i] = broadcast_to(values[i], shape)
    first = tensors[0]
    for i in tensors[1:]:
        if values[i].type.layout != values[first].type.layout:
            layout_mismatch(what, values[first], values[i], names[first], names[i])
    return values, values[first].type


def layout_mismatch(what: str, a: DynamicValue, b: DynamicValue, name_a: str, name_b: str):
    """Raise the error for two elementwise operands in different layouts."""
    enc_a = describe_layout(a.type.encoding, a.type.layout)
    enc_b = describe_layout(b.type.encoding, b.type.layout)
    notes = tuple(
        value.type.layout.render(max_rows=8, max_cols=16, title=f"{name} layout: {enc}")
        for name, value, enc in ((name_a, a, enc_a), (name_b, b, enc_b)))
    raise builder().error(
        f"{what}: the {name_a} and {name_b} have different layouts",
        expected=f"the {name_b} in the {name_a}'s layout",
        found=f"{name_a} {describe(a)}; {name_b} {describe(b)}",
        suggestion=f"move one of them with ll.convert_layout, e.g. "
                   f"ll.convert_layout({name_b.replace(' ', '_')}, {enc_a})",
        notes=notes)


# ------------------------------------------------------------------ arithmetic
def binary(kind: str, lhs: Any, rhs: Any, symbol: str) -> DynamicValue:
    """lhs <symbol> rhs for the IR's Binary kinds (add, sub, ..., max, min)."""
    el_l, el_r = operand_element(lhs, [rhs]), operand_element(rhs, [lhs])
    if kind in ("add", "sub") and (isinstance(el_l, PointerType) or isinstance(el_r, PointerType)):
        return pointer_offset(lhs, rhs, el_l, el_r, kind, symbol)
    element = promote(el_l, el_r, kind, symbol)
    (lhs, rhs), template = broadcast_values([lhs, rhs], ["lhs", "rhs"], f"'{symbol}'")
    lhs, rhs = coerce(lhs, element, template), coerce(rhs, element, template)
    b = builder()
    return b.wrap(b.create(ir.Binary, lhs.type, kind=kind, lhs=lhs.handle, rhs=rhs.handle))


def pointer_offset(lhs, rhs, el_l, el_r, kind: str, symbol: str) -> DynamicValue:
    """pointer + int, int + pointer, pointer - int: an AddPtr (offsets count elements)."""
    b = builder()
    if isinstance(el_r, PointerType):
        if kind == "sub" or isinstance(el_l, PointerType):
            raise b.error(f"'{symbol}' is not defined for {el_l} and {el_r}",
                          suggestion="subtracting pointers is not supported; keep offsets as ints")
        lhs, rhs, el_l, el_r = rhs, lhs, el_r, el_l
    if not isinstance(el_r, ScalarType) or el_r.is_float:
        raise b.error(f"pointer offsets must be integers, found {el_r}")
    if kind == "sub" and not is_value(rhs):
        kind, rhs = "add", -rhs
    (ptr, offset), template = broadcast_values([lhs, rhs], ["pointer", "offset"], f"'{symbol}'")
    ptr = coerce(ptr, el_l, template)
    offset = coerce(offset, el_r, template)
    if kind == "sub":
        offset = b.wrap(b.create(ir.Unary, offset.type, kind="neg", operand=offset.handle))
    return b.wrap(b.create(ir.AddPtr, ptr.type, pointer=ptr.handle, offset=offset.handle))


def compare(predicate: str, lhs: Any, rhs: Any, symbol: str) -> DynamicValue:
    el_l, el_r = operand_element(lhs, [rhs]), operand_element(rhs, [lhs])
    element = promote(el_l, el_r, "compare", symbol)
    (lhs, rhs), template = broadcast_values([lhs, rhs], ["lhs", "rhs"], f"'{symbol}'")
    lhs, rhs = coerce(lhs, element, template), coerce(rhs, element, template)
    result_type = template.with_element(i1) if template else i1
    b = builder()
    return b.wrap(b.create(ir.Compare, result_type, predicate=predicate, lhs=lhs.handle,
                           rhs=rhs.handle))


def unary(kind: str, x: Any, symbol: str, fma_share: float = 0.0) -> DynamicValue:
    """neg, not (bitwise ~), and the math functions (floats only, except abs); fma_share:
    see `ll.exp2`."""
    b = builder()
    x = to_value(x)
    element = element_of(x.type)
    if isinstance(element, PointerType):
        raise b.error(f"'{symbol}' is not defined for pointers ({element})")
    if kind == "not" and element.is_float:
        raise b.error(f"'~' needs an integer or boolean operand, found {element}")
    if kind not in ("neg", "not", "abs") and not element.is_float:
        raise b.error(f"{symbol} needs a floating-point operand, found {describe(x)}",
                      suggestion=f"convert first: {symbol}(x.to(ll.float32))")
    return b.wrap(b.create(ir.Unary, x.type, kind=kind, operand=x.handle, fma_share=fma_share))


def to_bool(x: DynamicValue) -> DynamicValue:
    """An i1 value: x itself, or x != 0."""
    if element_of(x.type) == i1:
        return x
    return compare("ne", x, 0, "!=")


def where(condition: Any, true_value: Any, false_value: Any) -> DynamicValue:
    b = builder()
    if not is_value(condition):
        condition = constant(bool(condition), i1)
    condition = to_bool(condition)
    el_t = operand_element(true_value, [false_value])
    el_f = operand_element(false_value, [true_value])
    element = el_t if el_t == el_f else promote(el_t, el_f, "select", "where")
    values, template = broadcast_values([condition, true_value, false_value],
                                        ["condition", "true value", "false value"], "where")
    condition = coerce(values[0], i1, template)
    true_value = coerce(values[1], element, template)
    false_value = coerce(values[2], element, template)
    return b.wrap(b.create(ir.Where, true_value.type, condition=condition.handle,
                           true_value=true_value.handle, false_value=false_value.handle))


def fma(a: Any, x: Any, c: Any) -> DynamicValue:
    b = builder()
    elements = [operand_element(v, [a, x, c]) for v in (a, x, c)]
    element = promote(promote(elements[0], elements[1], "fma", "fma"), elements[2], "fma", "fma")
    if not element.is_float:
        raise b.error(f"fma needs floating-point operands, found {', '.join(map(str, elements))}")
    values, template = broadcast_values([a, x, c], ["a", "b", "c"], "fma")
    a, x, c = (coerce(v, element, template) for v in values)
    return b.wrap(b.create(ir.Fma, a.type, a=a.handle, b=x.handle, c=c.handle))


# --------------------------------------------------------- async-op operands
def predicate(pred: Any, what: str) -> Optional[ir.Value]:
    """The i1 handle of an async op's `pred` (None when it is the constant True)."""
    if pred is True:
        return None
    if isinstance(pred, (bool, int)) and not is_value(pred):
        return constant(bool(pred), i1).handle
    if not is_value(pred) or isinstance(pred.type, TensorType):
        raise builder().error(f"{what} pred must be a scalar condition or a bool, found {describe(pred)}")
    return to_bool(pred).handle


def i32_scalar(x: Any, what: str) -> ir.Value:
    """An i32 scalar handle from an int or an integer scalar value."""
    if isinstance(x, bool) or not (isinstance(x, int) or is_value(x)):
        raise builder().error(f"{what} must be an int or an integer scalar, found {describe(x)}")
    value = to_value(x, i32)
    if isinstance(value.type, TensorType) or not isinstance(value.type, ScalarType) or not value.type.is_int:
        raise builder().error(f"{what} must be an integer scalar, found {describe(value)}")
    return (value if value.type == i32 else cast(value, i32)).handle
