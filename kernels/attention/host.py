"""The host side of flash attention: checks with readable errors, TMA descriptors, the
launch, and the float64 numpy reference."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from ...runtime.host_arrays import (check_arrays, contiguous, data_address, element_strides, is_torch,
                                    new_array)
from .._launch import (PreparedCall, descriptor_binding, gpu_signature, keep_prepared_call,
                       persistent_cluster_grid, persistent_grid, pointer_binding, prepared_call, torch_ops,
                       torch_route)
from .config import BOX, HEAD_DIMS, ROWS, ForwardConfig, SimpleConfig, register_cap
from .kernels import flash_attention_fa3
from .pingpong_config import (PingpongConfig, buffering, claim_ahead, cluster_size, default_config,
                              dynamic_schedule, half_tiles, lazy_max, per_warp_release, replicated, rescale_above,
                              tile_group)
from .simple import flash_attention_forward

LAYOUTS = ("bhsd", "bshd")
_DTYPES = ("bf16", "fp16")


def _kind(x) -> str:
    from ...runtime.arguments import ArgumentTypeError, dtype_signature

    try:
        return dtype_signature(x.dtype)
    except (ArgumentTypeError, AttributeError):
        return str(getattr(x, "dtype", type(x).__name__))


def _as_bhsd(x, layout: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) of x seen as [batch, heads, seq, head_dim]."""
    shape, strides = tuple(x.shape), element_strides(x)
    if layout == "bshd":
        order = (0, 2, 1, 3)
        shape, strides = tuple(shape[i] for i in order), tuple(strides[i] for i in order)
    return shape, strides


def _check_inputs(q, k, v, layout: str) -> tuple[str, int]:
    """(dtype name, head_dim); TypeError/ValueError saying what to change otherwise."""
    if layout not in LAYOUTS:
        raise ValueError(f"flash_attention layout must be 'bhsd' (batch, heads, seq, head_dim) "
                         f"or 'bshd' (batch, seq, heads, head_dim), got {layout!r}")
    names = ("q", "k", "v")
    check_arrays("flash_attention", q=q, k=k, v=v)
    kinds = [_kind(x) for x in (q, k, v)]
    if kinds[0] not in _DTYPES or len(set(kinds)) != 1:
        raise TypeError(f"flash_attention takes q, k and v of one dtype, bf16 or fp16, got "
                        f"{', '.join(kinds)}; convert with .to(torch.bfloat16)"
                        + (" (numpy has no bf16: use float16)" if isinstance(q, np.ndarray) else ""))
    for name, x in zip(names, (q, k, v)):
        if len(x.shape) != 4:
            raise ValueError(f"flash_attention: {name} must be 4-D ({_layout_words(layout)}), "
                             f"got shape {tuple(x.shape)}")
    (b, h, _, d), (bk, hk, _, dk) = _as_bhsd(q, layout)[0], _as_bhsd(k, layout)[0]
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"flash_attention: k and v must have one shape, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if d not in HEAD_DIMS:
        raise ValueError(f"flash_attention supports head_dim {HEAD_DIMS}, got {d}; pad q, k and "
                         f"v with zeros to the next supported size (and pass softmax_scale)")
    if dk != d or bk != b:
        raise ValueError(f"flash_attention: q is {tuple(q.shape)} and k is {tuple(k.shape)} "
                         f"({_layout_words(layout)}); batch and head_dim must match")
    if hk < 1 or h % hk:
        raise ValueError(f"flash_attention: q has {h} heads and k/v {hk}; the k/v heads must "
                         f"divide the q heads (GQA/MQA)")
    return kinds[0], d


def _tma_ready(x):
    """x as the kernels' 4-D TMA descriptors read it: itself when it starts on 16 bytes
    with head_dim contiguous and every other stride a non-negative multiple of 16 bytes
    (any order of batch, heads and seq), else a contiguous copy."""
    strides = element_strides(x)
    if math.prod(x.shape) == 0 or (strides[-1] == 1 and data_address(x) % 16 == 0
                                   and all(s >= 0 and s * 2 % 16 == 0 for s in strides[:-1])):
        return x
    return contiguous(x)


def _scaled_queries(q, softmax_scale: float):
    """(q', scale') with softmax(scale' q' k^T) = softmax(softmax_scale q k^T) and
    scale' > 0. The kernels take a row's running max as max(raw scores) * scale, the max
    of the scaled scores only when the scale is positive, and mask keys with -inf scores,
    which a zero scale turns into NaN. So a negative scale negates q instead (exact in
    fp16/bf16), and a zero scale, which weighs every visible key the same, becomes zero
    queries at scale 1."""
    if not math.isfinite(softmax_scale):
        raise ValueError(f"flash_attention: softmax_scale must be finite, got {softmax_scale}")
    if softmax_scale > 0:
        return q, softmax_scale
    if softmax_scale < 0:
        return -q, -softmax_scale
    return new_array(q, tuple(q.shape), zero=True), 1.0


