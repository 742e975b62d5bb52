"""Index math from linear layouts: lane/warp part once per layout, registers as constants.

A distributed layout L maps (register, lane, warp, block) to coordinates by XOR of the
bases of the set bits. Since XOR is linear, L(r, l, w, b) = L(r, 0, 0, 0) ^ L(0, l, w, b):
the second term depends only on the thread and is computed once per (layout, out-dim) in
the prologue; the first is a compile-time constant per register.

The same split gives shared-memory offsets: composing a tensor layout with the inverse of
a shared layout yields a linear map from hardware indices to element offsets.
"""

from __future__ import annotations

from typing import Optional

from llvmlite import ir

from ...layouts import LayoutError, LinearLayout
from ..errors import CompilationError
from ...layouts.rules import shared_addressing
from . import llvm_types as T

THREAD_DIMS = ("lane", "warp", "block")


def register_constant(layout: LinearLayout, out_dim: str, register: int) -> int:
    """L(register, 0, 0, 0) along `out_dim`: the per-register constant of the XOR split."""
    index = layout.out_dim_names.index(out_dim)
    value = 0
    for bit, basis in enumerate(layout.bases.get("register", ())):
        if register >> bit & 1:
            value ^= basis[index]
    return value


def xor_of_bits(builder: ir.IRBuilder, source: ir.Value, components) -> Optional[ir.Value]:
    """XOR over the set bits i of `source` of `components[i]`; None when all are 0.

    Runs of bits that land on consecutive output bits (the usual blocked case) become one
    mask and shift; other bits become (bit * component).
    """
    terms = []
    i, n = 0, len(components)
    while i < n:
        c = components[i]
        if c == 0:
            i += 1
            continue
        if c & (c - 1) == 0:
            j = i + 1
            while j < n and components[j] == c << (j - i):
                j += 1
            field = builder.and_(source, ir.Constant(T.I32, ((1 << (j - i)) - 1) << i))
            shift = c.bit_length() - 1 - i
            if shift > 0:
                field = builder.shl(field, ir.Constant(T.I32, shift))
            elif shift < 0:
                field = builder.lshr(field, ir.Constant(T.I32, -shift))
            terms.append(field)
            i = j
        else:
            bit = builder.and_(builder.lshr(source, ir.Constant(T.I32, i)), ir.Constant(T.I32, 1))
            terms.append(builder.mul(bit, ir.Constant(T.I32, c)))
            i += 1
    if not terms:
        return None
    result = terms[0]
    for term in terms[1:]:
        result = builder.xor(result, term)
    return result


def thread_part(ctx, layout: LinearLayout, out_dim: str) -> ir.Value:
    """L(0, lane, warp, block) along `out_dim`, as an i32 computed once in the prologue."""
    index = layout.out_dim_names.index(out_dim)

    def make(builder: ir.IRBuilder) -> ir.Value:
        total = None
        for dim in THREAD_DIMS:
            components = [basis[index] for basis in layout.bases.get(dim, ())]
            if not any(components):
                continue
            part = xor_of_bits(builder, ctx.hardware_index(dim), components)
            total = part if total is None else builder.xor(total, part)
        return total if total is not None else ir.Constant(T.I32, 0)

    return ctx.cached(("thread_part", layout, out_dim), make)


def coordinate(ctx, layout: LinearLayout, out_dim: str, register: int) -> ir.Value:
    """The coordinate along `out_dim` of `register` of this thread (i32)."""
    base = thread_part(ctx, layout, out_dim)
    constant = register_constant(layout, out_dim, register)
    if not constant:
        return base
    if isinstance(base, ir.Constant):
        return ir.Constant(T.I32, base.constant ^ constant)
    return ctx.builder.xor(base, ir.Constant(T.I32, constant))


def thread_bits(layout: LinearLayout, out_dim: str) -> int:
    """Every bit the thread part along `out_dim` can have set (OR of the thread bases)."""
    index = layout.out_dim_names.index(out_dim)
    mask = 0
    for dim in THREAD_DIMS:
        for basis in layout.bases.get(dim, ()):
            mask |= basis[index]
    return mask


def element_pointer(ctx, base: ir.Value, element: ir.Type, offsets: LinearLayout, register: int,
                    xor: int = 0) -> ir.Value:
    """Address of `register`'s element: base + (thread part ^ register constant ^ xor).

    The constant's bits the thread part never sets are an addition, emitted as a constant
    GEP that ptxas folds into the instruction's immediate offset; only the others are
    XORed in, so that registers whose constants differ only there share one address.
    """
    b = ctx.builder
    thread = thread_part(ctx, offsets, "offset")
    constant = register_constant(offsets, "offset", register) ^ xor
    mask = thread_bits(offsets, "offset")
    if constant & mask:
        thread = b.xor(thread, ir.Constant(T.I32, constant & mask))
    pointer = b.gep(base, [thread], source_etype=element)
    added = constant & ~mask
    return b.gep(pointer, [ir.Constant(T.I32, added)], source_etype=element) if added else pointer


def owner_predicate(ctx, layout: LinearLayout) -> Optional[ir.Value]:
    """i1 true in the one thread that owns each element of a broadcast layout.

    Free bits (whose bases repeat earlier ones, registers first) mark duplicates; the
    owner of an element is the index with every free bit clear. None when no thread bit
    is free (every thread owns what it holds).
    """
    masks = layout.free_variable_masks()

    def make(builder: ir.IRBuilder) -> Optional[ir.Value]:
        condition = None
        for dim in THREAD_DIMS:
            mask = masks.get(dim, 0)
            if not mask:
                continue
            clear = builder.icmp_unsigned(
                "==", builder.and_(ctx.hardware_index(dim), ir.Constant(T.I32, mask)), ir.Constant(T.I32, 0))
            condition = clear if condition is None else builder.and_(condition, clear)
        return condition

    if not any(masks.get(dim, 0) for dim in THREAD_DIMS):
        return None
    return ctx.cached(("owner", layout), make)


def duplicate_registers(layout: LinearLayout) -> int:
    """Mask of register bits whose registers repeat elements of lower registers."""
    return layout.free_variable_masks().get("register", 0)


def offset_map(tensor_layout: LinearLayout, addressing: LinearLayout) -> LinearLayout:
    """Hardware index -> element offset: `addressing` (dims -> offset) after the tensor layout."""
    names = addressing.in_dim_names
    try:
        ordered = tensor_layout.transpose_outs(names)
        return ordered.compose(addressing)
    except LayoutError as error:
        raise CompilationError(f"the tensor does not fit the shared buffer: {error}") from None


def addressing_of(shared_layout: LinearLayout) -> LinearLayout:
    """dims -> offset for a shared layout (offset[, block] -> dims); its minimal inverse."""
    try:
        return shared_addressing(shared_layout)
    except LayoutError as error:
        raise CompilationError(f"shared layout cannot address every element: {error}") from None
