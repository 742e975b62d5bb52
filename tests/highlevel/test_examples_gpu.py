"""The highlevel example kernels on the GPU against torch (float64 references)."""

import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import examples as high  # noqa: E402

pytestmark = pytest.mark.gpu


def relative_error(out, ref):
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(4096, 4096), (300, 777)])
def test_softmax_and_layer_norm(dtype, tolerance, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype) * 2
    w = torch.randn(shape[1], device="cuda", dtype=dtype)
    b = torch.randn(shape[1], device="cuda", dtype=dtype)
    assert relative_error(high.softmax(x), torch.softmax(x.double(), -1)) < tolerance
    reference = torch.nn.functional.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-5)
    assert relative_error(high.layer_norm(x, w, b, 1e-5), reference) < max(tolerance, 1e-5)


def test_add_argmax_transpose():
    x = torch.randn(1000, 1500, device="cuda")
    y = torch.randn(1000, 1500, device="cuda")
    assert torch.equal(high.add(x, y), x + y)
    assert torch.equal(high.argmax(x).long(), x.argmax(-1))
    assert torch.equal(high.transpose(x), x.t().contiguous())
