"""plan_conversion: how to move a tensor from one distributed layout to another.

Everything follows from the conversion map C = dst.invert_and_compose(src): for each
hardware index x = (register, lane, warp, block) of dst, an index C(x) of src holding the
same element (a *pull*: each destination register knows where its value comes from, which
is also how shfl.sync.idx works). C is linear, so it is a matrix; which of its blocks are
the identity decides the plan:

    C(x) = x on lane/warp/block bits, registers only permuted   -> RegisterPermutation
    warp and block bits fixed, lanes mixed                      -> WarpShuffle (if cheaper)
    anything else inside a CTA                                  -> SharedRoundTrip

When src holds an element several times (broadcast: a zero basis, or a basis repeated), C
is not unique: C + k works for every k in the kernel of src. invert_and_compose returns the
minimal choice, which may send a thread to *another* lane although its own lane holds the
element too. `conversion_columns` therefore adds kernel vectors to make the lane/warp/block
part of C as close to the identity as possible (higher bits first: staying in the CTA and
the warp matters most). The correction is a fixed linear function, so C stays linear.

Worked example: src = 32 lanes along dim1 holding 2 rows in a register, dst = the same but
lanes reversed (lane bit i of dst is lane bit 4-i of src). C keeps registers and warps and
permutes lane bits, so the plan is a WarpShuffle with one round per register.
"""

from __future__ import annotations

import numpy as np

from .banks import check_element_bits
from .errors import LayoutError
from .gf2 import XorBasis
from .linear_layout import LinearLayout
from .plans import (
    IN_DIMS,
    NoOp,
    Plan,
    RegisterPermutation,
    ShuffleRound,
    WarpShuffle,
    linear_table,
    register_copies,
    unique_register_bits,
)
from .subspaces import Echelon, kernel
from .swizzle import BARRIER_COST, plan_shared_round_trip, shared_cost

DEFAULT_MAX_SCRATCH_BYTES = 32 * 1024
"""Scratch budget of a shared round trip. A 128x128 16-bit tile fits in one iteration; larger
tiles iterate so that a conversion inside a pipelined loop leaves room for the operand
stages (228 KB per SM on H200, shared by every buffer of the kernel)."""

# Issue-slot costs used to choose between shuffles and a shared round trip. shfl and
# ld/st.shared both go through the shared-memory crossbar (one warp-wide shuffle ~ one
# wavefront); selects are ALU work; bar.sync stalls the whole CTA.
SHUFFLE_COST = 1.0
SELECT_COST = 0.5
PACK_COST = 1.0  # prmt to pack / unpack sub-32-bit elements into one shuffled word


def describe(layout: LinearLayout) -> str:
    return f"in-dims {layout.in_dims} -> out-dims {layout.out_dims}"


def normalize(layout: LinearLayout, out_names, role: str) -> LinearLayout:
    """The layout with in-dims exactly register, lane, warp, block (missing ones of size 1)."""
    if not isinstance(layout, LinearLayout):
        raise LayoutError(f"{role} must be a LinearLayout, got {type(layout).__name__}")
    unknown = [d for d in layout.in_dims if d not in IN_DIMS]
    if unknown:
        raise LayoutError(
            f"{role} layout has in-dims {unknown} that a distributed layout cannot have "
            f"(expected some of {list(IN_DIMS)}); {role}: {describe(layout)}"
        )
    bases = layout.transpose_outs(out_names).bases
    return LinearLayout({d: bases.get(d, ()) for d in IN_DIMS}, [(n, layout.out_dims[n]) for n in out_names])


