"""The TMA side of pointer loads stage_pointer_loads proves boxes: a tensor map the host
encodes at each launch from the kernel's arguments (a hidden parameter keyed by its recipe,
as make_tensor_descriptor's: runtime/made_tensor_descriptor.py), and `desc.load` of the box
at the tile's coordinates, permuted back to the load's dims where its contiguous dim is the
first (B read as [K, N] tiles of an [N, K] array)."""

from __future__ import annotations

from ..compiler import ir
from ..compiler.builder import Builder, language_wrapper
from ..compiler.passes.stage_pointer_loads import PointerBox, stage_pointer_loads
from ..compiler.types import tensor_descriptor_type
from ..runtime import made_tensor_descriptor as made
from . import semantic as sem


def stage_pointer_loads_by_tma(kernel: ir.Kernel) -> ir.Kernel:
    builder = Builder(kernel.num_warps, language_wrapper("highlevel"), "tl")
    known = dict(zip(kernel.hidden_params, kernel.params[len(kernel.params) - len(kernel.hidden_params):]))

    def build_box(box: PointerBox, coords: tuple, loc) -> tuple:
        from .tensor_descriptor import MadeTensorDescriptor, load

        dims = (1 - box.contiguous, box.contiguous)
        block = tuple(box.sizes[d] for d in dims)
        type_ = tensor_descriptor_type(box.base.type.pointee, block)
        recipe = made.recipe_text(tuple(box.bounds[d] for d in dims), (box.stride, ("const", 1)), block,
                                  load_only=True)
        key = (box.base.hint, made.FIELD, recipe)
        if key not in known:
            known[key] = ir.Value(type_, f"{box.base.hint}_desc{len(known)}")
        with builder.activate(), builder.at(loc):
            ops = builder.push_block()
            tile = load(MadeTensorDescriptor(known[key], (), ()), [builder.wrap(c) for c in coords])
            if box.contiguous == 0:
                tile = sem.permute(tile, (1, 0))
            builder.pop_block()
        return ops, tile.handle, key, known[key]

    return stage_pointer_loads(kernel, build_box)
