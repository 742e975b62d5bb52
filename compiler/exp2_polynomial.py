"""exp2 on the FMA pipe: the polynomial `ll.exp2(x, fma_share=...)` uses for a share of
each thread's registers, so that those exps leave the exp unit (MUFU) free.

Why: the exp unit does 16 exps per clock per SM, about the rate at which the tensor
cores consume attention scores at head_dim 64; FlashAttention-4 moves part of the exps to
FMAs for that reason. (Each exp moved costs nine more issued instructions, so weft's
attention, which is not limited by the exp unit alone, ran slower with any share:
docs/attention-journal.md.)

The algorithm, the same in the backend and the emulator, in fp32:
    x = min(max(x, -127), 128)      NaN-propagating clamps (x = NaN stays NaN)
    t = x + 1.5 * 2^23, rounded down: floor(x) sits in the low mantissa bits of t
    j = t - 1.5 * 2^23              = floor(x), exactly
    f = x - j                       in [0, 1), exactly
    p = 1 + f (c1 + f (c2 + f c3))  2^f, three FMAs
    2^x = p * float(bits(t) << 23 + bits(1.0))   (the shift leaves j << 23, so the
                                     multiplier is 2^j: 0 for j = -127, inf for j = 128)
Ten instructions, none on the exp unit. Relative error at most 8.6e-5 (the polynomial's;
below half a bf16 or fp16 ulp), results below 2^-126 are 0 (as ex2.approx.ftz gives),
inf and NaN as exp2 gives them.
"""

from __future__ import annotations

from fractions import Fraction

# 2^f on [0, 1] with p(0) = 1, minimax in relative error (8.6e-5), fp32 values.
COEFFICIENTS = (1.0, 0.6951163411140442, 0.22764700651168823, 0.07706519961357117)
CLAMP_LOW = -127.0   # 2^-127 and below flush to 0
CLAMP_HIGH = 128.0   # 2^128 and above are inf
ROUNDING_MAGIC = 12582912.0  # 1.5 * 2^23: adding it moves an integer part into the mantissa's low bits
ONE_BITS = 0x3F800000  # bits of 1.0f
MANTISSA_BITS = 23


def polynomial_registers(count: int, share: float) -> tuple[int, ...]:
    """Which of a thread's `count` registers the polynomial computes for `fma_share`:
    floor(count * share) of them, spread evenly (register i when floor((i + 1) * share)
    steps up), so the exp unit and the FMAs interleave."""
    share = Fraction(share).limit_denominator(1024)
    return tuple(i for i in range(count) if (i + 1) * share // 1 > i * share // 1)