def normalize_pair(src: LinearLayout, dst: LinearLayout) -> tuple[LinearLayout, LinearLayout]:
    for role, layout in (("src", src), ("dst", dst)):
        if not isinstance(layout, LinearLayout):
            raise LayoutError(f"{role} must be a LinearLayout, got {type(layout).__name__}")
    if src.out_dims != dst.out_dims:
        raise LayoutError(
            f"cannot convert between layouts of different tensors: src {describe(src)}, "
            f"dst {describe(dst)}; the out-dims (names and sizes) must be equal"
        )
    src_n = normalize(src, src.out_dim_names, "src")
    dst_n = normalize(dst, src.out_dim_names, "dst")
    for dim in IN_DIMS[1:]:
        if src_n.in_dim_size(dim) != dst_n.in_dim_size(dim):
            raise LayoutError(
                f"src and dst must run on the same threads: {dim} size {src_n.in_dim_size(dim)} "
                f"vs {dst_n.in_dim_size(dim)}; src {describe(src)}, dst {describe(dst)}"
            )
    if src_n.in_dim_size("lane") > 32:
        raise LayoutError(f"a warp has 32 lanes, got lane size {src_n.in_dim_size('lane')}: src {describe(src)}")
    return src_n, dst_n


class ConversionMap:
    """C as flat columns (one per dst input bit) of src input vectors, with field accessors.

    Flat input vectors put register bits lowest, then lane, warp, block (first dim minor).
    """

    def __init__(self, src: LinearLayout, dst: LinearLayout):
        self.src, self.dst = src, dst
        self.src_bits = {d: src.in_dim_bits(d) for d in IN_DIMS}
        self.dst_bits = {d: dst.in_dim_bits(d) for d in IN_DIMS}
        self.columns = conversion_columns(src, dst)

    def _field(self, bits: dict[str, int], dim: str) -> tuple[int, int]:
        shift = sum(bits[d] for d in IN_DIMS[: IN_DIMS.index(dim)])
        return shift, bits[dim]

    def part(self, vector: int, dim: str) -> int:
        """The `dim` coordinate of a src input vector."""
        shift, width = self._field(self.src_bits, dim)
        return vector >> shift & ((1 << width) - 1)

    def dst_columns(self, dim: str) -> list[int]:
        shift, width = self._field(self.dst_bits, dim)
        return self.columns[shift : shift + width]

    def thread_identity(self, dim: str, bit: int) -> int:
        """The src input vector of the same thread bit (lane/warp/block sizes agree)."""
        return 1 << (self._field(self.src_bits, dim)[0] + bit)

    def _thread_part_is(self, column: int, dims, want: dict[str, int]) -> bool:
        return all(self.part(column, d) == want.get(d, 0) for d in dims)

    def is_register_only(self) -> bool:
        """Every lane/warp/block bit maps to itself exactly; registers stay in their thread."""
        threads = ("lane", "warp", "block")
        if not all(self._thread_part_is(c, threads, {}) for c in self.dst_columns("register")):
            return False
        return all(
            column == self.thread_identity(dim, bit)
            for dim in threads
            for bit, column in enumerate(self.dst_columns(dim))
        )

    def is_warp_local(self) -> bool:
        """Warp and block bits map to themselves (plus registers); nothing else leaves the warp."""
        threads = ("lane", "warp", "block")
        for dim in ("warp", "block"):
            for bit, column in enumerate(self.dst_columns(dim)):
                if not self._thread_part_is(column, threads, {dim: 1 << bit}):
                    return False
        return all(
            self._thread_part_is(column, ("warp", "block"), {})
            for dim in ("register", "lane")
            for column in self.dst_columns(dim)
        )

    def is_cta_local(self) -> bool:
        """Every dst thread finds its elements in src threads of its own CTA."""
        for bit, column in enumerate(self.dst_columns("block")):
            if self.part(column, "block") != 1 << bit:
                return False
        return all(
            self.part(column, "block") == 0
            for dim in ("register", "lane", "warp")
            for column in self.dst_columns(dim)
        )


def conversion_columns(src: LinearLayout, dst: LinearLayout) -> list[int]:
    """Columns of C (dst index -> src index holding the same element), made thread-local.

    See the module docstring: kernel vectors of src are added so that lane, warp and block
    bits map to themselves whenever src allows it.
    """
    try:
        minimal = dst.invert_and_compose(src)
    except LayoutError as error:
        raise LayoutError(
            f"src does not hold every element dst holds, so no conversion exists: src {describe(src)}, "
            f"dst {describe(dst)} ({error})"
        ) from None
    columns = minimal.columns()
    register_bits = src.in_dim_bits("register")
    reachable = Echelon()
    for vector in kernel(src.columns()):
        reachable.add(vector >> register_bits, vector)
    dst_register_bits = dst.in_dim_bits("register")
    adjusted = []
    for index, column in enumerate(columns):
        target = 1 << (index - dst_register_bits) if index >= dst_register_bits else 0
        _, correction = reachable.reduce((column >> register_bits) ^ target)
        adjusted.append(column ^ correction)
    return adjusted


