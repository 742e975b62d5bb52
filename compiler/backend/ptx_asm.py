"""Every inline-PTX string of the backend, each with the PTX ISA section it follows.

Everything that an NVVM intrinsic covers (thread ids, barriers, shuffles, ex2/lg2/sin/cos
approximations) is emitted as the intrinsic, not here. Inline PTX is used where LLVM has
no way to say what we need: predicated global accesses (a masked-off lane must not touch
memory), atomics with PTX's memory semantics and scope (atom, red), the fp8
conversions, fp32 pairs to packed 16-bit floats (LLVM emits one scalar `cvt` per
element and integer ops to pack them), and Hopper's async machinery
(mbarrier, TMA, cp.async, setmaxnreg, wgmma) in the two sections at the end.

Each function returns `(asm_text, constraints)` for `llvmlite.ir.InlineAsm`. Constraint
letters (LLVM NVPTX): `b` predicate (i1), `h` 16-bit, `r` 32-bit, `l` 64-bit, `f` f32.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html
"""

from __future__ import annotations

from typing import Sequence

ISA = "https://docs.nvidia.com/cuda/parallel-thread-execution/index.html"

# Register constraint and PTX type for one word of a global access, by word width.
_WORD = {8: ("h", "b8"), 16: ("h", "b16"), 32: ("r", "b32"), 64: ("l", "b64")}


def _vector_suffix(count: int) -> str:
    return "" if count == 1 else f".v{count}"


def masked_global_load(word_bits: int, count: int, fill: tuple = (), cache: str = "") -> tuple[str, str]:
    """`count` words of `word_bits`, loaded only where the predicate holds, else `fill`
    (one bit pattern per word; 0 when not given). `cache`: qualifiers after ld.global
    (".cg", ".L1::evict_first", ...).

    Operands: outputs $0..$count-1, then the address ($count, 64-bit global) and the
    predicate ($count+1).
    ld: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
    mov: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-mov
    """
    letter, ptx_type = _WORD[word_bits]
    mov_type = "b16" if word_bits == 8 else ptx_type
    outputs = [f"${i}" for i in range(count)]
    fill = tuple(fill) or (0,) * count
    zero = "\n\t".join(f"mov.{mov_type} {o}, {word:#x};" for o, word in zip(outputs, fill))
    target = outputs[0] if count == 1 else "{" + ", ".join(outputs) + "}"
    text = f"{zero}\n\t@${count + 1} ld.global{cache}{_vector_suffix(count)}.{ptx_type} {target}, [${count}];"
    constraints = ",".join([f"={letter}"] * count + ["l", "b"])
    return text, constraints


def masked_global_store(word_bits: int, count: int, cache: str = "") -> tuple[str, str]:
    """Store `count` words only where the predicate holds. `cache`: qualifiers after
    st.global (".cs", ".L1::evict_first", ...).

    Operands: the address ($0), the words ($1..$count), the predicate ($count+1).
    st: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st
    """
    letter, ptx_type = _WORD[word_bits]
    values = [f"${i + 1}" for i in range(count)]
    source = values[0] if count == 1 else "{" + ", ".join(values) + "}"
    text = f"@${count + 1} st.global{cache}{_vector_suffix(count)}.{ptx_type} [$0], {source};"
    constraints = ",".join(["l"] + [letter] * count + ["b"])
    return text, constraints


_ATOMIC_OPS = {"add": "add", "max": "max", "min": "min", "and": "and", "or": "or", "xor": "xor",
               "xchg": "exch", "cas": "cas"}


def atomic_type(kind: str, element_name: str) -> str:
    """The PTX type of an atom/red on `element_name` elements: bitwise ops, exch and cas
    take .b32/.b64, add .u32/.u64 (two's complement: signed too) or .f32/.f64, max/min
    .s or .u by signedness."""
    bits = element_name[-2:]
    if element_name.startswith("fp"):
        return f"f{bits}"
    if kind in ("max", "min"):
        return f"{element_name[0].replace('i', 's')}{bits}"
    return f"u{bits}" if kind == "add" else f"b{bits}"


