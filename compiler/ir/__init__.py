"""The IR: SSA values, one frozen dataclass per op, blocks, kernels.

`core` holds values, the op base class and blocks; `ops` the ops any kernel may hold;
`hopper` the Hopper async machinery; this module the kernel, and re-exports them all.

An op's fields are typed: `result`/`results` are the values it defines, fields holding a
`Value` (or a tuple of them, or None) are its operands, fields holding a `Block` are its
regions, everything else is an attribute. Passes never mutate an op; they build a new one
with `dataclasses.replace` and a new block around it.

Values compare by identity: two values are the same value only if they are the same object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from ..types import PointerType, ScalarType, TensorDescriptorType  # noqa: F401 (re-exported)
from .core import *  # noqa: F401,F403
from .core import Block, Op, Value
from .hopper import *  # noqa: F401,F403
from .hopper import WarpSpecialize
from .ops import *  # noqa: F401,F403


@dataclass(frozen=True)
class Kernel:
    """One kernel: parameters (values), body, and launch facts.

    `shared_bytes` is the kernel's total shared memory, set by allocation.
    """

    name: str
    params: tuple[Value, ...]
    body: Block
    num_warps: int
    source: str = ""
    constexprs: tuple[tuple[str, Any], ...] = ()
    shared_bytes: int = 0
    stage: str = "layout"
    # Per parameter, a power of two known to divide it (integers: the value; pointers: the
    # address in bytes), from launch specialization; 1 when nothing is known.
    param_divisibility: tuple[int, ...] = ()
    language: str = "lowlevel"  # the language it was written in (its registered layout classes)
    cluster: tuple[int, int, int] = (1, 1, 1)  # CTAs per cluster it launches in
    # The launch option maxnreg: registers a thread may hold at most (None: as many as the
    # block size allows), so that more CTAs fit on an SM.
    max_registers: Optional[int] = None
    # (descriptor parameter, "shape" or "strides", dim) of each hidden parameter: the last
    # len(hidden_params) params, which the kernel reads as `desc.shape[dim]` and the
    # launcher fills from that descriptor argument (compiled.Param.hidden).
    hidden_params: tuple[tuple[str, str, int], ...] = ()
    # The launch option num_stages (highlevel): the stages a dot loop without
    # tl.range(num_stages=) is pipelined over (None or below 2: not pipelined).
    num_stages: Optional[int] = None
    # The launch option issue_dots_early (highlevel): a loop's dot that does not read the
    # one before it is issued right after it (compiler/passes/issue_dots_early.py).
    issue_dots_early: bool = True
    # The launch option sink_waits (highlevel): a wgmma wait(0) moves into the next wait(0)
    # past wgmmas that do not read its results (compiler/passes/merge_wgmma_waits.py).
    sink_waits: bool = False
    # The launch option fit_rings (highlevel): rings shallower than num_stages where the
    # launch's would keep fewer CTAs on an SM than the registers allow (compiler/ring_depth.py).
    fit_rings: bool = True
    # The launch option hoist_slot_loads (highlevel): a loop's shared loads of ring slots
    # issued before its first wgmma (compiler/passes/hoist_slot_loads.py).
    hoist_slot_loads: bool = False
    # The launch option dot_ahead (highlevel): True asks issue_dot_ahead to issue an
    # attention-style loop's next Q K^T with this block's P V (where the tiles fit the
    # registers); False or None keep the loop as pipeline_dot_loops scheduled it. A string
    # asks for it too, naming the anchor of P V's wait (WarpgroupMmaWait.ANCHORS, "none").
    dot_ahead: Optional[bool | str] = None
    # The launch option pingpong (highlevel): the consumer warpgroups of a warp-specialized
    # two-dot loop take turns at issuing their wgmmas (pingpong_warpgroups); "after_wait"
    # hands the turn over once the first dot is waited for rather than issued. None (not
    # given): turns wherever they apply; False: none.
    pingpong: Optional[bool | str] = None
    # Block-pointer loads the frontend built both ways, through pointers and by TMA
    # (compiler/passes/stage_block_pointers.py keeps one of each and clears this).
    block_pointer_loads: tuple = ()

    def walk(self) -> Iterator[Op]:
        return self.body.walk()

    @property
    def total_warps(self) -> int:
        """Warps the CTA launches with: num_warps plus the workers of its warp_specialize
        (the largest, when there are several)."""
        workers = [op.worker_warps() for op in self.walk() if isinstance(op, WarpSpecialize)]
        return self.num_warps + max(workers, default=0)

    def with_body(self, body: Block, **changes) -> "Kernel":
        return dataclasses.replace(self, body=body, **changes)


__all__ = [name for name in dir() if not name.startswith("_")]