def plan_conversion(
    src: LinearLayout,
    dst: LinearLayout,
    element_bits: int,
    max_scratch_bytes: int = DEFAULT_MAX_SCRATCH_BYTES,
) -> Plan:
    """The cheapest plan moving a tensor held in layout `src` into layout `dst`.

    `element_bits` is the element width (8..64 in practice); `max_scratch_bytes` bounds the
    shared buffer of a round trip (see `DEFAULT_MAX_SCRATCH_BYTES`; a plan exceeds it only
    when src and dst share too few register bits to iterate over). Raises LayoutError when
    the layouts describe different tensors, run on different thread counts, when src lacks
    elements dst needs, or when data would move between the CTAs of a cluster.
    """
    check_element_bits(element_bits)
    src_n, dst_n = normalize_pair(src, dst)
    if src_n == dst_n:
        return NoOp()
    conversion = ConversionMap(src_n, dst_n)
    if conversion.is_register_only():
        table = linear_table([conversion.part(c, "register") for c in conversion.dst_columns("register")])
        return RegisterPermutation(tuple(int(r) for r in table))
    if not conversion.is_cta_local():
        raise LayoutError(
            f"the conversion moves data between CTAs of a cluster, which needs distributed shared "
            f"memory and is not supported: src {describe(src)}, dst {describe(dst)}"
        )
    shuffle = plan_warp_shuffle(conversion, element_bits) if conversion.is_warp_local() else None
    cost = shuffle_cost(shuffle) if shuffle is not None else None
    if cost is not None and cost <= BARRIER_COST:
        return shuffle  # cheaper than any barrier: skip the swizzle search
    shared = plan_shared_round_trip(src_n, dst_n, element_bits, max_scratch_bytes)
    if cost is not None and cost <= shared_cost(shared):
        return shuffle
    return shared


