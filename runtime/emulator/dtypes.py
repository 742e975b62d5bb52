"""Element types as numpy values: register storage, memory encoding, rounding, casts.

Registers hold each element in a *storage* dtype: fp32/fp64/fp16 natively, integers in
their numpy integer (wraparound arithmetic), i1 as bool, pointers as int64 byte addresses.
bf16 and the fp8 formats have no numpy dtype: their registers hold float32 values that are
exactly representable in the format, and every op producing one rounds its float32 result
(round to nearest even) with `finish`. That matches the GPU, which computes bf16/fp8
arithmetic in fp32 and rounds once (a single float32 rounding before the final one is
innocuous for +, -, *, / because 24 >= 2 * 8 + 2 mantissa bits).

In memory (global or shared) an element is its bit pattern: bf16 as uint16, fp8 as uint8,
i1 as one byte (0 or 1). `encode`/`decode` convert between the two.

Integer `//` and `%` follow C (truncation toward zero; the remainder takes the dividend's
sign), which is what PTX `div.s32`/`rem.s32` compute and what the backend emits. Division
by zero yields -1 (all bits set) for `//` and the dividend for `%` instead of faulting.
Float `//` is floor(a / b); float `%` is C fmod (LLVM `frem`). Float -> int casts truncate
and saturate, NaN giving 0 (PTX `cvt.rzi.sat`); float -> fp8 casts saturate to the largest
finite value (PTX `cvt.rn.satfinite`); float -> bf16/fp16 overflow to infinity.
"""

from __future__ import annotations

import numpy as np

from ...compiler.types import PointerType, ScalarType

_NATIVE = {
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
    "bf16": np.float32, "fp8e4m3": np.float32, "fp8e5m2": np.float32,
}
_MEMORY = {**_NATIVE, "i1": np.uint8, "bf16": np.uint16, "fp8e4m3": np.uint8, "fp8e5m2": np.uint8}
# name -> (mantissa bits, minimum normal exponent, largest finite value, saturate on overflow)
_SMALL_FLOATS = {
    "bf16": (7, -126, (2 - 2.0 ** -7) * 2.0 ** 127, False),
    "fp16": (10, -14, 65504.0, False),
    "fp8e4m3": (3, -6, 448.0, True),
    "fp8e5m2": (2, -14, 57344.0, True),
}


def storage_dtype(element) -> np.dtype:
    """The numpy dtype registers hold `element` in."""
    if isinstance(element, PointerType):
        return np.dtype(np.int64)
    return np.dtype(_NATIVE[element.name])


def memory_dtype(element) -> np.dtype:
    """The numpy dtype of `element`'s bit pattern in memory."""
    if isinstance(element, PointerType):
        return np.dtype(np.int64)
    return np.dtype(_MEMORY[element.name])


def element_bytes(element) -> int:
    return memory_dtype(element).itemsize


def is_float(element) -> bool:
    return isinstance(element, ScalarType) and element.is_float


def _scalar_or_array(out: np.ndarray):
    return out[()] if out.ndim == 0 else out


# --------------------------------------------------------------- bf16 and fp8 codecs
def to_bf16(values) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    f32 = np.asarray(values, dtype=np.float32)
    bits = f32.view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))) >> 16
    nan = np.uint32(0x7FC0) | ((bits >> 16) & np.uint32(0x8000))
    return np.where(np.isnan(f32), nan, rounded).astype(np.uint16)


def from_bf16(bits) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_small_float(values, name: str) -> np.ndarray:
    """Round float64 values to the nearest (even) value of a small float format, as float64."""
    man_bits, emin, max_finite, saturate = _SMALL_FLOATS[name]
    x = np.asarray(values, dtype=np.float64)
    _, exponent = np.frexp(x)  # x = m * 2**exponent with 0.5 <= |m| < 1
    quantum = np.maximum(exponent - 1 - man_bits, emin - man_bits)
    y = np.ldexp(np.rint(np.ldexp(x, -quantum)), quantum)
    limit = max_finite if saturate else np.inf
    return np.where(np.abs(y) > max_finite, np.copysign(limit, y), y)


def _fp8_value(code: int, name: str) -> float:
    man_bits, emin, _, _ = _SMALL_FLOATS[name]
    sign = -1.0 if code & 0x80 else 1.0
    exp_field = (code & 0x7F) >> man_bits
    mantissa = code & ((1 << man_bits) - 1)
    bias = 1 - emin
    if name == "fp8e4m3" and code & 0x7F == 0x7F:
        return float("nan")
    if name == "fp8e5m2" and exp_field == 31:
        return sign * float("inf") if mantissa == 0 else float("nan")
    if exp_field == 0:
        return sign * mantissa * 2.0 ** (emin - man_bits)
    return sign * (1 + mantissa / (1 << man_bits)) * 2.0 ** (exp_field - bias)


_FP8_TABLES: dict = {}


