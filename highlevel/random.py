"""Triton's random numbers (`tl.rand`, `tl.randn`, `tl.randint`, `tl.randint4x`, ...):
counter-based Philox-4x32-10, the same streams as Triton's bit for bit.

Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11) maps a
128-bit counter and a 64-bit key to 128 random bits in 10 rounds. Triton's convention,
kept here: the counter is (offset, 0, 0, 0) and the key the seed's low and high 32 bits;
each round multiplies two counter words by fixed odd constants, swaps the halves of the
products in with the other words and the key, then bumps the key by the golden-ratio
constants. `randint` is the first word; `rand` maps it to [0, 1) through the int32 with
the same bits; `randn` feeds two words to Box-Muller.

`randint` and `rand` are bit-exact with Triton (integer arithmetic, one int-to-float
conversion and one multiplication, all rounded to nearest). `randn` follows Triton's
formula with Triton's math (libdevice's logf, sinf and cosf, sqrt.approx.ftz), so on the
GPU its bits are Triton's too; the CPU emulator's numpy math agrees within a few ulps.
"""

from __future__ import annotations

import builtins as py
from typing import Any

from ..compiler.builder import builtin
from ..compiler.types import ScalarType, fp32, i32, i64, u32, u64
from ..lowlevel import semantic as ll_sem
from . import semantic as sem
from .math import umulhi

N_ROUNDS_DEFAULT = 10
# Philox-4x32 multipliers and key increments (the Random123 constants Triton uses).
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85
# Largest scales with (2**31 - 1) * scale < 1 in fp32 (and the int64 analogue): Triton's.
SCALE_32, SCALE_64 = 4.6566127342e-10, 1.0842020432385337e-19


def _rounds(n_rounds: Any) -> int:
    if isinstance(n_rounds, py.bool) or not isinstance(n_rounds, py.int) or n_rounds < 1:
        raise sem.builder().error(f"n_rounds must be a positive compile-time int, found {sem.describe(n_rounds)}")
    return n_rounds


def _key(seed: Any) -> tuple:
    """(low, high) u32 words of the seed taken as a u64, as Triton's `seed.to(tl.uint64)`
    (a signed seed is sign-extended)."""
    b = sem.builder()
    if not ll_sem.is_value(seed):
        if isinstance(seed, py.bool) or not isinstance(seed, py.int):
            raise b.error(f"the seed must be an integer, found {seed!r}")
        if not -(1 << 63) <= seed < (1 << 64):
            raise b.error(f"the seed {seed} does not fit in 64 bits")
        seed &= (1 << 64) - 1
        return ll_sem.constant(seed & 0xFFFFFFFF, u32), ll_sem.constant(seed >> 32, u32)
    element = ll_sem.element_of(seed.type)
    if sem.is_tensor(seed) or not isinstance(element, ScalarType) or element.is_float or element.is_bool:
        raise b.error(f"the seed must be an integer scalar, found {sem.describe(seed)}",
                      suggestion="pass one seed for the whole tile (a kernel argument or a number)")
    wide = ll_sem.cast(seed, u64)
    return ll_sem.cast(wide, u32), ll_sem.cast(wide >> 32, u32)


def _counter_word(value: Any, what: str):
    """A 32-bit counter word as u32 (the same bits)."""
    b = sem.builder()
    if not ll_sem.is_value(value):
        if isinstance(value, py.bool) or not isinstance(value, py.int):
            raise b.error(f"{what} must be an integer, found {value!r}")
        return ll_sem.constant(value & 0xFFFFFFFF, u32)
    element = ll_sem.element_of(value.type)
    if not isinstance(element, ScalarType) or not element.is_int or element.is_bool or element.bits != 32:
        raise b.error(f"{what} must be 32-bit integers, found {sem.describe(value)}",
                      suggestion="convert with .to(tl.int32) (weft's Philox runs on 32-bit counters)")
    return ll_sem.cast(value, u32, bitcast=True)


