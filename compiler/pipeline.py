"""The compiler's stages, in order, in one table.

    source  -> frontend            Python source of the kernel and its callees
    tile    -> frontend            highlevel IR: tensors without layouts
    layout  -> frontend + passes   explicit IR: layouts, shared offsets, barriers, plans
    llir    -> backend             LLVM IR text (llvmlite)
    ptx     -> backend             PTX for sm_90a (LLVM's NVPTX target)
    cubin   -> ptxas               binary, with the resource report in metadata

Lowlevel kernels enter at `layout` straight from the frontend; highlevel kernels enter
at `tile` and reach `layout` through the inference passes (TILE_PASSES). Every stage's text is
kept on the CompiledKernel (`kernel.asm[stage]`), and WEFT_DUMP=<stage or pass> prints it.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional

from .compiled import CompiledKernel, Param, hidden_params
from .ir import Kernel
from .passes.accelerate_dots import accelerate_dots
from .passes.allocate_shared_memory import allocate_shared_memory
from .passes.axis_analysis import format_axis_info
from .passes.coalesce import coalesce
from .passes.drop_deadlocking_turns import drop_deadlocking_turns
from .passes.drop_unused_atomic_results import drop_unused_atomic_results
from .passes.hoist_copy_fences import hoist_copy_fences
from .passes.hoist_slot_loads import hoist_slot_loads
from .passes.insert_barriers import insert_barriers
from .passes.issue_dot_ahead import issue_dot_ahead
from .passes.issue_dots_early import issue_dots_early
from .passes.lower_tiles import lower_tiles
from .passes.merge_wgmma_waits import merge_wgmma_waits
from .passes.pingpong_warpgroups import pass_after_drain, pingpong_warpgroups
from .passes.pipeline_dot_loops import pipeline_dot_loops
from .passes.pipeline_tma_warp_specialize import warp_specialize_epilogues
from .passes.plan_data_movement import plan_data_movement
from .passes.propagate_layouts import propagate_layouts
from .passes.stage_block_pointers import stage_block_pointers
from .passes.vectorize_memory import vectorize_memory
from .printer import print_kernel
from .ring_depth import fit_ring_depth
from .verifier import verify

# The highlevel inference passes, in order: `tile` in, `layout` out. axis_analysis changes
# nothing (coalesce runs it); it is listed so that WEFT_DUMP=axis_analysis shows its facts.
TILE_PASSES: tuple[tuple[str, Callable[[Kernel], Kernel]], ...] = (
    ("stage_block_pointers", stage_block_pointers),  # first: the passes after it see TMA boxes or pointers
    ("axis_analysis", lambda kernel: kernel),      # facts about pointers need only shapes
    ("coalesce", coalesce),                        # axis facts pick each global access's layout
    ("accelerate_dots", accelerate_dots),          # before propagation: a wgmma's accumulator is an anchor
    ("pipeline_dot_loops", pipeline_dot_loops),    # the dots' operand stores are known; copies take their layouts
    ("issue_dot_ahead", issue_dot_ahead),          # on pipelined loops: the rings and the in-flight dot exist
    ("issue_dots_early", issue_dots_early),        # after the loops' waits are placed: moves a dot, lowers a wait
    ("warp_specialize_epilogues", warp_specialize_epilogues),  # a split loop's epilogue joins its consumers
    ("pingpong_warpgroups", pingpong_warpgroups),  # the split's consumer loops are final; turns go around them
    ("propagate_layouts", propagate_layouts),      # the accesses' layouts are the anchors
    ("lower_tiles", lower_tiles),                  # every tensor has a layout now
    ("pass_after_drain", pass_after_drain),        # after propagation: conversions it placed follow the turn's pass
    ("merge_wgmma_waits", merge_wgmma_waits),      # after lower_tiles: a wait of several deps needs no propagation
    ("hoist_slot_loads", hoist_slot_loads),        # the waits are final: slot loads move above the first dot
    ("hoist_copy_fences", hoist_copy_fences),      # last: the passes before it see each dot's fence
)

# The lowlevel passes, in order; one line each says why it sits where it does.
LAYOUT_PASSES: tuple[tuple[str, Callable[[Kernel], Kernel]], ...] = (
    ("plan_data_movement", plan_data_movement),          # layouts are final; plans decide who needs scratch
    ("vectorize_memory", vectorize_memory),              # layouts are final; axis facts pick access widths
    ("drop_unused_atomic_results", drop_unused_atomic_results),  # before allocation: no scratch for them
    ("allocate_shared_memory", allocate_shared_memory),  # every buffer and scratch user is known now
    ("insert_barriers", insert_barriers),                # needs byte offsets to see overlapping accesses
    ("drop_deadlocking_turns", drop_deadlocking_turns),  # every barrier is placed: none may fall inside a turn
)

STAGES = ("source", "tile", "layout", "llir", "ptx", "cubin")


def _dump(config, name: str, text) -> None:
    """Print `text` (or what the callable `text` returns: printing a kernel takes time) when
    WEFT_DUMP asks for `name`."""
    if config.should_dump(name):
        text = text() if callable(text) else text
        print(f"// ----- weft dump: {name} -----", file=sys.stderr)
        print(text if isinstance(text, str) else f"<{len(text)} bytes>", file=sys.stderr)


def run_layout_passes(kernel: Kernel, config=None) -> Kernel:
    """Run the lowlevel passes (verifying between them when asked)."""
    config = config or _config()
    if config.verify or config.debug:
        verify(kernel)
    for name, run in LAYOUT_PASSES:
        kernel = run(kernel)
        if config.verify or config.debug:
            verify(kernel)
        _dump(config, name, lambda: print_kernel(kernel))
    return kernel


def run_tile_passes(kernel: Kernel, config=None) -> Kernel:
    """A `tile` kernel through the inference passes to the `layout` stage."""
    config = config or _config()
    if kernel.stage != "tile":
        raise ValueError(f"kernel `{kernel.name}` is at stage `{kernel.stage}`, not `tile`")
    _dump(config, "tile", lambda: print_kernel(kernel))
    for name, run in TILE_PASSES:
        kernel = run(kernel)
        if config.verify or config.debug:
            verify(kernel)
        _dump(config, name, lambda: format_axis_info(kernel) if name == "axis_analysis" else print_kernel(kernel))
    return kernel


def run_tile_passes_fitted(kernel: Kernel, config=None) -> Kernel:
    """run_tile_passes, again with shallower rings where the launch's would keep fewer CTAs
    on an SM than the registers allow (compiler/ring_depth.py); each run is dumped."""
    config = config or _config()
    quiet = dataclasses.replace(config, dump=frozenset())
    return fit_ring_depth(kernel, lambda candidate: run_tile_passes(candidate, config),
                          lambda candidate: run_layout_passes(candidate, quiet))


def prepare_for_emulator(kernel: Kernel, config=None) -> Kernel:
    """The `layout` IR the emulator runs, for a kernel at `tile` or `layout`, printing what
    WEFT_DUMP asks for as a compile would: the source, the passes and `layout`. The stages
    after `layout` are not built for the emulator, so asking for one says where to get it."""
    config = config or _config()
    _dump(config, "source", kernel.source)
    if kernel.stage == "tile":
        kernel = run_tile_passes_fitted(kernel, config)
    kernel = run_layout_passes(kernel, config)
    _dump(config, "layout", lambda: print_kernel(kernel))
    for name in ("llir", "ptx", "cubin"):
        if name in config.dump:  # only named ones: `all` asks for whatever there is
            _dump(config, name, f"(not built: kernel `{kernel.name}` ran on the CPU emulator; "
                                f"kernel.compile(signature=...) builds {name} without a GPU)")
    return kernel


def _config():
    from .config import current

    return current()


def compile_tile_kernel(kernel: Kernel, params: tuple[Param, ...], source: str = "",
                        target: str = "sm_90a") -> CompiledKernel:
    """Inference passes, then `compile_layout_kernel`, for a `tile`-stage kernel; the
    `tile` text is kept beside the other stages."""
    config = _config()
    _dump(config, "source", source or kernel.source)
    tile = print_kernel(kernel)
    kernel = run_tile_passes_fitted(kernel, config)
    return compile_layout_kernel(kernel, params, source, target, earlier={"tile": tile})


def compile_layout_kernel(kernel: Kernel, params: tuple[Param, ...], source: str = "",
                          target: str = "sm_90a", earlier: Optional[dict] = None) -> CompiledKernel:
    """Passes, LLVM, PTX and (when ptxas is found) cubin for a `layout`-stage kernel
    (`earlier`: the text of stages before `layout`, kept too)."""
    from .backend import ptxas
    from .backend import compile_to_ptx

    if target != "sm_90a":
        raise ValueError(f"weft compiles for sm_90a only (Hopper), got target {target!r}")
    config = _config()
    asm = {"source": source or kernel.source, **(earlier or {})}
    if not earlier:
        _dump(config, "source", asm["source"])
    kernel = run_layout_passes(kernel, config)
    asm["layout"] = print_kernel(kernel)
    _dump(config, "layout", asm["layout"])
    from .backend import static_shared_bytes

    llir, ptx = compile_to_ptx(kernel)
    asm["llir"], asm["ptx"] = llir, ptx
    _dump(config, "llir", llir)
    _dump(config, "ptx", ptx)
    # The launcher passes shared - static_shared as dynamic shared memory.
    metadata = {"num_warps": kernel.num_warps, "total_warps": kernel.total_warps, "shared": kernel.shared_bytes,
                "static_shared": static_shared_bytes(kernel)}
    if ptxas.find_ptxas() is not None:
        cubin, report = ptxas.assemble(ptx, arch=target)
        asm["cubin"] = cubin
        metadata.update(report)
    return CompiledKernel(name=kernel.name, params=params + hidden_params(kernel), num_warps=kernel.num_warps,
                          shared=kernel.shared_bytes, asm=asm, metadata=metadata,
                          cluster=None if kernel.cluster == (1, 1, 1) else kernel.cluster,
                          total_warps=kernel.total_warps)