def global_atomic(kind: str, ptx_type: str, sem: str, scope: str) -> tuple[str, str]:
    """atom.{sem}.{scope}.global.{op}.{type} where the predicate holds; the old value
    where it does not is 0. `sem` and `scope` are PTX's qualifiers without the dot.

    Operands: the old value ($0), the address ($1, 64-bit global), the value ($2), for
    cas the new value ($3; $2 is the compared one), then the predicate. Registers are
    32- or 64-bit words (`r`/`l`): PTX accepts a .b register where .f has its width.
    atom: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-atom
    """
    letter, word = ("l", "b64") if ptx_type.endswith("64") else ("r", "b32")
    cas = kind == "cas"
    predicate = 4 if cas else 3
    operands = "$2, $3" if cas else "$2"
    text = (f"mov.{word} $0, 0;\n\t"
            f"@${predicate} atom.{sem}.{scope}.global.{_ATOMIC_OPS[kind]}.{ptx_type} $0, [$1], {operands};")
    return text, ",".join([f"={letter}", "l"] + [letter] * (2 if cas else 1) + ["b", MEMORY])


def global_reduction(kind: str, ptx_type: str, sem: str, scope: str) -> tuple[str, str]:
    """red.{sem}.{scope}.global.{op}.{type}: an atom that returns nothing (PTX allows
    only .relaxed and .release, and no exch or cas), where the predicate holds.

    Operands: the address ($0), the value ($1), the predicate ($2).
    red: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-red
    """
    letter = "l" if ptx_type.endswith("64") else "r"
    text = f"@$2 red.{sem}.{scope}.global.{_ATOMIC_OPS[kind]}.{ptx_type} [$0], $1;"
    return text, ",".join(["l", letter, "b", MEMORY])


def read_special_register(name: str) -> tuple[str, str]:
    """A special register (%tid.x, ...) read into a 32-bit register ($0). Emitted as
    volatile asm where LLVM must neither hoist the read nor merge it with another (its
    NVVM intrinsic is `readnone`, so LLVM may do both).
    Special registers: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#special-registers
    """
    return f"mov.u32 $0, %{name};", "=r"


def bulk_prefetch_l2() -> tuple[str, str]:
    """Prefetch a byte range of global memory into L2, issued where the predicate holds.

    Operands: the address ($0, 64-bit global, 16-byte aligned), the byte count ($1, a
    multiple of 16), the predicate ($2).
    cp.async.bulk.prefetch: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-prefetch
    """
    return "@$2 cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r,b"


_FP8 = {"fp8e4m3": "e4m3x2", "fp8e5m2": "e5m2x2"}


def fp8_to_f16x2(fp8_name: str) -> tuple[str, str]:
    """Two fp8 values (a 16-bit register, first value in the low byte) -> f16x2 (32 bits).

    cvt (fp8 to f16x2, sm_89+):
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    return f"cvt.rn.f16x2.{_FP8[fp8_name]} $0, $1;", "=r,h"


def f32_pair_to_fp8x2(fp8_name: str) -> tuple[str, str]:
    """cvt.rn.satfinite.<fp8>x2.f32 d, a, b: `a` goes to the high byte, `b` to the low one.

    Saturates to the largest finite fp8 value, as torch's float8 casts do.
    cvt (f32 to fp8x2, sm_89+):
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    return f"cvt.rn.satfinite.{_FP8[fp8_name]}.f32 $0, $1, $2;", "=h,f,f"


_HALF_PAIR = {"bf16": "bf16x2", "fp16": "f16x2"}


def f32_pair_to_half2(half_name: str) -> tuple[str, str]:
    """cvt.rn.{bf16x2,f16x2}.f32 d, a, b: two fp32 values rounded to nearest even into one
    32-bit register, `a` in the high half and `b` in the low one (sm_80+; NaN stays NaN,
    infinities and denormals convert exactly as the scalar cvt.rn does).
    cvt: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
    """
    return f"cvt.rn.{_HALF_PAIR[half_name]}.f32 $0, $1, $2;", "=r,f,f"