def _layout_words(layout: str) -> str:
    return "batch, heads, seq, head_dim" if layout == "bhsd" else "batch, seq, heads, head_dim"


def _descriptor(x, layout: str, rows: int):
    from ... import lowlevel as ll
    from ...runtime.tensor_descriptor import TensorDescriptor

    shape, strides = _as_bhsd(x, layout)
    return TensorDescriptor(x, shape, strides, [1, 1, rows, BOX], ll.NVMMASharedLayout(128, 16))


def flash_attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
                    return_lse: bool = False, layout: str = "bhsd", *,
                    config: ForwardConfig | None = None):
    """softmax(q k^T * softmax_scale) v per (batch, head), fp32 inside.

    q is [batch, heads, seq_q, head_dim] and k, v [batch, kv_heads, seq_k, head_dim]
    (layout="bshd": seq before heads); kv_heads divides heads (GQA/MQA); head_dim 64, 128
    or 256; bf16 or fp16; any strides (copied to contiguous where TMA cannot read them).
    softmax_scale is any finite number (default 1 / sqrt(head_dim)); at 0 every visible
    key weighs the same. Causal attention is aligned bottom-right: query i sees keys
    j <= i + seq_k - seq_q. Returns O shaped like q (contiguous), and with return_lse
    the fp32 log-sum-exp (natural log) of each row's scaled scores, [batch, heads,
    seq_q]; rows that see no key get O = 0 and log-sum-exp +inf, as in FlashAttention.

    Torch tensors autograd or torch.compile must see go through kernels/torch_ops.py (the
    operator weft::flash_attention, or in eager autograd a torch.autograd.Function):
    differentiable in q, k and v (the log-sum-exp is not), the backward by
    weft::flash_attention_backward. The rest run `host_flash_attention`.
    """
    route = torch_route(q, k, v)
    if route is not None:
        return torch_ops().flash_attention(q, k, v, causal, softmax_scale, return_lse, layout, config, route)
    return host_flash_attention(q, k, v, causal, softmax_scale, return_lse, layout, config=config)


def output_shapes(q, k, v, layout: str) -> tuple:
    """(O's shape, the log-sum-exp's shape) of `host_flash_attention`'s results, after the
    checks it makes (its fake for torch.compile): O contiguous in q's dtype, the
    log-sum-exp contiguous fp32."""
    _check_inputs(q, k, v, layout)
    batch, heads, seq_q, _ = _as_bhsd(q, layout)[0]
    return tuple(q.shape), (batch, heads, seq_q)


def host_flash_attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
                         return_lse: bool = False, layout: str = "bhsd", *, config: ForwardConfig | None = None):
    """`flash_attention` without the torch operator: numpy arrays and CPU tensors on the
    emulator, CUDA tensors on the GPU. A CUDA call with the signature of a recent one (see
    `_call_signature`) repeats that call's prepared launch on new outputs."""
    signature = _call_signature(q, k, v, causal, softmax_scale, return_lse, layout, config)
    if signature is not None:
        prepared = prepared_call(signature)
        if prepared is not None:
            return prepared()
    kind, head_dim = _check_inputs(q, k, v, layout)
    (batch, heads, seq_q, _), (_, _, seq_k, _) = _as_bhsd(q, layout)[0], _as_bhsd(k, layout)[0]
    if config is not None and not isinstance(config, ForwardConfig):
        raise TypeError(f"flash_attention: config must be a PingpongConfig or a SimpleConfig (from "
                        f"weft.kernels.attention), got {config!r}")
    chosen = config or default_config(head_dim, bool(causal), seq_k)
    if chosen.head_dim != head_dim:
        raise ValueError(f"flash_attention: {chosen} is for head_dim {chosen.head_dim}, the "
                         f"inputs have head_dim {head_dim}")
    inputs = (q, k, v)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    q, scale = _scaled_queries(q, float(softmax_scale))
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    out = new_array(q, tuple(q.shape))
    lse = new_array(q, (batch, heads, seq_q), "float32")
    if seq_q == 0 or batch * heads == 0:
        return (out, lse) if return_lse else out
    if seq_k == 0:
        out[...] = 0
        lse[...] = float("inf")
        return (out, lse) if return_lse else out
    call = _kernel_call(q, k, v, out, lse, layout, chosen, scale, bool(causal), bool(return_lse))
    call.kernel[call.grid](*call.args, **call.kwargs)
    # Kept only where the kernel reads the caller's own tensors: a copy or a negated q
    # would be a new tensor, at a new address, next call.
    if signature is not None and all(a is b for a, b in zip((q, k, v), inputs)):
        _prepare(signature, call, out, lse, bool(return_lse))
    return (out, lse) if return_lse else out


