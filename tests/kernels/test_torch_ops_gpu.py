"""weft's torch operators on a GPU: gradients against float32 torch, torch.compile with
inductor, and a forward + backward captured in a CUDA graph and replayed on new inputs.
CPU versions: test_torch_ops.py."""

import pytest

torch = pytest.importorskip("torch")

from weft.kernels.attention import flash_attention  # noqa: E402
from weft.kernels.matmul import matmul  # noqa: E402

BF16 = torch.bfloat16
pytestmark = pytest.mark.gpu


def _rel_err(x, ref) -> float:
    x, ref = x.detach().float(), ref.detach().float()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def _attention32(q, k, v, causal, scale=None, layout="bhsd"):
    """flash_attention in float32 torch ops (bottom-right causal, GQA by repeated heads)."""
    q, k, v = (x.float() for x in (q, k, v))
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    mask = None
    if causal:
        rows, cols = q.shape[2], k.shape[2]
        mask = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril(cols - rows)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2) if layout == "bshd" else out


def _leaves(*shapes, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, device="cuda", generator=g).to(BF16).requires_grad_() for s in shapes]


def _float32_grads(fn, *tensors, dout):
    leaves = [t.detach().float().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(dout.float())
    return out, [t.grad for t in leaves]


@pytest.mark.parametrize("m, n, k", [(1024, 1024, 512), (300, 520, 200)])
def test_matmul_gradients_match_float32_torch(m, n, k):
    a, b = _leaves((m, k), (k, n), seed=1)
    dc = torch.randn(m, n, device="cuda").to(BF16)
    c = matmul(a, b)
    c.backward(dc)
    ref, (da, db) = _float32_grads(torch.matmul, a, b, dout=dc)
    assert _rel_err(c, ref) < 1e-2
    assert _rel_err(a.grad, da) < 2e-2 and _rel_err(b.grad, db) < 2e-2


def test_a_thread_without_a_driver_context_runs_weft():
    """A thread that has made only CUDA runtime calls has no current driver context (torch's
    autograd threads run a matmul's backward so); weft's first driver call there (encoding
    a new tensor map) once failed with CUDA_ERROR_INVALID_CONTEXT."""
    import threading

    a, b = (torch.randn(shape, device="cuda").to(BF16) for shape in ((272, 136), (136, 200)))  # new maps
    results = []

    def run():
        try:
            results.append(matmul(a, b))
        except Exception as error:  # reported in the main thread
            results.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    (out,) = results
    assert not isinstance(out, Exception), out
    assert _rel_err(out, a.float() @ b.float()) < 1e-2


@pytest.mark.parametrize("b, h, hk, s, sk, d, causal, layout", [
    (2, 8, 8, 1024, 1024, 128, True, "bhsd"),
    (1, 8, 2, 1000, 1100, 64, True, "bhsd"),  # GQA, tails, seq_q != seq_k
    (2, 4, 1, 513, 513, 256, False, "bshd"),  # MQA
])
def test_attention_gradients_match_float32_torch(b, h, hk, s, sk, d, causal, layout):
    pytest.importorskip("weft.kernels.attention.backward_host")
    shape = (lambda heads, seq: (b, heads, seq, d)) if layout == "bhsd" else (lambda heads, seq: (b, seq, heads, d))
    q, k, v = _leaves(shape(h, s), shape(hk, sk), shape(hk, sk), seed=2)
    out = flash_attention(q, k, v, causal=causal, layout=layout)
    dout = torch.randn(out.shape, device="cuda").to(BF16)
    out.backward(dout)
    ref, grads = _float32_grads(lambda q, k, v: _attention32(q, k, v, causal, layout=layout), q, k, v, dout=dout)
    assert _rel_err(out, ref) < 2e-2
    for x, grad in zip((q, k, v), grads):
        assert _rel_err(x.grad, grad) < 3e-2


class _Block(torch.nn.Module):
    """Projection to q, k, v (weft matmul), causal weft attention, projection out."""

    def __init__(self, width=512, head_dim=128, reference=False):
        super().__init__()
        g = torch.Generator(device="cuda").manual_seed(3)
        self.qkv = torch.nn.Parameter((torch.randn(width, 3 * width, device="cuda", generator=g) / width ** 0.5).to(BF16))
        self.proj = torch.nn.Parameter((torch.randn(width, width, device="cuda", generator=g) / width ** 0.5).to(BF16))
        self.head_dim, self.reference = head_dim, reference

    def forward(self, x):
        batch, seq, width = x.shape
        mm = (lambda a, b: a.float() @ b.float()) if self.reference else matmul
        q, k, v = mm(x.reshape(-1, width), self.qkv).reshape(batch, seq, 3, -1, self.head_dim).unbind(2)
        o = _attention32(q, k, v, True, layout="bshd") if self.reference else \
            flash_attention(q, k, v, causal=True, layout="bshd")
        return mm(o.reshape(-1, width), self.proj).float().square().mean()


def _reference_grads(block, x):
    reference = _Block(reference=True)
    reference.load_state_dict(block.state_dict())
    reference(x).backward()
    return [p.grad for p in reference.parameters()]


def test_compile_with_inductor_matches_float32_torch():
    pytest.importorskip("weft.kernels.attention.backward_host")
    block, x = _Block(), torch.randn(2, 1024, 512, device="cuda").to(BF16)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    for _ in range(2):  # the second call runs the compiled code alone
        block.zero_grad(set_to_none=True)
        loss = compiled(x)
        loss.backward()
    for p, grad in zip(block.parameters(), _reference_grads(block, x)):
        assert _rel_err(p.grad, grad) < 3e-2


def test_forward_and_backward_replay_in_a_cuda_graph():
    """Warm up on a side stream (compiles, autotunes), capture forward + backward, then
    replay on new inputs copied into the captured ones."""
    pytest.importorskip("weft.kernels.attention.backward_host")
    block = _Block()
    static_x = torch.randn(2, 1024, 512, device="cuda").to(BF16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            block.zero_grad(set_to_none=True)
            block(static_x).backward()
    torch.cuda.current_stream().wait_stream(side)
    block.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = block(static_x)
        static_loss.backward()
    for seed in (4, 5):
        x = torch.randn(2, 1024, 512, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
        static_x.copy_(x.to(BF16))
        graph.replay()
        torch.cuda.synchronize()
        for p, grad in zip(block.parameters(), _reference_grads(block, static_x)):
            assert _rel_err(p.grad, grad) < 3e-2
        reference = _Block(reference=True)
        reference.load_state_dict(block.state_dict())
        assert _rel_err(static_loss, reference(static_x)) < 2e-2


def test_compile_reduce_overhead_replays_cuda_graphs():
    """torch.compile's CUDA graph trees around the operators: forward and backward."""
    pytest.importorskip("weft.kernels.attention.backward_host")
    block, x = _Block(), torch.randn(1, 512, 512, device="cuda").to(BF16)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up runs, then recorded, then replayed
        block.zero_grad(set_to_none=True)
        compiled(x).backward()
    for p, grad in zip(block.parameters(), _reference_grads(block, x)):
        assert _rel_err(p.grad, grad) < 3e-2
