"""Warp-level MMA (mma.sync.aligned.m16n8k16): which registers form each instruction.

Pure Python, so the fragment bookkeeping is proved on the CPU. `plan_mma_v2` takes the
linear layouts of the accumulator and of the A and B register operands (`mma_v2` and its
`dot_operand`s, or any layouts that hold the same fragments) and returns, per
instruction, the accumulator registers c0..c3 and the A and B registers that pack into
a0..a3 and b0, b1.

The fragments (PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16" with 16-bit A and
B and a 32-bit accumulator; groupID = lane / 4, t = lane % 4):

    C/D: c_i at row groupID + 8 * (i >= 2),        col 2t + i % 2
    A:   a_i at row groupID + 8 * ((i / 2) % 2),   col 2t + i % 2 + 8 * (i >= 4)   (i < 8)
    B:   b_i at row 2t + i % 2 + 8 * (i >= 2),     col groupID                     (i < 4)

Every warp runs its own instructions on its own registers: no thread outside the warp
takes part, so a warp-level MMA may run in a branch taken warp by warp.

An operand in shared memory is read with ldmatrix (`ldmatrix_addresses`) where its
fragments are 8 x 8 matrices of 16-byte rows, as in any 16-bit tile whose contiguous
dim is the MMA's K (A row-major, B as K^T) and in 128-byte swizzles: one instruction
and one address per thread for four words, where 32-bit loads take one each. A 16-bit
tensor held in such fragments (an accumulator converted to bf16 or fp16) is stored the
same way, by stmatrix (`stmatrix_groups`, lower_shared.store_tensor).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..layouts import LinearLayout
from .warpgroup_mma_descriptors import register_table, thread_bases

INSTR_M, INSTR_N, INSTR_K = 16, 8, 16
# Lane bases (row, col) of the three fragments.
ACC_LANES = ((0, 2), (0, 4), (1, 0), (2, 0), (4, 0))
A_LANES = ((0, 2), (0, 4), (1, 0), (2, 0), (4, 0))
B_LANES = ((2, 0), (4, 0), (0, 1), (0, 2), (0, 4))
SUGGESTION = ("use acc in NVMMADistributedLayout([2, 0], warps, [16, 8]), a in DotOperandLayout(0, <that "
              "layout>, 2) and b in DotOperandLayout(1, <that layout>, 2)")


class MmaError(ValueError):
    """Operands whose registers do not form mma.sync fragments; `suggestion` says what to
    do instead."""

    def __init__(self, message: str, suggestion: str = SUGGESTION):
        super().__init__(message)
        self.suggestion = suggestion


def acc_position(i: int) -> tuple[int, int]:
    return 8 * (i // 2), i % 2


def a_position(i: int) -> tuple[int, int]:
    return 8 * ((i // 2) % 2), i % 2 + 8 * (i // 4)


def b_position(i: int) -> tuple[int, int]:
    return i % 2 + 8 * (i // 2), 0


@dataclass(frozen=True)
class Instruction:
    """One mma.sync: accumulator registers c0..c3 (also d0..d3), A's four 32-bit words
    and B's two, each a pair of 16-bit registers (lowest first)."""

    c: tuple[int, ...]
    a: tuple[tuple[int, int], ...]
    b: tuple[tuple[int, int], ...]


def plan_mma_v2(acc: LinearLayout, a: LinearLayout, b: LinearLayout) -> tuple[Instruction, ...]:
    """The instructions of acc = a @ b + acc, K steps outermost (each accumulator tile
    chains through them), in the order the backend emits them. MmaError when a layout's
    lanes or warps do not hold the fragments."""
    (m, n), (m2, k), (k2, n2) = (tuple(x.out_dims.values()) for x in (acc, a, b))
    if (m, n, k) != (m2, n2, k2):
        raise MmaError(f"shapes do not chain: a [{m2}, {k}] @ b [{k2}, {n2}] into acc [{m}, {n}]", "")
    if m % INSTR_M or n % INSTR_N or k % INSTR_K:
        raise MmaError(f"mma.sync m16n8k16 needs M, N and K multiples of 16, 8 and 16; found "
                       f"M = {m}, N = {n}, K = {k}", "pad the tile")
    for name, layout, lanes in (("acc", acc, ACC_LANES), ("a", a, A_LANES), ("b", b, B_LANES)):
        if thread_bases(layout, "lane") != lanes:
            raise MmaError(f"{name}'s lanes {list(thread_bases(layout, 'lane'))} are not the mma.sync fragment's "
                           f"{list(lanes)}")
    acc_warps = thread_bases(acc, "warp")
    a_warps, b_warps = thread_bases(a, "warp"), thread_bases(b, "warp")
    if a_warps != tuple((row, 0) for row, _ in acc_warps) or b_warps != tuple((0, col) for _, col in acc_warps):
        raise MmaError(f"the operands' warps (a {list(a_warps)}, b {list(b_warps)}) do not hold the rows and "
                       f"columns of the accumulator's warps {list(acc_warps)}")
    tables = {name: register_table(layout) for name, layout in (("acc", acc), ("a", a), ("b", b))}
    for name, layout in (("acc", acc), ("a", a), ("b", b)):
        if len(tables[name]) != layout.in_dims.get("register", 1):
            raise MmaError(f"{name} holds some elements twice in one thread")

    def registers(name: str, origin: tuple[int, int], positions) -> list[int]:
        out = []
        for row, col in positions:
            r = tables[name].get((origin[0] | row, origin[1] | col))
            if r is None:
                raise MmaError(f"{name} has no register for element ({origin[0] | row}, {origin[1] | col}) of an "
                               f"mma.sync fragment")
            out.append(r)
        return out

    tiles = sorted({(row, col) for row, col in tables["acc"] if row % INSTR_M == 0 and col % INSTR_N == 0})
    plan = []
    for k0 in range(0, k, INSTR_K):
        for m0, n0 in tiles:
            c = registers("acc", (m0, n0), [acc_position(i) for i in range(4)])
            a_regs = registers("a", (m0, k0), [a_position(i) for i in range(8)])
            b_regs = registers("b", (k0, n0), [b_position(i) for i in range(4)])
            plan.append(Instruction(tuple(c), tuple(zip(a_regs[::2], a_regs[1::2])),
                                    tuple(zip(b_regs[::2], b_regs[1::2]))))
    return tuple(plan)


