"""The CPU emulator: runs `layout`-stage IR thread-faithfully on numpy (docs/design.md, runtime/).

    emulate(kernel, grid, args, *, rules=None, stream=None) -> None

runs every program of `grid` in turn on host arrays (numpy, or CPU torch tensors through
`.numpy()` views; results land in them in place) and Python numbers for scalar parameters.
Within a program each distributed tensor is held per thread, (num_warps, 32, registers),
laid out by its layout; shared memory is a byte array at the addresses the backend
computes, with race tracking between barriers; reductions and conversions run the plans
the GPU code runs. Faults, races and failed asserts raise `EmulationError` naming the
source line (and, for races, the other access's line).

The Hopper async machinery is modelled thread-faithfully too: mbarrier phases and
transaction counts (mbarrier.py), TMA and cp.async copies with their completion points
(tma.py, async_copy.py), wgmma reading shared memory through its layouts (warpgroup_mma.py;
mma.sync in mma_v2.py) and warp-specialized partitions as cooperative coroutines with deadlock reports
(partitions.py); happens-before between warps, async copies and the proxy fence is
tracked per shared byte (ordering.py).

Rules live in a table (`EMULATION_RULES`), one function per op class, registered by the
op-family modules imported below; copy it to add rules locally (`RuleTable.copy`).
`tensor_to_registers` / `registers_to_tensor` move whole tensors in and out of registers.
"""

from . import control, elementwise, global_memory, reduce, shape_ops, shared_memory  # noqa: F401  (register rules)
from . import atomics  # noqa: F401  (register rules)
from . import async_copy, mbarrier, mma_v2, partitions, tensormaps, tma, warpgroup_mma  # noqa: F401  (Hopper and MMA rules)
from .dtypes import from_bf16, to_bf16
from .errors import EmulationError
from .host_pointers import reachable
from .interpreter import CTA, SharedRef, emulate
from .registers import registers_to_tensor, tensor_to_registers
from .rules import EMULATION_RULES, RuleTable

__all__ = ["emulate", "reachable", "EmulationError", "EMULATION_RULES", "RuleTable", "CTA", "SharedRef",
           "tensor_to_registers", "registers_to_tensor", "to_bf16", "from_bf16"]
