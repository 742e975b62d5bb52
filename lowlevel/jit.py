"""`@ll.jit`: a lowlevel kernel, compiled by the frontend and the layout pipeline."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..compiler.compiled import Param
from ..runtime.arguments import check_cluster, check_maxnreg


def compile_kernel(jit_fn: Any, signature: dict, constexprs: dict, specialization: dict,
                   options: dict) -> Any:
    """The runtime's `compile_fn`: frontend, then the lowlevel passes and the backend
    (for the emulator target, the `layout` IR after the passes)."""
    from ..compiler import pipeline
    from ..compiler.frontend import build_kernel

    kernel = build_kernel(jit_fn, signature, constexprs, options.get("num_warps", 4), specialization,
                          cluster=check_cluster(jit_fn.__name__, options.get("cluster")),
                          max_registers=check_maxnreg(jit_fn.__name__, options.get("maxnreg")))
    if options.get("target") == "emulator":
        return pipeline.prepare_for_emulator(kernel)
    params = tuple(Param(name, text) for name, text in signature.items())
    return pipeline.compile_layout_kernel(kernel, params, target=options.get("target", "sm_90a"))


def emulate_kernel(kernel: Any, grid: tuple, args: tuple) -> None:
    """The runtime's `emulate_fn`: run the `layout` IR on the CPU emulator."""
    from ..runtime.emulator import emulate

    emulate(kernel, grid, args)


def jit(fn: Optional[Callable] = None, *, emulate_fn: Optional[Callable] = None,
        constexpr_names: Sequence[str] = ()):
    """`@ll.jit`: launch as `kernel[grid](...)` (host arrays run on the CPU emulator);
    other @jit functions a kernel calls are inlined into it."""
    from ..runtime.jit import jit as runtime_jit

    return runtime_jit(fn, compile_fn=compile_kernel, emulate_fn=emulate_fn or emulate_kernel,
                       constexpr_names=constexpr_names)
