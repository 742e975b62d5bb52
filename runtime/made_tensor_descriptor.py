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

from ..compiler.hardware import TENSOR_MAP_BYTES
from ..compiler.types import parse_tensor_descriptor_signature, tensor_descriptor_swizzle, tensor_descriptor_type

FIELD = "tensor_map"
OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


# A recipe's mark for a map that is only read (pointer loads staged by TMA,
# highlevel/pointer_tma.py): a launch where one of its bounds is empty reads zeros.
LOAD_ONLY = "load_only"


def recipe_text(shape: tuple, strides: tuple, block_shape: tuple, load_only: bool = False) -> str:
    return repr((tuple(shape), tuple(strides), tuple(block_shape)) + ((LOAD_ONLY,) if load_only else ()))


@functools.lru_cache(maxsize=256)
def parse_recipe(text: str) -> tuple[tuple, tuple, tuple]:
    shape, strides, block_shape = ast.literal_eval(text)[:3]
    return shape, strides, block_shape


def is_load_only(recipe: str) -> bool:
    return ast.literal_eval(recipe)[3:] == (LOAD_ONLY,)


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


def staged_pointer_recipes(kernel) -> tuple[str, ...]:
    """The recipes of the load-only maps (pointer loads staged by TMA) a compiled kernel
    (a CompiledKernel, or the ir.Kernel the emulator runs) encodes at each launch."""
    keys = getattr(kernel, "hidden_params", None)
    if keys is None:
        keys = tuple(p.hidden for p in getattr(kernel, "params", ()) if p.hidden is not None)
    return tuple(recipe for _, field, recipe in keys if field == FIELD and is_load_only(recipe))


def tma_takes(recipes: tuple[str, ...], lookup: Callable[[str], Any]) -> bool:
    """Whether no staged map has a negative stride for these arguments: a launch
    specializes a negative multiple of 16 as divisible by 16 like a positive one, and the
    prover sees only that, but a tensor map's strides are unsigned. Where one is negative
    the launch takes the kernel compiled with pointer_tma=False (runtime/jit.py)."""
    return all(min(shape_and_strides(recipe, lookup)[1]) >= 0 for recipe in recipes)


def host_descriptor(base: Any, recipe: str, block_shape: tuple, lookup: Callable[[str], Any]):
    """What the emulator binds for the hidden parameter: the base array with the shape,
    strides and box the kernel made (emulator/descriptors.bind_descriptor reads them).
    A negative stride raises as the GPU's encoding does (encoded_tensor_map), unless the
    map is a staged pointer load's with no element in bounds, which the GPU reads as zeros."""
    shape, strides = shape_and_strides(recipe, lookup)
    if min(strides) < 0 and not (is_load_only(recipe) and min(shape) < 1):
        from .tensor_descriptor import TensorDescriptorError

        raise TensorDescriptorError(
            f"TensorDescriptor: a tensor map made from the kernel's arguments has strides {list(strides)} "
            f"(shape {list(shape)}); TMA needs every stride non-negative")
    return SimpleNamespace(base=base, shape=shape, strides=strides, block_shape=block_shape)