# ------------------------------------------------------------------------- warp shuffles
def plan_warp_shuffle(conversion: ConversionMap, element_bits: int):
    """Rounds of shfl.sync.idx realising C inside each warp, or None when this scheme fails.

    Write C on (dst register j, lane L) as src register A j + B L and src lane Cm j + D L.
    Round t serves, in every lane L, the dst register j = t + M L for a matrix M: then lane
    L reads from lane Cm t + (Cm M + D) L. Choosing M with Cm M = D + I makes that lane
    L + Cm t: rounds with Cm t = 0 are local copies and the others are butterflies. A round
    is valid when all lanes reading one sender want the same register from it (checked).
    Rounds t and t + k with Cm k = 0 read the same lanes, so sub-32-bit elements of such
    rounds share one shuffled word.
    """
    dst = conversion.dst
    lanes = 1 << conversion.dst_bits["lane"]
    pivots = unique_register_bits(dst)
    register_columns = conversion.dst_columns("register")
    lane_columns = conversion.dst_columns("lane")
    a = [conversion.part(register_columns[p], "register") for p in pivots]
    cm = [conversion.part(register_columns[p], "lane") for p in pivots]
    b = [conversion.part(c, "register") for c in lane_columns]
    d = [conversion.part(c, "lane") for c in lane_columns]
    m = _choose_round_lanes(cm, d)
    rounds_index = np.arange(1 << len(pivots))
    lane_index = np.arange(lanes)
    served = rounds_index[:, None] ^ linear_table(m)[None, :]  # pivot-space dst register
    source_register = linear_table(a)[served] ^ linear_table(b)[None, :]
    source_lane = linear_table(cm)[served] ^ linear_table(d)[None, :]
    dst_register = linear_table([1 << p for p in pivots])[served]

    local = np.full((lanes, dst.in_dim_size("register")), -1, dtype=np.int64)
    is_local = np.all(source_lane == lane_index[None, :], axis=1)
    for t in np.flatnonzero(is_local):
        local[lane_index, dst_register[t]] = source_register[t]

    pack_bits = (32 // element_bits).bit_length() - 1 if element_bits < 32 else 0
    slots = linear_table(kernel(cm)[:pack_bits])
    visited = is_local.copy()
    rounds = []
    for first in range(len(rounds_index)):
        if visited[first]:
            continue
        members = first ^ slots
        visited[members] = True
        sends, receives = [], []
        for t in members:
            send = np.full(lanes, -1, dtype=np.int64)
            send[source_lane[t]] = source_register[t]
            if np.any(send[source_lane[t]] != source_register[t]):
                return None  # two lanes want different registers from one sender
            sends.append(tuple(send.tolist()))
            receives.append(tuple(dst_register[t].tolist()))
        xor = source_lane[first] ^ lane_index
        rounds.append(
            ShuffleRound(
                source_lane=tuple(source_lane[first].tolist()),
                send_register=tuple(sends),
                receive_register=tuple(receives),
                lane_xor=int(xor[0]) if np.all(xor == xor[0]) else None,
            )
        )
    return WarpShuffle(
        element_bits=element_bits,
        local_register=tuple(map(tuple, local.tolist())),
        rounds=tuple(rounds),
        warp_register_xor=tuple(conversion.part(c, "register") for c in conversion.dst_columns("warp")),
        block_register_xor=tuple(conversion.part(c, "register") for c in conversion.dst_columns("block")),
        register_copies=register_copies(dst),
    )


def _choose_round_lanes(cm: list[int], d: list[int]) -> list[int]:
    """M, one pivot-register mask per lane bit, so that the lane map D' = Cm M + D of every
    round is the identity where Cm M = D + I can be solved, and else stays invertible (an
    invertible D' makes every round valid: each sender has exactly one reader)."""
    solver = XorBasis(cm)
    m: list = [None] * len(d)
    chosen = XorBasis()
    for bit, column in enumerate(d):
        solution = solver.solve(column ^ 1 << bit)
        if solution is not None:
            m[bit] = solution
            chosen.add(1 << bit)
    # Every lane-space vector Cm can add, with the smallest mask reaching it.
    reachable: dict[int, int] = {}
    for mask, value in enumerate(linear_table(cm).tolist()):
        reachable.setdefault(value, mask)
    for bit, column in enumerate(d):
        if m[bit] is not None:
            continue
        options = sorted(reachable.items(), key=lambda item: (bin(item[1]).count("1"), item[1]))
        mask, image = next(
            ((mask, column ^ value) for value, mask in options if not chosen.contains(column ^ value)),
            (0, column),
        )
        m[bit] = mask
        chosen.add(image)
    return m


def _selects(tables: np.ndarray) -> int:
    """Selects to pick, per lane, one of the distinct values of each row (-1: don't care)."""
    if tables.size == 0:
        return 0
    ordered = np.sort(tables.reshape(-1, tables.shape[-1]), axis=1)
    distinct = (np.diff(ordered, axis=1) != 0).sum(axis=1) + 1 - (ordered[:, 0] < 0)
    return int(np.maximum(distinct - 1, 0).sum())


def shuffle_cost(plan: WarpShuffle) -> float:
    """Issue-slot estimate of a WarpShuffle (see SHUFFLE_COST and friends)."""
    words = max(1, plan.element_bits // 32)
    packed = sum(1 for r in plan.rounds if r.slots > 1)
    sends = np.asarray([t for r in plan.rounds for t in r.send_register], dtype=np.int64)
    receives = np.asarray([t for r in plan.rounds for t in r.receive_register], dtype=np.int64)
    local = np.asarray(plan.local_register, dtype=np.int64).T
    return (
        SHUFFLE_COST * words * len(plan.rounds)
        + PACK_COST * 2 * packed
        + SELECT_COST * (_selects(sends) + _selects(receives) + _selects(local))
    )
