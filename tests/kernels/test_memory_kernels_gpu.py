"""The issue-3 kernels on the GPU against torch (float64 references), random inputs."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from weft.kernels import convert, layer_norm, softmax, transpose, vector_add  # noqa: E402
from weft.layouts.strategies import distributed_layouts  # noqa: E402

pytestmark = pytest.mark.gpu


def relative_error(out, ref):
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def poisoned_like(x):
    return torch.full_like(x, float("nan"))


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("shape", [(4096, 4096), (1000, 1000), (64, 17), (8, 32768)])
def test_softmax_matches_torch(dtype, tolerance, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    assert relative_error(softmax.softmax(x), torch.softmax(x.double(), -1)) < tolerance


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(4096, 4096), (300, 777)])
def test_layer_norm_matches_torch(dtype, tolerance, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(shape[1], device="cuda", dtype=dtype)
    b = torch.randn(shape[1], device="cuda", dtype=dtype)
    y, mean, rstd = layer_norm.layer_norm(x, w, b, 1e-5, return_stats=True)
    ref = torch.nn.functional.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-5)
    assert relative_error(y, ref) < tolerance
    assert relative_error(mean, x.double().mean(-1)) < 1e-5


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(4096, 4096), (300, 777)])
def test_softmax_with_cache_hints_matches_torch(dtype, tolerance, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    base = softmax.Config.for_row(shape[1], 32 if dtype == torch.float32 else 16)
    config = dataclasses.replace(base, row_eviction="evict_first", out_cache=".cs")
    assert relative_error(softmax.softmax(x, config), torch.softmax(x.double(), -1)) < tolerance


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("options", [{"out_cache": ".cs", "row_eviction": "evict_first"},
                                     {"out_cache": ".cg", "weight_eviction": "evict_last"}])
@pytest.mark.parametrize("shape", [(4096, 4096), (300, 777)])
def test_layer_norm_cache_hint_variants_match_torch(dtype, tolerance, shape, options):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(shape[1], device="cuda", dtype=dtype)
    b = torch.randn(shape[1], device="cuda", dtype=dtype)
    base = layer_norm.Config.for_row(shape[1], 32 if dtype == torch.float32 else 16)
    config = dataclasses.replace(base, **options)
    y, mean, rstd = layer_norm.layer_norm(x, w, b, 1e-5, return_stats=True, config=config)
    ref = torch.nn.functional.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-5)
    assert relative_error(y, ref) < tolerance
    assert relative_error(mean, x.double().mean(-1)) < 1e-5
    assert relative_error(rstd, torch.rsqrt(x.double().var(-1, unbiased=False) + 1e-5)) < 1e-4


RING_CASES = [((4096, 4096), 4, 4), ((4096, 4096), 8, 2), ((1000, 1000), 4, 2), ((7, 2048), 2, 1),
              ((20000, 512), 1, 8), ((300, 8192), 16, 2)]


def _ring_config(module, n_cols, dtype, warps, stages, **extra):
    base = softmax.Config.for_row(n_cols, 32 if dtype == torch.float32 else 16)
    make = layer_norm.Config if module is layer_norm else softmax.Config
    return make(base.block, warps, base.vector, 0, stages, **extra)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape, warps, stages", RING_CASES)
def test_softmax_through_a_shared_memory_ring_matches_torch(dtype, tolerance, shape, warps, stages):
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    config = _ring_config(softmax, shape[1], dtype, warps, stages)
    assert relative_error(softmax.softmax(x, config), torch.softmax(x.double(), -1)) < tolerance


@pytest.mark.parametrize("hold", [False, True])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape, warps, stages", RING_CASES)
def test_layer_norm_through_a_shared_memory_ring_matches_torch(dtype, tolerance, shape, warps, stages, hold):
    x = torch.randn(shape, device="cuda", dtype=dtype) + 3
    w = torch.randn(shape[1], device="cuda", dtype=dtype)
    b = torch.randn(shape[1], device="cuda", dtype=dtype)
    config = _ring_config(layer_norm, shape[1], dtype, warps, stages, hold_weights=hold)
    y, mean, rstd = layer_norm.layer_norm(x, w, b, 1e-5, return_stats=True, config=config)
    ref = torch.nn.functional.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-5)
    assert relative_error(y, ref) < tolerance
    assert relative_error(mean, x.double().mean(-1)) < 1e-5
    assert relative_error(rstd, 1 / (x.double().var(-1, unbiased=False) + 1e-5).sqrt()) < 1e-5


def test_ring_rows_of_a_strided_view_and_rows_it_cannot_take():
    base = torch.randn(333, 1024, device="cuda") * 3
    view = base[:, :1000]  # rows 4096 bytes apart, 4000 bytes long: a ring takes them
    config = _ring_config(softmax, 1000, torch.float32, 4, 2)
    assert relative_error(softmax.softmax(view, config), torch.softmax(view.double(), -1)) < 1e-6
    odd = base[:, :999]  # 3996 bytes: the bulk copy cannot; the register kernel runs
    assert relative_error(softmax.softmax(odd, config), torch.softmax(odd.double(), -1)) < 1e-6


@pytest.mark.parametrize("n", [1, 1000, 1 << 24, (1 << 20) + 3])
def test_vector_add_matches_torch(n):
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = poisoned_like(x)
    vector_add.add(x, y, out=out)
    assert torch.equal(out, x + y)


@pytest.mark.parametrize("shape, dtype", [((4096, 4096), torch.float32), ((1000, 3000), torch.bfloat16),
                                          ((33, 65), torch.int8)])
def test_transpose_matches_torch(shape, dtype):
    x = (torch.randn(shape, device="cuda") * 50).to(dtype)
    assert torch.equal(transpose.transpose(x), x.t().contiguous())


@st.composite
def layout_pairs(draw):
    rows = draw(st.sampled_from([1, 4, 16, 32, 64, 128]))
    cols = draw(st.sampled_from([1, 8, 32, 64, 128]))
    warps = draw(st.sampled_from([1, 2, 4, 8]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.int8]))
    return (draw(distributed_layouts(shape=(rows, cols), num_warps=warps)),
            draw(distributed_layouts(shape=(rows, cols), num_warps=warps)), dtype)


@settings(max_examples=200, deadline=None, database=None)
@given(layout_pairs())
def test_conversion_kernel_on_random_layout_pairs(pair):
    src, dst, dtype = pair
    shape = tuple(src.out_dims.values())
    x = (torch.randn(shape, device="cuda") * 100).to(dtype)
    assert torch.equal(convert.convert(x, src, dst), x)
