"""Lowering of global loads and stores, vectorised and masked.

A `vector` of v means registers g..g+v-1 (g a multiple of v) hold consecutive elements
with g's address aligned to v elements (the vectorize_memory pass proves both), so the
group moves with one `ld.global.v{2,4}` / `st.global.v{2,4}` of up to 128 bits. The mask
is constant over a group, so the group's first mask register predicates it.

Unmasked accesses are plain LLVM loads and stores (LLVM picks the vector instruction
from the vector type and alignment). Masked accesses are predicated inline PTX
(`ptx_asm`): a masked-off lane never touches memory, and its loaded value is `other`.

Stores skip duplicates: a register that repeats a lower register's element is not
stored, and a thread whose lane/warp bits are free in the layout (a broadcast) stores
nothing, so each element is written once. A scalar store is done by thread 0 only.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from llvmlite import ir

from ..hardware import MAX_ACCESS_BITS
from ..ir import Load, PrefetchL2, Store
from ..types import PointerType, TensorType
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, lowers
from .indexing import duplicate_registers, owner_predicate


def _words(total_bits: int, element_bits: int) -> tuple[int, int]:
    """(word bits, word count) of one access of `total_bits`."""
    if element_bits == 64:
        return 64, total_bits // 64
    if total_bits <= 32:
        return total_bits, 1
    return 32, total_bits // 32


def _word_type(word_bits: int) -> ir.Type:
    return T.I16 if word_bits == 8 else ir.IntType(word_bits)


def _group_width(vector: int, element_bits: int) -> int:
    return max(1, min(vector, MAX_ACCESS_BITS // element_bits))


def _pack(b: ir.IRBuilder, values, memory: ir.Type, element_bits: int) -> list[ir.Value]:
    """Elements (in memory type) -> the words of one access."""
    word_bits, count = _words(len(values) * element_bits, element_bits)
    if len(values) == 1 and word_bits == element_bits and isinstance(memory, ir.IntType):
        word = values[0]
    else:
        vector = ir.Constant(ir.VectorType(memory, len(values)), None)
        for i, value in enumerate(values):
            vector = b.insert_element(vector, value, ir.Constant(T.I32, i))
        word_vector = b.bitcast(vector, ir.VectorType(ir.IntType(max(word_bits, 8)), count))
        words = [b.extract_element(word_vector, ir.Constant(T.I32, i)) for i in range(count)]
        if word_bits == 8:
            return [b.zext(words[0], T.I16)]
        return words
    return [b.zext(word, T.I16)] if word_bits == 8 else [word]


def _unpack(b: ir.IRBuilder, words, memory: ir.Type, width: int, element_bits: int) -> list[ir.Value]:
    """The words of one access -> `width` elements in memory type."""
    word_bits, count = _words(width * element_bits, element_bits)
    if word_bits == 8:
        words = [b.trunc(words[0], T.I8)]
        word_bits = 8
    vector = ir.Constant(ir.VectorType(ir.IntType(word_bits), count), None)
    for i, word in enumerate(words):
        vector = b.insert_element(vector, word, ir.Constant(T.I32, i))
    elements = b.bitcast(vector, ir.VectorType(memory, width))
    return [b.extract_element(elements, ir.Constant(T.I32, i)) for i in range(width)]


def _to_register(b: ir.IRBuilder, value: ir.Value, element) -> ir.Value:
    if T.memory_type(element) != T.element_type(element):  # i1 stored as a byte
        return b.icmp_unsigned("!=", value, ir.Constant(T.I8, 0))
    return value


def _to_memory(b: ir.IRBuilder, value: ir.Value, element) -> ir.Value:
    if T.memory_type(element) != T.element_type(element):
        return b.zext(value, T.I8)
    return value


def _element_bits_of(constant: ir.Constant, element) -> Optional[int]:
    """The memory bit pattern of one constant element, or None if it is not a constant."""
    if not isinstance(constant, ir.Constant) or isinstance(element, PointerType):
        return 0 if isinstance(constant, ir.Constant) and constant.constant is None else None
    value = constant.constant
    if value is None:
        return 0
    name = element.name
    if name == "fp32":
        return int(np.float32(value).view(np.uint32))
    if name == "fp16":
        return int(np.float16(value).view(np.uint16))
    if name == "fp64":
        return int(np.float64(value).view(np.uint64))
    if name == "bf16":
        bits = int(np.float32(value).view(np.uint32))
        if np.isnan(np.float32(value)):
            return 0x7FC0
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even
    if element.is_float:  # fp8 registers are bytes already
        return int(value) & 0xFF
    return int(value) & ((1 << (T.memory_bytes(element) * 8)) - 1)


def _fill_words(others, element, width: int):
    """Bit patterns of the words a masked-off access yields, when `other` is constant.

    Filling the destination with `other` inside the predicated load saves one select per
    element. Returns () without `other` (fill with zeros, no select needed either) and
    None when some `other` is not a compile-time constant.
    """
    if others is None:
        return ()
    patterns = [_element_bits_of(value, element) for value in others]
    if any(p is None for p in patterns):
        return None
    bits = T.memory_bytes(element) * 8
    word_bits, count = _words(width * bits, bits)
    per_word = max(word_bits // bits, 1)
    words = []
    for w in range(count):
        word = 0
        for i in range(per_word):
            word |= patterns[w * per_word + i] << (i * bits)
        words.append(word)
    return tuple(words)


def load_group(ctx: Lowering, pointer, mask, element, width: int, fill=(), cache: str = "") -> list[ir.Value]:
    b = ctx.builder
    memory = T.memory_type(element)
    bits = T.memory_bytes(element) * 8
    align = width * T.memory_bytes(element)
    if mask is None and cache:  # LLVM loads carry no cache qualifiers: inline PTX, always on
        mask = ir.Constant(T.I1, 1)
    if mask is None:
        if width == 1:
            return [b.load(pointer, typ=memory, align=align)]
        vector = b.load(pointer, typ=ir.VectorType(memory, width), align=align)
        return [b.extract_element(vector, ir.Constant(T.I32, i)) for i in range(width)]
    word_bits, count = _words(width * bits, bits)
    word_type = _word_type(word_bits)
    result_type = word_type if count == 1 else ir.LiteralStructType([word_type] * count)
    text, constraints = ptx_asm.masked_global_load(word_bits, count, fill, cache)
    asm = ir.InlineAsm(ir.FunctionType(result_type, [T.GLOBAL_PTR, T.I1]), text, constraints, side_effect=True)
    loaded = b.call(asm, [pointer, mask])
    words = [loaded] if count == 1 else [b.extract_value(loaded, i) for i in range(count)]
    return _unpack(b, words, memory, width, bits)


@lowers(Load)
def lower_load(ctx: Lowering, op: Load) -> None:
    b = ctx.builder
    element = T.element_of(op.result.type)
    bits = T.memory_bytes(element) * 8
    if not isinstance(op.result.type, TensorType):
        mask = ctx.scalar(op.mask) if op.mask is not None else None
        (value,) = load_group(ctx, ctx.scalar(op.pointer), mask, element, 1, cache=op.cache)
        value = _to_register(b, value, element)
        if op.other is not None and mask is not None:
            value = b.select(mask, value, ctx.scalar(op.other))
        ctx.define(op.result, value)
        return
    count = T.register_count(op.result.type)
    pointers = ctx.registers(op.pointer, count)
    masks = ctx.registers(op.mask, count) if op.mask is not None else None
    others = ctx.registers(op.other, count) if op.other is not None else None
    width = _group_width(op.vector, bits)
    values = []
    for start in range(0, count, width):
        mask = masks[start] if masks is not None else None
        size = min(width, count - start)
        fill = _fill_words(others[start:start + size] if others is not None else None, element, size)
        group = load_group(ctx, pointers[start], mask, element, size, fill or (), op.cache)
        for i, value in enumerate(group):
            value = _to_register(b, value, element)
            if mask is not None and fill is None:
                value = b.select(mask, value, others[start + i])
            values.append(value)
    ctx.define(op.result, tuple(values))


def _store_group(ctx: Lowering, pointer, values, predicate, element, cache: str = "") -> None:
    b = ctx.builder
    memory = T.memory_type(element)
    bits = T.memory_bytes(element) * 8
    values = [_to_memory(b, v, element) for v in values]
    width = len(values)
    if predicate is None and cache:  # LLVM stores carry no cache qualifiers: inline PTX, always on
        predicate = ir.Constant(T.I1, 1)
    if predicate is None:
        align = width * T.memory_bytes(element)
        if width == 1:
            b.store(values[0], pointer, align=align)
            return
        vector = ir.Constant(ir.VectorType(memory, width), None)
        for i, value in enumerate(values):
            vector = b.insert_element(vector, value, ir.Constant(T.I32, i))
        b.store(vector, pointer, align=align)
        return
    words = _pack(b, values, memory, bits)
    word_bits, count = _words(width * bits, bits)
    text, constraints = ptx_asm.masked_global_store(word_bits, count, cache)
    function_type = ir.FunctionType(ir.VoidType(), [T.GLOBAL_PTR] + [w.type for w in words] + [T.I1])
    b.call(ir.InlineAsm(function_type, text, constraints, side_effect=True), [pointer, *words, predicate])


def _and(b: ir.IRBuilder, x, y):
    if x is None:
        return y
    if y is None:
        return x
    return b.and_(x, y)


@lowers(Store)
def lower_store(ctx: Lowering, op: Store) -> None:
    b = ctx.builder
    element = T.element_of(op.value.type)
    bits = T.memory_bytes(element) * 8
    if not isinstance(op.pointer.type, TensorType):
        first_thread = ctx.cached("thread0", lambda p: p.icmp_unsigned(
            "==", ctx.thread_id, ir.Constant(T.I32, 0)))
        mask = ctx.scalar(op.mask) if op.mask is not None else None
        _store_group(ctx, ctx.scalar(op.pointer), [ctx.scalar(op.value)], _and(b, first_thread, mask), element,
                     op.cache)
        return
    layout = op.pointer.type.layout
    count = T.register_count(op.pointer.type)
    pointers = ctx.registers(op.pointer, count)
    values = ctx.registers(op.value, count)
    masks = ctx.registers(op.mask, count) if op.mask is not None else None
    owner = owner_predicate(ctx, layout)
    duplicates = duplicate_registers(layout)
    width = _group_width(op.vector, bits)
    for start in range(0, count, width):
        if start & duplicates:
            continue
        mask = masks[start] if masks is not None else None
        group = values[start:start + width]
        _store_group(ctx, pointers[start], group, _and(b, owner, mask), element, op.cache)


@lowers(PrefetchL2)
def lower_prefetch_l2(ctx: Lowering, op: PrefetchL2) -> None:
    b = ctx.builder
    first_thread = ctx.cached("thread0", lambda p: p.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.I32, 0)))
    nbytes = b.and_(ctx.scalar(op.nbytes), ir.Constant(T.I32, ~15 & 0xFFFFFFFF))
    # A zero-byte bulk prefetch is not allowed: skip it instead.
    issue = b.and_(first_thread, b.icmp_signed(">", nbytes, ir.Constant(T.I32, 0)))
    address = b.ptrtoint(ctx.scalar(op.pointer), T.I64)
    text, constraints = ptx_asm.bulk_prefetch_l2()
    fn_type = ir.FunctionType(ir.VoidType(), [T.I64, T.I32, ir.IntType(1)])
    b.asm(fn_type, text, constraints, [address, nbytes, issue], side_effect=True)
