"""Inline PTX for warpgroup MMA (wgmma) and the async-proxy fence.

Each function returns `(asm_text, constraints)` for `llvmlite.ir.InlineAsm`, in the style
of `ptx_asm`. Constraint letters (LLVM NVPTX): `f` f32, `r` 32-bit, `l` 64-bit, `h`
16-bit; an input constraint that is a number ties it to that output (LLVM's spelling of
"+f"), so values that pass through an instruction are outputs and tied inputs.

Registers the hardware reads or writes asynchronously (accumulators, register A) pass
through every asm that orders them — the fence before the first mma, each mma, and the
wait — so LLVM cannot move their definitions below the fence or their uses above the
wait (Triton and CUTLASS do the same with `warpgroup_fence_operand`).

wgmma: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions
"""

from __future__ import annotations

from typing import Sequence

ISA = "https://docs.nvidia.com/cuda/parallel-thread-execution/index.html"
MEMORY = "~{memory}"


def _tied(letters: Sequence[str]) -> tuple[list[str], list[str]]:
    """Output constraints and the inputs tied to them, for registers passing through."""
    return [f"={c}" for c in letters], [str(i) for i in range(len(letters))]


def _join(*groups: Sequence[str]) -> str:
    return ",".join(c for group in groups for c in group)


def fence_operands(letters: Sequence[str]) -> tuple[str, str]:
    """wgmma.fence.sync.aligned, with `letters` registers passing through (outputs $0..,
    tied inputs after them): orders earlier register writes and shared-memory accesses of
    the warpgroup before the wgmma.mma_async that follow.
    wgmma.fence: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-fence
    """
    outputs, inputs = _tied(letters)
    return "wgmma.fence.sync.aligned;", _join(outputs, inputs, [MEMORY])


def mma_async(n: int, k: int, dtype: str, atype: str, btype: str, accumulators: int, acc_letter: str,
              a_in_registers: bool, trans_a: int, trans_b: int) -> tuple[str, str]:
    """One wgmma.mma_async.sync.aligned.m64n{n}k{k}.{dtype}.{atype}.{btype}.

    Operands: the `accumulators` d registers ($0..$R-1, each also a tied input), then A
    (a 64-bit descriptor, or four 32-bit registers), the B descriptor, and scale-d as an
    i32 (non-zero: D = A*B + D, zero: D = A*B), turned into the predicate `p` in the asm.
    imm-scale-a/b are 1; imm-trans-a/b (only for 16-bit inputs) select MN-major operands.
    wgmma.mma_async: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async
    """
    r = accumulators
    outputs, tied = _tied([acc_letter] * r)
    d = "{" + ", ".join(f"${i}" for i in range(r)) + "}"
    a_count = 4 if a_in_registers else 1
    a = "{" + ", ".join(f"${2 * r + i}" for i in range(4)) + "}" if a_in_registers else f"${2 * r}"
    b = f"${2 * r + a_count}"
    scale = f"${2 * r + a_count + 1}"
    immediates = "1, 1"
    if atype in ("f16", "bf16"):  # only 16-bit types take the transpose immediates
        immediates += f", {trans_b}" if a_in_registers else f", {trans_a}, {trans_b}"
    text = ("{\n\t.reg .pred p;\n\t"
            f"setp.ne.b32 p, {scale}, 0;\n\t"
            f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{dtype}.{atype}.{btype} {d}, {a}, {b}, p, {immediates};\n\t"
            "}")
    a_letters = ["r"] * 4 if a_in_registers else ["l"]
    return text, _join(outputs, tied, a_letters, ["l", "r"], [MEMORY])


def commit_group() -> tuple[str, str]:
    """wgmma.commit_group.sync.aligned: the warpgroup's uncommitted mma_async form a group.
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-commit-group
    """
    return "wgmma.commit_group.sync.aligned;", MEMORY


def wait_group(pending: int, letters: Sequence[str]) -> tuple[str, str]:
    """wgmma.wait_group.sync.aligned `pending`, with the registers the waited groups write
    passing through (outputs $0.., tied inputs), so their reads stay below the wait.
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-wait-group
    """
    outputs, inputs = _tied(letters)
    return f"wgmma.wait_group.sync.aligned {int(pending)};", _join(outputs, inputs, [MEMORY])


def fence_proxy_async_shared() -> tuple[str, str]:
    """fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory accesses
    are ordered with later async-proxy ones (wgmma operands, TMA).
    membar/fence: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar
    """
    return "fence.proxy.async.shared::cta;", MEMORY
