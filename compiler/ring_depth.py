"""fit_ring_depth: a kernel whose rings would keep fewer CTAs on an SM than its registers
allow gets shallower rings.

The launch's `num_stages` sets the depth of every ring pipeline_dot_loops builds. Each
iteration of a loop that runs several dots (attention backward's dK/dV loop: four, its dQ
loop: three) takes several times a one-dot iteration, so a ring a few slots deep already
issues its copies far enough ahead; the slots beyond that only take shared memory. At
head_dim 128 the tutorial's backward at 5 stages needs 146 KB a CTA, so one CTA runs on
an SM, where the register file holds two of its 4-warp CTAs at any register count
(65536 / (128 x 256)).

So, for a kernel launched with num_stages = S > 2 whose pipelined loops all run two or
more wgmmas an iteration: when the CTAs an SM's shared memory holds (SM_SHARED over the
kernel's bytes plus the driver's 1 KB a CTA) are fewer than the CTAs its register file
holds at the most registers a thread may have (MAX_REGISTERS rounded up to the
8-register allocation unit, or the launch's maxnreg), the inference passes run again with
S - 1, S - 2, ... down to 2 stages, and the deepest ring that fits that many CTAs is kept.
None fitting, S is kept. A loop that asked tl.range(num_stages=) keeps its own depth; the
launch option `fit_rings=False` keeps S everywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .hardware import MAX_REGISTERS, REGISTER_FILE, SHARED_RESERVED_PER_CTA, SM_SHARED
from .ir import AsyncCopyWaitGroup, For, Kernel, WarpgroupMma

NAME = "fit_ring_depth"

REGISTER_UNIT = 8  # registers a thread is given in multiples of (256 a warp)
MIN_STAGES = 2
MIN_DOTS = 2  # wgmmas an iteration from which a shallower ring still issues its copies far enough ahead


def register_ctas(kernel: Kernel) -> int:
    """CTAs of `kernel` an SM's register file holds whatever registers ptxas gives a thread."""
    per_thread = kernel.max_registers or MAX_REGISTERS
    per_thread = -(-per_thread // REGISTER_UNIT) * REGISTER_UNIT
    return REGISTER_FILE // (kernel.total_warps * 32 * per_thread)


def shared_ctas(shared_bytes: int) -> int:
    """CTAs an SM's shared memory holds at `shared_bytes` a CTA."""
    return SM_SHARED // (shared_bytes + SHARED_RESERVED_PER_CTA)


def _ring_loops_run_several_dots(kernel: Kernel) -> bool:
    """Whether `kernel` has cp.async-pipelined loops and each runs MIN_DOTS or more wgmmas."""
    loops = [op for op in kernel.walk() if isinstance(op, For)
             and any(isinstance(inner, AsyncCopyWaitGroup) for inner in op.body.ops)]
    return bool(loops) and all(sum(isinstance(inner, WarpgroupMma) for inner in loop.body.walk()) >= MIN_DOTS
                               for loop in loops)


def fit_ring_depth(kernel: Kernel, tile_passes: Callable[[Kernel], Kernel],
                   layout_passes: Callable[[Kernel], Kernel]) -> Kernel:
    """`kernel` (at `tile`) through `tile_passes`, at the deepest ring from its num_stages
    down that lets as many CTAs share an SM as its registers do (see the module
    docstring). `layout_passes` measures a candidate's shared memory."""
    inferred = tile_passes(kernel)
    stages = kernel.num_stages
    if not kernel.fit_rings or stages is None or stages <= MIN_STAGES or not _ring_loops_run_several_dots(inferred):
        return inferred
    wanted = register_ctas(inferred)
    if wanted < 2 or shared_ctas(layout_passes(inferred).shared_bytes) >= wanted:
        return inferred
    for fewer in range(stages - 1, MIN_STAGES - 1, -1):
        candidate = tile_passes(dataclasses.replace(kernel, num_stages=fewer))
        if shared_ctas(layout_passes(candidate).shared_bytes) >= wanted:
            return candidate
    return inferred
