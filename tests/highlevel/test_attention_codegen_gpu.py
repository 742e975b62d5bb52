"""The attention example's forward and backward on the GPU against float64, at the
benchmark's configs (benchmarks/highlevel_attention.py; the tutorial backward's launch),
causal and not, with tails: what the emulator cannot check of test_attention_codegen.py's
changes (descriptors from a shfl'd warp index, built at each wgmma; no proxy fence inside
loops that write shared memory by cp.async only; the launch option sink_waits)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import attention_backward_example, attention_example  # noqa: E402
from weft.kernels.attention import reference_attention_backward  # noqa: E402

from .test_attention_backward_source import forward  # noqa: E402
from .test_attention_example import reference  # noqa: E402

pytestmark = pytest.mark.gpu


def _inputs(seed, n_ctx, head_dim, count):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [(0.5 * torch.randn(2, 3, n_ctx, head_dim, device="cuda", generator=gen)).half() for _ in range(count)]


@pytest.mark.parametrize("head_dim,block,num_warps,stages", [(64, (128, 64), 8, 3), (64, (128, 128), 8, 3),
                                                             (64, (128, 64), 4, 4), (128, (128, 64), 8, 3),
                                                             (128, (128, 128), 8, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_ctx", [1024, 1000])
def test_forward_matches_float64(head_dim, block, num_warps, stages, causal, n_ctx):
    q, k, v = _inputs(11, n_ctx, head_dim, 3)
    out, lse = attention_example.attention(q, k, v, causal, block=block, num_warps=num_warps, num_stages=stages)
    expected, expected_lse = reference(*(x.cpu().numpy() for x in (q, k, v)), causal, head_dim ** -0.5)
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse.cpu().numpy(), expected_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_float64(causal, sink):
    seq, head_dim = 1024, 64
    q, k, v, do = _inputs(12, seq, head_dim, 4)
    scale = head_dim ** -0.5
    host = [x.cpu().numpy() for x in (q, k, v, do)]
    out, lse = forward(*host[:3], causal, scale)
    grads = attention_backward_example.attention_backward(q, k, v, torch.from_numpy(out).cuda(),
                                                          torch.from_numpy(lse).cuda(), do, causal,
                                                          sink_waits=sink)
    for name, got, expected in zip(("dq", "dk", "dv"), grads,
                                   reference_attention_backward(*host[:3], host[3], causal, scale)):
        np.testing.assert_allclose(got.double().cpu().numpy(), expected, atol=4e-3 * np.abs(expected).max(),
                                   rtol=0, err_msg=name)
