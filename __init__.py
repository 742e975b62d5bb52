"""weft: a Python GPU kernel language and compiler for NVIDIA Hopper (sm_90a).

Public API re-exports only; see docs/design.md for the architecture.
"""

__version__ = "0.1.0"

from . import layouts  # noqa: F401
from .layouts import LayoutError, LinearLayout  # noqa: F401
