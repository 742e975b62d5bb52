"""Every inline-PTX string of the backend, each with the PTX ISA section it follows.

Everything that an NVVM intrinsic covers (thread ids, barriers, shuffles, ex2/lg2/sin/cos
approximations) is emitted as the intrinsic, not here. Inline PTX is used where LLVM has
no way to say what we need: predicated global accesses (a masked-off lane must not touch
memory), the fp8 conversions, and fp32 pairs to packed 16-bit floats (LLVM emits one
scalar `cvt` per element and integer ops to pack them).

Each function returns `(asm_text, constraints)` for `llvmlite.ir.InlineAsm`. Constraint
letters (LLVM NVPTX): `b` predicate (i1), `h` 16-bit, `r` 32-bit, `l` 64-bit, `f` f32.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html
"""

from __future__ import annotations

ISA = "https://docs.nvidia.com/cuda/parallel-thread-execution/index.html"

# Register constraint and PTX type for one word of a global access, by word width.
_WORD = {8: ("h", "b8"), 16: ("h", "b16"), 32: ("r", "b32"), 64: ("l", "b64")}


def _vector_suffix(count: int) -> str:
    return "" if count == 1 else f".v{count}"


def masked_global_load(word_bits: int, count: int, fill: tuple = ()) -> tuple[str, str]:
    """`count` words of `word_bits`, loaded only where the predicate holds, else `fill`
    (one bit pattern per word; 0 when not given).

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
    text = f"{zero}\n\t@${count + 1} ld.global{_vector_suffix(count)}.{ptx_type} {target}, [${count}];"
    constraints = ",".join([f"={letter}"] * count + ["l", "b"])
    return text, constraints


def masked_global_store(word_bits: int, count: int) -> tuple[str, str]:
    """Store `count` words only where the predicate holds.

    Operands: the address ($0), the words ($1..$count), the predicate ($count+1).
    st: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st
    """
    letter, ptx_type = _WORD[word_bits]
    values = [f"${i + 1}" for i in range(count)]
    source = values[0] if count == 1 else "{" + ", ".join(values) + "}"
    text = f"@${count + 1} st.global{_vector_suffix(count)}.{ptx_type} [$0], {source};"
    constraints = ",".join(["l"] + [letter] * count + ["b"])
    return text, constraints


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
