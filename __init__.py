"""weft: a Python GPU kernel language and compiler for NVIDIA Hopper (sm_90a).

Public API re-exports only; see docs/design.md for the architecture.
"""

__version__ = "0.1.0"

from . import layouts  # noqa: F401
from .layouts import LayoutError, LinearLayout  # noqa: F401


_RUNTIME_NAMES = ("autotune", "Config", "heuristics")  # runtime/autotune.py, for both languages


def __getattr__(name: str):
    """`weft.autotune`, `weft.Config`, `weft.heuristics`, imported on first use so that
    `import weft` stays light."""
    if name in _RUNTIME_NAMES:
        from .runtime import autotune as module

        return getattr(module, name)
    raise AttributeError(f"module 'weft' has no attribute {name!r}")