# ======================================================= Hopper async machinery
# mbarrier, TMA (cp.async.bulk.tensor), cp.async, setmaxnreg.
#
# Shared-memory operands are 32-bit shared::cta addresses (`r`); a shared::cta address is
# also a valid shared::cluster address of the executing CTA, which TMA loads take. The
# TMA descriptor is the 64-bit generic address of the tensor map (`l`). Labels inside
# `{ }` are local to that block, so a wait loop may appear many times in one kernel.
#

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


def mbarrier_expect(nbytes) -> tuple[str, str]:
    """One arrival on the mbarrier at $0 that also raises its expected transaction count
    by `nbytes`, where $1 holds. `nbytes` None: the count is a run-time operand ($2).

    mbarrier.arrive.expect_tx: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-arrive
    """
    if nbytes is None:
        return "@$1 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $2;", "r,b,r"
    return f"@$1 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {nbytes};", "r,b"


def _count_operand(count: int | None, operand: str, constraints: str) -> tuple[str, str]:
    """The arrival count as PTX text: the int, or (None) the run-time operand `operand`,
    a 32-bit register appended to `constraints`."""
    if count is None:
        return operand, constraints + ",r"
    return str(count), constraints


def mbarrier_arrive(count: int | None) -> tuple[str, str]:
    """`count` arrivals (release, CTA scope) on the mbarrier at $0, where $1 holds;
    count None: as many as $2 holds.

    mbarrier.arrive: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-arrive
    """
    count, constraints = _count_operand(count, "$2", "r,b")
    return f"@$1 mbarrier.arrive.shared::cta.b64 _, [$0], {count};", constraints


_RELEASE_SCOPES = {"cluster": ".release.cluster", "cta": ""}  # "cta": the instruction's default


def mbarrier_arrive_remote(count: int | None, scope: str = "cluster") -> tuple[str, str]:
    """`count` arrivals (None: as many as $3 holds) on the mbarrier at the shared::cta
    offset $0 in the CTA of cluster rank $2, where $1 holds: mapa turns the offset into
    that CTA's shared::cluster address; the arrival releases at `scope`: "cluster" makes
    this thread's accesses before it visible to the peer's threads after their wait;
    "cta" (the instruction's default) only to this CTA's, which is enough to hand back a
    buffer already read, and cheaper.

    mapa: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-mapa
    mbarrier.arrive: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-arrive
    """
    count, constraints = _count_operand(count, "$3", "r,b,r")
    return ("{ .reg .b32 remote; mapa.shared::cluster.u32 remote, $0, $2;\n"
            f"@$1 mbarrier.arrive{_RELEASE_SCOPES[scope]}.shared::cluster.b64 _, [remote], {count}; }}",
            constraints)


def barrier_red_or() -> tuple[str, str]:
    """Named barrier $2 over $3 threads that also ORs $1 (nonzero: true) over them; $0 is
    1 in every thread if any of them passed true, else 0. `bar.red` is the `.aligned`
    form: every thread of each warp executes it together.

    barrier.cta.red: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-bar
    """
    return ("{\n\t.reg .pred %mine, %any;\n\tsetp.ne.u32 %mine, $1, 0;\n\t"
            "bar.red.or.pred %any, $2, $3, %mine;\n\tselp.u32 $0, 1, 0, %any;\n\t}"), "=r,r,r,r"


def named_barrier_arrive_by_group(barriers: tuple[int, int], threads: int) -> tuple[str, str]:
    """Arrive without waiting on named barrier barriers[0] of `threads` threads where $0 is
    0, on barriers[1] where it is 1, and on neither otherwise (bar.arrive, the `.aligned`
    form: every thread of each warp executes it together; $0 is warp-uniform). The ids are
    immediates: ptxas serializes a kernel's wgmmas when a bar.arrive with its id in a
    register sits in their loop.

    bar.arrive: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-bar
    """
    first, second = barriers
    return ("{\n\t.reg .pred %first, %second;\n\tsetp.eq.u32 %first, $0, 0;\n\tsetp.eq.u32 %second, $0, 1;\n\t"
            f"@%first bar.arrive {first}, {threads};\n\t@%second bar.arrive {second}, {threads};\n\t}}"), "r"


