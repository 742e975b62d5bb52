"""The backend: `layout` IR -> LLVM IR (llvmlite.ir) -> PTX for sm_90a (-> cubin by ptxas).

    llir = lower_to_llvm(kernel)      # LLVM IR text
    ptx = emit_ptx(llir)              # O3 pipeline, then the NVPTX code generator
    llir, ptx = compile_to_ptx(kernel)

Lowering rules live next to their op family (lower_*.py) and register themselves in
`DEFAULT_RULES` with `@lowers(OpClass)`; `lower_to_llvm(kernel, rules=...)` takes another
table (e.g. `{**DEFAULT_RULES, MyOp: my_rule}`) without touching the default one.
"""

from __future__ import annotations

from ..ir import Kernel
# Importing the families registers their rules in DEFAULT_RULES.
from . import (lower_atomic, lower_cast, lower_control, lower_convert, lower_debug, lower_elementwise,  # noqa: F401
               lower_math, lower_memory, lower_reduce, lower_shape, lower_shared)
from . import lower_mma_v2, lower_warpgroup_mma  # noqa: F401
from . import lower_async_copy, lower_mbarrier, lower_tensormap, lower_tma, lower_warp_specialize  # noqa: F401
from .context import DEFAULT_RULES, Lowering, SharedView, lowers
from .lower_kernel import STATIC_SHARED_LIMIT, lower_to_llvm, static_shared_bytes, uses_dynamic_shared_memory
from .target import emit_ptx, llvm_version, optimized_llir


def compile_to_ptx(kernel: Kernel, rules=None) -> tuple[str, str]:
    """(LLVM IR text, PTX text) for a kernel at the `layout` stage."""
    llir = lower_to_llvm(kernel, rules)
    return llir, emit_ptx(llir)


__all__ = [
    "DEFAULT_RULES", "Lowering", "STATIC_SHARED_LIMIT", "SharedView", "compile_to_ptx", "emit_ptx",
    "llvm_version", "lower_to_llvm", "lowers", "optimized_llir", "static_shared_bytes", "uses_dynamic_shared_memory",
]
