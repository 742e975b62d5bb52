"""`ll.exp2(x, fma_share=...)`: a share of each thread's registers computed by an FMA
polynomial instead of the exp unit (compiler/exp2_polynomial.py), in the backend, the
emulator and on the GPU."""

import re

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.compiler.exp2_polynomial import polynomial_registers
from weft.runtime.emulator.elementwise import exp2_on_fma

LAYOUT = ll.BlockedLayout([8], [32], [4], [0])  # 8 registers per thread over 1024 elements
SIZE = 1024
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32"}
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")  # exp2(200) = inf


@ll.jit
def split_exp2(x_ptr, out_ptr, SHARE: ll.constexpr):
    offs = ll.arange(0, 1024, LAYOUT)
    ll.store(out_ptr + offs, ll.exp2(ll.load(x_ptr + offs), fma_share=SHARE))


def _on_fma_mask(share: float) -> np.ndarray:
    """Which of the 1024 elements LAYOUT puts in a register the polynomial computes:
    element e is register e % 8 of its thread."""
    return np.isin(np.arange(SIZE) % 8, polynomial_registers(8, share))


def _inputs(rng) -> np.ndarray:
    x = rng.uniform(-140.0, 140.0, SIZE).astype(np.float32)
    x[:64] = rng.uniform(-1.0, 1.0, 64)
    x[64:80] = [-np.inf, np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 127.5, 128.0, 200.0,
                -126.0, -126.5, -127.0, -127.5, -300.0, 3e-39]
    return x


def _relative_error(got, x) -> np.ndarray:
    want = np.exp2(x.astype(np.float64))
    normal = (want >= 2.0 ** -126) & (want < 2.0 ** 128)
    return np.abs(got.astype(np.float64)[normal] / want[normal] - 1)


@pytest.mark.parametrize("count, share, expected", [
    (8, 0.0, ()), (8, 1.0, tuple(range(8))), (8, 0.25, (3, 7)), (8, 0.5, (1, 3, 5, 7)),
    (64, 0.125, (7, 15, 23, 31, 39, 47, 55, 63)), (3, 1 / 3, (2,)), (1, 0.5, ()),
])
def test_polynomial_registers_are_spread_evenly(count, share, expected):
    assert polynomial_registers(count, share) == expected


