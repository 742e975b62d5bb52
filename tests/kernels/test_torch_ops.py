"""weft's kernels as torch operators (kernels/torch_ops.py) on CPU tensors, which run on the
emulator: gradients through autograd against float64, the fakes against the real
results, torch.compile(fullgraph=True) traces, and which calls go through the operators
at all. GPU versions: test_torch_ops_gpu.py."""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weft.kernels import _launch  # noqa: E402
from weft.kernels.attention import PingpongConfig, SimpleConfig, flash_attention, reference_attention  # noqa: E402
from weft.kernels.matmul import matmul  # noqa: E402
from weft.kernels.matmul.config import Config as MatmulConfig  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16


def _rel_err(x, ref) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def _leaf(shape, dtype=BF16, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).requires_grad_()


def test_importing_weft_and_numpy_calls_import_no_torch():
    code = ("import sys, numpy as np, weft, weft.kernels.matmul as mm, weft.kernels.attention as at; "
            "a = np.ones((16, 16), np.float16); mm.matmul(a, a); "
            "print(sorted(m for m in ('torch', 'weft.kernels.torch_ops') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_only_calls_autograd_or_a_trace_must_see_leave_the_host_path():
    x, y = torch.ones(4, 4), torch.ones(4, 4)
    route = _launch.torch_route
    assert route(x, y) is None  # plain tensors, no gradient: the host path's prepared launch
    assert route(x.numpy(), y.numpy()) is None and route(x, y.numpy()) is None
    w = y.clone().requires_grad_()
    assert route(x, w) == _launch.AUTOGRAD  # eager autograd: a Function around the host path
    with torch.no_grad():
        assert route(x, w) is None
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        assert route(*(mode.from_tensor(t) for t in (x, y))) == _launch.OPERATOR  # a subclass
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Watching():
        assert route(x, w) == _launch.OPERATOR


@pytest.mark.parametrize("grads, out_dtype", [((True, True), None), ((True, False), torch.float32),
                                              ((False, True), None)])
def test_matmul_gradients_match_float64(grads, out_dtype):
    """dA = dC B^T and dB = A^T dC by weft matmuls on the emulator, only for the inputs
    that require grad; an odd N (C's rows padded to 16 bytes) and a K-major b."""
    a = _leaf((40, 64), seed=1).requires_grad_(grads[0])
    bt = _leaf((20, 64), seed=2).requires_grad_(grads[1])
    b = bt.t()  # K-major: read in place
    dc = torch.randn(40, 20, generator=torch.Generator().manual_seed(3))
    c = matmul(a, b, out_dtype=out_dtype)
    assert c.dtype == (out_dtype or BF16) and c.requires_grad
    c.backward(dc.to(c.dtype))
    # The operator (what torch.compile sees) differentiates the same way.
    leaves = [x.detach().requires_grad_(g) for x, g in zip((a, bt), grads)]
    from weft.kernels import torch_ops

    c_op = torch_ops.matmul(leaves[0], leaves[1].t(), out_dtype, route=_launch.OPERATOR)
    c_op.backward(dc.to(c.dtype))
    assert torch.equal(c_op, c)
    for x, leaf in zip((a, bt), leaves):
        assert (x.grad is None and leaf.grad is None) or torch.equal(x.grad, leaf.grad)
    a64, b64 = (x.detach().double().requires_grad_(g) for x, g in zip((a, b), grads))
    (a64 @ b64).backward(dc.to(c.dtype).double())
    assert _rel_err(c, a64 @ b64) < 1e-2
    for x, x64, needed in ((a, a64, grads[0]), (bt, b64, grads[1])):
        if needed:
            assert x.grad.dtype == BF16
            assert _rel_err(x.grad.t() if x is bt else x.grad, x64.grad) < 2e-2
        else:
            assert x.grad is None


def test_fakes_give_the_real_shapes_strides_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from weft.kernels import torch_ops

    a, b = torch.randn(24, 64).to(BF16), torch.randn(64, 20).to(BF16)  # N = 20: rows padded to 24
    q, k = torch.randn(1, 40, 2, 64).to(FP16), torch.randn(1, 56, 1, 64).to(FP16)
    calls = [(torch.ops.weft.matmul, (a, b)), (torch.ops.weft.matmul, (a, b, torch.float32)),
             (torch.ops.weft.flash_attention, (q, k, k, True, -0.3, "bshd"))]
    with FakeTensorMode() as mode:
        fakes = [op(*(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args))
                 for op, args in calls]
    for (op, args), fake in zip(calls, fakes):
        real = op(*args)
        real, fake = ((r,) if isinstance(r, torch.Tensor) else r for r in (real, fake))
        assert [(r.shape, r.stride(), r.dtype) for r in real] == [(f.shape, f.stride(), f.dtype) for f in fake]
    assert fakes[0].stride() == (24, 1)
    out, lse = torch_ops.flash_attention(q, k, k, causal=True, softmax_scale=-0.3, return_lse=True,
                                         layout="bshd")
    ref_out, ref_lse = reference_attention(q, k, k, causal=True, softmax_scale=-0.3, return_lse=True,
                                           layout="bshd")
    assert np.abs(out.float().numpy() - ref_out).max() < 2e-2 and np.abs(lse.numpy() - ref_lse).max() < 1e-2


def test_a_config_crosses_the_operator_by_value():
    from weft.kernels import torch_ops

    config = MatmulConfig(block_k=64, stages=2, variant="pipelined")
    assert torch_ops._config((MatmulConfig,), torch_ops.config_text(config)) == config
    for attention in (PingpongConfig(head_dim=64, lazy_max=False), SimpleConfig(head_dim=64)):
        # One attention config type per kernel variant: the text says which.
        back = torch_ops._config(torch_ops.ATTENTION_CONFIGS, torch_ops.config_text(attention))
        assert back == attention and type(back) is type(attention)
    a = _leaf((16, 64))
    eye = torch.eye(64, dtype=BF16)
    c = matmul(a, eye, config=config)
    assert torch.equal(c, a.detach())
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: matmul(a, eye, config=config), fullgraph=True, backend="eager")
    assert torch.equal(compiled(a), a.detach())


