"""What the emulation rules of the async ops share (tma, async_copy, mbarrier, warpgroup_mma).

"One thread issues" ops run once per partition execution, where the op's `pred` (one
value across the threads) holds (`predicate`); `partition_warps` are the warps that run
them. Groups (cp.async commit groups, TMA store groups, wgmma groups) are kept per
partition, which executes uniformly, standing for every thread's identical groups
(`async_state`). In a cluster, a CTA's shared window is addressed by its rank (`in_rank`,
`check_rank`, `cluster_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...compiler import ir
from .dtypes import element_bytes
from .errors import EmulationError
from .interpreter import SharedRef


def partition_warps(cta) -> np.ndarray:
    """The CTA warps the running partition (or the whole kernel) executes on."""
    return np.arange(cta.warp_base, cta.warp_base + cta.num_warps)


def predicate(cta, pred: Optional[ir.Value], op) -> bool:
    if pred is None:
        return True
    x = np.asarray(cta[pred])
    if x.ndim and not (x == x.reshape(-1)[0]).all():
        raise EmulationError(f"`{op.NAME}` pred differs between threads; one thread issues it, "
                             f"so it must be a scalar", op.loc)
    return bool(x.reshape(-1)[0])


def in_rank(cta, addresses, rank: int):
    """The same shared offsets in the window of the cluster's CTA `rank` (mapa)."""
    return addresses + (rank - cta.rank) * cta.shared.window


def check_rank(cta, rank: int, op, what: str) -> int:
    """A rank of the CTA's cluster (a launch without `cluster=` has clusters of one)."""
    ctas = cta.shared.ctas
    if not 0 <= rank < ctas:
        cluster = ("the launch has clusters of one CTA (rank 0); launch with cluster= for more" if ctas == 1
                   else f"the cluster has {ctas} CTAs (ranks 0-{ctas - 1})")
        raise EmulationError(f"{what}: rank {rank} is not a CTA of the cluster: {cluster}", op.loc)
    return rank


def cluster_ranks(cta, mask: int, op, what: str) -> list[int]:
    """The ranks a multicast mask names, each one a CTA of the cluster."""
    ranks = [r for r in range(16) if mask >> r & 1]
    if not ranks or mask >> 16:
        raise EmulationError(f"{what}: mask {mask:#x} must name 1 to 16 ranks (bits 0-15)", op.loc)
    for rank in ranks:
        check_rank(cta, rank, op, f"{what} mask {mask:#x}")
    return ranks


@dataclass
class PartitionAsync:
    """One partition's async groups, oldest first (indices into Ordering.records)."""

    copies: list = field(default_factory=list)        # cp.async not yet committed
    copy_groups: list = field(default_factory=list)   # committed cp.async groups
    store_groups: list = field(default_factory=list)  # TMA stores (each its own group)
    dot_groups: list = field(default_factory=list)    # wgmma groups (warpgroup_mma.py)


def async_state(cta) -> PartitionAsync:
    if cta.async_state is None:
        cta.async_state = PartitionAsync()
    return cta.async_state


def byte_rows(addresses: np.ndarray, size: int) -> np.ndarray:
    """Every byte of the elements at `addresses` (flattened)."""
    return (np.asarray(addresses, dtype=np.int64).reshape(-1)[:, None] + np.arange(size)).reshape(-1)


def view_addresses(cta, op, ref: SharedRef) -> np.ndarray:
    """Byte address of every element of a shared buffer or view, in its shape."""
    def offsets():
        grids = np.meshgrid(*(np.arange(s) for s in ref.type.shape), indexing="ij")
        (flat,) = ref.addressing(**{f"dim{i}": g for i, g in enumerate(grids)})
        return np.asarray(flat, dtype=np.int64)
    element_offsets = cta.memo(op, ("elements", id(ref.addressing), tuple(ref.type.shape)), offsets)
    return ref.offset + (element_offsets ^ ref.xor) * element_bytes(ref.type.element)