def cluster_barrier() -> tuple[str, str]:
    """Every thread of the cluster's CTAs arrives (release) and waits for all the others
    (acquire); `.aligned`: every thread of each warp executes it together.

    barrier.cluster: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-barrier-cluster
    """
    return "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;", ""


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
def tma_load(rank: int, multicast: bool = False) -> tuple[str, str]:
    """Copy one box of a tensor into shared memory; its bytes complete on an mbarrier.
    `multicast`: into every CTA of the cluster whose rank's bit is set in a 16-bit mask,
    at the same shared offsets, each completing on its own barrier at the mbarrier's offset.

    Operands: the destination ($0, shared), the descriptor ($1, generic 64-bit), the
    mbarrier ($2, shared), the coordinates ($3.., innermost first), the predicate, then
    the mask (multicast).
    cp.async.bulk.tensor: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-tensor
    """
    coords = ", ".join(f"${3 + i}" for i in range(rank))
    cast, mask = (".multicast::cluster", f", ${4 + rank}") if multicast else ("", "")
    text = (f"@${3 + rank} cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes{cast} "
            f"[$0], [$1, {{{coords}}}], [$2]{mask};")
    return text, ",".join(["r", "l", "r"] + ["r"] * rank + ["b"] + (["h"] if multicast else []))


def bulk_load() -> tuple[str, str]:
    """Copy contiguous bytes from global to shared memory; they complete on an mbarrier.

    Operands: the destination ($0, shared, 16-byte aligned), the source ($1, global,
    16-byte aligned), the byte count ($2, a multiple of 16), the mbarrier ($3, shared),
    the predicate ($4).
    cp.async.bulk: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk
    """
    return ("@$4 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
            "r,l,r,r,b")


def tma_store(rank: int, commit: bool = True) -> tuple[str, str]:
    """Copy a shared-memory box to the tensor, then (`commit`) close this thread's bulk
    group: the strips of a wide box go in one group, so that store_wait counts boxes.

    Operands: the descriptor ($0), the source ($1, shared), the coordinates ($2..,
    innermost first), the predicate.
    cp.async.bulk.tensor: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-tensor
    cp.async.bulk.commit_group: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-commit-group
    """
    return _shared_box_to_global("cp.async.bulk.tensor", rank, commit)


def tma_reduce_add(rank: int, commit: bool = True) -> tuple[str, str]:
    """Add a shared-memory box into the tensor (the tensor map's element type picks the
    add), then (`commit`) close this thread's bulk group, as tma_store.

    Operands: the descriptor ($0), the source ($1, shared), the coordinates ($2..,
    innermost first), the predicate.
    cp.reduce.async.bulk.tensor: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-reduce-async-bulk-tensor
    """
    return _shared_box_to_global("cp.reduce.async.bulk.tensor", rank, commit, ".add")


def _shared_box_to_global(instruction: str, rank: int, commit: bool, operation: str = "") -> tuple[str, str]:
    """A store-direction bulk tensor instruction (`operation`: its reduction, if any) from
    the shared box $1 to the box of descriptor $0 at coordinates $2.. under the predicate
    after them, then (`commit`) this thread's bulk group closed."""
    coords = ", ".join(f"${2 + i}" for i in range(rank))
    guard = f"@${2 + rank} "
    tile = ".tile" if operation else ""
    text = (f"{guard}{instruction}.{rank}d.global.shared::cta{operation}{tile}.bulk_group "
            f"[$0, {{{coords}}}], [$1];")
    if commit:
        text += f"\n\t{guard}cp.async.bulk.commit_group;"
    return text, ",".join(["l", "r"] + ["r"] * rank + ["b"])


