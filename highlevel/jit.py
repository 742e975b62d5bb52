"""`@hl.jit`: a highlevel kernel, traced at the `tile` stage and lowered by the inference
passes (`compiler.pipeline.TILE_PASSES`) to the `layout` IR the lowlevel pipeline takes."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from ..compiler.compiled import Param
from ..compiler.ir import WarpgroupMmaWait


def compile_kernel(jit_fn: Any, signature: dict, constexprs: dict, specialization: dict,
                   options: dict) -> Any:
    """The runtime's `compile_fn`: frontend, inference passes, then the lowlevel passes and
    the backend (for the emulator target, the `layout` IR after the lowlevel passes)."""
    from ..compiler import pipeline
    from ..compiler.frontend import build_kernel
    from ..runtime.arguments import check_cluster, check_maxnreg

    kernel = build_kernel(jit_fn, signature, constexprs, options.get("num_warps", 4), specialization,
                          language="highlevel", cluster=check_cluster(jit_fn.__name__, options.get("cluster")),
                          max_registers=check_maxnreg(jit_fn.__name__, options.get("maxnreg")))
    if options.get("num_stages") is not None:
        kernel = dataclasses.replace(kernel, num_stages=check_num_stages(jit_fn.__name__, options["num_stages"]))
    if options.get("issue_dots_early") is not None:
        kernel = dataclasses.replace(kernel, issue_dots_early=check_issue_dots_early(jit_fn.__name__,
                                                                                     options["issue_dots_early"]))
    if options.get("sink_waits") is not None:
        kernel = dataclasses.replace(kernel, sink_waits=check_bool_option(jit_fn.__name__, "sink_waits",
                                                                          options["sink_waits"]))
    if options.get("hoist_slot_loads") is not None:
        kernel = dataclasses.replace(kernel, hoist_slot_loads=check_bool_option(jit_fn.__name__, "hoist_slot_loads",
                                                                                options["hoist_slot_loads"]))
    if options.get("fit_rings") is not None:
        kernel = dataclasses.replace(kernel, fit_rings=check_bool_option(jit_fn.__name__, "fit_rings",
                                                                         options["fit_rings"]))
    if options.get("dot_ahead") is not None:
        kernel = dataclasses.replace(kernel, dot_ahead=check_dot_ahead(jit_fn.__name__, options["dot_ahead"]))
    if options.get("pingpong") is not None:
        if not isinstance(options["pingpong"], bool) and options["pingpong"] != "after_wait":
            raise ValueError(f"kernel '{jit_fn.__name__}': pingpong must be True, False or 'after_wait' (the turn "
                             f"passed once the first dot is waited for), got {options['pingpong']!r}")
        kernel = dataclasses.replace(kernel, pingpong=options["pingpong"])
    from ..compiler.passes.stage_block_pointers import stage_block_pointers
    kernel = stage_block_pointers(kernel, keep_pointers=options.get("block_pointer_tma") is not None and not (
        check_bool_option(jit_fn.__name__, "block_pointer_tma", options["block_pointer_tma"])))
    # After the block pointers' choice (the pipeline's own stage_block_pointers then has
    # nothing left to do): pointer loads proven boxes go by TMA unless pointer_tma=False.
    if options.get("pointer_tma") is None or check_bool_option(jit_fn.__name__, "pointer_tma", options["pointer_tma"]):
        from .pointer_tma import stage_pointer_loads_by_tma
        kernel = stage_pointer_loads_by_tma(kernel)
    if options.get("target") == "emulator":
        return pipeline.prepare_for_emulator(kernel)
    params = tuple(Param(name, text) for name, text in signature.items())
    return pipeline.compile_tile_kernel(kernel, params, target=options.get("target", "sm_90a"))


def check_issue_dots_early(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"kernel '{name}': issue_dots_early must be True or False, got {value!r}")
    return value


def check_bool_option(name: str, option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"kernel '{name}': {option} must be True or False, got {value!r}")
    return value


def check_num_stages(name: str, num_stages: Any) -> int:
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 0:
        raise ValueError(f"kernel '{name}': num_stages must be an int >= 0 (0 or 1: no pipelining), "
                         f"got {num_stages!r}")
    return num_stages


def check_dot_ahead(name: str, dot_ahead: Any):
    """True, False, or the name of the instruction that holds P V's wait below the softmax
    (issue_dot_ahead: WarpgroupMmaWait.ANCHORS, or "none")."""
    if not isinstance(dot_ahead, bool) and dot_ahead not in WarpgroupMmaWait.ANCHORS + ("none",):
        raise ValueError(f"kernel '{name}': dot_ahead must be True or False (or left out: off), or one of "
                         f"{', '.join(repr(a) for a in WarpgroupMmaWait.ANCHORS + ('none',))}, got {dot_ahead!r}")
    return dot_ahead


def jit(fn: Optional[Callable] = None, *, emulate_fn: Optional[Callable] = None,
        constexpr_names: Sequence[str] = (), launch_metadata: Optional[Callable] = None):
    """`@hl.jit`: launch as `kernel[grid](...)` (host arrays run on the CPU emulator);
    other @jit functions a kernel calls are inlined into it. `launch_metadata` (Triton's
    profiler hook, a function of (grid, kernel, args)) is accepted and kept on the kernel
    as `.launch_metadata`; weft has no profiler that calls it yet."""
    from ..lowlevel.jit import emulate_kernel
    from ..runtime.jit import jit as runtime_jit

    if launch_metadata is not None and not callable(launch_metadata):
        raise TypeError(f"jit(launch_metadata=...) takes a function of (grid, kernel, args), "
                        f"found {launch_metadata!r}")

    def make(function: Callable):
        kernel = runtime_jit(function, compile_fn=compile_kernel, emulate_fn=emulate_fn or emulate_kernel,
                             constexpr_names=constexpr_names)
        kernel.launch_metadata = launch_metadata
        return kernel

    return make if fn is None else make(fn)