def _philox(seed: Any, c0: Any, c1: Any, c2: Any, c3: Any, n_rounds: int) -> tuple:
    k0, k1 = _key(seed)
    c0, c1, c2, c3 = (_counter_word(c, f"philox counter c{i}") for i, c in enumerate((c0, c1, c2, c3)))
    c0, c1, c2, c3 = sem.broadcast_all(c0, c1, c2, c3, what="philox")
    for _ in py.range(n_rounds):
        c0, c1, c2, c3 = (umulhi(ROUND_B, c2) ^ c1 ^ k0, c2 * ROUND_B,
                          umulhi(ROUND_A, c0) ^ c3 ^ k1, c0 * ROUND_A)
        k0, k1 = k0 + KEY_A, k1 + KEY_B
    return c0, c1, c2, c3


@builtin
def philox(seed: Any, c0: Any, c1: Any, c2: Any, c3: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """Philox-4x32 of the counter (c0, c1, c2, c3) under the key `seed` (taken as a u64):
    four u32 values (tensors where a counter word is one)."""
    return _philox(seed, c0, c1, c2, c3, _rounds(n_rounds))


@builtin
def randint4x(seed: Any, offset: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """Four blocks of random u32 for a scalar `seed` and a block of 32-bit `offset`s."""
    return _philox(seed, offset, 0, 0, 0, _rounds(n_rounds))


@builtin
def randint(seed: Any, offset: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """A block of random u32 (the first of randint4x's)."""
    return _philox(seed, offset, 0, 0, 0, _rounds(n_rounds))[0]


def _uniform(x: Any):
    element = ll_sem.element_of(x.type)
    if element.bits == 32:
        x, scale = ll_sem.cast(x, i32, bitcast=True), SCALE_32
    else:
        x, scale = ll_sem.cast(x, i64, bitcast=True), SCALE_64
    x = ll_sem.where(x < 0, -x - 1, x)
    return ll_sem.binary("mul", ll_sem.cast(x, fp32), scale, "*")


@builtin
def uint_to_uniform_float(x: Any):
    """Random 32- or 64-bit integers to floats in [0, 1): the int with the same bits,
    folded onto the non-negative ones (x < 0 -> -x - 1), times the largest scale that stays
    below 1."""
    element = ll_sem.element_of(x.type) if ll_sem.is_value(x) else None
    if not isinstance(element, ScalarType) or not element.is_int or element.bits not in (32, 64):
        raise sem.builder().error(f"uint_to_uniform_float needs 32- or 64-bit integers, found {sem.describe(x)}")
    return _uniform(x)


@builtin
def rand(seed: Any, offset: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """A block of random fp32 in [0, 1)."""
    return _uniform(_philox(seed, offset, 0, 0, 0, _rounds(n_rounds))[0])


@builtin
def rand4x(seed: Any, offset: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """Four blocks of random fp32 in [0, 1)."""
    return tuple(_uniform(word) for word in _philox(seed, offset, 0, 0, 0, _rounds(n_rounds)))


def _normal_pair(u1: Any, u2: Any) -> tuple:
    from .builtins import cos, log, maximum, sin, sqrt

    u1 = maximum(1.0e-7, u1)
    th = 6.283185307179586 * u2
    r = sqrt(-2.0 * log(u1))
    return r * cos(th), r * sin(th)


@builtin
def pair_uniform_to_normal(u1: Any, u2: Any):
    """Box-Muller: two uniform blocks in [0, 1) to two standard normal blocks."""
    return _normal_pair(u1, u2)


@builtin
def randn(seed: Any, offset: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """A block of random fp32 from N(0, 1)."""
    words = _philox(seed, offset, 0, 0, 0, _rounds(n_rounds))
    return _normal_pair(_uniform(words[0]), _uniform(words[1]))[0]


@builtin
def randn4x(seed: Any, offset: Any, n_rounds: int = N_ROUNDS_DEFAULT):
    """Four blocks of random fp32 from N(0, 1)."""
    u = [_uniform(word) for word in _philox(seed, offset, 0, 0, 0, _rounds(n_rounds))]
    return _normal_pair(u[0], u[1]) + _normal_pair(u[2], u[3])