def _call_signature(q, k, v, causal, softmax_scale, return_lse, layout, config):
    """What a launch for these arguments depends on, as a dict key: q, k and v's
    addresses, shapes, strides, dtypes and device, every option, torch's current stream
    and WEFT_EMULATE (`gpu_signature`); None where no prepared call applies (not torch
    CUDA tensors, or a softmax_scale, layout or config of a type whose value could
    change under the same identity)."""
    if not (softmax_scale is None or type(softmax_scale) in (float, int)) or type(layout) is not str \
            or not (config is None or type(config) in (PingpongConfig, SimpleConfig)):
        return None
    signature = gpu_signature((q, k, v), (bool(causal), softmax_scale, bool(return_lse), layout, config))
    return None if signature is None else ("flash_attention", signature)


@dataclass(frozen=True)
class KernelCall:
    """One launch a wrapper makes: `kernel[grid](*args, **kwargs)`, plus the descriptors
    of its outputs and whether its tile counter must start at zero."""

    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict
    out_desc: object
    zero_counter: bool


def _prepare(signature, call: KernelCall, out, lse, return_lse: bool) -> None:
    launch = call.kernel.prepare(call.grid, *call.args, **call.kwargs)
    if launch is None:  # WEFT_EMULATE: the launch runs on the CPU
        return
    device = out.device
    outputs = [(tuple(out.shape), None, out.dtype, device), (tuple(lse.shape), None, lse.dtype, device)]
    bindings = [[descriptor_binding(launch, "o_desc", call.out_desc)], [pointer_binding(launch, "lse_ptr")]]
    zeroed = []
    if call.zero_counter:
        outputs.append(((1,), None, _int32(), device))
        bindings.append([pointer_binding(launch, "counter_ptr")])
        zeroed.append((2, 1))
    elif launch.holder("counter_ptr") is not None:
        # Never read (a static schedule): point it at live memory all the same.
        bindings[1].append(pointer_binding(launch, "counter_ptr"))
    keep_prepared_call(signature, PreparedCall(launch, outputs, bindings, zeroed,
                                               _WITH_LSE if return_lse else _WITHOUT_LSE))


# What a prepared call returns from its outputs (out, lse, counter); C callables, as
# the fast path adds no Python frame it can avoid.
_WITH_LSE, _WITHOUT_LSE = operator.itemgetter(0, 1), operator.itemgetter(0)


def _int32():
    import torch

    return torch.int32


def _kernel_call(q, k, v, out, lse, layout: str, config: ForwardConfig, scale: float, causal: bool,
                 write_lse: bool) -> KernelCall:
    if isinstance(config, SimpleConfig):
        return _simple_call(q, k, v, out, lse, layout, config, scale, causal, write_lse)
    return _pingpong_call(q, k, v, out, lse, layout, config, scale, causal, write_lse)


