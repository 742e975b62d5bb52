"""Names of Triton's `triton.language` that weft.highlevel does not provide (yet).

Code ported from Triton reaches for these by habit; `tl.sort` should say that weft has no
`sort` here and what to use instead, not raise a bare AttributeError. The list is written
from Triton's public `triton.language` reference; each name maps to the nearest weft
alternative ("" when there is none). A name leaves this table when highlevel gains it
(tests/highlevel/test_language.py checks that no name here is also defined).
"""

from __future__ import annotations

_LOWLEVEL_MMA = "write the matmul in weft.lowlevel with ll.warpgroup_mma (Hopper wgmma)"
_POINTERS = "index with pointer arithmetic (tl.arange offsets and masks) in the shape you need"
_SPECIALIZED = ("weft specialises each launch on which integer arguments are divisible by 16 "
                "and which pointers are 16-byte aligned; the hint is not needed")
_REDUCTIONS = "use tl.sum, tl.max, tl.min, tl.argmax or tl.argmin"

TRITON_ONLY_NAMES: dict[str, str] = {
    # linear algebra
    "dot_scaled": _LOWLEVEL_MMA,
    # shape manipulation
    "cat": _POINTERS,
    "flip": _POINTERS,
    "gather": "tl.load from the gathered addresses",
    "cast": "x.to(dtype)",
    # memory and pointers
    # compiler hints
    # reductions, scans and sorts
    "reduce": _REDUCTIONS,
    "xor_sum": _REDUCTIONS,
    "sort": "",
    "topk": "",
    "histogram": "",
    # math
    "extra": "",
    "clamp": "tl.minimum(tl.maximum(x, low), high)",
    "sigmoid": "1 / (1 + tl.exp(-x))",
    "softmax": "compose tl.max, tl.exp and tl.sum",
    "inline_asm_elementwise": "",
    "swizzle2d": "compute the tile indices from tl.program_id with integer arithmetic",
    # types
    "block_type": "",
    "void": "",
    "float8e4b15": "tl.float8e4nv or tl.float8e5",
    "float8e4b8": "tl.float8e4nv or tl.float8e5",
    "float8e5b16": "tl.float8e4nv or tl.float8e5",
}


def unsupported_name_error(module: str, name: str) -> AttributeError:
    """The AttributeError for `module.name`: a Triton name says so and what to use instead;
    any other name gets Python's usual message."""
    if name not in TRITON_ONLY_NAMES:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    alternative = TRITON_ONLY_NAMES[name]
    message = f"`tl.{name}` is not supported by weft.highlevel yet"
    return AttributeError(message + (f"; instead, {alternative}" if alternative else ""))
