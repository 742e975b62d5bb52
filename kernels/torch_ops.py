"""weft's kernels as torch operators, so that autograd, torch.compile and CUDA graphs see
them: `weft::matmul`, `weft::flash_attention` (returning O and the log-sum-exp) and
`weft::flash_attention_backward`, registered with torch.library.custom_op.

Each operator has a fake: the shapes, strides and dtypes of its results, from the same
checks the host path makes, so `torch.compile(fullgraph=True)` traces a model that calls
them without running a kernel. Their real implementations call the host path
(`host_matmul`, `host_flash_attention`: the prepared launch on CUDA tensors, the emulator
on CPU tensors), which launches on torch's current stream and allocates through torch,
so the calls can be captured in a CUDA graph once they have run outside one (the first
call of a shape compiles and autotunes, which capture forbids).

Gradients: dA = dC B^T and dB = A^T dC by weft matmuls; attention's by
weft.kernels.attention.backward_host.flash_attention_backward from the saved q, k, v, O
and log-sum-exp (the log-sum-exp is not differentiable, as in FlashAttention).

The wrappers import this module the first time a torch call needs it, and
kernels/_launch.torch_route says which way each call goes: the operators in a
torch.compile trace or a dispatch mode, in eager autograd a torch.autograd.Function
with the same setup and backward around the host path (the operator's dispatch and
torch's generic autograd wrapper cost several times its Python). Importing weft never
imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import torch

from ._launch import OPERATOR, keeping_no_tensors, torch_route
from .attention import host as attention_host
from .attention.config import SimpleConfig
from .attention.pingpong_config import PingpongConfig
from .matmul import host as matmul_host
from .matmul.config import Config as MatmulConfig

# A kernel Config crosses the operator boundary as JSON text (an operator's arguments are
# tensors, numbers, strings and dtypes): the graph torch.compile keeps names it by value.
# The text names the config's type too: attention has one per kernel variant.
ATTENTION_CONFIGS = (PingpongConfig, SimpleConfig)


@torch.compiler.assume_constant_result  # a trace keeps the text, not the json calls
def config_text(config) -> str | None:
    return None if config is None else _config_text(config)


@functools.lru_cache(maxsize=64)  # configs are frozen: a repeated call pays a dict lookup
def _config_text(config) -> str:
    return json.dumps([type(config).__name__, dataclasses.asdict(config)], sort_keys=True)


@functools.lru_cache(maxsize=64)
def _config(kinds: tuple, text: str | None):
    """The config `config_text` wrote, of the one of `kinds` it names."""
    if text is None:
        return None
    name, fields = json.loads(text)
    return next(kind for kind in kinds if kind.__name__ == name)(**fields)


# ----------------------------------------------------------------------------- matmul

@torch.library.custom_op("weft::matmul", mutates_args=())
def matmul_op(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None,
              config: str | None = None) -> torch.Tensor:
    with keeping_no_tensors():
        return matmul_host.host_matmul(a, b, out_dtype, config=_config((MatmulConfig,), config))


@matmul_op.register_fake
def _matmul_fake(a, b, out_dtype=None, config=None):
    shape, strides, dtype = matmul_host.output_layout(a, b, out_dtype)
    return a.new_empty_strided(shape, strides, dtype=dtype)


def _matmul_setup(ctx, inputs, output):
    a, b, _, _ = inputs
    needs_a, needs_b = ctx.needs_input_grad[:2]
    ctx.save_for_backward(a if needs_b else None, b if needs_a else None)
    ctx.input_dtype = a.dtype


def _matmul_backward(ctx, dc):
    a, b = ctx.saved_tensors
    if ctx.input_dtype.itemsize == 1:
        raise NotImplementedError("weft matmul has no backward for fp8 inputs; call it on tensors that do "
                                  "not require grad (e.g. a.detach()) or use bf16/fp16")
    dc = dc.to(ctx.input_dtype)  # an fp32 out_dtype: the gradient in the inputs' precision
    # Through the public matmul: a compiled backward sees the operator, an eager one (no
    # grad mode there) takes the prepared launch without the operator's dispatch.
    da = matmul_host.matmul(dc, b.t()) if b is not None else None  # b.t(): a K-major b, read in place
    db = matmul_host.matmul(a.t().contiguous(), dc) if a is not None else None
    return da, db, None, None


matmul_op.register_autograd(_matmul_backward, setup_context=_matmul_setup)


class _EagerMatmul(torch.autograd.Function):
    """weft::matmul's autograd around the host path, for eager calls (`torch_route`).
    forward takes ctx itself: with a separate setup_context, Function.apply binds its
    arguments with inspect.signature on every call, which costs more than the launch."""

    @staticmethod
    def forward(ctx, a, b, out_dtype, config):
        c = matmul_host.host_matmul(a, b, out_dtype, config=config)
        _matmul_setup(ctx, (a, b, out_dtype, config), c)
        return c

    backward = staticmethod(_matmul_backward)


def matmul(a, b, out_dtype=None, config=None, route=OPERATOR):
    """weft.kernels.matmul.matmul on torch tensors, by `route` (kernels/_launch.torch_route)."""
    if route == OPERATOR:
        return _MATMUL(a, b, out_dtype, config_text(config))
    return _EAGER_MATMUL(a, b, out_dtype, config)


# ----------------------------------------------------------------------------- attention

@torch.library.custom_op("weft::flash_attention", mutates_args=())
def flash_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       softmax_scale: float | None = None, layout: str = "bhsd",
                       config: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    with keeping_no_tensors():
        return attention_host.host_flash_attention(q, k, v, causal, softmax_scale, True, layout,
                                                   config=_config(ATTENTION_CONFIGS, config))


@flash_attention_op.register_fake
def _flash_attention_fake(q, k, v, causal=False, softmax_scale=None, layout="bhsd", config=None):
    out_shape, lse_shape = attention_host.output_shapes(q, k, v, layout)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, softmax_scale, layout, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (causal, softmax_scale, layout)
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, *ctx.options)
    needs = ctx.needs_input_grad
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None, None, None, None, None)


flash_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


@torch.library.custom_op("weft::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                                lse: torch.Tensor, dout: torch.Tensor, causal: bool = False,
                                softmax_scale: float | None = None,
                                layout: str = "bhsd") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with keeping_no_tensors():
        return _host_attention_backward(q, k, v, out, lse, dout, causal, softmax_scale, layout)


@flash_attention_backward_op.register_fake
def _flash_attention_backward_fake(q, k, v, out, lse, dout, causal=False, softmax_scale=None, layout="bhsd"):
    attention_host.output_shapes(q, k, v, layout)  # the forward's checks
    return tuple(x.new_empty(x.shape) for x in (q, k, v))


def flash_attention_backward(q, k, v, out, lse, dout, causal, softmax_scale, layout):
    """(dq, dk, dv) through weft::flash_attention_backward where a trace or a dispatch mode
    must see it, else (an eager backward) by the host directly."""
    if torch_route(q, k, v, out, lse, dout) == OPERATOR:
        return _ATTENTION_BACKWARD(q, k, v, out, lse, dout, causal, softmax_scale, layout)
    return _host_attention_backward(q, k, v, out, lse, dout, causal, softmax_scale, layout)


def _host_attention_backward(q, k, v, out, lse, dout, causal, softmax_scale, layout):
    from .attention.backward_host import flash_attention_backward as host_backward

    grads = host_backward(q, k, v, out, lse, dout, causal=causal, softmax_scale=softmax_scale, layout=layout)
    # As the fake says: contiguous, in the inputs' shapes and dtypes.
    return tuple(g.to(x.dtype).contiguous() for g, x in zip(grads, (q, k, v)))


class _EagerFlashAttention(torch.autograd.Function):
    """weft::flash_attention's autograd around the host path, for eager calls
    (`torch_route`)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, layout, config):  # ctx: as _EagerMatmul's
        result = attention_host.host_flash_attention(q, k, v, causal, softmax_scale, True, layout, config=config)
        _attention_setup(ctx, (q, k, v, causal, softmax_scale, layout, config), result)
        return result

    backward = staticmethod(_attention_backward)