def _simple_call(q, k, v, out, lse, layout: str, config: SimpleConfig, scale: float, causal: bool,
                 write_lse: bool) -> KernelCall:
    """The simple kernel's launch (simple.py): one CTA per query tile."""
    (batch, heads, seq_q, head_dim), (_, kv_heads, seq_k, _) = _as_bhsd(q, layout)[0], _as_bhsd(k, layout)[0]
    num_m_tiles = -(-seq_q // config.block_m)
    descs = [_descriptor(x, layout, rows) for x, rows in
             ((q, config.block_m), (k, config.block_n), (v, config.block_n), (out, config.block_m))]
    args = (*descs, lse, scale, seq_q, seq_k, heads, heads // kv_heads)
    kwargs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, HEAD_DIM=head_dim, STAGES=config.stages,
                  CAUSAL=causal, WRITE_LSE=write_lse, NUM_WARPS=4 * config.consumers,
                  PRODUCER_REGS=config.producer_regs, CONSUMER_REGS=config.consumer_regs,
                  num_warps=4 * config.consumers)
    return KernelCall(flash_attention_forward, (num_m_tiles, batch * heads), args, kwargs, descs[3], False)


def _pingpong_call(q, k, v, out, lse, layout: str, config: PingpongConfig, scale: float, causal: bool,
                   write_lse: bool) -> KernelCall:
    """The FA3 kernel's launch (kernels.py), with what the config's None knobs choose for
    this problem (pingpong_config.py)."""
    (batch, heads, seq_q, head_dim), (_, kv_heads, seq_k, _) = _as_bhsd(q, layout)[0], _as_bhsd(k, layout)[0]
    num_m_tiles = -(-seq_q // config.block_m)
    regs = dict(PRODUCER_REGS=config.producer_regs, CONSUMER_REGS=config.consumer_regs)
    descs = [_descriptor(x, layout, rows) for x, rows in
             ((q, ROWS), (k, config.block_n), (v, config.block_n), (out, ROWS))]
    kv_bytes = 2 * seq_k * head_dim * 2 // (heads // kv_heads)  # per query head
    group = tile_group(config, causal, kv_bytes, batch * heads)
    persistent = config.persistent
    cluster = cluster_size(config, causal, num_m_tiles, group) if persistent else 1
    dynamic = persistent and dynamic_schedule(config, cluster)
    # The tile counter of a dynamic schedule: a CTA's first tile is its program id, every
    # later one comes from an atomic add on this (grid + the count so far), so it starts
    # at 0 on every launch. A static schedule never reads it: no zeroing (a kernel launch).
    counter = new_array(q, (1,), "int32", zero=dynamic)
    args = (*descs, lse, counter, scale, seq_q, seq_k, heads, heads // kv_heads, num_m_tiles, batch * heads,
            group)
    # A persistent CTA stores O through its own buffer where it fits (not head_dim 256), so
    # the next tile's Q loads during the last tile's final P V and store, and keeps spare
    # Q buffers where they fit, so the next tile's Q loads during this one.
    o_buffer, q_buffers = buffering(config) if persistent else (False, config.consumers)
    replicate = replicated(config, causal, seq_k)
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.stages,
                      CONSUMERS=config.consumers, CAUSAL=causal, WRITE_LSE=write_lse, O_BUFFER=o_buffer,
                      Q_BUFFERS=q_buffers, EXP2_FMA=float(config.exp2_fma_share), REPLICATED=replicate,
                      PER_WARP=per_warp_release(config, replicate), RESCALE_ABOVE=rescale_above(config),
                      CLAIM_AHEAD=claim_ahead(config), DYNAMIC=dynamic, **regs)
    if lazy_max(config):
        constexprs.update(LAZY_MAX=True)
    if half_tiles(config, causal):
        constexprs.update(HALF_TILES=True)
    tiles = num_m_tiles * batch * heads
    if cluster > 1:
        constexprs.update(CLUSTER=cluster)
        grid = persistent_cluster_grid(flash_attention_fa3, q, tiles, args, constexprs, 4, cluster)
        return KernelCall(flash_attention_fa3, (grid,), args, dict(constexprs, num_warps=4, cluster=(cluster, 1, 1)),
                          descs[3], dynamic)
    # Several CTAs an SM (PingpongConfig.ctas_per_sm): each launches with its share of the registers.
    options = dict(maxnreg=register_cap(config)) if config.ctas_per_sm > 1 else {}
    grid = persistent_grid(flash_attention_fa3, q, tiles, args, constexprs, 4, options) if persistent else tiles
    return KernelCall(flash_attention_fa3, (grid,), args, dict(constexprs, num_warps=4, **options), descs[3],
                      dynamic)


def _host64(x) -> np.ndarray:
    if is_torch(x):
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def reference_probabilities(q, k, scale: float, causal: bool):
    """(P, lse) in float64 for [batch, heads, seq, head_dim] arrays (k repeated to q's
    heads): P = softmax(scale Q K^T) over the keys a query sees (all of them, or under
    `causal` those up to its diagonal, aligned to the end), all zeros in a row that sees
    none, and each row's log-sum-exp (inf for such a row)."""
    seq_q, seq_k = q.shape[2], k.shape[2]
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        visible = np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if seq_k else np.full(s.shape[:-1] + (1,), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)),
                   np.inf)
    return p / np.where(l > 0, l, 1.0), lse


def reference_attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
                        return_lse: bool = False, layout: str = "bhsd"):
    """flash_attention's result in float64 numpy (same conventions), from any arrays."""
    q, k, v = (_host64(x) for x in (q, k, v))
    if layout == "bshd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = (np.repeat(x, heads // kv_heads, axis=1) for x in (k, v))
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    p, lse = reference_probabilities(q, k, scale, causal)
    out = np.einsum("bhqk,bhkd->bhqd", p, v)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return (out, lse) if return_lse else out
