"""Float32 torch references and random CUDA inputs for the attention GPU tests
(test_attention_gpu.py, test_attention_backward_gpu.py), with flash_attention's
conventions: a bottom-right causal mask, GQA/MQA by repeating K and V over each group of
query heads, and a row that sees no key giving zeros (and log-sum-exp inf)."""


def random_attention_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, dtype, generator,
                            with_output_grad=False):
    """(q, k, v), and dO after them when `with_output_grad`: standard normal CUDA tensors
    in `layout` ("bhsd": [batch, heads, seq, head_dim]; "bshd": [batch, seq, heads, head_dim])."""
    import torch

    def make(h, s):
        shape = (batch, h, s, head_dim) if layout == "bhsd" else (batch, s, h, head_dim)
        return torch.randn(shape, device="cuda", dtype=dtype, generator=generator)

    sizes = [(heads, seq_q), (kv_heads, seq_k), (kv_heads, seq_k)] + [(heads, seq_q)] * with_output_grad
    return tuple(make(h, s) for h, s in sizes)


def torch_attention(q, k, v, causal, scale, layout):
    """(out in `layout`, lse [batch, heads, seq_q]) in float32: softmax(scale q k^T) v,
    differentiable in q, k and v (a row that sees no key takes no NaN into the gradients)."""
    import torch

    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    q, k, v = (x.float() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    seq_q, seq_k = q.shape[2], k.shape[2]
    visible = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal:
        visible = (torch.arange(seq_k, device=q.device)[None, :]
                   <= torch.arange(seq_q, device=q.device)[:, None] + (seq_k - seq_q))
    s = s.masked_fill(~visible, float("-inf"))
    seen = visible.any(dim=1)[:, None]
    p = torch.softmax(s.masked_fill(~seen, 0.0), dim=-1) * seen
    out = p @ v
    lse = torch.logsumexp(s, dim=-1)
    lse = torch.where(torch.isinf(lse), float("inf"), lse)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return out, lse


def torch_gradients(q, k, v, do, causal, scale, layout):
    """(dq, dk, dv) in float32, in `layout`, by torch autograd of `torch_attention`."""
    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    out, _ = torch_attention(q, k, v, causal, scale, layout)
    (out * do.float()).sum().backward()
    return q.grad, k.grad, v.grad
