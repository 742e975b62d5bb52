"""Tensor maps a kernel makes from its own arguments (`tl.make_tensor_descriptor(base,
shape, strides, block_shape)` in a highlevel kernel), built on the host at each launch.

When the base is a pointer parameter and every shape and stride an int parameter, a
constant, or a sum, difference or product of those, the tensor map depends on the
arguments alone: the kernel takes it as a hidden parameter (compiled.Param.hidden =
(base parameter, FIELD, recipe)) and the launcher encodes it from the arguments, as it
fills `desc.shape` reads from a descriptor argument. The recipe is the text of
((shape expressions), (stride expressions), block_shape); an expression is ("param",
name), ("const", value) or (op, lhs, rhs) with op "add", "sub" or "mul".
"""

from __future__ import annotations

import ast
import functools
from types import SimpleNamespace
from typing import Any, Callable

from ..compiler.types import parse_tensor_descriptor_signature, tensor_descriptor_swizzle, tensor_descriptor_type

FIELD = "tensor_map"
OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def recipe_text(shape: tuple, strides: tuple, block_shape: tuple) -> str:
    return repr((tuple(shape), tuple(strides), tuple(block_shape)))


@functools.lru_cache(maxsize=256)
def parse_recipe(text: str) -> tuple[tuple, tuple, tuple]:
    shape, strides, block_shape = ast.literal_eval(text)
    return shape, strides, block_shape


def evaluate(expression: tuple, lookup: Callable[[str], Any]) -> int:
    kind = expression[0]
    if kind == "const":
        return int(expression[1])
    if kind == "param":
        return int(lookup(expression[1]))
    return OPERATIONS[kind](evaluate(expression[1], lookup), evaluate(expression[2], lookup))


def shape_and_strides(recipe: str, lookup: Callable[[str], Any]) -> tuple[tuple, tuple]:
    """The global shape and strides (elements) the recipe gives for these arguments."""
    shape, strides, _ = parse_recipe(recipe)
    return tuple(evaluate(e, lookup) for e in shape), tuple(evaluate(e, lookup) for e in strides)


def host_descriptor(base: Any, recipe: str, block_shape: tuple, lookup: Callable[[str], Any]):
    """What the emulator binds for the hidden parameter: the base array with the shape,
    strides and box the kernel made (emulator/descriptors.bind_descriptor reads them)."""
    shape, strides = shape_and_strides(recipe, lookup)
    return SimpleNamespace(base=base, shape=shape, strides=strides, block_shape=block_shape)


def encoded_tensor_map(address: int, recipe: str, param_type: str, lookup: Callable[[str], Any]) -> bytes:
    """The 128-byte CUtensorMap for the launch (checked as a host TensorDescriptor's is)."""
    from . import tensor_descriptor as td

    element, block_shape, swizzle = parse_tensor_descriptor_signature(param_type)
    if swizzle is None:
        swizzle = tensor_descriptor_swizzle(tensor_descriptor_type(element, block_shape))
    shape, strides = shape_and_strides(recipe, lookup)
    itemsize = element.bits // 8
    td._check_global(int(address), shape, strides, tuple(block_shape), itemsize)
    return td._encoded(element.name, int(address), shape, strides,
                       td.tma_copy_box(block_shape, swizzle, element.bits), swizzle, itemsize)
