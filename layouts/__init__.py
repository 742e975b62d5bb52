"""weft.layouts: the GF(2) linear-layout algebra, and the layout descriptions kernels name
(BlockedLayout, NVMMASharedLayout, ...) as values built on it (numpy and the standard
library only; nothing else of weft)."""

from .errors import LayoutError
from .linear_layout import LinearLayout, identity_1d, identity_layout, zeros_1d
from .standard import (
    blocked,
    default_nvmma_swizzle,
    dot_operand,
    mma_v2,
    nvmma_shared,
    slice_layout,
    swizzled_shared,
    wgmma_accumulator,
    wgmma_operand_a,
)
from .banks import bank_conflicts, vector_width
from .conversion import plan_conversion
from .execute import collect, distribute, execute_plan
from .plans import NoOp, Plan, RegisterPermutation, SharedRoundTrip, ShuffleRound, WarpShuffle
from .description import LayoutDescription
from .distributed import (BlockedLayout, DistributedLayout, DotOperandLayout, LinearDistributedLayout,
                          NVMMADistributedLayout, SliceLayout, as_distributed)
from .shared_layouts import (LinearSharedLayout, MBarrierLayout, NVMMASharedLayout, SharedLayout,
                             SwizzledSharedLayout, as_shared, describe)