def stmatrix_groups(offsets: LinearLayout, count: int, xor: int = 0, align: int = 16,
                    element_bytes: int = 2) -> list | None:
    """The `count` registers of a 16-bit tensor whose elements sit at `offsets` (as for
    ldmatrix_addresses) as groups of four words (register pairs), each with the row
    addresses of the stmatrix.x4 that stores it, every register in one group; None where
    no two register bits step between a group's words. stmatrix places words as ldmatrix
    loads them, so ldmatrix_addresses decides each group."""
    if element_bytes != 2 or count < 8 or count & (count - 1):
        return None
    bits = [1 << i for i in range(1, count.bit_length() - 1)]  # register bits above the pair's
    for step0, step1 in itertools.combinations(bits, 2):
        groups = []
        for first in range(0, count, 2):
            if first & (step0 | step1):
                continue
            words = tuple((f, f + 1) for f in (first, first ^ step0, first ^ step1, first ^ step0 ^ step1))
            addresses = ldmatrix_addresses(offsets, words, xor, align, element_bytes)
            if addresses is None:
                break
            groups.append((words, addresses))
        else:
            return groups
    return None


def ldmatrix_addresses(offsets: LinearLayout, words: tuple[tuple[int, int], ...], xor: int = 0,
                       align: int = 16, element_bytes: int = 2) -> LinearLayout | None:
    """The row addresses with which ldmatrix.x{len(words)} loads `words` (pairs of 16-bit
    registers) of a tensor whose elements sit at `offsets` (register, lane, warp[,
    block] -> element offset, XORed with `xor`, from a base aligned to `align` bytes), as
    a layout of the same in-dims: lane i gives the address of row i % 8 of matrix i // 8,
    its register constant is that of words[0][0]. None when ldmatrix cannot load them.

    ldmatrix hands lane l the elements 2 (l % 4), +1 of row l // 4 of each 8 x 8 matrix
    (a 16-byte row): each word's pair must be adjacent, lanes' bits 0 and 1 must step 2
    and 4 elements along it, every other bit must move by whole rows, and the words'
    first registers must be a linear function of the matrix index (lanes 8-31's bits 3
    and 4 select them)."""
    count = len(words)
    if count not in (1, 2, 4) or element_bytes != 2 or align % 16 or xor % 8:
        return None
    lanes = offsets.bases.get("lane", ())
    if len(lanes) != 5 or lanes[0] != (2,) or lanes[1] != (4,):
        return None
    zero = {dim: 0 for dim in offsets.in_dim_names}
    constant = lambda register: offsets(**{**zero, "register": register})[0]  # noqa: E731
    if any(constant(first ^ second) != 1 for first, second in words):
        return None
    rows = [basis[0] for basis in lanes[2:]] + [basis[0] for dim in ("warp", "block")
                                                for basis in offsets.bases.get(dim, ())]
    firsts = [first for first, _ in words]
    if any(value % 8 for value in rows + [constant(first) for first in firsts]):
        return None
    steps = [firsts[1] ^ firsts[0] if count > 1 else 0, firsts[2] ^ firsts[0] if count > 2 else 0]
    if count == 4 and firsts[3] != firsts[0] ^ steps[0] ^ steps[1]:
        return None
    bases = offsets.bases
    lane_bases = [lanes[2], lanes[3], lanes[4]] + [(constant(step),) for step in steps]
    return LinearLayout({**bases, "lane": lane_bases}, offsets.out_dims)

