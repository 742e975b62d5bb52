"""`@ll.jit`: a lowlevel kernel, compiled by the frontend and the layout pipeline."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..compiler.compiled import Param
from ..runtime.arguments import LaunchError

MAX_CLUSTER_CTAS = 8  # CTAs per cluster any sm_90 launch may take without opting into more


def compile_kernel(jit_fn: Any, signature: dict, constexprs: dict, specialization: dict,
                   options: dict) -> Any:
    """The runtime's `compile_fn`: frontend, then the lowlevel passes and the backend
    (for the emulator target, the `layout` IR after the passes)."""
    from ..compiler import pipeline
    from ..compiler.frontend import build_kernel

    cluster = _cluster(options.get("cluster"), jit_fn)
    if options.get("target") == "emulator" and cluster is not None:
        raise LaunchError(f"kernel '{jit_fn.__name__}' launched with cluster={options['cluster']}: the CPU "
                          f"emulator runs clusters of one CTA; launch on the GPU, or without `cluster=`")
    kernel = build_kernel(jit_fn, signature, constexprs, options.get("num_warps", 4), specialization)
    if options.get("target") == "emulator":
        return pipeline.run_layout_passes(kernel)
    params = tuple(Param(name, text) for name, text in signature.items())
    compiled = pipeline.compile_layout_kernel(kernel, params, target=options.get("target", "sm_90a"))
    compiled.cluster = cluster
    return compiled


def _cluster(value: Any, jit_fn: Any) -> Optional[tuple[int, int, int]]:
    """The `cluster=` launch option as CTA counts (x, y, z); None for one CTA."""
    if value is None:
        return None
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise LaunchError(f"kernel '{jit_fn.__name__}': cluster={value!r} must be 1-3 positive ints (CTAs "
                          f"per cluster along x, y, z)")
    dims = (dims + (1, 1))[:3]
    if dims[0] * dims[1] * dims[2] > MAX_CLUSTER_CTAS:
        raise LaunchError(f"kernel '{jit_fn.__name__}': cluster={value!r} has {dims[0] * dims[1] * dims[2]} "
                          f"CTAs; Hopper's portable limit is {MAX_CLUSTER_CTAS}")
    return None if dims == (1, 1, 1) else dims


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
