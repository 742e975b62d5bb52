"""The issue-3 kernels on the GPU against torch (float64 references), random inputs."""

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