def tma_store_wait(pending: int) -> tuple[str, str]:
    """Wait until at most `pending` bulk groups of this thread still read shared memory.

    cp.async.bulk.wait_group: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-wait-group
    """
    return f"cp.async.bulk.wait_group.read {pending};", ""


def tensormap_replace(field: str, ordinal: int | None = None) -> tuple[str, str]:
    """Replace one field of the 128-byte tensor map in global memory at $0 with $1:
    `global_address` (b64), `global_dim` (b32, dim `ordinal`, innermost first) or
    `global_stride` (b64 bytes, of dim `ordinal` + 1 innermost first: dim 0's is the
    element size). Operands: the map ($0, global), the value ($1), the predicate ($2).
    tensormap.replace: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-tensormap-replace
    """
    kind = "b32" if field == "global_dim" else "b64"
    index = "" if ordinal is None else f" {ordinal},"
    return (f"@$2 tensormap.replace.tile.{field}.global.b1024.{kind} [$0],{index} $1;",
            f"l,{'r' if kind == 'b32' else 'l'},b")


def tensormap_release() -> tuple[str, str]:
    """Order this thread's writes of tensor maps (generic proxy) before later reads of them
    by the TMA unit (tensormap proxy), at GPU scope. Operand: the predicate ($0).
    fence.proxy.tensormap::generic: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar
    """
    return "@$0 fence.proxy.tensormap::generic.release.gpu;", "b"


def tensormap_acquire() -> tuple[str, str]:
    """Make the tensor map at $0 (global, 128 bytes), released by its writer, visible to
    this thread's later TMA copies through it (the PTX ISA section as tensormap_release)."""
    return "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;", "l"


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


def async_copy_mbarrier_arrive(noinc: bool = True) -> tuple[str, str]:
    """Arrive once on the mbarrier at $0 when this thread's earlier cp.async copies have
    landed; .noinc: the arrival counts against the barrier's init count (without it, the
    pending count first grows by one, so the arrival only holds the phase back until then).

    cp.async.mbarrier.arrive: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-cp-async-mbarrier-arrive
    """
    return f"cp.async.mbarrier.arrive{'.noinc' if noinc else ''}.shared::cta.b64 [$0];", "r"


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


# ======================================================= wgmma
# Warpgroup MMA and the async-proxy fence. An input constraint that is a number ties it
# to that output (LLVM's spelling of "+f"), so values that pass through an instruction
# are outputs and tied inputs.
#
# Registers the hardware reads or writes asynchronously (accumulators, register A) pass
# through every asm that orders them — the fence before the first mma, each mma, and the
# wait — so LLVM cannot move their definitions below the fence or their uses above the
# wait (Triton and CUTLASS do the same with `warpgroup_fence_operand`).
#
# wgmma: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions

MEMORY = "~{memory}"


def _tied(letters: Sequence[str]) -> tuple[list[str], list[str]]:
    """Output constraints and the inputs tied to them, for registers passing through."""
    return [f"={c}" for c in letters], [str(i) for i in range(len(letters))]


def _join(*groups: Sequence[str]) -> str:
    return ",".join(c for group in groups for c in group)


def wgmma_fence_operands(letters: Sequence[str]) -> tuple[str, str]:
    """wgmma.fence.sync.aligned, with `letters` registers passing through (outputs $0..,
    tied inputs after them): orders earlier register writes and shared-memory accesses of
    the warpgroup before the wgmma.mma_async that follow.
    wgmma.fence: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-fence
    """
    outputs, inputs = _tied(letters)
    return "wgmma.fence.sync.aligned;", _join(outputs, inputs, [MEMORY])