def flash_attention(q, k, v, causal=False, softmax_scale=None, return_lse=False, layout="bhsd", config=None,
                    route=OPERATOR):
    """weft.kernels.attention.flash_attention on torch tensors, by `route`
    (kernels/_launch.torch_route)."""
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    if route == OPERATOR:
        out, lse = _ATTENTION(q, k, v, bool(causal), softmax_scale, layout, config_text(config))
    else:
        out, lse = _EAGER_ATTENTION(q, k, v, bool(causal), softmax_scale, layout, config)
    return (out, lse) if return_lse else out


# The operators' overloads, called directly: one Python layer less than the CustomOpDef.
_MATMUL = torch.ops.weft.matmul.default
_ATTENTION = torch.ops.weft.flash_attention.default
_ATTENTION_BACKWARD = torch.ops.weft.flash_attention_backward.default


def _function_apply(function):
    """`function.apply` without its Python layer: torch.autograd.Function.apply binds
    default arguments (only with a setup_context, which these Functions leave out) and
    unwraps the dead functorch wrappers of its arguments (only under a functorch
    transform, which the AUTOGRAD route excludes: `torch_route`) before calling the C
    apply this returns, which records the graph node."""
    return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)


_EAGER_MATMUL = _function_apply(_EagerMatmul)
_EAGER_ATTENTION = _function_apply(_EagerFlashAttention)