def test_the_polynomial_is_accurate_and_keeps_special_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-126, 127, 200_000), np.linspace(-2, 2, 40_001)]).astype(np.float32)
    got = exp2_on_fma(x)
    assert _relative_error(got, x).max() < 8.7e-5
    integers = np.arange(-126, 128, dtype=np.float32)
    np.testing.assert_array_equal(exp2_on_fma(integers), np.ldexp(np.float32(1), integers.astype(int)))  # p(0) = 1
    special = np.array([-np.inf, -127.0, -130.0, 128.0, 1000.0, np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(exp2_on_fma(special), [0, 0, 0, np.inf, np.inf, np.inf, np.nan])


@pytest.mark.parametrize("share", [0.25, 0.5, 1.0])
def test_the_emulator_splits_registers_as_the_backend_does(share):
    x = _inputs(np.random.default_rng(1))
    out = np.zeros(SIZE, np.float32)
    split_exp2[(1,)](x, out, SHARE=share)
    on_fma = _on_fma_mask(share)
    np.testing.assert_array_equal(out[on_fma], exp2_on_fma(x[on_fma]))
    # The exp unit's registers: ex2.approx.ftz flushes results below 2^-126 to 0, and so
    # does the emulator (test_split_exp2_on_the_gpu checks the GPU does).
    exact = np.exp2(x[~on_fma])
    np.testing.assert_array_equal(out[~on_fma], np.where(exact < 2.0 ** -126, 0.0, exact))
    if share < 1.0:
        assert ((exact > 0) & (exact < 2.0 ** -126)).any()  # some did flush
    assert not np.array_equal(out[on_fma], np.exp2(x[on_fma]))  # the polynomial did run
    assert _relative_error(out, x).max() < 8.7e-5


@pytest.mark.parametrize("share, polynomials", [(0.0, 0), (0.25, 2), (0.5, 4), (1.0, 8)])
def test_ptx_puts_the_share_on_fma_and_the_rest_on_the_exp_unit(share, polynomials):
    ptx = split_exp2.compile(signature=SIGNATURE, constexprs={"SHARE": share}).asm["ptx"]
    assert len(re.findall(r"ex2\.approx\.ftz\.f32", ptx)) == 8 - polynomials
    assert len(re.findall(r"add\.rm\.f32", ptx)) == polynomials
    assert len(re.findall(r"max\.NaN\.f32", ptx)) == polynomials


@ll.jit
def bad_share(x_ptr, out_ptr):
    offs = ll.arange(0, 1024, LAYOUT)
    x = ll.load(x_ptr + offs)
    ll.store(out_ptr + offs, ll.exp2(x, fma_share=1.5))


@ll.jit
def runtime_share(x_ptr, out_ptr):
    offs = ll.arange(0, 1024, LAYOUT)
    x = ll.load(x_ptr + offs)
    ll.store(out_ptr + offs, ll.exp2(x, fma_share=ll.load(x_ptr)))


@pytest.mark.parametrize("kernel, line", [(bad_share, "fma_share=1.5"), (runtime_share, "fma_share=ll.load")])
def test_a_bad_share_is_refused_at_the_users_line(kernel, line):
    with pytest.raises(CompilationError, match=r"exp2 fma_share must be a compile-time number in \[0, 1\]") as info:
        kernel.compile(signature=SIGNATURE)
    assert line in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("share", [0.25, 1.0])
def test_split_exp2_on_the_gpu(share):
    torch = pytest.importorskip("torch")
    x = _inputs(np.random.default_rng(2))
    out = torch.zeros(SIZE, dtype=torch.float32, device="cuda")
    split_exp2[(1,)](torch.from_numpy(x).cuda(), out, SHARE=share)
    got = out.cpu().numpy()
    on_fma = _on_fma_mask(share)
    emulated = exp2_on_fma(x[on_fma])
    # the emulator rounds each FMA from fp64: at most one fp32 ulp from the GPU's
    np.testing.assert_array_max_ulp(got[on_fma][np.isfinite(emulated)], emulated[np.isfinite(emulated)], maxulp=1)
    np.testing.assert_array_equal(got[on_fma][~np.isfinite(emulated)], emulated[~np.isfinite(emulated)])
    assert _relative_error(got, x).max() < 8.7e-5
    specials = np.exp2(x[64:80].astype(np.float64))
    tiny = specials < 2.0 ** -126
    np.testing.assert_array_equal(got[64:80][tiny], 0.0)
    np.testing.assert_array_equal(np.isnan(got[64:80]), np.isnan(specials))


def test_the_verifier_refuses_fma_share_on_other_math():
    """A hand-built op must not reach the backend, which would compute exp2 for it."""
    from weft.compiler import ir
    from weft.compiler.frontend import build_kernel
    from weft.compiler.verifier import VerificationError, verify

    kernel = build_kernel(split_exp2, SIGNATURE, {"SHARE": 0.5}, 4)
    (op,) = [op for op in kernel.walk() if isinstance(op, ir.Unary)]
    verify(kernel)
    object.__setattr__(op, "kind", "log2")  # frozen dataclass: what a buggy pass could build
    with pytest.raises(VerificationError, match="fma_share=0.5 is for exp2 only"):
        verify(kernel)


@ll.jit
def exp_and_exp2(x_ptr, out_ptr):
    offs = ll.arange(0, 128, ll.BlockedLayout([1], [32], [4], [0]))
    x = ll.load(x_ptr + offs)
    ll.store(out_ptr + offs, ll.exp2(x))
    ll.store(out_ptr + 128 + offs, ll.exp(x * 0.6931471805599453))


def _tiny_inputs() -> np.ndarray:
    """Powers of two from 2^-140 to 2^0 and between: half of them denormal results."""
    return np.linspace(-140.0, 0.0, 128).astype(np.float32)


def _flushed_powers(x) -> np.ndarray:
    want = np.exp2(x.astype(np.float64))
    return np.where(want < 2.0 ** -126, 0.0, want)


def test_exp_and_exp2_flush_denormal_results_on_the_emulator():
    """Both lower to ex2.approx.ftz.f32, whose results below 2^-126 are 0 on the GPU; the
    emulator gives the same (and so catches kernels that lean on denormals)."""
    x = _tiny_inputs()
    out = np.full(256, np.nan, np.float32)
    exp_and_exp2[(1,)](x, out, num_warps=4)
    want = _flushed_powers(x)
    assert (want == 0).sum() > 10 and (want > 0).sum() > 10
    np.testing.assert_allclose(out[:128], want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(out[128:], want, rtol=2e-5, atol=0)


@pytest.mark.gpu
def test_exp_and_exp2_flush_denormal_results_on_the_gpu():
    torch = pytest.importorskip("torch")
    x = _tiny_inputs()
    out = torch.full((256,), float("nan"), device="cuda")
    exp_and_exp2[(1,)](torch.from_numpy(x).cuda(), out, num_warps=4)
    got, want = out.cpu().numpy(), _flushed_powers(x)
    np.testing.assert_array_equal(got[:128] == 0, want == 0)
    np.testing.assert_allclose(got[:128], want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(got[128:][want > 2.0 ** -125], want[want > 2.0 ** -125], rtol=2e-5, atol=0)