def wgmma_mma_async(n: int, k: int, dtype: str, atype: str, btype: str, accumulators: int, acc_letter: str,
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


def mma_sync_m16n8k16(input_type: str) -> tuple[str, str]:
    """One mma.sync.aligned.m16n8k16.row.col.f32.{input_type}.{input_type}.f32: d0..d3
    ($0..$3, f32, each also the tied input c_i), then A's four and B's two 32-bit words
    (two 16-bit elements each). No memory clobber: it reads registers only.
    mma: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-mma
    """
    outputs, tied = _tied(["f"] * 4)
    text = (f"mma.sync.aligned.m16n8k16.row.col.f32.{input_type}.{input_type}.f32 "
            "{$0, $1, $2, $3}, {$8, $9, $10, $11}, {$12, $13}, {$0, $1, $2, $3};")
    return text, _join(outputs, tied, ["r"] * 6)


def ldmatrix(count: int) -> tuple[str, str]:
    """ldmatrix.sync.aligned.m8n8.x{count}.shared.b16: `count` 32-bit words ($0..), each
    two 16-bit elements of an 8 x 8 matrix, from the row address this lane gives (last
    operand, shared). Reads shared memory: a memory clobber keeps it after the writes.
    ldmatrix: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-ldmatrix
    """
    words = ", ".join(f"${i}" for i in range(count))
    return (f"ldmatrix.sync.aligned.m8n8.x{count}.shared.b16 {{{words}}}, [${count}];",
            ",".join(["=r"] * count + ["r", MEMORY]))


def stmatrix(count: int) -> tuple[str, str]:
    """stmatrix.sync.aligned.m8n8.x{count}.shared.b16: ldmatrix's inverse. `count` 32-bit
    words ($1..), each two 16-bit elements of an 8 x 8 matrix, to the row address this
    lane gives ($0, shared). Writes shared memory: a memory clobber keeps it in order.
    stmatrix: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-stmatrix
    """
    words = ", ".join(f"${i + 1}" for i in range(count))
    return (f"stmatrix.sync.aligned.m8n8.x{count}.shared.b16 [$0], {{{words}}};",
            ",".join(["r"] * (count + 1) + [MEMORY]))


def wgmma_descriptor_step(step: int) -> tuple[str, str]:
    """add.s64 of a constant start-address step to a wgmma matrix descriptor, kept one
    64-bit add: LLVM turns an add of bits it knows disjoint into an or, which ptxas builds
    as two 32-bit halves (the constant high word made again for every wgmma); the add is one
    UIADD3.64 from the base.
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#integer-arithmetic-instructions-add
    """
    return f"add.s64 $0, $1, {step};", "=l,l"


def wgmma_commit_group() -> tuple[str, str]:
    """wgmma.commit_group.sync.aligned: the warpgroup's uncommitted mma_async form a group.
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-commit-group
    """
    return "wgmma.commit_group.sync.aligned;", MEMORY


# Instructions ptxas does not hoist a wgmma wait above (WarpgroupMmaWait.anchor): a
# volatile shared load (its value unused), nanosleep 0, a CTA fence. A clock or timer read,
# a warp barrier or a proxy fence do not hold it.
WAIT_ANCHORS = {
    "volatile": "{ .reg .b32 a, v; mov.u32 a, 0; ld.volatile.shared.b32 v, [a]; } ",
    "sleep": "nanosleep.u32 0; ",
    "fence": "fence.acq_rel.cta; ",
}


def wgmma_wait_group(pending: int, letters: Sequence[str], anchor: str = "") -> tuple[str, str]:
    """wgmma.wait_group.sync.aligned `pending`, with the registers the waited groups write
    passing through (outputs $0.., tied inputs), so their reads stay below the wait;
    after WAIT_ANCHORS[anchor] where one is named.
    https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-wait-group
    """
    outputs, inputs = _tied(letters)
    prefix = WAIT_ANCHORS[anchor] if anchor else ""
    return f"{prefix}wgmma.wait_group.sync.aligned {int(pending)};", _join(outputs, inputs, [MEMORY])


def fence_proxy_async_shared() -> tuple[str, str]:
    """fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory accesses
    are ordered with later async-proxy ones (wgmma operands, TMA).
    membar/fence: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar
    """
    return "fence.proxy.async.shared::cta;", MEMORY
