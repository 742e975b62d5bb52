"""Atomic read-modify-write of global memory (Triton's `atomic_*` ops).

    old = ll.atomic_add(counter_ptr, 1)                    # a scalar: one add per program
    ll.atomic_add(hist_ptr + bins, 1, mask=bins < n)       # a tensor: one add per element
    ll.atomic_cas(lock_ptr, 0, 1, sem="acquire")

Each op updates every element of `pointer` (a pointer, or a tensor of pointers) once per
program (per partition inside `ll.warp_specialize`), however many threads hold the
element in its layout, and returns the old values in the broadcast operands' shape and
layout: every thread holding an element gets the same one; masked-off elements do
nothing and return 0. `sem` orders the atomic with the program's other memory accesses
("relaxed", "acquire", "release", "acq_rel"); `scope` is the set of threads that
ordering is with ("cta", "gpu", "sys"). compiler/atomics.py has the rules the backend
and the emulator share.
"""

from __future__ import annotations

from typing import Any, Optional

from ..compiler import atomics as rules
from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.types import PointerType, i1
from . import semantic

__all__ = ["atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or",
           "atomic_xchg", "atomic_xor"]


def _qualifier(name: str, value: Any, allowed: tuple[str, ...], default: str, what: str) -> str:
    if value is None:  # Triton's default
        return default
    if value not in allowed:
        raise semantic.builder().error(
            f"{name} {what} must be one of {', '.join(repr(a) for a in allowed)}, found {value!r}",
            suggestion=f"pass {what}={default!r} (the default) or leave it out")
    return value


def _element(name: str, kind: str, pointer: Any):
    b = semantic.builder()
    if not semantic.is_value(pointer) or not isinstance(semantic.element_of(pointer.type), PointerType):
        raise b.error(f"{name} needs a pointer or a tensor of pointers, found {semantic.describe(pointer)}")
    element = semantic.element_of(pointer.type).pointee
    allowed = rules.ELEMENT_TYPES[kind]
    if element.name not in allowed:
        float_minmax = kind in ("max", "min") and element.is_float
        why = " (PTX has no floating-point atomic max/min)" if float_minmax else ""
        hint = "point at int32, uint32, int64 or uint64 elements"
        if kind == "add":
            hint += ", float32 or float64"
        if float_minmax:
            hint += ("; for floats of one sign, bitcast the pointer to int32 (ll.pointer_type) and "
                     "use atomic_max/atomic_min on the bits (signed order for positive floats)")
        raise b.error(f"{name} does not support {element} elements{why}",
                      expected=" or ".join(allowed), found=str(element), suggestion=hint)
    return element


def _atomic(name: str, kind: str, pointer: Any, value: Any, mask: Any, sem: Any, scope: Any,
            compare: Any = None):
    b = semantic.builder()
    sem = _qualifier(name, sem, rules.SEMANTICS, "acq_rel", "sem")
    scope = _qualifier(name, scope, rules.SCOPES, "gpu", "scope")
    element = _element(name, kind, pointer)
    if mask is not None:
        mask = semantic.to_bool(mask if semantic.is_value(mask) else semantic.constant(bool(mask), i1))
    values = [pointer, compare, value, mask]
    names = ["pointer", "cmp", "value", "mask"]
    present = [i for i, v in enumerate(values) if v is not None]
    broadcast, template = semantic.broadcast_values([values[i] for i in present],
                                                    [names[i] for i in present], name)
    for i, v in zip(present, broadcast):
        values[i] = v
    pointer = semantic.coerce(values[0], semantic.element_of(pointer.type), template)
    compare = semantic.coerce(values[1], element, template) if compare is not None else None
    value = semantic.coerce(values[2], element, template)
    mask = semantic.coerce(values[3], i1, template).handle if mask is not None else None
    result_type = template.with_element(element) if template else element
    fields = dict(pointer=pointer.handle, value=value.handle, mask=mask, sem=sem, scope=scope)
    if kind == "cas":
        return b.wrap(b.create(ir.AtomicCAS, result_type, compare=compare.handle, **fields))
    return b.wrap(b.create(ir.AtomicRMW, result_type, kind=kind, **fields))


def _rmw(kind: str, doc: str):
    name = "atomic_" + kind

    def op(pointer: Any, value: Any, mask: Any = None, sem: Optional[str] = "acq_rel",
           scope: Optional[str] = "gpu"):
        return _atomic(name, kind, pointer, value, mask, sem, scope)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"{doc} at `pointer` where `mask` holds, atomically, once per element and "
                  f"program; returns the old values (0 where masked off).")
    return builtin(op)


atomic_add = _rmw("add", "memory += value (int32/uint32/int64/uint64, float32/float64)")
atomic_max = _rmw("max", "memory = max(memory, value) (signed or unsigned by element type)")
atomic_min = _rmw("min", "memory = min(memory, value) (signed or unsigned by element type)")
atomic_and = _rmw("and", "memory &= value")
atomic_or = _rmw("or", "memory |= value")
atomic_xor = _rmw("xor", "memory ^= value")
atomic_xchg = _rmw("xchg", "memory = value")


@builtin
def atomic_cas(pointer: Any, cmp: Any, value: Any, sem: Optional[str] = "acq_rel",
               scope: Optional[str] = "gpu", mask: Any = None):
    """Where memory at `pointer` equals `cmp`, write `value`, atomically, once per element
    and program; returns the old values (compare them with `cmp` to see which swapped).
    `mask` (not in Triton) skips elements, which return 0."""
    return _atomic("atomic_cas", "cas", pointer, value, mask, sem, scope, compare=cmp)
