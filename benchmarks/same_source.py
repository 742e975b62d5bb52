"""weft.highlevel kernels compiled by Triton from their own source, for the benchmarks that
time both compilers on the same source. Only used where Triton is installed."""

from __future__ import annotations

import importlib.util
import inspect
import os
import tempfile


def triton_module(name: str, *kernels):
    """A module holding `kernels` (weft.highlevel jit functions, helpers before their
    callers) as Triton kernels: their source in a module that imports triton.language as
    tl, each decorator spelled triton.jit. ImportError where Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        raise ImportError("no module named 'triton'")
    parts = ["import triton\nimport triton.language as tl\n"]
    parts += [inspect.getsource(kernel.fn).replace("@tl.jit", "@triton.jit", 1) for kernel in kernels]
    path = os.path.join(tempfile.mkdtemp(prefix=f"weft_{name}_"), f"{name}.py")
    with open(path, "w") as f:
        f.write("\n\n".join(parts))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
