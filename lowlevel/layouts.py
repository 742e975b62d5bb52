"""The layouts lowlevel kernels name, under their old import path: they live in weft.layouts
(layouts/distributed.py, layouts/shared_layouts.py), beside the algebra they build on."""

from ..layouts import (BlockedLayout, DistributedLayout, DotOperandLayout, LinearDistributedLayout,
                       LinearSharedLayout, MBarrierLayout, NVMMADistributedLayout, NVMMASharedLayout, SharedLayout,
                       SliceLayout, SwizzledSharedLayout, as_distributed, as_shared, describe)

__all__ = ["BlockedLayout", "DistributedLayout", "DotOperandLayout", "LinearDistributedLayout",
           "LinearSharedLayout", "MBarrierLayout", "NVMMADistributedLayout", "NVMMASharedLayout", "SharedLayout",
           "SliceLayout", "SwizzledSharedLayout", "as_distributed", "as_shared", "describe"]