def encoded_tensor_map(address: int, recipe: str, param_type: str, lookup: Callable[[str], Any]) -> bytes:
    """The 128-byte CUtensorMap for the launch (checked as a host TensorDescriptor's is)."""
    from . import tensor_descriptor as td

    element, block_shape, swizzle = parse_tensor_descriptor_signature(param_type)
    if swizzle is None:
        swizzle = tensor_descriptor_swizzle(tensor_descriptor_type(element, block_shape))
    shape, strides = shape_and_strides(recipe, lookup)
    itemsize = element.bits // 8
    if is_load_only(recipe) and min(shape) < 1:
        # Every element is out of bounds (a staged pointer load masked by a bound <= 0, K = 0
        # in a matmul): TMA has no empty map, so the map is one element of zeros (the
        # arguments' strides may be anything then: an empty array's are).
        address, shape = zeros_address(), (1,) * len(shape)
        strides = (16 // itemsize,) * (len(shape) - 1) + (1,)
    td._check_global(int(address), shape, strides, tuple(block_shape), itemsize)
    return td._encoded(element.name, int(address), shape, strides,
                       td.tma_copy_box(block_shape, swizzle, element.bits), swizzle, itemsize)


_ZEROS: dict[int, int] = {}  # device -> the address of ZERO_BYTES zeroed bytes
ZERO_BYTES = 256


def zeros_address() -> int:
    """ZERO_BYTES of zeros on the current device (16-byte aligned), allocated and zeroed at
    the first call on a device (so not inside a CUDA graph capture: a warm-up launch first)."""
    from . import driver

    device = driver.current_device()
    if device not in _ZEROS:
        address = driver.allocate(ZERO_BYTES)
        driver.memset_d8_async(address, ZERO_BYTES, 0)
        driver.synchronize()
        _ZEROS[device] = address
    return _ZEROS[device]


# Tensor maps the kernel writes itself (highlevel/device_tensor_map.py): each call site is
# a template parameter (base parameter, TEMPLATE_FIELD, site), its map encoded from the
# descriptor type alone, and the kernel takes one workspace pointer (base parameter,
# WORKSPACE_FIELD, 0) with a 128-byte slot per site and program.
TEMPLATE_FIELD = "tensor_map_template"
WORKSPACE_FIELD = "tensor_map_workspace"


def workspace_bytes(sites: int, grid) -> int:
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    programs = 1
    for extent in grid:
        programs *= int(extent)
    return max(1, sites * programs) * TENSOR_MAP_BYTES


def _template_geometry(param_type: str) -> tuple:
    """(element, box, swizzle, shape, strides) of a template: the box as the tensor, rows
    padded to 16 bytes; the kernel replaces the shape, strides and address."""
    element, block_shape, swizzle = parse_tensor_descriptor_signature(param_type)
    if swizzle is None:
        swizzle = tensor_descriptor_swizzle(tensor_descriptor_type(element, block_shape))
    itemsize = element.bits // 8
    strides, step = [], 1
    for d, extent in reversed(list(enumerate(block_shape))):
        strides.insert(0, step)
        step *= -(-extent * itemsize // 16) * 16 // itemsize if d == len(block_shape) - 1 else extent
    return element, tuple(block_shape), swizzle, tuple(block_shape), tuple(strides)


def template_descriptor(param_type: str):
    """What the emulator binds for a template parameter (emulator/descriptors.bind_descriptor)."""
    import numpy as np

    element, block_shape, swizzle, shape, strides = _template_geometry(param_type)
    base = np.zeros(shape[0] * strides[0] * element.bits // 8, np.uint8)
    return SimpleNamespace(base=base, shape=shape, strides=strides, block_shape=block_shape, swizzle=swizzle)


class TensorMapWorkspace:
    """The launcher's workspace for a kernel's in-kernel tensor maps: one device buffer per
    device and stream (launches on one stream run in order, so they may share it; on two
    streams they may overlap), grown to the largest grid launched and kept, and each site's
    template encoded once. The first launch on a stream allocates, so it cannot be inside
    a CUDA graph capture; a warm-up launch before capturing allocates it."""

    def __init__(self, template_types: tuple[str, ...]):
        self.template_types = template_types
        self._buffers: dict[tuple[int, int], tuple[int, int]] = {}  # (device, stream) -> (address, bytes)
        self._templates: dict[tuple[int, int], bytes] = {}

    def address(self, device: int, stream: int, grid) -> int:
        from . import driver

        needed = workspace_bytes(len(self.template_types), grid)
        address, size = self._buffers.get((device, stream), (0, 0))
        if size < needed:
            if address:
                driver.free(address)  # synchronizes: no launch still reads it
            address, size = driver.allocate(needed), needed
            self._buffers[device, stream] = (address, size)
        return address

    def template(self, site: int, address: int) -> bytes:
        """Site `site`'s template map, encoded over the workspace (any mapped 16-byte
        aligned address does: the kernel replaces it)."""
        key = (site, address)
        encoded = self._templates.get(key)
        if encoded is None:
            from . import tensor_descriptor as td

            element, block_shape, swizzle, shape, strides = _template_geometry(self.template_types[site])
            encoded = self._templates[key] = td._encoded(
                element.name, address, shape, strides, td.tma_copy_box(block_shape, swizzle, element.bits),
                swizzle, element.bits // 8)
        return encoded
