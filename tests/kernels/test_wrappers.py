"""Every public kernel wrapper over the inputs a new user passes: strided views, transposed
views, zero-size arrays, Python lists and arrays on two devices.

Each wrapper is one `Wrapper` row: how to draw its inputs, how to call it, its float64
numpy reference. Values are checked on the CPU emulator for numpy arrays and, where torch
is installed, for CPU torch tensors; the `gpu` cases run torch CUDA tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from weft.kernels import convert, layer_norm, softmax, transpose, vector_add
from weft.kernels.attention import flash_attention, reference_attention
from weft.kernels.matmul import matmul, reference_matmul
from weft.layouts.standard import blocked

try:
    import torch
except ImportError:
    torch = None

RNG = np.random.default_rng(38)
CONVERT_SRC = blocked([8, 16], [1, 2], [8, 4], [1, 1], [1, 0])
CONVERT_DST = blocked([8, 16], [2, 1], [4, 8], [1, 1], [0, 1])


@dataclass(frozen=True)
class Wrapper:
    name: str
    shapes: tuple           # the input shapes of one call
    dtype: type
    call: Callable          # (*inputs) -> output
    reference: Callable     # (*float64 inputs) -> float64 output
    tolerance: float
    empty_shapes: tuple = ()  # input shapes with a zero dim, each with a result

    def __str__(self):
        return self.name


def _attention(causal: bool, scale=None):
    return dict(call=lambda q, k, v: flash_attention(q, k, v, causal=causal, softmax_scale=scale),
                reference=lambda q, k, v: reference_attention(q, k, v, causal=causal, softmax_scale=scale))


def _float32_like(a):
    return torch.float32 if torch is not None and isinstance(a, torch.Tensor) else np.float32


WRAPPERS = [
    Wrapper("vector_add", ((6, 40), (6, 40)), np.float32, vector_add.add, lambda x, y: x + y, 1e-6,
            empty_shapes=(((0,), (0,)), ((3, 0), (3, 0)))),
    Wrapper("softmax", ((5, 48),), np.float32, softmax.softmax,
            lambda x: softmax.reference(x) if x.size else x, 1e-5,
            empty_shapes=(((0, 8),), ((3, 0),))),
    Wrapper("layer_norm", ((5, 48), (48,), (48,)), np.float32, layer_norm.layer_norm,
            lambda x, w, b: layer_norm.reference(x, w, b, 1e-5)[0], 1e-4,
            empty_shapes=(((0, 8), (8,), (8,)), ((3, 0), (0,), (0,)))),
    Wrapper("transpose", ((20, 36),), np.float32, transpose.transpose, lambda x: x.T, 0,
            empty_shapes=(((0, 5),), ((5, 0),))),
    Wrapper("convert", ((8, 16),), np.float32, lambda x: convert.convert(x, CONVERT_SRC, CONVERT_DST),
            lambda x: x, 0),
    Wrapper("matmul", ((24, 40), (40, 16)), np.float16, lambda a, b: matmul(a, b, _float32_like(a)), lambda a, b: a @ b,
            2e-3, empty_shapes=(((0, 16), (16, 8)), ((8, 16), (16, 0)), ((8, 0), (0, 16)))),
    Wrapper("flash_attention", ((1, 2, 20, 64), (1, 1, 24, 64), (1, 1, 24, 64)), np.float16,
            **_attention(causal=True), tolerance=4e-3,
            empty_shapes=(((1, 2, 0, 64), (1, 1, 8, 64), (1, 1, 8, 64)),
                          ((1, 2, 8, 64), (1, 1, 0, 64), (1, 1, 0, 64)),
                          ((0, 2, 8, 64), (0, 1, 8, 64), (0, 1, 8, 64)))),
]


def _values(shape, dtype):
    return (RNG.standard_normal(shape) * 2).astype(dtype)


def strided(shape, dtype):
    """Random values of `shape` as every other element of a larger array along every dim."""
    return _values(tuple(2 * s for s in shape), dtype)[tuple(slice(None, None, 2) for _ in shape)]


def sliced(shape, dtype):
    """Random values of `shape` as a slice of an array one longer in every dim: rows keep
    their stride but are 1 element longer (not 16-byte aligned), and start 1 row and
    column in."""
    return _values(tuple(s + 1 for s in shape), dtype)[tuple(slice(1, None) for _ in shape)]


def transposed(shape, dtype):
    """Random values of `shape` whose last two dims are swapped in memory (x.T for 2-D)."""
    if len(shape) == 1:
        return strided(shape, dtype)[::-1]  # 1-D has no transpose: a negative stride instead
    swapped = shape[:-2] + (shape[-1], shape[-2])
    return np.swapaxes(_values(swapped, dtype), -1, -2)


def check(wrapper, inputs, as_array=lambda x: x):
    got = wrapper.call(*(as_array(x) for x in inputs))
    got = got.numpy() if torch is not None and isinstance(got, torch.Tensor) else got
    assert isinstance(got, np.ndarray)
    want = wrapper.reference(*(np.asarray(x, dtype=np.float64) for x in inputs))
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=wrapper.tolerance,
                               atol=wrapper.tolerance)


def _torch_cpu(x):
    # from_numpy keeps the view's strides; negative strides have no torch view, so those
    # become a copy (contiguous), which other cases cover.
    return torch.from_numpy(x) if all(s >= 0 for s in x.strides) else torch.from_numpy(x.copy())


LIBRARIES = ["numpy", pytest.param("torch", marks=pytest.mark.skipif(torch is None, reason="torch not installed"))]


def _as(library):
    return (lambda x: x) if library == "numpy" else _torch_cpu


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_strided_inputs(wrapper, library):
    check(wrapper, [strided(s, wrapper.dtype) for s in wrapper.shapes], _as(library))


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_sliced_inputs(wrapper, library):
    check(wrapper, [sliced(s, wrapper.dtype) for s in wrapper.shapes], _as(library))


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_transposed_inputs(wrapper, library):
    check(wrapper, [transposed(s, wrapper.dtype) for s in wrapper.shapes], _as(library))


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_contiguous_inputs(wrapper):
    check(wrapper, [_values(s, wrapper.dtype) for s in wrapper.shapes])


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value")  # numpy's mean of no columns
@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("wrapper", [w for w in WRAPPERS if w.empty_shapes], ids=str)
def test_zero_size_inputs(wrapper, library):
    for shapes in wrapper.empty_shapes:
        check(wrapper, [_values(s, wrapper.dtype) for s in shapes], _as(library))


def test_zero_size_convert_names_the_layouts():
    with pytest.raises(ValueError, match="layouts cover"):
        convert.convert(np.zeros((0, 16), np.float32), CONVERT_SRC, CONVERT_DST)


def test_empty_layer_norm_statistics_are_nan():
    x = np.zeros((3, 0), np.float32)
    y, mean, rstd = layer_norm.layer_norm(x, x[0], x[0], return_stats=True)
    assert y.shape == (3, 0) and np.isnan(mean).all() and np.isnan(rstd).all()


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_python_lists_are_refused_naming_what_to_pass(wrapper):
    inputs = [_values(s, wrapper.dtype) for s in wrapper.shapes]
    with pytest.raises(TypeError, match=r"numpy arrays .* or torch tensors.*np\.asarray"):
        wrapper.call(inputs[0].tolist(), *inputs[1:])
    if len(inputs) > 1:
        with pytest.raises(TypeError, match="numpy arrays"):
            wrapper.call(*inputs[:-1], inputs[-1].tolist())


class FakeCudaArray:
    """A CUDA array as another library shows one (its memory is never touched: the wrapper
    must refuse it before any launch)."""

    def __init__(self, like: np.ndarray):
        self.shape, self.dtype = like.shape, like.dtype
        self.__cuda_array_interface__ = dict(shape=like.shape, typestr=like.dtype.str, data=(1 << 40, False),
                                             version=3, strides=None)


@pytest.mark.parametrize("wrapper", [w for w in WRAPPERS if len(w.shapes) > 1], ids=str)
def test_host_and_cuda_arrays_mixed_are_refused(wrapper):
    inputs = [_values(s, wrapper.dtype) for s in wrapper.shapes]
    with pytest.raises(ValueError, match="one device.*numpy array.*CUDA memory.*cuda\\(\\)"):
        wrapper.call(*inputs[:-1], FakeCudaArray(inputs[-1]))


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_other_cuda_arrays_say_to_pass_torch_tensors(wrapper):
    inputs = [FakeCudaArray(_values(s, wrapper.dtype)) for s in wrapper.shapes]
    with pytest.raises(TypeError, match="torch CUDA tensors"):
        wrapper.call(*inputs)


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("wrapper", [w for w in WRAPPERS if len(w.shapes) > 1], ids=str)
def test_torch_tensors_on_two_devices_are_refused(wrapper):
    """A CPU tensor beside one on another device (`meta`: no GPU needed to make one)."""
    inputs = [torch.from_numpy(_values(s, wrapper.dtype)) for s in wrapper.shapes]
    inputs[-1] = inputs[-1].to("meta")
    with pytest.raises(ValueError, match="one device.*cpu.*meta"):
        wrapper.call(*inputs)


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_torch_tensors_off_cuda_and_host_are_refused(wrapper):
    inputs = [torch.from_numpy(_values(s, wrapper.dtype)).to("meta") for s in wrapper.shapes]
    with pytest.raises(ValueError, match="runs on CUDA tensors .* or host arrays .* got tensors on meta"):
        wrapper.call(*inputs)


# ------------------------------------------------------------------ vector_add's `out`

@pytest.mark.parametrize("library", LIBRARIES)
def test_vector_add_writes_a_strided_out_in_place(library):
    x, y = strided((6, 40), np.float32), transposed((6, 40), np.float32)
    out = np.full((12, 80), 7.0, np.float32)
    as_array = _as(library)
    target = as_array(out)[::2, 1::2]
    result = vector_add.add(as_array(x), as_array(y), out=target)
    assert result is target
    np.testing.assert_allclose(out[::2, 1::2], x + y, rtol=1e-6)
    assert (out[1::2] == 7).all() and (out[::2, ::2] == 7).all()  # nothing else written


def test_vector_add_refuses_an_out_of_another_shape():
    x = _values((8,), np.float32)
    with pytest.raises(ValueError, match=r"out has shape \(4,\)"):
        vector_add.add(x, x, out=np.empty(4, np.float32))


# ------------------------------------------------------------------ attention's softmax_scale

@pytest.mark.parametrize("variant", ["fa3", "simple"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [-0.125, -1.0, 0.0, 0.3])
def test_attention_for_any_finite_scale(scale, causal, variant):
    from weft.kernels.attention import SimpleConfig

    q, k, v = (_values(s, np.float16) for s in ((1, 2, 20, 64), (1, 1, 24, 64), (1, 1, 24, 64)))
    config = SimpleConfig(head_dim=64) if variant == "simple" else None
    out, lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, config=config)
    want, want_lse = reference_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)


def test_attention_at_scale_zero_averages_the_visible_values():
    q, k, v = (_values(s, np.float16) for s in ((1, 1, 6, 64), (1, 1, 8, 64), (1, 1, 8, 64)))
    values = v[0, 0].astype(np.float64)
    out = flash_attention(q, k, v, softmax_scale=0.0)
    np.testing.assert_allclose(out[0, 0], np.broadcast_to(values.mean(0), (6, 64)), rtol=2e-3, atol=2e-3)
    causal = flash_attention(q, k, v, causal=True, softmax_scale=0.0)
    # Query i sees keys 0 .. i + 2 (bottom-right alignment, 8 keys for 6 queries).
    expected = np.stack([values[:i + 3].mean(0) for i in range(6)])
    np.testing.assert_allclose(causal[0, 0], expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_attention_refuses_a_scale_that_is_not_finite(scale):
    q = np.zeros((1, 1, 8, 64), np.float16)
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        flash_attention(q, q, q, softmax_scale=scale)


# ------------------------------------------------------------------ torch CUDA, on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("make", [strided, sliced, transposed], ids=["strided", "sliced", "transposed"])
@pytest.mark.parametrize("wrapper", WRAPPERS, ids=str)
def test_gpu_torch_strided_inputs(wrapper, make):
    torch_ = pytest.importorskip("torch")
    inputs = [make(s, wrapper.dtype) for s in wrapper.shapes]
    got = wrapper.call(*(_cuda_view(torch_, x) for x in inputs))
    want = wrapper.reference(*(x.astype(np.float64) for x in inputs))
    np.testing.assert_allclose(got.float().cpu().numpy(), want, rtol=wrapper.tolerance, atol=wrapper.tolerance)


def _cuda_view(torch_, x: np.ndarray):
    """x's values on the GPU with x's strides: a view into a larger CUDA buffer (torch has
    no negative strides: such an x comes as a contiguous tensor)."""
    strides = tuple(s // x.itemsize for s in x.strides)
    values = torch_.from_numpy(np.ascontiguousarray(x)).cuda()
    if any(s < 0 for s in strides):
        return values
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, strides))
    view = torch_.zeros(span, dtype=values.dtype, device="cuda").as_strided(x.shape, strides)
    view.copy_(values)
    return view


@pytest.mark.gpu
def test_gpu_torch_cpu_and_cuda_mixed_are_refused():
    torch_ = pytest.importorskip("torch")
    x = torch_.randn(8, 64)
    with pytest.raises(ValueError, match="one device.*cpu.*cuda:0"):
        vector_add.add(x, x.cuda())
    with pytest.raises(ValueError, match="one device"):
        layer_norm.layer_norm(x.cuda(), torch_.ones(64), torch_.zeros(64, device="cuda"))