def _attention_leaves(b, h, hk, s, sk, d, layout, seed):
    shape = (lambda heads, seq: (b, heads, seq, d)) if layout == "bhsd" else (lambda heads, seq: (b, seq, heads, d))
    return _leaf(shape(h, s), seed=seed), _leaf(shape(hk, sk), seed=seed + 1), _leaf(shape(hk, sk), seed=seed + 2)


@pytest.mark.parametrize("b, h, hk, s, sk, d, causal, scale, layout", [
    (1, 2, 1, 70, 90, 64, True, None, "bhsd"),  # GQA, tails, causal with seq_q != seq_k
    (1, 2, 2, 33, 33, 128, False, -0.2, "bshd"),  # negative scale, seq-major tensors
])
def test_attention_gradients_through_autograd_match_float64(b, h, hk, s, sk, d, causal, scale, layout):
    pytest.importorskip("weft.kernels.attention.backward_host")
    q, k, v = _attention_leaves(b, h, hk, s, sk, d, layout, seed=4)
    out, lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, layout=layout, return_lse=True)
    assert out.requires_grad and not lse.requires_grad  # the log-sum-exp is not differentiable
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(BF16)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _attention64(q64, k64, v64, causal, scale, layout)
    ref.backward(dout.double())
    assert _rel_err(out, ref) < 2e-2
    for x, x64 in ((q, q64), (k, k64), (v, v64)):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
        assert _rel_err(x.grad, x64.grad) < 3e-2


def _attention64(q, k, v, causal, scale, layout):
    """flash_attention in float64 torch ops, for autograd's reference gradients."""
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        rows, cols = s.shape[-2:]
        s = s.masked_fill(~torch.ones(rows, cols, dtype=torch.bool).tril(cols - rows), float("-inf"))
    out = torch.softmax(s, dim=-1) @ v
    return out.transpose(1, 2) if layout == "bshd" else out


class _TinyAttention(torch.nn.Module):
    """A projection to q, k and v by weft matmul, causal weft attention, a projection out."""

    def __init__(self, width=64, head_dim=64):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.qkv = torch.nn.Parameter((torch.randn(width, 3 * width, generator=g) / width ** 0.5).to(BF16))
        self.proj = torch.nn.Parameter((torch.randn(width, width, generator=g) / width ** 0.5).to(BF16))
        self.head_dim = head_dim

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = matmul(x.reshape(-1, width), self.qkv).reshape(batch, seq, 3, -1, self.head_dim).unbind(2)
        o = flash_attention(q, k, v, causal=True, layout="bshd")
        return matmul(o.reshape(-1, width), self.proj).float().square().mean()


def test_compile_fullgraph_traces_both_operators_without_running_a_kernel():
    from torch._dynamo.testing import CompileCounterWithBackend

    module, x = _TinyAttention(), torch.randn(1, 40, 64).to(BF16)
    counter = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(module, fullgraph=True, backend=counter)(x)
        eager = module(x)
    assert counter.frame_count == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count("weft.matmul.default") == 2 and targets.count("weft.flash_attention.default") == 1
    assert torch.equal(compiled, eager)


def test_compile_aot_eager_forward_and_backward_match_eager():
    pytest.importorskip("weft.kernels.attention.backward_host")
    module, x = _TinyAttention(), torch.randn(1, 40, 64).to(BF16)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    loss = compiled(x)
    loss.backward()
    grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    eager = module(x)
    eager.backward()
    assert torch.equal(loss, eager)
    for grad, p in zip(grads, module.parameters()):
        assert torch.equal(grad, p.grad)
    # ... and autograd's float64 gradients of the same model.
    params64 = [p.detach().double().requires_grad_() for p in module.parameters()]
    x64 = x.double().reshape(-1, 64)
    q, k, v = (x64 @ params64[0]).reshape(1, 40, 3, 1, 64).unbind(2)
    o = _attention64(q, k, v, True, None, "bshd")
    (o.reshape(-1, 64) @ params64[1]).square().mean().backward()
    for grad, p64 in zip(grads, params64):
        assert _rel_err(grad, p64.grad) < 5e-2


def test_eager_autograd_calls_repeat_the_prepared_launch(monkeypatch):
    """On (stubbed) CUDA tensors that require grad, the second call with the same
    signature skips the long way, as without autograd (tests/kernels/fake_gpu.py)."""
    from weft.kernels.matmul import host as matmul_host

    from .fake_gpu import fake_gpu

    long_ways = []
    original = matmul_host._kernel_call
    monkeypatch.setattr(matmul_host, "_kernel_call", lambda *a, **k: long_ways.append(1) or original(*a, **k))
    a, b = _leaf((80, 64), seed=6), torch.randn(64, 72).to(BF16)
    config = MatmulConfig(block_k=64, stages=3)  # the autotuner needs CUDA events
    with fake_gpu() as fake:
        results = [matmul(a, b, config=config) for _ in range(2)]
        assert len(long_ways) == 1 and len(fake.launches) == 2
        assert all(c.requires_grad and type(c.grad_fn).__name__ == "_EagerMatmulBackward" for c in results)
