"""tl.rand / tl.randn / tl.randint / tl.randint4x / tl.philox: Triton's Philox-4x32-10
streams, bit for bit.

Two independent references: a numpy Philox written here from the published algorithm
(Salmon et al., SC11: each round (c0, c1, c2, c3) -> (hi(B*c2)^c1^k0, lo(B*c2),
hi(A*c0)^c3^k1, lo(A*c0)), key bumped by (0x9E3779B9, 0xBB67AE85) after each round; Triton's
counter is (offset, 0, 0, 0) and its key the seed's two 32-bit halves), and the known-answer
vectors of Random123's kat_vectors file (the Philox authors' library, whose rounds Triton's
python/triton/language/random.py reproduces) for Philox-4x32-10.
"""

import numpy as np
import pytest

from weft import highlevel as tl

from ._compile import error_of, line_of, ptx_through_ptxas

RNG = np.random.default_rng(42)
MASK32 = np.uint64(0xFFFFFFFF)

# Random123 kat_vectors, "philox4x32 10": counter (4 words), key (2 words) -> output (4 words).
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_reference(seed: int, c0, c1=0, c2=0, c3=0, n_rounds: int = 10):
    """Philox-4x32 in numpy (uint64 arithmetic, masked to 32 bits)."""
    c = [np.asarray(v, np.int64).astype(np.uint64) & MASK32 for v in (c0, c1, c2, c3)]
    c = np.broadcast_arrays(*c)
    c0, c1, c2, c3 = (np.array(v) for v in c)
    seed &= (1 << 64) - 1
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    a, b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(n_rounds):
        p0, p2 = a * c0, b * c2
        c0, c1, c2, c3 = ((p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & MASK32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & MASK32)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & MASK32, (k1 + np.uint64(0xBB67AE85)) & MASK32
    return tuple(v.astype(np.uint32) for v in (c0, c1, c2, c3))


def uniform_reference(words: np.ndarray) -> np.ndarray:
    x = words.view(np.int32).astype(np.int64)
    x = np.where(x < 0, -x - 1, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)  # int -> fp32 rounds to nearest, as cvt.rn


def normal_reference(u1: np.ndarray, u2: np.ndarray):
    u1 = np.maximum(1.0e-7, u1.astype(np.float64))
    r = np.sqrt(-2.0 * np.log(u1))
    th = 6.283185307179586 * u2.astype(np.float64)
    return r * np.cos(th), r * np.sin(th)


def test_the_numpy_reference_reproduces_random123s_known_answers():
    for counter, key, expected in KNOWN_ANSWERS:
        out = philox_reference(key[0] | key[1] << 32, *counter)
        assert tuple(int(v) for v in out) == expected


@tl.jit
def philox_words(counter_ptr, out_ptr, SEED: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, N)
    c0 = tl.load(counter_ptr + offs * 4)
    c1 = tl.load(counter_ptr + offs * 4 + 1)
    c2 = tl.load(counter_ptr + offs * 4 + 2)
    c3 = tl.load(counter_ptr + offs * 4 + 3)
    a, b, c, d = tl.philox(SEED, c0, c1, c2, c3)
    tl.store(out_ptr + offs * 4, a)
    tl.store(out_ptr + offs * 4 + 1, b)
    tl.store(out_ptr + offs * 4 + 2, c)
    tl.store(out_ptr + offs * 4 + 3, d)


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_matches_random123s_known_answers(counter, key, expected):
    counters = np.tile(np.array(counter, np.uint32), 16)
    out = np.zeros_like(counters)
    philox_words[(1,)](counters, out, SEED=key[0] | key[1] << 32, N=16)
    assert [tuple(int(v) for v in row) for row in out.reshape(16, 4)] == [expected] * 16


@tl.jit
def random_streams(offset_ptr, out_ptr, seed, N: tl.constexpr):
    offs = tl.load(offset_ptr + tl.arange(0, N))
    block = tl.arange(0, N)
    tl.store(out_ptr + block, tl.randint(seed, offs).to(tl.int32, bitcast=True))
    i0, i1, i2, i3 = tl.randint4x(seed, offs)
    for k, word in enumerate((i0, i1, i2, i3)):
        tl.store(out_ptr + (1 + k) * N + block, word.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 5 * N + block, tl.rand(seed, offs).to(tl.int32, bitcast=True))
    u0, u1, u2, u3 = tl.rand4x(seed, offs)
    tl.store(out_ptr + 6 * N + block, u3.to(tl.int32, bitcast=True))


def streams(seed, offsets):
    n = offsets.size
    out = np.zeros(7 * n, np.int32)
    random_streams[(1,)](offsets, out, seed, N=n)
    return out.reshape(7, n).view(np.uint32)


@pytest.mark.parametrize("seed", [12345, -7, -(2**40) + 3])  # i32, i32 sign-extended to the u64 key, i64
def test_randint_and_rand_are_philox_bit_for_bit(seed):
    offsets = RNG.integers(-2**31, 2**31, 256).astype(np.int32)
    out = streams(seed, offsets)
    words = philox_reference(seed, offsets)
    np.testing.assert_array_equal(out[0], words[0])
    for k in range(4):
        np.testing.assert_array_equal(out[1 + k], words[k])
    np.testing.assert_array_equal(out[5].view(np.float32), uniform_reference(words[0]))
    np.testing.assert_array_equal(out[6].view(np.float32), uniform_reference(words[3]))
    u = out[5].view(np.float32)
    assert (u >= 0).all() and (u < 1).all()


@tl.jit
def normals(out_ptr, seed, start, N: tl.constexpr):
    offs = start + tl.arange(0, N)
    tl.store(out_ptr + tl.arange(0, N), tl.randn(seed, offs))
    n0, n1, n2, n3 = tl.randn4x(seed, offs)
    tl.store(out_ptr + N + tl.arange(0, N), n1)
    tl.store(out_ptr + 2 * N + tl.arange(0, N), n2)


def test_randn_is_box_muller_of_the_philox_words():
    out = np.zeros(3 * 1024, np.float32)
    normals[(1,)](out, 99, 5000, N=1024)
    words = philox_reference(99, np.arange(5000, 6024))
    u = [uniform_reference(w) for w in words]
    first, second = normal_reference(u[0], u[1])
    third, _ = normal_reference(u[2], u[3])
    np.testing.assert_allclose(out.reshape(3, 1024), np.array([first, second, third]), rtol=1e-4, atol=1e-4)
    assert abs(out.mean()) < 0.1 and abs(out.std() - 1) < 0.1


@tl.jit
def seeded_dropout(x_ptr, out_ptr, n, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    keep = tl.rand(seed, offs) > p
    tl.store(out_ptr + offs, tl.where(keep, x / (1 - p), 0.0), mask=mask)


def test_seeded_dropout_matches_numpy_and_compiles_through_ptxas():
    x = RNG.standard_normal(1000).astype(np.float32)
    out = np.zeros_like(x)
    seeded_dropout[(4,)](x, out, 1000, 0.5, 123, BLOCK=256)
    keep = uniform_reference(philox_reference(123, np.arange(1000))[0]) > np.float32(0.5)
    np.testing.assert_allclose(out, np.where(keep, x.astype(np.float64) / 0.5, 0.0), rtol=1e-6)
    ptx = ptx_through_ptxas(seeded_dropout, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "p": "fp32",
                                             "seed": "i32"}, {"BLOCK": 256})
    assert "mul.hi.u32" in ptx or "mul.wide.u32" in ptx


# ------------------------------------------------------------------ errors
@tl.jit
def wide_offsets(out_ptr, seed):
    offs = tl.arange(0, 16).to(tl.int64)
    tl.store(out_ptr + tl.arange(0, 16), tl.rand(seed, offs))


@tl.jit
def float_seed(out_ptr, seed):
    tl.store(out_ptr + tl.arange(0, 16), tl.rand(seed, tl.arange(0, 16)))


@tl.jit
def tile_seed(out_ptr, seed):
    seeds = tl.arange(0, 16)
    tl.store(out_ptr + tl.arange(0, 16), tl.randn(seeds, tl.arange(0, 16)))


@tl.jit
def no_rounds(out_ptr, seed):
    tl.store(out_ptr + tl.arange(0, 16), tl.randint(seed, tl.arange(0, 16), 0).to(tl.float32))


@pytest.mark.parametrize("fn, seed_type, text, message", [
    (wide_offsets, "i32", "tl.rand(seed, offs)", "must be 32-bit integers"),
    (float_seed, "fp32", "tl.rand(seed, ", "the seed must be an integer scalar"),
    (tile_seed, "i32", "tl.randn(seeds, ", "the seed must be an integer scalar"),
    (no_rounds, "i32", "tl.randint(seed, ", "n_rounds must be a positive compile-time int"),
])
def test_bad_random_arguments_point_at_the_users_line(fn, seed_type, text, message):
    error = error_of(fn, {"out_ptr": "*fp32", "seed": seed_type})
    assert message in error.message
    assert error.loc.line == line_of(fn, text)