def _fp8_tables(name: str):
    if name not in _FP8_TABLES:
        decode = np.array([_fp8_value(c, name) for c in range(256)], dtype=np.float32)
        positive = decode[:0x80]
        finite = np.flatnonzero(np.isfinite(positive))
        order = finite[np.argsort(positive[finite], kind="stable")]
        _FP8_TABLES[name] = (decode, positive[order], order.astype(np.uint8))
    return _FP8_TABLES[name]


def from_fp8(bits, name: str) -> np.ndarray:
    return _fp8_tables(name)[0][np.asarray(bits, dtype=np.uint8)]


def to_fp8(values, name: str) -> np.ndarray:
    """float values -> fp8 bit patterns: round to nearest even, saturating, NaN kept."""
    decode, sorted_values, codes = _fp8_tables(name)
    rounded = round_small_float(values, name)
    index = np.clip(np.searchsorted(sorted_values, np.abs(rounded)), 0, len(codes) - 1)
    out = codes[index] | np.where(np.signbit(rounded), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(rounded), np.uint8(0x7F), out).astype(np.uint8)


# ------------------------------------------------------------ rounding and casting
def finish(element, values):
    """A computed value as `element`'s storage: rounded for bf16/fp8, wrapped for integers."""
    x = np.asarray(values)
    name = element.name if isinstance(element, ScalarType) else ""
    if name == "bf16":
        out = from_bf16(to_bf16(x)) if x.dtype != np.float64 else \
            round_small_float(x, name).astype(np.float32)
    elif name.startswith("fp8"):
        out = round_small_float(x, name).astype(np.float32)
    else:
        out = x.astype(storage_dtype(element), copy=False)
    return _scalar_or_array(out)


def cast(values, source, target):
    """Numeric conversion between element types (the `cast` op)."""
    x = np.asarray(values)
    if source == target:
        return _scalar_or_array(x)
    if isinstance(target, ScalarType) and target.is_bool:
        return _scalar_or_array(x != 0)
    if is_float(source) and isinstance(target, ScalarType) and target.is_int:
        info = np.iinfo(storage_dtype(target))
        t = np.trunc(x.astype(np.float64))
        high, low = t >= float(info.max), t <= float(info.min)
        safe = np.where(high | low | np.isnan(t), 0, t).astype(storage_dtype(target))
        out = np.where(high, info.max, np.where(low, info.min, safe)).astype(storage_dtype(target))
        return _scalar_or_array(out)
    if is_float(target) and target.name in ("fp32", "fp64", "fp16"):
        return _scalar_or_array(x.astype(storage_dtype(target)))
    if is_float(target):  # bf16 / fp8 from anything: one rounding from exact float64
        if target.name == "bf16" and x.dtype == np.float32:
            return finish(target, x)
        return finish(target, x.astype(np.float64))
    return _scalar_or_array(x.astype(storage_dtype(target)))


def encode(element, values) -> np.ndarray:
    """Register values -> memory bit patterns."""
    name = element.name if isinstance(element, ScalarType) else ""
    if name == "bf16":
        return to_bf16(values)
    if name.startswith("fp8"):
        return to_fp8(values, name)
    return np.asarray(values).astype(memory_dtype(element), copy=False)


def decode(element, raw):
    """Memory bit patterns -> register values."""
    name = element.name if isinstance(element, ScalarType) else ""
    if name == "bf16":
        return from_bf16(raw)
    if name.startswith("fp8"):
        return from_fp8(raw, name)
    if name == "i1":
        return np.asarray(raw) != 0
    return np.asarray(raw)


def bitcast(values, source, target):
    """Reinterpret the bits of each element (equal widths)."""
    raw = np.ascontiguousarray(encode(source, values))
    if memory_dtype(source).itemsize != memory_dtype(target).itemsize:
        raise ValueError(f"bitcast between {source} and {target} of different widths")
    return _scalar_or_array(np.asarray(decode(target, raw.view(memory_dtype(target)))))


# ------------------------------------------------------------- integer division (C)
def c_divide(a, b):
    """Integer quotient truncated toward zero; x // 0 gives -1; INT_MIN // -1 wraps."""
    a, b = np.asarray(a), np.asarray(b)
    zero = b == 0
    safe = np.where(zero, 1, b).astype(b.dtype)
    with np.errstate(over="ignore"):
        quotient = a // safe
        remainder = a - quotient * safe
    adjust = (remainder != 0) & ((a < 0) != (safe < 0))
    quotient = np.where(adjust, quotient + 1, quotient)
    out = np.where(zero, np.array(-1).astype(a.dtype), quotient).astype(a.dtype)
    return _scalar_or_array(out)


def c_remainder(a, b):
    """Integer remainder with the dividend's sign; x % 0 gives x."""
    a, b = np.asarray(a), np.asarray(b)
    zero = b == 0
    safe = np.where(zero, 1, b).astype(b.dtype)
    out = np.where(zero, a, np.fmod(a, safe)).astype(a.dtype)
    return _scalar_or_array(out)
