"""Inline PTX of Hopper's async machinery: mbarrier, TMA (cp.async.bulk.tensor), cp.async,
setmaxnreg. Each function returns `(asm_text, constraints)` for `llvmlite.ir.InlineAsm`,
with the PTX ISA section it follows (constraint letters as in `ptx_asm`: `b` predicate,
`r` 32-bit, `l` 64-bit).

Shared-memory operands are 32-bit shared::cta addresses (`r`); a shared::cta address is
also a valid shared::cluster address of the executing CTA, which TMA loads take. The
TMA descriptor is the 64-bit generic address of the tensor map (`l`). Labels inside
`{ }` are local to that block, so a wait loop may appear many times in one kernel.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html
"""

from __future__ import annotations

ISA = "https://docs.nvidia.com/cuda/parallel-thread-execution/index.html"


def _guard(predicated: bool, index: int) -> str:
    return f"@${index} " if predicated else ""


# ------------------------------------------------------------------------ mbarrier
def mbarrier_init(count: int) -> tuple[str, str]:
    """Initialise the mbarrier at $0 for phases of `count` arrivals, where $1 holds; then
    make the initialisation visible to other threads and to the async proxy (TMA's
    complete_tx) before the CTA barrier that follows.

    Operands: the barrier ($0, shared address), the predicate ($1).
    mbarrier.init: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-init
    fence.mbarrier_init: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar
    """
    return (f"@$1 mbarrier.init.shared::cta.b64 [$0], {count};\n\t"
            "@$1 fence.mbarrier_init.release.cluster;"), "r,b"


def mbarrier_expect(nbytes: int) -> tuple[str, str]:
    """One arrival on the mbarrier at $0 that also raises its expected transaction count
    by `nbytes`, where $1 holds.

    mbarrier.arrive.expect_tx: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-arrive
    """
    return f"@$1 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {nbytes};", "r,b"


def mbarrier_arrive(count: int) -> tuple[str, str]:
    """`count` arrivals (release, CTA scope) on the mbarrier at $0, where $1 holds.

    mbarrier.arrive: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-arrive
    """
    return f"@$1 mbarrier.arrive.shared::cta.b64 _, [$0], {count};", "r,b"


def mbarrier_wait() -> tuple[str, str]:
    """Spin until the phase of parity $1 (0 or 1) of the mbarrier at $0 has completed
    (try_wait suspends the thread for a while before each retry).

    mbarrier.try_wait: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-test-wait-try-wait
    """
    text = ("{\n\t.reg .pred done;\n\twait_phase:\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n\t"
            "@!done bra.uni wait_phase;\n\t}")
    return text, "r,r"


def mbarrier_invalidate() -> tuple[str, str]:
    """Retire the mbarrier at $0, where $1 holds.

    mbarrier.inval: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-inval
    """
    return "@$1 mbarrier.inval.shared::cta.b64 [$0];", "r,b"


# ----------------------------------------------------------------------------- TMA
def tma_load(rank: int) -> tuple[str, str]:
    """Copy one box of a tensor into shared memory; its bytes complete on an mbarrier.

    Operands: the destination ($0, shared), the descriptor ($1, generic 64-bit), the
    mbarrier ($2, shared), the coordinates ($3.., innermost first), the predicate.
    cp.async.bulk.tensor: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-tensor
    """
    coords = ", ".join(f"${3 + i}" for i in range(rank))
    text = (f"@${3 + rank} cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes "
            f"[$0], [$1, {{{coords}}}], [$2];")
    return text, ",".join(["r", "l", "r"] + ["r"] * rank + ["b"])


def tma_store(rank: int) -> tuple[str, str]:
    """Copy a shared-memory box to the tensor, then close this thread's bulk group.

    Operands: the descriptor ($0), the source ($1, shared), the coordinates ($2..,
    innermost first), the predicate.
    cp.async.bulk.tensor: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-tensor
    cp.async.bulk.commit_group: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-commit-group
    """
    coords = ", ".join(f"${2 + i}" for i in range(rank))
    guard = f"@${2 + rank} "
    text = (f"{guard}cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group [$0, {{{coords}}}], [$1];\n\t"
            f"{guard}cp.async.bulk.commit_group;")
    return text, ",".join(["l", "r"] + ["r"] * rank + ["b"])


def tma_store_wait(pending: int) -> tuple[str, str]:
    """Wait until at most `pending` bulk groups of this thread still read shared memory.

    cp.async.bulk.wait_group: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-wait-group
    """
    return f"cp.async.bulk.wait_group.read {pending};", ""


# ------------------------------------------------------------------------ cp.async
def async_copy(nbytes: int, predicated: bool) -> tuple[str, str]:
    """Copy `nbytes` (4, 8 or 16) from global to shared memory without registers; only
    the first $2 bytes are read and the rest are zero-filled (so 0 fills all).

    16-byte copies cache in L2 only (.cg, which allows 16 bytes only); smaller ones in
    L1 too (.ca). Operands: the destination ($0, shared), the source ($1, global), the
    source size ($2), then the predicate ($3) when `predicated`.
    cp.async: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async
    """
    if nbytes not in (4, 8, 16):
        raise ValueError(f"cp.async copies 4, 8 or 16 bytes, not {nbytes}")
    cache = "cg" if nbytes == 16 else "ca"
    text = f"{_guard(predicated, 3)}cp.async.{cache}.shared.global [$0], [$1], {nbytes}, $2;"
    return text, "r,l,r" + (",b" if predicated else "")


def async_commit_group() -> tuple[str, str]:
    """cp.async.commit_group: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-commit-group"""
    return "cp.async.commit_group;", ""


def async_wait_group(pending: int) -> tuple[str, str]:
    """cp.async.wait_group: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-wait-group"""
    return f"cp.async.wait_group {pending};", ""


# ---------------------------------------------------------------------- setmaxnreg
def set_max_registers(count: int, increase: bool) -> tuple[str, str]:
    """Give this warpgroup `count` registers per thread (a multiple of 8 in [24, 256]);
    every warp of the warpgroup executes it.

    setmaxnreg: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#miscellaneous-instructions-setmaxnreg
    """
    direction = "inc" if increase else "dec"
    return f"setmaxnreg.{direction}.sync.aligned.u32 {count};", ""
